"""The ``ci`` and ``dev`` hypothesis profiles the adversarial suites run under.

Must NOT import torch or the engine (``reference_engine``), nor the other
``rsp_bench.adversarial`` modules.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

__all__ = ["CI_MAX_EXAMPLES", "DEV_MAX_EXAMPLES", "DEFAULT_DATABASE_DIR", "register_profiles", "load_profile"]


#: Examples per test in the ``ci`` profile. The adversarial suite runs one property per
#: class (14 degrade classes + 2 normal), so one property costs 16 x 40 = 640 examples.
CI_MAX_EXAMPLES = 40
#: Examples per test in the ``dev`` profile: 16 x 400 = 6400 per property.
DEV_MAX_EXAMPLES = 400
#: Where failing examples are kept (relative paths resolve against the working directory
#: at registration time, normally the repository root).
DEFAULT_DATABASE_DIR = os.path.join("results", "hypothesis")


def register_profiles(database_dir: str | os.PathLike[str] = DEFAULT_DATABASE_DIR) -> None:
    """Register the ``ci`` and ``dev`` hypothesis profiles (load one with ``load_profile``).

    ``ci``: ``CI_MAX_EXAMPLES`` per test, derandomized (the same examples every run, so a
    run is repeatable), no deadline (model calls vary in time), ``too_slow`` suppressed,
    blobs printed. ``dev``: ``DEV_MAX_EXAMPLES`` per test, random, no deadline.

    Both keep failing examples in a ``DirectoryBasedExampleDatabase`` at ``database_dir`` so
    they replay first on the next run. hypothesis rejects ``derandomize=True`` together with
    ``database=`` in one call (derandomized runs regenerate their failures anyway), so ``ci``
    sets the database on a child of the derandomized settings; the saved failures then also
    replay when the test or its strategy changes and the derandomized seed moves.
    """
    db = DirectoryBasedExampleDatabase(str(Path(database_dir).resolve()))
    ci_base = settings(
        derandomize=True,
        deadline=None,
        max_examples=CI_MAX_EXAMPLES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
    settings.register_profile("ci", settings(ci_base, database=db))
    settings.register_profile(
        "dev",
        settings(
            max_examples=DEV_MAX_EXAMPLES,
            # Explicit: a bare settings() inherits the loaded default, which hypothesis
            # switches to its derandomized built-in "ci" profile when $CI is set.
            derandomize=False,
            deadline=None,
            database=db,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def load_profile(name: str | None = None, database_dir: str | os.PathLike[str] = DEFAULT_DATABASE_DIR) -> str:
    """Register the profiles and load ``name`` (default: ``$RSP_BENCH_HYPOTHESIS_PROFILE`` or ``ci``).

    Returns the loaded name. Raises ValueError naming an unknown profile.
    """
    chosen = name or os.environ.get("RSP_BENCH_HYPOTHESIS_PROFILE") or "ci"
    if chosen not in ("ci", "dev"):
        raise ValueError(f"unknown hypothesis profile {chosen!r}: use 'ci' or 'dev'")
    register_profiles(database_dir)
    settings.load_profile(chosen)
    return chosen
