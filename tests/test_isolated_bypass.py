"""``forward_unit_alone`` (per-token bypass labels) against the plain one-pass forward: the output
at decode position t with a unit bypassed at t alone is what ``forward_units`` gives on the
sequence cut after t with the bypass starting at t."""

import pytest

torch = pytest.importorskip("torch")

from reference_engine.isolated_bypass import forward_unit_alone  # noqa: E402
from reference_engine.model import BypassMap, forward_units  # noqa: E402


@pytest.mark.parametrize("unit,with_map", [(2, False), (3, False), (2, True), (5, True)])
def test_alone_equals_cut_sequence(tiny_engine, unit, with_map):
    w, d = tiny_engine.weights, tiny_engine.dims
    ids = tiny_engine.encode("The quick brown fox jumps over the lazy dog, then sleeps all day.")
    S = len(ids) - 7
    gen = torch.Generator().manual_seed(unit)
    m = BypassMap(0.05 * torch.randn(d.hidden, 4, generator=gen), 0.05 * torch.randn(4, d.hidden, generator=gen)) \
        if with_map else None
    maps = [None] * (2 * d.n_layers)
    maps[unit] = m
    rec: dict = {}
    with torch.no_grad():
        clean = forward_units(w, torch.tensor([ids]), S, record=rec)
        alone = forward_unit_alone(w, rec, S, unit, m)
        assert alone.shape == clean.shape
        assert torch.allclose(alone[0], clean[0], atol=1e-5, rtol=0)  # the prompt's last output is untouched
        ka, km = [True] * d.n_layers, [True] * d.n_layers
        (km if unit % 2 else ka)[unit // 2] = False
        for t in range(S, len(ids) - 1):
            cut = forward_units(w, torch.tensor([ids[:t + 2]]), t, ka, km, unit_bypass=maps)
            assert torch.allclose(alone[t - S + 1], cut[1], atol=1e-4, rtol=0), t
        whole = forward_units(w, torch.tensor([ids]), S, ka, km, unit_bypass=maps)
    # bypassing every earlier position too differs from the bypass at t alone (what the labels fix)
    assert not torch.allclose(whole[2:], alone[2:], atol=1e-4)
    assert not torch.allclose(clean[1:], alone[1:], atol=1e-4)


def test_per_position_flags_equal_fixed_flags(tiny_engine):
    """The same unit bypassed at every decode position is forward_units with that unit off; no
    flag is pruning off."""
    from reference_engine.isolated_bypass import forward_units_per_position

    w, d = tiny_engine.weights, tiny_engine.dims
    ids = tiny_engine.encode("Count the apples: one, two, three, four, five, six.")
    S = len(ids) - 6
    seq = torch.tensor([ids])
    skip = torch.zeros(len(ids), 2 * d.n_layers, dtype=torch.bool)
    with torch.no_grad():
        assert torch.allclose(forward_units_per_position(w, seq, S, skip), forward_units(w, seq, S), atol=1e-5)
        skip[:, 3] = True
        skip[:, 4] = True
        km = [True] * d.n_layers
        ka = [True] * d.n_layers
        km[1] = False
        ka[2] = False
        assert torch.allclose(forward_units_per_position(w, seq, S, skip), forward_units(w, seq, S, ka, km), atol=1e-5)
        one = torch.zeros_like(skip)
        one[S + 2, 3] = True  # one position only: earlier rows untouched, later ones moved
        a, b = forward_units_per_position(w, seq, S, one), forward_units(w, seq, S)
        assert torch.allclose(a[:3], b[:3], atol=1e-6) and not torch.allclose(a[3:], b[3:], atol=1e-4)
