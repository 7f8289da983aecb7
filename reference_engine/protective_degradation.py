"""The engine's side of protective degradation (DESIGN.md section 2): for every lossy request,
before its first decode step, the text rules and the model-level score (``ood.py``) judge each
prompt from the prefill's own hidden states, and the score's loss and entropy rows go through the
output matrix in the same pass as the prompt's last-position logits; plus the detector's
per-weights artefacts (the fitted score, the instruction probe, the chat template's ends, the vocabulary's pieces), the
request rule's words (``degradation.request_words``), the fallback checks for weights with no
fitted score, and the suspension used to measure what a detector's errors cost.

``Engine`` inherits ``ProtectiveDegradation``; the methods read the engine's weights, kernel,
tokenizer and caches. Must not import the harness (``rsp_bench``) or ``engine.py`` (which
imports this).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from . import calibration as calib_mod
from . import degradation, ood
from .degradation import instruction_probe as probe_mod
from .degradation import language_rule as lang_rule
from .degradation import request_words
from .generation import PromptRow
from .model import logits_from_hidden, rms_norm

log = logging.getLogger("reference_engine")

LOSS_SAMPLE_POSITIONS = 64  # prompt positions scored for the loss check (the LM head is costly)


class ProtectiveDegradation:
    """Mixed into ``Engine``: the degradation check and what it needs."""

    _degradation_suspended: bool = False

    def _check_degradation(self, rows: list[PromptRow], hidden: list[torch.Tensor], cal: calib_mod.Calibration,
                           last_logits: bool = False) -> torch.Tensor | None:
        """Text rules, then the model-level out-of-distribution score (ood.py) from the prefill's
        own hidden states: any firing turns pruning off for that row.

        With ``last_logits`` it also returns the prompts' last-position logits [B, V], which the
        prefill then left to it: the score's loss and entropy rows go through the output matrix
        in the same pass (on the native kernel the matrix is streamed once for all rows), so the
        check adds their arithmetic to TTFT, not another read of the matrix. Each row's logits are
        the bits the prefill would have computed alone."""
        w = self.weights
        final = hidden[-1]
        S = final.shape[1]
        det = None if self._degradation_suspended else self.ood_detector()
        scored: list[tuple[int, PromptRow, int, int, torch.Tensor]] = []
        for b, r in enumerate(rows):
            if self._degradation_suspended:
                break
            reason = degradation.text_anomaly_reason(r.prompt)
            if reason is None and det is not None:
                lo, hi = ood.content_span(r.ids, *self._template_ends())
                scored.append((b, r, lo, hi, ood.scored_positions(lo, hi)))
            elif reason is None:
                reason = self._legacy_model_checks(b, r, hidden, cal)
            r.degraded_reason = r.degraded_reason or reason
        last = rms_norm(final[:, -1], w.final_norm, w.dims.rms_eps) if last_logits else None
        check = [rms_norm(final[b, S - len(r.ids) + pred], w.final_norm, w.dims.rms_eps)
                 for b, r, _, _, pred in scored if len(pred)]
        logits, check_logits = self._head_pass(last, torch.cat(check) if check else None)
        at = 0
        rule = self.language_rule() if scored else None
        for b, r, lo, hi, pred in scored:
            nll_ent = (ood.loss_and_entropy(check_logits[at:at + len(pred)], [r.ids[int(q) + 1] for q in pred])
                       if len(pred) else (np.zeros(0), np.zeros(0)))
            at += len(pred)
            reason = ood.judge(det, w, hidden, b, S - len(r.ids), r.ids, lo, hi, len(r.prompt),
                               self._pieces, self._byte_ids(),
                               lambda r=r, lo=lo, hi=hi: self._request_tokens(r.prompt, r.ids, lo, hi), nll_ent,
                               (lambda stats, r=r: rule.margin_for(r.prompt, stats.pooled)) if rule else None,
                               rule.min_coverage if rule else 1.0, self.instruction_probe())
            r.degraded_reason = r.degraded_reason or reason
        return logits

    def _head_pass(self, last: torch.Tensor | None, check: torch.Tensor | None
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits of the prompts' last rows and of the check's rows (final-normed, [B, D] and
        [m, D]). On the native kernel one GEMV call streams the output matrix once for both, each
        row the bits it has alone; F.linear's sums may depend on the row count, so there the
        prompts' rows get a call of their own, the one the prefill would have made."""
        head = self._head()
        if head is None:
            return (None if last is None else F.linear(last, self.weights.lm_head),
                    None if check is None else F.linear(check, self.weights.lm_head))
        parts = [x for x in (last, check) if x is not None]
        if not parts:
            return None, None
        out = head(torch.cat(parts))
        n = 0 if last is None else len(last)
        return (out[:n] if last is not None else None), (out[n:] if check is not None else None)

    def _head(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The output matrix's product for final-normed rows [m, D]: the native kernel's GEMV when
        the decode step is native (a prompt's first token is then computed as every later one is,
        each row the same bits whatever the row count), else None (F.linear)."""
        if self.decode_kernel != "native":
            return None
        from .decode_native import gemv

        lm_head = self.weights.lm_head
        return lambda x: gemv(lm_head, x)

    @contextmanager
    def degradation_suspended(self) -> Iterator[None]:
        """For measurement only, never on a request path: within it no row degrades, so a caller
        sees what pruning would do to input the detector protects (``rsp-bench degradation``
        reports the cost of each of its errors this way). Not thread-safe, like the engine."""
        before, self._degradation_suspended = self._degradation_suspended, True
        try:
            yield
        finally:
            self._degradation_suspended = before

    def _per_weights_file(self, path_of: Callable[[Path, str], Path],
                          load: Callable[[Path, str], object | None]) -> tuple[object, Path] | None:
        """(what ``load`` reads, its path) from the packaged data, else the user cache, else None."""
        def find(where: Path) -> tuple[object, Path] | None:
            path = path_of(where, self.weights_sha256)
            found = load(path, self.weights_sha256)
            return (found, path) if found is not None else None

        return self._packaged_or_cached(find)

    def ood_detector(self) -> ood.OODDetector | None:
        """The fitted out-of-distribution score for these weights: packaged copy, else cache
        (``scripts/calibrate_ood.py`` fits one), else None (then the coarser mean-loss and norm
        checks stand in, with one WARNING per process). ``detector_info`` says which ran."""
        if getattr(self, "_ood", None) is None:
            found = self._per_weights_file(ood.detector_path, ood.load)
            if found is None:
                ood.warn_fallback_once(log, self.weights_sha256)
            self._ood = found[0] if found is not None else False
            self._detector = ood.describe(found[1] if found else None, Path(__file__).parent / "data")
        return self._ood or None

    def language_rule(self) -> lang_rule.LanguageRule | None:
        """The language rule for these weights (``degradation.language_rule``): packaged copy, else
        cache, else None (no prompt gets a margin; ``detector_info`` says so)."""
        if getattr(self, "_language_rule", None) is None:
            found = self._per_weights_file(lang_rule.rule_path, lang_rule.load)
            self._language_rule = found[0] if found is not None else False
            self._language_rule_file = found[1].name if found is not None else None
        return self._language_rule or None

    def instruction_probe(self) -> probe_mod.InstructionProbe | None:
        """The instruction probe for these weights (``degradation.instruction_probe``): packaged
        copy, else cache, else None (the probe does not run; ``detector_info`` says so)."""
        if getattr(self, "_instruction_probe", None) is None:
            found = self._per_weights_file(probe_mod.probe_path, probe_mod.load)
            self._instruction_probe = found[0] if found is not None else False
            self._instruction_probe_file = found[1].name if found is not None else None
        return self._instruction_probe or None

    def detector_name(self) -> str:
        """The detector that judges this engine's requests (``ood.describe``'s "detector"): what
        every request's stats carry. ``detector_info`` has the rest, and hashes the text rules."""
        self.ood_detector()
        return self._detector["detector"]

    def detector_info(self) -> dict:
        """Which protective-degradation detector runs for these weights (``ood.describe``), which
        language rule and instruction probe (their files, or None) and which text rules
        (``degradation.text_rules_fingerprint``)."""
        self.ood_detector()
        self.language_rule()
        self.instruction_probe()
        return {**self._detector, "language_rule": self._language_rule_file,
                "instruction_probe": self._instruction_probe_file,
                "text_rules": degradation.text_rules_fingerprint()}

    def _template_ends(self) -> tuple[list[int], list[int]]:
        if getattr(self, "_ends", None) is None:
            self._ends = ood.template_ends(self.encode)
        return self._ends

    def _pieces(self) -> request_words.Pieces:
        if getattr(self, "_piece_table", None) is None:
            self._piece_table = request_words.pieces(self.tokenizer.decode, self.dims.vocab)
        return self._piece_table

    def _request_tokens(self, prompt: str, ids: Sequence[int], lo: int, hi: int) -> list[int] | None:
        """Indices into ``ids`` of the prompt's request words, found in its text and mapped through
        the tokenizer's character offsets (``request_words.text_request_tokens``). The text is the
        prompt as given, else the content decoded from ``ids[lo:hi]`` (a teacher-forced row holds
        the templated text), whichever tokenizes alone to exactly those ids; None when neither
        does or the tokenizer gives no offsets (then vocabulary pieces stand in)."""
        content = list(ids[lo:hi])
        for text in (prompt, None):
            if text is None:
                text = self.tokenizer.decode(content)
            try:
                enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            except (NotImplementedError, ValueError, TypeError):
                return None
            if list(enc["input_ids"]) == content:
                return [lo + i for i in request_words.text_request_tokens(text, enc["offset_mapping"])]
        return None

    def _byte_ids(self) -> frozenset[int]:
        if getattr(self, "_bytes", None) is None:
            self._bytes = ood.byte_piece_ids(self.tokenizer.decode, self.dims.vocab)
        return self._bytes

    def _legacy_model_checks(self, b: int, r: PromptRow, hidden: list[torch.Tensor],
                             cal: calib_mod.Calibration) -> str | None:
        """Mean prompt loss (z = 4) and hidden-norm band: what a model without a fitted detector gets."""
        w, S, n = self.weights, hidden[0].shape[1], len(r.ids)
        reason = None
        if n > 1:
            # Score an evenly spaced sample of positions: the full LM head over a long prompt
            # would cost more than the decode it protects.
            pos = torch.linspace(S - n, S - 2, steps=min(LOSS_SAMPLE_POSITIONS, n - 1)).round().long().unique()
            logp = torch.log_softmax(logits_from_hidden(w, hidden[-1][b, pos]).double(), -1)
            targets = torch.tensor(r.ids)[pos - (S - n) + 1]
            nll = float(-logp.gather(-1, targets[:, None]).mean())
            reason = degradation.loss_anomaly_reason(nll, cal.nll_mean, cal.nll_std)
        if reason is None:
            norms = [float(h[b, S - n:].norm(dim=-1).max()) for h in hidden[1:]]
            lows = [float(h[b, S - n:].norm(dim=-1).min()) for h in hidden[1:]]
            reason = degradation.norm_anomaly_reason(norms, cal.norm_lo, cal.norm_hi) or \
                degradation.norm_anomaly_reason(lows, cal.norm_lo, cal.norm_hi)
        return reason
