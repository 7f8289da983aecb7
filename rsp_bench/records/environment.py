"""Where and with what a run ran: machine description and fingerprint, library versions, git commit.

Must NOT import torch, transformers or reference_engine: library versions are read from
package metadata, the GPU name from ``nvidia-smi`` (or passed in by the caller), so that
the gate and leaderboard work on a machine without torch. Must not import the other
``rsp_bench.records`` modules nor any rsp_bench module (``rsp_bench`` itself is read
lazily, for its version).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
from typing import Any

__all__ = ["machine_info", "machine_fingerprint", "versions", "git_commit", "code_digest", "ENGINE_CODE_PACKAGES"]


# Sentinel for "detect it yourself" where None is a legitimate value (no GPU, no git).
_AUTO: Any = object()


def _cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name, with its family, model and widest vector unit where /proc/cpuinfo
    gives them: cloud CPUs name themselves "AMD EPYC" across generations, and two runners of one
    name measured 30% apart (an AVX-512 EPYC and an AVX2-only one, whose native kernels take
    different paths), so the name alone would give both one speed baseline."""
    name, family, model, flags = "", "", "", set()
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    if name:
                        break  # the first processor's block says it for all
                    continue
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key in ("model name", "Hardware", "Processor") and value and not name:
                    name = value
                elif key == "cpu family":
                    family = value
                elif key == "model":
                    model = value
                elif key == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    if not name:
        return platform.processor() or platform.machine() or "unknown"
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else ""
    detail = ", ".join(x for x in (f"family {family}, model {model}" if family and model else "", isa) if x)
    return f"{name} ({detail})" if detail else name


def _usable_cores() -> int:
    # The cores this process may run on (a container or taskset limit), which is what a
    # benchmark actually gets, rather than the host's count.
    if hasattr(os, "sched_getaffinity"):
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def _memory_gb() -> float:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0.0
    return round(total / 1e9, 1)


def _gpu_name() -> str | None:
    # nvidia-smi rather than torch.cuda: this module must not import torch, and the
    # fingerprint must be the same whether or not torch is installed.
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not names:
        return None
    if len(set(names)) == 1 and len(names) > 1:
        return f"{len(names)}x {names[0]}"
    return " + ".join(names)


# The packages whose sources decide what an in-process engine computes and how fast: the
# reference engine (Python and the native kernel's C), and the harness's adapters and timers.
ENGINE_CODE_PACKAGES = ("reference_engine", "rsp_bench.engines", "rsp_bench.speed")
_CODE_SUFFIXES = (".py", ".c", ".h")


def code_digest(packages: tuple[str, ...] = ENGINE_CODE_PACKAGES) -> str:
    """A 16-hex digest of the named packages' source files (.py, .c, .h), found without
    importing them: two records with the same digest ran the same engine code. Packages that
    are not installed count as absent (their name is hashed with nothing after it)."""
    import importlib.util
    from pathlib import Path

    digest = hashlib.sha256()
    for package in packages:
        digest.update(package.encode())
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        for location in locations:
            root = Path(location)
            for path in sorted(q for q in root.rglob("*") if q.suffix in _CODE_SUFFIXES and q.is_file()
                               and "__pycache__" not in q.parts):
                digest.update(path.relative_to(root).as_posix().encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def machine_fingerprint(cpu: str, cores: int, memory_gb: float, gpu: str | None) -> str:
    """Short stable hash identifying a *kind* of machine (12 hex characters).

    Hostname and OS patch level are left out on purpose: CI runners of one kind get
    fresh hostnames every job and must share one baseline. Memory is rounded to the
    nearest 4 GB because identical machines report slightly different totals (firmware
    and kernel reservations).
    """
    memory_bucket = max(4, 4 * round(float(memory_gb) / 4))
    key = f"cpu={cpu.strip()}|cores={int(cores)}|memory_gb~{memory_bucket}|gpu={(gpu or 'none').strip()}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def machine_info(gpu: str | None = _AUTO) -> dict[str, Any]:
    """Describe this machine for the record's ``machine`` field.

    ``gpu`` overrides detection (the plugin may know the CUDA device it actually used);
    pass ``None`` to record a CPU-only run on a machine that has a GPU.
    """
    cpu = _cpu_model()
    cores = _usable_cores()
    memory_gb = _memory_gb()
    gpu_name = _gpu_name() if gpu is _AUTO else gpu
    return {
        "fingerprint": machine_fingerprint(cpu, cores, memory_gb, gpu_name),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": cores,
        "memory_gb": memory_gb,
        "gpu": gpu_name,
    }


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Library versions for the record, read from package metadata without importing them."""
    rsp = _dist_version("rsp-bench")
    if rsp is None:
        # Running from a checkout that is not pip-installed (the unit tests do).
        import rsp_bench

        rsp = getattr(rsp_bench, "__version__", None) or "0+unknown"
    return {
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "transformers": _dist_version("transformers"),
        "rsp_bench": rsp,
    }


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The commit checked out in ``cwd`` (default: the current directory), or None.

    None when git is missing or ``cwd`` is not inside a repository; a record must still
    be writable from an sdist or a copied folder.
    """
    exe = shutil.which("git")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "rev-parse", "--verify", "HEAD"],
            cwd=os.fspath(cwd) if cwd is not None else None,
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not re.fullmatch(r"[0-9a-f]{7,64}", commit):
        return None
    return commit
