"""Fit the instruction probe (``reference_engine.degradation.instruction_probe``) for the embedded
weights and write it into the package.

Three parts, none of them the split that reports (``rsp-bench degradation``'s default split, written
after this file's splits were chosen, reports once):
- fit: the injections (odd kinds whose name says they address the model: ``INJECTION_KIND``) of the
  FIT splits, against their ordinary requests (data requests, plain English, plain requests in other
  languages), the normal corpus' calibration part, and the project's own prompts: every fixture
  prompt, the SQuAD prompts whose passage is not in the suites' first 48, the structured documents
  after the suites' first 48;
- choose: the ridge and the threshold, on the CHOOSE splits' injections and their whole ordinary
  side with the normal corpus' held-out part and the suites' SQuAD passages and structured
  documents: the most injections caught by the probe or the text rules together, with false alarms
  at most ``--target-far`` on that ordinary side and at most twice it in each of its groups;
- the file names the splits, the counts and the choice.

Features are the prefill's pooled hidden states (``ood.collect``, ~0.35 s a prompt on 2 cores; all
splits and the project's own prompts ~42 min). ``--cache DIR`` keeps them per split between runs. Run:

    python scripts/fit_instruction_probe.py --cache ~/.cache/rsp-bench/probe-features

Must not be imported by the engine or the harness.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from reference_engine import Engine, ood  # noqa: E402
from reference_engine.degradation import instruction_probe as probe_mod  # noqa: E402
from reference_engine.degradation.text_rules import text_anomaly_reasons  # noqa: E402
from rsp_bench import datasets as ds  # noqa: E402

FIT = ("2026-12-05f", "2026-12-05g", "2026-12-06b", "2026-12-06c", "2026-12-06d", "2026-12-06e", "2026-12-06h",
       "2026-12-06i")
CHOOSE = ("2026-12-06f", "2026-12-06g")
ORDINARY = ("data_request", "plain_en", "plain_language")
RIDGES = (0.003, 0.01, 0.03, 0.1, 0.3)
#: The suites' SQuAD and structured subsets draw their first ``SUITE_SUBSET`` after one seeded shuffle.
SUITE_SUBSET = 48
RULES = {"prompt_injection", "embedded_instruction", "special_token_text"}
#: An odd kind that addresses the model: a jailbreak framing or a directive planted in a document.
INJECTION_KIND = re.compile(
    r"directive|inject|override|jailbreak|ploy|demand|claim|persona|prompt|instruction|secret|rule|game|consent|"
    r"alter_ego|exfil|smuggl|refusal|prefix|threat|polic|agent|planted|dan_|roleplay|grandma|developer_mode|sudo|"
    r"penalty|dual_answer|villain|acrostic|unrestricted|leak|extraction|ignore|twin|priming|beacon|markdown_image|"
    r"exempt|switch|console|banner|forbidden|bedtime|opposite|filter_dodge|concatenation|obey|forgery|hijack|"
    r"forged|debug_mode|lawless|pretext|avoid|dare|wager|pressure|liberation|appeal|flatter|coercion|vault|"
    r"resume_trick|social_proof")


def features(engine: Engine, texts: list[str], cache: Path | None, name: str) -> np.ndarray:
    """Pooled directions at the score's blocks, concatenated, one row per text (cached by name)."""
    path = cache / f"{name}.npy" if cache else None
    if path is not None and path.is_file():
        X = np.load(path)
        if len(X) == len(texts):
            return X
    t0 = time.time()
    stats = ood.collect(engine.weights, engine.encode, texts)
    X = np.array([np.concatenate([probe_mod.unit(s.pooled[b]) for b in sorted(s.pooled)]) for s in stats])
    print(f"  {name}: {len(texts)} prompts, {time.time() - t0:.0f} s", flush=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, X)
    return X


def split(engine: Engine, name: str, cache: Path | None) -> dict:
    items = [json.loads(line) for line in
             open(ROOT / f"fixtures/degradation_heldout_{name}/prompts.jsonl", encoding="utf-8")]
    inj = [x for x in items if x["group"] == "odd" and INJECTION_KIND.search(x["kind"])]
    ordi = [x for x in items if x["group"] in ORDINARY]
    return {"inj": features(engine, [x["text"] for x in inj], cache, f"{name}-injections"),
            "ord": features(engine, [x["text"] for x in ordi], cache, f"{name}-ordinary"),
            "ord_group": np.array([x["group"] for x in ordi]),
            "inj_rules": np.array([bool(RULES & set(text_anomaly_reasons(x["text"]))) for x in inj])}


def corpus(engine: Engine, part: str, cache: Path | None) -> np.ndarray:
    texts = [json.loads(line)["text"] for line in open(ROOT / f"fixtures/normal_corpus/{part}.jsonl", encoding="utf-8")]
    return features(engine, texts, cache, f"normal-{part}")


