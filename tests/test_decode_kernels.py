"""The engine's decode kernels on the tiny model: "torch" (the exact path), "numpy"
(reference_engine.decode_numpy, OpenBLAS GEMV over zero-copy views) and "native"
(reference_engine.decode_native, the whole step in one C call, compiled on first use). Same math:
logits agree to float32 rounding, the KV cache and residual-stream side effects are the same,
block bypass and padding behave the same, and the native kernel is the engine's default where it
builds (else torch). Without a C compiler the native kernel names what is missing, and the tests
that run it are skipped with that reason.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from reference_engine import decode_native  # noqa: E402
from reference_engine.model import BypassMap, KVCache, decode_step, prefill  # noqa: E402

PROMPTS = ["hello there", "12345 + 678 = ", "def add(a, b):"]
ATOL = 2e-4  # float32 logits of a 6-block model: summation order moves them by ~1e-6
try:
    decode_native.load_library()
    NO_NATIVE = None
except decode_native.NativeKernelUnavailable as exc:  # no C compiler here: say so, run the rest
    NO_NATIVE = f"the native decode kernel cannot be built here: {str(exc).splitlines()[0]}"
needs_native = pytest.mark.skipif(NO_NATIVE is not None, reason=NO_NATIVE or "")
FAST = ["numpy", pytest.param("native", marks=needs_native)]


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


def test_the_default_kernel_is_native_where_it_builds_and_the_env_chooses(tiny_engine, monkeypatch):
    from reference_engine.engine import KERNEL_ENV, default_decode_kernel

    assert tiny_engine.decode_kernel == default_decode_kernel() == ("native" if NO_NATIVE is None else "torch")
    assert default_decode_kernel({KERNEL_ENV: "torch"}) == "torch"
    with pytest.raises(ValueError, match="RSP_DECODE_KERNEL='cuda'"):
        default_decode_kernel({KERNEL_ENV: "cuda"})
    # no compiler: "auto" falls back to the torch kernel, an explicit "native" says why it cannot
    import reference_engine.decode_native as native

    def unavailable():
        raise native.NativeKernelUnavailable("the native decode kernel needs a C compiler")

    monkeypatch.setattr(native, "load_library", unavailable)
    assert default_decode_kernel({}) == "torch"
    with pytest.raises(native.NativeKernelUnavailable, match="needs a C compiler"):
        default_decode_kernel({KERNEL_ENV: "native"})


@pytest.mark.parametrize("kernel", FAST)
@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch3-padded"])
def test_fast_kernel_matches_torch_kernel(tiny_engine, prompts, kernel):
    ref, ref_streams, _ = _run(tiny_engine, prompts, "torch", 8)
    tokens = [l.argmax(-1) for l in ref]
    fast, fast_streams, _ = _run_forced(tiny_engine, prompts, kernel, tokens)
    exact, exact_streams, _ = _run_forced(tiny_engine, prompts, "torch", tokens)
    for a, b in zip(exact, ref):
        assert torch.equal(a, b)  # forcing the torch kernel's own tokens reproduces it exactly
    for a, b, sa, sb in zip(exact, fast, exact_streams, fast_streams):
        assert b.dtype == torch.float32 and b.shape == a.shape
        assert torch.allclose(a, b, atol=ATOL, rtol=0), float((a - b).abs().max())
        assert torch.allclose(sa, sb, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kernel", FAST)
def test_fast_kernel_cache_and_bypass_match(tiny_engine, kernel):
    d = tiny_engine.dims
    keep = [True, False, True, False, True, True][:d.n_layers]
    gen = torch.Generator().manual_seed(0)
    bypass = [BypassMap(0.01 * torch.randn(d.hidden, 4, generator=gen), 0.01 * torch.randn(4, d.hidden, generator=gen))
              if not k and i == 1 else None for i, k in enumerate(keep)]
    ref, _, _ = _run(tiny_engine, PROMPTS[:2], "torch", 6, keep, bypass)
    tokens = [l.argmax(-1) for l in ref]
    exact, _, c_exact = _run_forced(tiny_engine, PROMPTS[:2], "torch", tokens, keep, bypass)
    fast, _, c_fast = _run_forced(tiny_engine, PROMPTS[:2], kernel, tokens, keep, bypass)
    assert c_exact.length == c_fast.length
    for layer in range(d.n_layers):  # bypassed blocks still wrote their K/V, on both kernels
        assert torch.allclose(c_exact.k[layer], c_fast.k[layer], atol=ATOL, rtol=0)
        assert torch.allclose(c_exact.v[layer], c_fast.v[layer], atol=ATOL, rtol=0)
    for a, b in zip(exact, fast):
        assert torch.allclose(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kernel", FAST)
def test_engine_generate_on_fast_kernel(tiny_engine, kernel):
    before = tiny_engine.decode_kernel
    try:
        tiny_engine.decode_kernel = kernel
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


@needs_native
def test_native_kernel_greedy_output_equals_torch(tiny_engine):
    """Greedy generation, pruning off, batch 1 and a padded batch: the same tokens on both kernels."""
    before = tiny_engine.decode_kernel
    prompts = PROMPTS + ["Once upon a time", "the quick brown fox"]
    try:
        tiny_engine.decode_kernel = "native"
        fast = [r.token_ids for r in tiny_engine.generate(prompts, max_new_tokens=12, mode="off", log_level="NONE")]
        fast1 = [tiny_engine.generate([p], max_new_tokens=12, mode="off", log_level="NONE")[0].token_ids
                 for p in prompts]
    finally:
        tiny_engine.decode_kernel = before
    exact = [r.token_ids for r in tiny_engine.generate(prompts, max_new_tokens=12, mode="off", log_level="NONE")]
    exact1 = [tiny_engine.generate([p], max_new_tokens=12, mode="off", log_level="NONE")[0].token_ids
              for p in prompts]
    assert fast == exact and fast1 == exact1


@needs_native
def test_native_kernel_bypass_identity_and_map(tiny_engine):
    """A bypassed block without a map leaves the stream unchanged; with one it adds (h @ down) @ up."""
    d = tiny_engine.dims
    keep = [True, False, False, True, True, True][:d.n_layers]
    gen = torch.Generator().manual_seed(1)
    lin = BypassMap(0.05 * torch.randn(d.hidden, 3, generator=gen), 0.05 * torch.randn(3, d.hidden, generator=gen))
    bypass = [None, None, lin] + [None] * (d.n_layers - 3)
    ref, _, _ = _run(tiny_engine, PROMPTS[:1], "torch", 3, keep, bypass)
    tokens = [l.argmax(-1) for l in ref]
    _, streams, _ = _run_forced(tiny_engine, PROMPTS[:1], "native", tokens, keep, bypass)
    _, exact_streams, _ = _run_forced(tiny_engine, PROMPTS[:1], "torch", tokens, keep, bypass)
    for s, e in zip(streams, exact_streams):
        assert torch.equal(s[2], s[1])  # block 1 bypassed, no map: identity, bit for bit
        h = s[2]
        assert torch.allclose(s[3], h + (h @ lin.down) @ lin.up, atol=1e-6, rtol=0)
        assert torch.allclose(s, e, atol=ATOL, rtol=0)


@needs_native
def test_native_gemv_matches_matmul():
    gen = torch.Generator().manual_seed(2)
    for n, k, b in [(37, 19, 1), (64, 576, 1), (130, 33, 3)]:  # tails of the 16-wide and 4-row loops
        w, x = torch.randn(n, k, generator=gen), torch.randn(b, k, generator=gen)
        for threads in (1, 2):
            assert torch.allclose(decode_native.gemv(w, x, threads), x @ w.T, atol=1e-4, rtol=1e-5)



@needs_native
def test_native_gemv_gives_each_row_the_same_bits_whatever_the_row_count():
    """Several x rows take gemv_multi (AVX-512: 4 weight rows against up to 4 x rows per pass over
    k; AVX2: 4 against up to 3, one pass over k per accumulator chain), one takes gemv_rows: the batched decode step, the verify pass and the
    degradation check's head rely on every row coming out bit for bit as alone, so batch size
    never moves a token."""
    gen = torch.Generator().manual_seed(3)
    for n, k in [(130, 33), (64, 576), (41, 16), (37, 27)]:  # row tails; 16-wide, 8-wide and scalar tails
        w, x = torch.randn(n, k, generator=gen), torch.randn(13, k, generator=gen)
        alone = torch.cat([decode_native.gemv(w, x[i:i + 1], 1) for i in range(len(x))])
        for m in (2, 3, 4, 5, 8, 13):
            for threads in (1, 2):
                assert torch.equal(decode_native.gemv(w, x[:m], threads), alone[:m]), (n, k, m, threads)

def test_native_kernel_without_compiler_names_what_is_missing(tiny_engine, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(decode_native.shutil, "which", lambda name: None)
    monkeypatch.setattr(decode_native, "_LIB", None)
    monkeypatch.setattr(decode_native, "library_path", lambda cc=None: __import__("pathlib").Path("/nonexistent.so"))
    cache, valid, pos, tok = _start(tiny_engine, PROMPTS[:1], 2)
    with pytest.raises(decode_native.NativeKernelUnavailable, match="C compiler.*cc, gcc, clang"):
        decode_step(tiny_engine.weights, cache, tok, pos, valid, None, None, None, kernel="native")
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.raises(decode_native.NativeKernelUnavailable, match="no-such-compiler-xyz"):
        decode_native.find_compiler()
    assert cache.length == pos.item()  # nothing was written: the exact path is still usable


@needs_native
def test_native_kernel_is_bit_identical_across_threads(tiny_engine):
    """Each row's dot product and each head's attention run on one thread, whole: the thread count
    moves work, not summation order, so 1 and 2 threads give the same bits."""
    before = torch.get_num_threads()
    ref, _, _ = _run(tiny_engine, PROMPTS, "torch", 4)
    tokens = [l.argmax(-1) for l in ref]
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(_run_forced(tiny_engine, PROMPTS, "native", tokens))
    finally:
        torch.set_num_threads(before)
    (l1, s1, c1), (l2, s2, c2) = outs
    assert all(torch.equal(a, b) for a, b in zip(l1, l2)) and all(torch.equal(a, b) for a, b in zip(s1, s2))
    assert all(torch.equal(a, b) for a, b in zip(c1.k, c2.k))
