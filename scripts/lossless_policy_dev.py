"""Design experiment (issue 25): which lossless drafting policy pays most, chosen on development
prompts by replaying decoding with measured costs instead of wall clocks.

Lossless mode's output is pruning off's output whatever it drafts, so how fast a drafting policy
is on a prompt depends only on that output (what the verifier accepts) and on what a plain step
and an S-position verify pass cost. Here each development prompt's off output is generated once;
then every policy is replayed by lossless mode's own decoder (``speculative._RowDecoder``: its
n-gram index, acceptance estimates and choice of source and length) with the verify pass answering
from the off output and the clock replaced by a cost table: a plain step 1, an S-position pass
``verify[S]`` plain steps, measured here on this machine at ``--threads`` (interleaved with plain
steps, median of ``--cost-reps``). Speed-up of a prompt = its decode tokens / its replayed cost;
the table gives the median over prompts and the aggregate. No timing noise, so small policy
differences show; the chosen policy is then timed for real (rsp-bench lossless).

Development prompts only: SQuAD (a seeded shuffle's first ``--squad``; the first 32 are the ones
rsp-bench lossless times) and the structured extraction set's documents. Never a held-out
set.

    python scripts/lossless_policy_dev.py --threads 2 --out results/lossless_policy_dev.json

Must not be imported by the engine or the harness; it records a design decision.
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

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reference_engine import Engine  # noqa: E402
from reference_engine.generation import PromptRow  # noqa: E402
from reference_engine.model import KVCache, decode_step, prefill  # noqa: E402
from reference_engine.decode_native import verify_native  # noqa: E402
from reference_engine import draft_sources as ds  # noqa: E402
from reference_engine import speculative as sp  # noqa: E402
from rsp_bench.datasets import load_squad, load_structured, quick_subset, squad_prompt, structured_prompt  # noqa: E402

MAX_S = 17


def measure_costs(engine: Engine, reps: int) -> list[float]:
    """verify[S] for S = 0..MAX_S in plain steps: each rep times a plain step and an S-position
    pass back to back on the same cache (the median ratio per S)."""
    ids = engine.encode(squad_prompt(quick_subset(load_squad(), 1)[0]))
    w = engine.weights
    cache = KVCache.allocate(engine.dims, 1, len(ids) + MAX_S + 2)
    kv = torch.ones(1, cache.capacity, dtype=torch.bool)
    prefill(w, cache, torch.tensor([ids]), torch.arange(len(ids))[None], kv)
    P = cache.length
    ratios: dict[int, list[float]] = {S: [] for S in range(2, MAX_S + 1)}
    for _ in range(reps):
        for S in range(2, MAX_S + 1):
            cache.length = P
            t0 = time.perf_counter()
            decode_step(w, cache, torch.tensor([ids[-1]]), torch.tensor([P]), kv, None, None, None,
                        kernel=engine.decode_kernel)
            t1 = time.perf_counter()
            cache.length = P
            verify_native(w, cache, ids[-S:], P, kv)
            t2 = time.perf_counter()
            ratios[S].append((t2 - t1) / (t1 - t0))
    cache.length = P
    return [1.0, 1.0] + [round(statistics.median(ratios[S]), 3) for S in range(2, MAX_S + 1)]


class _Replay(sp._RowDecoder):
    """Lossless mode's row decoder with the model replaced by the off output and the clock by costs."""

    def __init__(self, engine: Engine, row: PromptRow, off: list[int], max_new: int, policy: sp.DraftPolicy,
                 costs: list[float], shared: ds._Costs) -> None:
        cfg = engine._config(None, {"mode": "lossless", "log_level": "NONE"})
        super().__init__(engine, row, max_new, policy, cfg, shared, None, 0)
        self.off, self.cost_table, self.spent = off, costs, 0.0
        self.pruned_state = "off"
        self.verify = self._fake_verify
        self.exact_verify = True

    def _fake_verify(self, _w, cache, tokens, start, _kv):
        at = len(self.out)  # the verifier predicts off's tokens at output indices at .. at + S - 1
        V = self.engine.dims.vocab
        logits = torch.zeros(len(tokens), V)
        for i in range(len(tokens)):
            j = at + i
            logits[i, self.off[j] if j < len(self.off) else self.engine.eos_id] = 1.0
        self.spent += self.cost_table[min(len(tokens), len(self.cost_table) - 1)]
        cache.length = start + len(tokens)
        return logits

    def _plain(self) -> int:
        self.cache.length += 1
        self.clean = self.cache.length
        self.plain_steps += 1
        self.copy_from = None
        self.spent += 1.0
        self._emit([self.off[len(self.out)]])
        return self.engine.dims.n_layers


