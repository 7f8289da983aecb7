"""Design experiment (issue 26): does a score whose weights keep their meaning generalise better?

The packaged score (reference_engine/ood.py) is a free logistic fit of ten features on the normal
calibration corpus against eight generated tuning classes. Several features are collinear, and the
free fit gives two of them that measure oddness ("unsure": the share of positions where the model is
not confident; "no_easy": the share of tokens that were not easy) *negative* weights, so text on
which the model is never confident scores as less odd. On 12-05, the split nobody steered, noise in
non-Latin scripts (Hangul and Devanagari syllable jumbles, Cyrillic pseudo-words) was missed with
both features at 1.0.

Variants compared here, each refitted on the same calibration and tuning stats, its threshold chosen
as the packaged one is (``--target-far`` on the normal held-out part):
- ``free``: the packaged fit (reproduced here);
- ``signed``: every weight constrained to the sign its feature's meaning says (higher = odder for
  all but ``entropy_spread``, whose sign is left free), by projected Newton steps;
Both are judged on the development splits as the engine judges a prompt (text rules, the score,
the request rule, the language rule's margin), from stats collected once per prompt through the
engine's own check (``--cache``, about 35 min on 2 cores for the eight development splits).

    python scripts/ood_design.py [--cache /tmp/ood_design.pkl] [--out results/ood_design_dev.json]

Result (2026-12-05, results/ood_design_dev.json, 35 min on 2 cores, offline decisions equal to the
engine's on 5,327 of 5,327 items): the signed fit keeps high_loss, entropy, short_tokens and the far
distances, zeroes unsure, no_easy, surprise_gap and byte_pieces, and over the eight development
splits degrades fewer other-language requests (339 against 432 of 1,171) and fewer odd inputs (923
against 958 of 1,071; on 12-05 94 against 97 of 145); the syllable jumbles stay missed. Neither fit
has seen such noise among its tuning classes, and the signs do not make up for that. With a ninth
tuning class of such noise (``--extra-tuning script_syllables``, generated here, not a suite class)
the threshold chosen for the same false-alarm rate moves up and every group degrades less: odd 884
(free) and 861 (signed) of 1,071, other languages 287 and 254 of 1,171, data requests 17 and 21 of
1,364; on 12-05 the odd inputs caught fall to 81 and 76 of 145. On these features the variants lie on
one trade-off curve; none lifts odd inputs at the packaged false-alarm cost. The packaged free fit
stays.

The packaged score's own trade-off (stop 46, ``--threshold-sweep=-1,-0.75,-0.5,-0.25,0,0.25,0.5
--out results/ood_threshold_sweep_dev.json``, a few seconds on the cache of 2026-12-05 01:02, the
cached stats re-judged with the text rules and language rule that ship): over the eight development
splits the detector as shipped degrades 985 of 1,071 odd inputs (0.920) and 44 of 1,364 data
requests (0.032). Lowering the threshold buys odd inputs slowly and data requests fast: -0.25 gives
0.939 odd for 0.050 data, -0.5 0.951 for 0.085, -1.0 0.962 for 0.200 (plain English 9 of 357).
On the splits the detector was developed on, the score reaches 95% of odd inputs only at about
three times the false alarms on data requests that issue 26 allows; on the blind splits (odd 0.56-0.76)
it is further away. Moving the threshold is not the way to the odd-input target.

Must not be imported by the engine or the harness; it records a design decision.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import random
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from reference_engine import degradation, ood  # noqa: E402
from reference_engine.engine import Engine  # noqa: E402
from rsp_bench.adversarial import machine_text as mt  # noqa: E402
from rsp_bench.metrics import wilson_interval  # noqa: E402
from rsp_bench.storage import atomic_write_json  # noqa: E402

DEV_SPLITS = ("degradation_heldout", "degradation_heldout_2026-12-03", "degradation_heldout_2026-12-03b",
              "degradation_heldout_2026-12-04", "degradation_heldout_2026-12-04b", "degradation_heldout_2026-12-04c",
              "degradation_heldout_2026-12-04d", "degradation_heldout_2026-12-05")
BATCH = 8  # prompts per engine call, as rsp-bench degradation batches them
# +1: higher is odder; 0: sign left to the fit
SIGNS = {"high_loss": 1, "entropy": 1, "unsure": 1, "no_easy": 1, "surprise_gap": 1, "entropy_spread": 0,
         "short_tokens": 1, "byte_pieces": 1}


# Letters of one script each, as ordinary text in that script is written (consonant + vowel sign
# for the abugidas, whole syllable blocks for Hangul); the normal corpus holds plain text in each.
_SCRIPT_SYLLABLES: dict[str, tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]] = {
    "hangul": (((0xAC00, 0xD7A3),), ()),
    "devanagari": (((0x915, 0x939),), ((0x93E, 0x94C),)),
    "bengali": (((0x995, 0x9B9),), ((0x9BE, 0x9CC),)),
    "thai": (((0xE01, 0xE2E),), ((0xE31, 0xE39),)),
    "cyrillic": (((0x430, 0x44F),), ()),
    "greek": (((0x3B1, 0x3C9),), ()),
    "arabic": (((0x628, 0x64A),), ()),
    "hebrew": (((0x5D0, 0x5EA),), ()),
    "georgian": (((0x10D0, 0x10F0),), ()),
    "armenian": (((0x561, 0x586),), ()),
    "kana": (((0x3041, 0x3093), (0x30A1, 0x30F3)), ()),
    "tamil": (((0xB95, 0xBB9),), ((0xBBE, 0xBCC),)),
}


def script_syllables(rng: random.Random) -> str:
    """Random letters or syllables of one script (Hangul, Devanagari, Cyrillic, Arabic, ...) in
    word-sized groups with the odd full stop: the script's characters, none of its words."""
    base, signs = _SCRIPT_SYLLABLES[rng.choice(sorted(_SCRIPT_SYLLABLES))]
    words = []
    for _ in range(rng.randint(8, 50)):
        word = ""
        for _ in range(rng.randint(1, 4 if not signs else 3) * (1 if base[0][0] >= 0x3000 else 2)):
            lo, hi = rng.choice(base)
            word += chr(rng.randint(lo, hi))
            if signs and rng.random() < 0.6:
                word += chr(rng.randint(*signs[0]))
        words.append(word + ("." if rng.random() < 0.1 else ""))
    return " ".join(words)


