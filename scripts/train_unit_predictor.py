"""Train a unit predictor end to end (``reference_engine.unit_predictor.train``) with a choice of
labels and training text, into a folder of its own (the packaged predictor is left alone).

    python scripts/train_unit_predictor.py --labels token --extra 116 --out /tmp/upt
    python scripts/train_unit_predictor.py --labels token --extra 116 --more 120 --out /tmp/upt4

``--extra N`` adds the first N plain English requests of reference_engine/data/training_text/plain_en.jsonl
(116, frozen from the degradation splits' plain requests; none is a router-curve prompt) to the
predictor's 48 training prompts. The result is ``FOLDER/unit_predictor/<sha16>-v<N>.npz``, which
``scripts/router_more_text.py --trained FOLDER`` compares with the packaged predictor on the
development prompts.

``--more N`` adds N more plain English requests after those: the plain requests of the degradation
splits through 2026-12-05d (``router_oracle.extra_training_prompts("2026-12-05d")``, none a curve
prompt) that are not already in the packaged text, in that list's fixed order. The candidate for
predictor version 4 (issue 25: on cached labels, 284 prompts instead of 164 lowered KL by 5-18%
from 2 blocks' worth on, results/router_more_text_v3_dev.json); 60 min on 2 idle cores. Trained
and compared in stop 48 (``scripts/compare_predictor_curve.py``, results/predictor_v4_curve_dev.json):
worse than version 3 up to 3 blocks' worth, so not adopted (docs/unit-router.md).

``--maps packaged`` keeps the packaged predictor's unit maps (fitted on version 3's own text) and
fits only the ridges on the new labels, which are collected through those maps: the configuration
whose cached-label experiment lowered KL, and the one change of the two the version-4 candidate
made at once (stop 49). The script swaps ``unit_predictor.fit_unit_maps`` for the packaged maps
in this process only; the engine's code is untouched.

    python scripts/train_unit_predictor.py --labels token --extra 116 --more 120 --maps packaged --out /tmp/upt5

Result (stop 49, 3,510 s, results/predictor_v3maps_284_curve_dev.json): the same shape as version
4's candidate, worse to 2.3 blocks' worth and better from 4; not adopted (docs/unit-router.md).

Must not be imported by the engine or the harness; it records a design decision.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from reference_engine import Engine
from reference_engine import unit_predictor as up



# glibc's heap, not a leak: with the packaged maps, label collection grew by about 0.6 GB a prompt
# (stop 49: killed by the OOM killer at 30 of 284 prompts on 24 GB); with large blocks served by
# mmap it stays at 1.4 GB. The variables must be set before the interpreter starts, hence re-exec.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2"}


def main() -> int:
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--labels", choices=("sequence", "token"), default="token")
    ap.add_argument("--extra", type=int, default=0, help="plain English requests added to the training prompts")
    ap.add_argument("--more", type=int, default=0, help="plain English requests of later splits added after --extra")
    ap.add_argument("--maps", choices=("fit", "packaged"), default="fit",
                    help="fit new unit maps on the training text, or keep the packaged predictor's")
    ap.add_argument("--out", type=Path, required=True, help="folder to write unit_predictor/<sha16>-v<N>.npz into")
    args = ap.parse_args()
    extra = up.training_prompts()[len(up.TRAIN_PROMPTS):]  # the packaged extra text, read by its one loader
    if not 0 <= args.extra <= len(extra):
        print(f"error: --extra must be 0-{len(extra)} (the requests in {up.TRAINING_TEXT_FILE}), got {args.extra}",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    prompts = up.TRAIN_PROMPTS + tuple(extra[: args.extra])
    if args.more:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from router_oracle import extra_training_prompts

        later = [t for t in extra_training_prompts("2026-12-05d") if t not in set(extra)]
        if not 0 < args.more <= len(later):
            print(f"error: --more must be 1-{len(later)} (the later splits' plain requests), got {args.more}",
                  file=sys.stderr)
            return 2
        prompts += tuple(later[: args.more])
    engine = Engine.load(None)
    if args.maps == "packaged":
        packaged = engine.unit_predictor()  # the packaged copy (it would be trained here only if none were)
        if packaged is None or packaged.map_use is None:
            print("error: --maps packaged: no packaged unit predictor with maps for these weights", file=sys.stderr)
            return 2

        def packaged_maps(*_args, **_kwargs):
            return (packaged.map_down.copy(), packaged.map_up.copy(), packaged.map_use.copy(),
                    {k: v for k, v in packaged.report.items() if k.startswith(("map_", "kl_identity", "kl_map"))}
                    | {"maps_from": "packaged predictor"})

        up.fit_unit_maps = packaged_maps
    last = [0.0]

    def progress(msg: str) -> None:
        if time.perf_counter() - last[0] > 10:
            last[0] = time.perf_counter()
            print(f"[{time.perf_counter() - t0:.0f} s] {msg}", file=sys.stderr, flush=True)

    pred = up.train(engine.weights, engine.encode, engine.eos_id, engine.weights_sha256, progress, prompts=prompts,
                    kernel=engine.decode_kernel, labels=args.labels, deep_prompts=())  # a candidate: one ridge per unit
    path = up.save(pred, args.out)
    rep = pred.report
    print(f"{path}: {len(prompts)} prompts, {args.labels} labels, {args.maps} maps, held-out within-unit Spearman "
          f"{rep['spearman_predicted_vs_kl_within_unit_mean']:.3f}, {rep['train_seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
