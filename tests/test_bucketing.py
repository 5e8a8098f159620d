"""Bounded dynamic shapes: bucket policy, padding that leaves results unchanged (compiled
and fused), refusal of ops padding would change, compile counts, metrics and warnings."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from torch_tpu import metrics
from torch_tpu.bucketing import bucket_for, pad_sequences, pad_to_bucket
from torch_tpu.compile.buckets import BucketingError, BucketPolicy, split_options

# ------------------------------------------------------------------ policy


def test_policy_rounds_up_to_buckets():
    assert [bucket_for(n, bucket_size=8) for n in (1, 8, 9, 17)] == [8, 8, 16, 24]
    geometric = BucketPolicy(bucket_size=4, num_dynamic_buckets=3)
    assert geometric.sizes() == (4, 8, 16)
    assert [geometric.bucket(n) for n in (1, 5, 16)] == [4, 8, 16]
    assert BucketPolicy(dynamic_buckets=(32, 10)).bucket(11) == 32
    with pytest.raises(BucketingError, match="largest bucket 16.*num_dynamic_buckets=3"):
        geometric.bucket(17)


def test_policy_options_are_checked_and_split_from_xla_options():
    policy, xla = split_options({"bucket_size": 8, "xla_cpu_enable_fast_math": False})
    assert policy == BucketPolicy(bucket_size=8)
    assert xla == {"xla_cpu_enable_fast_math": False}
    assert split_options({"a": 1}) == (None, {"a": 1})
    with pytest.raises(ValueError, match="'bucket_size' must be an int >= 1"):
        split_options({"bucket_size": 0})
    with pytest.raises(ValueError, match="either 'dynamic_buckets'"):
        split_options({"dynamic_buckets": [8], "bucket_size": 8})


def test_recompile_warning_names_the_bucket_options(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN_LIMIT", "2")
    metrics.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(4):
            metrics.record_compile(0.0, "graph", "g", [("x", (n + 1, 4), "torch.float32")])
    text = " ".join(str(w.message) for w in caught)
    assert "bucket_size" in text and "mark_dynamic" in text and "pad_to_bucket" in text
    assert len(metrics.shapes()[("graph", "g")]) == 4
    metrics.reset()


def test_recompiles_with_unchanged_shapes_warn_without_failing(monkeypatch):
    """Recompiles whose inputs kept their shapes and dtypes (strides, storage offsets or
    an op's constant arguments changed) raised IndexError from the warning's own code;
    their warning names those causes, not padding."""
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN_LIMIT", "2")
    metrics.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            metrics.record_compile(0.0, "graph", "g", [("x", (4, 4), "torch.float32")])
    (message,) = [str(w.message) for w in caught if "no input changed" in str(w.message)]
    assert "as a constant" in message and "pad_to_bucket" not in message  # (no shape advice)
    metrics.reset()


# ---------------------------------------------------- eager: explicit padding


def test_pad_to_bucket_matches_cpu_and_compiles_nothing_per_length():
    """Edge or constant padding of a tpu tensor equals CPU's, goes through the host (no
    program per unpadded length), and a row-wise computation on the padded tensor, sliced
    back, equals the unpadded CPU run — in fused mode, where one segment per bucket runs.
    (The upload itself is left out of the count: `.to("tpu")` runs a copy_ program per
    shape, in fused mode as a deferred op.)"""
    torch.manual_seed(0)
    w = torch.randn(6, 6)
    wt = w.to("tpu")

    def rowwise(x, w):
        return F.layer_norm(x @ w, (6,)).relu()

    compiled_after_warmup = 0
    for n in (3, 5, 2, 7):
        x = torch.randn(2, n, 6)
        xt = x.to("tpu")
        before = metrics.snapshot().get("compiles", 0)
        with torch.tpu.set_eager_mode("fused"):
            expected_pad, _ = pad_to_bucket(x, 1, bucket_size=8)
            padded, length = pad_to_bucket(xt, 1, bucket_size=8)
            assert length == n and padded.shape == (2, 8, 6)
            torch.testing.assert_close(padded.cpu(), expected_pad)
            torch.testing.assert_close(padded.cpu()[:, n:], x[:, -1:].expand(2, 8 - n, 6))
            filled, _ = pad_to_bucket(xt, 1, bucket_size=8, value=-1.0, side="left")
            torch.testing.assert_close(filled.cpu()[:, 8 - n :], x)
            assert (filled.cpu()[:, : 8 - n] == -1).all()
            out = rowwise(padded, wt).cpu()[:, :n]  # sliced on the host: no read per length
            torch.testing.assert_close(out, rowwise(x, w), atol=1e-5, rtol=1e-5)
        if n != 3:
            compiled_after_warmup += metrics.snapshot().get("compiles", 0) - before
    assert compiled_after_warmup == 0


def test_pad_sequences_left_pads_to_the_bucket():
    ids, mask = pad_sequences([[5, 6, 7], [8]], side="left", bucket_size=4, pad_value=0)
    assert ids.tolist() == [[0, 5, 6, 7], [0, 0, 0, 8]]
    assert mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    with pytest.raises(ValueError, match="side"):
        pad_sequences([[1]], side="middle", bucket_size=4)


# ------------------------------------------------------- compiled: padding


def _rowwise_model(x, ids, pos, cache, weight, table):
    """Every op class bucketing lets through, on a prompt-like length `n` (dim 1 of x and
    ids, dim 0 of pos): an embedding gather, a matmul over the hidden dim, layer norm and
    softmax over the hidden dim, a prefix sum along n, slicing from a fixed start, a
    gather at a given position, and an index_copy_ into a static cache."""
    h = F.layer_norm(x @ weight + table[ids], (x.shape[-1],))
    cache.index_copy_(1, pos, h)  # pad rows write the last real row again
    scores = h.softmax(-1) + h.cumsum(1)
    return scores[:, 1:], scores.index_select(1, pos[:1]), cache.sum(-1)


def _compile_bucketed(fn, dims=(1,)):
    """fn compiled with bucket_size 8, its k-th argument's dim dims[k] marked dynamic."""
    compiled = torch.compile(fn, backend="tpu", options={"bucket_size": 8})

    def call(*args):
        for x, d in zip(args, dims):
            torch._dynamo.mark_dynamic(x, d)
        return compiled(*args)

    return call


