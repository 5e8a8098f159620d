"""Distributed checkpoints that are written completely or not at all.

`torch.distributed.checkpoint` writes each rank's shards and then rank 0's
`.metadata`; a job killed in between leaves a directory that looks like a
checkpoint, and a truncated or damaged shard file can load as wrong values.
`save` writes into `<path>.partial`, then rank 0 records every file's size and
SHA-256 in `MANIFEST.json` and renames the directory to `<path>` (one atomic
step), so `<path>` exists only once complete. `load` refuses a directory whose
manifest is missing or whose files do not match it, with `CheckpointError`
naming what is wrong, before anything is read into the state dict.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

MANIFEST = "MANIFEST.json"


class CheckpointError(RuntimeError):
    """A checkpoint directory that is missing, partial or corrupt."""


def save(state: dict, path: str | os.PathLike) -> None:
    """dcp.save `state` to `path`, which appears only once every rank's part and the
    manifest are written (call on every rank, like dcp.save)."""
    final = Path(path)
    partial = final.with_name(final.name + ".partial")
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0 and partial.exists():
        shutil.rmtree(partial)  # an earlier save that died
    _barrier()
    dcp.save(state, checkpoint_id=str(partial))
    if rank == 0:
        files = {
            f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)}
            for f in sorted(partial.iterdir())
        }
        (partial / MANIFEST).write_text(json.dumps(files, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
    _barrier()


def verify(path: str | os.PathLike) -> None:
    """Raise CheckpointError unless `path` is a complete, intact checkpoint."""
    root = Path(path)
    if not root.is_dir():
        partial = root.with_name(root.name + ".partial")
        hint = ""
        if partial.exists():
            hint = " (only a partial save exists: the job died while saving)"
        raise CheckpointError(f"checkpoint {root} does not exist{hint}")
    manifest = root / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(
            f"checkpoint {root} has no {MANIFEST}: it is partial (a save that did not "
            "finish) or was not written by torch_tpu.distributed.checkpoint.save; refusing "
            "to load it"
        )
    try:
        files = json.loads(manifest.read_text())
    except ValueError as e:
        raise CheckpointError(f"checkpoint {root}: {MANIFEST} is corrupt ({e})") from None
    if ".metadata" not in files:
        raise CheckpointError(f"checkpoint {root}: the manifest lists no .metadata")
    for name, expected in files.items():
        f = root / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {root} is partial: {name} is missing")
        size = f.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(
                f"checkpoint {root} is corrupt: {name} has {size} bytes, the manifest "
                f"says {expected['bytes']}"
            )
        if _sha256(f) != expected["sha256"]:
            raise CheckpointError(
                f"checkpoint {root} is corrupt: {name}'s contents do not match its "
                "SHA-256 in the manifest"
            )


def load(state: dict, path: str | os.PathLike) -> None:
    """Check `path` (every rank), then dcp.load it into `state` in place (any mesh:
    dcp reshards)."""
    verify(path)
    dcp.load(state, checkpoint_id=str(path))


def _sha256(f: Path) -> str:
    h = hashlib.sha256()
    with f.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
