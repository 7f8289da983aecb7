"""Model-level out-of-distribution score of a prompt, from what prefill already computed.

Protective degradation (DESIGN.md section 2) turns pruning off for odd input. Text rules catch
only what someone listed; this module scores how unlike a broad normal corpus the model finds
the prompt, from the prefill's own hidden states (no second forward pass):

- per-token prompt loss at up to ``LOSS_POSITIONS`` content positions (the LM head is the one
  extra cost): the mean, the mean of the worst eighth, and the share of tokens above the
  calibrated 98th percentile of normal token losses (random strings hide in a predictable
  mean: their byte-fallback pieces are easy once the first is seen, the entry points are not);
- at a quarter, half and three quarters of the depth: the per-token Mahalanobis distance of
  the direction of each content token's hidden state (mean, and mean of the worst eighth), and
  the distance of the mean-pooled direction, each under a probabilistic-PCA Gaussian
  (Tipping & Bishop 1999: top-k covariance plus isotropic noise). That is a shrinkage
  covariance with k*D parameters, well conditioned from a few hundred documents where a full
  576x576 covariance is not, and it costs k*D per token instead of D*D;
- how far the content tokens' hidden-state norms leave the calibrated per-block band.

Each feature is standardised by its normal-corpus distribution, s = (x - median) / (q99 -
median), so s = 1 sits at the 99th percentile of normal text; the score is the Mahalanobis
distance of the upward excess of s over normal text (``OODModel.combine``), compared with ONE
threshold chosen for a stated false-alarm rate on the held-out part of the corpus. Router instability is not in the score: it is only known
after decoding, and the engine checks it there.

Only the user's content is scored: the chat template's fixed prefix and suffix (and BOS) are
the same in every request and would dilute every pooled statistic.

Must NOT import ``rsp_bench``. Imports torch and the engine's model module (prefill) only.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from .model import KVCache, ModelWeights, logits_from_hidden, prefill

__all__ = ["OOD_VERSION", "LOSS_POSITIONS", "TOKEN_POSITIONS", "RawStats", "OODModel", "raw_stats",
           "content_span", "fit", "load_corpus", "default_corpus_dir", "model_path", "save", "load",
           "collect"]

OOD_VERSION = 1
LOSS_POSITIONS = 48  # LM-head rows per prompt: 48 x 576 x 49k MACs, the check's main cost
TOKEN_POSITIONS = 96  # content tokens whose hidden-state distance is computed, evenly spaced
BLOCK_FRACTIONS = (0.25, 0.5, 0.75)
TOKEN_RANK = 32
POOL_RANK = 12
TOKEN_LOSS_QUANTILE = 0.98
STANDARD_QUANTILE = 0.99
FIT_MAX_TOKENS = 96  # calibration documents are cut here (prefill cost; statistics are per token)
DEFAULT_TARGET_FAR = 0.02
NORM_SLACK = 1.5
COV_SHRINK = 0.1


def _blocks(n_layers: int) -> tuple[int, ...]:
    return tuple(sorted({max(1, min(n_layers - 1, round(f * n_layers))) for f in BLOCK_FRACTIONS}))


def feature_names(n_layers: int) -> tuple[str, ...]:
    names = ["loss_mean", "loss_top", "loss_share"]
    for b in _blocks(n_layers):
        names += [f"tok_mean@{b}", f"tok_top@{b}", f"pool@{b}"]
    return tuple(names + ["norm_out"])


@dataclass
class RawStats:
    """What one prompt's prefill gives the score (computed once, reused by fit and score)."""

    nll: np.ndarray  # [m] per-token loss (nats) at sampled content positions
    tok: dict[int, np.ndarray]  # block -> [k, D] unit directions of sampled content tokens
    pool: dict[int, np.ndarray]  # block -> [D] mean unit direction over all content tokens
    norm_lo: np.ndarray  # [L] per block (input of blocks 1..L-1 and the final stream), min norm
    norm_hi: np.ndarray  # [L] max norm