def replay(engine: Engine, rows: list[tuple[PromptRow, list[int]]], max_new: int, policy: sp.DraftPolicy,
           costs: list[float]) -> dict:
    shared = ds._Costs(max_positions=len(costs) - 1)
    shared.verify = list(costs) + [costs[-1]] * 64
    shared.t_plain = 1.0
    shared.observe_verify = lambda *a: None  # the table is fixed
    speedups, toks, spent, drafted, accepted = [], 0, 0.0, 0, 0
    for row, off in rows:
        dec = _Replay(engine, row, off, max_new, policy, costs, shared)
        dec.run(torch.nn.functional.one_hot(torch.tensor(off[0]), engine.dims.vocab).float())
        assert dec.out == off, "the replay must reproduce the off output"
        n = len(off) - 1
        if n >= 1:
            speedups.append(n / dec.spent)
            toks += n
            spent += dec.spent
        st = dec.stats()
        drafted += st["drafted"]
        accepted += st["accepted"]
    return {"median": round(statistics.median(speedups), 4), "aggregate": round(toks / spent, 4),
            "acceptance": round(accepted / drafted, 3) if drafted else 0.0, "drafted": drafted}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--squad", type=int, default=96)
    ap.add_argument("--structured", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--cost-reps", type=int, default=15)
    ap.add_argument("--prompts", type=Path, default=None, help="replay these development prompts instead (JSONL, text)")
    ap.add_argument("--costs-from", type=Path, default=None,
                    help="reuse the cost table of an earlier run's JSON (compare code versions on equal costs)")
    ap.add_argument("--offs", type=Path, default=Path("/tmp/lossless_offs.json"), help="cache of the off outputs")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = Engine.load()
    sets = {"squad": [squad_prompt(x) for x in quick_subset(load_squad(), args.squad)],
            "structured": [structured_prompt(d) for d in quick_subset(load_structured(), args.structured)]}
    if args.prompts is not None:  # another development file (id, text), e.g. to set beside a timed run
        sets = {"prompts": [json.loads(line)["text"] for line in args.prompts.read_text().splitlines() if line.strip()]}
    cached = json.loads(args.offs.read_text()) if args.offs.is_file() else {}
    rows: dict[str, list] = {}
    for name, prompts in sets.items():
        rows[name] = []
        for i, p in enumerate(prompts):
            key = f"{args.tokens}:{p}"
            if key not in cached:
                cached[key] = engine.generate(p, max_new_tokens=args.tokens, mode="off", log_level="NONE")[0].token_ids
                print(f"  off {name} {i + 1}/{len(prompts)}", end="\r", flush=True)
            rows[name].append((PromptRow(p, engine.encode(p)), cached[key]))
    args.offs.write_text(json.dumps(cached))
    costs = (json.loads(args.costs_from.read_text())["verify_cost_by_positions"] if args.costs_from
             else measure_costs(engine, args.cost_reps))
    print("verify cost by positions:", costs[2:])
    variants = {
        "packaged": sp.DraftPolicy(),
        **{f"ngram_max={n}": sp.DraftPolicy(ngram_max=n) for n in (3, 6)},
        **{f"min_gain={g}": sp.DraftPolicy(min_gain=g) for g in (1.0, 1.1)},
        "max_lookup=7": sp.DraftPolicy(max_lookup=7),
    }
    table = {}
    for vname, pol in variants.items():
        pol.pruned = False
        table[vname] = {name: replay(engine, rs, args.tokens, pol, costs) for name, rs in rows.items()}
        print(f"{vname:16} " + "  ".join(f"{n}: {r['median']:.3f} / {r['aggregate']:.3f} (acc {r['acceptance']})"
                                          for n, r in table[vname].items()), flush=True)
    doc = {"what": __doc__.split("\n")[0], "command": " ".join(["python"] + sys.argv),
           "threads": args.threads, "verify_cost_by_positions": costs, "prompts": {n: len(r) for n, r in rows.items()},
           "tokens": args.tokens, "replayed_speedup_median_aggregate": table}
    fd, tmp = tempfile.mkstemp(dir=args.out.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
