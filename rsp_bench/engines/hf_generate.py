"""The ``hf-generate`` adapter: plain ``transformers`` greedy ``generate`` on the reference
engine's weights, the unpruned peer every figure can be checked against.

Must NOT import torch or transformers at module import.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

from rsp_bench.engines.base import ConfigSpec, Output, register_engine
from rsp_bench.engines.reference import need_engine
from rsp_bench.errors import HarnessInputError

if TYPE_CHECKING:
    import torch
    from reference_engine import Engine


class HFGenerateAdapter:
    """Plain ``transformers`` greedy ``generate`` on the engine's weights: the unpruned peer.

    It shares the reference engine's tokenizer and chat template (``engine.encode``) so both
    see identical prompt ids; any difference in output is then the decode loop's.
    """

    name = "hf-generate"
    modes = ("off",)
    batch_size = 1

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.model = engine.hf_model

    def _check(self, spec: ConfigSpec) -> None:
        if spec.mode != "off":
            raise HarnessInputError(f"engine 'hf-generate' only runs mode 'off' (unpruned), got {spec.mode!r} "
                                    f"in configuration {spec.config_id!r}")

    def generate(self, prompts: list[str], max_new_tokens: int, spec: ConfigSpec) -> list[Output]:
        import torch
        from transformers import GenerationConfig

        self._check(spec)
        # A fresh GenerationConfig so the checkpoint's own defaults (sampling, repetition
        # penalty, extra stop ids) cannot make the peer differ from plain greedy decoding.
        gen_cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                   eos_token_id=self.engine.eos_id, pad_token_id=self.engine.pad_id)
        n_layers = self.engine.dims.n_layers
        outputs = []
        for prompt in prompts:
            ids = self.engine.encode(prompt, chat=True)
            t0 = time.perf_counter()
            with torch.no_grad():
                seq = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                          generation_config=gen_cfg)
            new = seq[0, len(ids):].tolist()
            stats = {"layers_bypassed": 0, "total_tokens": len(new), "bypass_ratio": 0.0, "blocks": n_layers,
                     "degraded": False, "degraded_reason": None, "mode": "off", "sensitivity": None,
                     "prompt_tokens": len(ids), "decode_time_s": time.perf_counter() - t0, "batch_size": 1}
            outputs.append(Output(self.engine.decode(new), new, list(ids), stats))
        return outputs

    def teacher_forced_logits(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int],
                              spec: ConfigSpec) -> tuple["torch.Tensor", dict[str, Any]]:
        import torch

        self._check(spec)
        if len(continuation_ids) == 0 or len(prompt_ids) == 0:
            raise HarnessInputError("teacher forcing needs a non-empty prompt and continuation")
        ids = torch.tensor([list(prompt_ids) + list(continuation_ids)[:-1]])
        with torch.no_grad():
            logits = self.model(ids).logits[0].float()
        p, t = len(prompt_ids), len(continuation_ids)
        # Position p-1 (the last prompt token) predicts continuation[0], and so on.
        stats = {"layers_bypassed": 0, "total_tokens": t, "bypass_ratio": 0.0,
                 "blocks": self.engine.dims.n_layers, "mode": "off"}
        return logits[p - 1:p - 1 + t].clone(), stats


@register_engine("hf-generate", modes=("off",))
def _hf_factory(engine: "Engine | None" = None, **_: Any) -> HFGenerateAdapter:
    return HFGenerateAdapter(need_engine("hf-generate", engine))
