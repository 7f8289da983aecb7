"""Lossless mode (reference_engine.speculative) on tiny random models: exactly mode "off", token
for token, whatever the drafts, plus cache rollback, stats and adaptive drafting (the draft
sources and cost model of reference_engine.draft_sources).

Two variants of the seeded tiny model are built in memory: "varied" (random full-strength blocks
and an untied LM head, so greedy output wanders and prompt lookup rarely hits) and "repeating"
(the stock tiny model with amplified blocks: long runs of one token with switches, so lookup
drafts are mostly accepted and sometimes rejected). No calibration is needed: the pruned draft
uses a fixed keep plan. Must not import the harness (``rsp_bench``).
"""

from __future__ import annotations

import io
import json

import pytest
import torch

from reference_engine.engine import Engine
from reference_engine.generation import PromptRow
from reference_engine.errors import PromptError
from reference_engine.model import KVCache, decode_step, prefill
from reference_engine.model_loading import load_hf_model, load_tokenizer, make_tiny_model
from reference_engine.draft_sources import NgramIndex, expected_gain
from reference_engine.speculative import DraftPolicy, generate_lossless, verify_forward

PROMPTS = ["The quick brown fox", "def add(a, b):", "Bonjour", "Who was the Norse leader?",
           "abc abc abc abc abc abc", "12345 + 678 = 13023. 12345 + 678 ="]
KEEP = [True, False, True, False, True, True]  # the pruned draft bypasses blocks 1 and 3
# Costs and priors pinned: decisions depend neither on timing nor on earlier requests.
PINNED = dict(verify_beta=0.1, pruned_cost=0.5, learn_priors=False)
N = 32


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny matrices: OpenMP barriers on a shared 2-core machine cost more than the work.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("lossless") / "tiny")


def _varied(path) -> Engine:
    hf = load_hf_model(path)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        d = hf.config.hidden_size
        hf.model.embed_tokens.weight.div_(20)
        hf.lm_head.weight = torch.nn.Parameter(torch.randn(hf.config.vocab_size, d, generator=g) * 4 / d ** 0.5)
        for layer in hf.model.layers:
            for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                        layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 3 / lin.weight.shape[1] ** 0.5)
    return Engine("tiny-varied", path, hf, load_tokenizer(path), "tiny-varied")


def _repeating(path) -> Engine:
    hf = load_hf_model(path)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.o_proj.weight.mul_(60)
            layer.mlp.down_proj.weight.mul_(60)
            layer.self_attn.q_proj.weight.mul_(3)
            layer.self_attn.k_proj.weight.mul_(3)
    return Engine("tiny-repeating", path, hf, load_tokenizer(path), "tiny-repeating")


@pytest.fixture(scope="module")
def varied(tiny_path):
    return _varied(tiny_path)


@pytest.fixture(scope="module")
def repeating(tiny_path):
    return _repeating(tiny_path)


_OFF: dict[tuple[str, str, int], list[int]] = {}


def _off(engine: Engine, prompt: str, n: int = N) -> list[int]:
    key = (engine.name, prompt, n)
    if key not in _OFF:
        _OFF[key] = engine.generate(prompt, max_new_tokens=n, mode="off", log_level="NONE")[0].token_ids
    return _OFF[key]


def _lossless(engine: Engine, prompt: str, policy: DraftPolicy, n: int = N):
    cfg = engine._config(None, {"mode": "lossless", "log_level": "NONE"})
    return generate_lossless(engine, [PromptRow(prompt, engine.encode(prompt))], n, cfg, None, policy)[0]


POLICIES = {
    "adaptive": DraftPolicy(draft_keep=KEEP, **PINNED),
    "lookup": DraftPolicy(force="lookup"),
    "pruned": DraftPolicy(force="pruned", draft_keep=KEEP),
    # The torch verify (certified) under native plain steps; the default on the native kernel is
    # the exact native verify, which needs no certificate.
    "lookup-torch": DraftPolicy(force="lookup", verify="torch"),
    # Every token from torch verify arithmetic lacks a certificate: each one goes through the exact replay.
    "repair-always": DraftPolicy(force="lookup", margin_eps=1e9, verify="torch"),
    "repair-sometimes": DraftPolicy(force="lookup", margin_eps=0.3, verify="torch"),
}


