"""After a blind report, or on a development split: what each instruction probe changes in the whole
detector's verdicts. The engine's check runs once over every prompt of a split at the default
lossy configuration with the probe silenced; where the check would have asked the probe (a prompt
the text rules and the score let through), the probe's features are kept. Each probe is then
applied to those features: a prompt degrades when the rest of the detector degraded it or the probe
fires. Prints degraded / n per group for the rest of the detector alone and with each probe.

    python scripts/instruction_probe_effect.py fixtures/degradation_heldout_2026-12-07f/prompts.jsonl \
        --also OLD.npz

``--also`` takes earlier probe files: version 2 (this package's format) or version 1 (stops 57-66:
one logistic model, ``git show 63b0b59~1:reference_engine/data/calibration/a672150fb4f99d7c-instruction-probe-v1.npz``).
~10 min for a 731-prompt split on 2 cores. Development only: a split this reads after its report
is development from then on. Must not be imported by the engine or the harness.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("odd", "data_request", "payload_alone", "plain_en", "plain_language")
BATCH = 8  # as rsp-bench degradation batches its prompts


def _older_probe(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """An earlier probe file as a function of feature rows -> fires (versions 1 and 2)."""
    from reference_engine.degradation import instruction_probe as ip

    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        arrays = {k: z[k].astype(np.float64) for k in z.files if k != "meta"}
    if meta.get("version") == 1:
        mu, sd, coef, bias, thr = arrays["mu"], arrays["sd"], arrays["coef"], float(meta["bias"]), meta["threshold"]
        return lambda X: ((X - mu) / sd) @ coef + bias > thr
    probe = ip.load(path, meta.get("weights_sha256", ""))
    if probe is None:
        raise ValueError(f"{path} is not an instruction probe file of version 1 or {ip.VERSION}")
    return lambda X: probe.log_odds(X) > probe.threshold


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prompts", type=Path, help="a split's prompts.jsonl")
    ap.add_argument("--also", type=Path, action="append", default=[], help="an earlier probe file (repeatable)")
    a = ap.parse_args(argv)
    try:
        items = [json.loads(line) for line in a.prompts.read_text(encoding="utf-8").splitlines() if line.strip()]
        texts, groups = [x["text"] for x in items], np.array([x["group"] for x in items])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: cannot read the prompt file {a.prompts}: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from reference_engine import Engine, PruningConfig
    from reference_engine.degradation import instruction_probe as ip

    try:
        older = {p.name: _older_probe(p) for p in a.also}
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine = Engine.load(None)
    packaged = engine.instruction_probe()
    if packaged is None:
        print("error: no packaged instruction probe for the embedded weights", file=sys.stderr)
        return 2
    asked: list[np.ndarray] = []

    class _Silenced:
        """The packaged probe's reading, kept; it never fires."""

        def fires(self, pooled: dict[int, np.ndarray]) -> bool:
            asked.append(packaged.features(pooled))
            return False

    silenced = _Silenced()
    engine.instruction_probe = lambda: silenced
    cfg = PruningConfig(mode="lossy", sensitivity=0.5, hardware_watermark=0.0)
    order = sorted(range(len(texts)), key=lambda i: len(engine.encode(texts[i])))
    rest = np.zeros(len(texts), bool)
    feats: list[np.ndarray | None] = [None] * len(texts)
    for at in range(0, len(order), BATCH):
        batch = order[at:at + BATCH]
        asked.clear()
        results = engine.generate([texts[i] for i in batch], max_new_tokens=1, config=cfg)
        for i, r in zip(batch, results):
            rest[i] = r.stats["degraded_reason"] is not None
        # the check asks the probe in row order, of exactly the rows nothing else degraded
        kept = [i for i in batch if not rest[i]]
        if len(kept) != len(asked):
            raise RuntimeError(f"the probe was asked {len(asked)} times for {len(kept)} kept prompts")
        for i, x in zip(kept, asked):
            feats[i] = x
        print(f"\rchecked {min(at + BATCH, len(order))}/{len(order)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    idx = [i for i, x in enumerate(feats) if x is not None]
    X = np.array([feats[i] for i in idx]) if idx else np.zeros((0, 1))

    def with_probe(fires: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        out = rest.copy()
        if idx:
            out[idx] |= fires(X)
        return out

    arms = {"the rest of the detector": rest,
            f"with the packaged probe (version {ip.VERSION})":
                with_probe(lambda F: packaged.log_odds(F) > packaged.threshold),
            **{f"with {name}": with_probe(f) for name, f in older.items()}}
    print(f"{a.prompts}: degraded / n")
    for name, d in arms.items():
        print(f"  {name:45s} " + "  ".join(f"{g} {int(d[groups == g].sum())}/{int((groups == g).sum())}" for g in GROUPS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
