"""Per-unit bypass (attention and MLP of a block decided apart) on the tiny model.

The torch kernel's unit path equals its block path when every unit runs (bit for bit) and when a
whole block is bypassed; the numpy and native kernels equal torch to float32 rounding with units
and with the in-step gate (UnitGate); the one-pass teacher-forced ``forward_units`` equals prefill
plus decode steps with the same fixed flags.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from reference_engine import decode_native  # noqa: E402
from reference_engine.model import BypassMap, KVCache, UnitGate, decode_step, forward_units, prefill  # noqa: E402

ATOL = 2e-4
NO_NATIVE = decode_native.unavailable_reason()
needs_native = pytest.mark.skipif(NO_NATIVE is not None, reason=NO_NATIVE or "")
KERNELS = ["torch", "numpy", pytest.param("native", marks=needs_native)]


def _decode(engine, ids, n, kernel, gate_fn=None, **unit_kw):
    """Prefill ids[:S] then decode ids[S-1+1 ..] forced; returns logits per step and gate records."""
    S = len(ids) - n
    valid = torch.ones(1, len(ids) + 1, dtype=torch.bool)
    cache = KVCache.allocate(engine.dims, 1, len(ids) + 1)
    logits = [prefill(engine.weights, cache, torch.tensor([ids[:S]]), torch.arange(S)[None], valid)[0]]
    records = []
    for i in range(S, len(ids) - 1):
        gate = gate_fn() if gate_fn else None
        out = decode_step(engine.weights, cache, torch.tensor([ids[i]]), torch.tensor([i]), valid, None,
                          unit_kw.get("bypass"), None, kernel=kernel,
                          keep_attn=unit_kw.get("keep_attn"), keep_mlp=unit_kw.get("keep_mlp"), gate=gate,
                          unit_bypass=unit_kw.get("unit_bypass"))
        logits.append(out[0].clone())
        if gate is not None:
            records.append((gate.scores.clone(), gate.decisions.clone()))
    return torch.stack(logits), records


def _ids(engine, n=6):
    ids = engine.encode("count to ten: one two")
    return ids + [(7 * i + 11) % engine.dims.vocab for i in range(n)]


def test_unit_path_all_kept_is_bit_identical_to_block_path(tiny_engine):
    L = tiny_engine.dims.n_layers
    ids = _ids(tiny_engine)
    a, _ = _decode(tiny_engine, ids, 6, "torch")
    b, _ = _decode(tiny_engine, ids, 6, "torch", keep_attn=[True] * L, keep_mlp=[True] * L)
    assert torch.equal(a, b)


def test_both_units_off_equals_block_bypass_with_its_map(tiny_engine):
    d = tiny_engine.dims
    gen = torch.Generator().manual_seed(0)
    lin = BypassMap(0.05 * torch.randn(d.hidden, 3, generator=gen), 0.05 * torch.randn(3, d.hidden, generator=gen))
    bypass = [None, lin] + [None] * (d.n_layers - 2)
    ids = _ids(tiny_engine)
    keep = [True, False, False] + [True] * (d.n_layers - 3)
    S = len(ids) - 6
    valid = torch.ones(1, len(ids) + 1, dtype=torch.bool)
    outs = []
    for kw in ({"keep": keep}, {"keep": None, "keep_attn": keep, "keep_mlp": keep}):
        cache = KVCache.allocate(d, 1, len(ids) + 1)
        prefill(tiny_engine.weights, cache, torch.tensor([ids[:S]]), torch.arange(S)[None], valid)
        seq = [decode_step(tiny_engine.weights, cache, torch.tensor([ids[i]]), torch.tensor([i]), valid, kw["keep"],
                           bypass, None, keep_attn=kw.get("keep_attn"), keep_mlp=kw.get("keep_mlp"))
               for i in range(S, len(ids) - 1)]
        outs.append(torch.stack(seq))
    assert torch.allclose(outs[0], outs[1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kernel", KERNELS)
def test_fixed_unit_flags_match_torch_and_one_pass(tiny_engine, kernel):
    d = tiny_engine.dims
    ka = [True, False, True, False, True, True][:d.n_layers]
    km = [True, True, False, False, True, True][:d.n_layers]
    ids = _ids(tiny_engine)
    exact, _ = _decode(tiny_engine, ids, 6, "torch", keep_attn=ka, keep_mlp=km)
    fast, _ = _decode(tiny_engine, ids, 6, kernel, keep_attn=ka, keep_mlp=km)
    assert torch.allclose(exact, fast, atol=ATOL, rtol=0)
    one = forward_units(tiny_engine.weights, torch.tensor([ids]), len(ids) - 6, ka, km)
    assert one.shape == exact.shape
    assert torch.allclose(exact, one, atol=ATOL, rtol=0)
    full, _ = _decode(tiny_engine, ids, 6, "torch")
    assert not torch.allclose(full, exact, atol=1e-3)  # the flags did bypass something


def _unit_maps(d, units):
    gen = torch.Generator().manual_seed(1)
    maps = [None] * (2 * d.n_layers)
    for u in units:
        maps[u] = BypassMap(0.05 * torch.randn(d.hidden, 4, generator=gen), 0.05 * torch.randn(4, d.hidden, generator=gen))
    return maps


@pytest.mark.parametrize("kernel", KERNELS)
def test_unit_maps_match_torch_and_one_pass(tiny_engine, kernel):
    """Each bypassed unit adds its own map from the stream entering it (block 1: both units off,
    each with a map, in place of the block's map; block 2: only the MLP off, with a map; block 3:
    attention off, no map: identity)."""
    d = tiny_engine.dims
    ka = [True, False, True, False, True, True][:d.n_layers]
    km = [True, False, False, True, True, True][:d.n_layers]
    maps = _unit_maps(d, [2, 3, 5])
    block = [None, BypassMap(torch.ones(d.hidden, 1), torch.ones(1, d.hidden))] + [None] * (d.n_layers - 2)
    ids = _ids(tiny_engine)
    exact, _ = _decode(tiny_engine, ids, 6, "torch", keep_attn=ka, keep_mlp=km, unit_bypass=maps, bypass=block)
    fast, _ = _decode(tiny_engine, ids, 6, kernel, keep_attn=ka, keep_mlp=km, unit_bypass=maps, bypass=block)
    assert torch.allclose(exact, fast, atol=ATOL, rtol=0)
    one = forward_units(tiny_engine.weights, torch.tensor([ids]), len(ids) - 6, ka, km, block, unit_bypass=maps)
    assert torch.allclose(exact, one, atol=ATOL, rtol=0)
    plain, _ = _decode(tiny_engine, ids, 6, "torch", keep_attn=ka, keep_mlp=km)
    assert not torch.allclose(plain, exact, atol=1e-3)  # the maps changed the stream
    none, _ = _decode(tiny_engine, ids, 6, kernel, keep_attn=ka, keep_mlp=km, unit_bypass=[None] * (2 * d.n_layers),
                      bypass=block)
    assert torch.allclose(plain, none, atol=ATOL, rtol=0)  # no unit maps: identity, and no block map either


def _gate_fn(engine, thresholds):
    d = engine.dims
    gen = torch.Generator().manual_seed(3)
    w = 0.3 * torch.randn(2 * d.n_layers, d.hidden, generator=gen)
    b = torch.zeros(2 * d.n_layers)

    def make():
        g = UnitGate.allocate(w, b, 1)
        g.log_tau[:] = torch.tensor(thresholds)
        return g
    return make


@pytest.mark.parametrize("kernel", KERNELS)
def test_gate_decides_inside_the_step_like_torch(tiny_engine, kernel):
    d = tiny_engine.dims
    tau = [0.0] * (2 * d.n_layers)
    tau[0] = tau[-1] = float("-inf")  # a blacklisted unit never goes
    ids = _ids(tiny_engine)
    exact, rec_e = _decode(tiny_engine, ids, 6, "torch", gate_fn=_gate_fn(tiny_engine, tau))
    fast, rec_f = _decode(tiny_engine, ids, 6, kernel, gate_fn=_gate_fn(tiny_engine, tau))
    dec = torch.stack([r[1] for r in rec_e])
    assert 0 < int(dec.sum()) < dec.numel()  # some units bypassed, not all
    assert int(dec[:, 0].sum()) == 0 and int(dec[:, -1].sum()) == 0
    for (se, de), (sf, df) in zip(rec_e, rec_f):
        assert torch.equal(de, df)
        assert torch.allclose(se, sf, atol=1e-4, rtol=0)
        assert torch.equal(de.bool(), (se[0] < torch.tensor(tau)))
    assert torch.allclose(exact, fast, atol=ATOL, rtol=0)


def test_unit_flags_of_wrong_length_are_named(tiny_engine):
    ids = _ids(tiny_engine)
    with pytest.raises(ValueError, match="keep_attn has 2 entries"):
        _decode(tiny_engine, ids, 2, "torch", keep_attn=[True, False])


@needs_native
def test_native_gate_is_bit_identical_at_one_and_two_threads(tiny_engine):
    d = tiny_engine.dims
    tau = [0.0] * (2 * d.n_layers)
    ids = _ids(tiny_engine)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(_decode(tiny_engine, ids, 6, "native", gate_fn=_gate_fn(tiny_engine, tau)))
    finally:
        torch.set_num_threads(before)
    (l1, r1), (l2, r2) = runs
    assert torch.equal(l1, l2)
    for (s1, d1), (s2, d2) in zip(r1, r2):
        assert torch.equal(s1, s2) and torch.equal(d1, d2)


def test_default_router_is_unit_and_falls_back_to_block_without_a_predictor(tiny_engine, monkeypatch, caplog):
    """The unit router is the default; where the weights have no predictor a request never waits
    half an hour for one: the block router runs, one WARNING per process, the reason in the stats."""
    from reference_engine import PruningConfig

    cfg = PruningConfig(hardware_watermark=0.0, log_level="NONE")
    assert cfg.router == "unit"
    monkeypatch.setattr(tiny_engine, "unit_predictor_available", lambda: False)
    monkeypatch.setattr(tiny_engine, "_router_fallback_warned", False, raising=False)
    with caplog.at_level("WARNING", logger="reference_engine"):
        a, b = (tiny_engine.generate(["Hello there"], max_new_tokens=4, config=cfg)[0] for _ in range(2))
    assert a.stats["router"] == "block" and "no unit-router predictor" in a.stats["router_fallback"]
    assert b.stats["router_fallback"] == a.stats["router_fallback"]
    assert sum("no unit-router predictor" in r.getMessage() for r in caplog.records) == 1
    [blk] = tiny_engine.generate(["Hello there"], max_new_tokens=4, config=cfg.override(router="block"))
    assert blk.stats["router"] == "block" and blk.stats["router_fallback"] is None
    assert blk.token_ids == a.token_ids  # the fallback is the block router, nothing else
    [off] = tiny_engine.generate(["Hello there"], max_new_tokens=4, config=cfg.override(mode="off"))
    assert off.stats["router"] is None and off.stats["router_fallback"] is None
