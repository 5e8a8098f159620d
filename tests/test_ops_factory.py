"""Factories on tpu match the CPU: values, dtypes (inferred like torch), shapes."""

from __future__ import annotations

import pytest
import torch

import torch_tpu


@pytest.fixture(autouse=True)
def no_fallback():
    torch_tpu.metrics.reset()
    yield
    assert not torch_tpu.metrics.snapshot()["fallback_ops"]


def _same(make, **kwargs):
    """make(device=...) gives the same tensor on tpu as on the CPU."""
    expected = make(device="cpu")
    actual = make(device="tpu")
    assert actual.device.type == "tpu"
    torch.testing.assert_close(actual.cpu(), expected, **kwargs)


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((5,), {}),
        ((2, 11, 3), {}),
        ((10, 0, -3), {}),
        ((0, 1, 0.1), {}),
        ((-1.5, 2.5), {}),
        ((0.5, 5, 1.5), {"dtype": torch.int64}),
        ((4,), {"dtype": torch.float64}),
        ((0, 3, 0.25), {"dtype": torch.bfloat16}),
        ((0,), {}),
    ],
)
def test_arange(args, kwargs):
    _same(lambda device: torch.arange(*args, device=device, **kwargs))


def test_arange_out_resizes():
    out = torch.empty(0, device="tpu", dtype=torch.int32)
    torch.arange(1, 7, 2, out=out)
    assert torch.equal(out.cpu(), torch.tensor([1, 3, 5], dtype=torch.int32))


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((0, 1, 5), {}),
        ((-3.5, 10, 7), {"dtype": torch.float64}),
        ((-1.5, 10.7, 4), {"dtype": torch.int64}),
        ((2, 2, 1), {}),
        ((1, 0, 0), {}),
    ],
)
def test_linspace_logspace(args, kwargs):
    _same(lambda device: torch.linspace(*args, device=device, **kwargs))
    _same(lambda device: torch.logspace(*args, device=device, **kwargs), rtol=1e-5, atol=1e-5)
    _same(lambda device: torch.logspace(*args, base=2, device=device, **kwargs))


