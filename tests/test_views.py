"""Writes through every kind of view reach the base and every other alias, as on CPU."""

import pytest
import torch
from conftest import count_compiles, hold_executables

# Every test runs in debug, strict and fused eager mode (conftest.eager_mode).
pytestmark = pytest.mark.usefixtures("eager_mode")


def _both(fn):
    """Run fn on a fresh CPU base and a fresh tpu base; return both bases and results."""
    cpu = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tpu = cpu.to("tpu")
    return cpu, fn(cpu), tpu, fn(tpu)


def _edit_select(x):
    x[:, 0] = 5
    return x[1]


def _edit_setitem_slice(x):
    x[1:3, ::2] = -1.0
    return x[2]


def _edit_transpose_inplace(x):
    x.t_()
    x[0].mul_(10)
    return x


def _edit_view_flat(x):
    x.view(-1).add_(1)
    return x.view(-1)


def _edit_diagonal(x):
    x.diagonal().zero_()
    return x.diagonal(1)


def _edit_unfold(x):
    x[0].unfold(0, 2, 2).mul_(2)  # non-overlapping windows: writes are well defined
    return x[1].unfold(0, 3, 1) + 0  # overlapping windows: read only


def _edit_as_strided(x):
    s = x.as_strided((2, 2), (1, 6), 1)
    s.fill_(7)
    return s


def _edit_narrow(x):
    x.narrow(1, 2, 3).sub_(100)
    return x.narrow(0, 1, 2)


def _edit_unsqueeze(x):
    x.unsqueeze(0).mul_(2)
    return x


def _edit_expand_read(x):
    row = x[0:1]
    return row.expand(3, 6) + 0


def _edit_permute(x):
    v = x.reshape(2, 2, 6).permute(2, 0, 1)
    v[0].fill_(-3)
    return v


def _edit_chain(x):
    v = x[1:, 1:].t()[::2]
    v.add_(1000)
    return v


def _edit_split(x):
    a, b = x.split(3, dim=1)
    b.copy_(a)
    return b


def _edit_squeeze(x):
    x[None, :, None].squeeze(0).squeeze(-1)[2].fill_(9)
    return x


def _edit_data(x):
    x.data.mul_(0.5)
    return x


def _edit_detach(x):
    x.detach().add_(3)
    return x


def _edit_real_view(x):
    x.view(torch.int32)[0, 0] = 0  # float bits reinterpreted: 0.0
    return x.view(torch.int32)


VIEW_EDITS = [
    _edit_select,
    _edit_setitem_slice,
    _edit_transpose_inplace,
    _edit_view_flat,
    _edit_diagonal,
    _edit_unfold,
    _edit_as_strided,
    _edit_narrow,
    _edit_unsqueeze,
    _edit_expand_read,
    _edit_permute,
    _edit_chain,
    _edit_split,
    _edit_squeeze,
    _edit_data,
    _edit_detach,
    _edit_real_view,
]


@pytest.mark.parametrize("edit", VIEW_EDITS, ids=lambda f: f.__name__.removeprefix("_edit_"))
def test_write_through_view_matches_cpu(edit):
    cpu, cpu_out, tpu, tpu_out = _both(edit)
    torch.testing.assert_close(tpu.cpu(), cpu)
    torch.testing.assert_close(tpu_out.cpu(), cpu_out)
    assert tpu._version == cpu._version
    assert tpu.stride() == cpu.stride()


def test_aliases_see_each_other():
    x = torch.zeros(3, 3, device="tpu")
    row, col, flat = x[1], x[:, 1], x.view(-1)
    row.fill_(1)
    assert col.cpu().tolist() == [0.0, 1.0, 0.0]
    assert flat.cpu().tolist()[3:6] == [1.0, 1.0, 1.0]
    assert x._version == row._version == col._version == 1


def test_param_data_copy_and_grad_zero():
    p = torch.nn.Parameter(torch.ones(4, device="tpu"))
    p.data.copy_(torch.arange(4.0))
    (p * p).sum().backward()
    torch.testing.assert_close(p.grad.cpu(), 2 * torch.arange(4.0))
    p.grad.zero_()
    assert p.grad.cpu().tolist() == [0.0] * 4


