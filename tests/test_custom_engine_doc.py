"""docs/custom-engine.md, run as written (registration): its example engine registered each of
the three ways the page shows, and an unsupported mode refused before any test runs. The code
comes from the page's own code blocks, so the page cannot drift from what works.
tests/test_custom_engine_doc_end_to_end.py (slow) runs the rest of the page on the embedded model: baselined,
gated green on an unchanged rerun, red once made worse.

Must not load a model.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rsp_bench.doc_examples import code_blocks

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "custom-engine.md"


def _blocks() -> dict[str, str]:
    return code_blocks(DOC)


@pytest.fixture
def pytester(pytester: pytest.Pytester) -> pytest.Pytester:
    original = pytester.runpytest

    def run(*args, **kwargs):
        return original("-p", "no:hypothesispytest", "-p", "no:cacheprovider", *args, **kwargs)

    pytester.runpytest = run  # type: ignore[method-assign]
    return pytester


def test_the_page_names_its_files() -> None:
    assert {"my_engine_adapter.py", "conftest.py", "your"} <= set(_blocks()), sorted(_blocks())


def test_registering_with_dash_p_and_with_an_entry_point(pytester: pytest.Pytester, monkeypatch) -> None:
    blocks = _blocks()
    pytester.makepyfile(my_engine_adapter=blocks["my_engine_adapter.py"])
    pytester.syspathinsert()
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    # Without registration the option is refused, naming the engine.
    result = pytester.runpytest("--rsp-engine", "skip-odd", "--rsp-mode", "static")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--rsp-engine: unknown engine 'skip-odd'*"])
    # 2. -p my_engine_adapter
    result = pytester.runpytest("-p", "my_engine_adapter", "--rsp-engine", "skip-odd", "--rsp-mode", "static")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result = pytester.runpytest("-p", "my_engine_adapter", "--rsp-engine", "skip-odd", "--rsp-mode", "lossy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--rsp-mode: engine 'skip-odd' does not support mode 'lossy' (it supports off, static)*"])
    # 3. the entry point of an installed distribution, declared as the page's pyproject says
    from rsp_bench.engines import base

    monkeypatch.setattr(base, "_REGISTRY", {k: v for k, v in base._REGISTRY.items() if k != "skip-odd"})
    toml = blocks["your"]
    [(name, value)] = re.findall(r'^(\S+)\s*=\s*"([^"]+)"', toml, flags=re.M)
    dist = pytester.path / "skip_odd_engine-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: skip-odd-engine\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[rsp_bench.engines]\n{name} = {value}\n")
    result = pytester.runpytest("--rsp-engine", "skip-odd", "--rsp-mode", "static")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
