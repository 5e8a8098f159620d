"""examples/generate.py's decoder and greedy loop written by hand in JAX: the decode
benchmark's anchor for what XLA itself reaches on this machine (one jitted step, the
cache donated, tokens left on the device until the end), with no PyTorch in the loop."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu.bucketing import pad_sequences


def params_of(model) -> dict:
    """The example model's weights as JAX arrays on the CPU, by state-dict name."""
    state = {**model.state_dict(), "inv_freq": model.inv_freq}
    return {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in state.items()}


def _rms_norm(x, weight, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * weight


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + jnp.concatenate((-x[..., half:], x[..., :half]), -1) * sin


def make_step(config):
    """step_of(config) jitted, the cache donated."""
    return jax.jit(step_of(config), donate_argnums=6)


def step_of(config):
    """A step with the example step's inputs and outputs, plus the cache (a list)."""
    heads, kv_heads = config.heads, config.kv_heads
    d = config.hidden // heads

    def layer(p, x, cos, sin, cache_pos, mask, k_cache, v_cache):
        b, s, _ = x.shape
        h = _rms_norm(x, p["norm1.weight"])
        q = (h @ p["q.weight"].T).reshape(b, s, heads, d).transpose(0, 2, 1, 3)
        kv = (h @ p["kv.weight"].T).reshape(b, s, 2, kv_heads, d).transpose(0, 3, 2, 1, 4)
        k, v = kv[:, :, 0], kv[:, :, 1]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k_cache = k_cache.at[:, :, cache_pos].set(k)
        v_cache = v_cache.at[:, :, cache_pos].set(v)
        keys = jnp.repeat(k_cache, heads // kv_heads, axis=1)
        values = jnp.repeat(v_cache, heads // kv_heads, axis=1)
        scores = jnp.einsum("bhsd,bhtd->bhst", q, keys) / np.sqrt(d)
        # A finite fill: a pad query sees no key, and -inf would make its row NaN, and the
        # NaN would reach the real rows through the pad slots' cached values (0 * NaN).
        weights = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(scores.dtype).min), -1)
        a = jnp.einsum("bhst,bhtd->bhsd", weights, values)
        x = x + a.transpose(0, 2, 1, 3).reshape(b, s, -1) @ p["o.weight"].T
        gate, up = jnp.split(_rms_norm(x, p["norm2.weight"]) @ p["up.weight"].T, 2, -1)
        return x + (jax.nn.silu(gate) * up) @ p["down.weight"].T, k_cache, v_cache

    def step(params, ids, cache_pos, pos_ids, key_valid, last, cache):
        x = params["embed.weight"][ids]
        freqs = pos_ids[..., None].astype(jnp.float32) * params["inv_freq"]
        emb = jnp.concatenate((freqs, freqs), -1)[:, None]
        cos, sin = jnp.cos(emb), jnp.sin(emb)
        slots = jnp.arange(key_valid.shape[1])
        mask = key_valid[:, None, None, :] & (slots[None, :] <= cache_pos[:, None])[None, None]
        new_cache = []
        for k in range(config.layers):
            p = {n.split(".", 2)[2]: w for n, w in params.items() if n.startswith(f"layers.{k}.")}
            x, kc, vc = layer(p, x, cos, sin, cache_pos, mask, cache[2 * k], cache[2 * k + 1])
            new_cache += [kc, vc]
        x = _rms_norm(x[:, last], params["norm.weight"])
        logits = x @ params["head.weight"].T
        return jnp.argmax(logits[:, 0], -1), cache_pos + 1, pos_ids + 1, new_cache

    return step


def generate(step, params, config, prompts, new_tokens: int, bucket_size: int, max_len=64):
    """examples/generate.py's generate(), in JAX: prompts left-padded to their bucket on the
    host. Greedy tokens (batch, new_tokens) as a torch tensor, and (prefill s, decode s)."""
    ids, valid = pad_sequences(prompts, side="left", bucket_size=bucket_size)
    batch, length = ids.shape
    key_valid = np.ones((batch, max_len), dtype=bool)
    key_valid[:, :length] = valid.bool().numpy()
    pos_ids = (valid.cumsum(1) - 1).clamp(min=0).numpy()
    d = config.hidden // config.heads
    cache = [jnp.zeros((batch, config.kv_heads, max_len, d)) for _ in range(2 * config.layers)]
    key_valid = jnp.asarray(key_valid)

    start = time.perf_counter()
    token, _, _, cache = step(
        params, jnp.asarray(ids.numpy()), jnp.arange(length), jnp.asarray(pos_ids), key_valid,
        jnp.asarray([length - 1]), cache,
    )  # fmt: skip
    first = np.asarray(token)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    zero = jnp.zeros(1, dtype=jnp.int32)
    cache_pos = jnp.asarray([length])
    pos_ids = jnp.asarray([[len(p)] for p in prompts])
    out = []
    for _ in range(1, new_tokens):
        token, cache_pos, pos_ids, cache = step(
            params, token[:, None], cache_pos, pos_ids, key_valid, zero, cache
        )
        out.append(token)
    rest = np.asarray(jnp.stack(out, 1)) if out else np.zeros((batch, 0), dtype=first.dtype)
    tokens = torch.from_numpy(np.concatenate([first[:, None], rest], 1).astype(np.int64))
    return tokens, (prefill, time.perf_counter() - start)
