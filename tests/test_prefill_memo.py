"""Engine.memoized_prefill: a prompt prefilled once gives every later request of any mode the
same bits as its own prefill would (tokens, logits, stats that are not timings), and the memo
stays within its byte bound."""

from __future__ import annotations

import pytest
import torch

from reference_engine import PruningConfig
from reference_engine.prefill_memo import PrefillMemo

PROMPTS = ["The quick brown fox", "def add(a, b):"]
CONFIGS = [PruningConfig(mode="off"), PruningConfig(mode="lossy", sensitivity=1.0),
           PruningConfig(mode="static", static_bypass=(2, 3))]


def _run(engine, cfg):
    out = []
    for p in PROMPTS:
        res = engine.generate([p], max_new_tokens=6, config=cfg, return_logits=cfg.mode != "lossy")[0]
        out.append((res.token_ids, res.logits, res.stats["bypass_ratio"], res.stats["degraded"]))
    return out


def _same(a, b) -> None:
    for (ta, la, ra, da), (tb, lb, rb, db) in zip(a, b):
        assert ta == tb and ra == rb and da == db
        assert (la is None) == (lb is None)
        if la is not None:
            assert torch.equal(la, lb)


def test_memoized_prefill_changes_no_output(tiny_engine):
    plain = [_run(tiny_engine, cfg) for cfg in CONFIGS]
    forced_plain = tiny_engine.teacher_forced(tiny_engine.encode(PROMPTS[0]), [5, 6, 7], CONFIGS[2]).logits
    with tiny_engine.memoized_prefill() as memo:
        memoized = [_run(tiny_engine, cfg) for cfg in CONFIGS]
        forced = tiny_engine.teacher_forced(tiny_engine.encode(PROMPTS[0]), [5, 6, 7], CONFIGS[2]).logits
        assert memo.misses == len(PROMPTS) and memo.hits == len(PROMPTS) * (len(CONFIGS) - 1) + 1
        with tiny_engine.memoized_prefill() as inner:  # nested: the same memo
            assert inner is memo
    for a, b in zip(plain, memoized):
        _same(a, b)
    assert torch.equal(forced_plain, forced)
    assert tiny_engine._prefill_memo is None  # off again after the block


def test_memo_is_bounded_and_batches_bypass_it(tiny_engine):
    with tiny_engine.memoized_prefill(max_bytes=1) as memo:  # no entry fits: nothing kept
        tiny_engine.generate([PROMPTS[0]], max_new_tokens=2, config=CONFIGS[0])
        assert len(memo) == 0 and memo.bytes == 0
    with tiny_engine.memoized_prefill() as memo:
        tiny_engine.generate(PROMPTS, max_new_tokens=2, config=CONFIGS[0])  # batch 2: not memoized
        assert memo.hits == memo.misses == 0
        tiny_engine.generate([PROMPTS[0]], max_new_tokens=2, config=CONFIGS[0])
        one = memo.bytes
        assert len(memo) == 1 and one > 0
    small = PrefillMemo(int(one * 1.5))
    tiny_engine._prefill_memo = small
    try:
        for p in PROMPTS:
            tiny_engine.generate([p], max_new_tokens=2, config=CONFIGS[0])
        assert len(small) == 1 and small.bytes <= small.max_bytes  # the older one was dropped
    finally:
        tiny_engine._prefill_memo = None


def test_memo_rejects_a_bad_bound():
    with pytest.raises(ValueError, match="max_bytes"):
        PrefillMemo(0)
