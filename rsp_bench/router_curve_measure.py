"""``rsp-bench router-curve``: the unit router's quality/speed curve against static and random
removal at equal weight bytes (the README's curve tables; ``rsp_bench.router_curve`` renders the
result on the leaderboard).

    rsp-bench router-curve [--out results/router_curve.json] [--tokens 32] [--held-out FILE]

1. Sensitivities are chosen on TUNE_PROMPTS (never on the held-out ones): a grid of
   sensitivities is run there and, for each target of 1..6 blocks' worth of weight bytes not
   read per decode token, the sensitivity landing there is interpolated from the measured
   (monotone) bytes curve.
2. On HELD_OUT_PROMPTS (written for this script; neither the predictor's training text nor
   fixtures/), for each chosen sensitivity: teacher-forced top-1 agreement and mean KL(unpruned
   || pruned) on the decode positions of the unpruned greedy continuation, for
   - the router (``Engine.teacher_forced``, mode lossy, router "unit", the engine's kernel,
     watermark pinned to 0 so the figures do not depend on the machine's load);
   - static per-unit removal: units ranked by Block Influence (ShortGPT's 1 - cos(in, out) of
     the attention and of the MLP sublayer, measured on the predictor's training text), removed
     lowest first; where the router's measured bytes fall between two whole-unit budgets, the
     figures are linearly interpolated between them at the router's bytes;
   - random per-unit removal at the same bytes, same interpolation, mean over SEEDS.
   Static and random run as one teacher-forced pass per prompt (``model.forward_units``, the
   same math as prefill plus decode steps with fixed flags; tests/test_router_units.py checks).
   The first and last blocks are excluded for all three (the router's default blacklist).
3. Speed: greedy decode, pruning off vs the router, interleaved A B A B in this process, on the
   engine's kernel; the ideal speed-up from the bytes not read; the router time per token.
Writes the JSON atomically. The sensitivities here are the router's own internal scale
(``Engine.raw_unit_scale``: the unit router's threshold scale), not the
user scale of reference_engine/sensitivity_scale.py.

The measurement itself is ``measure_curve`` (an engine, held-out prompts, targets, sizes): the
command calls it with the sizes above, and the full run's suite (suites/test_router_curve.py)
with smaller ones, recording its figures in the run record (``rsp_bench.router_curve``).

Must not import the pytest plugin; imports torch and the engine (it is loaded only when the
command runs, or when the suite measures).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from reference_engine import Engine
from reference_engine.model import forward_units
from reference_engine.sensitivity_scale import TUNE_PROMPTS
from reference_engine.unit_predictor import unit_bytes
from rsp_bench import metrics
from rsp_bench.datasets import read_prompt_texts
from rsp_bench.engines.reference import random_units, shortgpt_units, unit_budget_bracket
from rsp_bench.storage import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]

TARGETS = (1, 2, 3, 4, 5, 6)  # blocks' worth of weight bytes not read per decode token
# the router's threshold scales (the free router, predictor v3: 0.03 about 2 and 0.12 about 6
# blocks' worth on the development prompts); 0.5 is far past the targets, for the speed extreme
GRID = (0.01, 0.02, 0.03, 0.045, 0.06, 0.08, 0.1, 0.13, 0.16, 0.2, 0.3, 0.5)
SEEDS = (0, 1, 2, 3, 4)

# TUNE_PROMPTS (imported above) are the choosing split: the same prompts the sensitivity scale is fitted on

HELD_OUT_PROMPTS = (
    "Why do leaves change colour in the fall?",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "Return JSON with keys city and population for Lisbon, about 545,000 people.",
    "What is 23 times 19? Explain how you got it.",
    "Describe a sunrise over the mountains in three sentences.",
    "Give five tips for learning a new language.",
    "What is the boiling point of water at sea level, in Celsius and Fahrenheit?",
    "Write a SQL query that lists the ten most expensive products.",
    "Explain what an API is to a non-programmer.",
    "Summarize: The bakery on Elm Street will close for two weeks in August for repairs, "
    "and will reopen with a new menu on 1 September.",
    "Extract the name and the phone number: Call Priya Shah at 555-0142 after 6 pm.",
    "Tell a short story about a robot who paints.",
    "What are the main differences between a virus and a bacterium?",
    "Write a shell one-liner that counts the lines in every .py file.",
    "Plan a three-day trip to Rome in a short list.",
    "How long does light from the Sun take to reach Earth?",
    "Convert 5 kilometres to miles and explain the conversion.",
    "Write a short apology message for a late delivery.",
)


BUILT_IN_SOURCE = "built-in HELD_OUT_PROMPTS (a development set: used to compare router designs)"


def _log(message: str) -> None:
    print(message, flush=True)


def read_held_out(path: Path) -> tuple[str, ...]:
    """The prompts of a JSONL file, one JSON object with a "text" per line; ValueError naming the
    line when one is broken or empty, or when there are none."""
    return tuple(read_prompt_texts(path, plain_lines=False))


class Case:
    """One prompt: its ids, the unpruned greedy continuation and both paths' unpruned logits."""

    def __init__(self, engine: Engine, prompt: str, n: int):
        self.ids = engine.encode(prompt)
        [ref] = engine.generate([prompt], max_new_tokens=n, mode="off", log_level="NONE")
        self.cont = ref.token_ids
        self.ref_engine = engine.teacher_forced(self.ids, self.cont, mode="off", log_level="NONE").logits
        self.seq = torch.tensor([self.ids + self.cont])
        self.ref_pass = forward_units(engine.weights, self.seq, len(self.ids))


