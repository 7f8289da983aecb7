"""Tests of the llama-cpp adapter (rsp_bench.engines.llama_cpp) and the GGUF ladder
(rsp_bench.gguf_ladder), on the tiny random model exported to a GGUF here.

The export (``_export_gguf``) is llama.cpp's own HF -> GGUF layout for a Llama model, Q/K rows
permuted to llama.cpp's rotary order, tied embeddings, the tokenizer's vocabulary and merges:
if any of it were wrong, llama.cpp's F32 logits would not match the reference engine's and the
equivalence test below would fail.

Tests that run llama.cpp are skipped with a one-line reason where llama-cpp-python is not
installed; the ladder parsing and the configuration plan are tested without it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rsp_bench.engines import ConfigSpec, available_engines, declared_modes, get_engine
from rsp_bench.errors import HarnessInputError
from rsp_bench.gguf_ladder import (DEFAULT_LADDER, INSTALL_HINT, LADDER_ENV, Rung, build_ladder, file_sha256,
                                   ladder_from_env, parse_ladder)

NEED_LLAMA = f"llama-cpp-python is not installed: {INSTALL_HINT}"


def _llama_cpp():
    return pytest.importorskip("llama_cpp", reason=NEED_LLAMA)


@pytest.fixture(scope="session")
def llama():
    # Session scope and first in every fixture list below: the skip comes before the tiny
    # model is built and calibrated (pytest instantiates wider scopes first).
    return _llama_cpp()


# --------------------------------------------------------------------------- no llama.cpp needed


def test_parse_ladder_names_rungs_and_refuses_bad_entries() -> None:
    assert [r.name for r in parse_ladder(DEFAULT_LADDER)] == ["f32", "q8_0", "q4_k_m", "q4_1"]
    assert parse_ladder(" prod=Q8_0 , q4_1") == [Rung("prod", "q8_0"), Rung("q4_1", "q4_1")]
    with pytest.raises(HarnessInputError, match="unknown file type 'q9_9'"):
        parse_ladder("f32,q9_9")
    with pytest.raises(HarnessInputError, match="rung 'a' appears twice"):
        parse_ladder("a=q8_0,a=q4_1")
    with pytest.raises(HarnessInputError, match="rung name 'Bad Name'"):
        parse_ladder("Bad Name=q8_0")
    with pytest.raises(HarnessInputError, match="names no rung"):
        parse_ladder(" , ")
    assert ladder_from_env({}) == parse_ladder(DEFAULT_LADDER)
    assert ladder_from_env({LADDER_ENV: "prod=q4_1"}) == [Rung("prod", "q4_1")]


def test_registered_with_its_own_configurations(llama, monkeypatch) -> None:
    from rsp_bench.engines import plan_configs

    assert "llama-cpp" in available_engines() and declared_modes("llama-cpp") == ("off", "quant")
    ids = [s.config_id for s in plan_configs("llama-cpp", ("quant",), (0.5,), with_pruning=False)]
    assert ids == ["reference/off", "llama-cpp/f32", "llama-cpp/q8_0", "llama-cpp/q4_k_m", "llama-cpp/q4_1"]
    monkeypatch.setenv(LADDER_ENV, "prod=q8_0")
    [anchor, prod] = plan_configs("llama-cpp", ("quant",), (0.5,), with_pruning=False)
    assert (prod.config_id, prod.engine, prod.mode, prod.params) == ("llama-cpp/prod", "llama-cpp", "quant",
                                                                      {"quant": "q8_0"})


def test_without_llama_cpp_the_plan_says_how_to_install(monkeypatch) -> None:
    from rsp_bench.engines import llama_cpp as adapter_module

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(HarnessInputError, match=r"needs llama-cpp-python.*pip install -e '\.\[llama-cpp\]'"):
        adapter_module.configurations()


# --------------------------------------------------------------------------- the tiny model as a GGUF


def _permute(w, n_head: int):
    # HF stores rotary pairs as halves (rotate_half); llama.cpp's llama graph wants them interleaved.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _export_gguf(folder: Path, out: Path) -> Path:
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    sd = load_file(str(folder / "model.safetensors"))
    n_head, n_kv, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hidden // n_head)
    # transformers 5 moved rope_theta under rope_parameters
    w.add_rope_freq_base(float(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = dict(tok["model"]["vocab"])
    special = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab.update(special)
    tokens = [""] * cfg["vocab_size"]
    for text, i in vocab.items():
        tokens[i] = text
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(cfg["pad_token_id"])
    f32 = lambda name: np.ascontiguousarray(sd[name], dtype=np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", f32("model.embed_tokens.weight"))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", f32(p + "input_layernorm.weight"))
        w.add_tensor(f"blk.{i}.attn_q.weight", np.ascontiguousarray(_permute(f32(p + "self_attn.q_proj.weight"), n_head)))
        w.add_tensor(f"blk.{i}.attn_k.weight", np.ascontiguousarray(_permute(f32(p + "self_attn.k_proj.weight"), n_kv)))
        w.add_tensor(f"blk.{i}.attn_v.weight", f32(p + "self_attn.v_proj.weight"))
        w.add_tensor(f"blk.{i}.attn_output.weight", f32(p + "self_attn.o_proj.weight"))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", f32(p + "post_attention_layernorm.weight"))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", f32(p + "mlp.gate_proj.weight"))
        w.add_tensor(f"blk.{i}.ffn_up.weight", f32(p + "mlp.up_proj.weight"))
        w.add_tensor(f"blk.{i}.ffn_down.weight", f32(p + "mlp.down_proj.weight"))
    w.add_tensor("output_norm.weight", f32("model.norm.weight"))  # tied: no output.weight
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def tiny_gguf(llama, tiny_model_dir, tmp_path_factory) -> Path:
    return _export_gguf(tiny_model_dir, tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf")


@pytest.fixture(scope="module")
def ladder_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ladder-cache")


@pytest.fixture(scope="module")
def adapter(llama, tiny_gguf, tiny_engine, ladder_cache):
    from rsp_bench.engines.llama_cpp import LlamaCppAdapter

    return LlamaCppAdapter(tiny_engine, tiny_gguf, rungs=parse_ladder("f32,q4_1"), n_threads=1, n_ctx=256,
                           cache_dir=ladder_cache)


PROMPTS = ["Who was the Norse leader?", "def add(a, b):", "Revenue was $2.45B, up 12.3%. Why?"]


# --------------------------------------------------------------------------- ladder


def test_ladder_builds_once_caches_and_rebuilds_a_damaged_file(llama, tiny_gguf, tmp_path) -> None:
    types = ["f32", "q8_0", "q4_k_m", "q4_1"]
    first = build_ladder(tiny_gguf, types, cache_dir=tmp_path, nthread=1)
    assert list(first) == types and all(f.build_s is not None for f in first.values())
    folder = tmp_path / "gguf" / file_sha256(tiny_gguf)[:16]
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{t}.gguf" for t in types] + ["ladder.json"])
    sizes = {t: f.size for t, f in first.items()}
    assert sizes["f32"] > sizes["q8_0"] > sizes["q4_1"], sizes
    manifest = json.loads((folder / "ladder.json").read_text())
    for t, f in first.items():
        assert manifest["files"][t]["sha256"] == f.sha256 == file_sha256(f.path)
    again = build_ladder(tiny_gguf, types, cache_dir=tmp_path, nthread=1)
    assert all(f.build_s is None for f in again.values())  # cached, not rebuilt
    assert {t: f.sha256 for t, f in again.items()} == {t: f.sha256 for t, f in first.items()}
    # A damaged file is noticed (size differs from the manifest) and rebuilt, to the same bytes:
    # llama.cpp's quantizer is deterministic, so a digest names a rung's weights.
    with open(first["q4_1"].path, "r+b") as f:
        f.truncate(1000)
    rebuilt = build_ladder(tiny_gguf, ["q4_1"], cache_dir=tmp_path, nthread=1)["q4_1"]
    assert rebuilt.build_s is not None and rebuilt.sha256 == first["q4_1"].sha256
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left behind
    with pytest.raises(HarnessInputError, match="unknown GGUF file type 'q7'"):
        build_ladder(tiny_gguf, ["q7"], cache_dir=tmp_path)


# --------------------------------------------------------------------------- adapter


def _reference(tiny_engine, prompts, max_new: int):
    from rsp_bench.engines import ReferenceAdapter, pruning_config
    from rsp_bench.quality import ReferenceOutputs

    spec = ConfigSpec("reference/off", "reference", "off", None, {}, pruning_config("off"))
    return ReferenceOutputs(ReferenceAdapter(tiny_engine), spec).get("tiny", prompts, max_new, with_logits=True)


def test_f32_rung_computes_the_reference_engines_model(llama, adapter, tiny_engine) -> None:
    """Same weights through llama.cpp and the reference: same greedy tokens, same top-1, ~0 KL."""
    from rsp_bench.quality import equivalence_metrics

    [f32, q4_1] = adapter.configurations()
    assert f32.config_id == "llama-cpp/f32" and f32.params["gguf_sha256"] == adapter.files()["f32"].sha256
    reference = _reference(tiny_engine, PROMPTS, 12)
    values = equivalence_metrics(adapter, f32, PROMPTS, reference, 12)
    assert values["exact_match_rate"].value == 1.0
    assert values["top1_agreement"].value == 1.0
    assert values["kl_mean"].value < 1e-4, values["kl_mean"]
    # The Q4_1 rung is another model: measurably further from the reference than F32 is.
    quant = equivalence_metrics(adapter, q4_1, PROMPTS, reference, 12)
    assert quant["kl_mean"].value > 10 * values["kl_mean"].value


def test_generate_stats_feed_the_speed_suite(llama, adapter) -> None:
    from rsp_bench import speed

    spec = adapter.configurations()[0]
    [out] = adapter.generate([PROMPTS[0]], 6, spec)
    st = out.stats
    assert st["total_tokens"] == len(out.token_ids) and st["prompt_tokens"] == len(out.prompt_ids)
    assert len(st["decode_step_times_s"]) == len(out.token_ids) - 1 and st["prefill_time_s"] > 0
    assert st["decode_time_s"] >= st["prefill_time_s"] and st["quant"] == "f32" and st["n_threads"] == 1
    timing = speed.adapter_call(adapter, spec, [PROMPTS[0]], 6)()
    assert timing.method.startswith("engine stats") and timing.new_tokens == len(out.token_ids)
    assert timing.tokens == [out.token_ids]  # greedy: the same tokens on every call


def test_weights_are_read_into_memory_not_mapped(llama, adapter) -> None:
    # Mapped, a rung's decode speed followed its file's page-cache history (stop 49's red CI: Q4_K_M
    # 58 against 72 tok/s on the runner its baseline came from); every load must lay weights out alike.
    import llama_cpp

    llm = adapter.llama(adapter.configurations()[0])
    assert llm.model_params.load_mode == llama_cpp.LLAMA_LOAD_MODE_NONE  # llama-cpp-python's use_mmap=False


def test_bad_configurations_and_inputs_are_refused(llama, adapter, tiny_model_dir) -> None:
    from rsp_bench.engines.llama_cpp import LlamaCppAdapter

    with pytest.raises(HarnessInputError, match="no rung 'q8_0' in this ladder"):
        adapter.generate(["x"], 2, ConfigSpec("llama-cpp/q8_0", "llama-cpp", "quant", None, {"quant": "q8_0"}))
    with pytest.raises(HarnessInputError, match="mode 'lossy'"):
        adapter.generate(["x"], 2, ConfigSpec("llama-cpp/f32", "llama-cpp", "lossy", 0.5, {}))
    with pytest.raises(HarnessInputError, match="asks for quant 'q4_1' but rung 'f32'"):
        adapter.generate(["x"], 2, ConfigSpec("llama-cpp/f32", "llama-cpp", "quant", None, {"quant": "q4_1"}))
    spec = adapter.configurations()[0]
    with pytest.raises(HarnessInputError, match="exceeds the llama.cpp context of 256"):
        adapter.generate(["word " * 300], 8, spec)
    with pytest.raises(HarnessInputError, match="max_new_tokens must be an integer >= 1, got 0"):
        adapter.generate(["x"], 0, spec)
    with pytest.raises(HarnessInputError, match="is not a .gguf file"):
        LlamaCppAdapter(adapter.engine, tiny_model_dir)


def test_factory_builds_the_adapter_from_the_registry(llama, tiny_gguf, tiny_engine, ladder_cache, monkeypatch) -> None:
    monkeypatch.setenv(LADDER_ENV, "prod=f32")
    monkeypatch.setenv("RSP_LLAMA_CPP_THREADS", "1")
    monkeypatch.setenv("RSP_BENCH_CACHE", str(ladder_cache))
    built = get_engine("llama-cpp", engine=tiny_engine, model=str(tiny_gguf))
    assert built.name == "llama-cpp" and built.n_threads == 1 and list(built.rungs) == ["prod"]
    assert built.describe()["rungs"]["prod"]["quant"] == "f32"
    assert built.extra_buffers is False and built.describe()["extra_buffers"] is False
    monkeypatch.setenv("RSP_LLAMA_CPP_EXTRA_BUFFERS", "yes")
    with pytest.raises(HarnessInputError, match="RSP_LLAMA_CPP_EXTRA_BUFFERS='yes' must be 0 or 1"):
        get_engine("llama-cpp", engine=tiny_engine, model=str(tiny_gguf))
    monkeypatch.delenv("RSP_LLAMA_CPP_EXTRA_BUFFERS")
    monkeypatch.setenv("RSP_LLAMA_CPP_THREADS", "zero")
    with pytest.raises(HarnessInputError, match="RSP_LLAMA_CPP_THREADS='zero'"):
        get_engine("llama-cpp", engine=tiny_engine, model=str(tiny_gguf))
    with pytest.raises(HarnessInputError, match="needs a loaded reference Engine"):
        get_engine("llama-cpp", engine=None, model=str(tiny_gguf))
