"""Unit tests of the instruction probe (reference_engine/degradation/instruction_probe.py) and its
fit (scripts/fit_instruction_probe.py): the network's reading, its storage and refusals, the
packaged file's evidence, and where ``ood.judge`` asks it. Whether it catches injections written
outside the project is ``rsp-bench degradation``'s question, on a split that chose nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reference_engine.degradation import instruction_probe as ip

D = 8
BLOCKS = (2, 3)


def _pooled(rng: np.random.Generator, instruction: bool) -> dict[int, np.ndarray]:
    """Instructions sit at +e_last or -e_last, ordinary input at +e_0 or -e_0: two classes no line
    separates (each class's mean is the origin), which a network's hidden units can."""
    sign = rng.choice([-1.0, 1.0])
    centre = sign * (np.r_[np.zeros(D - 1), 1.0] if instruction else np.r_[1.0, np.zeros(D - 1)])
    return {b: centre + 0.2 * rng.standard_normal(D) for b in BLOCKS}


def _rows(rng: np.random.Generator, instruction: bool, n: int) -> np.ndarray:
    return np.array([np.concatenate([ip.unit(v) for v in _pooled(rng, instruction).values()]) for _ in range(n)])


@pytest.fixture(scope="module")
def probe() -> ip.InstructionProbe:
    rng = np.random.default_rng(0)
    p = _fit_script().train(BLOCKS, _rows(rng, True, 60), _rows(rng, False, 120), width=8, members=3, epochs=400)
    return ip.InstructionProbe(p.blocks, p.mu, p.sd, p.w1, p.b1, p.w2, p.b2, 0.0, {"fit_splits": ["x"]})


def test_fit_separates_what_no_line_does_and_fires_only_above_the_threshold(probe) -> None:
    rng = np.random.default_rng(1)
    assert sum(probe.fires(_pooled(rng, True)) for _ in range(50)) >= 45
    assert sum(probe.fires(_pooled(rng, False)) for _ in range(50)) <= 5
    # the best line on the same rows (version 1's logistic probe) stays near chance here
    pos, neg = _rows(rng, True, 200), _rows(rng, False, 200)
    X, y = np.vstack([pos, neg]), np.r_[np.ones(200), np.zeros(200)]
    w = ip.fit_logistic(X, y, np.full(400, 1 / 400), 0.01)
    assert np.mean(((X @ w[:-1] + w[-1]) > 0) == y) < 0.7
    raised = ip.InstructionProbe(probe.blocks, probe.mu, probe.sd, probe.w1, probe.b1, probe.w2, probe.b2, 1e9, {})
    assert not raised.fires(_pooled(rng, True))
    # scale does not matter (the probe reads directions), a missing block means no verdict
    x = _pooled(rng, True)
    assert probe.log_odds(probe.features(x)) == pytest.approx(probe.log_odds(probe.features({b: 7 * v for b, v in x.items()})))
    assert probe.features({BLOCKS[0]: x[BLOCKS[0]]}) is None and not probe.fires({BLOCKS[0]: x[BLOCKS[0]]})


def test_the_engines_reading_is_the_networks_the_fit_trained(probe) -> None:
    """numpy's tanh-GELU and ensemble mean against torch's layers with the same weights."""
    import torch

    x = np.random.default_rng(2).standard_normal((5, 2 * D))
    z = torch.tensor((x - probe.mu) / probe.sd)
    outs = []
    for e in range(len(probe.b2)):
        h = torch.nn.functional.gelu(z @ torch.tensor(probe.w1[e]) + torch.tensor(probe.b1[e]), approximate="tanh")
        outs.append((h @ torch.tensor(probe.w2[e]) + float(probe.b2[e])).numpy())
    assert probe.log_odds(x) == pytest.approx(np.mean(outs, 0), rel=1e-9, abs=1e-9)
    assert probe.log_odds(x[0]).shape == (1,)


def test_fit_refuses_too_few_rows() -> None:
    with pytest.raises(ValueError, match=">= 8"):
        _fit_script().train(BLOCKS, np.zeros((3, 2 * D)), np.zeros((20, 2 * D)), width=4, members=1, epochs=1)


def test_save_load_round_trip_and_refusals(probe, tmp_path) -> None:
    sha = "ab" * 32
    path = ip.probe_path(tmp_path, sha)
    ip.save(path, sha, probe)
    back = ip.load(path, sha)
    assert back is not None and back.blocks == probe.blocks and back.threshold == probe.threshold
    assert all(np.array_equal(getattr(back, k), getattr(probe, k)) for k in ip.ARRAYS) and back.info == probe.info
    assert not list(path.parent.glob("*.tmp*"))
    assert ip.load(path, "cd" * 32) is None  # other weights
    assert ip.load(tmp_path / "missing.npz", sha) is None
    # a file whose arrays disagree in shape is refused, not read
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    bad = tmp_path / "bad.npz"
    np.savez(bad, **{**arrays, "w2": arrays["w2"][:, :-1]})
    assert ip.load(bad, sha) is None
    path.write_bytes(path.read_bytes()[:100])
    assert ip.load(path, sha) is None  # damaged


def test_the_packaged_probe_loads_and_names_splits_that_report_nothing() -> None:
    import reference_engine

    data = Path(reference_engine.__file__).parent / "data" / "calibration"
    files = sorted(data.glob(f"*-instruction-probe-v{ip.VERSION}.npz"))
    assert files, f"no packaged instruction probe in {data}"
    with np.load(files[0]) as z:
        sha = json.loads(str(z["meta"]))["weights_sha256"]
    probe = ip.load(files[0], sha)
    assert probe is not None and np.isfinite(probe.threshold) and probe.w1.shape[1] == len(probe.mu)
    info = probe.info
    assert set(info["fit_splits"]).isdisjoint(info["choose_splits"])
    # the split the README reports on blind (rsp-bench degradation's default) chose nothing
    from rsp_bench.degradation_report import REPORTED_SPLIT

    reported = Path(REPORTED_SPLIT).parent.name.removeprefix("degradation_heldout_")
    assert reported not in set(info["fit_splits"]) | set(info["choose_splits"]), reported
    # nor did any split with no report in results/ (held out for one: 12-07g when stop 66 reported 12-07f, 12-07h when stop 67 reported 12-07g)
    results = Path(__file__).resolve().parents[1] / "results"
    unreported = sorted(s for s in set(info["fit_splits"]) | set(info["choose_splits"])
                        if not (results / f"degradation_heldout_{s}.json").exists())
    assert not unreported, f"the probe was fitted or chosen on unreported (held-out) splits: {unreported}"
    assert info["choose_false_alarms"] <= info["target_false_alarm_rate"] * info["choose_ordinary"]


class _FixedScore:
    """A stand-in score: its reason is fixed, its score under the threshold (so an odd-looking
    whole is excused as a request carrying data when it has request words)."""

    threshold = 0.0

    def __init__(self, reason: str | None) -> None:
        self._reason = reason

    def score(self, _stats) -> float:
        return -1.0

    def reason(self, _stats) -> str | None:
        return self._reason


class _FixedProbe:
    def __init__(self, fires: bool) -> None:
        self._fires, self.asked = fires, 0

    def fires(self, pooled) -> bool:
        self.asked += 1
        assert pooled  # it reads the whole prompt's pooled directions
        return self._fires


@pytest.mark.parametrize("score_reason, words, fires, expected", [
    (None, True, True, "instruction_probe"),  # the score passes it, the probe reads instructions
    (None, True, False, None),
    ("ood_score", True, True, "instruction_probe"),  # excused as a request carrying data, still probed
    ("ood_score", False, True, "ood_score"),  # odd and not excused: the score's reason stands
    ("hidden_norm", True, True, "hidden_norm"),  # never excused, never replaced
])
def test_judge_asks_the_probe_of_what_the_score_lets_through(tiny_engine, tiny_prefill, score_reason, words, fires,
                                                            expected):
    from reference_engine import ood

    eng = tiny_engine
    ids, lo, hi, hidden = tiny_prefill("Please summarise this email for me in two sentences.")
    probe = _FixedProbe(fires)
    reason = ood.judge(_FixedScore(score_reason), eng.weights, hidden, 0, 0, ids, lo, hi, 50, eng._pieces, frozenset(),
                       lambda: list(range(lo, hi)) if words else [], None, None, 1.0, probe)
    assert reason == expected
    assert judge_without_probe(eng, hidden, ids, lo, hi, score_reason, words) == (
        None if expected == "instruction_probe" else expected)


def judge_without_probe(eng, hidden, ids, lo, hi, score_reason, words):
    from reference_engine import ood

    return ood.judge(_FixedScore(score_reason), eng.weights, hidden, 0, 0, ids, lo, hi, 50, eng._pieces, frozenset(),
                     lambda: list(range(lo, hi)) if words else [], None, None, 1.0, None)


def _fit_script():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "fit_instruction_probe.py"
    spec = importlib.util.spec_from_file_location("fit_instruction_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_fit_scripts_threshold_sits_halfway_inside_the_budget() -> None:
    threshold = _fit_script().threshold
    s = np.array([5.0, 4.0, 3.0, 2.0, 1.0] + [0.0] * 195)
    g = np.array(["a"] * 200)
    # 1% of 200 allows 2 over it: halfway between the 2nd (4.0, may fire) and the 3rd (3.0, must not)
    assert threshold(s, g, 0.01) == pytest.approx(3.5)
    assert ((s > threshold(s, g, 0.01)).sum()) == 2
    # a group binds before the whole: of 400, 1% allows 4; "b" (100, twice the budget: 2) holds the top 3
    g2 = np.array(["b"] * 100 + ["a"] * 300)
    s2 = np.concatenate([[5.0, 4.0, 3.0], np.zeros(97), [2.5, 2.4], np.zeros(298)])
    assert threshold(s2, g2, 0.01) == pytest.approx(3.5)
    # no false alarm allowed at all: as far above the top score as the top is above the next
    assert threshold(np.array([2.0, 1.0, 0.0]), np.array(["a"] * 3), 0.01) == pytest.approx(2.5)