def _quality(ref: torch.Tensor, cand: torch.Tensor) -> tuple[float, float, int]:
    """(agreeing positions, summed KL, positions) over the decode rows (row 0 is prefill's)."""
    r, c = ref[1:], cand[1:]
    if r.shape[0] == 0:
        return 0.0, 0.0, 0
    return float(metrics.top1_matches(r, c).sum()), float(metrics.kl_per_token(r, c).sum()), r.shape[0]


def router_point(engine: Engine, cases: list[Case], s: float) -> dict:
    agree = kl = n = 0.0
    saved = steps = degraded = 0
    rt = 0.0
    for c in cases:
        res = engine.teacher_forced(c.ids, c.cont, mode="lossy", router="unit", sensitivity=s,
                                    hardware_watermark=0.0, log_level="NONE")
        if res.stats["degraded"]:  # protective degradation ran it unpruned: counted, not hidden
            degraded += 1
            _log(f"  note: degraded ({res.stats['degraded_reason']}) at s={s}")
        a, k, m = _quality(c.ref_engine, res.logits)
        agree, kl, n = agree + a, kl + k, n + m
        saved += res.stats["bypassed_weight_bytes"]
        steps += res.stats["total_tokens"] - 1
        rt += res.stats["router_time_s"]
    _, bb = engine.unit_bytes()
    return {"sensitivity": s, "top1": agree / n, "kl": kl / n, "blocks_worth": saved / steps / bb,
            "router_ms_per_token": 1e3 * rt / steps, "positions": int(n), "degraded_prompts": degraded}


