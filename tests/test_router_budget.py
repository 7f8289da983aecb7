"""Equal-bytes matching of per-unit static removal (rsp_bench.engines.reference)."""

from __future__ import annotations

import pytest

from rsp_bench.engines.reference import random_units, shortgpt_units, unit_budget_bracket
from rsp_bench.errors import HarnessInputError


def test_bracket_interpolates_instead_of_rounding() -> None:
    unit_bytes = [10, 40, 10, 40]  # attention, MLP, attention, MLP
    order = [0, 2, 1, 3]  # cumulative budgets 0, 10, 20, 60, 100
    assert unit_budget_bracket(0, unit_bytes, order) == (0, 1, 0.0)
    assert unit_budget_bracket(15, unit_bytes, order) == (1, 2, 0.5)
    k0, k1, t = unit_budget_bracket(50, unit_bytes, order)
    assert (k0, k1) == (2, 3) and t == pytest.approx(0.75)
    assert unit_budget_bracket(100, unit_bytes, order)[2] == pytest.approx(1.0)


def test_bracket_names_bad_input() -> None:
    with pytest.raises(HarnessInputError, match="exceeds"):
        unit_budget_bracket(101, [10, 40, 10, 40], [0, 2, 1, 3])
    with pytest.raises(HarnessInputError, match="-1"):
        unit_budget_bracket(-1, [10], [0])
    with pytest.raises(HarnessInputError, match="order holds 7"):
        unit_budget_bracket(1, [10], [7])


def test_unit_orders_skip_the_blacklist_and_are_reproducible() -> None:
    influence = [0.9, 0.8, 0.01, 0.3, 0.02, 0.2, 0.5, 0.6]
    assert shortgpt_units(influence, {0, 3}) == [2, 4, 5, 3]
    a, b = random_units(8, {0}, seed=3), random_units(8, {0}, seed=3)
    assert a == b and sorted(a) == [2, 3, 4, 5, 6, 7]
    assert random_units(8, {0}, seed=4) != a or len(a) < 3
