"""Fit the engine's out-of-distribution score (reference_engine/ood.py) and measure it.

    python scripts/calibrate_ood.py [--target-far 0.02] [--out results/ood_calibration.json]
                                    [--package | --cache] [--eval-seeds 12]

Fits on fixtures/normal_corpus/calibration.jsonl against the TUNING classes of
rsp_bench.adversarial.machine_text (seeds 0-15), chooses the one threshold for --target-far false
alarms on fixtures/normal_corpus/heldout.jsonl, and writes the detector beside the engine's
calibration (--package: reference_engine/data, the copy that ships; --cache: the user cache).
Then measures, on inputs the fit never saw: detection on fresh draws (seeds 1000+) of the tuning
classes and of the HELD_OUT classes, false alarms on the held-out normal part and on the user
prompts of fixtures/normal_corpus/user_prompts.py, each with its Wilson interval, and the check's
time per request on a short and a long prompt against one decode step. Writes the JSON atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fixtures" / "normal_corpus"))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from reference_engine import ood  # noqa: E402
from reference_engine.engine import Engine  # noqa: E402
from reference_engine.model_loading import cache_root  # noqa: E402
from rsp_bench.adversarial import machine_text as mt  # noqa: E402
from rsp_bench.metrics import wilson_interval  # noqa: E402
from rsp_bench.storage import atomic_write_json  # noqa: E402


def _corpus(part: str) -> list[str]:
    path = ROOT / "fixtures" / "normal_corpus" / f"{part}.jsonl"
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _rate(hits: int, n: int) -> dict:
    lo, hi = wilson_interval(hits, n)
    return {"hits": hits, "n": n, "rate": round(hits / n, 4) if n else None, "wilson95": [round(lo, 4), round(hi, 4)]}


def _collect(engine: Engine, texts: list[str], what: str) -> list[ood.PromptStats]:
    bar = tqdm(total=len(texts), desc=what, unit="prompt", leave=False)
    out = ood.collect(engine.weights, engine.encode, texts, engine._byte_ids(), progress=lambda i, n: bar.update(1))
    bar.close()
    return out


def _cost(engine: Engine, text: str, reps: int = 11) -> dict:
    """Seconds of the check alone (stats + score) after one real prefill, and of one decode
    step, interleaved (check, step, check, step, ...) so load on the machine hits both alike."""
    from reference_engine.model import KVCache, decode_step, prefill

    w, det = engine.weights, engine.ood_detector()
    ids = engine.encode(text)
    lo, hi = ood.content_span(ids, *ood.template_ends(engine.encode))
    byte_ids = engine._byte_ids()
    S = len(ids)
    hidden: list[torch.Tensor] = []
    cache = KVCache.allocate(w.dims, 1, S + reps + 1)
    valid = torch.ones(1, S + reps + 1, dtype=torch.bool)
    logits = prefill(w, cache, torch.tensor([ids]), torch.arange(S)[None], valid, hidden_out=hidden)
    tok = logits.argmax(-1)
    check, steps = [], []
    for i in range(reps):
        t0 = time.perf_counter()
        det.reason(ood.prompt_stats(w, hidden, 0, 0, ids, lo, hi, len(text), byte_ids))
        t1 = time.perf_counter()
        logits = decode_step(w, cache, tok, torch.tensor([S + i]), valid, None, None, None, kernel=engine.decode_kernel)
        steps.append(time.perf_counter() - t1)
        check.append(t1 - t0)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return {"prompt_tokens": S, "check_s": round(med(check), 5), "decode_step_s": round(med(steps), 5),
            "check_over_step": round(med(check) / med(steps), 3), "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-far", type=float, default=ood.DEFAULT_TARGET_FAR)
    ap.add_argument("--eval-seeds", type=int, default=12, help="fresh draws per generated class (default 12)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--package", action="store_true", help="write reference_engine/data (the shipped copy)")
    where.add_argument("--cache", action="store_true", help="write the user cache (default)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "ood_calibration.json")
    args = ap.parse_args(argv)
    if not 0.0 < args.target_far < 0.5:
        ap.error(f"--target-far must be in (0, 0.5), got {args.target_far}")
    if args.eval_seeds < 1:
        ap.error(f"--eval-seeds must be >= 1, got {args.eval_seeds}")
    torch.set_grad_enabled(False)
    # One thread: prefill of one short prompt at a time gains little from two, and on a shared
    # machine oversubscribed threads made it ten times slower (measured).
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    engine = Engine.load()
    n_layers = engine.dims.n_layers
    calib = _collect(engine, _corpus("calibration"), "normal calibration")
    held = _collect(engine, _corpus("heldout"), "normal held-out")
    odd_fit = _collect(engine, [mt.make(n, s) for n in mt.TUNING for s in range(16)], "odd tuning (fit)")
    det = ood.fit(calib, odd_fit, held, n_layers, args.target_far)
    folder = ROOT / "reference_engine" / "data" if args.package else cache_root()
    path = ood.detector_path(folder, engine.weights_sha256)
    ood.save(det, path, engine.weights_sha256)
    engine._ood = det
    fit_s = time.perf_counter() - t_start

    import user_prompts

    user = _collect(engine, [t for _, t in user_prompts.PROMPTS], "user prompts")
    per_class = {}
    for name in mt.MAKERS:
        stats = _collect(engine, [mt.make(name, s) for s in range(1000, 1000 + args.eval_seeds)], name)
        per_class[name] = sum(det.reason(s) is not None for s in stats)
    tune_hits = sum(per_class[n] for n in mt.TUNING)
    held_hits = sum(per_class[n] for n in mt.HELD_OUT)
    n_each = args.eval_seeds
    result = {
        "what": "model-level OOD score of the reference engine (reference_engine/ood.py), measured by "
                "scripts/calibrate_ood.py; generated odd text scored by the model score alone (text rules not applied)",
        "detector": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
        "target_false_alarm_rate": args.target_far, "threshold": det.threshold, "fit_info": det.info,
        "false_alarms_heldout_normal": _rate(sum(det.reason(s) is not None for s in held), len(held)),
        "false_alarms_user_prompts": _rate(sum(det.reason(s) is not None for s in user), len(user)),
        "user_prompts_fired": [t[:60] for (_, t), s in zip(user_prompts.PROMPTS, user) if det.reason(s)],
        "detection_tuning_classes": _rate(tune_hits, n_each * len(mt.TUNING)),
        "detection_heldout_classes": _rate(held_hits, n_each * len(mt.HELD_OUT)),
        "per_class": {n: {"split": "tuning" if n in mt.TUNING else "held_out", **_rate(h, n_each)}
                      for n, h in per_class.items()},
        "cost": {"short": _cost(engine, "What is the capital of France?"),
                 "long": _cost(engine, " ".join(_corpus("heldout")[:40])[:6000])},
        "fit_seconds": round(fit_s, 1), "total_seconds": round(time.perf_counter() - t_start, 1),
    }
    atomic_write_json(args.out, result)
    print(json.dumps({k: result[k] for k in ("false_alarms_heldout_normal", "false_alarms_user_prompts",
                                             "detection_tuning_classes", "detection_heldout_classes", "cost")},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
