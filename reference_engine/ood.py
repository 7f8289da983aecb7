"""The model-level out-of-distribution score: how unlike ordinary input a prompt looks to the model.

Protective degradation (DESIGN.md section 2) turns pruning off for odd input. Character rules
(``degradation.text_rules``) see only what someone listed; random or machine-made text (a
base64 blob, a hash list, keyboard mash) is made of ordinary characters. This module scores a
prompt from what the full prefill already computed (no second pass), over the user's content
only (the chat template's fixed prefix and suffix are the same in every request):

- the per-token loss and the model's own next-token entropy at up to ``SCORED_POSITIONS``
  evenly spaced content positions (the LM head on those rows is the one extra cost):
  ``high_loss`` the share of tokens above the normal corpus' 95th percentile of token loss,
  ``entropy`` the mean entropy, ``unsure`` the share of positions where the model is not
  confident (entropy >= 0.5 nats), ``no_easy`` the share of tokens that were not easy (loss >=
  0.5 nats; ordinary text is full of easy continuations, random strings have none),
  ``surprise_gap`` mean |loss - entropy|, ``entropy_spread`` the entropy's std;
- ``short_tokens``: -log(characters per content token); random strings fall apart into short
  tokens; ``byte_pieces``: the share of content tokens that are lone non-ASCII bytes, text the
  tokenizer learned no merge for (random ideographs, mojibake), where ordinary text in any
  script it was trained on is mostly merged pieces;
- ``far_l``: at blocks ~3/4 and ~9/10 of the depth, the log of 1 - the mean cosine of the
  prompt's mean-pooled hidden-state direction to its ``KNN`` nearest neighbours among the
  normal corpus' prompts. Nearest neighbours rather than one Gaussian: ordinary input is many modes
  (prose in 30 languages, code, tables, logs), and a distance to the nearest of them does not
  call a mode odd because it is far from the average (Sun et al. 2022, "Out-of-distribution
  detection with deep nearest neighbors").

Short prompts give noisy averages, so every feature is shrunk towards the normal corpus'
median with ``PRIOR_TOKENS`` pseudo-tokens: a 3-token greeting cannot look odd by
chance, a 200-token hex dump keeps its value. The features, standardised on the normal
calibration part, are combined by one logistic model fitted on that part against the
*tuning* classes of generated odd text (``rsp_bench.adversarial.machine_text.TUNING``); the
one threshold on its log-odds is chosen for a stated false-alarm rate on the *held-out*
normal part. Held-out generated classes are never seen by the fit. Hidden-state norms
outside the calibrated band (x/÷ ``NORM_SLACK``) score +inf: no ordinary input does that.

Must NOT import ``rsp_bench``. Imports torch, the engine's model module, calibration's atomic write,
``degradation.request_words``, ``degradation.instruction_probe`` and (lazily, when it is built) the native kernel's GEMV only.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .calibration import atomic_write
from .degradation import request_words
from .degradation.instruction_probe import InstructionProbe, fit_logistic
from .model import KVCache, ModelWeights, prefill, rms_norm

OOD_VERSION = 2
SCORED_POSITIONS = 48
HIGH_LOSS_QUANTILE = 0.95
EASY_NATS = 0.5
PRIOR_TOKENS = 8.0
KNN = 10
DEPTHS = (0.75, 0.9)
NORM_SLACK = 1.5
DEFAULT_TARGET_FAR = 0.015
RIDGE = 0.03
STACKED_NORM_TOKENS = 256  # content tokens up to which the norms are taken over stacked blocks
FIT_MAX_TOKENS = 512  # calibration texts are cut here (prefill cost); features are per-token means

FEATURES = ("high_loss", "entropy", "unsure", "no_easy", "surprise_gap", "entropy_spread", "short_tokens",
            "byte_pieces")


def blocks_for(n_layers: int) -> tuple[int, ...]:
    return tuple(sorted({min(n_layers - 1, max(1, round(f * n_layers))) for f in DEPTHS}))


def feature_names(n_layers: int) -> tuple[str, ...]:
    return FEATURES + tuple(f"far{b}" for b in blocks_for(n_layers))


@dataclass
class PromptStats:
    """What one prompt's prefill gives the score; computed once, used by fit and score."""

    nll: np.ndarray  # [m] loss (nats) of content tokens at the scored positions
    entropy: np.ndarray  # [m] the model's next-token entropy there (nats)
    chars_per_token: float
    byte_pieces: float  # share of content tokens that are lone non-ASCII byte pieces
    n_tokens: int  # content tokens
    pooled: dict[int, np.ndarray]  # block -> [D] mean unit direction of the content tokens
    norm_lo: np.ndarray  # [L] min hidden-state norm over content tokens, per block output
    norm_hi: np.ndarray  # [L]


