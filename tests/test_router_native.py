"""The unit router's per-token bookkeeping inside the native C step (issue 16) against its Python path.

Both drive the same native decode kernel on the tiny model, teacher-forced on the same tokens, so
they see the same logits and the same stream: the in-C thresholds (log_tau), decisions, entropy EMA,
gradient state and counters must equal the Python ``UnitRouter``'s (plan / after_step /
observe_step) to float rounding, step by step; the in-C router is bit-identical at 1 and 2 threads;
a degraded row vetoes every bypass; a finished row stops counting; and through the engine, the
DETAILED log and the stats are the same with the router in C or in Python.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reference_engine import decode_native  # noqa: E402
from reference_engine.model import KVCache, decode_step, prefill  # noqa: E402
from reference_engine.router import RouterCalibration, UnitRouter  # noqa: E402

NO_NATIVE = decode_native.unavailable_reason()
pytestmark = pytest.mark.skipif(NO_NATIVE is not None, reason=NO_NATIVE or "")

STEPS = 8


def _router(engine, batch, native, sensitivity=0.6, blacklist=frozenset({1}), target_bytes=0.0):
    """A UnitRouter with a random gate whose scores straddle the thresholds (some units go, most not),
    and a gradient reference small enough that the gradient factor moves."""
    d = engine.dims
    L = d.n_layers
    gen = np.random.default_rng(5)
    cal = RouterCalibration(impact=np.full(L, 0.01), rel_mean=np.full(L, 0.1),
                            grad_ref=gen.uniform(0.005, 0.05, L), entropy_ref=2.5, density_ref=0.3)
    tg = torch.Generator().manual_seed(7)
    w = 0.02 * torch.randn(2 * L, d.hidden, generator=tg)
    b = torch.empty(2 * L).uniform_(-5.0, -2.5, generator=tg)
    ub, bb = engine.unit_bytes()
    return UnitRouter(cal, w, b, ub, bb, batch, sensitivity, 0.08, blacklist,
                      np.linspace(0.8, 1.2, batch), 1.0, native=native, target_bytes=target_bytes)


def _drive(engine, router, ids_rows, active, done_at=None):
    """Prefill each row's ids[:-STEPS], then decode the last STEPS tokens teacher-forced with the
    router; returns per-step snapshots of its state and the final per-row counters."""
    d = engine.dims
    B = len(ids_rows)
    n = len(ids_rows[0])
    S = n - STEPS
    valid = torch.ones(B, n + 1, dtype=torch.bool)
    cache = KVCache.allocate(d, B, n + 1)
    prefill(engine.weights, cache, torch.tensor([r[:S] for r in ids_rows]), torch.arange(S)[None].repeat(B, 1),
            valid)
    stream = torch.empty(d.n_layers + 1, B, d.hidden)
    bytes_saved = np.zeros(B, dtype=np.int64)
    units = np.zeros(B, dtype=np.int64)
    snaps = []
    for i in range(S, n):
        done = [done_at is not None and b in done_at and i - S >= done_at[b] for b in range(B)]
        tok = torch.tensor([r[i] for r in ids_rows])
        pos = torch.full((B,), i)
        if router.native:
            gate = router.native_step(active, done, bytes_saved, units)
            logits = decode_step(engine.weights, cache, tok, pos, valid, None, None, None, kernel="native", gate=gate)
            by = router.last
        else:
            gate = router.plan(active)
            logits = decode_step(engine.weights, cache, tok, pos, valid, None, None, stream, kernel="native",
                                 gate=gate)
            by, saved = router.after_step(done)
            not_done = ~np.array(done)
            bytes_saved += np.where(not_done, saved, 0)
            units += np.where(not_done, int(by.sum()), 0)
            router.observe_step(stream, logits, by)
        snaps.append({"log_tau": gate.log_tau.clone(), "decisions": by.copy(), "entropy": router.entropy.copy(),
                      "grad": router.grad.copy(), "logits": logits.clone(), "flips": router.flips,
                      "ctl": router.ctl.copy()})
    return snaps, bytes_saved, units


def _rows(engine, B):
    texts = ["count to ten: one two three", "the capital of france is paris and"]
    rows = [engine.encode(t) for t in texts[:B]]
    n = min(len(r) for r in rows)
    return [r[:n - STEPS] + [(13 * i + 5 * b + 3) % engine.dims.vocab for i in range(STEPS)]
            for b, r in enumerate(rows)]


@pytest.mark.parametrize("batch,steered", [(1, False), (2, False), (1, True), (2, True)])
def test_in_c_router_matches_the_python_router(tiny_engine, batch, steered):
    """The C step's bookkeeping equals the Python router's, with and without the share controller
    (``steered``: a target of a third of the unit bytes per step, which the random gate misses, so
    the controller's factor moves)."""
    rows = _rows(tiny_engine, batch)
    active = np.ones(batch, dtype=bool)
    done_at = {1: 5} if batch == 2 else None  # row 1 finishes after 5 steps: its counts stop there
    target = float(tiny_engine.unit_bytes()[0].sum()) / 3 if steered else 0.0
    py, bs_py, u_py = _drive(tiny_engine, _router(tiny_engine, batch, native=False, target_bytes=target), rows,
                             active, done_at)
    rn = _router(tiny_engine, batch, native=True, target_bytes=target)
    nat, bs_nat, u_nat = _drive(tiny_engine, rn, rows, active, done_at)
    n_by = sum(int(s["decisions"].sum()) for s in py)
    assert 0 < n_by < len(py) * py[0]["decisions"].size  # some units bypassed, not all
    assert len({s["entropy"][0] for s in py}) > 1  # the entropy EMA moves
    for a, b in zip(py, nat):
        finite = torch.isfinite(a["log_tau"])
        assert torch.equal(finite, torch.isfinite(b["log_tau"]))  # blacklisted units -inf in both
        assert torch.allclose(a["log_tau"][finite], b["log_tau"][finite], atol=1e-5, rtol=0)
        assert np.array_equal(a["decisions"], b["decisions"])
        assert np.allclose(a["entropy"], b["entropy"], atol=1e-5, rtol=1e-5)
        assert np.allclose(a["grad"], b["grad"], atol=1e-5, rtol=1e-4)
        assert torch.equal(a["logits"], b["logits"])  # same kernel, same decisions
        assert a["flips"] == b["flips"]
        assert np.allclose(a["ctl"], b["ctl"], atol=1e-12, rtol=0)
    assert (np.abs(py[-1]["ctl"]) > 0).any() == steered  # the controller moved only where it is on
    if steered and batch == 2:  # a finished row's factor stops where it was
        assert py[-1]["ctl"][1] == py[5]["ctl"][1] != py[-1]["ctl"][0]
    assert np.array_equal(bs_py, bs_nat) and np.array_equal(u_py, u_nat)
    if batch == 2:
        assert bs_nat[1] < bs_nat[0] or n_by == 0
    # the Python views of the C-updated state give the Python numbers
    fresh = _router(tiny_engine, batch, native=False, target_bytes=target)
    fresh.ctl[:] = rn.ctl
    tau_py, f_ent, f_grad = fresh.thresholds((py[-1]["entropy"], py[-1]["grad"]))
    tau_nat, _, _ = rn.thresholds()
    assert np.allclose(tau_py, tau_nat, atol=1e-7, rtol=1e-5)
    assert rn.native_time_s() > 0 and rn._times[1] >= rn.native_time_s()


def test_in_c_router_is_bit_identical_at_one_and_two_threads(tiny_engine):
    rows = _rows(tiny_engine, 1)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(_drive(tiny_engine, _router(tiny_engine, 1, native=True), rows, np.ones(1, dtype=bool))[0])
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*runs):
        for k in ("log_tau", "logits"):
            assert torch.equal(a[k], b[k])
        for k in ("decisions", "entropy", "grad"):
            assert np.array_equal(a[k], b[k]), k


