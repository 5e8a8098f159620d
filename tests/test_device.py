"""The tpu device itself: registration, torch.tpu, copies, dtypes, serialization, errors."""

import io
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from conftest import assert_same_error

import torch_tpu

ALL_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
]


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def test_migration_guide_program_runs_without_importing_torch_tpu():
    out = _run(
        """
        import torch

        x = torch.randn(2, 2, device="tpu")
        y = torch.randn(2, 2, device="tpu")
        z = x @ y

        print(z)
        print(z.device)
        """
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "tpu:0"
    assert "device='tpu:0'" in out.stdout


def test_autoload_off_then_import_registers():
    out = _run(
        """
        import torch
        assert torch._C._get_privateuse1_backend_name() == "privateuseone"
        import torch_tpu
        print(torch.ones(2, device="tpu").device)
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tpu:0"


def test_torch_tpu_module_api():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    name = torch.tpu.get_device_name()
    assert torch_tpu.platform.platform().upper() in name
    props = torch.tpu.get_device_properties(0)
    assert props.platform == torch_tpu.platform.platform()
    with torch.tpu.device(0):
        torch.tpu.synchronize()
    x = torch.ones(1024, device="tpu")
    assert torch.tpu.is_initialized()
    assert torch.tpu.memory_allocated() >= x.numel() * 4
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    assert "allocated_bytes.all.current" in torch.tpu.memory_stats()
    summary = torch.tpu.memory_summary()  # (the names training scripts call on torch.cuda)
    assert "allocated" in summary and f"{torch.tpu.memory_allocated() / 2**20:.1f} MiB" in summary
    del x
    torch.tpu.reset_max_memory_allocated()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    x = torch.ones(1024, device="tpu")
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    s = torch.tpu.Stream()
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record(s)
    (x * 2).sum()
    end.record(s)
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
    with torch.tpu.stream(torch.tpu.current_stream()):
        torch.tpu.default_stream().synchronize()


def test_devices_and_bad_device_index():
    assert torch.device("tpu").type == "tpu"
    assert torch.zeros(1, device="tpu:0").device == torch.device("tpu:0")
    with pytest.raises(RuntimeError, match="tpu:7"):
        torch.zeros(2, device="tpu:7")
    with pytest.raises(RuntimeError, match="tpu:3"):
        torch.tpu.set_device(3)
    assert (torch.ones(2, device="tpu") + 1).cpu().tolist() == [2.0, 2.0]  # still works


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_round_trip_every_dtype(dtype):
    cpu = (torch.arange(-6, 6).reshape(3, 4) * 3).to(dtype)
    tpu = cpu.to("tpu")
    assert tpu.dtype == dtype and tpu.device.type == "tpu" and type(tpu) is torch.Tensor
    torch.testing.assert_close(tpu.cpu(), cpu)
    torch.testing.assert_close(tpu.t().cpu(), cpu.t())


def test_64_bit_values_are_not_narrowed():
    big = torch.tensor([2**40 + 1, -(2**62)], dtype=torch.int64)
    assert big.to("tpu").cpu().tolist() == big.tolist()
    precise = torch.tensor([1.0 + 2**-40], dtype=torch.float64)
    assert precise.to("tpu").cpu().item() == precise.item()


def test_copies_with_dtype_conversion_and_non_blocking():
    cpu = torch.tensor([[1.5, -2.5], [3.25, 4.0]])
    tpu = cpu.to("tpu", non_blocking=True)
    torch.testing.assert_close(tpu.to(torch.float64).cpu(), cpu.double())
    torch.testing.assert_close(tpu.to(torch.int32).cpu(), cpu.to(torch.int32))
    torch.testing.assert_close(tpu.to("cpu", torch.bfloat16), cpu.bfloat16())
    target = torch.empty(2, 2, dtype=torch.float16, device="tpu")
    target.copy_(cpu)
    torch.testing.assert_close(target.cpu(), cpu.half())
    host = torch.empty(2, 2, dtype=torch.float64)
    host.copy_(tpu)
    torch.testing.assert_close(host, cpu.double())
    assert tpu.to("tpu:0") is tpu


@pytest.mark.parametrize(
    "send",
    [
        lambda t: t.to("tpu"),
        lambda t: torch.empty(3, device="tpu").copy_(t),
        lambda t: torch.tensor(t.tolist(), device="tpu").copy_(t),
    ],
    ids=["to", "copy_", "copy_ again"],
)
def test_a_cpu_tensor_copied_to_tpu_stays_resizable_and_its_own(send):
    """The copy read the CPU tensor through `.numpy()`, which marks its storage not
    resizable: `resize_` of a tensor ever sent to tpu raised (also an out= resize)."""
    cpu = torch.ones(3)
    on_tpu = send(cpu)
    cpu.add_(1)  # (the device holds its own copy)
    cpu.resize_(7)
    torch.sum(torch.ones(2, 4), 0, out=cpu)
    assert cpu.shape == (4,) and torch.equal(on_tpu.cpu(), torch.ones(3))


def test_to_tpu_matches_pytorchs_to_copy_in_every_case():
    """`.to("tpu")` of a contiguous CPU tensor is one upload (pinned._plain_upload); the
    other cases keep PyTorch's kernel. Both give what the CPU gives, strides included."""
    cpu = torch.arange(24.0).reshape(2, 3, 4) - 5
    cases = {
        "plain": (cpu, {}),
        "dtype": (cpu, {"dtype": torch.float16}),
        "to int": (cpu, {"dtype": torch.int32}),
        "conj view": (torch.complex(cpu, -cpu).conj(), {}),
        "neg view": (torch.complex(cpu, cpu).conj().imag, {}),
        "transposed": (cpu.transpose(0, 2), {}),
        "made contiguous": (cpu.transpose(0, 2), {"memory_format": torch.contiguous_format}),
        "channels_last": (cpu[None].to(memory_format=torch.channels_last), {}),
        "0 elements": (torch.empty(0, 3), {}),
        "0-d": (torch.tensor(2.5), {}),
    }  # fmt: skip
    for name, (t, kwargs) in cases.items():
        expected = t.to("cpu", copy=True, **kwargs)
        got = t.to("tpu", **kwargs)
        assert got.device.type == "tpu" and got.dtype == expected.dtype, name
        assert got.stride() == expected.stride(), (name, got.stride(), expected.stride())
        torch.testing.assert_close(got.cpu(), expected, msg=name)
    leaf = cpu.clone().requires_grad_()
    (leaf.to("tpu") * 3).sum().backward()  # the copy stays differentiable
    torch.testing.assert_close(leaf.grad, torch.full_like(cpu, 3.0))
    with pytest.raises(RuntimeError, match="tpu:5"):
        cpu.to("tpu:5")
    source = cpu.clone()
    uploaded = source.to("tpu")
    source.add_(100)  # the upload owns its copy
    torch.testing.assert_close(uploaded.cpu(), cpu)


def test_item_tolist_repr_and_numpy_error():
    t = torch.tensor([[1, 2], [3, 4]], device="tpu")
    assert t[1, 0].item() == 3
    assert t.tolist() == [[1, 2], [3, 4]]
    assert "device='tpu:0'" in repr(t)
    with pytest.raises(TypeError, match="numpy"):
        t.numpy()


def test_save_load_pickle_state_dict():
    model = torch.nn.Linear(3, 2).to("tpu")
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    on_tpu = torch.load(buf)
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    for k, v in model.state_dict().items():
        assert on_tpu[k].device.type == "tpu" and on_cpu[k].device.type == "cpu"
        torch.testing.assert_close(on_tpu[k].cpu(), v.cpu())
        torch.testing.assert_close(on_cpu[k], v.cpu())
    clone = pickle.loads(pickle.dumps(model.weight.detach()))
    torch.testing.assert_close(clone.cpu(), model.weight.detach().cpu())
    cpu_model = torch.nn.Linear(3, 2)
    cpu_model.load_state_dict(model.state_dict())
    torch.testing.assert_close(cpu_model.weight, model.weight.detach().cpu())
    back = torch.nn.Linear(3, 2).to("tpu")
    back.load_state_dict(cpu_model.state_dict())
    torch.testing.assert_close(back.weight.detach().cpu(), cpu_model.weight.detach())


def test_mixed_devices_and_shape_errors_are_clean():
    a = torch.ones(2, 2, device="tpu")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(2, 2)
    with pytest.raises(RuntimeError):
        a + torch.ones(3, 3, device="tpu")
    with pytest.raises(RuntimeError):
        a @ torch.ones(3, 3, device="tpu")
    with pytest.raises(RuntimeError):
        a.add_(torch.ones(2, 2, dtype=torch.float32, device="tpu").to(torch.int64).float().view(4))
    assert (a * 3).cpu().tolist() == [[3.0, 3.0], [3.0, 3.0]]
    assert (a + torch.tensor(2.0)).cpu().tolist() == [[3.0, 3.0], [3.0, 3.0]]  # cpu scalar ok


WRITES_INTO_A_CPU_SCALAR = {
    "in-place": lambda host, dev: host.add_(dev),
    "operator": lambda host, dev: host.__imul__(dev),
    "out=": lambda host, dev: torch.add(dev, dev, out=host),
    "index_put_": lambda host, dev: host.index_put_((), dev),
}


@pytest.mark.parametrize("case", list(WRITES_INTO_A_CPU_SCALAR))
def test_a_cpu_scalar_is_never_written_by_a_tpu_op(eager_mode, case):
    """A CPU 0-dim tensor may be read by a tpu op, as CUDA reads one; written, the
    result went to its upload and the tensor silently kept its old value."""
    host = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        WRITES_INTO_A_CPU_SCALAR[case](host, torch.tensor(2.0, device="tpu"))
    assert host.item() == 1.0
    host.copy_(torch.tensor(3.0, device="tpu"))  # a copy between devices still lands
    assert host.item() == 3.0


_test_lib = torch.library.Library("tpu_test", "DEF")
_test_lib.define("scale(Tensor x, float factor) -> Tensor")
_test_lib.impl("scale", lambda x, factor: x * factor, "CPU")


def test_cpu_fallback_warns_counts_and_can_be_disabled():
    # An op with only a CPU kernel stands in for any ATen op we have not lowered.
    a = torch.randn(5)
    torch_tpu.metrics.reset()
    with pytest.warns(UserWarning, match="tpu_test::scale"):
        out = torch.ops.tpu_test.scale(a.to("tpu"), 3.0)
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), a * 3.0)
    assert torch_tpu.metrics.snapshot()["fallback_ops"] == {"tpu_test::scale.default": 1}
    torch.tpu.enable_cpu_fallback = False
    try:
        with pytest.raises(NotImplementedError, match="tpu_test::scale"):
            torch.ops.tpu_test.scale(a.to("tpu"), 3.0)
    finally:
        torch.tpu.enable_cpu_fallback = True
    assert torch.tpu.enable_cpu_fallback is True


