"""``rsp-bench compare A B``: do two run records hold the same deterministic figures?

What a subset, a reversed order or a rerun of the suites must reproduce is every figure that is a
function of the weights, the prompts and the configuration (quality, bypass accounting,
trace-derived projections): ``rsp_bench.baselines.metric_scope`` says "model" for those. Timing
figures ("machine") move from run to run and are left out. Figures only one of the records holds
are listed, not failed (a subset measures less); a figure both hold must be equal to the last
digit, its n included, or the command exits 1.

Must NOT import torch, transformers or reference_engine; it is not re-exported by
``rsp_bench.records`` (it imports ``rsp_bench.baselines``, which imports the records package).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Mapping

from rsp_bench.baselines import metric_scope
from rsp_bench.records.files import load_record


@dataclass
class Comparison:
    """What two records' model-scope figures have in common and where they differ."""

    same: int = 0
    differ: list[tuple[str, str, Any, Any]] = field(default_factory=list)  # (config, metric, a, b)
    only_a: list[str] = field(default_factory=list)  # "config metric"
    only_b: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differ


def _figures(record: Mapping[str, Any]) -> dict[tuple[str, str], tuple[float, Any]]:
    out: dict[tuple[str, str], tuple[float, Any]] = {}
    for cid, conf in record["configurations"].items():
        for name, m in conf["metrics"].items():
            if metric_scope(name) == "model":
                out[(cid, name)] = (float(m["value"]), m.get("n"))
    return out


def compare_records(a: Mapping[str, Any], b: Mapping[str, Any]) -> Comparison:
    """Exact comparison of the model-scope figures the two records share (value and n)."""
    fa, fb = _figures(a), _figures(b)
    out = Comparison()
    for key in sorted(fa.keys() & fb.keys()):
        (va, na), (vb, nb) = fa[key], fb[key]
        if va == vb and na == nb:  # record values are finite (validated when added)
            out.same += 1
        else:
            out.differ.append((key[0], key[1], (va, na), (vb, nb)))
    out.only_a = [f"{c} {m}" for c, m in sorted(fa.keys() - fb.keys())]
    out.only_b = [f"{c} {m}" for c, m in sorted(fb.keys() - fa.keys())]
    return out


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="RUN_A", help="a run record (JSON)")
    p.add_argument("b", metavar="RUN_B", help="another run record of the same weights")


def run(args: argparse.Namespace) -> int:
    from rsp_bench.errors import HarnessInputError

    a, b = load_record(args.a), load_record(args.b)
    if a["model"].get("weights_sha256") != b["model"].get("weights_sha256"):
        raise HarnessInputError(f"{args.a} and {args.b} were run on different weights: nothing to compare")
    c = compare_records(a, b)
    for cid, name, (va, na), (vb, nb) in c.differ:
        print(f"DIFFERS  {cid}  {name}: {va!r} (n={na}) vs {vb!r} (n={nb})")
    print(f"{c.same} model-scope figures equal, {len(c.differ)} differ; "
          f"{len(c.only_a)} only in {a['run_id']}, {len(c.only_b)} only in {b['run_id']}")
    if not args.quiet:
        for label, keys in ((a["run_id"], c.only_a), (b["run_id"], c.only_b)):
            if keys:
                print(f"only in {label}: " + ", ".join(keys[:12]) + (" ..." if len(keys) > 12 else ""))
    return 0 if c.ok else 1
