"""`python -m torch_tpu ...`: the torch-tpu command."""

from torch_tpu_cli import main

raise SystemExit(main())