def test_compiled_bucketing_equals_unpadded_and_compiles_once_per_bucket():
    torch.manual_seed(0)
    weight, table = torch.randn(4, 4), torch.randn(10, 4)
    cache, cache_tpu = torch.zeros(2, 16, 4), torch.zeros(2, 16, 4, device="tpu")
    compiled = _compile_bucketed(_rowwise_model, dims=(1, 1, 0))
    metrics.reset()
    with torch.no_grad():
        for n in (3, 6, 11):
            x, ids, pos = torch.randn(2, n, 4), torch.randint(0, 10, (2, n)), torch.arange(n)
            expected = _rowwise_model(x, ids, pos, cache, weight, table)
            actual = compiled(
                x.to("tpu"), ids.to("tpu"), pos.to("tpu"), cache_tpu,
                weight.to("tpu"), table.to("tpu"),
            )  # fmt: skip
            for a, e in zip(actual, expected):
                assert a.shape == e.shape
                torch.testing.assert_close(a.cpu(), e, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cache_tpu.cpu(), cache, atol=1e-5, rtol=1e-5)
    assert metrics.snapshot()["compiles: graph"] == 2  # buckets 8 and 16, three lengths
    (landed,) = metrics.buckets().values()
    assert set(landed) == {((3,), (8,)), ((6,), (8,)), ((11,), (16,))}
    assert "buckets of" in metrics.report_text()


def _sum_over_length(x):
    return x.sum(1)


def _last_row(x):
    return x[:, -1] * 2


def _softmax_over_length(x):
    return x.softmax(1)


def _contract_over_length(x):
    return x.transpose(1, 2) @ x


def _length_as_value(x):
    return x * x.shape[1]


