"""What the ``rsp-bench`` command line checks before any slow work: numbers and choices as
argparse types that name the flag as typed, files named and files to be written, the model's
blocks and context read from its config or GGUF header without loading it.

Bad input raises ``UserError`` (a ``HarnessInputError``), which ``rsp_bench.cli.main`` prints as one
line and exit 2. Must not import torch, the engine (except its light model-path helper, lazily) or
any command's module: ``rsp-bench --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import struct
from pathlib import Path
from typing import Callable, Sequence

from .errors import HarnessInputError


class UserError(HarnessInputError):
    """Bad input found by the CLI itself; the message names the flag as the user typed it."""


def number(flag: str, lo: float | None = None, hi: float | None = None, *,
            integer: bool = False) -> Callable[[str], float]:
    """An argparse type: a number (an integer if asked) in [lo, hi], named by its flag on error."""
    kind = "an integer" if integer else "a number"
    if lo is not None and hi is not None:
        allowed = f"{kind} in [{lo:g}, {hi:g}]" if not integer else f"{kind} from {lo} to {hi}"
    elif lo is not None:
        allowed = f"{kind} >= {lo:g}" if not integer else f"{kind} >= {lo}"
    else:
        allowed = kind

    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            value = None
        if (value is None or (not integer and not math.isfinite(value))
                or (lo is not None and value < lo) or (hi is not None and value > hi)):
            raise argparse.ArgumentTypeError(f"{flag} must be {allowed}, got {text!r}")
        return value
    return parse


def choice(flag: str, allowed: Sequence[str], upper: bool = False) -> Callable[[str], str]:
    """An argparse type: one of ``allowed`` (case-insensitive), named by its flag on error."""
    def parse(text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in allowed:
            raise argparse.ArgumentTypeError(f"{flag} must be one of {', '.join(allowed)}, got {text!r}")
        return value
    return parse


def blacklist_arg(text: str) -> tuple[int, ...]:
    """``--blacklist 0,29``: block indices never bypassed; an empty string means none."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not re.fullmatch(r"\d+", part):
            raise argparse.ArgumentTypeError(
                f"--blacklist must be comma-separated block indices (integers >= 0), got {part!r} in {text!r}")
        out.append(int(part))
    return tuple(out)


def check_model_path(model: str | None) -> None:
    """--model names a path that exists (the loader says more about one that exists but is wrong)."""
    if model is not None and not Path(model).expanduser().exists():
        raise UserError(f"--model {model!r} does not exist (give a local Llama-family model folder "
                         "or .gguf file, or leave --model out for the embedded SmolLM2-135M-Instruct)")


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_shape(path: Path) -> tuple[int, int] | None:
    """(blocks, context) from a GGUF file's metadata header, reading only as far as needed.

    ``gguf.GGUFReader`` maps every tensor first (seconds, here 27 s under load); the two keys
    sit near the start of the key-value section, so this stops as soon as both are read."""
    with open(path, "rb") as f:
        def unpack(fmt: str):
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) != size:
                raise EOFError
            return struct.unpack(fmt, data)[0]

        def text() -> str:
            return f.read(unpack("<Q")).decode("utf-8", "replace")

        def skip(vtype: int) -> object:
            if vtype in _GGUF_SCALARS:
                return unpack(_GGUF_SCALARS[vtype])
            if vtype == 8:
                return text()
            if vtype == 9:
                item, count = unpack("<I"), unpack("<Q")
                if item in _GGUF_SCALARS:
                    f.seek(count * struct.calcsize(_GGUF_SCALARS[item]), 1)
                else:
                    for _ in range(count):
                        skip(item)
                return None
            raise ValueError(vtype)

        if f.read(4) != b"GGUF" or unpack("<I") < 2:
            return None
        unpack("<Q")  # tensor count
        found: dict[str, int] = {}
        for _ in range(unpack("<Q")):
            key, value = text(), skip(unpack("<I"))
            for suffix in (".block_count", ".context_length"):
                if key.endswith(suffix) and isinstance(value, int):
                    found[suffix] = value
            if len(found) == 2:
                return found[".block_count"], found[".context_length"]
    return None


def model_shape(model: str | None) -> tuple[int, int] | None:
    """(blocks, context in tokens) of the model --model names, read from its config.json or GGUF
    header without loading it; None when that cannot be read cheaply (then the checks run after
    loading, with the same messages)."""
    try:
        if model is None:
            from reference_engine.model_loading import embedded_gguf_path

            return gguf_shape(embedded_gguf_path())
        path = Path(model).expanduser()
        if path.is_file():
            return gguf_shape(path) if path.suffix.lower() == ".gguf" else None
        cfg = json.loads((path / "config.json").read_text())
        return int(cfg["num_hidden_layers"]), int(cfg["max_position_embeddings"])
    except Exception:  # any surprise here only postpones the checks until the model is loaded
        return None


def check_blacklist(blacklist: tuple[int, ...] | None, n_layers: int) -> None:
    for i in blacklist or ():
        if i >= n_layers:
            raise UserError(f"--blacklist block {i} is out of range: the model has {n_layers} blocks "
                             f"(indices 0 to {n_layers - 1})")


def open_for_append(flag: str, path: str):
    """Open a file the user named, before any slow work, so a typo fails in a second."""
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{flag} {path!r} cannot be opened for writing: {exc.strerror or exc}") from None


