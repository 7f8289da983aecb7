"""``rsp-bench calibrate``: measure and cache a model's per-weights artefacts: the block router's
calibration (with its table), the unit router's predictor and the unit router's sensitivity scale
(``--package`` writes the scale into the package data; the embedded model's copy is committed).

Must not import the pytest plugin; imports torch and the engine only when run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rsp_bench.cli_checks import check_model_path


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="local Llama-family folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--force", action="store_true", help="measure again even if cached")
    p.add_argument("--package", action="store_true",
                   help="also write the sensitivity scale into the package data (reference_engine/data)")


def calibrate_unit_predictor(engine, args: argparse.Namespace) -> None:
    """The unit router's predictor (reference_engine.unit_predictor): loaded, or trained with a
    progress bar (one tick per prompt continued, per prompt where maps and identity are compared,
    and per prompt labelled)."""
    import time

    from tqdm import tqdm

    from reference_engine.unit_predictor import MAP_CHOICE_PROMPTS, training_prompts

    bar = None if args.quiet else tqdm(total=2 * len(training_prompts()) + MAP_CHOICE_PROMPTS, desc="unit predictor",
                                       file=sys.stderr)
    t0 = time.perf_counter()
    pred = engine.unit_predictor(progress=(lambda m: bar.update(1) if "/" in m else None) if bar else None,
                                 force=args.force)
    if bar is not None:
        bar.close()
    rep = pred.report
    print(f"unit predictor: {pred.n_units} units, Spearman (held-out positions) predicted vs KL "
          f"{rep.get('spearman_predicted_vs_kl_pooled', float('nan')):.3f}, proxy vs KL "
          f"{rep.get('spearman_proxy_vs_kl_pooled', float('nan')):.3f}; trained in "
          f"{rep.get('train_seconds', float('nan'))} s; this run {time.perf_counter() - t0:.1f} s")


def run(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    check_model_path(args.model)
    from reference_engine import Engine

    engine = Engine.load(args.model, calibrate=False)
    cal = engine.calibration(progress=None if args.quiet else (lambda m: print(m, file=sys.stderr)),
                             force=args.force)
    rows = [(i, f"{cal.rel_mean[i]:.3f}", f"{cal.block_influence[i]:.3f}", f"{cal.impact_identity[i]:.3f}",
             f"{cal.impact_linear[i]:.3f}", "linear" if cal.use_linear[i] else "identity")
            for i in range(cal.n_layers)]
    print(tabulate(rows, headers=["block", "rel. update", "block influence", "KL identity (nats)",
                                  "KL linear (nats)", "bypass"]))
    print(f"entropy_ref {cal.entropy_ref:.3f} nats, density_ref {cal.density_ref:.3f}, "
          f"prompt nll {cal.nll_mean:.3f} +- {cal.nll_std:.3f}; weights {cal.weights_sha256[:16]}")
    ood = engine.ood_detector()
    if ood is not None:  # refit with scripts/calibrate_ood.py (it needs fixtures/normal_corpus)
        print(f"out-of-distribution score: threshold {ood.threshold:.3f} (log-odds), fitted on "
              f"{ood.info.get('n_calibration')} normal prompts, {ood.info.get('heldout_false_alarms')}/"
              f"{ood.info.get('n_heldout')} held-out false alarms at target {ood.info.get('target_false_alarm_rate')}")
    calibrate_unit_predictor(engine, args)
    calibrate_scale(engine, args)
    return 0


def calibrate_scale(engine, args: argparse.Namespace) -> None:
    """What the user's sensitivity means for the unit router (reference_engine.sensitivity_scale):
    loaded, or fitted with a progress bar (one tick per threshold scale tried); ``--package``
    writes it into the package data (the embedded model's copy is committed)."""
    from tabulate import tabulate
    from tqdm import tqdm

    import reference_engine
    from reference_engine import sensitivity_scale as ss

    steps = len(ss.fit_grid(engine.unit_predictor().deep_from))
    bar = None if args.quiet else tqdm(total=steps, desc="sensitivity scale", file=sys.stderr)
    scale = engine.sensitivity_scale(progress=(lambda m: bar.update(1)) if bar else None, force=args.force)
    if bar is not None:
        bar.close()
    if getattr(args, "package", False):
        where = ss.save(scale, Path(reference_engine.__file__).parent / "data")
        print(f"sensitivity scale written to {where}", file=sys.stderr)
    rows = [(f"{s:.2f}", f"{scale.target_share(s):.1%}", f"{scale.internal_for(s):.4f}") for s in (0.25, 0.5, 0.75, 1.0)]
    print(tabulate(rows, headers=["sensitivity", "target share of decode weight bytes not read",
                                  "unit router threshold scale (internal)"]))
    print(f"sensitivity scale: fitted on {scale.prompts} prompts x {scale.tokens} tokens ({scale.kernel} kernel, "
          f"{scale.seconds} s); the most it measured: {scale.max_share:.1%}")
