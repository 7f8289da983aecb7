"""The instruction probe of protective degradation (issue 26): instructions addressed to the model
read by meaning, not by a list of cues.

Six versions of the embedded-instruction cue list (``embedded_instructions``) caught 20-58% of the
next blind set's injections: every set brings framings that share no words with the last. The
model itself reads what a prompt asks of it; the score (``reference_engine.ood``) already pools
each prompt's hidden states at two blocks (``PromptStats.pooled``). The probe is one logistic
model on those two unit directions, fitted on the injections of development splits against their
ordinary requests (data requests, plain English, plain requests in 24 languages) and the normal
corpus, its threshold chosen on other development splits for a stated false-alarm rate over their
whole ordinary side (``scripts/fit_instruction_probe.py``; the file names the splits). Its cost is
one dot product of 1,152 numbers per prompt.

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

VERSION = 1


@dataclass(frozen=True)
class InstructionProbe:
    """A logistic model on a prompt's pooled unit directions at ``blocks``, and its threshold."""

    blocks: tuple[int, ...]
    mu: np.ndarray  # [F] standardisation, F = len(blocks) x D
    sd: np.ndarray
    coef: np.ndarray  # [F]
    bias: float
    threshold: float  # on the log-odds
    info: dict  # the evidence: splits, counts, the choice

    def features(self, pooled: dict[int, np.ndarray]) -> np.ndarray | None:
        """The unit directions at the probe's blocks, concatenated (None when one is missing)."""
        if any(b not in pooled for b in self.blocks):
            return None
        return np.concatenate([unit(pooled[b]) for b in self.blocks])

    def log_odds(self, x: np.ndarray) -> np.ndarray:
        return ((np.atleast_2d(x) - self.mu) / self.sd) @ self.coef + self.bias

    def fires(self, pooled: dict[int, np.ndarray]) -> bool:
        x = self.features(pooled)
        return x is not None and bool(self.log_odds(x)[0] > self.threshold)


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


def fit(blocks: tuple[int, ...], pos: np.ndarray, neg: np.ndarray, ridge: float) -> InstructionProbe:
    """Fit on feature rows ``pos`` (instructions to the model) against ``neg`` (ordinary input),
    the two classes weighing the same; the threshold is left at +inf for the caller to choose."""
    if len(pos) < 8 or len(neg) < 8:
        raise ValueError(f"need >= 8 rows in each class, got {len(pos)} and {len(neg)}")
    X = np.vstack([pos, neg])
    mu, sd = X.mean(0), X.std(0) + 1e-6
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    wts = np.r_[np.full(len(pos), 0.5 / len(pos)), np.full(len(neg), 0.5 / len(neg))]
    w = fit_logistic((X - mu) / sd, y, wts, ridge)
    return InstructionProbe(tuple(blocks), mu, sd, w[:-1], float(w[-1]), float("inf"), {"ridge": ridge})


def probe_path(folder: Path, weights_sha256: str) -> Path:
    return folder / "calibration" / f"{weights_sha256[:16]}-instruction-probe-v{VERSION}.npz"


def save(path: Path, weights_sha256: str, probe: InstructionProbe) -> None:
    """Write the probe atomically (a temporary file beside it, then a rename)."""
    meta = {"version": VERSION, "weights_sha256": weights_sha256, "blocks": list(probe.blocks), "bias": probe.bias,
            "threshold": probe.threshold, "info": probe.info}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, meta=np.array(json.dumps(meta)), mu=probe.mu.astype(np.float64),
                        sd=probe.sd.astype(np.float64), coef=probe.coef.astype(np.float64))
    tmp.replace(path)


def load(path: Path, weights_sha256: str) -> InstructionProbe | None:
    """The stored probe, or None when missing, damaged, of another version or other weights (then
    the probe does not run)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            d = json.loads(str(z["meta"]))
            mu, sd, coef = (z[k].astype(np.float64) for k in ("mu", "sd", "coef"))
        if d.get("version") != VERSION or d.get("weights_sha256") != weights_sha256:
            return None
        if not (mu.shape == sd.shape == coef.shape and mu.ndim == 1 and np.all(sd > 0)):
            return None
        return InstructionProbe(tuple(int(b) for b in d["blocks"]), mu, sd, coef, float(d["bias"]),
                                float(d["threshold"]), dict(d.get("info", {})))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile):
        return None
