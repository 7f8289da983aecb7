"""One side of an A/B run: a worker process that loads an engine from *its own* source tree and
answers JSON-lines requests on stdin/stdout.

Run by the runner as ``python <this file> --root SRC --engine NAME ...``: it puts SRC first on
``sys.path`` (and drops this file's own folder), so ``reference_engine`` and ``rsp_bench.engines``
come from SRC: the base's worktree or the head's checkout. The native decode kernel is then
compiled from SRC's C source on first use, cached by its hash as always.

Why a subprocess with JSON lines rather than execnet: the base is any old commit, whose
``rsp_bench`` has no ``ab`` package and may differ in everything but the adapter protocol; this
file is shipped by path and needs nothing from SRC but ``reference_engine`` and the engine
registry. One request, one reply line, stderr kept in a log for the error message: nothing to
bootstrap, nothing version-coupled between the two sides, and the worker can be killed by its
pid. Bulk data (logits, [T, V] float32) never goes through the pipe: it is written to .npy files
in a folder the runner owns, and the reply names them.

Protocol: request ``{"op": "hello" | "generate" | "teacher_forced" | "time" | "quit", ...}``;
reply ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.

Must NOT import anything at module level but the standard library, and never ``rsp_bench.ab``
(the source tree it serves may not have it). The protocol's stdout is a private copy of fd 1;
fd 1 itself is pointed at stderr so a library's stray print cannot corrupt a reply.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_TIMING_KEYS = ("prefill_time_s", "decode_step_times_s")


def _isolate(root: Path) -> None:
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != here]
    sys.path.insert(0, str(root))


class Worker:
    def __init__(self, root: Path, engine_name: str, model: str | None, mode: str, sensitivity: float | None,
                 threads: int, url: str | None) -> None:
        import torch

        torch.set_num_threads(threads)
        torch.set_grad_enabled(False)
        import reference_engine
        from reference_engine import Engine
        from rsp_bench.engines import ConfigSpec, get_engine
        from rsp_bench.engines.configs import pruning_config

        self.root = root
        # Calibration only where a router or a static plan needs it (off needs none; load is faster).
        self.engine = Engine.load(model, calibrate=mode not in ("off", "lossless"))
        kwargs: dict[str, Any] = {"engine": self.engine, "model": model}
        if url is not None:
            kwargs["engine_url"] = url
        self.adapter = get_engine(engine_name, **kwargs)
        self.spec = ConfigSpec(f"{engine_name}/{mode}", engine_name, mode, sensitivity, {},
                               pruning_config(mode, sensitivity))
        self.modules = {"reference_engine": str(Path(reference_engine.__file__).resolve()),
                        "rsp_bench": str(Path(sys.modules["rsp_bench"].__file__).resolve())}

    # ---- ops ----
    def hello(self) -> dict[str, Any]:
        lib = None
        kernel = getattr(self.engine, "decode_kernel", None)
        if kernel == "native":
            from reference_engine import decode_native

            loaded = getattr(decode_native, "_LIB", None)  # a ctypes.CDLL: its _name is the .so path
            lib = getattr(loaded, "_name", None)
        return {"root": str(self.root), "modules": self.modules, "kernel": kernel, "native_library": lib,
                "pid": os.getpid(), "adapter": getattr(self.adapter, "name", None),
                "batch_size": int(getattr(self.adapter, "batch_size", 1))}

    def _save(self, logits: Any, path: str) -> str:
        import numpy as np
        import torch

        arr = logits.detach().to(torch.float32).cpu().numpy() if isinstance(logits, torch.Tensor) else np.asarray(logits, np.float32)
        np.save(path, arr)
        return path

    def generate(self, prompts: list[str], max_new_tokens: int, logits_dir: str | None = None) -> dict[str, Any]:
        rows = []
        for i, prompt in enumerate(prompts):  # batch 1: quality is measured per request
            out = self.adapter.generate([prompt], max_new_tokens, self.spec)[0]
            row: dict[str, Any] = {"token_ids": [int(t) for t in out.token_ids],
                                   "prompt_ids": [int(t) for t in out.prompt_ids], "text": out.text}
            if logits_dir is not None:
                logits = out.logits
                if logits is None:  # this adapter or mode gives none from generate: teacher-force its own output
                    logits, _ = self.adapter.teacher_forced_logits(out.prompt_ids, out.token_ids, self.spec)
                row["logits"] = self._save(logits, os.path.join(logits_dir, f"gen_{i}.npy"))
            rows.append(row)
        return {"outputs": rows}

    def teacher_forced(self, prompt_ids: list[int], continuation_ids: list[int], path: str) -> dict[str, Any]:
        logits, _ = self.adapter.teacher_forced_logits(list(prompt_ids), list(continuation_ids), self.spec)
        return {"logits": self._save(logits, path)}

    def time(self, prompts: list[str], max_new_tokens: int) -> dict[str, Any]:
        """One timed call of ``len(prompts)`` prompts as one batch: the engine's own prefill and
        step timings where its stats carry them, else timed from outside (as rsp_bench.speed.calls
        does: TTFT = a max_new_tokens=1 call, each step = (call - TTFT) / (tokens - 1))."""
        t0 = time.perf_counter()
        outs = self.adapter.generate(list(prompts), max_new_tokens, self.spec)
        wall = time.perf_counter() - t0
        stats = outs[0].stats
        tokens = [len(o.token_ids) for o in outs]
        if all(k in stats for k in _TIMING_KEYS):
            return {"ttft_s": float(stats["prefill_time_s"]),
                    "step_times_s": [float(t) for t in stats["decode_step_times_s"]],
                    "batch": len(prompts), "tokens": tokens, "wall_s": wall, "method": "engine stats"}
        t1 = time.perf_counter()
        self.adapter.generate(list(prompts), 1, self.spec)
        ttft = time.perf_counter() - t1
        steps = max(tokens) - 1
        step = (wall - ttft) / steps if steps > 0 else 0.0
        return {"ttft_s": ttft, "step_times_s": [step] * steps if step > 0 else [], "batch": len(prompts),
                "tokens": tokens, "wall_s": wall, "method": "external"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--engine", default="reference")
    ap.add_argument("--model", default=None)
    ap.add_argument("--mode", default="off")
    ap.add_argument("--sensitivity", type=float, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--url", default=None)
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # stray prints of any library go to stderr, not into the protocol

    def reply(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    _isolate(root)
    os.chdir(root)  # fixtures and relative paths resolve inside this side's own tree
    try:
        worker = Worker(root, args.engine, args.model, args.mode, args.sensitivity, args.threads, args.url)
    except Exception as exc:  # the runner shows this line, the traceback is in the worker's log
        traceback.print_exc()
        reply({"ok": False, "error": f"worker for {root} could not load engine {args.engine!r}: "
                                     f"{type(exc).__name__}: {exc}"})
        return 1
    reply({"ok": True, "ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.pop("op")
            if op == "quit":
                reply({"ok": True})
                return 0
            if op not in ("hello", "generate", "teacher_forced", "time"):
                raise ValueError(f"unknown op {op!r}")
            reply({"ok": True, **getattr(worker, op)(**req)})
        except Exception as exc:
            traceback.print_exc()
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