def content_span(ids: Sequence[int], prefix: Sequence[int], suffix: Sequence[int]) -> tuple[int, int]:
    """[lo, hi) of the user's content inside ``ids``: after the template prefix (else after the
    first token) and before the template suffix; at least one token."""
    n = len(ids)
    lo = len(prefix) if len(prefix) < n and list(ids[:len(prefix)]) == list(prefix) else min(1, n - 1)
    hi = n - len(suffix) if len(suffix) and n - len(suffix) > lo and list(ids[n - len(suffix):]) == list(suffix) else n
    return lo, max(hi, lo + 1)


def _even(lo: int, hi: int, k: int) -> torch.Tensor:
    if hi - lo <= k:
        return torch.arange(lo, hi)
    return torch.linspace(lo, hi - 1, steps=k).round().long().unique()


def raw_stats(w: ModelWeights, hidden: Sequence[torch.Tensor], row: int, offset: int,
              ids: Sequence[int], lo: int, hi: int) -> RawStats:
    """Statistics of one row of a prefill. ``hidden[l]`` [B, S, D] enters block l (``hidden[L]``
    is the final stream); the row's tokens sit at ``offset + i`` (left padding), content at
    ``[lo, hi)`` of its own ids."""
    L = len(hidden) - 1
    with torch.no_grad():
        # Position p predicts token p + 1: score the predictions of content tokens.
        pred = _even(max(lo - 1, 0), hi - 1, LOSS_POSITIONS)
        if len(pred) == 0:
            nll = np.zeros(0)
        else:
            logp = torch.log_softmax(logits_from_hidden(w, hidden[-1][row, offset + pred]).double(), -1)
            targets = torch.tensor([ids[int(p) + 1] for p in pred])
            nll = (-logp.gather(-1, targets[:, None])[:, 0]).numpy()
        sel = _even(lo, hi, TOKEN_POSITIONS) + offset
        tok, pool = {}, {}
        for b in _blocks(L):
            h = hidden[b][row, offset + lo: offset + hi].double()
            u = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            pool[b] = u.mean(0).numpy()
            tok[b] = u[sel - offset - lo].numpy()
        norms = torch.stack([h[row, offset + lo: offset + hi].norm(dim=-1) for h in hidden[1:]])  # [L, n]
        return RawStats(nll, tok, pool, norms.min(1).values.double().numpy(), norms.max(1).values.double().numpy())


# --------------------------------------------------------------------------- the model


@dataclass
class _PPCA:
    mean: np.ndarray  # [D]
    basis: np.ndarray  # [D, k] top eigenvectors
    inv_var: np.ndarray  # [k] 1 / eigenvalue
    inv_noise: float  # 1 / mean of the remaining eigenvalues

    @classmethod
    def fit(cls, x: np.ndarray, rank: int) -> "_PPCA":
        mean = x.mean(0)
        xc = x - mean
        n, d = xc.shape
        # Eigen-decomposition of the D x D covariance (one GEMM and a small eigh): far cheaper
        # than an SVD of the N x D data when N is thousands of tokens.
        ev, vec = np.linalg.eigh(xc.T @ xc / max(n - 1, 1))
        ev, vec = np.maximum(ev[::-1], 0.0), vec[:, ::-1]
        k = max(1, min(rank, d - 1, n - 1))
        # The ML noise variance: the mean of the remaining eigenvalues (zero ones included when
        # n < D, so unseen directions share it).
        noise = max(float(ev[k:].sum() / (d - k)), 1e-6 * float(ev[0]), 1e-12)
        return cls(mean, np.ascontiguousarray(vec[:, :k]), 1.0 / np.maximum(ev[:k], noise), 1.0 / noise)

    def dist(self, x: np.ndarray) -> np.ndarray:
        """Squared Mahalanobis distance per row, divided by D (about 1 on the fitted data)."""
        xc = np.atleast_2d(x) - self.mean
        p = xc @ self.basis
        resid = np.einsum("nd,nd->n", xc, xc) - np.einsum("nk,nk->n", p, p)
        return (p ** 2 @ self.inv_var + np.maximum(resid, 0.0) * self.inv_noise) / xc.shape[1]


