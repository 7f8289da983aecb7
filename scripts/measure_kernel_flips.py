"""How often greedy output flips when the decode kernel changes (issue 14).

The engine's decode kernels (reference_engine.model.decode_step): "torch", bit-identical to
``transformers``; "numpy" (reference_engine.decode_numpy), the same math on OpenBLAS GEMV; and
"native" (reference_engine.decode_native), the same math in one C call. The fast ones sum in
another order. For every equivalence prompt (fixtures) and every held-out prompt below (written
for this measurement, never tuned on), this runs greedy generation, pruning off, batch 1, on the
exact kernel and each fast kernel and reports whether the tokens are identical, where they first
differ and the exact kernel's top-2 logit margin there. On the held-out prompts ``model.generate``
runs too, so every kernel is also compared with ``transformers`` directly.

    python scripts/measure_kernel_flips.py --tokens 24 --threads 1 --kernels numpy,native \
        --out results/kernel_flips.json

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


def compare(engine: Engine, prompt: str, tokens: int, with_hf: bool, kernels: list[str]) -> dict:
    cfg = PruningConfig(mode="off", log_level="NONE")
    out = {}
    for kernel in ["torch", *kernels]:
        engine.decode_kernel = kernel
        r = engine.generate([prompt], max_new_tokens=tokens, config=cfg, return_logits=True)[0]
        out[kernel] = (r.token_ids, r.logits)
    engine.decode_kernel = "torch"
    a = out["torch"][0]
    row: dict = {"prompt": prompt, "tokens": len(a), "kernels": {}}
    hf_tokens = None
    if with_hf:
        hf_tokens = hf_generate_call(engine.hf_model, [engine.encode(prompt)], tokens, engine.pad_id,
                                     engine.eos_id)().tokens[0]
        row["torch_equals_hf"] = hf_tokens[:len(a)] == a
    for kernel in kernels:
        b = out[kernel][0]
        div = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if div is None and len(a) != len(b):
            div = min(len(a), len(b))
        margin = None
        if div is not None and div < len(out["torch"][1]):
            top = out["torch"][1][div].topk(2).values
            margin = float(top[0] - top[1])
        k = {"identical": a == b, "first_divergence": div, "torch_top2_margin_there": margin}
        if hf_tokens is not None:
            k["equals_hf"] = hf_tokens[:len(b)] == b
        row["kernels"][kernel] = k
    row["identical"] = all(k["identical"] for k in row["kernels"].values())
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=24, help="new tokens per prompt (default 24, the quick suite's)")
    p.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (default 1)")
    p.add_argument("--limit", type=int, default=None, help="first N equivalence prompts only")
    p.add_argument("--kernels", default="numpy,native",
                   help="fast kernels to compare with the exact torch kernel, comma-separated (default numpy,native)")
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = p.parse_args(argv)
    from reference_engine.model import DECODE_KERNELS

    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    bad = [k for k in kernels if k not in DECODE_KERNELS or k == "torch"]
    if bad or not kernels:
        print(f"error: --kernels takes fast kernels among {DECODE_KERNELS[1:]}, got {args.kernels!r}", file=sys.stderr)
        return 2
    if args.tokens < 1 or args.threads < 1:
        print(f"error: --tokens and --threads must be >= 1, got {args.tokens}, {args.threads}", file=sys.stderr)
        return 2
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    engine = Engine.load(calibrate=False)  # pruning off needs no calibration
    eq = [x.text for x in load_prompts()][:args.limit]
    result: dict = {"tokens": args.tokens, "threads": args.threads, "kernels": kernels}
    for name, prompts in (("equivalence", eq), ("heldout", HELDOUT)):
        rows = []
        for prompt in prompts:
            rows.append(compare(engine, prompt, args.tokens, with_hf=name == "heldout", kernels=kernels))
            flips = " ".join(f"{k}={v['identical']}@{v['first_divergence']}" for k, v in rows[-1]["kernels"].items())
            print(name, flips, prompt[:60], flush=True)
        result[name] = {"prompts": len(rows), "identical": sum(r["identical"] for r in rows),
                        "identical_by_kernel": {k: sum(r["kernels"][k]["identical"] for r in rows) for k in kernels},
                        "rows": rows}
    summary = {f"{name}/{k}": f"{n}/{result[name]['prompts']} identical"
               for name in ("equivalence", "heldout") for k, n in result[name]["identical_by_kernel"].items()}
    print(summary)
    if args.out:
        atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
