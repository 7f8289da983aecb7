"""Unit tests of the request rule (reference_engine/degradation/request_words.py and
``ood.judge``): which pieces are words, which runs of them are a request, and that the score
excuses a prompt only through its request words. Whether the rule keeps odd input degraded on
the real model is the held-out split's question (``rsp-bench degradation``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference_engine import ood
from reference_engine.degradation import request_words as rw
from reference_engine.model import KVCache, prefill


@pytest.mark.parametrize("piece, cls", [
    (" this", rw.WORD_LEAD), (" Überprüfe", rw.WORD_LEAD), (" это", rw.WORD_LEAD), ("Check", rw.LETTERS),
    (" a", rw.SPACED), ("ab3", rw.GLUED), (" 42", rw.SPACED), (":", rw.PUNCT), (", ", rw.PUNCT), ("\n", rw.PUNCT),
    ("\n\n", rw.BREAK), ("==", rw.GLUED), ("_x", rw.GLUED),
])
def test_piece_classes(piece: str, cls: int) -> None:
    assert rw.piece_class(piece) == cls


# A toy vocabulary: id -> piece; sentences are written as lists of pieces.
VOCAB = ["Please", " decode", " this", " base", "64", ":", " aGV", "sbG8", "gd2", "9yb", "GQ=", " the", "xq",
         "zk", "\n\n", " for", " me", ".", " s", "Wh"]
CLASSES = np.array([rw.piece_class(p) for p in VOCAB], dtype=np.int8)


def _ids(*pieces: str) -> list[int]:
    return [VOCAB.index(p) for p in pieces]


def test_a_request_around_a_payload_keeps_its_words_and_drops_the_payload() -> None:
    ids = _ids("Please", " decode", " this", " base", "64", ":", " aGV", "sbG8", "gd2", " for", " me", ".")
    words = rw.request_tokens(ids, 0, len(ids), CLASSES)
    # " base" is continued by "64": not a whole word, and it ends the first run.
    assert [VOCAB[ids[i]] for i in words] == ["Please", " decode", " this"]


def test_a_payload_alone_has_no_request_words() -> None:
    ids = _ids(" aGV", "sbG8", "gd2", "9yb", "GQ=", "xq", "zk")
    assert rw.request_tokens(ids, 0, len(ids), CLASSES) == []


def test_stray_words_in_random_text_are_not_a_request() -> None:
    ids = _ids("xq", " the", "zk", " this", " s", " me", "Wh", " for", " the", "xq")
    assert rw.request_tokens(ids, 0, len(ids), CLASSES) == []  # runs of one and two words


def test_punctuation_joins_a_run_a_blank_line_ends_it() -> None:
    joined = _ids("Please", ":", " decode", ".", " this")
    assert len(rw.request_tokens(joined, 0, len(joined), CLASSES)) == 3
    split = _ids("Please", " decode", "\n\n", " this", " for")
    assert rw.request_tokens(split, 0, len(split), CLASSES) == []
    assert rw.request_tokens(split, 0, len(split), CLASSES, min_run=2) == [0, 1, 3, 4]


def test_indices_stay_inside_the_content_span() -> None:
    ids = _ids("Please", " decode", " this", " for", " me")
    assert rw.request_tokens(ids, 2, 5, CLASSES) == [2, 3, 4]
    assert rw.request_tokens(ids, 2, 4, CLASSES) == []  # two words are no run


def test_pieces_decodes_each_id_once() -> None:
    seen: list[list[int]] = []

    def decode(i: list[int]) -> str:
        seen.append(i)
        return VOCAB[i[0]]

    table = rw.pieces(decode, len(VOCAB))
    assert table.classes.tolist() == CLASSES.tolist() and table.chars.tolist() == [len(p) for p in VOCAB]
    assert seen == [[i] for i in range(len(VOCAB))]


class _Scorer:
    """A detector stand-in: odd when the judged tokens are more than ``excused`` (the whole
    prompt), ordinary otherwise; records what it was asked."""

    threshold = 0.0

    def __init__(self, whole_reason: str | None, excused: int) -> None:
        self.whole_reason, self.excused, self.asked = whole_reason, excused, []

    def reason(self, s: ood.PromptStats) -> str | None:
        self.asked.append(("whole", s.n_tokens))
        return self.whole_reason

    def score(self, s: ood.PromptStats) -> float:
        self.asked.append(("words", s.n_tokens))
        return -1.0 if s.n_tokens <= self.excused else 1.0


@pytest.fixture(scope="module")
def prefilled(tiny_engine):
    w = tiny_engine.weights
    text = "The quick brown fox jumps over the lazy dog: qzxv9 k3j2 88fq ==x0"
    ids = tiny_engine.encode(text)
    lo, hi = ood.content_span(ids, *ood.template_ends(tiny_engine.encode))
    hidden: list[torch.Tensor] = []
    cache = KVCache.allocate(w.dims, 1, len(ids))
    with torch.no_grad():
        prefill(w, cache, torch.tensor([ids]), torch.arange(len(ids))[None], torch.ones(1, len(ids), dtype=torch.bool),
                hidden_out=hidden)
    table = rw.pieces(tiny_engine.tokenizer.decode, tiny_engine.dims.vocab)
    return w, hidden, ids, lo, hi, len(text), table


def test_judge_excuses_an_odd_whole_only_through_ordinary_request_words(prefilled) -> None:
    w, hidden, ids, lo, hi, n_chars, table = prefilled
    words = rw.request_tokens(ids, max(lo, 1), hi, table.classes)
    assert 0 < len(words) < hi - lo, "the tiny tokenizer should split this prompt into words and a payload"
    args = (w, hidden, 0, 0, ids, lo, hi, n_chars, lambda: table)
    ordinary = _Scorer("ood_score", excused=len(words))
    assert ood.judge(ordinary, *args) is None
    assert ordinary.asked == [("whole", hi - lo), ("words", len(words))]
    odd_words = _Scorer("ood_score", excused=len(words) - 1)
    assert ood.judge(odd_words, *args) == "ood_score"
    # Norms outside the band (and any reason other than the score) are never excused.
    norm = _Scorer("hidden_norm", excused=10**6)
    assert ood.judge(norm, *args) == "hidden_norm" and norm.asked == [("whole", hi - lo)]
    fine = _Scorer(None, excused=0)
    assert ood.judge(fine, *args) is None and fine.asked == [("whole", hi - lo)]


def test_subset_stats_match_prompt_stats_on_the_whole_content(prefilled) -> None:
    w, hidden, ids, lo, hi, n_chars, table = prefilled
    whole = ood.prompt_stats(w, hidden, 0, 0, ids, lo, hi, n_chars)
    sub = ood.subset_stats(w, hidden, 0, 0, ids, range(max(lo, 1), hi), whole, table)
    if lo >= 1:
        np.testing.assert_allclose(sub.nll, whole.nll, rtol=1e-6)
        for b in whole.pooled:
            np.testing.assert_allclose(sub.pooled[b], whole.pooled[b], rtol=1e-6, atol=1e-9)
    assert sub.n_tokens == hi - max(lo, 1)


@pytest.mark.parametrize("text, words", [
    ("decode this morse please: -- . . - / .-", ["decode", "this", "morse", "please"]),
    # digits cut a run; "md5" and "base64" are not words, "hex digests to" still weighs 3
    ("convert these md5 hex digests to base64 please: 16ee3129", ["hex", "digests", "to"]),
    # a script written without spaces weighs half its characters
    ("请帮我算一下这些成绩的平均数：78, 85, 92", ["请帮我算一下这些成绩的平均数"]),
    ("what's the FEN after black's 8th move? 1.e4 e5", ["what's", "the", "FEN", "after", "black's"]),
    ("dedupe:\ncfbb55051399525e16\n1c49a083a74ed444", []),  # a one-word request is not a run
    ("SGVsbG8gV29ybGQhIFRoaXMgaXM=", []),  # base64: letters cut by digits
    ("see this\n\nand that", []),  # a blank line ends a run: two runs of 2
    ("まず 短い", []),  # 2 + 1 characters: under 3
])
def test_request_spans_find_runs_of_words_in_the_text(text: str, words: list[str]) -> None:
    assert [text[a:b] for a, b in rw.request_spans(text)] == words


def test_text_request_tokens_map_words_to_the_tokens_that_overlap_them() -> None:
    text = "sort these please: 3 1 2"
    offsets = [(0, 4), (4, 10), (10, 17), (17, 18), (18, 20), (20, 22), (22, 24)]
    assert rw.text_request_tokens(text, offsets) == [0, 1, 2]
    assert rw.text_request_tokens("3 1 2", [(0, 1), (1, 3), (3, 5)]) == []


def test_engine_finds_request_words_from_the_prompt_or_its_decoded_content(tiny_engine) -> None:
    text = "please sort these numbers for me: 9 4 7 1"
    ids = tiny_engine.encode(text)
    lo, hi = ood.content_span(ids, *ood.template_ends(tiny_engine.encode))
    words = tiny_engine._request_tokens(text, ids, lo, hi)
    assert words and all(lo <= i < hi for i in words)
    said = tiny_engine.decode([ids[i] for i in words]).replace(" ", "")
    assert said.startswith("pleasesortthese") and not any(c.isdigit() for c in said), said
    # a teacher-forced row holds the templated text: the content decoded from the ids stands in
    assert tiny_engine._request_tokens(tiny_engine.decode(ids), ids, lo, hi) == words
