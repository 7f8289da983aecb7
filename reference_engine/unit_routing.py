"""The unit router's side of the engine: its per-weights artefacts (the predictor and its maps,
the bytes each unit's bypass saves, the sensitivity scale), building the router for a request,
and one decode step with attention and MLP decided apart (by the router, or by fixed per-unit
static flags).

``Engine`` inherits ``UnitRouting``; the methods read the engine's weights, kernel and caches.
Must not import the harness (``rsp_bench``) or ``engine.py`` (which imports this).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch

from . import calibration as calib_mod
from .config import PruningConfig
from .generation import PromptRow
from .model import decode_step
from .model_loading import cache_root
from .router import RouterCalibration, density_factor, sample_watermark, watermark_factor

log = logging.getLogger("reference_engine")


class UnitRouting:
    """Mixed into ``Engine``: everything the unit router needs from it."""

    _raw_unit_scale: bool = False

    def unit_bytes(self) -> tuple[np.ndarray, int]:
        """Weight bytes a bypass of each unit does not read [2L] (net of the unit's map, where it
        has one), and one whole block's bytes."""
        from .unit_predictor import unit_bytes

        if getattr(self, "_unit_bytes", None) is None:
            self._unit_bytes = unit_bytes(self.weights, self.unit_maps())
        return self._unit_bytes

    def unit_maps(self) -> list:
        """Per unit, the low-rank stand-in its bypass takes, or None (identity): the predictor's."""
        return self.unit_predictor().bypass_maps()

    def unit_predictor(self, progress: Callable[[str], None] | None = None, force: bool = False):
        """The unit router's predictor: packaged copy, else cache, else trained now and cached."""
        from . import unit_predictor as up

        if getattr(self, "_unit_predictor", None) is not None and not force:
            return self._unit_predictor
        found = None if force else self._packaged_or_cached(lambda where: up.load(where, self.weights_sha256))
        if found is None:
            found = up.train(self.weights, self.encode, self.eos_id, self.weights_sha256, progress,
                             kernel=self.decode_kernel)
            up.save(found, cache_root())
        self._unit_predictor = found
        self._unit_bytes = None  # net of this predictor's maps
        return found

    def _make_unit_router(self, rows: list[PromptRow], cfg: PruningConfig, cal: calib_mod.Calibration):
        from . import router as router_mod
        from . import unit_predictor as up
        from .router import UnitRouter

        pred = self.unit_predictor()
        rc = RouterCalibration(impact=cal.impact, rel_mean=np.asarray(cal.rel_mean),
                               grad_ref=np.asarray(cal.grad_ref), entropy_ref=cal.entropy_ref,
                               density_ref=cal.density_ref)
        f_density = np.array([density_factor(self._density(r.prompt, r.ids), cal.density_ref) for r in rows])
        wm = sample_watermark()[0] if cfg.hardware_watermark is None else cfg.hardware_watermark
        ub, bb = self.unit_bytes()
        if self._raw_unit_scale:  # curves and the scale's own fit: the fixed threshold, no controller
            internal, target = cfg.sensitivity, 0.0
        else:  # the user scale: the calibrated threshold to start from, the controller holds the share
            from .sensitivity_scale import decode_bytes_per_token

            scale = self.sensitivity_scale()
            internal = scale.internal_for(cfg.sensitivity)
            target = scale.target_share(cfg.sensitivity) * decode_bytes_per_token(self)
        blacklist = cfg.blacklist_for(self.dims.n_layers)
        native = self.decode_kernel == "native"
        lam = router_mod.UNIT_PRIOR_LAMBDA
        if lam is None:  # the free router: ``internal`` scales its threshold (nats per block's worth)
            ridges, weight, bias = pred.ridges_for(internal)  # deep budgets score with the ridges on more text
            router = UnitRouter(rc, torch.from_numpy(weight), torch.from_numpy(bias), ub, bb, len(rows),
                                internal, cfg.tau0, blacklist, f_density, watermark_factor(wm), native=native,
                                target_bytes=target)
        else:  # ``internal`` is the share of unit bytes that are candidates; the threshold stays nominal
            ridges = "shallow"
            candidates, bias = router_mod.static_prior(pred.impact, ub, blacklist, internal, pred.bias, cfg.tau0, lam,
                                                      floor=up.KL_FLOOR)
            router = UnitRouter(rc, torch.from_numpy(pred.weight), torch.from_numpy(bias), ub, bb, len(rows),
                                0.5, cfg.tau0, blacklist, f_density, watermark_factor(wm), native=native,
                                extra_protected=~candidates, tau_weight=np.ones(len(ub)))
        router.internal_sensitivity = internal
        router.ridges = ridges
        return router

    def router_for(self, cfg: PruningConfig) -> tuple[str, str | None]:
        """The router a lossy request runs, and why it is not the one ``cfg`` asks for (None when
        it is). The unit router needs its predictor; training one takes about half an hour, so a
        request never waits for it: without one, the block router runs, with one WARNING per
        process and the reason in every request's stats."""
        if cfg.router != "unit" or self.unit_predictor_available():
            return cfg.router, None
        reason = (f"no unit-router predictor for weights {self.weights_sha256[:16]} "
                  "(`rsp-bench calibrate` trains one): the block router ran")
        if not getattr(self, "_router_fallback_warned", False):
            self._router_fallback_warned = True
            log.warning("router: %s; every lossy request of this process does the same until then", reason)
        return "block", reason

    def unit_predictor_available(self) -> bool:
        """Whether the unit router can run without training its predictor now (about half an hour
        of CPU for the embedded model's size): loaded, packaged or cached for these weights."""
        from . import unit_predictor as up

        if getattr(self, "_unit_predictor", None) is not None:
            return True
        return self._packaged_or_cached(lambda where: up.predictor_path(where, self.weights_sha256).is_file()) is not None

    def sensitivity_scale(self, progress: Callable[[str], None] | None = None, force: bool = False):
        """What a user sensitivity means for the unit router (sensitivity_scale.py): packaged
        copy, else cache, else fitted now (a few minutes) and cached."""
        from . import sensitivity_scale as ss

        if getattr(self, "_sensitivity_scale", None) is not None and not force:
            return self._sensitivity_scale
        found = None if force else self._packaged_or_cached(lambda where: ss.load(where, self.weights_sha256))
        if found is None:
            log.warning("no sensitivity scale for weights %s: fitting one now on %d prompts (a few minutes)",
                        self.weights_sha256[:16], len(ss.TUNE_PROMPTS))
            found = ss.fit(self, progress=progress)
            ss.save(found, cache_root())
        self._sensitivity_scale = found
        return found

    @contextmanager
    def raw_unit_scale(self) -> Iterator[None]:
        """For calibration and curves only: within it the unit router takes ``sensitivity`` as
        its internal scale directly, not through the sensitivity scale: the share of unit bytes
        that are candidates (router.static_prior), or with no prior (router.UNIT_PRIOR_LAMBDA
        None) the threshold scale (tau ~ tau0 * sensitivity / 0.5)."""
        before, self._raw_unit_scale = self._raw_unit_scale, True
        try:
            yield
        finally:
            self._raw_unit_scale = before

    def _unit_step(self, router, static_attn, static_mlp, cache, tok, next_pos, key_valid, stream, active, done,
                   bytes_saved, units_bypassed, executed_trace, detail, detail_lines, step, rows, block_bytes,
                   static_saved) -> torch.Tensor:
        """One decode step with units decided apart: by the unit router (its gate decides inside
        the step) or by fixed per-unit static flags. Updates the per-row byte and unit counts;
        ``router.time_s`` is this step's router time (plan + after_step + observe); on the native
        kernel (router.native) the C call's measured router time plus the Python spent here for it."""
        if router is None:
            not_done = ~np.array(done)
            logits = decode_step(self.weights, cache, tok, next_pos, key_valid, None, self._bypass, None,
                                 kernel=self.decode_kernel, keep_attn=static_attn, keep_mlp=static_mlp,
                                 unit_bypass=self.unit_maps())
            n_units = sum(not k for k in static_attn) + sum(not k for k in static_mlp)
            bytes_saved += np.where(not_done, static_saved, 0)
            units_bypassed += np.where(not_done, n_units, 0)
            executed_trace.append(self.dims.n_layers - static_saved / block_bytes)
            return logits
        if router.native:  # plan, decide, observe and count inside the C call
            t0 = time.perf_counter()
            gate = router.native_step(active, done, bytes_saved, units_bypassed)
            t1 = time.perf_counter()
            pre = (router.entropy.copy(), router.grad.copy()) if detail else None  # logging, not router time
            logits = decode_step(self.weights, cache, tok, next_pos, key_valid, None, self._bypass, None,
                                 kernel=self.decode_kernel, gate=gate,  # no stream: C takes the norms it needs
                                 unit_bypass=self.unit_maps())
            t2 = time.perf_counter()
            executed_trace.append(self.dims.n_layers - router.last_step_bytes() / block_bytes)
            router.time_s = (t1 - t0) + router.native_time_s() + (time.perf_counter() - t2)
            if detail:
                detail_lines.extend(router.detail_records(router.last, step + 1, pre))
            return logits
        not_done = ~np.array(done)
        t0 = time.perf_counter()
        gate = router.plan(active)
        t1 = time.perf_counter()
        logits = decode_step(self.weights, cache, tok, next_pos, key_valid, None, self._bypass, stream,
                             kernel=self.decode_kernel, gate=gate, unit_bypass=self.unit_maps())
        t2 = time.perf_counter()
        by, saved = router.after_step(done)
        bytes_saved += np.where(not_done, saved, 0)
        units_bypassed += np.where(not_done, int(by.sum()), 0)
        executed_trace.append(self.dims.n_layers - saved / block_bytes)
        if detail:  # before observe: the thresholds this step used
            t3 = time.perf_counter()
            detail_lines.extend(router.detail_records(by, step + 1))
            t2 += time.perf_counter() - t3  # logging is not router time
        router.observe_step(stream, logits, by)
        router.time_s = (t1 - t0) + (time.perf_counter() - t2)
        return logits