def content_span(ids: Sequence[int], prefix: Sequence[int], suffix: Sequence[int]) -> tuple[int, int]:
    """[lo, hi) of the user's content in ``ids``: after the template prefix (else after the first
    token) and before the template suffix; never empty."""
    n = len(ids)
    lo = len(prefix) if len(prefix) < n and list(ids[:len(prefix)]) == list(prefix) else min(1, n - 1)
    hi = n - len(suffix) if suffix and n - len(suffix) > lo and list(ids[n - len(suffix):]) == list(suffix) else n
    return lo, max(hi, lo + 1)


def byte_piece_ids(decode: Callable[[list[int]], str], vocab: int, scan: int = 1024) -> frozenset[int]:
    """Token ids that stand for one non-ASCII byte alone (they decode to U+FFFD). Byte-level BPE
    keeps its 256 base bytes among the first ids, so scanning the first ``scan`` finds them."""
    return frozenset(i for i in range(min(scan, vocab)) if decode([i]) == "\ufffd")


_native_gemv: Callable | None | bool = None  # decode_native.gemv once loaded, False when unavailable


def _native_head_gemv() -> Callable | None:
    global _native_gemv
    if _native_gemv is None:
        try:
            from .decode_native import NativeKernelUnavailable, gemv, load_library

            load_library()
            _native_gemv = gemv
        except (ImportError, OSError, NativeKernelUnavailable):
            _native_gemv = False
    return _native_gemv or None


