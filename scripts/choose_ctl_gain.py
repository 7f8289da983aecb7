"""Design choice (issue 25): the unit router's share-controller gain (router.CTL_GAIN), on the
development prompts only.

    python scripts/choose_ctl_gain.py [--gains 0,0.1,0.2,0.3,0.5] [--tokens 16,64] [--out results/ctl_gain_dev.json]

Per gain and generation length: the share of a decode token's weight bytes not read, per prompt,
at the default sensitivity 0.5 (asks for 10%), free-running greedy at batch 1 (the detector
suspended, watermark pinned to 0), on the first 12 of the router curve's built-in development
prompts (``HELD_OUT_PROMPTS``). Gain 0 is the router without the controller (a fixed threshold).
The held-out knob figures are ``rsp-bench sensitivity-scale``'s, on other prompts.

Must not be imported by the engine or the harness; it records a design decision.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from reference_engine import Engine, PruningConfig
from reference_engine import router as router_mod
from reference_engine import sensitivity_scale as ss
from rsp_bench.router_curve_measure import HELD_OUT_PROMPTS
from rsp_bench.storage import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gains", default="0,0.1,0.2,0.3,0.5")
    ap.add_argument("--tokens", default="16,64")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "ctl_gain_dev.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    engine = Engine.load(None)
    total = ss.decode_bytes_per_token(engine)
    prompts = list(HELD_OUT_PROMPTS)[: args.prompts]
    default_gain, rows = router_mod.CTL_GAIN, []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        for gain in [float(g) for g in args.gains.split(",")]:
            router_mod.CTL_GAIN = gain
            cfg = PruningConfig(mode="lossy", router="unit", hardware_watermark=0.0, log_level="NONE", sensitivity=0.5)
            shares = []
            with engine.degradation_suspended():
                for p in prompts:
                    st = engine.generate(p, max_new_tokens=tokens, config=cfg)[0].stats
                    shares.append(st["bypassed_weight_bytes"] / (total * max(st["total_tokens"] - 1, 1)))
            sh = np.array(shares)
            rows.append({"gain": gain, "tokens": tokens, "mean": float(sh.mean()), "min": float(sh.min()),
                         "max": float(sh.max()), "sd": float(sh.std()), "per_prompt": [round(float(x), 4) for x in sh]})
            print(f"tokens {tokens} gain {gain}: mean {sh.mean():.3f}, per prompt {sh.min():.3f}-{sh.max():.3f}", flush=True)
    router_mod.CTL_GAIN = default_gain
    out = {"what": __doc__.split("\n")[0], "command": "python scripts/choose_ctl_gain.py " + " ".join(sys.argv[1:]),
           "prompts": len(prompts), "target_share": 0.1, "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    atomic_write_text(args.out, json.dumps(out, indent=1))
    print(f"wrote {args.out} in {out['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