EXTRA_CLASSES = {"script_syllables": script_syllables}  # generated here, not in the suite's classes


def _make_extra(name: str, seed: int) -> str:
    return EXTRA_CLASSES[name](random.Random(f"{name}:{seed}"))


def _corpus(part: str) -> list[str]:
    path = ROOT / "fixtures" / "normal_corpus" / f"{part}.jsonl"
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def collect(engine: Engine, limit: int | None = None, calib_cache: Path | None = None) -> dict:
    """Calibration stats as scripts/calibrate_ood.py collects them, and per development item what
    the engine's check sees: its text reason, the whole content's stats, the request words' stats,
    the language rule's margin and whether the request words cover enough of the prompt."""
    t0 = time.perf_counter()
    say = lambda what: lambda i, n: print(f"\r{what}: {i}/{n} ({time.perf_counter() - t0:.0f} s)", end="",  # noqa: E731
                                          file=sys.stderr, flush=True)
    cut = slice(None, limit)
    if calib_cache is not None and calib_cache.is_file():
        out = pickle.loads(calib_cache.read_bytes())
    else:
        out = {"calib": ood.collect(engine.weights, engine.encode, _corpus("calibration")[cut], engine._byte_ids(),
                                    say("calib")),
               "held": ood.collect(engine.weights, engine.encode, _corpus("heldout")[cut], engine._byte_ids(),
                                   say("held")),
               "odd_fit": ood.collect(engine.weights, engine.encode,
                                      [mt.make(n, s) for n in mt.TUNING for s in range(16)][cut], engine._byte_ids(),
                                      say("tuning"))}
    captured: list = []
    print(file=sys.stderr)
    real_judge = ood.judge

    def judge(det, w, hidden, row, offset, ids, lo, hi, n_chars, pieces, byte_ids=frozenset(), request_tokens=None,
              scored=None, plain_margin=None, min_coverage=1.0):
        whole = ood.prompt_stats(w, hidden, row, offset, ids, lo, hi, n_chars, byte_ids, scored)
        table = pieces()
        words = request_tokens() if request_tokens is not None else None
        if words is None:
            words = ood.request_words.request_tokens(ids, max(lo, 1), hi, table.classes)
        words = [i for i in words if max(lo, 1) <= i < hi]
        sub = ood.subset_stats(w, hidden, row, offset, ids, words, whole, table, byte_ids) if words else None
        margin = plain_margin(whole) if plain_margin else 0.0
        cover = len(words) >= min_coverage * max(1, hi - max(lo, 1))
        captured.append((whole, sub, margin, cover))
        return real_judge(det, w, hidden, row, offset, ids, lo, hi, n_chars, pieces, byte_ids, request_tokens, scored,
                          plain_margin, min_coverage)

    if calib_cache is not None:
        calib_cache.write_bytes(pickle.dumps(out))
    ood.judge = judge
    items = []
    try:
        rows = [(split, json.loads(line)) for split in DEV_SPLITS
                for line in (ROOT / "fixtures" / split / "prompts.jsonl").read_text(encoding="utf-8").splitlines()[cut]]
        # batches of similar token length, as rsp-bench degradation runs them (padding to a long
        # prompt made unsorted batches six times slower)
        n_tok = [len(engine.encode(x["text"])) for _, x in rows]
        rows = [rows[i] for i in sorted(range(len(rows)), key=lambda i: n_tok[i])]
        for at in range(0, len(rows), BATCH):
            batch = rows[at:at + BATCH]
            captured.clear()
            results = engine.generate([x["text"] for _, x in batch], max_new_tokens=1)
            checks = iter(captured)  # the check judges, in batch order, the rows no text rule took
            for (split, x), r in zip(batch, results):
                text_reason = degradation.text_anomaly_reason(x["text"])
                items.append({"split": split, "id": x["id"], "group": x["group"], "kind": x["kind"],
                              "lang": x.get("lang"), "text_reason": text_reason,
                              "engine_reason": r.stats["degraded_reason"],
                              "check": next(checks) if text_reason is None else None})
            say("development items")(min(at + BATCH, len(rows)), len(rows))
    finally:
        ood.judge = real_judge
    print(file=sys.stderr)
    out["items"] = items
    return out