def _loss_and_entropy(w: ModelWeights, h: torch.Tensor, targets: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Loss of ``targets`` and next-token entropy (nats) at the final-stream rows ``h`` [m, D]:
    the check's one pass over the output matrix, its largest cost. The decode kernel's GEMV
    streams the matrix once for all rows (4 weight rows against 4 stream rows per pass over k,
    ``gemv_multi``); on 2 cores (torch 2.13, MKL) it took 4.3 / 6.6 / 8.8 / 24.9 ms for
    1 / 8 / 13 / 48 rows against 12 / 24 ms for F.linear at 1 / 12 rows (the 2-core AMD EPYC
    runner, 2026-12-03), and each row's logits are the same bits whatever the row count
    (``tests/test_decode_kernels.py``). The engine does better still: it computes these rows in
    the same pass as the prompt's own last-position logits (``Engine._check_degradation``)."""
    x = rms_norm(h, w.final_norm, w.dims.rms_eps)
    native = _native_head_gemv()
    logits = native(w.lm_head, x) if native is not None else F.linear(x, w.lm_head)  # [m, V]
    return loss_and_entropy(logits, targets)


def loss_and_entropy(logits: torch.Tensor, targets: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Loss of ``targets`` and entropy (nats) from logits [m, V]; the loss is the log-sum-exp minus
    the target's logit. Both come from the native kernel's one-pass routine where it is built (the
    unit router's entropy; within 7e-6 nats of the torch formulas below, and 3.8 against 12.2 ms
    for 48 rows on the 2-core runner; its log-sum-exp saved 0.4 of the check's 4.3 ms on a short
    prompt), else H = logsumexp - E_p[logit] in torch."""
    if len(logits) == 0:
        return np.zeros(0), np.zeros(0)
    if _native_head_gemv() is not None:
        from .decode_native import entropy_and_lse

        ent, lse = entropy_and_lse(logits)
        picked = logits.numpy()[np.arange(len(lse)), np.asarray(targets, dtype=np.int64)]
        return lse - picked, np.maximum(ent, 0.0)
    lse = torch.logsumexp(logits, -1)
    nll = lse - logits.gather(-1, torch.tensor(list(targets), dtype=torch.long)[:, None])[:, 0]
    p = torch.exp(logits - lse[:, None])
    ent = lse - (p * logits).sum(-1)
    return nll.double().numpy(), ent.clamp_min(0.0).double().numpy()


def scored_positions(lo: int, hi: int) -> torch.Tensor:
    """The positions whose next-token loss and entropy a prompt's statistics use: position p
    predicts token p + 1, over the content tokens (the first is predicted by the template's last
    token), at most ``SCORED_POSITIONS`` of them, evenly spaced."""
    first, last = max(lo - 1, 0), hi - 2
    if last < first:
        return torch.zeros(0, dtype=torch.long)
    pred = torch.arange(first, last + 1)
    if len(pred) > SCORED_POSITIONS:
        pred = torch.linspace(first, last, SCORED_POSITIONS).round().long().unique()
    return pred


def prompt_stats(w: ModelWeights, hidden: Sequence[torch.Tensor], row: int, offset: int, ids: Sequence[int],
                 lo: int, hi: int, n_chars: int, byte_ids: frozenset[int] = frozenset(),
                 scored: tuple[np.ndarray, np.ndarray] | None = None) -> PromptStats:
    """Statistics of one row of a prefill. ``hidden[l]`` [B, S, D] enters block l (``hidden[-1]``
    is the final stream); the row's tokens sit at ``offset + i`` (left padding). ``scored``: the
    loss and entropy at ``scored_positions(lo, hi)`` when the caller computed them already (the
    engine does, in its prefill's head pass); else they are computed here."""
    L = len(hidden) - 1
    if scored is not None:
        nll, ent = scored
    else:
        pred = scored_positions(lo, hi)
        nll = ent = np.zeros(0)
        if len(pred):
            nll, ent = _loss_and_entropy(w, hidden[-1][row, offset + pred], [ids[int(p) + 1] for p in pred])
    pooled = {}
    for b in blocks_for(L):
        h = hidden[b][row, offset + lo: offset + hi].double()
        pooled[b] = (h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12)).mean(0).numpy()
    # A short prompt's rows take one norm over the stacked blocks (the same bits as a norm per
    # block, a third of the time: the check's Python cost counts against its 0.25-of-a-step budget
    # on a short prompt); a long one's a norm per block, since stacking 30 blocks of a 3,000-token
    # prompt copies 230 MB (it added 70 ms to the check when tried).
    rows = [h[row, offset + lo: offset + hi] for h in hidden[1:]]
    norms = torch.stack(rows).norm(dim=-1) if hi - lo <= STACKED_NORM_TOKENS else torch.stack([r.norm(dim=-1) for r in rows])
    lo_n, hi_n = torch.aminmax(norms, dim=1)
    n = max(hi - lo, 1)
    pieces = sum(1 for t in ids[lo:hi] if t in byte_ids) / n
    return PromptStats(nll, ent, n_chars / n, pieces, hi - lo, pooled, lo_n.double().numpy(), hi_n.double().numpy())


def subset_stats(w: ModelWeights, hidden: Sequence[torch.Tensor], row: int, offset: int, ids: Sequence[int],
                 tokens: Sequence[int], whole: PromptStats, pieces: request_words.Pieces,
                 byte_ids: frozenset[int] = frozenset()) -> PromptStats:
    """Statistics of some content tokens alone (``tokens``: indices into ``ids``, each > 0), as
    ``prompt_stats`` computes them for a whole prompt; norms are the whole prompt's."""
    idx = torch.tensor(sorted(tokens))
    if len(idx) > SCORED_POSITIONS:
        scored = idx[torch.linspace(0, len(idx) - 1, SCORED_POSITIONS).round().long().unique()]
    else:
        scored = idx
    nll, ent = _loss_and_entropy(w, hidden[-1][row, offset + scored - 1], [ids[int(t)] for t in scored])
    pooled = {}
    for b in blocks_for(len(hidden) - 1):
        h = hidden[b][row, offset + idx].double()
        pooled[b] = (h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12)).mean(0).numpy()
    tok = [ids[int(t)] for t in idx]
    chars = float(pieces.chars[np.asarray(tok)].sum())
    return PromptStats(nll, ent, chars / len(tok), sum(t in byte_ids for t in tok) / len(tok), len(tok), pooled,
                       whole.norm_lo, whole.norm_hi)


def judge(det: "OODDetector", w: ModelWeights, hidden: Sequence[torch.Tensor], row: int, offset: int,
          ids: Sequence[int], lo: int, hi: int, n_chars: int, pieces: Callable[[], request_words.Pieces],
          byte_ids: frozenset[int] = frozenset(),
          request_tokens: Callable[[], list[int] | None] | None = None,
          scored: tuple[np.ndarray, np.ndarray] | None = None,
          plain_margin: Callable[[PromptStats], float] | None = None, min_coverage: float = 1.0,
          probe: InstructionProbe | None = None) -> str | None:
    """The degradation reason for one prefilled prompt (None: prune). The score judges the whole
    content; a whole that looks odd is judged again on its request words alone
    (``degradation.request_words``), and a request that reads as ordinary language is a request
    carrying data, not odd input. Norms outside the band are never excused. ``request_tokens``
    gives the request words' indices into ``ids`` from the prompt's text (None where the
    tokenizer gives no offsets: then whole-word vocabulary pieces stand in); ``pieces`` gives the
    vocabulary's piece table. Both are asked for only when the whole looks odd (decoding the
    vocabulary takes about a second, once per engine). ``scored``: as for ``prompt_stats``.
    ``plain_margin`` (``degradation.language_rule``, asked only here, with the whole's stats): a
    plain request in a language that pruning spares as it spares English, whose request words are
    at least ``min_coverage`` of its content, is odd only above the threshold plus that margin.
    ``probe`` (``degradation.instruction_probe``): a prompt the score passes or excuses is still
    degraded when the probe reads it as instructions addressed to the model."""
    whole = prompt_stats(w, hidden, row, offset, ids, lo, hi, n_chars, byte_ids, scored)
    reason = det.reason(whole)
    if reason is None or reason == "ood_score" and _excused(det, w, hidden, row, offset, ids, lo, hi, whole, pieces,
                                                             byte_ids, request_tokens, plain_margin, min_coverage):
        return "instruction_probe" if probe is not None and probe.fires(whole.pooled) else None
    return reason


def _excused(det: "OODDetector", w: ModelWeights, hidden: Sequence[torch.Tensor], row: int, offset: int,
             ids: Sequence[int], lo: int, hi: int, whole: PromptStats, pieces: Callable[[], request_words.Pieces],
             byte_ids: frozenset[int], request_tokens: Callable[[], list[int] | None] | None,
             plain_margin: Callable[[PromptStats], float] | None, min_coverage: float) -> bool:
    """Whether a whole the score finds odd is a request carrying data or a plain request in a
    language pruning spares (``judge``)."""
    table = pieces()
    words = request_tokens() if request_tokens is not None else None
    if words is None:
        words = request_words.request_tokens(ids, max(lo, 1), hi, table.classes)
    words = [i for i in words if max(lo, 1) <= i < hi]
    if words and det.score(subset_stats(w, hidden, row, offset, ids, words, whole, table, byte_ids)) <= det.threshold:
        return True
    margin = plain_margin(whole) if plain_margin is not None else 0.0
    # a plain request in a language pruning does not hurt more than English
    return margin > 0 and len(words) >= min_coverage * max(1, hi - max(lo, 1)) and det.score(whole) <= det.threshold + margin


def _token_features(s: PromptStats, high_loss_q: float) -> np.ndarray:
    nll, ent = s.nll, s.entropy
    if nll.size == 0:
        return np.full(6, np.nan)
    return np.array([np.mean(nll > high_loss_q), ent.mean(), np.mean(ent >= EASY_NATS), np.mean(nll >= EASY_NATS),
                     np.abs(nll - ent).mean(), ent.std()])


@dataclass
class OODDetector:
    """The fitted score and its one threshold, for one model's weights."""

    n_layers: int
    high_loss_q: float
    prior: np.ndarray  # [F] normal-corpus medians the short-prompt shrinkage pulls towards
    mu: np.ndarray  # [F] standardisation on the normal calibration part
    sd: np.ndarray
    weights: np.ndarray  # [F + 1] logistic model, bias last
    bank: dict[int, np.ndarray]  # block -> [N, D] unit pooled directions of the normal calibration part
    norm_lo: np.ndarray
    norm_hi: np.ndarray
    threshold: float
    info: dict = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return feature_names(self.n_layers)

    def raw_features(self, s: PromptStats, exclude: int | None = None) -> np.ndarray:
        """The features before shrinkage (NaN where a prompt has no scored position).
        ``exclude``: the bank row that is this prompt itself (during the fit), left out of its
        own neighbours."""
        f = list(_token_features(s, self.high_loss_q)) + [-math.log(max(s.chars_per_token, 1e-3)), s.byte_pieces]
        for b, bank in sorted(self.bank.items()):
            v = s.pooled[b] / max(np.linalg.norm(s.pooled[b]), 1e-12)
            cos = bank @ v
            if exclude is not None:
                cos[exclude] = -np.inf
            # log: a code snippet in a language the corpus lacks is far, random text is farther
            # still, and on a linear scale the first would already outvote every loss feature.
            top = np.sort(np.partition(cos, len(cos) - KNN)[-KNN:]) if len(cos) > KNN else np.sort(cos)
            f.append(math.log(max(1.0 - float(top.mean()), 1e-4)))
        return np.asarray(f)

    def features(self, s: PromptStats, exclude: int | None = None) -> np.ndarray:
        """The features, shrunk towards ``prior`` with PRIOR_TOKENS pseudo-tokens."""
        raw = self.raw_features(s, exclude)
        m = min(s.n_tokens, SCORED_POSITIONS)
        return np.where(np.isnan(raw), self.prior, (raw * m + self.prior * PRIOR_TOKENS) / (m + PRIOR_TOKENS))

    def log_odds(self, feats: np.ndarray) -> np.ndarray:
        z = (np.atleast_2d(feats) - self.mu) / self.sd
        return z @ self.weights[:-1] + self.weights[-1]

    def norm_outside(self, s: PromptStats) -> bool:
        with np.errstate(divide="ignore", invalid="ignore"):
            return bool(np.any(s.norm_hi > self.norm_hi * NORM_SLACK) or np.any(s.norm_lo < self.norm_lo / NORM_SLACK)
                        or not np.all(np.isfinite(s.norm_hi)))

    def score(self, s: PromptStats) -> float:
        """Log-odds that the prompt is odd; +inf for norms outside the band or non-finite losses."""
        if self.norm_outside(s):
            return math.inf
        return self._score_inside_band(s)

    def _score_inside_band(self, s: PromptStats) -> float:
        if not np.all(np.isfinite(s.nll)):
            return math.inf
        return float(self.log_odds(self.features(s))[0])

    def reason(self, s: PromptStats) -> str | None:
        """"hidden_norm", "ood_score" or None (the names degradation.REASONS lists)."""
        if self.norm_outside(s):
            return "hidden_norm"
        return "ood_score" if self._score_inside_band(s) > self.threshold else None


def fit(calib: Sequence[PromptStats], odd: Sequence[PromptStats], heldout: Sequence[PromptStats], n_layers: int,
        target_far: float = DEFAULT_TARGET_FAR) -> OODDetector:
    """Fit on normal ``calib`` against generated ``odd`` text (tuning classes only); choose the
    threshold for ``target_far`` false alarms on the normal ``heldout`` part."""
    if len(calib) < 16 or len(odd) < 8 or len(heldout) < 8:
        raise ValueError(f"need >= 16 calibration, 8 odd and 8 held-out prompts, got {len(calib)}, {len(odd)}, "
                         f"{len(heldout)}")
    if not 0.0 < target_far < 0.5:
        raise ValueError(f"target_far must be in (0, 0.5), got {target_far!r}")
    q = float(np.quantile(np.concatenate([s.nll for s in calib]), HIGH_LOSS_QUANTILE))
    blocks = blocks_for(n_layers)
    bank = {b: np.stack([s.pooled[b] / max(np.linalg.norm(s.pooled[b]), 1e-12) for s in calib]) for b in blocks}
    F = len(feature_names(n_layers))
    det = OODDetector(n_layers, q, np.zeros(F), np.zeros(F), np.ones(F), np.zeros(F + 1), bank,
                      np.min([s.norm_lo for s in calib], axis=0), np.max([s.norm_hi for s in calib], axis=0), math.inf)
    det.prior = np.median([det.raw_features(s, exclude=i) for i, s in enumerate(calib) if s.n_tokens >= 16], axis=0)
    Xc = np.array([det.features(s, exclude=i) for i, s in enumerate(calib)])
    Xo = np.array([det.features(s) for s in odd])
    det.mu, det.sd = Xc.mean(0), Xc.std(0) + 1e-9
    A = (np.vstack([Xc, Xo]) - det.mu) / det.sd
    y = np.r_[np.zeros(len(Xc)), np.ones(len(Xo))]
    wts = np.r_[np.full(len(Xc), 0.5 / len(Xc)), np.full(len(Xo), 0.5 / len(Xo))]  # classes weigh the same
    det.weights = fit_logistic(A, y, wts, RIDGE)
    held = np.array([det.score(s) for s in heldout])
    det.threshold = float(np.quantile(held, 1.0 - target_far, method="higher"))
    det.info = {"n_calibration": len(calib), "n_odd_tuning": len(odd), "n_heldout": len(heldout),
                "target_false_alarm_rate": target_far, "heldout_false_alarms": int((held > det.threshold).sum()),
                "calibration_false_alarms": int((det.log_odds(Xc) > det.threshold).sum()),
                "tuning_detected": int((det.log_odds(Xo) > det.threshold).sum()),
                "weights": dict(zip(det.names + ("bias",), np.round(det.weights, 4).tolist()))}
    return det


# --------------------------------------------------------------------------- storage


def detector_path(folder: Path, weights_sha256: str) -> Path:
    return folder / "calibration" / f"{weights_sha256[:16]}-ood-v{OOD_VERSION}.npz"


def save(det: OODDetector, path: Path, weights_sha256: str) -> None:
    """Write atomically as .npz (arrays and a JSON header, no pickle)."""
    arrays = {"prior": det.prior, "mu": det.mu, "sd": det.sd, "weights": det.weights, "norm_lo": det.norm_lo,
              "norm_hi": det.norm_hi}
    arrays.update({f"bank{b}": v.astype(np.float16) for b, v in det.bank.items()})
    header = {"version": OOD_VERSION, "weights_sha256": weights_sha256, "n_layers": det.n_layers,
              "high_loss_q": det.high_loss_q, "threshold": det.threshold, "blocks": sorted(det.bank),
              "features": list(det.names), "info": det.info}
    arrays["header"] = np.array(json.dumps(header))
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(buf.getvalue()))