@pytest.mark.parametrize("which", ["varied", "repeating"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_lossless_equals_off(which, policy, request):
    engine = request.getfixturevalue(which)
    for prompt in PROMPTS[:2] + PROMPTS[4:]:
        got = _lossless(engine, prompt, POLICIES[policy])
        assert got.token_ids == _off(engine, prompt), (which, policy, prompt)
        assert got.stats["certificate_failures"] == 0


def test_lookup_hits_on_repetitive_output(repeating):
    hits = 0
    for prompt in PROMPTS:
        st = _lossless(repeating, prompt, DraftPolicy(pruned=False, **PINNED)).stats
        assert st["total_tokens"] == N
        assert st["verify_passes"] + st["plain_steps"] < N - 1  # fewer model passes than tokens
        hits += st["sources"]["prompt_lookup"]["accepted"]
    assert hits > 0.5 * len(PROMPTS) * N


def test_repairs_happen_and_stay_exact(repeating):
    st = _lossless(repeating, PROMPTS[0], POLICIES["repair-always"]).stats
    assert st["repairs"] > 0 and st["replayed_tokens"] >= st["repairs"]
    assert st["accepted"] == 0  # nothing uncertified is ever accepted


def test_engine_generate_dispatches_lossless(varied, repeating):
    for engine in (varied, repeating):
        log = io.StringIO()
        res = engine.generate(PROMPTS[:3], max_new_tokens=20, mode="lossless", log_level="SUMMARY", log_file=log)
        for prompt, r in zip(PROMPTS[:3], res):
            assert r.token_ids == _off(engine, prompt, 20)
            assert r.stats["mode"] == "lossless"
        lines = [json.loads(line) for line in log.getvalue().splitlines()]
        assert [line["event"] for line in lines] == ["request"] * 3


def test_eos_and_short_budgets(repeating, varied):
    for engine in (repeating, varied):
        for n in (1, 2, 3):
            for policy in ("lookup", "pruned"):
                got = _lossless(engine, PROMPTS[1], POLICIES[policy], n)
                assert got.token_ids == _off(engine, PROMPTS[1], n)
                assert len(got.stats["decode_step_times_s"]) == n - 1
    eos = repeating.eos_id
    cfg = repeating._config(None, {"mode": "lossless", "log_level": "NONE"})
    # A prompt ending in end-of-turn tokens: whatever comes out, it must stop where "off" stops.
    ids = repeating.encode(PROMPTS[0]) + [eos] * 4
    got = generate_lossless(repeating, [PromptRow("x", ids)], N, cfg, None, POLICIES["lookup"])[0]
    off = repeating._run([PromptRow("x", ids)], N, cfg.override(mode="off"), 0.0, None, None, None)[0]
    assert got.token_ids == off.token_ids


def test_cache_rollback_leaves_no_trace(varied):
    """Stale K/V past cache.length (drafts the verifier rejected) must never be read."""
    w, dims = varied.weights, varied.dims
    ids = varied.encode(PROMPTS[0])
    P = len(ids)
    key_valid = torch.ones(1, P + 16, dtype=torch.bool)
    fresh = KVCache.allocate(dims, 1, P + 16)
    used = KVCache.allocate(dims, 1, P + 16)
    for cache in (fresh, used):
        prefill(w, cache, torch.tensor([ids]), torch.arange(P)[None], key_valid)
    logits = verify_forward(w, used, [5, 6, 7, 8, 9], P, key_valid)
    assert logits.shape == (5, dims.vocab) and used.length == P + 5
    used.length = P  # reject everything
    a = decode_step(w, fresh, torch.tensor([11]), torch.tensor([P]), key_valid, None, None, None)
    b = decode_step(w, used, torch.tensor([11]), torch.tensor([P]), key_valid, None, None, None)
    assert torch.equal(a, b)  # bit for bit: positions past the rollback were overwritten or unread

    # The verify pass computes what sequential decode computes (up to GEMM vs GEMV rounding).
    seq = KVCache.allocate(dims, 1, P + 16)
    prefill(w, seq, torch.tensor([ids]), torch.arange(P)[None], key_valid)
    step = [decode_step(w, seq, torch.tensor([t]), torch.tensor([P + i]), key_valid, None, None, None)[0]
            for i, t in enumerate([5, 6, 7, 8, 9])]
    torch.testing.assert_close(logits, torch.stack(step), rtol=1e-4, atol=1e-4)


def test_stats_consistency(varied, repeating):
    for engine in (varied, repeating):
        for policy in ("adaptive", "pruned", "repair-sometimes"):
            r = _lossless(engine, PROMPTS[4], POLICIES[policy])
            st = r.stats
            n = st["total_tokens"]
            assert n == len(r.token_ids)
            assert st["drafted"] == st["accepted"] + st["rejected"]
            src = st["sources"]
            assert st["drafted"] == src["prompt_lookup"]["drafted"] + src["pruned"]["drafted"]
            assert st["accepted"] == src["prompt_lookup"]["accepted"] + src["pruned"]["accepted"]
            assert st["verify_passes"] == src["prompt_lookup"]["verify_passes"] + src["pruned"]["verify_passes"]
            parts = [k for k in src["prompt_lookup"] if k == "copy" or k[:1] == "n" and k[1:2].isdigit()]
            assert len(parts) == 1 + 3 * DraftPolicy().ngram_max  # copy, then n-gram length x match class
            assert src["prompt_lookup"]["drafted"] == sum(src["prompt_lookup"][k]["drafted"] for k in parts)
            for s in (st, src["prompt_lookup"], src["pruned"]):
                assert s["acceptance_rate"] == (s["accepted"] / s["drafted"] if s["drafted"] else 0.0)
            assert len(st["decode_step_times_s"]) == len(st["executed_blocks_per_step"]) == n - 1
            assert sum(st["decode_step_times_s"]) <= st["decode_time_s"] + 1e-6
            bypassed_per_draft = KEEP.count(False)
            assert st["layers_bypassed"] == src["pruned"]["drafted"] * bypassed_per_draft
            assert st["bypass_ratio"] == st["layers_bypassed"] / (engine.dims.n_layers * n)
            assert st["degraded"] is False and st["degraded_reason"] is None
            # Block passes: one full pass per plain step, verify pass and replayed token, plus drafts.
            L = engine.dims.n_layers
            expected = L * (st["plain_steps"] + st["verify_passes"] + st["replayed_tokens"]) \
                + src["pruned"]["drafted"] * KEEP.count(True)
            assert sum(st["executed_blocks_per_step"]) == expected


def test_drafting_switches_off_on_low_acceptance(varied):
    """Random output: lookup drafts fail, so after a few tries (and rare re-probes) steps are plain."""
    n = 60
    for prompt in PROMPTS:
        st = _lossless(varied, prompt, DraftPolicy(pruned=False, **PINNED), n).stats
        assert st["verify_passes"] <= 10, st
        assert st["plain_steps"] >= st["total_tokens"] - 1 - 2 * st["verify_passes"], st
    # A pruned draft that promises much (prior 0.9) but delivers little is dropped as well.
    policy = DraftPolicy(lookup=False, draft_keep=[True, False, False, False, False, True],
                         priors={"pruned": 0.9}, **PINNED)
    st = _lossless(varied, PROMPTS[0], policy, n).stats
    assert st["sources"]["pruned"]["acceptance_rate"] < 0.5
    assert st["verify_passes"] <= 10 and st["plain_steps"] >= st["total_tokens"] - 1 - 5 * st["verify_passes"], st


def test_expected_gain():
    assert expected_gain(0.0, 1, 0.0, 1.1) < 1.0  # a draft that always fails only costs
    assert expected_gain(0.9, 8, 0.0, 1.8) > 3.0
    assert expected_gain(0.5, 2, 0.8, 1.2) < 1.0  # an expensive draft does not pay at 50%


def test_ngram_index():
    idx = NgramIndex([1, 2, 3, 4, 1, 2, 5, 1, 2], 3)
    assert idx.draft(2, 3) == [5, 1, 2]  # latest earlier occurrence of (1, 2) wins
    assert idx.draft(3, 2) is None  # (5, 1, 2) never occurred before
    assert idx.draft(1, 1) == [5]
    loop = NgramIndex([7, 8, 9, 7, 8], 2)
    assert loop.draft(2, 7) == [9, 7, 8, 9, 7, 8, 9]  # copying past the end repeats the period
    idx.append(5)
    assert idx.draft(3, 1) == [1]
    assert idx.match(2) == 7 and idx.copy(7, 2) == [1, 2]
    # match classes: u (always followed by the same token, 2+ times), o (once), x (mixed)
    assert idx.match_class(2) == "o"  # (2, 5) once before, followed by 1
    assert NgramIndex([1, 2, 3, 1, 2, 4, 1, 2], 2).match_class(2) == "x"  # (1, 2) followed by 3, then 4
    assert NgramIndex([4, 5, 9, 4, 5, 9, 4, 5], 2).match_class(2) == "u"  # (4, 5) followed by 9 twice
    assert NgramIndex([4, 5, 9, 4], 2).match_class(1) == "o" and NgramIndex([4, 5], 2).match_class(1) is None


def test_too_long_prompt_is_refused(varied):
    cfg = varied._config(None, {"mode": "lossless"})
    with pytest.raises(PromptError, match="context"):
        generate_lossless(varied, [PromptRow("x", [5] * 500)], 100, cfg, None)
    with pytest.raises(ValueError, match="force"):
        generate_lossless(varied, [PromptRow("x", [5])], 2, cfg, None, DraftPolicy(force="bogus"))


def test_calibrated_draft_plan_and_degradation(repeating, monkeypatch):
    """The calibrated plan and the degradation checks run only once the pruned draft is wanted."""
    import numpy as np

    class Cal:
        impact = np.array([0.0, 0.1, 0.3, 0.2, 0.4, 0.0])

    calls = []
    monkeypatch.setattr(repeating, "calibration", lambda: Cal())

    def check(rows, hidden, cal):
        calls.append(len(hidden))
        if "odd" in rows[0].prompt:
            rows[0].degraded_reason = "test: odd input"

    monkeypatch.setattr(repeating, "_check_degradation", check)
    cfg = repeating._config(None, {"mode": "lossless", "log_level": "NONE"})
    plain = DraftPolicy(pruned=True, lookup=False, priors={"pruned": 0.0}, **PINNED)
    got = generate_lossless(repeating, [PromptRow("fine", repeating.encode("fine"))], 8, cfg, None, plain)[0]
    assert calls == [] and got.stats["sources"]["pruned"]["drafted"] == 0  # never wanted, never checked
    forced = DraftPolicy(force="pruned")
    for prompt, degraded in (("fine", False), ("odd", True)):
        got = generate_lossless(repeating, [PromptRow(prompt, repeating.encode(prompt))], 8, cfg, None, forced)[0]
        assert got.token_ids == _off(repeating, prompt, 8)
        assert got.stats["degraded"] is degraded
        assert (got.stats["sources"]["pruned"]["drafted"] > 0) is not degraded
        # blacklist {0, 5}; a quarter of 6 blocks rounds to 2: the two least-harmful others
        assert got.stats["layers_bypassed"] == 2 * got.stats["sources"]["pruned"]["drafted"]
    assert calls == [repeating.dims.n_layers + 1] * 2


def test_engine_learns_acceptance_across_requests(tiny_path):
    """A request's prior is the engine's recent acceptance: after copy-friendly requests the
    engine expects lookup drafts to be accepted; after random output it expects the opposite."""
    from reference_engine.draft_sources import _COSTS

    rates = {}
    for name, engine in (("repeating", _repeating(tiny_path)), ("varied", _varied(tiny_path))):
        policy = DraftPolicy(pruned=False, verify_beta=0.1)
        for prompt in PROMPTS[:3]:
            _lossless(engine, prompt, policy)
        used = [a for a in _COSTS[engine].acceptance.values() if a.passes]
        most = max(used, key=lambda a: a.passes)  # its rate has moved from the seed prior (<= 0.75)
        rates[name] = sum(a.accepted for a in used) / sum(a.drafted for a in used), most.rate
    assert rates["repeating"][0] > 0.8 and rates["repeating"][1] > 0.8
    assert rates["varied"][0] < 0.3 and rates["varied"][1] < 0.3