def test_a_sparse_result_of_the_cpu_fallback_is_refused_by_the_ops_name():
    """`to_sparse()` runs on the CPU fallback; moving its sparse result back failed inside
    a sparse constructor the user never called ('Sparsetpu' backend)."""
    x = torch.randn(3, 3, device="tpu")
    cases = [(torch.Tensor.to_sparse, "sparse_coo"), (torch.Tensor.to_sparse_csr, "sparse_csr")]
    for convert, layout in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the fallback's, once per op and process)
            with pytest.raises(NotImplementedError, match=f"layout torch.{layout}.*dense"):
                convert(x)


@pytest.mark.parametrize(
    "make_sparse",
    [
        lambda: torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.ones(2), (3,), device="tpu"),
        lambda: torch.eye(3).to_sparse().to("tpu"),
        lambda: torch.nn.Embedding(4, 2, sparse=True).to("tpu")(torch.tensor([1], device="tpu"))
        .sum()
        .backward(),
    ],
    ids=["constructor", "moved", "embedding_sparse_gradient"],
)
def test_sparse_tensors_on_tpu_are_refused_naming_the_limit(make_sparse):
    """PyTorch's own error named an internal constructor and the 'Sparsetpu' backend."""
    with pytest.raises(NotImplementedError, match="sparse tensors are not supported on tpu"):
        make_sparse()


