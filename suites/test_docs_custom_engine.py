"""docs/custom-engine.md, run as written on the embedded model (marker ``docs``): the example
engine from the page's own code blocks, registered by the page's conftest, is baselined, passes
an unchanged rerun under --rsp-ci, and fails the gate once made worse the way the page says
(``max_skipped = 2``); the reference engine's baseline stays byte for byte as it was.

The inner sessions run the real suites/test_equivalence.py with its budgets in a temporary
folder, each in its own process (an in-process nested session re-registers torch operators and
breaks every later model load of the outer session, so the suites would depend on their order), at reduced sizes (--rsp-max-new-tokens), with their own results and baselines folders:
nothing here writes to the project's results/. Skipped under another --rsp-engine (it tests the
page, not that engine).

Must NOT import torch or the engine (the inner sessions load it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rsp_bench.doc_examples import code_blocks
from rsp_bench.records import load_record

pytestmark = [pytest.mark.docs, pytest.mark.reference_only]
pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "custom-engine.md"
TOKENS = "8"


def test_example_engine_is_baselined_gated_and_caught_when_worse(pytester: pytest.Pytester, rsp_options) -> None:
    blocks = code_blocks(DOC)
    adapter_code = blocks["my_engine_adapter.py"]
    assert "max_skipped = 1" in adapter_code, "the page's example changed: update this test with it"
    pytester.makepyfile(my_engine_adapter=adapter_code)
    pytester.makeconftest(blocks["conftest.py"])
    pytester.syspathinsert()
    # Under another module name: the outer session has imported suites/test_equivalence.py as
    # "test_equivalence" already, and pytest refuses a second file of that name.
    shutil.copy(REPO / "suites" / "test_equivalence.py", pytester.path / "test_doc_equivalence.py")
    shutil.copy(REPO / "suites" / "budgets.toml", pytester.path / "budgets.toml")
    baselines = pytester.path / "out" / "baselines"
    baselines.mkdir(parents=True)
    reference = Path(shutil.copy(next((REPO / "results" / "baselines").glob("*__reference.json")), baselines))
    before = reference.read_bytes()
    args = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "test_doc_equivalence.py", "-k", "test_equivalence",
            "--rsp-engine", "skip-odd", "--rsp-mode", "static", "--rsp-quick", "--rsp-results", "out",
            "--rsp-baselines", "out/baselines", "--rsp-max-new-tokens", TOKENS]
    if rsp_options.model:
        args += ["--rsp-model", str(rsp_options.model)]

    result = pytester.runpytest_subprocess(*args, "--rsp-update-baseline", "--rsp-reason", "docs example")
    assert result.ret == 0, result.stdout.str()[-3000:]
    [quality] = baselines.glob("*__skip-odd.json")
    record = load_record(quality)
    assert set(record["configurations"]) == {"reference/off", "skip-odd/off", "skip-odd/static/s=0.50"}
    assert record["extra"]["comparators"] == ["reference/off"]
    assert reference.read_bytes() == before

    result = pytester.runpytest_subprocess(*args, "--rsp-ci")  # unchanged rerun: the page's expected verdict
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*rsp-bench gate PASSED*"])

    pytester.makepyfile(my_engine_adapter=adapter_code.replace("max_skipped = 1", "max_skipped = 2"))
    result = pytester.runpytest_subprocess(*args, "--rsp-ci")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*skip-odd/static/s=0.50*top1_agreement*REGRESSED*", "*rsp-bench gate FAILED*"])
    assert reference.read_bytes() == before