@pytest.mark.parametrize("shape", [(3,), (2, 4), (4, 2), (0, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_eye(shape, dtype):
    _same(lambda device: torch.eye(*shape, device=device, dtype=dtype))


@pytest.mark.parametrize("args", [(3, 3), (4, 3, 1), (3, 5, -1), (0, 0), (2, 6, 10)])
def test_triangle_indices(args):
    _same(lambda device: torch.tril_indices(*args, device=device))
    _same(lambda device: torch.triu_indices(*args, device=device))
    _same(lambda device: torch.tril_indices(*args, device=device, dtype=torch.int32))


def test_like_factories():
    for dtype in (torch.float32, torch.int32):
        base = torch.ones(2, 3, dtype=dtype)

        def on(device, base=base):
            return base.to(device)

        _same(lambda device: torch.zeros_like(on(device)))
        _same(lambda device: torch.ones_like(on(device), dtype=torch.float64))
        _same(lambda device: torch.full_like(on(device), 7))
        _same(lambda device: on(device).new_full((4,), 2.5, dtype=torch.float32))
        _same(lambda device: on(device).new_zeros((2, 2)))
        empty = torch.empty_like(on("tpu"))
        assert empty.shape == (2, 3) and empty.dtype == dtype and empty.device.type == "tpu"


def test_scalar_and_literal_tensors():
    _same(lambda device: torch.scalar_tensor(3.5, device=device))
    _same(lambda device: torch.scalar_tensor(2, device=device, dtype=torch.int64))
    _same(lambda device: torch.tensor([[1, 2], [3, 4]], device=device))
    _same(lambda device: torch.tensor([1.5, -2.0], device=device, dtype=torch.bfloat16))
    _same(lambda device: torch.tensor(True, device=device))
    _same(lambda device: torch.tensor([1 + 2j], device=device))
    _same(lambda device: torch.full((2, 3), 4, device=device))
    _same(lambda device: torch.zeros(2, 3, device=device, dtype=torch.int8))
    _same(lambda device: torch.ones(0, 4, device=device))


@pytest.mark.parametrize("eager", ["strict", "fused"])
@pytest.mark.parametrize("fmt,shape", [(torch.channels_last, (2, 3, 4, 5)),
                                       (torch.channels_last_3d, (2, 3, 2, 4, 5))])
def test_memory_formats_keep_cpu_strides_and_storage_order(eager, fmt, shape):
    """A memory format given to empty, empty_like, clone, contiguous or to() lays the tensor
    out as on CPU. Dropping it changed no printed value, but code that reads the storage
    order (resize_as_, view after permute, is_contiguous) then got other answers."""
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    made = {}
    with torch.tpu.set_eager_mode(eager):
        for device in ("cpu", "tpu"):
            xd = x.to(device)
            converted = xd.contiguous(memory_format=fmt)
            flat = torch.arange(float(x.numel()), device=device)
            flat.resize_as_(converted, memory_format=torch.preserve_format)
            made[device] = {
                "empty": torch.empty(shape, device=device, memory_format=fmt),
                "empty_like": torch.empty_like(converted),
                "clone": xd.clone(memory_format=fmt),
                "contiguous": converted,
                "to": xd.to(memory_format=fmt),
                "op on it": converted * 2 + 1,
                "resize_as_": flat,
                "storage order": converted.permute(0, *range(2, len(shape)), 1).reshape(-1),
            }
    for name, expected in made["cpu"].items():
        actual = made["tpu"][name]
        assert actual.stride() == expected.stride(), name
        assert actual.is_contiguous(memory_format=fmt) == expected.is_contiguous(memory_format=fmt)
        if not name.startswith("empty"):
            torch.testing.assert_close(actual.cpu(), expected, msg=name)
    with pytest.raises(RuntimeError, match="rank"):  # PyTorch's own check of the rank
        torch.empty(2, 3, 4, device="tpu", memory_format=torch.channels_last)


@pytest.mark.parametrize("make", [
    lambda o: torch.arange(0, 4, out=o),
    lambda o: torch.linspace(0, 3, 4, out=o),
    lambda o: torch.logspace(0, 3, 4, base=2, out=o),
])  # fmt: skip
@pytest.mark.parametrize("view", [False, True])
def test_factory_out_of_the_right_count_keeps_its_shape(eager_mode, make, view):
    """CPU resizes arange/linspace/logspace's out= only when the count differs; the meta
    kernels made it 1-D: a (2, 2) out came back (4,), and a (2, 2) view of a larger
    tensor was given new storage, its base never written (lost data)."""
    results = {}
    for device in ("cpu", "tpu"):
        base = torch.zeros(2, 3, device=device)
        out = base.narrow(1, 1, 2) if view else torch.zeros(2, 2, device=device)
        make(out)
        results[device] = (tuple(out.shape), out.cpu(), base.cpu())
    assert results["tpu"][0] == results["cpu"][0] == (2, 2)
    torch.testing.assert_close(results["tpu"][1], results["cpu"][1])
    torch.testing.assert_close(results["tpu"][2], results["cpu"][2])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_integer_linspace_is_cpus(eager_mode, dtype):
    """XLA turned the division by the step count into a product with its reciprocal: an
    integer linspace truncated to one less (0..999999 in 10**6 steps: half the values)."""
    for start, end, steps in ((1, 127, 50), (0, 999_999 if dtype != torch.uint8 else 255, 1000)):
        expected = torch.linspace(start, end, steps, dtype=dtype)
        actual = torch.linspace(start, end, steps, dtype=dtype, device="tpu")
        assert torch.equal(actual.cpu(), expected)
    big = torch.linspace(0, 999_999, 1_000_000, dtype=torch.int64, device="tpu")
    assert torch.equal(big.cpu(), torch.arange(1_000_000))


@pytest.mark.parametrize("shape", [(5, 0), (5, 0, 3, 0, 2), (0, 3)])
def test_zero_sized_tensors_have_cpus_strides(eager_mode, shape):
    for make in (torch.empty, torch.zeros):
        assert make(shape, device="tpu").stride() == make(shape).stride()


@pytest.mark.parametrize("args", [(5,), (6, False), (7, True, 5.0), (1,), (0,), (64, False, 30.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_kaiser_window(eager_mode, args, dtype):
    """PyTorch's per-device kernel had no tpu entry (an internal assert)."""
    expected = torch.kaiser_window(*args, dtype=dtype)
    actual = torch.kaiser_window(*args, dtype=dtype, device="tpu")
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool]
)
def test_deterministic_mode_fills_uninitialized_memory_as_cpu(dtype):
    """Under use_deterministic_algorithms(True) with fill_uninitialized_memory, CPU fills
    empty tensors with NaN or the dtype's largest value; tpu gave zeros."""
    from torch.testing._internal.common_utils import DeterministicGuard

    with DeterministicGuard(True, fill_uninitialized_memory=True):
        made = {
            d: (torch.empty(3, dtype=dtype, device=d),
                torch.empty_strided((2, 2), (1, 2), dtype=dtype, device=d))
            for d in ("cpu", "tpu")
        }  # fmt: skip
    for cpu, tpu in zip(made["cpu"], made["tpu"]):
        torch.testing.assert_close(tpu.cpu(), cpu, equal_nan=True)


OUT_FACTORIES = {
    "full": lambda out: torch.full((4,), 3.5, out=out),
    "ones": lambda out: torch.ones(4, out=out),
    "zeros": lambda out: torch.zeros(4, out=out),
    "randn": lambda out: torch.randn(4, out=out),
    "resize_ to its own size": lambda out: out.resize_(4).fill_(2.0),
}


@pytest.mark.parametrize("case", list(OUT_FACTORIES))
def test_out_into_a_strided_view_writes_only_the_view(case, eager_mode):
    """ATen's full/ones/randn(out=) resize their out= first; resize_ to a tensor's own size
    keeps its strides on CPU, and tpu made it contiguous: `full((4,), 3.5, out=base[::2])`
    wrote 3.5 into base[:4] instead of base[::2] (helper-44, PyTorch's test_ops)."""
    base = torch.full((8,), 7.0, device="tpu")
    out = base[::2]
    OUT_FACTORIES[case](out)
    assert out.stride() == (2,)
    assert torch.equal(base[1::2].cpu(), torch.full((4,), 7.0))
    assert bool((base[::2] != 7.0).all())