def test_a_degraded_row_vetoes_every_bypass_in_c(tiny_engine):
    rows = _rows(tiny_engine, 2)
    for native in (False, True):
        snaps, bs, units = _drive(tiny_engine, _router(tiny_engine, 2, native=native, sensitivity=1.0), rows,
                                  np.array([True, False]))
        for s in snaps:
            assert not s["decisions"].any()
            assert torch.isinf(s["log_tau"]).all() and (s["log_tau"] < 0).all()
        assert bs.tolist() == [0, 0] and units.tolist() == [0, 0]
        assert len({s["entropy"][0] for s in snaps}) > 1  # still observed, as the Python path does


def test_router_state_arrays_of_the_wrong_kind_are_named(tiny_engine):
    r = _router(tiny_engine, 1, native=True)
    with pytest.raises(ValueError, match="bytes_saved must be int64"):
        r.state.rebind("bytes_saved", np.zeros(1))
    with pytest.raises(ValueError, match="no array field 'nope'"):
        r.state.rebind("nope", np.zeros(1))


@pytest.fixture(scope="module")
def unit_engine(tiny_engine):
    from reference_engine import unit_predictor as up

    if getattr(tiny_engine, "_unit_predictor", None) is None:
        tiny_engine._unit_predictor = up.train(tiny_engine.weights, tiny_engine.encode, tiny_engine.eos_id,
                                               tiny_engine.weights_sha256, prompts=up.TRAIN_PROMPTS[:6],
                                               continuation_tokens=10)
    return tiny_engine