def fit_signed(A: np.ndarray, y: np.ndarray, wts: np.ndarray, ridge: float, signs: np.ndarray) -> np.ndarray:
    """ood._logistic with each weight kept on its sign (projected Newton: a weight that would cross
    zero is held at zero and the step is re-solved without it)."""
    A1 = np.c_[A, np.ones(len(A))]
    w = np.zeros(A1.shape[1])
    pen = np.r_[np.full(A.shape[1], ridge), 0.0]
    sign = np.r_[signs, 0]
    for _ in range(200):
        p = 1.0 / (1.0 + np.exp(-np.clip(A1 @ w, -30, 30)))
        g = A1.T @ (wts * (p - y)) + pen * w
        H = (A1 * (wts * p * (1 - p))[:, None]).T @ A1 + np.diag(pen) + 1e-9 * np.eye(len(w))
        # free: unconstrained, or inside its sign, or at zero with the gradient pushing it inward
        free = (sign == 0) | (sign * w > 0) | (sign * g < 0)
        step = np.zeros_like(w)
        step[free] = np.linalg.solve(H[np.ix_(free, free)], g[free])
        new = w - step
        new[(sign != 0) & (sign * new < 0)] = 0.0
        if np.abs(new - w).max() < 1e-9:
            w = new
            break
        w = new
    return w


