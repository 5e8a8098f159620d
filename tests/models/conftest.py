"""The model zoo's tests: its modules are importable, and torchvision can be imported.

The shim must run before anything imports torchvision (timm and transformers'
image models do); see torchvision_shim.py and docs/models.md.
"""

import importlib.util
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

MISSING = [name for name in ("transformers", "timm", "torchvision")
           if importlib.util.find_spec(name) is None]  # fmt: skip

if not MISSING:
    import torchvision_shim

    torchvision_shim.install()