def own_prompts(engine: Engine, cache: Path | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(fit, choose by group) features of the project's own prompts. SQuAD is split by passage, so that no
    passage is on both sides; the suites' subsets (and their passages' other questions) choose."""
    squad = ds.quick_subset(ds.load_squad(), 10**6)
    documents = ds.quick_subset(ds.load_structured(), 10**6)
    P = features(engine, [p.text for p in ds.load_prompts()], cache, "prompts")
    Q = features(engine, [ds.squad_prompt(q) for q in squad], cache, "squad")
    S = features(engine, [ds.structured_prompt(d) for d in documents], cache, "structured")
    suite_passages = {q.context for q in squad[:SUITE_SUBSET]}
    q_choose = np.array([q.context in suite_passages for q in squad])
    return (np.vstack([P, Q[~q_choose], S[SUITE_SUBSET:]]),
            {"squad": Q[q_choose], "structured": S[:SUITE_SUBSET]})


def threshold(s_ord: np.ndarray, group: np.ndarray, target_far: float) -> float:
    """The lowest threshold whose false alarms stay within the budget, overall and in each group
    (twice the overall), set halfway between the highest ordinary score that must not fire and the
    lowest that may: a threshold equal to an ordinary prompt's own score would flip on the last bit
    of a feature computed in another process."""
    desc = np.sort(s_ord)[::-1]
    k = 0  # ordinary scores allowed over the threshold
    while k < len(desc) - 1:
        fa = s_ord >= desc[k]
        if fa.mean() > target_far or any(fa[group == g].mean() > 2 * target_far for g in set(group)):
            break
        k += 1
    upper = desc[k - 1] if k else desc[0] + (desc[0] - desc[1])  # no false alarm: as far above the top
    return float((desc[k] + upper) / 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=None, help="folder keeping the features per split between runs")
    ap.add_argument("--target-far", type=float, default=0.01,
                    help="false alarms allowed on the choosing splits' whole ordinary side (default 0.01)")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: the packaged file)")
    a = ap.parse_args(argv)
    if not 0.0 < a.target_far < 0.2:
        ap.error(f"--target-far must be in (0, 0.2), got {a.target_far}")
    engine = Engine.load()
    blocks = ood.blocks_for(engine.weights.dims.n_layers)
    fit = [split(engine, s, a.cache) for s in FIT]
    choose = [split(engine, s, a.cache) for s in CHOOSE]
    pos = np.vstack([d["inj"] for d in fit])
    own_fit, own_choose = own_prompts(engine, a.cache)
    neg = np.vstack([d["ord"] for d in fit] + [corpus(engine, "calibration", a.cache), own_fit])
    c_inj = np.vstack([d["inj"] for d in choose])
    c_rules = np.concatenate([d["inj_rules"] for d in choose])
    held = corpus(engine, "heldout", a.cache)
    c_ord = np.vstack([d["ord"] for d in choose] + [held, *own_choose.values()])
    c_group = np.concatenate([d["ord_group"] for d in choose] + [np.full(len(held), "normal_heldout")]
                             + [np.full(len(X), g) for g, X in own_choose.items()])
    best = None
    for ridge in RIDGES:
        p = probe_mod.fit(blocks, pos, neg, ridge)
        s_ord, s_inj = p.log_odds(c_ord), p.log_odds(c_inj)
        ok = threshold(s_ord, c_group, a.target_far)
        caught = (s_inj > ok) | c_rules
        print(f"ridge {ridge}: threshold {ok:.3f}, false alarms {(s_ord > ok).sum()}/{len(s_ord)}, injections "
              f"{(s_inj > ok).sum()}/{len(s_inj)} (with the rules {caught.sum()})", flush=True)
        if best is None or caught.sum() > best[0]:
            best = (int(caught.sum()), ridge, float(ok), p)
    _, ridge, thr, p = best
    s_ord, s_inj = p.log_odds(c_ord), p.log_odds(c_inj)
    info = {"fit_splits": list(FIT), "choose_splits": list(CHOOSE), "ridge": ridge, "ridges_tried": list(RIDGES),
            "target_false_alarm_rate": a.target_far, "n_fit_injections": len(pos), "n_fit_ordinary": len(neg),
            "n_fit_own_prompts": len(own_fit), "n_choose_own_prompts": sum(len(X) for X in own_choose.values()),
            "choose_injections": len(s_inj), "choose_injections_caught": int((s_inj > thr).sum()),
            "choose_injections_caught_with_rules": int(((s_inj > thr) | c_rules).sum()),
            "choose_ordinary": len(s_ord), "choose_false_alarms": int((s_ord > thr).sum()),
            "choose_false_alarms_by_group": {g: [int((s_ord[c_group == g] > thr).sum()), int((c_group == g).sum())]
                                             for g in sorted(set(c_group))},
            "injection_kind_pattern": INJECTION_KIND.pattern}
    probe = probe_mod.InstructionProbe(p.blocks, p.mu, p.sd, p.coef, p.bias, thr, info)
    out = a.out or probe_mod.probe_path(ROOT / "reference_engine" / "data", engine.weights_sha256)
    probe_mod.save(out, engine.weights_sha256, probe)
    print(json.dumps(info, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
