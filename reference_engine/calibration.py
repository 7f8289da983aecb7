"""Per-model calibration: the per-block numbers the router and the degradation detector need.

Measured once per model on a small fixed set of chat prompts and the model's own greedy
continuations (the decode-time distribution), then cached by a hash of the weights:
- per block: mean relative update ||dh|| / ||h||, mean norm gradient |dlog||h|||, hidden-norm range,
  Block Influence (ShortGPT: 1 - cos(h_in, h_out)), and the measured impact of bypassing it,
  KL(full || bypassed) in nats per decode token, for an identity bypass and a low-rank linear
  bypass fitted by least squares; the cheaper-in-KL of the two is the block's bypass;
- per model: mean next-token entropy on decode tokens, mean prompt density, and the mean and
  spread of the per-token prompt loss.

Must not import the harness (``rsp_bench``).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .model import KVCache, ModelWeights, block_forward, decode_step, logits_from_hidden, prefill

CALIBRATION_VERSION = 1
CONTINUATION_TOKENS = 40
BYPASS_RANK = 32

CALIBRATION_PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that checks whether a number is prime.",
    "Summarize: The city council voted on Tuesday to expand the bike lane network by 40 km "
    "over the next three years, citing a 25% rise in cycling since 2019.",
    "What is 17 multiplied by 23? Show your working.",
    "Give me three tips for sleeping better.",
    "Translate to French: The library opens at nine in the morning.",
    "Extract the invoice number and total from: Invoice INV-20931, total due $1,284.50 by March 3.",
    "Tell me a short story about a lighthouse keeper and a cat.",
)


@dataclass
class Calibration:
    version: int
    weights_sha256: str
    n_layers: int
    rel_mean: list[float]
    grad_ref: list[float]
    norm_lo: list[float]
    norm_hi: list[float]
    block_influence: list[float]
    impact_identity: list[float]
    impact_linear: list[float]
    entropy_ref: float
    density_ref: float
    nll_mean: float
    nll_std: float
    bypass_rank: int

    @property
    def impact(self) -> np.ndarray:
        """Per-block impact of the bypass the engine uses (the lower-KL of identity and linear)."""
        return np.minimum(np.asarray(self.impact_identity), np.asarray(self.impact_linear))

    @property
    def use_linear(self) -> list[bool]:
        return [lin < ident for lin, ident in zip(self.impact_linear, self.impact_identity)]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        return cls(**json.loads(text))


def calibration_path(cache_dir: Path, weights_sha256: str) -> Path:
    return cache_dir / "calibration" / f"{weights_sha256[:16]}-v{CALIBRATION_VERSION}.json"


def bypass_maps_path(cache_dir: Path, weights_sha256: str) -> Path:
    return cache_dir / "calibration" / f"{weights_sha256[:16]}-v{CALIBRATION_VERSION}-bypass.pt"


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` into a temporary file beside ``path``, then rename it over ``path``: a reader
    sees the old file or the new one, never half of one. Every per-weights artefact (this
    calibration, the OOD score, the unit predictor) is written through here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the packaged copies are package data
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save(cal: Calibration, maps: dict[str, torch.Tensor], cache_dir: Path) -> None:
    atomic_write(bypass_maps_path(cache_dir, cal.weights_sha256), lambda p: torch.save(maps, p))
    atomic_write(calibration_path(cache_dir, cal.weights_sha256), lambda p: Path(p).write_text(cal.to_json()))


def load(cache_dir: Path, weights_sha256: str) -> tuple[Calibration, dict[str, torch.Tensor]] | None:
    path, maps_path = calibration_path(cache_dir, weights_sha256), bypass_maps_path(cache_dir, weights_sha256)
    if not (path.is_file() and maps_path.is_file()):
        return None
    try:
        cal = Calibration.from_json(path.read_text())
        maps = torch.load(maps_path, weights_only=True)
    except (OSError, ValueError, TypeError, RuntimeError):
        return None  # a damaged cache is recomputed, never trusted
    if cal.version != CALIBRATION_VERSION or cal.weights_sha256 != weights_sha256:
        return None
    return cal, maps


def _full_pass(w: ModelWeights, ids: torch.Tensor) -> list[torch.Tensor]:
    """Hidden streams [1, S, D] entering each block, plus the final stream."""
    S = ids.shape[1]
    cache = KVCache.allocate(w.dims, 1, S)
    hidden: list[torch.Tensor] = []
    prefill(w, cache, ids, torch.arange(S)[None], torch.ones(1, S, dtype=torch.bool), hidden_out=hidden)
    return hidden


def _forward_from(w: ModelWeights, h: torch.Tensor, layer: int) -> torch.Tensor:
    """Run blocks layer..L-1 over a whole sequence (teacher forcing) and return logits [S, V]."""
    S = h.shape[1]
    cache = KVCache.allocate(w.dims, 1, S)
    positions = torch.arange(S)[None]
    cos, sin = w.rope_cos[positions][:, None], w.rope_sin[positions][:, None]
    for i in range(layer, w.dims.n_layers):
        h = block_forward(w.blocks[i], w.dims, cache, i, h, 0, cos, sin, None, causal=True)
    return logits_from_hidden(w, h[0])


def _kl(ref_logp: torch.Tensor, logits: torch.Tensor) -> float:
    logp = torch.log_softmax(logits.double(), -1)
    return float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean())


def fit_low_rank(x: torch.Tensor, y: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduced-rank ridge regression y ~ x @ down @ up (least squares, then the top-r fitted directions)."""
    x64, y64 = x.double(), y.double()
    D = x64.shape[1]
    gram = x64.T @ x64
    lam = 1e-2 * torch.trace(gram) / D
    full = torch.linalg.solve(gram + lam * torch.eye(D, dtype=torch.float64), x64.T @ y64)  # [D, D]
    _, _, vh = torch.linalg.svd(x64 @ full, full_matrices=False)
    v_r = vh[:rank].T  # [D, r]
    return (full @ v_r).float().contiguous(), v_r.T.float().contiguous()