#: What ran when no score file fits these weights: the mean prompt loss and hidden-norm checks.
FALLBACK = "fallback:loss_norm"
_warned: set[str] = set()  # weights digests already warned about in this process


def describe(path: Path | None, packaged_dir: Path) -> dict:
    """Which detector runs, for stats and run records: ``detector`` ("ood_score/v2" or
    ``FALLBACK``), and for a score its file, the file's SHA-256 and whether it is the packaged one."""
    if path is None:
        return {"detector": FALLBACK, "version": None, "file": None, "sha256": None, "packaged": False}
    import hashlib

    return {"detector": f"ood_score/v{OOD_VERSION}", "version": OOD_VERSION, "file": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "packaged": path.resolve().parent.parent == packaged_dir.resolve()}


def warn_fallback_once(logger, weights_sha256: str) -> None:
    """One WARNING per process and weights: protection is weaker without the score, and a
    deployment that lost its file should hear it, but not once per request."""
    if weights_sha256 not in _warned:
        _warned.add(weights_sha256)
        logger.warning("no out-of-distribution score for weights %s: protective degradation runs the mean "
                       "prompt loss and norm checks only (detector %s; scripts/calibrate_ood.py fits a score)",
                       weights_sha256[:12], FALLBACK)


def load(path: Path, weights_sha256: str) -> OODDetector | None:
    """The stored detector, or None when missing, damaged, of another version or other weights."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            h = json.loads(str(z["header"]))
            if h.get("version") != OOD_VERSION or h.get("weights_sha256") != weights_sha256:
                return None
            bank = {int(b): z[f"bank{b}"].astype(np.float64) for b in h["blocks"]}
            return OODDetector(int(h["n_layers"]), float(h["high_loss_q"]), z["prior"], z["mu"], z["sd"], z["weights"],
                               bank, z["norm_lo"], z["norm_hi"], float(h["threshold"]), h.get("info", {}))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged file is refitted, never trusted


# --------------------------------------------------------------------------- collection


def template_ends(encode: Callable[[str], list[int]]) -> tuple[list[int], list[int]]:
    """The chat template's fixed prefix and suffix token ids (what two different prompts share)."""
    a, b = encode("a"), encode("b")
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    s = 0
    while s < min(len(a), len(b)) - p and a[-1 - s] == b[-1 - s]:
        s += 1
    return a[:p], a[len(a) - s:]


