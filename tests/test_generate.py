"""Greedy generation with a static KV cache on tpu: tokens equal CPU's, and after one
warm-up per bucket nothing compiles, whatever the prompt lengths. The hand-written loop
is examples/generate.py; HF models are built from tiny configs (no downloads)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import weakref

import pytest
import torch

from torch_tpu import metrics
from torch_tpu.bucketing import pad_sequences
from torch_tpu.tensor import storage_of

_EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "generate.py"
_spec = importlib.util.spec_from_file_location("generate_example", _EXAMPLE)
example = sys.modules["generate_example"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def _compiles() -> int:
    return metrics.snapshot().get("compiles", 0)


def _run_rounds(step_fn, model_cpu, model_tpu, batches, new_tokens, host_bucket=None):
    """Per batch of prompt lengths: tokens equal CPU eager's; returns compiles per batch
    (each with what compiled, when anything did)."""
    counts = []
    for k, lengths in enumerate(batches):
        prompts = example.prompts_of(lengths, model_cpu.c.vocab, seed=k)
        expected, _ = example.generate(example.step, model_cpu, prompts, new_tokens, "cpu")
        before, events = _compiles(), len(metrics.compiles())
        actual, _ = example.generate(step_fn, model_tpu, prompts, new_tokens, "tpu", host_bucket)
        n = _compiles() - before
        counts.append(n and (n, [(e.kind, e.name, e.reason) for e in metrics.compiles()[events:]]))
        assert torch.equal(actual, expected), f"lengths {lengths}: {actual} != {expected}"
    return counts


def _models(config):
    return example.build(0, config), example.build(0, config).to("tpu")


_SMALL = example.Config(vocab=64, hidden=32, layers=1, heads=2, kv_heads=1, ffn=32)


def test_compiled_decode_loop_matches_cpu_and_compiles_nothing_after_warmup(compile_first_calls):
    """A batch in bucket 8, one in bucket 16, then back to bucket 8 with other prompt
    lengths: the return compiles nothing (prefill padded to the same bucket, decode steps
    one static graph, and no program depends on what ran in between). Its own model
    size: other tests' programs of _SMALL would make the warm-ups compile nothing, in
    whatever order a worker runs them."""
    cpu, tpu = _models(example.Config(vocab=64, hidden=32, layers=1, heads=2, kv_heads=1, ffn=48))
    with torch.no_grad():
        counts = _run_rounds(example.compiled_step(8), cpu, tpu, [[3, 6], [15, 9], [5, 2]], 3)
    assert counts[0] and counts[1] and counts[2] == 0, counts


def test_compiled_decode_step_writes_the_kv_cache_in_place():
    """index_copy_ into the static cache is an input mutation of the compiled decode
    graph: each cache buffer is donated (XLA writes the step's keys and values into it),
    never copied, so the cache is not held twice; its contents equal CPU's."""
    model_cpu, model = _models(_SMALL)
    step_fn = example.compiled_step(8)
    batch, max_len = 2, 16
    caches = {d: m.new_cache(batch, max_len, d) for d, m in (("cpu", model_cpu), ("tpu", model))}

    def decode(device, pos: int):
        fn, m = (example.step, model_cpu) if device == "cpu" else (step_fn, model)
        ids = torch.tensor([[1], [2]])
        args = (ids, torch.tensor([pos]), torch.tensor([[pos], [pos]]))
        valid, last = torch.ones(batch, max_len, dtype=torch.bool), torch.zeros(1, dtype=torch.long)
        return fn(m, *(t.to(device) for t in (*args, valid, last)), *caches[device])

    with torch.no_grad():
        for device in ("cpu", "tpu"):
            decode(device, 0)  # the first step compiles (and copies the shared zeros)
        old = [weakref.ref(storage_of(c).array()) for c in caches["tpu"]]
        copies = metrics.snapshot().get("compiled_graph_donation_copies", 0)
        for device in ("cpu", "tpu"):
            decode(device, 1)
    assert metrics.snapshot().get("compiled_graph_donation_copies", 0) == copies
    assert all(ref() is None or ref().is_deleted() for ref in old), "a cache buffer was kept"
    for got, want in zip(caches["tpu"], caches["cpu"]):
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.slow  # 28 generate calls and four buckets (~2 min); the CI test runs two
def test_compiled_decode_loop_twenty_prompt_lengths_zero_compiles():
    cpu, tpu = _models(_SMALL)
    warmup = [[7, 3], [15, 9], [23, 17], [31, 25]]  # buckets 8, 16, 24, 32
    measured = [[n, max(1, n - 4)] for n in range(2, 30)]  # 28 distinct longest lengths
    with torch.no_grad():
        step_fn = example.compiled_step(8)
        _run_rounds(step_fn, cpu, tpu, warmup, 4)
        counts = _run_rounds(step_fn, cpu, tpu, measured, 4)
    assert counts == [0] * len(measured), counts
    (landed,) = [v for k, v in metrics.buckets().items() if k.startswith("step:")]
    assert {bucket for _, bucket in landed} == {(8,), (16,), (24,), (32,)}


@pytest.mark.slow  # fused-mode sweep (~1 min); the CI subset runs the compiled loop
def test_fused_decode_loop_with_host_buckets_matches_cpu():
    """Fused eager has no graph to check: the prompts are padded on the host to their
    bucket (pad_sequences) and masked; after one warm-up per bucket nothing compiles."""
    cpu, tpu = _models(_SMALL)
    with torch.no_grad(), torch.tpu.set_eager_mode("fused"):
        counts = _run_rounds(example.step, cpu, tpu, [[3, 6], [5, 2], [7, 1], [4, 4]], 3, 8)
    assert counts[0] and counts[1:] == [0, 0, 0], counts


# ------------------------------------------------------------- HF models


def _hf():
    # torchvision 0.28 on the registry is a CUDA build that cannot load here
    # (docs/models.md); text models need none of it, so transformers is told it is absent.
    sys.modules.setdefault("torchvision", None)
    return pytest.importorskip("transformers", reason="the models extra is not installed")


def _tiny(family: str):
    transformers = _hf()
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[family]
    config = config_class(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=0, eos_token_id=None, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    cpu = model_class(config).eval()
    tpu = model_class(config).eval()
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    # generate() compiles the decode step of a static cache on tpu, by default with
    # backend="inductor", which refuses tpu tensors: name the tpu backend.
    tpu.generation_config.compile_config = transformers.CompileConfig(backend="tpu")
    return cpu, tpu


@pytest.mark.slow  # each bucket's warm-up compiles ~100 eager ops (~50 s for both models)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hf_generate_static_cache_matches_cpu_and_compiles_nothing_after_warmup(family):
    """model.generate(cache_implementation="static") with prompts left-padded on the host
    to buckets of 8: greedy tokens equal CPU's (same padded inputs), and after a warm-up
    batch per bucket, 20 batches of distinct longest lengths (prompts of 1..23 tokens),
    taken in turn from buckets 8, 16 and 24 so that each goes back to a bucket warmed up
    before others, compile nothing. max_cache_len sizes the static cache once: without
    it transformers sizes it per call, growing (never shrinking) to the longest call so
    far, and an earlier bucket's prefill then runs at a new cache length, a genuinely
    new program (docs/serving.md)."""
    cpu, tpu = _tiny(family)
    options = dict(
        max_new_tokens=5, do_sample=False, cache_implementation="static", max_cache_len=40,
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)

    def run(n: int) -> int:
        prompts = [torch.randint(3, 128, (m,), generator=g).tolist() for m in (n, n - 1)]
        ids, mask = pad_sequences(prompts, side="left", bucket_size=8)
        expected = cpu.generate(ids, attention_mask=mask, **options)
        before = _compiles()
        actual = tpu.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), **options)
        compiled = _compiles() - before
        assert torch.equal(actual.cpu(), expected), f"length {n}"
        return compiled

    lengths = [n for n in range(2, 24) if n % 8]  # none fills its bucket
    measured = sorted(lengths, key=lambda n: ((n - 1) % 8, n))  # 9, 17, 2, 10, 18, 3, ...
    with torch.no_grad():
        for bucket in (8, 16, 24):
            assert run(bucket - 1), f"bucket {bucket}'s warm-up compiled nothing"
        counts = {n: run(n) for n in measured}
    assert len(counts) == 20 and set(counts.values()) == {0}, counts
    graphs = [code for code in metrics.shapes() if code[0] == "graph"]
    assert graphs, "generate() did not run a compiled graph"
