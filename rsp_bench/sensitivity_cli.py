"""``rsp-bench sensitivity-scale``: what each sensitivity means for the unit router, measured.

The unit router's sensitivity asks for a share of a decode token's weight bytes not read
(reference_engine/sensitivity_scale.py); the scale is fitted on its own tune prompts. This
command measures the share each sensitivity actually gets on another prompt file (default: the
router curve's held-out prompts, which chose nothing for the scale): per sensitivity, the target,
the mean share over prompts with its lowest and highest, and the ideal speed-up from those bytes.
Free-running greedy generation at batch 1, watermark pinned to 0, the detector suspended (the
share is the router's, not the detector's).

Must not import the pytest plugin; imports torch and the engine only when run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rsp_bench.datasets import read_prompt_texts

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "fixtures" / "router_curve" / "heldout_2026-12-03.jsonl"
DEFAULT_SENSITIVITIES = (0.25, 0.5, 0.75, 1.0)


def _usage(msg: str) -> int:
    print(f"rsp-bench sensitivity-scale: error: {msg}", file=sys.stderr)
    return 2


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="local Llama-family folder or .gguf (default: the embedded model)")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                   help="JSONL with a \"text\" per line, or one prompt per line (default: %(default)s)")
    p.add_argument("--sensitivities", default=",".join(str(s) for s in DEFAULT_SENSITIVITIES),
                   help="comma list in (0, 1] (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here (atomically)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        sens = [float(x) for x in args.sensitivities.split(",") if x.strip()]
    except ValueError:
        return _usage(f"--sensitivities must be a comma list of numbers in (0, 1], got {args.sensitivities!r}")
    bad = [s for s in sens if not 0.0 < s <= 1.0]
    if not sens or bad:
        return _usage(f"--sensitivities must be numbers in (0, 1], got {args.sensitivities!r}")
    if len(set(sens)) != len(sens):  # each would be measured again, minutes each, for the same figures
        return _usage(f"--sensitivities names a sensitivity twice, got {args.sensitivities!r}")
    if args.tokens < 2:
        return _usage(f"--tokens must be an integer >= 2, got {args.tokens}")
    try:
        prompts = read_prompt_texts(args.prompts)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return _usage(f"--prompts {args.prompts}: {exc}")
    if args.model is not None and not Path(args.model).exists():
        return _usage(f"--model {args.model!r} does not exist")

    from tabulate import tabulate
    from tqdm import tqdm

    from reference_engine import Engine, PruningConfig
    from reference_engine.sensitivity_scale import decode_bytes_per_token

    engine = Engine.load(args.model)
    scale = engine.sensitivity_scale()
    total = decode_bytes_per_token(engine)
    cfg = PruningConfig(mode="lossy", router="unit", hardware_watermark=0.0, log_level="NONE")
    bar = None if args.quiet else tqdm(total=len(sens) * len(prompts), desc="sensitivity scale", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with engine.degradation_suspended():
        for s in sens:
            shares = []
            for p in prompts:
                [res] = engine.generate(p, max_new_tokens=args.tokens, config=cfg.override(sensitivity=s))
                steps = max(res.stats["total_tokens"] - 1, 1)
                shares.append(res.stats["bypassed_weight_bytes"] / (total * steps))
                if bar is not None:
                    bar.update(1)
            mean = statistics.fmean(shares)
            rows.append({"sensitivity": s, "target_share": scale.target_share(s),
                         "unit_threshold_scale": scale.internal_for(s), "mean_share": mean,
                         "min_share": min(shares), "max_share": max(shares),
                         "ideal_speedup": 1.0 / (1.0 - mean), "shares": shares})
    if bar is not None:
        bar.close()
    print(tabulate([(f"{r['sensitivity']:.2f}", f"{r['target_share']:.1%}", f"{r['mean_share']:.1%}",
                     f"{r['min_share']:.1%} - {r['max_share']:.1%}", f"{r['ideal_speedup']:.3f}x")
                    for r in rows],
                   headers=["sensitivity", "target share", "measured share (mean)", "per prompt", "ideal speed-up"]))
    print(f"{len(prompts)} prompts from {args.prompts}, {args.tokens} tokens each, free-running greedy, batch 1; "
          f"share of the {total / 1e6:.0f} MB of weights a decode token reads; scale fitted on "
          f"{scale.prompts} tune prompts")
    if args.out is not None:
        doc = {"schema": "rsp-bench-sensitivity-scale/1", "prompts_file": str(args.prompts), "n_prompts": len(prompts),
               "tokens": args.tokens, "decode_bytes_per_token": total, "kernel": engine.decode_kernel,
               "scale_points": [list(p) for p in scale.points], "share_at_full": scale.share_at_full,
               "seconds": round(time.perf_counter() - t0, 1),
               "command": "rsp-bench sensitivity-scale " + " ".join(sys.argv[2:]), "rows": rows,
               "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=args.out.parent, prefix=args.out.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, args.out)
        print(f"written: {args.out}")
    return 0
