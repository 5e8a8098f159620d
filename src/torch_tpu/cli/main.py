"""The torch-tpu command's old entry point, kept for console scripts installed before
pyproject.toml pointed at `torch_tpu_cli:main` (which answers --help without importing torch)."""

from torch_tpu_cli import main

__all__ = ["main"]