# Files named on the command line of the lazily loaded commands, checked here so the error names
# the flag as typed whatever the command's own module says later.
_INPUT_FILES = {"gate": (("baseline", "--baseline"), ("run", "--run"), ("policy", "--policy")),
                "compare": (("a", "RUN_A"), ("b", "RUN_B")),
                "tune": (("from_table", "--from-table"),), "degradation": (("prompts", "--prompts"),),
                "language-damage": (("split", "--split"),),
                "lossless": (("prompts", "--prompts"),),
                "router-curve": (("held_out", "--held-out"), ("tune_from", "--tune-from")),
                "sensitivity-scale": (("prompts", "--prompts"),)}


# Files and folders the lazily loaded commands write, most of them only at the end of a long
# measurement: a path that cannot be written must fail now, not after the work is lost.
_OUTPUT_PATHS = {"router-curve": (("out", "--out", False),), "sensitivity-scale": (("out", "--out", False),),
                 "lossless": (("out", "--out", False),), "degradation": (("out", "--out", False),),
                 "language-damage": (("out", "--out", False),),
                 "loadtest": (("out", "--out", False),), "tune": (("out", "--out", True),),
                 "leaderboard": (("out", "--out", True),),
                 "ab": (("out", "--out", False), ("markdown", "--markdown", False), ("power_out", "--power-out", False),
                        ("logs", "--logs", True))}

# Counts and values those commands take as plain int/float (argparse lets 0, -1 and nan through):
# (dest, flag, lowest, highest, integer).
_NUMBERS = {"router-curve": (("threads", "--threads", 1, None, True), ("speed_prompts", "--speed-prompts", 1, None, True),
                             ("speed_rounds", "--speed-rounds", 1, None, True)),
            "loadtest": (("clients", "--clients", 1, None, True), ("requests", "--requests", 1, None, True),
                         ("max_tokens", "--max-tokens", 1, None, True), ("prompts", "--prompts", 1, None, True),
                         ("max_queue", "--max-queue", 1, None, True), ("max_batch", "--max-batch", 1, None, True),
                         ("batch_window_ms", "--batch-window-ms", 0, None, False), ("soak", "--soak", 1, None, False),
                         ("soak_requests", "--soak-requests", 1, None, True),
                         ("sensitivity", "--sensitivity", 0, 1, False),
                         ("hardware_watermark", "--hardware-watermark", 0, 1, False))}
_LOADTEST_MODES = ("off", "lossy", "lossless", "static")


def check_writable(flag: str, value: str, folder: bool) -> None:
    """``value`` can be written as a file (or created as a folder), found without writing it."""
    import tempfile

    path = Path(value).expanduser()
    if not folder and path.is_dir():
        raise UserError(f"{flag} {value!r} is a folder; give a file path")
    if folder and path.exists() and not path.is_dir():
        raise UserError(f"{flag} {value!r} is a file; give a folder")
    base = path if folder else path.parent
    while not base.exists():  # the command creates the missing folders; the nearest existing one must take them
        base = base.parent
    try:
        if not base.is_dir():
            raise NotADirectoryError(20, f"{base} is not a folder")
        # root passes os.access everywhere, so try it: an unnamed file that is gone when closed
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as exc:
        raise UserError(f"{flag} {value!r} cannot be written: {exc.strerror or exc} (in {base})") from None


def check_inputs(command: str, args: argparse.Namespace) -> None:
    for dest, flag in _INPUT_FILES.get(command, ()):
        value = getattr(args, dest, None)
        if value is None:
            continue
        value = str(value)  # some commands parse it to a Path, whose repr is not what the user typed
        if not Path(value).exists():
            raise UserError(f"{flag} {value!r} does not exist")
        if Path(value).is_dir():
            raise UserError(f"{flag} {value!r} is a folder; give a file")
    for dest, flag, lo, hi, integer in _NUMBERS.get(command, ()):
        value = getattr(args, dest, None)
        if value in (None, ""):  # not given ('' is loadtest's "send no watermark")
            continue
        try:
            number(flag, lo, hi, integer=integer)(str(value))
        except argparse.ArgumentTypeError as exc:
            raise UserError(str(exc)) from None
    if command == "loadtest" and args.mode not in _LOADTEST_MODES:
        raise UserError(f"--mode must be one of {', '.join(_LOADTEST_MODES)}, got {args.mode!r}")
    for dest, flag, folder in _OUTPUT_PATHS.get(command, ()):
        value = getattr(args, dest, None)
        if value is not None and str(value) != "-":  # --markdown with no PATH prints to stdout
            check_writable(flag, str(value), folder)
    if command == "baseline" and args.baseline_action == "show":
        # listing a folder that is not there would print "no baselines" and exit 0: a typo unnoticed
        flag, typed, where = (("--baselines", args.baselines, args.baselines) if args.baselines
                              else ("--results", args.results_typed, args.results))
        if not Path(where).is_dir():
            raise UserError(f"{flag} {typed!r} is not a folder")
    if command == "leaderboard":
        from .records import record_paths

        typed = getattr(args, "results_typed", args.results)
        if not Path(args.results).is_dir():
            raise UserError(f"--results {typed!r} does not exist (give the results folder that holds runs/)")
        if not record_paths(args.results):
            raise UserError(f"--results {typed!r}: no run records in {Path(args.results) / 'runs'} "
                             "(give the results folder that holds runs/, or run `rsp-bench run` first)")


def results_folder(text: str) -> str:
    """--results names the folder that holds runs/; a user pointing at runs/ itself means its parent."""
    path = Path(text)
    if path.name == "runs" and path.is_dir() and not (path / "runs").is_dir():
        return str(path.parent)
    return text
