"""The instruction probe of protective degradation (issue 26): instructions addressed to the model
read by meaning, not by a list of cues.

Six versions of the embedded-instruction cue list (``embedded_instructions``) caught 20-58% of the
next blind set's injections: every set brings framings that share no words with the last. The
model itself reads what a prompt asks of it; the score (``reference_engine.ood``) already pools
each prompt's hidden states at two blocks (``PromptStats.pooled``). The probe reads those two unit
directions. Version 1 (stops 57-65) was one logistic model; twice the injections in its fit bought
it nothing (stop 65), while a small network on the same directions separates what a line cannot.
Version 2 is an ensemble of ``E`` one-hidden-layer networks (``H`` tanh-GELU units each), fitted on
the injections of development splits against their ordinary requests (data requests, plain
English, plain requests in 24 languages), the normal corpus and the project's own prompts; its
threshold is chosen on other development splits for a stated false-alarm rate over their whole
ordinary side (``scripts/fit_instruction_probe.py``, which trains it; the file names the splits).
Its cost is E x 1,152 x H multiply-adds per prompt (184k: ~0.06 ms).

It runs where the score runs (``ood.judge``): a prompt the score passes, or excuses as a request
carrying data or a plain request in a spared language, is still degraded when the probe fires
(reason ``instruction_probe``). Without its file the probe does not run, and ``detector_info``
says so.

Must NOT import ``rsp_bench``, torch, or other modules of this package; numpy and the stdlib only.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VERSION = 2


@dataclass(frozen=True)
class InstructionProbe:
    """An ensemble of one-hidden-layer networks on a prompt's pooled unit directions at ``blocks``,
    and its threshold on the members' mean log-odds."""

    blocks: tuple[int, ...]
    mu: np.ndarray  # [F] standardisation, F = len(blocks) x D
    sd: np.ndarray
    w1: np.ndarray  # [E, F, H]
    b1: np.ndarray  # [E, H]
    w2: np.ndarray  # [E, H]
    b2: np.ndarray  # [E]
    threshold: float
    info: dict  # the evidence: splits, counts, the choice

    def features(self, pooled: dict[int, np.ndarray]) -> np.ndarray | None:
        """The unit directions at the probe's blocks, concatenated (None when one is missing)."""
        if any(b not in pooled for b in self.blocks):
            return None
        return np.concatenate([unit(pooled[b]) for b in self.blocks])

    def log_odds(self, x: np.ndarray) -> np.ndarray:
        """The members' mean log-odds for feature rows ``x`` ([N, F] or [F]) -> [N]."""
        z = (np.atleast_2d(x) - self.mu) / self.sd
        h = gelu(np.matmul(z[None], self.w1) + self.b1[:, None, :])  # [E, N, H]; a batched BLAS call
        return (np.matmul(h, self.w2[:, :, None])[..., 0] + self.b2[:, None]).mean(0)

    def fires(self, pooled: dict[int, np.ndarray]) -> bool:
        x = self.features(pooled)
        return x is not None and bool(self.log_odds(x)[0] > self.threshold)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU's tanh form, the one the fit trains with (torch's ``approximate="tanh"``)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def unit(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float64)
    return v / max(float(np.linalg.norm(v)), 1e-12)


def fit_logistic(A: np.ndarray, y: np.ndarray, wts: np.ndarray, ridge: float) -> np.ndarray:
    """Weighted ridge logistic regression by Newton's method (bias unpenalised, last)."""
    A1 = np.c_[A, np.ones(len(A))]
    w = np.zeros(A1.shape[1])
    pen = np.r_[np.full(A.shape[1], ridge), 0.0]
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(A1 @ w, -30, 30)))
        g = A1.T @ (wts * (p - y)) + pen * w
        H = (A1 * (wts * p * (1 - p))[:, None]).T @ A1 + np.diag(pen) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def probe_path(folder: Path, weights_sha256: str) -> Path:
    return folder / "calibration" / f"{weights_sha256[:16]}-instruction-probe-v{VERSION}.npz"


def save(path: Path, weights_sha256: str, probe: InstructionProbe) -> None:
    """Write the probe atomically (a temporary file beside it, then a rename)."""
    meta = {"version": VERSION, "weights_sha256": weights_sha256, "blocks": list(probe.blocks),
            "threshold": probe.threshold, "info": probe.info}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, meta=np.array(json.dumps(meta)),
                        **{k: getattr(probe, k).astype(np.float32 if k == "w1" else np.float64) for k in ARRAYS})
    tmp.replace(path)


#: The probe's arrays; ``w1`` is stored in float32 (its product is read in float64; the fit's own
#: scores are float32 throughout).
ARRAYS = ("mu", "sd", "w1", "b1", "w2", "b2")


def load(path: Path, weights_sha256: str) -> InstructionProbe | None:
    """The stored probe, or None when missing, damaged, of another version or other weights (then
    the probe does not run)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            d = json.loads(str(z["meta"]))
            mu, sd, w1, b1, w2, b2 = (z[k].astype(np.float64) for k in ARRAYS)
        if d.get("version") != VERSION or d.get("weights_sha256") != weights_sha256:
            return None
        e, f, h = w1.shape
        if not (mu.shape == sd.shape == (f,) and b1.shape == w2.shape == (e, h) and b2.shape == (e,)
                and np.all(sd > 0)):
            return None
        return InstructionProbe(tuple(int(b) for b in d["blocks"]), mu, sd, w1, b1, w2, b2, float(d["threshold"]),
                                dict(d.get("info", {})))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile):
        return None