def calibrate(w: ModelWeights, encode: Callable[[str], list[int]], eos_id: int | None,
              density_of: Callable[[str, list[int]], float], weights_sha256: str,
              progress: Callable[[str], None] | None = None) -> tuple[Calibration, dict[str, torch.Tensor]]:
    """Measure a model's calibration. ``encode`` applies the chat template; takes ~1 min on 135M/CPU."""
    say = progress or (lambda _msg: None)
    L = w.dims.n_layers
    rank = min(BYPASS_RANK, w.dims.hidden // 2)
    sequences, prompt_lens, densities = [], [], []
    with torch.no_grad():
        say("calibration: generating continuations")
        for prompt in CALIBRATION_PROMPTS:
            ids = encode(prompt)
            densities.append(density_of(prompt, ids))
            S = len(ids)
            cache = KVCache.allocate(w.dims, 1, S + CONTINUATION_TOKENS)
            valid = torch.ones(1, S + CONTINUATION_TOKENS, dtype=torch.bool)
            logits = prefill(w, cache, torch.tensor([ids]), torch.arange(S)[None], valid)
            out = []
            for i in range(CONTINUATION_TOKENS):
                nxt = int(logits.argmax(-1))
                out.append(nxt)
                if nxt == eos_id or i == CONTINUATION_TOKENS - 1:
                    break
                logits = decode_step(w, cache, torch.tensor([nxt]), torch.tensor([S + i]), valid, None, None, None)
            sequences.append(torch.tensor([ids + out]))
            prompt_lens.append(S)

        say("calibration: block statistics")
        hiddens = [_full_pass(w, seq) for seq in sequences]
        rel, grad, cos, lo, hi = [[] for _ in range(L)], [[] for _ in range(L)], [[] for _ in range(L)], [], []
        entropies, nlls = [], []
        for seq, hid, S in zip(sequences, hiddens, prompt_lens):
            for layer in range(L):
                hin, hout = hid[layer][0], hid[layer + 1][0]
                n_in, n_out = hin.norm(dim=-1), hout.norm(dim=-1)
                dec = slice(S, hin.shape[0])  # decode positions: what the router sees
                rel[layer].append(((hout - hin).norm(dim=-1) / n_in)[dec])
                grad[layer].append((n_out.log() - n_in.log()).abs()[dec])
                cos[layer].append(torch.nn.functional.cosine_similarity(hin, hout, dim=-1))
            lo.append(torch.stack([h[0].norm(dim=-1).min() for h in hid[1:-1] + [hid[-1]]]))
            hi.append(torch.stack([h[0].norm(dim=-1).max() for h in hid[1:-1] + [hid[-1]]]))
            logp = torch.log_softmax(logits_from_hidden(w, hid[-1][0]).double(), -1)
            entropies.append(-(logp.exp() * logp).sum(-1)[S - 1:-1])
            targets = seq[0, 1:S]
            nlls.append(float(-logp[: S - 1].gather(-1, targets[:, None]).mean()))

        say("calibration: bypass impact per block")
        impact_id, impact_lin, maps = [], [], {}
        for layer in range(L):
            xs = torch.cat([h[layer][0] for h in hiddens])
            ys = torch.cat([h[layer + 1][0] - h[layer][0] for h in hiddens])
            down, up = fit_low_rank(xs, ys, rank)
            maps[f"{layer}.down"], maps[f"{layer}.up"] = down, up
            kl_id, kl_lin = [], []
            for hid, S in zip(hiddens, prompt_lens):
                ref_logp = torch.log_softmax(logits_from_hidden(w, hid[-1][0]).double(), -1)[S - 1:-1]
                for kind, store in (("identity", kl_id), ("linear", kl_lin)):
                    h_next = hid[layer + 1].clone()
                    h_in = hid[layer][:, S:]
                    h_next[:, S:] = h_in if kind == "identity" else h_in + (h_in @ down) @ up
                    logits = _forward_from(w, h_next, layer + 1)[S - 1:-1]
                    store.append(_kl(ref_logp, logits))
            impact_id.append(float(np.mean(kl_id)))
            impact_lin.append(float(np.mean(kl_lin)))
            say(f"calibration: block {layer + 1}/{L}")

    cal = Calibration(
        version=CALIBRATION_VERSION, weights_sha256=weights_sha256, n_layers=L,
        rel_mean=[float(torch.cat(r).mean()) for r in rel],
        grad_ref=[float(torch.cat(g).mean()) for g in grad],
        norm_lo=[float(v) for v in torch.stack(lo).min(0).values],
        norm_hi=[float(v) for v in torch.stack(hi).max(0).values],
        block_influence=[float(1 - torch.cat(c).mean()) for c in cos],
        impact_identity=impact_id, impact_linear=impact_lin,
        entropy_ref=float(torch.cat(entropies).mean()),
        density_ref=float(np.mean(densities)),
        nll_mean=float(np.mean(nlls)), nll_std=float(max(np.std(nlls), 0.25)),
        bypass_rank=rank,
    )
    return cal, maps