def _cat_along_length(x):
    return torch.cat([x, x[:, :1]], 1) + 1


def _attention_over_padded_keys(x):
    q = x[:, None]
    return F.scaled_dot_product_attention(q, q, q)


def _causal_attention(x):
    q = x[:, None]
    return F.scaled_dot_product_attention(q, q, q, is_causal=True)


_REFUSED = [
    (_sum_over_length, "sum.*reduces over a padded dimension"),
    pytest.param(_last_row, "select.*selects from the end", marks=pytest.mark.slow),
    pytest.param(
        _softmax_over_length, "softmax.*reduces over a padded dimension", marks=pytest.mark.slow
    ),  # each refusal traces a graph (~5-10 s): the CI subset keeps one
    pytest.param(_contract_over_length, "contracts over a padded", marks=pytest.mark.slow),
    pytest.param(_length_as_value, "uses the padded size as a value", marks=pytest.mark.slow),
    pytest.param(_cat_along_length, "concatenates along a padded", marks=pytest.mark.slow),
    pytest.param(_attention_over_padded_keys, "reduces over a padded", marks=pytest.mark.slow),
    pytest.param(_causal_attention, "reduces over a padded", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("fn, message", _REFUSED)
def test_bucketing_refuses_ops_that_padding_would_change(fn, message):
    compiled = _compile_bucketed(fn)
    with torch.no_grad(), pytest.raises(Exception, match=f"cannot be bucketed: aten.*{message}"):
        compiled(torch.randn(2, 5, 4, device="tpu"))


@pytest.mark.slow  # traces a graph (~5 s); the refusal logic is covered above
def test_bucketing_refuses_graphs_that_need_gradients():
    w = torch.randn(4, 4, device="tpu", requires_grad=True)
    compiled = _compile_bucketed(lambda x: x @ w)
    with pytest.raises(Exception, match="needs gradients.*torch.no_grad"):
        compiled(torch.randn(2, 5, 4, device="tpu"))


@pytest.mark.slow  # compiles a graph (~10 s)
def test_select_at_a_fixed_index_checks_the_real_length():
    """x[:, 2] is right on a padded tensor only when the real length is above 2; below,
    the padded program would read padding, so the call raises CPU's IndexError."""
    compiled = _compile_bucketed(lambda x: x[:, 2] + 1)
    with torch.no_grad():
        x = torch.randn(2, 5, 4)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), x[:, 2] + 1)
        with pytest.raises(IndexError, match="out of bounds"):
            compiled(torch.randn(2, 2, 4, device="tpu"))


@pytest.mark.slow  # compiles two graphs (~20 s)
def test_without_bucket_options_every_length_compiles():
    """The baseline bucketing bounds: a dynamic graph without a policy compiles per length."""
    compiled = torch.compile(lambda x: F.relu(x) * 2, backend="tpu")
    metrics.reset()
    with torch.no_grad():
        for n in (3, 4, 5):
            x = torch.randn(2, n)
            torch._dynamo.mark_dynamic(x, 1)
            torch.testing.assert_close(compiled(x.to("tpu")).cpu(), F.relu(x) * 2)
    assert metrics.snapshot()["compiles: graph"] == 3
    assert metrics.buckets() == {}


def test_upload_of_a_new_length_compiles_nothing():
    """`.to("tpu")` of a host tensor installs the uploaded array: prompts of a new length
    must not compile a copy program (nor zeros) per shape on their way to the device."""
    torch.zeros(2, 3, dtype=torch.long).to("tpu")  # the first upload may set things up
    before = len(metrics.compiles())
    for n in (5, 7, 11):
        x = torch.arange(2 * n).reshape(2, n)
        t = x.to("tpu")
        assert torch.equal(t.cpu(), x)
        assert torch.equal(torch.arange(n, dtype=torch.float64).to("tpu").cpu(), x[0, :n] * 1.0)
    compiled = [e.name for e in metrics.compiles()[before:] if e.name != "read"]
    assert compiled == []  # the checks' host reads compile per shape; the uploads nothing
