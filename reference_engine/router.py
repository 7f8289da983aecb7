"""The pre-compute router: per decode token, KEEP or BYPASS for every block, decided before it runs.

Score (unit: nats). For block l and token t,

    score_l(t) = impact_l * ema_rel_l(t) / calib_rel_l

- ``impact_l``: calibrated mean KL(full || bypassed) at the output, in nats per token, when block l
  alone is bypassed on decode tokens (``calibration.py`` measures it).
- ``ema_rel_l``: exponential moving average of the block's relative update ||dh_l|| / ||h_l|| on the
  recent tokens where it ran (probe steps run every block and refresh it).
- ``calib_rel_l``: the calibration mean of that relative update.
So the score is "predicted nats of output KL if block l is bypassed for this token": a block whose
update is currently small relative to its usual size is cheap to skip.

Threshold (unit: nats), one per row and block:

    tau = clamp(tau0 * f_density * f_entropy * f_gradient_l * f_watermark * sensitivity / 0.5,
                0.001, 0.15)

BYPASS when score < tau and the block is not blacklisted and the step is not a probe step.
In a batch a block is bypassed only when every row agrees (skipping it for some rows would save
nothing). Sensitivity 0 disables pruning before any of this runs.

All router state is a few numpy arrays of shape [B, L]; one plan and one update per token.
Must not import the harness; torch only for the per-token tensor it reads.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

TAU_MIN, TAU_MAX = 0.001, 0.15
EMA_ALPHA = 0.5  # recent tokens dominate: a score is about this token, not the request
ENTROPY_EMA_ALPHA = 0.3
FACTOR_LO, FACTOR_HI = 0.5, 2.0


# ---- the four signals: each a documented formula of measured inputs, returning a factor ----

def density_of_text(text: str, token_ids: list[int], vocab: int, embed_cos_to_mean: float) -> float:
    """Semantic density in [0, 1]: mean of four shares measured on the prompt.

    digits: share of characters that are digits; entities: share of words that are capitalised
    mid-sentence or contain a digit; rare: share of tokens in the top quarter of BPE ids (BPE ids
    are ordered by merge frequency, so high ids are rarer); diversity: 1 - mean cosine between the
    prompt's token embeddings and their mean (varied content is dense).
    """
    chars = max(len(text), 1)
    digits = sum(c.isdigit() for c in text) / chars
    words = re.findall(r"\w+", text)
    entity = sum(1 for i, wd in enumerate(words) if (i > 0 and wd[:1].isupper()) or any(c.isdigit() for c in wd))
    entities = entity / max(len(words), 1)
    rare = sum(1 for t in token_ids if t >= 0.75 * vocab) / max(len(token_ids), 1)
    diversity = min(max(1.0 - embed_cos_to_mean, 0.0), 1.0)
    return float(np.clip((min(digits * 4, 1.0) + entities + rare + diversity) / 4.0, 0.0, 1.0))


def density_factor(density: float, density_ref: float) -> float:
    """Dense text lowers tau: (1 + 2 d_ref) / (1 + 2 d), in [0.5, 2]; 1 at the calibration density."""
    return float(np.clip((1 + 2 * density_ref) / (1 + 2 * density), FACTOR_LO, FACTOR_HI))


def entropy_factor(entropy_ema: np.ndarray, entropy_ref: float) -> np.ndarray:
    """A confident, narrow task raises tau: (H_ref + 0.5) / (H + 0.5), in [0.5, 2]; H in nats."""
    return np.clip((entropy_ref + 0.5) / (entropy_ema + 0.5), FACTOR_LO, FACTOR_HI)


def gradient_factor(grad: np.ndarray, grad_ref: np.ndarray) -> np.ndarray:
    """A block where the stream turns sharply is protected.

    grad_l = |log ||h_{l+1}|| - log ||h_l|||, the rate of change of the stream's norm across block
    l on the latest token where it ran. Factor 1 / (1 + 2 max(0, grad / grad_ref - 1)), in [0.5, 1]:
    only a sharper-than-usual turn lowers tau.
    """
    excess = np.maximum(grad / np.maximum(grad_ref, 1e-6) - 1.0, 0.0)
    return np.clip(1.0 / (1.0 + 2.0 * excess), FACTOR_LO, 1.0)


def watermark_factor(watermark: float) -> float:
    """A loaded machine raises tau: 1 below watermark 0.8, rising linearly to 2 at 1.0."""
    return float(1.0 + np.clip((watermark - 0.8) / 0.2, 0.0, 1.0))


def sample_watermark() -> tuple[float, dict]:
    """The machine's load in [0, 1], and what it was computed from.

    CUDA: max(memory used share, SM utilisation, (temperature - 60 C) / 30) through NVML when
    nvidia-ml-py is installed. CPU: max(memory used share, 1-minute load average / (2 x cores)),
    so a machine merely busy with this process stays well below the 0.8 knee.
    """
    info: dict = {}
    try:
        import pynvml  # type: ignore

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        info = {"source": "nvml", "mem_used": mem.used / mem.total, "sm_util": util.gpu / 100, "temp_c": temp}
        return float(max(info["mem_used"], info["sm_util"], (temp - 60) / 30, 0.0)), info
    except Exception:
        pass
    mem_used = 0.0
    try:
        with open("/proc/meminfo") as f:
            kv = {line.split(":")[0]: int(line.split()[1]) for line in f if ":" in line}
        mem_used = 1.0 - kv["MemAvailable"] / kv["MemTotal"]
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        pass
    try:
        load = os.getloadavg()[0] / (2 * (os.cpu_count() or 1))
    except OSError:
        load = 0.0
    info = {"source": "cpu", "mem_used": round(mem_used, 4), "load": round(load, 4)}
    return float(np.clip(max(mem_used, load), 0.0, 1.0)), info


@dataclass
class RouterCalibration:
    """Per-block numbers the router needs, measured once per model (see calibration.py)."""

    impact: np.ndarray  # [L] nats: mean KL when the block alone is bypassed on decode tokens
    rel_mean: np.ndarray  # [L] mean ||dh|| / ||h||
    grad_ref: np.ndarray  # [L] mean |dlog||h||| across the block
    entropy_ref: float  # nats, mean next-token entropy on calibration decode tokens
    density_ref: float


class Router:
    """Router state for one request batch: plan() before a step, observe() after it."""

    def __init__(self, calib: RouterCalibration, batch: int, sensitivity: float, tau0: float,
                 blacklist: frozenset[int], f_density: np.ndarray, f_watermark: float,
                 probe_interval: int):
        L = len(calib.impact)
        self.calib = calib
        self.n_layers = L
        self.ema_rel = np.tile(calib.rel_mean, (batch, 1))
        self.grad = np.tile(calib.grad_ref, (batch, 1))
        self.entropy = np.full(batch, calib.entropy_ref)
        self.base = tau0 * f_density * f_watermark * (sensitivity / 0.5)  # [B]
        self.f_density = f_density
        self.f_watermark = f_watermark
        self.protected = np.zeros(L, dtype=bool)
        self.protected[list(blacklist)] = True
        self.probe_interval = probe_interval
        self.step = 0
        self.last_keep = np.ones(L, dtype=bool)
        self.flips = 0
        self.decisions = 0

    def scores(self) -> np.ndarray:
        return self.calib.impact * self.ema_rel / np.maximum(self.calib.rel_mean, 1e-9)

    def thresholds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        f_ent = entropy_factor(self.entropy, self.calib.entropy_ref)  # [B]
        f_grad = gradient_factor(self.grad, self.calib.grad_ref)  # [B, L]
        tau = np.clip(self.base[:, None] * f_ent[:, None] * f_grad, TAU_MIN, TAU_MAX)
        return tau, f_ent, f_grad

    def plan(self, active: np.ndarray) -> tuple[list[bool], bool]:
        """KEEP (True) or BYPASS per block for the next token, and whether it is a probe step.

        ``active`` [B] is False for degraded rows: they veto every bypass in the batch.
        """
        probe = self.step % self.probe_interval == 0
        self.step += 1
        if probe or not active.all():
            return [True] * self.n_layers, probe
        tau, _, _ = self.thresholds()
        keep = ~((self.scores() < tau).all(axis=0) & ~self.protected)
        self.flips += int((keep != self.last_keep).sum())
        self.decisions += self.n_layers
        self.last_keep = keep
        return keep.tolist(), probe

    def observe(self, norms: np.ndarray, update_norms: np.ndarray, entropy: np.ndarray, keep: list[bool]) -> None:
        """Fold in what the step measured: norms [B, L+1] of the stream, ||dh|| [B, L], entropy [B]."""
        ran = np.asarray(keep)
        rel = update_norms / np.maximum(norms[:, :-1], 1e-9)
        grad = np.abs(np.log(np.maximum(norms[:, 1:], 1e-9)) - np.log(np.maximum(norms[:, :-1], 1e-9)))
        self.ema_rel[:, ran] = EMA_ALPHA * rel[:, ran] + (1 - EMA_ALPHA) * self.ema_rel[:, ran]
        self.grad[:, ran] = grad[:, ran]
        self.entropy = ENTROPY_EMA_ALPHA * entropy + (1 - ENTROPY_EMA_ALPHA) * self.entropy