def collect(w: ModelWeights, encode: Callable[[str], list[int]], texts: Iterable[str],
            byte_ids: frozenset[int] = frozenset(),
            progress: Callable[[int, int], None] | None = None) -> list[PromptStats]:
    """Prefill each text (content cut to ``FIT_MAX_TOKENS``) and keep its PromptStats."""
    prefix, suffix = template_ends(encode)
    texts = list(texts)
    out = []
    with torch.no_grad():
        for i, text in enumerate(texts):
            ids = encode(text)
            lo, hi = content_span(ids, prefix, suffix)
            n_chars = len(text)
            if hi - lo > FIT_MAX_TOKENS:
                n_chars = round(n_chars * FIT_MAX_TOKENS / (hi - lo))
                ids = ids[:lo + FIT_MAX_TOKENS] + ids[hi:]
                hi = lo + FIT_MAX_TOKENS
            S = len(ids)
            hidden: list[torch.Tensor] = []
            cache = KVCache.allocate(w.dims, 1, S)
            prefill(w, cache, torch.tensor([ids]), torch.arange(S)[None], torch.ones(1, S, dtype=torch.bool),
                    hidden_out=hidden)
            out.append(prompt_stats(w, hidden, 0, 0, ids, lo, hi, n_chars, byte_ids))
            if progress is not None:
                progress(i + 1, len(texts))
    return out
