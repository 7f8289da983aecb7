"""The one place rsp-bench writes files: atomic writes of text, bytes and JSON.

Every results file (run records, baselines, leaderboard tables and plots) goes through
this module so that a crash, a full disk or a CI job killed mid-write never leaves a
half-written file where a reader expects a whole one (DESIGN.md section 6). The recipe
is the usual one: write a temporary file in the *same directory* (``os.replace`` is
only atomic within one filesystem), flush and fsync it, rename it over the target,
then fsync the directory so the rename itself survives a power cut.

Imitates pytest-benchmark's split between storage and everything else: callers build
the bytes, this module only puts them on disk.

Must NOT import torch, transformers, reference_engine or any other rsp_bench module
except ``rsp_bench.errors``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rsp_bench.errors import HarnessInputError

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json", "dumps_json"]

# Suffix of in-flight temporary files. Readers that glob a results folder for "*.json"
# never see them, and a leftover one after a SIGKILL is recognisable for what it is.
TEMP_SUFFIX = ".tmp"


def _current_umask() -> int:
    # os.umask can only be read by setting it; set it back at once.
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    # Without this the rename may be lost on power failure on some filesystems.
    # Not every platform can open a directory (Windows cannot); durability there is
    # best effort, atomicity is unaffected.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; return the path written.

    Readers see either the previous file or the complete new one, never a mixture.
    Parent directories are created. On any failure the temporary file is removed and
    the exception propagates; the previous file is untouched.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"atomic_write_bytes needs bytes, got {type(data).__name__} for {path}")
    target = Path(path)
    if target.name in ("", ".", ".."):
        raise HarnessInputError(f"cannot write a file at {str(path)!r}: it names a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates the file 0600; results are meant to be shared and committed,
        # so give it the permissions an ordinary open() would have.
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, target)
    except BaseException:
        # BaseException: a KeyboardInterrupt mid-write must not leave the temp behind either.
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(target.parent)
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (no newline translation, so bytes are reproducible)."""
    if not isinstance(text, str):
        raise TypeError(f"atomic_write_text needs str, got {type(text).__name__} for {path}")
    return atomic_write_bytes(path, text.encode(encoding))


def dumps_json(obj: Any) -> str:
    """Serialize ``obj`` the way every rsp-bench JSON file is written.

    Sorted keys, two-space indent and a trailing newline keep files diff-friendly and
    byte-reproducible. NaN and infinity are refused because they are not JSON and
    other tools (jq, browsers) reject them.
    """
    try:
        return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    except ValueError as exc:
        raise HarnessInputError(f"cannot write JSON: {exc} (NaN or infinity are not valid JSON)") from exc
    except TypeError as exc:
        raise HarnessInputError(f"cannot write JSON: {exc}") from exc


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (sorted keys, indent 2, trailing newline)."""
    try:
        text = dumps_json(obj)
    except HarnessInputError as exc:
        raise HarnessInputError(f"{path}: {exc}") from exc
    return atomic_write_text(path, text)