def refit(det: ood.OODDetector, calib, odd_fit, held, target_far: float, signed: bool) -> ood.OODDetector:
    """A copy of ``det`` (same bank, prior, standardisation) with weights refitted and its threshold
    chosen for ``target_far`` on the held-out normal part, as ood.fit does."""
    import copy

    new = copy.deepcopy(det)
    Xc = np.array([det.features(s, exclude=i) for i, s in enumerate(calib)])
    Xo = np.array([det.features(s) for s in odd_fit])
    A = (np.vstack([Xc, Xo]) - det.mu) / det.sd
    y = np.r_[np.zeros(len(Xc)), np.ones(len(Xo))]
    wts = np.r_[np.full(len(Xc), 0.5 / len(Xc)), np.full(len(Xo), 0.5 / len(Xo))]
    if signed:
        signs = np.array([SIGNS.get(n, 1) for n in det.names], float)
        new.weights = fit_signed(A, y, wts, ood.RIDGE, signs)
    else:
        new.weights = ood._logistic(A, y, wts, ood.RIDGE)
    held_scores = np.array([new.score(s) for s in held])
    new.threshold = float(np.quantile(held_scores, 1.0 - target_far, method="higher"))
    return new


def decide(det: ood.OODDetector, item: dict) -> str | None:
    """The engine's decision for one captured item under ``det`` (ood.judge's logic)."""
    if item["text_reason"] is not None:
        return item["text_reason"]
    if item["check"] is None:
        return item["engine_reason"]
    whole, sub, margin, cover = item["check"]
    reason = det.reason(whole)
    if reason != "ood_score":
        return reason
    if sub is not None and det.score(sub) <= det.threshold:
        return None
    if margin > 0 and cover and det.score(whole) <= det.threshold + margin:
        return None
    return reason


def table(det: ood.OODDetector, items: list[dict]) -> dict:
    out = {}
    for split in DEV_SPLITS:
        rows = [it for it in items if it["split"] == split]
        per = {}
        for g in ("data_request", "payload_alone", "plain_language", "plain_en", "odd", "normal"):
            sel = [it for it in rows if it["group"] == g]
            if sel:
                k = sum(decide(det, it) is not None for it in sel)
                lo, hi = wilson_interval(k, len(sel))
                per[g] = {"degraded": k, "n": len(sel), "rate": round(k / len(sel), 4), "wilson95": [round(lo, 4), round(hi, 4)]}
        out[split] = per
    return out