@pytest.mark.parametrize(
    "make_quantized",
    [
        lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8).to("tpu"),
        lambda: torch.quantize_per_tensor(torch.randn(4, device="tpu"), 0.1, 0, torch.qint8),
    ],
    ids=["moved", "quantized_on_tpu"],
)
def test_quantized_tensors_on_tpu_are_refused_naming_the_limit(make_quantized):
    """PyTorch's own error named aten::empty_quantized and the 'Quantizedtpu' backend
    (found by PyTorch's test_shape_ops flip test, helper-43)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the CPU fallback's, once per op and process)
        with pytest.raises(NotImplementedError, match="quantized tensors are not supported"):
            make_quantized()


@pytest.mark.parametrize(
    "use",
    [lambda n: n + 1, lambda n: n.sum(), lambda n: n.unbind()[1].cpu()],
    ids=["add", "sum", "unbind"],
)
def test_strided_nested_tensors_on_tpu_are_refused_naming_the_limit(use):
    """PyTorch's own error at the first op named the 'NestedTensortpu' backend; a jagged
    nested tensor (dense tensors underneath) runs, and a CPU one is untouched."""
    parts = [torch.arange(2.0), torch.arange(3.0)]
    nested = torch.nested.nested_tensor(parts, device="tpu")
    with pytest.raises(NotImplementedError, match="nested tensors of layout torch.strided"):
        use(nested)
    with pytest.raises(NotImplementedError, match="nested tensors of layout torch.strided"):
        use(torch.nested.nested_tensor(parts).to("tpu"))
    jagged = torch.nested.nested_tensor(parts, layout=torch.jagged, device="tpu")
    expected = torch.nested.nested_tensor(parts, layout=torch.jagged) * 2
    for got, want in zip((jagged * 2).unbind(), expected.unbind()):
        assert got.device.type == "tpu" and torch.equal(got.cpu(), want)
    assert torch.equal((torch.nested.nested_tensor(parts) + 1).unbind()[1], parts[1] + 1)


def test_rng_state_round_trip_and_seeding():
    torch.manual_seed(123)
    first = torch.randn(4, device="tpu").cpu()
    torch.manual_seed(123)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), first)
    state = torch.tpu.get_rng_state()
    a = torch.rand(3, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="tpu").cpu(), a)
    assert not torch.equal(torch.rand(3, device="tpu").cpu(), a)
    assert torch.tpu.initial_seed() == 123


def test_cpu_index_tensors_are_accepted_like_cuda():
    cpu = torch.arange(12.0).reshape(3, 4)
    tpu = cpu.to("tpu")
    rows, mask = torch.tensor([2, 0]), torch.tensor([True, False, True])
    torch.testing.assert_close(tpu[rows].cpu(), cpu[rows])
    torch.testing.assert_close(tpu[mask].cpu(), cpu[mask])
    tpu[rows] = 1.0
    cpu[rows] = 1.0
    torch.testing.assert_close(tpu.cpu(), cpu)


def test_integer_indexing_fuses_without_a_flush():
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    idx = torch.tensor([2, 0], device="tpu")
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        y = x[idx] * 2
        assert torch_tpu.engine.fuse.pending_ops() == 2
    torch.testing.assert_close(y.cpu(), torch.arange(12.0).reshape(3, 4)[[2, 0]] * 2)


@pytest.mark.parametrize(
    "make",
    [
        lambda device: torch.UntypedStorage(12, device=device),
        lambda device: torch.UntypedStorage([0, 0, 128, 63, 0, 0, 0, 64], device=device),
        lambda device: torch.UntypedStorage(device=device),
        lambda device: torch.TypedStorage(3, device=device),
        lambda device: torch.TypedStorage(2, dtype=torch.int64, device=device),
    ],
    ids=["size", "bytes", "empty", "typed", "typed_int64"],
)
def test_storage_constructors_make_tpu_storages(make):
    """PyTorch's storage constructor allocates through the device's C++ allocator, which a
    Python backend cannot register: on tpu it crashed the process (a segfault)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (TypedStorage is deprecated)
        cpu, tpu = make("cpu"), make("tpu")
    assert tpu.device.type == "tpu" and type(tpu) is type(cpu)
    assert tpu.nbytes() == cpu.nbytes()
    untyped = tpu if isinstance(tpu, torch.UntypedStorage) else tpu._untyped_storage
    viewed = torch.tensor([], dtype=torch.uint8, device="tpu").set_(untyped)
    viewed.fill_(7)  # a storage tensors can be made over, and written through
    assert untyped.cpu().tolist() == [7] * cpu.nbytes()


