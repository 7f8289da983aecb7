"""How often greedy output flips when the decode kernel changes (issue 14).

The engine has two decode kernels (reference_engine.model.decode_step): "torch", bit-identical to
``transformers``, and "numpy" (reference_engine.decode_numpy), the same math on OpenBLAS GEMV,
which sums in another order. For every equivalence prompt (fixtures) and every held-out prompt
below (written for this measurement, never tuned on), this runs greedy generation, pruning off,
batch 1, on both kernels and reports whether the tokens are identical, where they first differ
and the exact kernel's top-2 logit margin there. On the held-out prompts ``model.generate`` runs
too, so both kernels are also compared with ``transformers`` directly.

    python scripts/measure_kernel_flips.py --tokens 24 --threads 1 --out results/kernel_flips.json

Imports the reference engine and the harness's fixtures; writes one JSON file atomically.
"""

from __future__ import annotations

import argparse
import sys

import torch

from reference_engine import Engine, PruningConfig
from rsp_bench.datasets import load_prompts
from rsp_bench.speed import hf_generate_call
from rsp_bench.storage import atomic_write_json

HELDOUT = [
    "Write a haiku about a lighthouse in winter.",
    "What are three common causes of a flat bicycle tire, and how do you fix each?",
    "Convert 72 degrees Fahrenheit to Celsius and show your work.",
    "List the planets of the solar system in order from the sun.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "Give me a Python function that reverses a string.",
    "Why do cats purr? Give a short answer.",
    'Translate "Where is the train station?" into French and Spanish.',
    "What is 17 times 23?",
    "Draft a polite email asking my landlord to fix a leaking faucet.",
    "Explain the difference between weather and climate to a ten-year-old.",
    "Name five vegetables that grow well in shade.",
    "What does the acronym NASA stand for?",
    "Describe the smell of rain in one paragraph.",
    "How many minutes are there in a week? Explain briefly.",
    "Suggest a name for a bakery that specializes in sourdough bread.",
]


def compare(engine: Engine, prompt: str, tokens: int, with_hf: bool) -> dict:
    cfg = PruningConfig(mode="off", log_level="NONE")
    out = {}
    for kernel in ("torch", "numpy"):
        engine.decode_kernel = kernel
        r = engine.generate([prompt], max_new_tokens=tokens, config=cfg, return_logits=True)[0]
        out[kernel] = (r.token_ids, r.logits)
    engine.decode_kernel = "torch"
    a, b = out["torch"][0], out["numpy"][0]
    div = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if div is None and len(a) != len(b):
        div = min(len(a), len(b))
    margin = None
    if div is not None and div < len(out["torch"][1]):
        top = out["torch"][1][div].topk(2).values
        margin = float(top[0] - top[1])
    row = {"prompt": prompt, "tokens": len(a), "identical": a == b, "first_divergence": div,
           "torch_top2_margin_there": margin}
    if with_hf:
        hf = hf_generate_call(engine.hf_model, [engine.encode(prompt)], tokens, engine.pad_id, engine.eos_id)()
        row["torch_equals_hf"] = hf.tokens[0][:len(a)] == a
        row["numpy_equals_hf"] = hf.tokens[0][:len(b)] == b
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=24, help="new tokens per prompt (default 24, the quick suite's)")
    p.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (default 1)")
    p.add_argument("--limit", type=int, default=None, help="first N equivalence prompts only")
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = p.parse_args(argv)
    if args.tokens < 1 or args.threads < 1:
        print(f"error: --tokens and --threads must be >= 1, got {args.tokens}, {args.threads}", file=sys.stderr)
        return 2
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    engine = Engine.load(calibrate=False)  # pruning off needs no calibration
    eq = [x.text for x in load_prompts()][:args.limit]
    result: dict = {"tokens": args.tokens, "threads": args.threads}
    for name, prompts in (("equivalence", eq), ("heldout", HELDOUT)):
        rows = []
        for prompt in prompts:
            rows.append(compare(engine, prompt, args.tokens, with_hf=name == "heldout"))
            print(name, rows[-1]["identical"], rows[-1]["first_divergence"], prompt[:60], flush=True)
        result[name] = {"prompts": len(rows), "identical": sum(r["identical"] for r in rows), "rows": rows}
    summary = {k: f"{v['identical']}/{v['prompts']} identical" for k, v in result.items() if isinstance(v, dict)}
    print(summary)
    if args.out:
        atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
