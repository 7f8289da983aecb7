"""The engine's two decode kernels on the tiny model: "torch" (the exact path) and "numpy"
(reference_engine.decode_numpy, OpenBLAS GEMV over zero-copy views). Same math: logits agree to
float32 rounding, the KV cache and residual-stream side effects are the same, block bypass and
padding behave the same, and the exact path stays the engine's default.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from reference_engine.model import BypassMap, KVCache, decode_step, prefill  # noqa: E402

PROMPTS = ["hello there", "12345 + 678 = ", "def add(a, b):"]
ATOL = 2e-4  # float32 logits of a 6-block model: summation order moves them by ~1e-6


def _start(engine, prompts, extra):
    """Left-padded prefill of ``prompts``; returns what a decode loop needs."""
    rows = [engine.encode(p) for p in prompts]
    B, S = len(rows), max(len(r) for r in rows)
    ids = torch.full((B, S), engine.pad_id, dtype=torch.long)
    valid = torch.zeros(B, S + extra, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, S - len(r):] = torch.tensor(r)
        valid[b, S - len(r):] = True
    pos = (valid[:, :S].long().cumsum(-1) - 1).clamp(min=0)
    cache = KVCache.allocate(engine.dims, B, S + extra)
    logits = prefill(engine.weights, cache, ids, pos, valid)
    return cache, valid, pos[:, -1] + 1, logits.argmax(-1)


def _run(engine, prompts, kernel, steps, keep=None, bypass=None):
    cache, valid, pos, tok = _start(engine, prompts, steps + 1)
    stream = torch.empty(engine.dims.n_layers + 1, len(prompts), engine.dims.hidden)
    logits_seen, streams = [], []
    for _ in range(steps):
        logits = decode_step(engine.weights, cache, tok, pos, valid, keep, bypass, stream, kernel=kernel)
        logits_seen.append(logits.clone())
        streams.append(stream.clone())
        tok, pos = logits.argmax(-1), pos + 1  # both kernels fed the torch kernel's tokens below
    return logits_seen, streams, cache


def _run_forced(engine, prompts, kernel, tokens, keep=None, bypass=None):
    """Decode a fixed token sequence so the two kernels see identical inputs at every step."""
    cache, valid, pos, tok = _start(engine, prompts, len(tokens) + 1)
    stream = torch.empty(engine.dims.n_layers + 1, len(prompts), engine.dims.hidden)
    out, streams = [], []
    for t in [tok] + tokens[:-1]:
        out.append(decode_step(engine.weights, cache, t, pos, valid, keep, bypass, stream, kernel=kernel).clone())
        streams.append(stream.clone())
        pos = pos + 1
    return out, streams, cache


def test_exact_kernel_is_the_default(tiny_engine):
    assert tiny_engine.decode_kernel == "torch"


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch3-padded"])
def test_numpy_kernel_matches_torch_kernel(tiny_engine, prompts):
    ref, ref_streams, _ = _run(tiny_engine, prompts, "torch", 8)
    tokens = [l.argmax(-1) for l in ref]
    fast, fast_streams, _ = _run_forced(tiny_engine, prompts, "numpy", tokens)
    exact, exact_streams, _ = _run_forced(tiny_engine, prompts, "torch", tokens)
    for a, b in zip(exact, ref):
        assert torch.equal(a, b)  # forcing the torch kernel's own tokens reproduces it exactly
    for a, b, sa, sb in zip(exact, fast, exact_streams, fast_streams):
        assert b.dtype == torch.float32 and b.shape == a.shape
        assert torch.allclose(a, b, atol=ATOL, rtol=0), float((a - b).abs().max())
        assert torch.allclose(sa, sb, atol=ATOL, rtol=0)


def test_numpy_kernel_cache_and_bypass_match(tiny_engine):
    d = tiny_engine.dims
    keep = [True, False, True, False, True, True][:d.n_layers]
    gen = torch.Generator().manual_seed(0)
    bypass = [BypassMap(0.01 * torch.randn(d.hidden, 4, generator=gen), 0.01 * torch.randn(4, d.hidden, generator=gen))
              if not k and i == 1 else None for i, k in enumerate(keep)]
    ref, _, _ = _run(tiny_engine, PROMPTS[:2], "torch", 6, keep, bypass)
    tokens = [l.argmax(-1) for l in ref]
    exact, _, c_exact = _run_forced(tiny_engine, PROMPTS[:2], "torch", tokens, keep, bypass)
    fast, _, c_fast = _run_forced(tiny_engine, PROMPTS[:2], "numpy", tokens, keep, bypass)
    assert c_exact.length == c_fast.length
    for layer in range(d.n_layers):  # bypassed blocks still wrote their K/V, on both kernels
        assert torch.allclose(c_exact.k[layer], c_fast.k[layer], atol=ATOL, rtol=0)
        assert torch.allclose(c_exact.v[layer], c_fast.v[layer], atol=ATOL, rtol=0)
    for a, b in zip(exact, fast):
        assert torch.allclose(a, b, atol=ATOL, rtol=0)


def test_engine_generate_on_numpy_kernel(tiny_engine):
    before = tiny_engine.decode_kernel
    try:
        tiny_engine.decode_kernel = "numpy"
        [fast] = tiny_engine.generate([PROMPTS[2]], max_new_tokens=8, mode="off", log_level="NONE",
                                      return_logits=True)
    finally:
        tiny_engine.decode_kernel = before
    [exact] = tiny_engine.generate([PROMPTS[2]], max_new_tokens=8, mode="off", log_level="NONE",
                                   return_logits=True)
    assert len(fast.token_ids) >= 1 and fast.stats["decode_step_times_s"]
    n = next((i for i, (a, b) in enumerate(zip(exact.token_ids, fast.token_ids)) if a != b), len(fast.token_ids))
    # up to the first differing token (if any) both saw the same inputs: logits agree
    assert torch.allclose(exact.logits[:n + 1], fast.logits[:n + 1], atol=ATOL, rtol=0)


def test_unknown_kernel_is_named(tiny_engine):
    cache, valid, pos, tok = _start(tiny_engine, PROMPTS[:1], 2)
    with pytest.raises(ValueError, match="'cuda-graphs'"):
        decode_step(tiny_engine.weights, cache, tok, pos, valid, None, None, None, kernel="cuda-graphs")
