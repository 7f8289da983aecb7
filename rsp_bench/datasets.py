"""Loaders for the fixtures the quality suites read, and the prompts built from them.

Three sets, all under the repository's fixtures/ folder (override with the environment
variable RSP_BENCH_FIXTURES):
  squad/squad-v2-dev-subset.json   SQuAD 2.0 dev subset; only answerable questions load
  structured/documents.jsonl       generated business documents with gold JSON fields
  prompts/equivalence.jsonl        hand-written prompts for output-equivalence tests

A missing or corrupt file raises HarnessInputError naming the path (and the line for
JSON lines). Must NOT import torch, transformers or the engine: loading data needs none.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, TypeVar

from rsp_bench.errors import HarnessInputError

__all__ = [
    "SquadItem", "StructuredDoc", "PromptItem", "fixtures_dir",
    "load_squad", "load_structured", "load_prompts", "quick_subset",
    "squad_prompt", "structured_prompt", "read_prompt_texts",
]

FIXTURES_ENV = "RSP_BENCH_FIXTURES"

T = TypeVar("T")


@dataclass(frozen=True)
class SquadItem:
    """One answerable SQuAD question; ``answers`` are the distinct gold texts in file order."""

    id: str
    title: str
    context: str
    question: str
    answers: list[str]


@dataclass(frozen=True)
class StructuredDoc:
    """One generated document and its gold fields (conventions: rsp_bench.metrics)."""

    id: str
    kind: str
    text: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class PromptItem:
    """One equivalence prompt."""

    id: str
    category: str
    text: str


def fixtures_dir() -> Path:
    """The fixtures folder: $RSP_BENCH_FIXTURES if set, else <repo>/fixtures beside this package."""
    override = os.environ.get(FIXTURES_ENV)
    path = Path(override) if override else Path(__file__).resolve().parent.parent / "fixtures"
    if not path.is_dir():
        hint = f" (from ${FIXTURES_ENV})" if override else f"; set ${FIXTURES_ENV} to the fixtures folder"
        raise HarnessInputError(f"fixtures folder {path} does not exist{hint}")
    return path


def _resolve(path: str | os.PathLike | None, default: str) -> Path:
    resolved = Path(path) if path is not None else fixtures_dir() / default
    if not resolved.is_file():
        raise HarnessInputError(f"fixture file {resolved} does not exist")
    return resolved


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise HarnessInputError(f"limit must be a non-negative integer or None, got {limit!r}")


def read_jsonl(path: Path, required: dict[str, type]) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file, each checked to hold ``required`` keys of the given types."""
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessInputError(f"cannot read {path}: {exc}") from exc
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HarnessInputError(f"{path}:{lineno} is not valid JSON: {exc.msg}") from exc
        if not isinstance(row, dict):
            raise HarnessInputError(f"{path}:{lineno} must be a JSON object, got {type(row).__name__}")
        for key, kind in required.items():
            if not isinstance(row.get(key), kind) or not row[key]:
                raise HarnessInputError(
                    f"{path}:{lineno} needs a non-empty {kind.__name__} {key!r}, got {row.get(key)!r:.100}"
                )
        rows.append(row)
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise HarnessInputError(f"{path} repeats the id {duplicate!r}")
    return rows


