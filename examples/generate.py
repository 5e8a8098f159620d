"""Batch greedy generation with a static KV cache on tpu, compiled with shape buckets.

    python examples/generate.py [--mode compiled|fused|strict|cpu] [--prompts 8]

A small Llama-style decoder (RMSNorm, rotary positions, grouped-query attention,
SwiGLU) built from random weights, and a hand-written decode loop:

- The KV cache is preallocated per layer, (batch, kv heads, max_len, head dim),
  and written in place with `index_copy_` at the step's cache positions.
- Prompts of mixed lengths are left-padded to the longest on the host; a
  per-row `key_valid` mask hides the pad slots, and every row's last prompt
  token sits at the same position, so one `last` index picks the logits.
- Compiled (`--mode compiled`): `torch.compile(step, options={"bucket_size":
  16})` with the prompt length marked dynamic (`torch._dynamo.mark_dynamic`;
  `dynamic=True` would also make the norms' float `eps` symbolic). The
  prompt length varies; the backend pads it
  to a multiple of 16 inside the graph's inputs and checks that padding cannot
  change the result (every op is row-wise along the prompt, attention runs over
  the static cache length). Decode steps have length 1: one more graph.
- Fused (`--mode fused`): no graph to check, so the host pads the prompt batch
  to its bucket itself (`torch_tpu.bucketing.pad_sequences`).

After one warm-up per bucket nothing compiles, whatever the prompt lengths.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import torch_tpu  # noqa: F401  (registers the tpu device when autoload is off)
from torch_tpu import metrics
from torch_tpu.bucketing import pad_sequences


@dataclass
class Config:
    vocab: int = 256
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    rope_theta: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Layer(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.c, self.d = c, c.hidden // c.heads
        self.norm1, self.norm2 = RMSNorm(c.hidden), RMSNorm(c.hidden)
        self.q = nn.Linear(c.hidden, c.heads * self.d, bias=False)
        self.kv = nn.Linear(c.hidden, 2 * c.kv_heads * self.d, bias=False)
        self.o = nn.Linear(c.heads * self.d, c.hidden, bias=False)
        self.up = nn.Linear(c.hidden, 2 * c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x, cos, sin, cache_pos, mask, k_cache, v_cache):
        b, s, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, s, self.c.heads, self.d).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, self.c.kv_heads, self.d).transpose(1, 3).unbind(2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_cache.index_copy_(2, cache_pos, k)  # the static cache, written in place
        v_cache.index_copy_(2, cache_pos, v)
        group = self.c.heads // self.c.kv_heads
        keys = k_cache.repeat_interleave(group, dim=1)
        values = v_cache.repeat_interleave(group, dim=1)
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyDecoder(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)
        d = c.hidden // c.heads
        self.register_buffer(
            "inv_freq", 1.0 / c.rope_theta ** (torch.arange(0, d, 2).float() / d), persistent=False
        )

    def new_cache(self, batch: int, max_len: int, device) -> list[torch.Tensor]:
        d = self.c.hidden // self.c.heads
        shape = (batch, self.c.kv_heads, max_len, d)
        return [torch.zeros(shape, device=device) for _ in range(2 * self.c.layers)]


def step(model: TinyDecoder, ids, cache_pos, pos_ids, key_valid, last, *cache):
    """One forward over `ids` (batch, length) written at `cache_pos`; returns every row's
    greedy next token, from the logits at position `last` (a 1-element index), and the
    positions advanced by one (a decode step's inputs for the next step)."""
    x = model.embed(ids)
    freqs = pos_ids[..., None].float() * model.inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    cos, sin = emb.cos(), emb.sin()
    slots = torch.arange(key_valid.shape[1], device=ids.device)
    mask = key_valid[:, None, None, :] & (slots[None, :] <= cache_pos[:, None])[None, None]
    for k, layer in enumerate(model.layers):
        x = layer(x, cos, sin, cache_pos, mask, cache[2 * k], cache[2 * k + 1])
    x = model.norm(x.index_select(1, last))
    return model.head(x)[:, 0].argmax(-1), cache_pos + 1, pos_ids + 1


def generate(
    step_fn, model, prompts, new_tokens: int, device, bucket_size: int | None = None,
    max_len: int = 64,
):  # fmt: skip
    """Greedy tokens (batch, new_tokens) on the host, and (prefill s, decode s). Prompts are
    left-padded on the host to the longest (to its bucket if bucket_size is given); the
    cache holds max_len positions whatever the prompts (one cache shape, one program)."""
    ids, valid = pad_sequences(prompts, side="left", bucket_size=bucket_size or 1)
    batch, length = ids.shape
    lengths = torch.tensor([len(p) for p in prompts])
    if length + new_tokens > max_len:
        raise ValueError(f"prompt {length} + {new_tokens} new tokens exceed max_len {max_len}")
    key_valid = torch.ones(batch, max_len, dtype=torch.bool)
    key_valid[:, :length] = valid.bool()
    pos_ids = (valid.cumsum(1) - 1).clamp(min=0)
    cache = model.new_cache(batch, max_len, device)
    key_valid = key_valid.to(device)

    start = time.perf_counter()
    token, _, _ = step_fn(
        model, ids.to(device), torch.arange(length).to(device), pos_ids.to(device),
        key_valid, torch.tensor([length - 1]).to(device), *cache,
    )  # fmt: skip
    first = token.cpu()  # waits for the prefill
    prefill = time.perf_counter() - start
    # The decode loop stays on the device: each step computes the next one's positions,
    # and the tokens are read once at the end (a read per step would wait for every
    # step in turn).
    start = time.perf_counter()
    zero = torch.zeros(1, dtype=torch.long).to(device)
    cache_pos, pos_ids = torch.tensor([length]).to(device), lengths[:, None].to(device)
    out = []
    for _ in range(1, new_tokens):
        token, cache_pos, pos_ids = step_fn(
            model, token[:, None], cache_pos, pos_ids, key_valid, zero, *cache
        )
        out.append(token)
    tokens = torch.cat([first[:, None], torch.stack(out, 1).cpu()], 1) if out else first[:, None]
    return tokens, (prefill, time.perf_counter() - start)


def compiled_step(bucket_size: int = 16):
    """The step under torch.compile on tpu. A prefill marks its length dynamic, and the
    backend pads it to a multiple of bucket_size; a decode step (length 1) is its own
    static graph."""
    compiled = torch.compile(step, backend="tpu", options={"bucket_size": bucket_size})

    def call(model, ids, cache_pos, pos_ids, *rest):
        if ids.shape[1] > 1:
            torch._dynamo.mark_dynamic(ids, 1)
            torch._dynamo.mark_dynamic(cache_pos, 0)
            torch._dynamo.mark_dynamic(pos_ids, 1)
        return compiled(model, ids, cache_pos, pos_ids, *rest)

    return call


def build(seed: int = 0, config: Config | None = None) -> TinyDecoder:
    torch.manual_seed(seed)
    return TinyDecoder(config or Config()).eval()


def prompts_of(lengths, vocab: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    modes = ("compiled", "fused", "strict", "cpu")
    parser.add_argument("--mode", choices=modes, default="compiled")
    parser.add_argument("--prompts", type=int, default=8, help="batch size")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--bucket-size", type=int, default=16)
    args = parser.parse_args()
    model = build()
    device = "cpu" if args.mode == "cpu" else "tpu"
    model.to(device)
    step_fn = compiled_step(args.bucket_size) if args.mode == "compiled" else step
    host_bucket = args.bucket_size if args.mode in ("fused", "strict") else None
    eager = "fused" if args.mode == "fused" else "strict"
    with torch.no_grad(), torch.tpu.set_eager_mode(eager):
        for round_, base in enumerate((3, 20, 4, 21)):  # two buckets, each seen twice
            lengths = [base + (k * 5) % 11 for k in range(args.prompts)]
            before = metrics.snapshot()
            tokens, (prefill, decode) = generate(
                step_fn, model, prompts_of(lengths, model.c.vocab, round_), args.new_tokens,
                device, host_bucket,
            )  # fmt: skip
            after = metrics.snapshot()
            compiles, loaded = (
                after.get(k, 0) - before.get(k, 0) for k in ("compiles", "compile_cache_disk_hits")
            )
            rate = tokens.shape[0] * (args.new_tokens - 1) / decode
            print(
                f"lengths {min(lengths)}..{max(lengths)}: prefill {prefill * 1e3:.1f} ms, "
                f"decode {rate:.0f} tok/s, compiles {compiles} (+{loaded} from the disk "
                f"cache), first row {tokens[0, :6].tolist()}"
            )
    if device == "tpu":
        print(metrics.report_text())


if __name__ == "__main__":
    main()
