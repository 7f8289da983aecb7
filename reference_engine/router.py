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

``UnitRouter`` (config ``router="unit"``) decides attention and MLP of each block apart, from a
score predicted from this token's own unit input inside the decode step (see its docstring and
unit_predictor.py); it keeps the threshold, its four factors and the knobs above.
Must not import the harness; torch only for the per-token tensor it reads.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

TAU_MIN, TAU_MAX = 0.001, 0.15
EMA_ALPHA = 0.5  # recent tokens dominate: a score is about this token, not the request
ENTROPY_EMA_ALPHA = 0.3
FACTOR_LO, FACTOR_HI = 0.5, 2.0
UNIT_TAU_WEIGHT = "bytes"  # UnitRouter: "bytes" (tau per block's worth of bytes saved) or "none"
# The unit router's static prior (``static_prior``): a candidate unit goes on a token when its
# predicted cost there is under UNIT_PRIOR_LAMBDA x its mean cost. None (the default since
# predictor version 3): no prior, the free router (every unit outside the blacklist may go; its
# threshold reads nats per block's worth of bytes, so a unit goes when its predicted cost per byte
# saved is low). Chosen on the development split (scripts/choose_unit_prior.py, 36 prompts,
# results/unit_design_v3_dev.json): with the version-3 predictor the free router led the best
# static removal of the same bytes by +6.9 to +9.0 top-1 points with a lower KL at 2.1-6.1 blocks'
# worth, the prior (lambda 1.0) by +0.6 to +1.3. The prior made the version-2 predictor usable
# (lambda 1.0 chosen against 0.3 then, results/unit_prior_dev.json); it is kept for comparison.
UNIT_PRIOR_LAMBDA: float | None = None
# The unit router's share controller (UnitRouter.steer): after each decode step, a row's log factor
# on its threshold moves by CTL_GAIN x (target - bytes not read) / target, within +-CTL_MAX.
# 0.3 was chosen on the development prompts (scripts/choose_ctl_gain.py, results/ctl_gain_dev.json):
# at sensitivity 0.5 (10% asked) 12 prompts got 7.6-12.6% each over 16 tokens and 9.2-11.7% over 64,
# against 3.0-19.9% and 4.4-19.3% with a fixed threshold; 0.5 overshoots the mean at 64 tokens.
CTL_GAIN = 0.3
CTL_MAX = 2.3  # a factor of 10 either way


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