def threshold_sweep(engine: Engine, det: ood.OODDetector, items: list[dict], offsets: list[float], out: Path,
                    t0: float, argv: list[str] | None) -> int:
    """The packaged score's own trade-off: every group's degraded share over the development
    splits as its threshold moves by each offset. The cached items are re-judged with today's
    text rules (``degradation.text_anomaly_reason``) and today's language rule margin (the cache
    keeps the stats the check computed, not its decision), so the row at offset 0 is the
    detector that ships, on the development splits."""
    texts = {(split, x["id"]): x["text"] for split in DEV_SPLITS
             for x in map(json.loads, (ROOT / "fixtures" / split / "prompts.jsonl").read_text(encoding="utf-8").splitlines())}
    rule = engine.language_rule()
    judged = []
    for it in items:
        text = texts[(it["split"], it["id"])]
        it = {**it, "text_reason": degradation.text_anomaly_reason(text)}
        if it["check"] is not None:
            whole, sub, _, cover = it["check"]
            it["check"] = (whole, sub, rule.margin_for(text, whole.pooled) if rule is not None else 0.0, cover)
        judged.append(it)
    base = det.threshold
    rows = []
    try:
        for off in offsets:
            det.threshold = base + off
            row = {"offset": off, "threshold": round(det.threshold, 4)}
            for g in ("data_request", "payload_alone", "plain_language", "plain_en", "odd"):
                sel = [it for it in judged if it["group"] == g]
                k = sum(decide(det, it) is not None for it in sel)
                lo, hi = wilson_interval(k, len(sel))
                row[g] = {"degraded": k, "n": len(sel), "rate": round(k / len(sel), 4),
                          "wilson95": [round(lo, 4), round(hi, 4)]}
            rows.append(row)
            print(f"{off:+.2f}  " + "  ".join(f"{g} {row[g]['degraded']}/{row[g]['n']}" for g in row
                                              if isinstance(row[g], dict)), file=sys.stderr)
    finally:
        det.threshold = base
    res = {"what": "the packaged score's threshold moved, every group's degraded share on the development splits",
           "command": "python scripts/ood_design.py " + " ".join(argv or sys.argv[1:]),
           "splits": list(DEV_SPLITS), "language_rule": None if rule is None else rule.info.get("choice"),
           "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    atomic_write_json(out, res)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/ood_design.pkl"))
    ap.add_argument("--target-far", type=float, default=ood.DEFAULT_TARGET_FAR)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "ood_design_dev.json")
    ap.add_argument("--limit", type=int, default=None, help="first N items of each file (a smoke run)")
    ap.add_argument("--threshold-sweep", default="", metavar="OFFSETS",
                    help="comma list of offsets on the packaged score's threshold: only the packaged score, judged "
                         "with today's text rules and language rule, pooled over the development splits")
    ap.add_argument("--extra-tuning", nargs="*", default=[], choices=sorted(EXTRA_CLASSES), metavar="CLASS",
                    help="generated classes added to the fit's odd side in two more variants")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    torch.set_grad_enabled(False)
    engine = Engine.load()
    if args.cache.is_file():
        data = pickle.loads(args.cache.read_bytes())
    else:
        data = collect(engine, args.limit, args.cache.with_suffix(".calib.pkl"))
        args.cache.write_bytes(pickle.dumps(data))
    det = engine.ood_detector()
    items = data["items"]
    if args.threshold_sweep:
        return threshold_sweep(engine, det, items, [float(v) for v in args.threshold_sweep.split(",") if v],
                               args.out, t0, argv)
    agree = sum(decide(det, it) == it["engine_reason"] for it in items)
    print(f"offline decisions equal the engine's on {agree} of {len(items)} items", file=sys.stderr)
    variants = {"packaged": det}
    for name, signed in (("free", False), ("signed", True)):
        variants[name] = refit(det, data["calib"], data["odd_fit"], data["held"], args.target_far, signed)
    if args.extra_tuning:
        # more generated classes on the odd side of the fit (seeds 0-15, as the tuning classes)
        extra = ood.collect(engine.weights, engine.encode,
                            [_make_extra(n, s) for n in args.extra_tuning for s in range(16)], engine._byte_ids())
        tag = "+" + "+".join(args.extra_tuning)
        for name, signed in (("free", False), ("signed", True)):
            variants[name + tag] = refit(det, data["calib"], data["odd_fit"] + extra, data["held"], args.target_far,
                                         signed)
    res = {"what": __doc__.split("\n")[0], "command": "python scripts/ood_design.py " + " ".join(argv or sys.argv[1:]),
           "offline_equals_engine": [agree, len(items)], "variants": {}}
    for name, d in variants.items():
        res["variants"][name] = {"weights": dict(zip(d.names + ("bias",), np.round(d.weights, 4).tolist())),
                                 "threshold": round(d.threshold, 4), "splits": table(d, items)}
        tot = Counter()
        for split, per in res["variants"][name]["splits"].items():
            for g, v in per.items():
                tot[(g, "k")] += v["degraded"]
                tot[(g, "n")] += v["n"]
        summary = {g: f"{tot[(g, 'k')]}/{tot[(g, 'n')]}" for g in ("data_request", "payload_alone", "plain_language",
                                                                     "plain_en", "odd") if tot[(g, "n")]}
        res["variants"][name]["pooled"] = summary
        print(f"{name:9s} thr {d.threshold:+.3f}  " + "  ".join(f"{g} {v}" for g, v in summary.items()), file=sys.stderr)
        last = res["variants"][name]["splits"][DEV_SPLITS[-1]]
        print(f"{'':9s} 12-05: " + "  ".join(f"{g} {v['degraded']}/{v['n']}" for g, v in last.items()), file=sys.stderr)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
