"""Tests of rsp_bench.datasets and the fixtures it loads.

Checks the counts the suites rely on, that the structured generator is deterministic and
the committed file is its output, that every gold field can be read back from its text,
and that bad paths and corrupt files raise HarnessInputError naming the path.

Must NOT import torch, transformers or the engine.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import re
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from rsp_bench import datasets
from rsp_bench.datasets import (
    SquadItem,
    fixtures_dir,
    load_prompts,
    load_squad,
    load_structured,
    quick_subset,
    squad_prompt,
    structured_prompt,
)
from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics import field_prf, normalize_field_value

GENERATOR = Path(__file__).resolve().parent.parent / "fixtures" / "structured" / "generate.py"


def _generator_module():
    spec = importlib.util.spec_from_file_location("structured_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------
# SQuAD
# ---------------------------------------------------------------------------------------

def test_load_squad_answerable_only_in_file_order():
    items = load_squad()
    assert len(items) >= 400
    assert len({i.id for i in items}) == len(items)
    assert {i.title for i in items} >= {"Normans", "Computational_complexity_theory"}
    raw = json.loads((fixtures_dir() / "squad" / "squad-v2-dev-subset.json").read_text(encoding="utf-8"))
    first = next(qa for a in raw["data"] for p in a["paragraphs"] for qa in p["qas"] if not qa["is_impossible"])
    assert items[0].id == first["id"]
    for item in items:
        assert item.answers and len(set(item.answers)) == len(item.answers)
        assert all(answer in item.context for answer in item.answers)  # SQuAD answers are spans
    assert [i.id for i in load_squad(limit=5)] == [i.id for i in items[:5]]


def test_squad_copy_keeps_attribution():
    readme = (fixtures_dir() / "squad" / "README.md").read_text(encoding="utf-8")
    for needle in ("Rajpurkar, Jia and Liang", "ACL 2018", "CC BY-SA 4.0",
                   "https://rajpurkar.github.io/SQuAD-explorer/"):
        assert needle in readme


# ---------------------------------------------------------------------------------------
# Structured extraction set
# ---------------------------------------------------------------------------------------

def test_load_structured_counts_and_uniform_keys():
    docs = load_structured()
    assert len(docs) >= 200
    kinds = {d.kind for d in docs}
    assert len(kinds) >= 4 and "earnings" in kinds
    for kind in kinds:
        keys = {tuple(d.fields) for d in docs if d.kind == kind}
        assert len(keys) == 1, f"{kind} documents disagree on their gold keys: {keys}"
    assert len(load_structured(limit=3)) == 3


def test_generator_is_deterministic_and_file_is_current(tmp_path):
    module = _generator_module()
    assert module.generate() == module.generate()
    assert module.generate(seed=1) != module.generate()
    result = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    stale = tmp_path / "documents.jsonl"
    stale.write_text("{}\n", encoding="utf-8")
    result = subprocess.run([sys.executable, str(GENERATOR), "--check", "--out", str(stale)],
                            capture_output=True, text=True)
    assert result.returncode == 1


def _pct(part: float, whole: float) -> float:
    return float((Decimal(repr(part)) * 100 / Decimal(repr(whole))).quantize(Decimal("0.1"), ROUND_HALF_UP))


_MONEY_M = re.compile(r"\$(\d+(?:\.\d+)?)\s?(B|M|billion|million)\b")


def test_earnings_gold_is_consistent_with_text():
    docs = [d for d in load_structured() if d.kind == "earnings"]
    assert docs
    for doc in docs:
        f = doc.fields
        # Every ratio is printed as it is stored (a decline printed without its sign).
        for key in ("revenue_growth_qoq", "gross_margin_pct", "operating_expense_ratio"):
            assert f"{abs(f[key]):.1f}%" in doc.text, (doc.id, key)
        # ...and follows from the printed amounts, in $M.
        amounts = [float(v) * (1000 if u in ("B", "billion") else 1) for v, u in _MONEY_M.findall(doc.text)]
        pairs = [(a, b) for a in amounts for b in amounts if a != b]
        assert any(_pct(a - b, b) == f["revenue_growth_qoq"] for a, b in pairs), doc.id
        assert any(_pct(a, b) == f["gross_margin_pct"] for a, b in pairs), doc.id
        assert any(_pct(a, b) == f["operating_expense_ratio"] for a, b in pairs), doc.id
        declined = re.search(r"\b(down|decline|fell|contracted)\b", doc.text) is not None
        assert declined == (f["revenue_growth_qoq"] < 0), doc.id


_NUMBER_SPAN = re.compile(r"(?:USD |[$€£])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:K| kg| kilograms)?")
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]


def _date_renderings(iso: str) -> list[str]:
    d = datetime.date.fromisoformat(iso)
    month = _MONTHS[d.month - 1]
    return [iso, f"{month} {d.day}, {d.year}", f"{d.day} {month} {d.year}", f"{month[:3]} {d.day}, {d.year}"]


def test_every_gold_field_can_be_read_from_its_text():
    for doc in load_structured():
        if doc.kind == "earnings":
            continue  # covered, sign included, by the test above
        for key, gold in doc.fields.items():
            if isinstance(gold, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", gold):
                assert any(r in doc.text for r in _date_renderings(gold)), (doc.id, key)
            elif isinstance(gold, str):
                assert gold in doc.text, (doc.id, key)
            else:
                spans = _NUMBER_SPAN.findall(doc.text)
                assert any(field_prf({key: s}, {key: gold}).tp == 1 for s in spans), (doc.id, key, spans)
        # The gold scores perfectly against itself under the metric's conventions.
        assert field_prf(doc.fields, doc.fields).fn == 0, doc.id


def test_gold_values_are_already_canonical_numbers_or_text():
    for doc in load_structured():
        for key, gold in doc.fields.items():
            assert isinstance(gold, (int, float, str)) and not isinstance(gold, bool), (doc.id, key)
            if isinstance(gold, str) and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", gold):
                # A text field must not read as a number, or scoring would compare floats.
                assert isinstance(normalize_field_value(gold), str), (doc.id, key, gold)


# ---------------------------------------------------------------------------------------
# Prompts, subsets and prompt builders
# ---------------------------------------------------------------------------------------

def test_load_prompts():
    prompts = load_prompts()
    assert len(prompts) >= 40
    categories = {p.category for p in prompts}
    assert {"chat", "code", "arithmetic", "summarisation", "extraction", "multilingual"} <= categories
    assert len({p.id for p in prompts}) == len(prompts)
    assert sum(not p.text.isascii() for p in prompts if p.category == "multilingual") >= 5


def test_quick_subset_is_seeded_and_spans_kinds():
    docs = load_structured()
    subset = quick_subset(docs, 20)
    assert subset == quick_subset(docs, 20)
    assert subset != quick_subset(docs, 20, seed=1)
    assert len({d.kind for d in subset}) >= 4
    assert len(quick_subset(docs[:3], 10)) == 3
    with pytest.raises(HarnessInputError, match="n must be"):
        quick_subset(docs, -1)


def test_prompt_builders():
    item = SquadItem("q1", "T", "Paris is the capital of France.", "What is the capital?", ["Paris"])
    prompt = squad_prompt(item)
    assert "short span copied from the passage" in prompt
    assert item.context in prompt and item.question in prompt
    doc = load_structured()[0]
    prompt = structured_prompt(doc)
    assert "JSON" in prompt and doc.text in prompt
    for key in doc.fields:
        assert f"- {key}" in prompt


# ---------------------------------------------------------------------------------------
# Bad paths and corrupt files
# ---------------------------------------------------------------------------------------

def test_missing_files_name_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    for loader in (load_squad, load_structured, load_prompts):
        with pytest.raises(HarnessInputError, match=re.escape(str(missing))):
            loader(missing)


def test_corrupt_files_name_the_path_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "category": "chat", "text": "hi"}\n{not json\n', encoding="utf-8")
    with pytest.raises(HarnessInputError, match=re.escape(f"{bad}:2")):
        load_prompts(bad)
    bad.write_text('{"id": "a", "kind": "x", "text": "t"}\n', encoding="utf-8")
    with pytest.raises(HarnessInputError, match="'fields'"):
        load_structured(bad)
    bad.write_text('{"id": "a", "category": "c", "text": "t"}\n' * 2, encoding="utf-8")
    with pytest.raises(HarnessInputError, match="repeats the id 'a'"):
        load_prompts(bad)
    squad = tmp_path / "squad.json"
    squad.write_text('{"version": "v2.0"}', encoding="utf-8")
    with pytest.raises(HarnessInputError, match=re.escape(str(squad))):
        load_squad(squad)
    with pytest.raises(HarnessInputError, match="limit"):
        load_squad(limit=-1)


def test_fixtures_dir_override(tmp_path, monkeypatch):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "equivalence.jsonl").write_text(
        '{"id": "p", "category": "chat", "text": "hello"}\n', encoding="utf-8"
    )
    monkeypatch.setenv(datasets.FIXTURES_ENV, str(tmp_path))
    assert fixtures_dir() == tmp_path
    assert [p.id for p in load_prompts()] == ["p"]
    monkeypatch.setenv(datasets.FIXTURES_ENV, str(tmp_path / "absent"))
    with pytest.raises(HarnessInputError, match="absent"):
        fixtures_dir()
