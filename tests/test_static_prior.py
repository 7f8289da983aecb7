"""router.static_prior: which units are candidates and how the gate's score is rescaled.

Candidates are the lowest mean cost per byte first, within the asked share of the bytes outside
the blacklist; the bias shift makes exp(score) = predicted / (lam * (mean + floor)) * tau0.
"""

from __future__ import annotations

import numpy as np
import pytest

from reference_engine.router import static_prior

IMPACT = np.array([0.5, 0.01, 0.02, 0.30, 0.01, 0.08])  # 3 blocks: (attn, mlp) each
BYTES = np.array([100, 400, 100, 400, 100, 400])  # an MLP reads four times an attention's bytes


def _cands(share: float, blacklist=frozenset()) -> list[int]:
    c, _ = static_prior(IMPACT, BYTES, blacklist, share, np.zeros(6), tau0=0.05, floor=0.0)
    return [int(u) for u in np.flatnonzero(c)]


def test_cheapest_per_byte_first_within_the_share() -> None:
    # cost per byte: u1 2.5e-5, u5 2e-4, u4 1e-4, u2 2e-4 (tie with u5: lower index first), u3 7.5e-4, u0 5e-3
    assert _cands(0.0) == []
    assert _cands(400 / 1500) == [1]
    assert _cands(500 / 1500) == [1, 4]
    assert _cands(600 / 1500) == [1, 2, 4]  # u5 (400) does not fit; a cheaper smaller one does not jump it
    assert _cands(1.0) == [0, 1, 2, 3, 4, 5]


def test_a_blacklisted_block_is_never_a_candidate_and_leaves_the_budget() -> None:
    assert _cands(1.0, frozenset({0})) == [2, 3, 4, 5]
    # outside block 0: 1000 bytes; by cost per byte u4, u2, u5 (tie with u2, higher index), u3
    assert _cands(200 / 1000, frozenset({0})) == [2, 4]
    assert _cands(599 / 1000, frozenset({0})) == [2, 4]  # u5 does not fit: candidates are a prefix
    assert _cands(600 / 1000, frozenset({0})) == [2, 4, 5]


def test_bias_reads_predicted_cost_relative_to_the_mean() -> None:
    bias = np.log(np.array([0.5, 0.01, 0.02, 0.30, 0.01, 0.08]))  # predicts exactly the mean
    _, shifted = static_prior(IMPACT, BYTES, frozenset(), 1.0, bias, tau0=0.05, lam=2.0, floor=0.0)
    np.testing.assert_allclose(np.exp(shifted.astype(np.float64)), 0.05 / 2.0, rtol=1e-6)
    _, with_floor = static_prior(IMPACT, BYTES, frozenset(), 1.0, bias, tau0=0.05, lam=1.0, floor=1e-4)
    np.testing.assert_allclose(np.exp(with_floor.astype(np.float64)), 0.05 * IMPACT / (IMPACT + 1e-4), rtol=1e-6)


def test_share_outside_zero_one_still_behaves() -> None:
    assert _cands(-0.1) == []
    assert _cands(2.0) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(Exception):
        static_prior(IMPACT[:3], BYTES, frozenset(), 0.5, np.zeros(6), tau0=0.05)