def _top_mean(v: np.ndarray) -> float:
    if v.size == 0:
        return 0.0
    k = max(1, v.size // 8)
    return float(np.sort(v)[-k:].mean())


@dataclass
class OODModel:
    """Fitted statistics and the one threshold, for one model's weights."""

    n_layers: int
    blocks: tuple[int, ...]
    token_loss_q: float
    tok: dict[int, _PPCA]
    pool: dict[int, _PPCA]
    norm_lo: np.ndarray
    norm_hi: np.ndarray
    med: np.ndarray  # [F] feature medians on normal text
    scale: np.ndarray  # [F] q99 - median
    centre: np.ndarray  # [F] mean standardised feature vector of normal text
    precision: np.ndarray  # [F, F] inverse of its (shrunk) covariance
    threshold: float
    info: dict = field(default_factory=dict)  # corpus sizes, target and measured rates

    @property
    def names(self) -> tuple[str, ...]:
        return feature_names(self.n_layers)

    def features(self, r: RawStats) -> np.ndarray:
        f = [float(r.nll.mean()) if r.nll.size else 0.0, _top_mean(r.nll),
             float((r.nll > self.token_loss_q).mean()) if r.nll.size else 0.0]
        for b in self.blocks:
            d = self.tok[b].dist(r.tok[b])
            f += [float(d.mean()), _top_mean(d), float(self.pool[b].dist(r.pool[b])[0])]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.maximum(np.log(r.norm_hi / self.norm_hi), np.log(self.norm_lo / r.norm_lo))
        f.append(float(np.max(np.maximum(out, 0.0))))
        return np.asarray(f, dtype=np.float64)

    def standardised(self, feats: np.ndarray) -> np.ndarray:
        s = (feats - self.med) / self.scale
        return np.where(np.isfinite(s), s, np.inf)

    def combine(self, s: np.ndarray) -> np.ndarray:
        """The one score of standardised feature rows [N, F]: the Mahalanobis distance (divided
        by F) of their upward excess over normal text. Upward only, because every feature is
        oriented so that odd is high (a prompt more predictable than usual is no danger), and
        Mahalanobis rather than the largest feature because odd input moves several correlated
        features at once, each a little, where normal text moves one (measured on the tuning
        classes: the largest feature let most emoji floods and mojibake through at the same
        false-alarm rate)."""
        s = np.atleast_2d(s)
        bad = ~np.all(np.isfinite(s), axis=1)
        x = np.maximum(np.where(np.isfinite(s), s, 0.0), self.centre) - self.centre
        d = np.einsum("ni,ij,nj->n", x, self.precision, x) / s.shape[1]
        return np.where(bad, np.inf, d)

    def score(self, r: RawStats) -> tuple[float, str]:
        """(score, name of the most raised feature). Non-finite input scores +inf."""
        s = self.standardised(self.features(r))
        return float(self.combine(s)[0]), self.names[int(np.argmax(s))]

    def flags(self, r: RawStats) -> bool:
        return self.score(r)[0] > self.threshold


def _fit_parts(raws: Sequence[RawStats], blocks: tuple[int, ...]) -> tuple[dict, dict]:
    tok = {b: _PPCA.fit(np.concatenate([r.tok[b] for r in raws]), TOKEN_RANK) for b in blocks}
    pool = {b: _PPCA.fit(np.stack([r.pool[b] for r in raws]), POOL_RANK) for b in blocks}
    return tok, pool


def fit(calib: Sequence[RawStats], heldout: Sequence[RawStats], n_layers: int,
        target_far: float = DEFAULT_TARGET_FAR) -> OODModel:
    """Fit on ``calib``; choose the threshold for ``target_far`` on ``heldout``.

    Feature scales come from two-fold cross-fitting on ``calib`` (each half scored by Gaussians
    fitted on the other), since a document scored by a Gaussian fitted on itself looks closer
    than new text will. The threshold is the (1 - target_far) quantile of held-out scores, and
    never under the 99th percentile of the calibration's cross-fitted scores."""
    if len(calib) < 8 or len(heldout) < 4:
        raise ValueError(f"need >= 8 calibration and >= 4 held-out prompts, got {len(calib)} and {len(heldout)}")
    if not 0.0 < target_far < 0.5:
        raise ValueError(f"target_far must be in (0, 0.5), got {target_far!r}")
    blocks = _blocks(n_layers)
    q = float(np.quantile(np.concatenate([r.nll for r in calib]), TOKEN_LOSS_QUANTILE))
    norm_lo = np.min([r.norm_lo for r in calib], axis=0)
    norm_hi = np.max([r.norm_hi for r in calib], axis=0)
    F = len(feature_names(n_layers))
    neutral = OODModel(n_layers, blocks, q, {}, {}, norm_lo, norm_hi, np.zeros(F), np.ones(F), np.zeros(F),
                       np.eye(F), math.inf)
    idx = np.arange(len(calib))
    folds = [idx[idx % 2 == 0], idx[idx % 2 == 1]]
    cross = np.zeros((len(calib), F))
    for a, b in ((0, 1), (1, 0)):
        tok, pool = _fit_parts([calib[i] for i in folds[a]], blocks)
        m = OODModel(**{**neutral.__dict__, "tok": tok, "pool": pool})
        for i in folds[b]:
            cross[i] = m.features(calib[i])
    med = np.median(cross, axis=0)
    scale = np.maximum(np.quantile(cross, STANDARD_QUANTILE, axis=0) - med, 1e-6 * np.maximum(np.abs(med), 1.0))
    # Norms inside the calibrated band give 0 on nearly every normal prompt, so their q99 says
    # nothing: a norm NORM_SLACK times outside the band (the slack the old norm check used)
    # scores 1 instead.
    scale[-1] = max(scale[-1], math.log(NORM_SLACK))
    z = (cross - med) / scale
    centre = z.mean(0)
    cov = np.cov(z.T)
    # Shrink towards the diagonal: F is small, but the calibration has only a few hundred rows.
    cov = (1.0 - COV_SHRINK) * cov + COV_SHRINK * np.diag(np.diag(cov)) + 1e-6 * np.eye(F)
    tok, pool = _fit_parts(calib, blocks)
    model = OODModel(n_layers, blocks, q, tok, pool, norm_lo, norm_hi, med, scale, centre, np.linalg.inv(cov),
                     math.inf)
    held = np.array([model.score(r)[0] for r in heldout])
    cross_scores = model.combine(z)
    threshold = max(float(np.quantile(cross_scores, 0.99)), float(np.quantile(held, 1.0 - target_far, method="higher")))
    model.threshold = threshold
    model.info = {"n_calibration": len(calib), "n_heldout": len(heldout), "target_false_alarm_rate": target_far,
                  "heldout_false_alarms": int((held > threshold).sum()),
                  "calibration_cross_fit_false_alarms": int((cross_scores > threshold).sum())}
    return model


# --------------------------------------------------------------------------- storage


def model_path(cache_dir: Path, weights_sha256: str) -> Path:
    return cache_dir / "calibration" / f"{weights_sha256[:16]}-ood-v{OOD_VERSION}.npz"


def save(model: OODModel, path: Path, weights_sha256: str) -> None:
    """Write atomically as .npz (arrays, no pickle) with a JSON header."""
    arrays: dict[str, np.ndarray] = {"norm_lo": model.norm_lo, "norm_hi": model.norm_hi,
                                     "med": model.med, "scale": model.scale, "centre": model.centre,
                                     "precision": model.precision}
    for kind, parts in (("tok", model.tok), ("pool", model.pool)):
        for b, p in parts.items():
            arrays[f"{kind}{b}_mean"] = p.mean.astype(np.float32)
            arrays[f"{kind}{b}_basis"] = p.basis.astype(np.float32)
            arrays[f"{kind}{b}_inv_var"] = p.inv_var
            arrays[f"{kind}{b}_inv_noise"] = np.array(p.inv_noise)
    header = {"version": OOD_VERSION, "weights_sha256": weights_sha256, "n_layers": model.n_layers,
              "blocks": list(model.blocks), "token_loss_q": model.token_loss_q, "threshold": model.threshold,
              "features": list(model.names), "info": model.info}
    arrays["header"] = np.array(json.dumps(header))
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(buf.getvalue())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; it is package data
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(path: Path, weights_sha256: str) -> OODModel | None:
    """The stored model, or None when missing, damaged, of another version or other weights."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            if header.get("version") != OOD_VERSION or header.get("weights_sha256") != weights_sha256:
                return None
            blocks = tuple(int(b) for b in header["blocks"])
            parts = {kind: {b: _PPCA(z[f"{kind}{b}_mean"].astype(np.float64), z[f"{kind}{b}_basis"].astype(np.float64),
                                     z[f"{kind}{b}_inv_var"], float(z[f"{kind}{b}_inv_noise"])) for b in blocks}
                     for kind in ("tok", "pool")}
            return OODModel(int(header["n_layers"]), blocks, float(header["token_loss_q"]), parts["tok"],
                            parts["pool"], z["norm_lo"], z["norm_hi"], z["med"], z["scale"], z["centre"],
                            z["precision"], float(header["threshold"]), header.get("info", {}))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged file is refitted, never trusted


# --------------------------------------------------------------------------- corpus and collection


def default_corpus_dir() -> Path | None:
    """``$RSP_NORMAL_CORPUS``, else the repository's fixtures/normal_corpus when it is there."""
    env = os.environ.get("RSP_NORMAL_CORPUS")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[1] / "fixtures" / "normal_corpus"
    return here if here.is_dir() else None


def load_corpus(folder: Path, part: str) -> list[str]:
    """Texts of ``part`` ("calibration" or "heldout") of a normal corpus folder (JSON lines)."""
    if part not in ("calibration", "heldout"):
        raise ValueError(f"part must be 'calibration' or 'heldout', got {part!r}")
    path = Path(folder) / f"{part}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"normal corpus part not found: {path}")
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def collect(w: ModelWeights, encode: Callable[[str], list[int]], texts: Iterable[str],
            prefix: Sequence[int], suffix: Sequence[int], max_tokens: int = FIT_MAX_TOKENS,
            progress: Callable[[str], None] | None = None) -> list[RawStats]:
    """Run prefill on each text (cut to ``max_tokens`` of content) and keep its RawStats."""
    out = []
    texts = list(texts)
    with torch.no_grad():
        for i, text in enumerate(texts):
            ids = encode(text)
            lo, hi = content_span(ids, prefix, suffix)
            if hi - lo > max_tokens:
                ids = ids[:lo + max_tokens] + ids[hi:]
                hi = lo + max_tokens
            S = len(ids)
            hidden: list[torch.Tensor] = []
            cache = KVCache.allocate(w.dims, 1, S)
            prefill(w, cache, torch.tensor([ids]), torch.arange(S)[None], torch.ones(1, S, dtype=torch.bool),
                    hidden_out=hidden)
            out.append(raw_stats(w, hidden, 0, 0, ids, lo, hi))
            if progress and (i + 1) % 10 == 0:
                progress(f"ood calibration: {i + 1}/{len(texts)} prompts")
    return out
