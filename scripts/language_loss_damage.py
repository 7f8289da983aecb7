"""Design evidence (issue 26): does pruning's damage on a language follow how unfamiliar the model
finds it? Per language of a degradation split's plain requests, the model's mean next-token loss
on the prompts (pruning off, the prompt's own tokens after the first) against the per-language
damage its committed report measured (``languages_damage``: teacher-forced KL and top-1 of
pruning at the default against pruning off), with their Spearman correlation.

    python scripts/language_loss_damage.py [--split degradation_heldout_2026-12-04c]

Writes ``results/language_loss_damage_<split>.json``. Read-only on the engine; must not be
imported by the engine or the harness.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", default="degradation_heldout_2026-12-04c")
    a = ap.parse_args()
    from scipy.stats import spearmanr

    from reference_engine import Engine
    from reference_engine.model import forward_units

    torch.set_grad_enabled(False)
    report = json.loads((ROOT / "results" / f"{a.split}.json").read_text())
    damage = report["languages_damage"]
    engine = Engine.load(None)
    losses: dict[str, list[float]] = {}
    for line in (ROOT / "fixtures" / a.split / "prompts.jsonl").open():
        x = json.loads(line)
        if x["group"] not in ("plain_language", "plain_en"):
            continue
        ids = engine.encode(x["text"])
        logits = forward_units(engine.weights, torch.tensor([ids]), 1)  # rows predict tokens 1..n
        logp = torch.log_softmax(logits[: len(ids) - 1].double(), -1)
        loss = -logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        losses.setdefault("en" if x["group"] == "plain_en" else x["lang"], []).append(float(loss.mean()))
    rows = sorted(({"lang": lang, "mean_loss": round(float(np.mean(v)), 4), "prompts": len(v),
                    "kl_mean": damage[lang]["kl_mean"], "top1": damage[lang]["top1"]}
                   for lang, v in losses.items() if lang in damage), key=lambda r: r["kl_mean"])
    loss = [r["mean_loss"] for r in rows]
    out = {"what": __doc__.split("\n")[0], "command": "python scripts/language_loss_damage.py --split " + a.split,
           "report_config": report.get("config"), "languages": len(rows),
           "spearman_loss_kl": round(float(spearmanr(loss, [r["kl_mean"] for r in rows]).statistic), 4),
           "spearman_loss_top1": round(float(spearmanr(loss, [r["top1"] for r in rows]).statistic), 4),
           "rows": rows}
    path = ROOT / "results" / f"language_loss_damage_{a.split}.json"
    from rsp_bench.storage import atomic_write_text

    atomic_write_text(path, json.dumps(out, indent=1) + "\n")
    print(f"{len(rows)} languages: Spearman(loss, KL) {out['spearman_loss_kl']}, (loss, top-1) "
          f"{out['spearman_loss_top1']}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
