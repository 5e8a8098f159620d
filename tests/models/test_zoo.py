"""Every zoo case in every mode matches the CPU (see harness.py for what a cell checks).

CI runs the cells in CI_CELLS: about 5 minutes on 2 cores, one of each kind of
program (decoder LM with generate(), encoder classifier, CNN with BatchNorm,
vision transformer, attention and FFT in plain PyTorch) and each mode at least
once. Every other cell is marked slow: the whole zoo takes about an hour here
and runs, with timings and fallbacks, as `python tests/models/report.py`
(docs/models.md).
"""

import importlib.util

import pytest

MISSING = [name for name in ("transformers", "timm", "torchvision")
           if importlib.util.find_spec(name) is None]  # fmt: skip

if MISSING:
    pytest.skip(
        f"{MISSING} not installed: pip install -c constraints.txt -e '.[models]'",
        allow_module_level=True,
    )

# pytest puts this folder on sys.path; zoo installs the torchvision shim before torchvision
# loads. (No conftest.py here: a second `conftest` module would shadow tests/conftest.py for
# the suite's `from conftest import ...`.)
import harness  # noqa: E402
import zoo  # noqa: E402

CI_CELLS = {
    ("llama (untied)", "strict"),
    ("llama (untied)", "compiled"),
    ("bert classifier", "fused"),
    ("vit (torchvision)", "strict"),
    ("scaled_dot_product_attention", "compiled"),
    ("multihead_attention", "fused"),
    ("fft", "strict"),
}

SLOW = pytest.mark.slow  # reason: the full zoo takes about an hour on 2 cores (docs/models.md)


def _cells():
    for name in zoo.CASES:
        for mode in harness.MODES:
            marks = () if (name, mode) in CI_CELLS else (SLOW,)
            yield pytest.param(name, mode, marks=marks, id=f"{name}-{mode}")


@pytest.mark.parametrize("name, mode", list(_cells()))
def test_cell_matches_cpu(name, mode):
    cell = harness.run_cell(zoo.CASES[name], mode)
    assert cell.passed, (
        f"{name} / {mode}: {cell.status}: {cell.detail}"
        f"\ngenerate: {cell.generate}\nfallbacks: {cell.fallbacks}\n{cell.trace}"
    )


def test_ci_cells_exist():
    assert {name for name, _ in CI_CELLS} <= set(zoo.CASES)
    assert {mode for _, mode in CI_CELLS} == set(harness.MODES)
