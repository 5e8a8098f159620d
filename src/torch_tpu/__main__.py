"""`python -m torch_tpu ...`: the torch-tpu command."""

from .cli.main import main

raise SystemExit(main())
