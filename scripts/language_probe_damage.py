"""Does pruning's damage on a request's own prompt tokens predict its damage on the answer?
(issue 26, exploratory, development splits only).

The language rule estimates what pruning would do to a plain request from its nearest requests in
a damage bank (``reference_engine/degradation/language_rule.py``); on the blind split 12-05f that
estimate put Welsh at 1.56x English's KL and Basque at 1.44x, where the split measured 0.80x and
0.92x. A request's own text offers a direct measurement instead: teacher-force the prompt's last
``--probe`` user tokens with pruning on and off and take the KL between them (a *probe*). This
script measures, per request of the fit splits' plain requests and the choose splits' odd inputs:

- the answer's damage, as ``rsp-bench degradation`` measures it (16 tokens of pruning off's own
  greedy answer, teacher-forced, KL(off || pruned), the detector suspended);
- the probe's damage on the prompt's last user tokens, the same way.

and reports their rank correlation per request and per language, and each language's two ratios
to English. It changes nothing in the engine; nothing here chose anything yet.

    python scripts/language_probe_damage.py --out results/language_probe_damage_dev.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from fit_language_rule import DAMAGE_TOKENS, FIT, _items  # noqa: E402  (the rule's own splits and reader)

from reference_engine.unit_predictor import spearman  # noqa: E402
from rsp_bench.degradation_report import damage  # noqa: E402
from rsp_bench.storage import atomic_write_json  # noqa: E402

ODD_FROM = ("degradation_heldout_2026-12-04",)


def _user_span(engine, ids: list[int]) -> tuple[int, int]:
    """[start, end) of the user's text in a chat prompt: after the last '<|im_start|>user\\n', up to
    its '<|im_end|>'."""
    tok = engine.tokenizer
    im_start, im_end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    starts = [i for i, t in enumerate(ids) if t == im_start]
    user = starts[-2] if len(starts) >= 2 else starts[-1]
    end = next(i for i in range(user, len(ids)) if ids[i] == im_end)
    return user + 3, end  # '<|im_start|>', 'user', '\n'


def _kl(engine, prefix: list[int], cont: list[int]) -> float:
    from rsp_bench.metrics.equivalence import kl_per_token

    ref = engine.teacher_forced(prefix, cont, mode="off")
    with engine.degradation_suspended():
        cand = engine.teacher_forced(prefix, cont)
    return float(kl_per_token(ref.logits, cand.logits).mean())


def measure(engine, text: str, probe: int, answer_tokens: int) -> dict:
    """The answer's damage as ``rsp-bench degradation`` measures it, and the probe's."""
    ids = engine.encode(text)
    start, end = _user_span(engine, ids)
    s = max(start + 1, end - probe)
    return {"answer_kl": damage(engine, text, answer_tokens)["kl_mean"],
            "probe_kl": _kl(engine, ids[:s], ids[s:end]), "probe_tokens": end - s}


def _spearman(a, b) -> float:
    return float(spearman(np.asarray(a, dtype=float), np.asarray(b, dtype=float)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--probe", type=int, default=16, help="prompt tokens teacher-forced (default 16)")
    p.add_argument("--per-language", type=int, default=8, help="plain requests a language at most")
    p.add_argument("--english", type=int, default=48, help="plain English requests")
    p.add_argument("--odd", type=int, default=60, help="odd inputs of the choose split 12-04")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    from reference_engine import Engine

    engine = Engine.load()
    fit = json.load((REPO / "results" / "language_rule_fit.json").open())["rows"]
    texts = {(s, it["id"]): it["text"] for s in FIT for it in _items(s)}
    count: collections.Counter = collections.Counter()
    chosen = []
    for r in fit:
        cap = a.english if r["lang"] == "en" else a.per_language
        if count[r["lang"]] < cap:
            count[r["lang"]] += 1
            chosen.append({"split": r["split"], "id": r["id"], "lang": r["lang"], "group": "plain",
                           "text": texts[(r["split"], r["id"])]})
    for s in ODD_FROM:
        chosen += [{"split": s, "id": it["id"], "lang": "odd", "group": "odd", "text": it["text"]}
                   for it in _items(s) if it["group"] == "odd"][: a.odd]
    rows, t0 = [], time.time()
    for i, c in enumerate(chosen):
        rows.append({k: c[k] for k in ("split", "id", "lang", "group")} | measure(engine, c["text"], a.probe, DAMAGE_TOKENS))
        if i % 25 == 0:
            print(f"{i + 1}/{len(chosen)} {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    plain = [r for r in rows if r["group"] == "plain"]
    en = [r for r in plain if r["lang"] == "en"]
    en_answer, en_probe = np.mean([r["answer_kl"] for r in en]), np.mean([r["probe_kl"] for r in en])
    langs = {}
    for lang in sorted({r["lang"] for r in plain} - {"en"}):
        rs = [r for r in plain if r["lang"] == lang]
        langs[lang] = {"n": len(rs), "answer_ratio": float(np.mean([r["answer_kl"] for r in rs]) / en_answer),
                       "probe_ratio": float(np.mean([r["probe_kl"] for r in rs]) / en_probe)}
    big = [v for v in langs.values() if v["n"] >= 6]
    summary = {
        "requests": len(plain), "odd": len(rows) - len(plain),
        "spearman_per_request": _spearman([r["answer_kl"] for r in plain], [r["probe_kl"] for r in plain]),
        "spearman_per_language_n6": _spearman([v["answer_ratio"] for v in big], [v["probe_ratio"] for v in big]),
        "english": {"answer_kl": float(en_answer), "probe_kl": float(en_probe), "n": len(en)},
        "odd_probe_ratio_quantiles": [float(q) for q in np.quantile(
            [r["probe_kl"] / en_probe for r in rows if r["group"] == "odd"] or [np.nan], [0.05, 0.25, 0.5, 0.75, 0.95])],
        "wall_s": round(time.time() - t0, 1),
    }
    out = {"what": __doc__.split("\n")[0], "command": "python scripts/language_probe_damage.py " + " ".join(sys.argv[1:]),
           "config": {"probe": a.probe, "answer_tokens": DAMAGE_TOKENS, "fit_splits": FIT, "odd_from": ODD_FROM},
           "summary": summary, "languages": langs, "rows": rows}
    atomic_write_json(a.out, out)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