class Removal:
    """Static (ranked) or random removal, evaluated at whole-group budgets and cached.

    ``groups``: what is removed, first to last; a group is one unit ([u]) or a whole block
    ([2l, 2l + 1]). Figures at a byte budget interpolate between the two whole-group budgets
    around it (``rsp_bench.engines.reference.unit_budget_bracket``). Removed units take the same
    stand-ins the router's do (the unit maps), whole blocks their calibrated block maps."""

    def __init__(self, engine: Engine, cases: list[Case], groups: list[list[int]]):
        self.engine, self.cases, self.groups = engine, cases, groups
        self.whole_blocks = all(len(g) == 2 for g in groups)
        ub, self.block_bytes = engine.unit_bytes()
        self.group_bytes = [int(sum(ub[u] for u in g)) for g in groups]
        if self.whole_blocks:  # a whole block reads its block map instead of the two unit maps
            plain, _ = unit_bytes(engine.weights)
            maps = engine._bypass or [None] * engine.dims.n_layers
            self.group_bytes = [int(plain[g[0]] + plain[g[1]] - (0 if maps[g[0] // 2] is None else
                                    4 * (maps[g[0] // 2].down.numel() + maps[g[0] // 2].up.numel())))
                                for g in groups]
        self.cache: dict[int, tuple[float, float]] = {}

    def at_k(self, k: int) -> tuple[float, float]:
        if k not in self.cache:
            L = self.engine.dims.n_layers
            ka, km = [True] * L, [True] * L
            for g in self.groups[:k]:
                for u in g:
                    (ka if u % 2 == 0 else km)[u // 2] = False
            agree = kl = n = 0.0
            for c in self.cases:
                cand = forward_units(self.engine.weights, c.seq, len(c.ids), ka, km, self.engine._bypass,
                                     unit_bypass=None if self.whole_blocks else self.engine.unit_maps())
                a, k_, m = _quality(c.ref_pass, cand)
                agree, kl, n = agree + a, kl + k_, n + m
            self.cache[k] = (agree / n, kl / n)
        return self.cache[k]

    def at_bytes(self, blocks_worth: float) -> dict:
        """Linear interpolation between the two whole-group budgets around ``blocks_worth``."""
        k, k1, t = unit_budget_bracket(blocks_worth * self.block_bytes, self.group_bytes,
                                       list(range(len(self.groups))))
        (a0, kl0), (a1, kl1) = self.at_k(k), self.at_k(k1)
        lo = sum(self.group_bytes[:k]) / self.block_bytes
        return {"top1": (1 - t) * a0 + t * a1, "kl": (1 - t) * kl0 + t * kl1, "groups": [k, k1], "t": t,
                "blocks_worth_bracket": [lo, lo + self.group_bytes[k] / self.block_bytes]}


def static_orders(engine: Engine, pred, blacklist: set[int]) -> dict[str, list[list[int]]]:
    """The static baselines, all measured on calibration/training text, none on the held-out prompts:
    - unit_bi: units by ascending Block Influence of their sublayer (ShortGPT, decoupled);
    - block_bi: whole blocks by ascending Block Influence (ShortGPT as published; the suite's today);
    - unit_bi_per_byte: units by Block Influence / (bytes saved / block bytes) (decoupled, and
      aware that an MLP saves four times an attention's bytes);
    - unit_impact_per_byte: units by measured mean KL when bypassed alone / bytes share (the
      strongest static ranking this project can build from its own calibration)."""
    ub, bb = engine.unit_bytes()
    share = ub / bb
    L = engine.dims.n_layers
    cal = engine.calibration()
    blocks = sorted((i for i in range(L) if i not in blacklist), key=lambda i: (cal.block_influence[i], i))
    units = [u for u in range(2 * L) if u // 2 not in blacklist]
    return {
        "unit_bi": [[u] for u in shortgpt_units(pred.block_influence, blacklist)],
        "block_bi": [[2 * i, 2 * i + 1] for i in blocks],
        "unit_bi_per_byte": [[u] for u in sorted(units, key=lambda u: (pred.block_influence[u] / share[u], u))],
        "unit_impact_per_byte": [[u] for u in sorted(units, key=lambda u: (pred.impact[u] / share[u], u))],
    }


def choose_sensitivities(points: list[dict], targets: Sequence[int] = TARGETS) -> dict[int, float]:
    s = np.array([p["sensitivity"] for p in points])
    b = np.maximum.accumulate(np.array([p["blocks_worth"] for p in points]))
    out = {}
    for t in targets:
        if b[-1] < t:
            continue
        out[t] = float(np.interp(t, b, s))
    return out


def tune_grid(engine: Engine, tune_prompts: Sequence[str], tokens: int, stop_at: float | None = None,
              log: Callable[[str], None] = _log) -> list[dict]:
    """The router at each GRID sensitivity on the tune prompts; with ``stop_at``, the grid stops at
    the first point whose bytes reach it (the bytes curve is monotone: deeper points choose nothing
    for targets up to ``stop_at``)."""
    tune = [Case(engine, p, tokens) for p in tune_prompts]
    grid = []
    for s in GRID:
        grid.append(router_point(engine, tune, s))
        log(f"  tune s={s}: {grid[-1]}")
        if stop_at is not None and grid[-1]["blocks_worth"] >= stop_at:
            break
    return grid


def speed(engine: Engine, prompts: list[str], sens: list[float], n: int, rounds: int, pair_ratios: bool = False,
          log: Callable[[str], None] = _log) -> list[dict]:
    """Interleaved A B A B: off, then the router at each sensitivity, per prompt and round; with
    ``pair_ratios`` each point also holds the per-pair ratios (off time / router time) the
    speed-up is the median of (the run record's samples)."""
    w = engine.weights
    step_bytes = sum(w.bytes_per_block() for _ in w.blocks) + w.lm_head.numel() * w.lm_head.element_size()
    _, bb = engine.unit_bytes()
    out = []
    for s in sens:
        base, cand, saved, steps, rt = [], [], 0, 0, 0.0
        for _ in range(rounds):
            for p in prompts:
                [a] = engine.generate([p], max_new_tokens=n, mode="off", log_level="NONE")
                [r] = engine.generate([p], max_new_tokens=n, mode="lossy", router="unit", sensitivity=s,
                                      hardware_watermark=0.0, log_level="NONE")
                base.append(a.stats["decode_time_s"] / max(a.stats["total_tokens"] - 1, 1))
                cand.append(r.stats["decode_time_s"] / max(r.stats["total_tokens"] - 1, 1))
                saved += r.stats["bypassed_weight_bytes"]
                steps += r.stats["total_tokens"] - 1
                rt += r.stats["router_time_s"]
        sp = metrics.interleaved_speedup(base, cand)
        per_tok = saved / steps
        out.append({"sensitivity": s, "speedup": sp["ratio"], "speedup_lo": sp["lo"], "speedup_hi": sp["hi"],
                    "ideal_speedup": step_bytes / (step_bytes - per_tok), "blocks_worth": per_tok / bb,
                    "router_ms_per_token": 1e3 * rt / steps, "pairs": len(base),
                    "off_ms_per_token": 1e3 * float(np.median(base))})
        if pair_ratios:
            out[-1]["pair_ratios"] = [a / c for a, c in zip(base, cand)]
        log(f"  speed s={s:.3f}: {out[-1]}")
    return out


def configure_parser(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "router_curve.json",
                    help="the JSON result, written atomically (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=32,
                    help="tokens of each prompt's unpruned continuation, teacher-forced (default: %(default)s)")
    ap.add_argument("--speed-prompts", type=int, default=4,
                    help="held-out prompts in the interleaved speed runs (default: %(default)s)")
    ap.add_argument("--speed-rounds", type=int, default=2,
                    help="A B rounds per prompt and sensitivity in the speed runs (default: %(default)s)")
    ap.add_argument("--model", default=None, help="a local model folder or .gguf (default: the embedded one)")
    ap.add_argument("--smoke", action="store_true", help="2 tune and 3 held-out prompts: checks the script runs")
    ap.add_argument("--threads", type=int, default=None, help="torch / native kernel threads (default: torch's)")
    ap.add_argument("--held-out", type=Path, default=None, metavar="JSONL",
                    help="held-out prompts from a file, one JSON object with a \"text\" per line (default: the "
                         "built-in HELD_OUT_PROMPTS, a development set now; fixtures/router_curve/ holds fresh ones)")
    ap.add_argument("--load-note", default="",
                    help="what else ran on the machine while measuring, recorded as the result's load_note")
    ap.add_argument("--tune-from", type=Path, default=None,
                    help="reuse the tune grid and chosen sensitivities of an earlier result (skips step 1)")


def measure_curve(engine: Engine, held_prompts: Sequence[str], *, tune_prompts: Sequence[str] = TUNE_PROMPTS,
                  tokens: int = 32, targets: Sequence[int] = TARGETS, grid: list[dict] | None = None,
                  stop_tune_at_targets: bool = False, grid_extras: bool = True, seeds: Sequence[int] = SEEDS,
                  speed_prompts: int = 4, speed_rounds: int = 2, speed_targets: Sequence[int] | None = (1, 3, 6),
                  speed_deepest: bool = True, pair_ratios: bool = False,
                  log: Callable[[str], None] = _log) -> dict:
    """Steps 1-3 of the module docstring on ``engine`` (sensitivities in the router's raw scale,
    entered here): the curve's figures as a dict with the command's keys ``predictor_report``,
    ``tune_grid``, ``chosen_sensitivities``, ``held_out``, ``speed`` and ``static_orders``.

    ``grid``: an earlier tune grid (skips step 1); ``stop_tune_at_targets``: the tune grid stops
    once its bytes reach the deepest target; ``grid_extras``: also measure the GRID points above
    the chosen sensitivities on the held-out prompts; ``speed_targets``: the targets whose
    sensitivities are timed (None: all), ``speed_deepest``: and the deepest measured point;
    ``pair_ratios``: each speed point keeps its per-pair ratios."""
    pred = engine.unit_predictor(progress=log)
    L = engine.dims.n_layers
    blacklist = {0, L - 1}
    with engine.raw_unit_scale():  # the curve's sensitivities are the router's own scale
        log(f"kernel {engine.decode_kernel}; predictor report {json.dumps(pred.report)[:400]}")
        if grid is None:
            grid = tune_grid(engine, tune_prompts, tokens, max(targets) if stop_tune_at_targets else None, log)
        chosen = choose_sensitivities(grid, targets)
        # The held-out prompts may land elsewhere than the tune ones did: the fixed grid's points above
        # the chosen ones are measured too (chosen a priori, not on the held-out figures).
        extra = [s for s in GRID if s > max(chosen.values(), default=0.0)] if grid_extras else []
        log(f"chosen sensitivities {chosen}, plus grid points {extra}")

        held = [Case(engine, p, tokens) for p in held_prompts]
        statics = {name: Removal(engine, held, g) for name, g in static_orders(engine, pred, blacklist).items()}
        randoms = [Removal(engine, held, [[u] for u in random_units(2 * L, blacklist, seed)]) for seed in seeds]
        rows = []
        for target, s in [*sorted(chosen.items()), *[(None, s) for s in extra]]:
            rp = router_point(engine, held, s)
            st = {name: r.at_bytes(rp["blocks_worth"]) for name, r in statics.items()}
            best = max(st, key=lambda name: st[name]["top1"])
            rd = [r.at_bytes(rp["blocks_worth"]) for r in randoms]
            row = {"target_blocks_worth": target, "router": rp, "static": st, "best_static": best,
                   "random": {"top1": float(np.mean([r["top1"] for r in rd])), "kl": float(np.mean([r["kl"] for r in rd])),
                              "top1_per_seed": [r["top1"] for r in rd]},
                   "router_minus_static_unit_bi_top1": rp["top1"] - st["unit_bi"]["top1"],
                   "router_minus_best_static_top1": rp["top1"] - st[best]["top1"]}
            rows.append(row)
            log(f"held-out target {target}: router {rp['top1']:.3f}/{rp['kl']:.3f} at {rp['blocks_worth']:.2f} blocks; "
                + "; ".join(f"{n} {v['top1']:.3f}/{v['kl']:.3f}" for n, v in st.items())
                + f"; random {row['random']['top1']:.3f}")
        timed = {r["router"]["sensitivity"] for r in rows
                 if r["target_blocks_worth"] is not None and (speed_targets is None or r["target_blocks_worth"] in speed_targets)}
        if speed_deepest and rows:
            timed.add(max(rows, key=lambda r: r["router"]["blocks_worth"])["router"]["sensitivity"])
        sp = speed(engine, list(held_prompts[:speed_prompts]), sorted(timed), tokens, speed_rounds, pair_ratios, log)
    return {"predictor_report": pred.report, "tune_grid": grid, "chosen_sensitivities": chosen, "held_out": rows,
            "speed": sp, "static_orders": {name: r.groups for name, r in statics.items()}}


def run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.tokens < 4:
        print(f"rsp-bench router-curve: error: --tokens must be >= 4, got {args.tokens}", file=sys.stderr)
        return 2
    held_source = BUILT_IN_SOURCE
    all_held: tuple[str, ...] = HELD_OUT_PROMPTS
    if args.held_out is not None:
        try:
            all_held = read_held_out(args.held_out)
        except ValueError as exc:
            print(f"rsp-bench router-curve: error: --held-out {args.held_out}: {exc}", file=sys.stderr)
            return 2
        held_source = str(args.held_out)
    grid = None
    if args.tune_from is not None:
        try:
            grid = json.loads(args.tune_from.read_text())["tune_grid"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"rsp-bench router-curve: error: --tune-from {args.tune_from}: not a result of this command ({exc})",
                  file=sys.stderr)
            return 2
    # every input checked before the weights load: a typo fails in a second
    t0 = time.perf_counter()
    torch.set_grad_enabled(False)
    engine = Engine.load(args.model)
    tune_prompts, held_prompts = (TUNE_PROMPTS[:2], all_held[:3]) if args.smoke else (TUNE_PROMPTS, all_held)
    curve = measure_curve(engine, held_prompts, tune_prompts=tune_prompts, tokens=args.tokens, grid=grid,
                          speed_prompts=args.speed_prompts, speed_rounds=args.speed_rounds)
    result = {
        "what": "unit router vs static (Block Influence per unit) and random per-unit removal at equal weight bytes",
        "command": "rsp-bench router-curve " + " ".join(sys.argv[2:]),
        "model": engine.name, "weights_sha256": engine.weights_sha256, "kernel": engine.decode_kernel,
        "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
        "load_note": args.load_note, "held_out_source": held_source,
        "tokens": args.tokens, "tune_prompts": len(tune_prompts), "held_out_prompts": len(held_prompts),
        "predictor_report": curve["predictor_report"], "tune_grid": curve["tune_grid"],
        "chosen_sensitivities": curve["chosen_sensitivities"], "held_out": curve["held_out"], "speed": curve["speed"],
        "seconds": round(time.perf_counter() - t0, 1), "static_orders": curve["static_orders"],
    }
    atomic_write_text(args.out, json.dumps(result, indent=1))
    print(f"wrote {args.out} in {result['seconds']} s")
    return 0
