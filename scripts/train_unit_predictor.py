"""Train a unit predictor end to end (``reference_engine.unit_predictor.train``) with a choice of
labels and training text, into a folder of its own (the packaged predictor is left alone).

    python scripts/train_unit_predictor.py --labels token --extra 116 --out /tmp/upt

``--extra N`` adds the first N plain English requests of reference_engine/data/training_text/plain_en.jsonl
(116, frozen from the degradation splits' plain requests; none is a router-curve prompt) to the
predictor's 48 training prompts. The result is ``FOLDER/unit_predictor/<sha16>-v<N>.npz``, which
``scripts/router_more_text.py --trained FOLDER`` compares with the packaged predictor on the
development prompts.

Must not be imported by the engine or the harness; it records a design decision.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from reference_engine import Engine
from reference_engine import unit_predictor as up



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--labels", choices=("sequence", "token"), default="token")
    ap.add_argument("--extra", type=int, default=0, help="plain English requests added to the training prompts")
    ap.add_argument("--out", type=Path, required=True, help="folder to write unit_predictor/<sha16>-v<N>.npz into")
    args = ap.parse_args()
    extra = up.training_prompts()[len(up.TRAIN_PROMPTS):]  # the packaged extra text, read by its one loader
    if not 0 <= args.extra <= len(extra):
        print(f"error: --extra must be 0-{len(extra)} (the requests in {up.TRAINING_TEXT_FILE}), got {args.extra}",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    engine = Engine.load(None)
    prompts = up.TRAIN_PROMPTS + tuple(extra[: args.extra])
    last = [0.0]

    def progress(msg: str) -> None:
        if time.perf_counter() - last[0] > 10:
            last[0] = time.perf_counter()
            print(f"[{time.perf_counter() - t0:.0f} s] {msg}", file=sys.stderr, flush=True)

    pred = up.train(engine.weights, engine.encode, engine.eos_id, engine.weights_sha256, progress, prompts=prompts,
                    kernel=engine.decode_kernel, labels=args.labels)
    path = up.save(pred, args.out)
    rep = pred.report
    print(f"{path}: {len(prompts)} prompts, {args.labels} labels, held-out within-unit Spearman "
          f"{rep['spearman_predicted_vs_kl_within_unit_mean']:.3f}, {rep['train_seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
