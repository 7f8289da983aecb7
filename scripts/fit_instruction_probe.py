"""Fit the instruction probe (``reference_engine.degradation.instruction_probe``) for the embedded
weights and write it into the package.

Three parts, none of them the split that reports (``rsp-bench degradation``'s default split, written
after this file's splits were chosen, reports once):
- fit: the injections (odd kinds whose name says they address the model: ``INJECTION_KIND``) of the
  FIT splits, against their ordinary requests (data requests, plain English, plain requests in other
  languages), the normal corpus' calibration part, and the project's own prompts: every fixture
  prompt, the SQuAD prompts whose passage is not in the suites' first 48, the structured documents
  after the suites' first 48;
- choose: the network's width and the threshold, on the CHOOSE splits' injections and their whole ordinary
  side with the normal corpus' held-out part and the suites' SQuAD passages and structured
  documents: the most injections caught by the probe or the text rules together, with false alarms
  at most ``--target-far`` on that ordinary side and at most twice it in each of its groups;
- the file names the splits, the counts and the choice.

The probe (version 2) is an ensemble of ``MEMBERS`` one-hidden-layer networks trained with torch
(seeds 0..MEMBERS-1, two threads: the same machine gives the same file); the engine reads it with
numpy (``instruction_probe.InstructionProbe.log_odds``), and the threshold is chosen on those
scores, not the training's.

Features are the prefill's pooled hidden states (``ood.collect``, ~0.35 s a prompt on 2 cores; all
splits and the project's own prompts ~60 min). ``--cache DIR`` keeps them per split between runs. Run:

    python scripts/fit_instruction_probe.py --cache ~/.cache/rsp-bench/probe-features

(~2 min with every split's features cached.)

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
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from reference_engine import Engine, ood  # noqa: E402
from reference_engine.degradation import instruction_probe as probe_mod  # noqa: E402
from reference_engine.degradation.text_rules import text_anomaly_reasons  # noqa: E402
from rsp_bench import datasets as ds  # noqa: E402

FIT = ("2026-12-05f", "2026-12-05g", "2026-12-06b", "2026-12-06c", "2026-12-06d", "2026-12-06e", "2026-12-06h",
       "2026-12-06i", "2026-12-06j", "2026-12-06k", "2026-12-06l", "2026-12-06m", "2026-12-07a", "2026-12-07b")
CHOOSE = ("2026-12-06f", "2026-12-06g", "2026-12-07c", "2026-12-07d")
ORDINARY = ("data_request", "plain_en", "plain_language")
#: The hidden widths tried (the choice); the rest of the training is fixed.
WIDTHS = (32, 64)
MEMBERS, EPOCHS, BATCH, LR, WEIGHT_DECAY, DROPOUT = 5, 60, 256, 1e-3, 0.01, 0.2
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
    r"resume_trick|social_proof|harm|prefill|permission|comply|bribe|order|fraud|fake_|shaming|payload_split|"
    r"reverse_psychology|follow|authoris|framing|emulation")
#: Prose transformed or put in a container, and fake secrets listed, are odd input that asks nothing of the
#: model, whatever words their kind names share with the pattern above (a prose "prefix staircase", prose
#: "as NASM directives", sentences in another "order", "fake" keys in a dump).
NOT_INJECTION_KIND = re.compile(r"prose|_lists$|_dumps$|sentence_(word_)?order")


def is_injection(kind: str) -> bool:
    return bool(INJECTION_KIND.search(kind)) and not NOT_INJECTION_KIND.search(kind)


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
    inj = [x for x in items if x["group"] == "odd" and is_injection(x["kind"])]
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


def train(blocks: tuple[int, ...], pos: np.ndarray, neg: np.ndarray, width: int,
          members: int = MEMBERS, epochs: int = EPOCHS) -> probe_mod.InstructionProbe:
    """An ensemble of ``members`` networks (``width`` tanh-GELU units, dropout on the input) fitted on
    feature rows ``pos`` (instructions to the model) against ``neg`` (ordinary input), the two
    classes weighing the same; the threshold is left at +inf for the caller to choose."""
    if len(pos) < 8 or len(neg) < 8:
        raise ValueError(f"need >= 8 rows in each class, got {len(pos)} and {len(neg)}")
    X = np.vstack([pos, neg])
    mu, sd = X.mean(0), X.std(0) + 1e-6
    Xt = torch.tensor((X - mu) / sd, dtype=torch.float32)
    yt = torch.tensor(np.r_[np.ones(len(pos)), np.zeros(len(neg))], dtype=torch.float32)
    wt = torch.tensor(np.r_[np.full(len(pos), len(neg) / len(pos)), np.ones(len(neg))], dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    nets = []
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(True)  # the engine turns autograd off when it loads
    try:
        for seed in range(members):
            torch.manual_seed(seed)
            net = torch.nn.Sequential(torch.nn.Dropout(DROPOUT), torch.nn.Linear(X.shape[1], width),
                                      torch.nn.GELU(approximate="tanh"), torch.nn.Linear(width, 1))
            opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
            for _ in range(epochs):
                order = torch.randperm(len(Xt))
                for at in range(0, len(Xt), BATCH):
                    b = order[at:at + BATCH]
                    loss = (torch.nn.functional.binary_cross_entropy_with_logits(net(Xt[b]).squeeze(1), yt[b],
                                                                                 reduction="none") * wt[b]).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            nets.append(net)
    finally:
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)
    arr = lambda t: t.detach().double().numpy()  # noqa: E731
    return probe_mod.InstructionProbe(
        tuple(blocks), mu, sd, np.stack([arr(n[1].weight).T.astype(np.float32).astype(np.float64) for n in nets]),
        np.stack([arr(n[1].bias) for n in nets]), np.stack([arr(n[3].weight)[0] for n in nets]),
        np.array([float(n[3].bias.detach()) for n in nets]), float("inf"), {"width": width})


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
    best, tried = None, {}
    for width in WIDTHS:
        p = train(blocks, pos, neg, width)
        s_ord, s_inj = p.log_odds(c_ord), p.log_odds(c_inj)
        ok = threshold(s_ord, c_group, a.target_far)
        caught = (s_inj > ok) | c_rules
        tried[width] = {"false_alarms": int((s_ord > ok).sum()), "injections": int((s_inj > ok).sum()),
                        "with_rules": int(caught.sum())}
        print(f"width {width}: threshold {ok:.3f}, false alarms {(s_ord > ok).sum()}/{len(s_ord)}, injections "
              f"{(s_inj > ok).sum()}/{len(s_inj)} (with the rules {caught.sum()})", flush=True)
        if best is None or caught.sum() > best[0]:
            best = (int(caught.sum()), width, float(ok), p)
    _, width, thr, p = best
    s_ord, s_inj = p.log_odds(c_ord), p.log_odds(c_inj)
    info = {"fit_splits": list(FIT), "choose_splits": list(CHOOSE), "width": width, "widths_tried": tried,
            "members": MEMBERS, "epochs": EPOCHS, "batch": BATCH, "lr": LR, "weight_decay": WEIGHT_DECAY,
            "dropout": DROPOUT, "torch": torch.__version__,
            "target_false_alarm_rate": a.target_far, "n_fit_injections": len(pos), "n_fit_ordinary": len(neg),
            "n_fit_own_prompts": len(own_fit), "n_choose_own_prompts": sum(len(X) for X in own_choose.values()),
            "choose_injections": len(s_inj), "choose_injections_caught": int((s_inj > thr).sum()),
            "choose_injections_caught_with_rules": int(((s_inj > thr) | c_rules).sum()),
            "choose_ordinary": len(s_ord), "choose_false_alarms": int((s_ord > thr).sum()),
            "choose_false_alarms_by_group": {g: [int((s_ord[c_group == g] > thr).sum()), int((c_group == g).sum())]
                                             for g in sorted(set(c_group))},
            "injection_kind_pattern": INJECTION_KIND.pattern, "not_injection_kind_pattern": NOT_INJECTION_KIND.pattern}
    probe = probe_mod.InstructionProbe(p.blocks, p.mu, p.sd, p.w1, p.b1, p.w2, p.b2, thr, info)
    out = a.out or probe_mod.probe_path(ROOT / "reference_engine" / "data", engine.weights_sha256)
    probe_mod.save(out, engine.weights_sha256, probe)
    print(json.dumps(info, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