def read_prompt_texts(path: Path, plain_lines: bool = True) -> list[str]:
    """The prompts of a file: JSON lines of objects with a "text" (as fixtures/router_curve/ holds)
    or, with ``plain_lines``, also lines of plain text, one prompt each. ValueError naming the
    line for a broken or empty one, or when there are none."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot be read ({exc})") from None
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if plain_lines and not line.lstrip().startswith("{"):
            out.append(line)
            continue
        try:  # each line is parsed alone, so json's own "line 1" would point at the wrong line
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {no}: not valid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ValueError(f"line {no}: not a JSON object with a \"text\" string")
        if not row["text"].strip():
            # the chat template alone would be generated from, as `generate` refuses to do
            raise ValueError(f"line {no}: the prompt is {'empty' if not row['text'] else 'only whitespace'}")
        out.append(row["text"])
    if not out:
        raise ValueError("no prompts in the file")
    return out


def load_squad(path: str | os.PathLike | None = None, limit: int | None = None) -> list[SquadItem]:
    """Answerable questions of a SQuAD v2 JSON file, in file order (first ``limit`` if given)."""
    _check_limit(limit)
    resolved = _resolve(path, "squad/squad-v2-dev-subset.json")
    try:
        data = json.loads(resolved.read_text(encoding="utf-8"))
        articles = data["data"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise HarnessInputError(f"{resolved} is not a SQuAD JSON file (data[].paragraphs[].qas[]): {exc}") from exc
    items: list[SquadItem] = []
    try:
        for article in articles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    if qa.get("is_impossible") or not qa.get("answers"):
                        continue
                    # dict.fromkeys dedupes in order; duplicates never change a max over golds.
                    answers = list(dict.fromkeys(a["text"] for a in qa["answers"]))
                    items.append(SquadItem(qa["id"], article["title"], paragraph["context"],
                                           qa["question"], answers))
    except (KeyError, TypeError) as exc:
        raise HarnessInputError(f"{resolved} has a malformed article or question: missing {exc}") from exc
    return items if limit is None else items[:limit]


def load_structured(path: str | os.PathLike | None = None, limit: int | None = None) -> list[StructuredDoc]:
    """Documents of the structured extraction set, in file order."""
    _check_limit(limit)
    resolved = _resolve(path, "structured/documents.jsonl")
    rows = read_jsonl(resolved, {"id": str, "kind": str, "text": str, "fields": dict})
    docs = [StructuredDoc(r["id"], r["kind"], r["text"], r["fields"]) for r in rows]
    return docs if limit is None else docs[:limit]


def load_prompts(path: str | os.PathLike | None = None) -> list[PromptItem]:
    """The equivalence prompt set, in file order."""
    resolved = _resolve(path, "prompts/equivalence.jsonl")
    rows = read_jsonl(resolved, {"id": str, "category": str, "text": str})
    return [PromptItem(r["id"], r["category"], r["text"]) for r in rows]


def quick_subset(items: Sequence[T], n: int, seed: int = 0) -> list[T]:
    """The first ``n`` items after a seeded shuffle (all of them if fewer).

    Shuffling first makes a small CI subset span articles and kinds rather than taking the
    head of the file, which is one article or one kind.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise HarnessInputError(f"n must be a non-negative integer, got {n!r}")
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    return shuffled[:n]


def squad_prompt(item: SquadItem) -> str:
    """Instruction for a small chat model: copy a short answer span from the passage."""
    return (
        "Answer with a short span copied from the passage. Give only the answer, no sentence.\n\n"
        f"Passage: {item.context}\n\n"
        f"Question: {item.question}\n"
        "Answer:"
    )


# Short unit hints so the model writes values in the gold conventions of rsp_bench.metrics.
_FIELD_HINTS = {
    "revenue_growth_qoq": "percent change, negative if revenue fell",
    "gross_margin_pct": "percent",
    "operating_expense_ratio": "percent of revenue",
    "total_amount": "number",
    "due_date": "YYYY-MM-DD",
    "effective_date": "YYYY-MM-DD",
    "term_months": "number of months",
    "weight_kg": "number of kilograms",
    "salary_min_usd": "number of dollars",
    "salary_max_usd": "number of dollars",
}


def structured_prompt(doc: StructuredDoc) -> str:
    """Instruction asking for one JSON object with exactly the gold keys, listed in order."""
    keys = "\n".join(
        f"- {key}" + (f" ({_FIELD_HINTS[key]})" if key in _FIELD_HINTS else "") for key in doc.fields
    )
    return (
        "Extract these fields from the text and reply with one JSON object that has exactly "
        "these keys:\n"
        f"{keys}\n"
        "Write numbers without units or % signs.\n\n"
        f"Text: {doc.text}\n\n"
        "JSON:"
    )
