"""``DetectorCalibration``: the numbers the model-level checks compare against, measured on
normal text, with its JSON form (``to_dict`` / ``from_dict``, schema-versioned).

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch (the
harness and tests import this without a model), or modules of this package other than
.model_checks. Only stdlib and numpy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .model_checks import _finite, loss_anomaly_reason, norm_anomaly_reason

# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class DetectorCalibration:
    """The numbers the model-level checks compare against, measured on normal text.

    ``nll_mean``/``nll_std``: mean and sample std over calibration prompts of each prompt's
    mean per-token NLL (nats). ``norm_lo``/``norm_hi``: per block, the smallest and largest
    hidden-state norm seen. ``n_prompts``: how many prompts these came from (0: unknown).
    """

    nll_mean: float
    nll_std: float
    norm_lo: tuple[float, ...]
    norm_hi: tuple[float, ...]
    n_prompts: int = 0

    SCHEMA_VERSION = 1

    def __post_init__(self) -> None:
        _finite("nll_mean", self.nll_mean)
        if _finite("nll_std", self.nll_std) < 0:
            raise ValueError(f"nll_std must be >= 0, got {self.nll_std!r}")
        object.__setattr__(self, "nll_mean", float(self.nll_mean))
        object.__setattr__(self, "nll_std", float(self.nll_std))
        lo = tuple(float(v) for v in self.norm_lo)
        hi = tuple(float(v) for v in self.norm_hi)
        object.__setattr__(self, "norm_lo", lo)
        object.__setattr__(self, "norm_hi", hi)
        # Validates lengths, signs and ordering with the same messages the check uses.
        norm_anomaly_reason(lo, lo, hi)
        if isinstance(self.n_prompts, bool) or not isinstance(self.n_prompts, int) or self.n_prompts < 0:
            raise ValueError(f"n_prompts must be an integer >= 0, got {self.n_prompts!r}")

    @classmethod
    def from_samples(
        cls, prompt_nlls: Sequence[float], prompt_block_norms: Sequence[Sequence[float]]
    ) -> "DetectorCalibration":
        """Build from per-prompt measurements: mean NLLs, and per-prompt per-block norms."""
        nll = np.asarray(prompt_nlls, dtype=np.float64).reshape(-1)
        if nll.size == 0:
            raise ValueError("prompt_nlls is empty: calibration needs at least one prompt")
        norms = np.asarray(prompt_block_norms, dtype=np.float64)
        if norms.ndim != 2 or norms.shape[0] != nll.size:
            raise ValueError(
                f"prompt_block_norms must be (n_prompts={nll.size}, n_blocks), got shape {norms.shape}"
            )
        if not (np.all(np.isfinite(nll)) and np.all(np.isfinite(norms))):
            raise ValueError("calibration measurements contain NaN or inf")
        std = float(nll.std(ddof=1)) if nll.size > 1 else 0.0
        return cls(
            nll_mean=float(nll.mean()),
            nll_std=std,
            norm_lo=tuple(norms.min(axis=0).tolist()),
            norm_hi=tuple(norms.max(axis=0).tolist()),
            n_prompts=int(nll.size),
        )

    def loss_reason(self, mean_nll: float, z: float = 4.0) -> str | None:
        """``loss_anomaly_reason`` against this calibration."""
        return loss_anomaly_reason(mean_nll, self.nll_mean, self.nll_std, z)

    def norm_reason(self, block_norms: Sequence[float], slack: float = 1.5) -> str | None:
        """``norm_anomaly_reason`` against this calibration."""
        return norm_anomaly_reason(block_norms, self.norm_lo, self.norm_hi, slack)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists, floats) with a schema version."""
        d = asdict(self)
        d["norm_lo"] = list(self.norm_lo)
        d["norm_hi"] = list(self.norm_hi)
        d["schema_version"] = self.SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DetectorCalibration":
        """Inverse of ``to_dict``; names any missing or unknown key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"DetectorCalibration data must be a mapping, got {type(data).__name__}")
        version = data.get("schema_version", cls.SCHEMA_VERSION)
        if version != cls.SCHEMA_VERSION:
            raise ValueError(
                f"DetectorCalibration schema_version {version!r} is not {cls.SCHEMA_VERSION}"
            )
        required = {"nll_mean", "nll_std", "norm_lo", "norm_hi"}
        allowed = required | {"n_prompts", "schema_version"}
        missing = sorted(required - set(data))
        if missing:
            raise ValueError(f"DetectorCalibration data lacks key(s) {missing}")
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"DetectorCalibration data has unknown key(s) {unknown}")
        for key in ("norm_lo", "norm_hi"):
            if isinstance(data[key], (str, bytes)) or not isinstance(data[key], Sequence):
                raise ValueError(f"DetectorCalibration {key} must be a list of numbers, got {data[key]!r}")
        return cls(
            nll_mean=data["nll_mean"],
            nll_std=data["nll_std"],
            norm_lo=tuple(data["norm_lo"]),
            norm_hi=tuple(data["norm_hi"]),
            n_prompts=data.get("n_prompts", 0),
        )