def static_prior(impact: np.ndarray, unit_bytes: np.ndarray, blacklist: frozenset[int] | set[int],
                 candidate_share: float, bias: np.ndarray, tau0: float,
                 lam: float = 1.0, floor: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """The unit router's static prior: (candidates [2L] bool, gate bias [2L] float32).

    Candidates are the units with the lowest mean cost per byte (``impact``: mean output KL with
    the unit alone bypassed, on the predictor's training text; per byte its bypass saves), first
    to last, while their bytes stay within ``candidate_share`` of all units outside the blacklist.
    The bias is shifted so the gate's score reads predicted cost / (lam x mean cost) x tau0: under
    the threshold at its nominal tau0 exactly when this token looks cheaper than lam x the unit's
    average. The ordering is static removal's best (by impact per byte); the per-token score only
    keeps a candidate on the tokens where it predicts that bypassing costs more than usual.
    ``floor``: the predictor's KL floor (it predicts KL + floor), added to the mean cost so that
    both sides of the comparison carry it."""
    ub = np.asarray(unit_bytes, dtype=np.float64)
    impact = np.maximum(np.asarray(impact, dtype=np.float64), 0.0) + floor
    eligible = [u for u in range(len(ub)) if u // 2 not in blacklist]
    order = sorted(eligible, key=lambda u: (impact[u] / ub[u], u))
    budget = float(candidate_share) * float(ub[eligible].sum()) if eligible else 0.0
    candidates = np.zeros(len(ub), dtype=bool)
    used = 0.0
    for u in order:
        if used + ub[u] > budget * (1 + 1e-12):
            break
        candidates[u] = True
        used += ub[u]
    shifted = np.asarray(bias, dtype=np.float64) + np.log(tau0) - np.log(lam * impact)
    return candidates, shifted.astype(np.float32)


class UnitRouter:
    """The per-token unit router: attention and MLP of every block decided apart, inside the step.

    Score (unit: nats) of unit u (2l: block l's attention, 2l+1: its MLP) for this token:
    ``exp(w_u . x_u + b_u)``, the predicted KL at the output if u alone is bypassed now, from the
    unit's own normalised input x_u (unit_predictor.py). The step itself computes it and bypasses u
    when score_u < tau[b, u] for every row b (model.UnitGate; in the native kernel, inside the one
    C call). tau is the block router's, per block l applied to both its units:

        tau[b, u] = clamp(tau0 * f_density * f_entropy * f_gradient_l * f_watermark * sensitivity / 0.5,
                          0.001, 0.15)

    With the static prior (``static_prior``, ``UNIT_PRIOR_LAMBDA`` a number; the default is None, no prior) only
    candidate units may go, the ones with the lowest mean cost per byte within the candidate share
    the sensitivity asks for; the others are protected like a blacklisted block's. The gate's
    bias is shifted so the score reads this token's predicted cost relative to the unit's mean
    (x tau0), tau_weight is 1 and the sensitivity argument 0.5: a candidate goes when
    predicted / mean cost < f_density * f_entropy * f_gradient_l * f_watermark (clamped as above).

    The four factors depend only on earlier tokens, so plan() sets the thresholds before the step
    and the per-token decision needs no Python. A blacklisted block's two units never go. No probe
    steps: a score is computed fresh for every unit on every token.

    With ``UNIT_TAU_WEIGHT == "bytes"`` the threshold of unit u is also multiplied by
    bytes_u / block_bytes (0.19 for an attention, 0.75 for an MLP here): tau is then read as nats
    per block's worth of weight bytes not read, so a unit goes when its predicted cost per byte
    saved is low, which is what an equal-bytes budget rewards. ``"none"``: one tau for all units.

    **Share controller** (``target_bytes`` > 0, the engine's user-scale requests): without it the
    threshold is fixed for the request, so the share of bytes not read follows the text (3.8-21% of
    a token's bytes per prompt at sensitivity 0.5). With it every row carries ``ctl[b]``, a log
    factor on its threshold (tau ~ base x f_entropy x f_gradient x exp(ctl)), and after each step
    ctl[b] += CTL_GAIN x (target_bytes - bytes this step did not read) / target_bytes, clamped to
    +-CTL_MAX: an integral controller, so a request's running mean of bytes not read is steered to
    the target the sensitivity asks for, whatever the text. The [0.001, 0.15] clamp still bounds
    every threshold. Raw-scale runs (curves, the scale's own fit) leave it off.

    ``native=True`` (the native decode kernel): the same per-token bookkeeping (plan, after_step,
    observe_step) runs inside the C step instead (decode_native.RouterState, set on the gate), over
    this object's own arrays (entropy, grad, counters), so thresholds(), scores(), detail_records()
    and the counters read the same numbers; the caller then calls native_step() around the step and
    skips plan / after_step / observe_step. The torch and numpy kernels keep the Python path.
    """

    def __init__(self, calib: RouterCalibration, gate_weight, gate_bias, unit_bytes: np.ndarray,
                 block_bytes: int, batch: int, sensitivity: float, tau0: float, blacklist: frozenset[int],
                 f_density: np.ndarray, f_watermark: float, native: bool = False,
                 extra_protected: np.ndarray | None = None, tau_weight: np.ndarray | None = None,
                 target_bytes: float = 0.0):
        import torch

        from .model import UnitGate

        L = len(calib.impact)
        self.calib = calib
        self.n_layers = L
        # float64, contiguous, updated in place only: the native step holds pointers to them
        self.grad = np.ascontiguousarray(np.tile(np.asarray(calib.grad_ref, dtype=np.float64), (batch, 1)))
        self.entropy = np.full(batch, float(calib.entropy_ref))
        self.base = np.ascontiguousarray(tau0 * np.asarray(f_density, dtype=np.float64) * f_watermark
                                         * (sensitivity / 0.5))  # [B]
        self.f_density = f_density
        self.f_watermark = f_watermark
        self.protected = np.zeros(2 * L, dtype=bool)
        for layer in blacklist:
            self.protected[2 * layer:2 * layer + 2] = True
        if extra_protected is not None:
            self.protected |= np.asarray(extra_protected, dtype=bool)
        self.gate = UnitGate.allocate(torch.as_tensor(gate_weight), torch.as_tensor(gate_bias), batch)
        self._log_tau = self.gate.log_tau.numpy()
        self._decisions = self.gate.decisions.numpy()
        self.unit_bytes = np.asarray(unit_bytes, dtype=np.int64)
        self.block_bytes = int(block_bytes)
        self._last = np.zeros(2 * L, dtype=np.uint8)  # the previous step's decisions (flips)
        # [0] flips, [1] decisions, [2] the latest step's bytes saved, [3] its units, [4] bytes summed
        # over steps (per row that ran every step; the engine keeps its own per-row count)
        self._counts = np.zeros(5, dtype=np.int64)
        self.tau_weight = np.ascontiguousarray(self.unit_bytes / self.block_bytes if UNIT_TAU_WEIGHT == "bytes"
                                               else np.ones(2 * L), dtype=np.float64)  # [2L]
        if tau_weight is not None:
            self.tau_weight = np.ascontiguousarray(tau_weight, dtype=np.float64)
        self._ent_num = calib.entropy_ref + 0.5
        self._inv_grad_ref = 1.0 / np.maximum(calib.grad_ref, 1e-6)
        self._unit_block = np.repeat(np.arange(L), 2)
        self._protect = np.where(self.protected, -np.inf, 0.0)
        self._lt = np.zeros((batch, 2 * L))
        self.time_s = 0.0  # router time of the latest step (plan + after_step + observe), set by the engine
        self.target_bytes = float(target_bytes)  # the share controller's target per step (0: off)
        self.ctl = np.zeros(batch)  # float64, updated in place only (the native step holds a pointer)
        self._plan_active: np.ndarray | None = None  # the rows plan() saw active (degraded rows are not steered)
        self.native = bool(native)
        self.state = None
        if self.native:
            self._init_native(batch)

    def _init_native(self, batch: int) -> None:
        from . import decode_native

        L = self.n_layers
        self._active = np.ones(batch, dtype=np.uint8)
        self._row_done = np.zeros(batch, dtype=np.uint8)
        self._times = np.zeros(7)  # [0] the latest step's router seconds (C), [1] their sum, [2:] parts
        arrays = {"inv_grad_ref": np.ascontiguousarray(self._inv_grad_ref, dtype=np.float64), "base": self.base,
                  "tau_weight": self.tau_weight, "protect": self.protected.astype(np.uint8),
                  "active": self._active, "row_done": self._row_done, "unit_bytes": self.unit_bytes,
                  "entropy": self.entropy, "grad": self.grad, "last": self._last,
                  "norms": np.zeros((batch, L + 1)), "step_entropy": np.zeros(batch),
                  "bytes_saved": np.zeros(batch, dtype=np.int64), "units_bypassed": np.zeros(batch, dtype=np.int64),
                  "counts": self._counts, "times": self._times, "ctl": self.ctl}
        self.state = decode_native.RouterState(
            batch, L, arrays, entropy_ref=float(self.calib.entropy_ref), ent_alpha=ENTROPY_EMA_ALPHA,
            tau_min=TAU_MIN, tau_max=TAU_MAX, f_lo=FACTOR_LO, f_hi=FACTOR_HI, block_bytes=float(self.block_bytes),
            target_bytes=self.target_bytes, ctl_gain=CTL_GAIN, ctl_max=CTL_MAX)
        self.gate.router_state = self.state
        self._bound = None  # the engine's per-row counters the state writes into
        self._active_src = None

    # the counters, kept in one int64 array the native step also writes
    flips = property(lambda self: int(self._counts[0]), lambda self, v: self._counts.__setitem__(0, v))
    decisions = property(lambda self: int(self._counts[1]), lambda self, v: self._counts.__setitem__(1, v))
    bypassed_bytes = property(lambda self: int(self._counts[4]), lambda self, v: self._counts.__setitem__(4, v))

    @property
    def last(self) -> np.ndarray:
        """The latest step's decisions [2L] (bool)."""
        return self._last.astype(bool)

    def native_step(self, active: np.ndarray, done: list[bool], bytes_saved: np.ndarray,
                    units_bypassed: np.ndarray):
        """Before a native step: point the C state at the engine's per-row counters (int64 [B], added
        to for rows not done) and this request's active rows, and return the gate to pass to
        model.decode_step. The C call plans, decides, observes and counts; afterwards
        ``last_step_bytes()`` and ``native_time_s()`` read what it did."""
        if self._bound is not bytes_saved:
            self.state.rebind("bytes_saved", bytes_saved)
            self.state.rebind("units_bypassed", units_bypassed)
            self._bound = bytes_saved
        if self._active_src is not active:
            self._active[:] = active
            self._active_src = active
        if True in done:  # rows only ever finish: the copy is paid after the first one does
            self._row_done[:] = done
        return self.gate

    def last_step_bytes(self) -> int:
        """Weight bytes the latest step did not read (per row)."""
        return int(self._counts[2])

    def native_time_s(self) -> float:
        """Router seconds the C step measured in its latest call (plan, gate, norms, entropy, observe)."""
        return float(self._times[0])

    def thresholds(self, state: tuple[np.ndarray, np.ndarray] | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """tau [B, 2L] (nats), f_entropy [B], f_gradient [B, L]; from ``state`` = (entropy, grad) when
        given (a snapshot taken before a native step, which updates both inside the call)."""
        entropy, grad = (self.entropy, self.grad) if state is None else state
        f_ent = entropy_factor(entropy, self.calib.entropy_ref)
        f_grad = gradient_factor(grad, self.calib.grad_ref)
        tau = np.clip((self._steered_base() * f_ent)[:, None] * f_grad, TAU_MIN, TAU_MAX)
        return np.clip(np.repeat(tau, 2, axis=1) * self.tau_weight, TAU_MIN, TAU_MAX), f_ent, f_grad

    def _steered_base(self) -> np.ndarray:
        return self.base * np.exp(self.ctl) if self.target_bytes > 0 else self.base

    def plan(self, active: np.ndarray):
        """Set this step's thresholds in the gate and return it (model.decode_step(gate=...)).
        ``active`` [B] False for a degraded row: it vetoes every bypass in the batch.
        The same numbers as thresholds(), in fewer numpy calls (this runs every token)."""
        self._plan_active = np.asarray(active, bool)
        if not active.all():
            self._log_tau[:] = -np.inf
            return self.gate
        f_ent = np.clip(self._ent_num / (self.entropy + 0.5), FACTOR_LO, FACTOR_HI)
        excess = np.maximum(self.grad * self._inv_grad_ref - 1.0, 0.0)
        f_grad = np.maximum(1.0 / (1.0 + 2.0 * excess), FACTOR_LO)  # <= 1 by construction
        tau = np.clip((self._steered_base() * f_ent)[:, None] * f_grad, TAU_MIN, TAU_MAX)
        np.log(np.clip(tau[:, self._unit_block] * self.tau_weight, TAU_MIN, TAU_MAX), out=self._lt)
        self._lt += self._protect  # -inf on blacklisted units
        self._log_tau[:] = self._lt
        return self.gate

    def after_step(self, done: Sequence[bool] | None = None) -> tuple[np.ndarray, int]:
        """What the step decided: bypassed units [2L] (bool) and the weight bytes not read per row;
        with the share controller on, steers the rows not ``done`` (``steer``)."""
        by = self._decisions.astype(bool)
        saved = int(self.unit_bytes[by].sum())
        c = self._counts
        c[0] += int((by != self._last.astype(bool)).sum())
        c[1] += by.size
        c[2], c[3] = saved, int(by.sum())
        c[4] += saved
        self._last[:] = by
        if self.target_bytes > 0:
            self.steer(saved, done)
        return by, saved

    def steer(self, saved: int, done: Sequence[bool] | None = None) -> None:
        """The share controller's update after a step that did not read ``saved`` bytes (the C
        step does the same in router_finish): rows not done and not degraded move their log
        factor towards the target."""
        live = np.ones(len(self.ctl), bool) if done is None else ~np.asarray(done, bool)
        if self._plan_active is not None:
            live &= self._plan_active
        step = CTL_GAIN * (self.target_bytes - saved) / self.target_bytes
        self.ctl[live] = np.clip(self.ctl[live] + step, -CTL_MAX, CTL_MAX)

    def scores(self) -> np.ndarray:
        """The last step's scores in nats [B, 2L] (0 for a unit a fixed flag bypassed)."""
        return np.exp(self.gate.scores.numpy())

    def observe(self, norms: np.ndarray, update_norms: np.ndarray, entropy: np.ndarray, ran: np.ndarray) -> None:
        """Fold in the step's stream norms [B, L+1] and entropy [B]; ``ran`` [L]: blocks where a unit ran."""
        grad = np.abs(np.log(np.maximum(norms[:, 1:], 1e-9)) - np.log(np.maximum(norms[:, :-1], 1e-9)))
        self.grad[:, ran] = grad[:, ran]
        self.entropy[:] = ENTROPY_EMA_ALPHA * entropy + (1 - ENTROPY_EMA_ALPHA) * self.entropy  # in place

    def observe_step(self, stream, logits, bypassed: np.ndarray) -> None:
        """Fold in a finished step: ``stream`` [L+1, B, D] and ``logits`` [B, V] (torch, CPU),
        ``bypassed`` [2L] the units it bypassed (a block where either unit ran updates its gradient)."""
        s = stream.numpy()
        norms = np.sqrt(np.einsum("lbh,lbh->bl", s, s))  # [B, L+1]
        z = logits.numpy()
        # Preallocated buffers and BLAS dots: numpy's own reductions over 49k floats cost ~25 us
        # each here, a dot ~5 (measured alone: 0.16 -> 0.14 ms for this method).
        bufs = getattr(self, "_entropy_bufs", None)
        if bufs is None or bufs[0].shape != z.shape:
            bufs = self._entropy_bufs = (np.empty_like(z), np.empty_like(z), np.ones(z.shape[1], z.dtype))
        shifted, e, ones = bufs
        np.subtract(z, z.max(axis=-1, keepdims=True), out=shifted)
        np.exp(shifted, out=e)
        entropy = np.empty(z.shape[0])
        for b in range(z.shape[0]):
            total = float(e[b] @ ones)
            entropy[b] = np.log(total) - float(e[b] @ shifted[b]) / total  # nats, -sum p log p
        self.observe(norms, None, entropy, ~(bypassed[0::2] & bypassed[1::2]))

    def detail_records(self, bypassed: np.ndarray, token: int,
                       state: tuple[np.ndarray, np.ndarray] | None = None) -> list[str]:
        """DETAILED log lines for the step just run: one per row and unit, with its predicted cost
        (nats), threshold, the four factors, the bytes it saved and the decision. ``state``: the
        (entropy, grad) the step planned from, when it has already folded in its own observation."""
        tau, f_ent, f_grad = self.thresholds(state)
        scores = self.scores()
        lines = []
        for b in range(scores.shape[0]):
            for u in range(2 * self.n_layers):
                layer = u // 2
                decision = "KEEP_BLACKLIST" if self.protected[u] else ("BYPASS" if bypassed[u] else "KEEP")
                lines.append(json.dumps({
                    "event": "unit", "request": b, "token": token, "block": layer,
                    "unit": "attention" if u % 2 == 0 else "mlp",
                    "score": round(float(scores[b, u]), 6), "threshold": round(float(tau[b, u]), 6),
                    "f_density": round(float(self.f_density[b]), 4), "f_entropy": round(float(f_ent[b]), 4),
                    "f_gradient": round(float(f_grad[b, layer]), 4), "f_watermark": round(self.f_watermark, 4),
                    "bytes_saved": int(self.unit_bytes[u]) if bypassed[u] else 0, "decision": decision,
                }))
        return lines