def test_view_of_int_and_bool_dtypes():
    for dtype in (torch.int64, torch.int8, torch.bool, torch.bfloat16, torch.float16):
        cpu = torch.zeros(3, 4, dtype=dtype)
        tpu = cpu.to("tpu")
        for x in (cpu, tpu):
            x[:, 1] = 1
            x.t()[2].fill_(1)
        torch.testing.assert_close(tpu.cpu(), cpu)


def test_complex_view_as_real_writes_through():
    cpu = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    tpu = cpu.to("tpu")
    for x in (cpu, tpu):
        torch.view_as_real(x)[:, 1].fill_(0.5)
    torch.testing.assert_close(tpu.cpu(), cpu)
    torch.testing.assert_close(torch.view_as_real(tpu).cpu(), torch.view_as_real(cpu))


def test_complex_view_of_float16_is_refused_by_name():
    """complex32 is a dtype tpu tensors refuse; a view that reinterprets float16 as it
    must say so where it is made. It used to make the view and raise KeyError:
    torch.complex32 at the next read."""
    x = torch.randn(3, 2, dtype=torch.float16).to("tpu")
    for make in (torch.view_as_complex, lambda t: t.view(torch.complex32)):
        with pytest.raises(TypeError, match="do not support dtype torch.complex32"):
            make(x)
    y = torch.randn(3, 2).to("tpu")  # the views of supported dtypes still alias
    torch.testing.assert_close(torch.view_as_complex(y).cpu(), torch.view_as_complex(y.cpu()))
    assert torch.equal(y.view(torch.int32).cpu(), y.cpu().view(torch.int32))


def _conjugate_program(x):
    """Every way PyTorch hands a conjugate or negative view on: to ops that read the bit
    (mm, dot, vdot, copy_, clone), to ops it resolves first (add, sum), writes through
    the view and through the base after the view was taken, and the host read."""
    v = x.conj()
    vi = v.imag  # a negative view of x's imaginary parts
    n = torch._neg_view(x)
    x[0, 0] = 5 + 5j  # the views see a write to the base
    v[1, 1] = 7 + 7j  # the base sees a write through the view
    vi[2, 0] = 1.5
    out = {
        "v": v.clone(), "vi": vi.clone(), "n": n.clone(), "x": x.clone(),
        "mm": v @ x, "mm_t": x.mH @ x, "dot": torch.dot(v[0], x[1]),
        "vdot": torch.vdot(v[0], x[1]), "add": v + 1, "sum": v.sum(), "item": v[0, 0].item(),
        "resolved": v.resolve_conj(), "conj_conj": v.conj(), "real_of_conj": v.real * 1,
    }
    v[0].add_(1j)  # an in-place op on the view (PyTorch resolves and writes back)
    target = torch.zeros_like(x).conj()
    target.copy_(x)  # copy_ into a conjugate view stores the conjugate
    out.update(after_add=x.clone(), copied=target.resolve_conj(), stored=target.conj().clone())
    return out


def test_conjugate_and_negative_views_alias_their_base_as_on_cpu():
    """x.conj(), x.conj().imag and torch._neg_view(x) are views with PyTorch's lazy bits;
    a copy instead (the lowering's result) missed every later write to x and lost writes
    made through it."""
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    cpu = torch.complex(base, -base / 2)[:, :3]
    expected = _conjugate_program(cpu.clone())
    tpu = cpu.to("tpu")
    got = _conjugate_program(tpu)
    for name, value in expected.items():
        actual = got[name]
        if isinstance(value, torch.Tensor):
            assert actual.is_conj() == value.is_conj() and actual.is_neg() == value.is_neg(), name
            torch.testing.assert_close(actual.cpu(), value, msg=name)
        else:
            assert actual == pytest.approx(value), name
    assert tpu.conj()._base is tpu and tpu.conj().is_conj()