def test_storage_from_bytes_keeps_them_and_refuses_what_cpu_refuses():
    storage = torch.UntypedStorage([0, 0, 128, 63, 0, 0, 0, 64], device="tpu")
    floats = torch.tensor([], device="tpu").set_(storage)
    assert floats.cpu().tolist() == [1.0, 2.0]
    for bad in (1.5, "ab"):
        assert_same_error(lambda device, bad=bad: torch.UntypedStorage(bad, device=device))
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.UntypedStorage(-1, device="tpu")


_TOO_LARGE = 1 << 46  # float32 elements: 256 TiB, past any machine's address space


def _allocate_too_much_eagerly():
    x = torch.zeros(_TOO_LARGE, device="tpu")
    x.add_(1)
    torch.tpu.synchronize()


def _allocate_too_much_in_a_graph():
    grow = torch.compile(lambda a: a.expand(1 << 23, 1 << 23) * 2, backend="tpu")
    grow(torch.ones(1 << 23, device="tpu"))[0, 0].item()  # (fails at the read: async)


@pytest.mark.parametrize("allocate", [_allocate_too_much_eagerly, _allocate_too_much_in_a_graph])
def test_out_of_memory_is_pytorchs_error_and_the_device_goes_on(eager_mode, allocate):
    """Programs catch torch.OutOfMemoryError (torch.cuda's is the same class) to retry with
    a smaller batch; JAX's own error escaped every such handler."""
    assert torch.tpu.OutOfMemoryError is torch.OutOfMemoryError
    with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory"):
        allocate()
    assert (torch.ones(3, device="tpu") * 2).cpu().tolist() == [2.0, 2.0, 2.0]