def test_engine_logs_and_stats_are_the_same_with_the_router_in_c(unit_engine, monkeypatch):
    assert unit_engine.decode_kernel == "native"
    make = type(unit_engine)._make_unit_router

    def python_router(self, rows, cfg, cal):
        r = make(self, rows, cfg, cal)
        r.native, r.gate.router_state = False, None  # the Python bookkeeping over the same kernel
        return r

    runs = []
    for patch in (False, True):
        if patch:
            monkeypatch.setattr(type(unit_engine), "_make_unit_router", python_router)
        buf = io.StringIO()
        with unit_engine.raw_unit_scale():  # every unit a candidate
            [r] = unit_engine.generate(["the quick brown fox jumps over the lazy dog"], max_new_tokens=12,
                                       mode="lossy", router="unit", sensitivity=1.0, hardware_watermark=0.0,
                                       log_level="DETAILED", log_file=buf, layer_blacklist=(1,))
        units = [json.loads(x) for x in buf.getvalue().splitlines() if '"event": "unit"' in x]
        runs.append((r, units))
    (rc, uc), (rp, up_) = runs
    assert rc.token_ids == rp.token_ids
    for k in ("bypassed_weight_bytes", "units_bypassed", "executed_blocks_per_step", "layers_bypassed"):
        assert rc.stats[k] == rp.stats[k], k
    assert rc.stats["bypassed_weight_bytes"] > 0
    assert len(uc) == len(up_) > 0
    for a, b in zip(uc, up_):
        assert a["decision"] == b["decision"] and a["bytes_saved"] == b["bytes_saved"]
        for k in ("score", "threshold", "f_entropy", "f_gradient"):
            assert abs(a[k] - b[k]) <= 1e-4 * max(1.0, abs(b[k])), (k, a, b)
    assert rc.stats["router_time_s"] > 0


@pytest.mark.parametrize("vocab", [1, 17, 392, 1000, 49152])
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_in_c_entropy_equals_numpy(vocab, scale):
    z = (scale * torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab))).float()
    z[2, vocab // 2] += 100.0  # one row nearly one-hot
    x = z.double().numpy()
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = -(p * np.log(np.maximum(p, 1e-300))).sum(-1)
    got = decode_native.entropy(z)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)


@pytest.mark.parametrize("vocab", [1, 17, 392, 49152])
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_in_c_log_sum_exp_equals_numpy(vocab, scale):
    """The degradation check's losses come from the same pass as the entropy (ood.loss_and_entropy)."""
    z = (scale * torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab + 1))).float()
    z[2, vocab // 2] += 100.0
    x = z.double().numpy()
    want = x.max(-1) + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1))
    ent, lse = decode_native.entropy_and_lse(z)
    assert np.allclose(lse, want, rtol=1e-6, atol=1e-5), (lse, want)
    assert np.array_equal(ent, decode_native.entropy(z))


def test_check_losses_native_match_torch(monkeypatch):
    """ood.loss_and_entropy gives the same losses and entropies (to 1e-5 nats) on the kernel as in torch."""
    from reference_engine import ood

    z = (3.0 * torch.randn(5, 1000, generator=torch.Generator().manual_seed(3))).float()
    targets = [0, 17, 999, 500, 3]
    nll, ent = ood.loss_and_entropy(z, targets)
    monkeypatch.setattr(ood, "_native_head_gemv", lambda: None)
    nll_t, ent_t = ood.loss_and_entropy(z, targets)
    assert np.allclose(nll, nll_t, atol=1e-5) and np.allclose(ent, ent_t, atol=1e-5)
    assert ood.loss_and_entropy(z[:0], [])[0].shape == (0,)