def test_bool_storages_viewed_as_bytes_and_back():
    """view(dtype) to and from bool (XLA has no bool bitcast: a JAX TypeError reached the
    user at the read), reading and writing through the view."""
    flags = torch.tensor([True, False, True, True, False, False, True, False])
    raw = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1], dtype=torch.uint8)
    results = {}
    for device in ("cpu", "tpu"):
        b, u = flags.to(device), raw.to(device)
        as_bytes, as_flags = b.view(torch.uint8), u.view(torch.bool)
        as_bytes[0] = 0  # a byte written into a bool storage
        as_flags[1] = False  # a bool written into a byte storage
        results[device] = [as_bytes * 1, as_flags.clone(), b.view(torch.int8) + 0,
                           b.view(torch.float16) * 1, b.clone(), u.clone()]
    for expected, actual in zip(results["cpu"], results["tpu"]):
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def _row_loop(x):
    """A program's loop over rows: each row a view at its own storage offset."""
    values = []
    for i in range(1, x.shape[0]):
        x[i] = x[i - 1] * 2 + i  # read two rows, write a third
        x[i, 1:].add_(1)  # in place through a view of a view
        values.append(x[i, 2].item())  # a read of one element
    return values


def _column_loop(x):
    """A loop over columns (PyTorch's test_sort checks order column by column)."""
    return [bool((x[:, j] <= x[:, j + 1]).all().item()) for j in range(x.shape[1] - 1)]


def test_a_loop_over_columns_compiles_once_per_op(monkeypatch, eager_mode):
    """Strided views spanning few storage elements take run-time offsets too: a loop
    over a small matrix's columns compiled a program per column."""
    width = {"debug": 7, "strict": 8, "fused": 9}[eager_mode]
    cpu = torch.arange(4.0 * width).reshape(4, width)
    cpu[2, 3] = 100.0
    tpu = cpu.to("tpu")
    hold_executables(monkeypatch)  # (from the warm-up on)
    _column_loop(tpu[:, :3])  # warm up
    programs = count_compiles(monkeypatch)
    assert _column_loop(tpu) == _column_loop(cpu)
    assert programs == []


def test_a_loop_over_rows_compiles_once_per_op(monkeypatch, eager_mode, compile_first_calls):
    """A view's storage offset is passed to the program at run time: a loop over the rows
    of a tensor compiled a program for every op at every row (25-30 ms each here), and a
    read of `x[i].item()` one for every i."""
    width = {"debug": 4, "strict": 5, "fused": 6}[eager_mode]  # (no mode reuses another's)
    cpu = torch.arange(12.0 * width).reshape(12, width)
    tpu = cpu.clone().to("tpu")
    expected = _row_loop(cpu)
    hold_executables(monkeypatch)  # (from the warm-up on)
    _row_loop(tpu[:3])  # warm up: every program of the loop, once
    programs = count_compiles(monkeypatch)
    assert _row_loop(tpu) == expected
    torch.testing.assert_close(tpu.cpu(), cpu)
    assert programs == []


def test_resize_keeps_the_storage_it_fits_in():
    """resize_ to a size the storage holds keeps the storage, as CPU: a shrink and a
    regrow gave zeros back, and a resized view stopped aliasing its base."""
    for device in ("cpu", "tpu"):
        a = torch.arange(10.0, device=device)
        a.resize_(5)
        a.resize_(10)
        base = torch.arange(6.0, device=device)
        view = base[:4]
        view.resize_(2)
        view.fill_(-1)
        if device == "cpu":
            expected = (a.clone(), base.clone())
    torch.testing.assert_close(a.cpu(), expected[0])
    torch.testing.assert_close(base.cpu(), expected[1])


def test_copy_of_a_python_number_fills():
    expected = torch.zeros(3).copy_(float("nan"))
    actual = torch.zeros(3, device="tpu").copy_(float("nan"))
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def test_is_set_to_compares_storage_and_geometry():
    """is_set_to fell back to the CPU, whose host copies never share a storage."""

    def checks(d):
        t = torch.arange(6.0, device=d).view(2, 3)
        same = torch.tensor([], device=d).set_(t)
        return [t.is_set_to(same), t.is_set_to(t.clone()), t.is_set_to(t.t()), t[0].is_set_to(t[0])]

    assert checks("tpu") == checks("cpu") == [True, False, False, True]
