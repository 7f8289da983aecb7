"""Unit tests of the ``rsp`` lm-eval model (rsp_bench/lm_eval_model.py) and the offline task
folder, on the seeded tiny model: loglikelihood equals a direct computation, rolling windows
cover every token once, generate_until honours stop strings and max_gen_toks, stats are summed
into the side file, and the task data files are up to date with the fixtures.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "fixtures" / "lm_eval_tasks"


@pytest.fixture(scope="module")
def rsp_cls():
    from rsp_bench.lm_eval_model import RSPLM

    return RSPLM


@pytest.fixture(scope="module")
def lm_off(tiny_engine, rsp_cls):
    return rsp_cls(engine=tiny_engine, mode="off")


def _req(kind: str, *args):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc={}, arguments=tuple(args), idx=0)


def _hf_logprob(engine, context_ids: list[int], continuation_ids: list[int]) -> float:
    """Direct computation: one plain transformers forward pass over context + continuation."""
    import torch

    ids = torch.tensor([context_ids + continuation_ids])
    logits = engine.hf_model(ids).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    p = len(context_ids)
    return float(sum(logp[p - 1 + t, tok] for t, tok in enumerate(continuation_ids)))


def test_registered_without_hiding_builtin_models(rsp_cls) -> None:
    from lm_eval.api.registry import get_model

    assert get_model("rsp") is rsp_cls
    # get_model imports lm-eval's own table only while the registry is empty: registering
    # first must not have hidden it.
    assert get_model("dummy").__name__ == "DummyLM"


def test_loglikelihood_equals_direct_forward_pass(tiny_engine, lm_off) -> None:
    context, continuation = "Question: Who was the Norse leader? Answer:", " Rollo."
    (ll, greedy), = lm_off.loglikelihood([_req("loglikelihood", context, continuation)])
    ctx_ids = tiny_engine.encode(context, chat=False)
    whole = tiny_engine.encode(context + continuation, chat=False)
    direct = _hf_logprob(tiny_engine, ctx_ids, whole[len(ctx_ids):])
    # Two implementations of the same math (the engine's decode loop and transformers'
    # forward pass): equal to float32 rounding.
    assert math.isclose(ll, direct, rel_tol=1e-4, abs_tol=1e-3), (ll, direct)
    assert isinstance(greedy, bool)


def test_loglikelihood_pruned_is_the_engines_teacher_forced_score(tiny_engine, rsp_cls) -> None:
    import torch

    lm = rsp_cls(engine=tiny_engine, mode="lossy", sensitivity=1.0)
    context, continuation = "The quick brown fox", " jumps over the lazy dog. Revenue was $2.45B, up 12.3%."
    (ll, greedy), = lm.loglikelihood([_req("loglikelihood", context, continuation)])
    ctx = tiny_engine.encode(context, chat=False)
    cont = tiny_engine.encode(context + continuation, chat=False)[len(ctx):]
    res = tiny_engine.teacher_forced(ctx, cont, lm.config)
    logp = torch.log_softmax(res.logits.double(), -1)
    direct = float(sum(logp[t, tok] for t, tok in enumerate(cont)))
    assert math.isclose(ll, direct, rel_tol=0, abs_tol=1e-9)
    assert greedy == bool((res.logits.argmax(-1) == torch.tensor(cont)).all())
    assert lm.pruning_stats["requests"] == {"loglikelihood": 1}
    assert lm.pruning_stats["decode_tokens"] == len(cont)


def test_trailing_space_moves_to_continuation_and_empty_context_uses_prefix(tiny_engine, lm_off) -> None:
    a, b = lm_off.loglikelihood([_req("loglikelihood", "The quick ", "brown fox"),
                                 _req("loglikelihood", "The quick", " brown fox")])
    assert a == b
    (ll, _), = lm_off.loglikelihood([_req("loglikelihood", "", "The quick brown fox")])
    cont = list(tiny_engine.tokenizer("The quick brown fox", add_special_tokens=False)["input_ids"])
    direct = _hf_logprob(tiny_engine, [lm_off.prefix_token_id], cont)
    assert math.isclose(ll, direct, rel_tol=1e-4, abs_tol=1e-3)


def test_loglikelihood_rolling_windows_cover_every_token_once(tiny_engine, rsp_cls) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 3
    tokens = list(tiny_engine.tokenizer(text, add_special_tokens=False)["input_ids"])
    whole = rsp_cls(engine=tiny_engine, mode="off")
    (ll_one,) = whole.loglikelihood_rolling([_req("loglikelihood_rolling", text)])
    direct = _hf_logprob(tiny_engine, [whole.prefix_token_id], tokens)
    assert math.isclose(ll_one, direct, rel_tol=1e-4, abs_tol=1e-3)
    # Windows shorter than the text: each token is still scored exactly once.
    short = rsp_cls(engine=tiny_engine, mode="off", max_length=16)
    (ll_windows,) = short.loglikelihood_rolling([_req("loglikelihood_rolling", text)])
    assert short.pruning_stats["decode_tokens"] == len(tokens)
    assert ll_windows < 0 and math.isfinite(ll_windows)


def test_rolling_with_pruning_is_not_degraded_by_its_empty_first_context(tiny_engine, rsp_cls) -> None:
    from rsp_bench.lm_eval_model import WARMUP_TOKENS

    text = "The quick brown fox jumps over the lazy dog. Revenue was $2.45B, up 12.3%. " * 2
    tokens = list(tiny_engine.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(tokens) > WARMUP_TOKENS + 1
    lm = rsp_cls(engine=tiny_engine, mode="lossy", sensitivity=1.0)
    (ll,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", text)])
    stats = lm.pruning_stats
    assert "empty_or_whitespace" not in stats["degraded_reasons"]
    assert stats["decode_tokens"] == len(tokens) and stats["requests"] == {"loglikelihood_rolling": 1}
    # The chain rule: head scored unpruned from the prefix, tail pruned from prefix + head.
    import torch

    prefix, head, tail = [lm.prefix_token_id], tokens[:WARMUP_TOKENS], tokens[WARMUP_TOKENS:]
    expected = 0.0
    for ctx, cont, cfg in ((prefix, head, lm.config.override(mode="off")), (prefix + head, tail, lm.config)):
        logits = tiny_engine.teacher_forced(ctx, cont, cfg).logits
        expected += float(torch.log_softmax(logits.double(), -1)[torch.arange(len(cont)), torch.tensor(cont)].sum())
    assert math.isclose(ll, expected, rel_tol=0, abs_tol=1e-9)


def test_generate_until_honours_stop_strings_and_max_gen_toks(tiny_engine, lm_off) -> None:
    prompt = "Question: Who was the Norse leader? Answer:"
    [direct] = tiny_engine.generate([prompt], max_new_tokens=24, config=lm_off.config, chat=False)
    assert len(direct.text) > 4, "the tiny model should say something to cut"
    stop = direct.text[len(direct.text) // 2:len(direct.text) // 2 + 2]
    expected = direct.text.split(stop)[0]
    lm_off.reset_stats()
    out = lm_off.generate_until([
        _req("generate_until", prompt, {"until": [stop], "max_gen_toks": 24, "do_sample": False}),
        _req("generate_until", prompt, {"until": ["\u2603never"], "max_gen_toks": 24}),
        _req("generate_until", prompt, {"until": [], "max_gen_toks": 3}),
    ])
    assert out[0] == expected and stop not in out[0]
    assert out[1] == direct.text
    short = tiny_engine.generate([prompt], max_new_tokens=3, config=lm_off.config, chat=False)[0]
    assert out[2] == short.text
    assert lm_off.pruning_stats["requests"] == {"generate_until": 3}


def test_generate_until_batched_keeps_request_order(tiny_engine, rsp_cls) -> None:
    lm = rsp_cls(engine=tiny_engine, mode="off", batch_size=2)
    prompts = ["Bonjour, comment", "def add(a, b):", "The quick brown fox jumps"]
    out = lm.generate_until([_req("generate_until", p, {"until": [], "max_gen_toks": 4}) for p in prompts])
    singles = [tiny_engine.generate([p], max_new_tokens=4, config=lm.config, chat=False)[0].text for p in prompts]
    # Left-padded batches may differ from batch 1 in float rounding, never in which row is which.
    assert len(out) == 3
    assert sum(o == s for o, s in zip(out, singles)) >= 2


def test_chat_template_text_encodes_like_the_engines_chat_prompt(tiny_engine, lm_off) -> None:
    text = lm_off.apply_chat_template([{"role": "user", "content": "Hi there"}])
    assert tiny_engine.encode(text, chat=False) == tiny_engine.encode("Hi there", chat=True)


def test_chat_requests_reach_the_engine_as_the_message_itself(tiny_engine, rsp_cls) -> None:
    # The template's special-token text would trip protective degradation (pruning off for
    # every chat request); the remembered one-message chat goes in with chat=True instead.
    lm = rsp_cls(engine=tiny_engine, mode="lossy", sensitivity=1.0)
    message = "Question: Who was the Norse leader? Answer:"
    context = lm.apply_chat_template([{"role": "user", "content": message}])
    [out] = lm.generate_until([_req("generate_until", context, {"until": [], "max_gen_toks": 6})])
    [direct] = tiny_engine.generate([message], max_new_tokens=6, config=lm.config, chat=True)
    assert out == direct.text
    assert "special_token_text" not in lm.pruning_stats["degraded_reasons"]
    raw = rsp_cls(engine=tiny_engine, mode="lossy", sensitivity=1.0)
    raw.generate_until([_req("generate_until", context, {"until": [], "max_gen_toks": 6})])
    assert raw.pruning_stats["degraded_reasons"].get("special_token_text") == 1, \
        "the same text not produced by apply_chat_template stays a raw prompt"


def test_stats_side_file_is_written_and_summed(tiny_engine, rsp_cls, tmp_path) -> None:
    path = tmp_path / "stats" / "rsp.json"
    lm = rsp_cls(engine=tiny_engine, mode="lossy", sensitivity=1.0, stats_file=str(path))
    lm.generate_until([_req("generate_until", "The quick brown", {"until": [], "max_gen_toks": 6})])
    lm.loglikelihood([_req("loglikelihood", "The quick", " brown fox")])
    saved = json.loads(path.read_text())
    assert saved == json.loads(json.dumps(lm.pruning_stats))
    assert saved["requests"] == {"generate_until": 1, "loglikelihood": 1}
    assert saved["mode"] == "lossy" and saved["sensitivity"] == 1.0 and saved["hardware_watermark"] == 0.0
    assert 0.0 <= saved["bypass_ratio"] <= 1.0
    assert lm.get_model_info()["rsp_pruning"]["decode_tokens"] == saved["decode_tokens"]


@pytest.mark.parametrize("args, match", [
    ({"mode": "sideways"}, "mode must be one of"),
    ({"sensitivity": 1.5}, "sensitivity must be a number in"),
    ({"watermark": "busy"}, "watermark must be"),
    ({"max_length": 4096}, "exceeds the model's context"),
    ({"temperatur": 0.1}, "unknown model argument"),
])
def test_bad_model_arguments_name_the_value(tiny_engine, rsp_cls, args, match) -> None:
    from rsp_bench.errors import HarnessInputError

    with pytest.raises(HarnessInputError, match=match):
        rsp_cls(engine=tiny_engine, **args)


def test_arg_string_and_unsupported_generation_kwargs(tiny_engine, lm_off, rsp_cls) -> None:
    from rsp_bench.errors import HarnessInputError

    lm = rsp_cls.create_from_arg_string("sensitivity=0.25,mode=lossy", {"engine": tiny_engine, "batch_size": 1,
                                                                          "device": "cuda:0"})
    assert lm.config.sensitivity == 0.25 and lm.config.mode == "lossy"
    with pytest.raises(HarnessInputError, match="top_p=0.9"):
        lm_off.generate_until([_req("generate_until", "Hi", {"until": [], "top_p": 0.9})])
    with pytest.raises(HarnessInputError, match="max_gen_toks"):
        lm_off.generate_until([_req("generate_until", "Hi", {"until": [], "max_gen_toks": 0})])


def test_task_data_files_match_the_fixtures() -> None:
    proc = subprocess.run([sys.executable, str(TASKS / "generate.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_task_scorers_are_the_harness_metrics() -> None:
    import importlib.util

    from rsp_bench import metrics as m

    spec = importlib.util.spec_from_file_location("rsp_lm_eval_task_utils", TASKS / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    doc = {"answers": ["Rollo", "Rollo of Normandy"]}
    assert utils.process_squad(doc, ["Answer: Rollo.\nmore"]) == {"squad_em": 1.0, "squad_f1": 1.0}
    gold = {"total_amount": 1234.5, "due_date": "2024-03-01"}
    text = 'Sure: {"total_amount": "$1,234.50", "due_date": "March 2, 2024"}'
    got = utils.process_structured({"fields_json": json.dumps(gold)}, [text])
    assert got == {"json_field_f1": m.doc_field_f1(m.parse_json_answer(text), gold)} and got["json_field_f1"] == 0.5
