"""The work model of one decode step: a Llama-family decoder's shape (``ModelShape``), the
operators of one step in launch order with FLOPs, bytes and kernel counts (``decode_step_ops``),
and the weight bytes a token reads (``bytes_per_token``, ``cpu_ideal_speedup``: the achieved-
bandwidth figure, gpt-fast style, and the speed-up skipped bytes would give a bandwidth-bound CPU).

Must NOT import transformers, torch or the engine: it prices a shape, not a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rsp_bench.errors import HarnessInputError

# Kernels an eager PyTorch decode loop launches per operator. Assumption, to be checked
# against a measured kernel trace of the engine (override with ``kernel_counts=``):
# - an RMSNorm written as x * rsqrt(mean(x^2) + eps) * w is pow, mean, add, rsqrt, mul, mul;
# - rotary embedding of q and k: per tensor mul(cos), rotate_half (neg + cat), mul(sin), add;
# - the KV cache write is one index_copy_ for K and one for V;
# - attention is one fused SDPA kernel; silu * up is two; each linear is one cuBLAS call;
# - greedy sampling is an argmax plus the device-to-host copy of the token.
# In a launch-bound step (small model, batch 1) these counts, not the bytes, set the speed.
EAGER_KERNELS: dict[str, int] = {
    "embedding": 1,
    "attn_norm": 6,
    "qkv": 1,
    "rope": 10,
    "kv_write": 2,
    "attention": 1,
    "o_proj": 1,
    "attn_add": 1,
    "mlp_norm": 6,
    "gate_up": 1,
    "silu_mul": 2,
    "down": 1,
    "mlp_add": 1,
    # a bypassed block still writes K/V for the token: norm its input, project, rotate k
    "kv_norm": 6,
    "kv_proj": 1,
    "rope_k": 5,
    "bypass_linear": 3,  # two thin GEMVs (rank-r factors) and the residual add
    "final_norm": 6,
    "lm_head": 1,
    "sampling": 2,
}

BYPASS_KINDS = ("identity", "linear")


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-family decoder that decide its decode cost."""

    n_layers: int
    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool

    def __post_init__(self) -> None:
        for field in ("n_layers", "hidden", "intermediate", "n_heads", "n_kv_heads",
                      "head_dim", "vocab"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HarnessInputError(
                    f"model shape: {field} must be a positive integer, got {value!r}"
                )
        if self.n_heads % self.n_kv_heads:
            raise HarnessInputError(
                f"model shape: n_heads={self.n_heads} is not a multiple of "
                f"n_kv_heads={self.n_kv_heads}"
            )

    @classmethod
    def from_hf_config(cls, cfg: Mapping | object) -> "ModelShape":
        """Read a Llama-style Hugging Face config (a dict or a config object)."""
        def get(key: str, default: object = KeyError) -> object:
            value = cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)
            if value is None:
                if default is KeyError:
                    names = cfg if isinstance(cfg, Mapping) else getattr(cfg, "__dict__", {})
                    have = sorted(str(k) for k in names if not str(k).startswith("_"))
                    raise HarnessInputError(
                        f"model config lacks {key!r} (a Llama-style config needs it); "
                        f"keys present: {have}"
                    )
                return default
            return value

        try:
            n_heads = int(get("num_attention_heads"))
            hidden = int(get("hidden_size"))
            return cls(
                n_layers=int(get("num_hidden_layers")),
                hidden=hidden,
                intermediate=int(get("intermediate_size")),
                n_heads=n_heads,
                n_kv_heads=int(get("num_key_value_heads", n_heads)),
                head_dim=int(get("head_dim", hidden // n_heads)),
                vocab=int(get("vocab_size")),
                # LlamaConfig's own default is untied
                tied_embeddings=bool(get("tie_word_embeddings", False)),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, HarnessInputError):
                raise
            raise HarnessInputError(f"model config has a non-integer dimension: {exc}") from exc

    @classmethod
    def smollm2_135m(cls) -> "ModelShape":
        """SmolLM2-135M(-Instruct), the embedded model (DESIGN.md section 5)."""
        return cls(n_layers=30, hidden=576, intermediate=1536, n_heads=9, n_kv_heads=3,
                   head_dim=64, vocab=49152, tied_embeddings=True)

    @classmethod
    def llama_7b(cls) -> "ModelShape":
        """A Llama-2-7B-like shape: the 'larger Llama-shaped model' of the speed suites."""
        return cls(n_layers=32, hidden=4096, intermediate=11008, n_heads=32, n_kv_heads=32,
                   head_dim=128, vocab=32000, tied_embeddings=False)

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def attention_weights(self) -> int:
        """Weights of q, k, v and o projections of one block."""
        return self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden

    def mlp_weights(self) -> int:
        """Weights of gate, up and down projections of one block."""
        return 3 * self.hidden * self.intermediate

    def block_weights(self) -> int:
        """All weights of one block, its two RMSNorm vectors included."""
        return self.attention_weights() + self.mlp_weights() + 2 * self.hidden

    def bypassed_block_weights(self, bypass_kind: str = "identity", bypass_rank: int = 0) -> int:
        """Weights a bypassed block still reads: input norm and K/V projections (the
        engine writes K/V for bypassed blocks), plus the rank-r map of a linear bypass."""
        kind = _check_bypass(bypass_kind, bypass_rank, self)
        extra = 2 * self.hidden * bypass_rank if kind == "linear" else 0
        return self.hidden + 2 * self.kv_dim * self.hidden + extra


@dataclass(frozen=True)
class Op:
    """One operator of a decode step.

    ``flops`` and ``bytes`` are for one execution; ``count`` is how many times it runs per
    step on average (a fraction for blocks executed on some tokens only); ``host_us`` is
    host work before its launches that is not a kernel launch (e.g. a Python router).
    """

    name: str
    flops: float
    bytes: float
    kernels: int = 1
    count: float = 1.0
    block: int | None = None
    host_us: float = 0.0

    def __post_init__(self) -> None:
        if self.flops < 0 or self.bytes < 0 or self.kernels < 0 or self.host_us < 0:
            raise HarnessInputError(f"op {self.name!r}: negative cost in {self!r}")
        if self.kernels == 0 and (self.flops or self.bytes):
            raise HarnessInputError(
                f"op {self.name!r} does work (flops={self.flops}, bytes={self.bytes}) "
                "but launches no kernel"
            )
        if not 0 <= self.count:
            raise HarnessInputError(f"op {self.name!r}: count must be >= 0, got {self.count}")


def linear_op(name: str, d_in: int, d_out: int, batch: int, dtype_bytes: float,
              kernels: int = 1, **kw: object) -> Op:
    """A matrix product of ``batch`` rows by a (d_in x d_out) weight: GEMV at batch 1.

    Bytes: the weight once plus the input and output activations.
    """
    return Op(name, flops=2.0 * batch * d_in * d_out,
              bytes=(d_in * d_out + batch * (d_in + d_out)) * dtype_bytes,
              kernels=kernels, **kw)


def elementwise_op(name: str, elems_in: float, elems_out: float, flops: float,
                   dtype_bytes: float, kernels: int = 1, **kw: object) -> Op:
    """A memory-bound operator that reads ``elems_in`` and writes ``elems_out`` values.

    Eager PyTorch runs it as ``kernels`` separate kernels, each re-reading the tensor; the
    bytes count one pass only, since such ops are floor-bound (min kernel time) at decode
    sizes anyway.
    """
    return Op(name, flops=flops, bytes=(elems_in + elems_out) * dtype_bytes,
              kernels=kernels, **kw)


def _check_bypass(bypass_kind: str, bypass_rank: int, shape: ModelShape) -> str:
    if bypass_kind not in BYPASS_KINDS:
        raise HarnessInputError(
            f"unknown bypass_kind {bypass_kind!r}; valid kinds: {', '.join(BYPASS_KINDS)}"
        )
    if bypass_kind == "linear" and (not isinstance(bypass_rank, int) or bypass_rank < 1):
        raise HarnessInputError(
            f"bypass_kind='linear' needs an integer bypass_rank >= 1, got {bypass_rank!r}"
        )
    # a map of the hidden stream has rank at most hidden: a larger r describes no real bypass,
    # and priced as written its factors soon read more than the block they replace
    if bypass_kind == "linear" and bypass_rank > shape.hidden:
        raise HarnessInputError(
            f"bypass rank {bypass_rank} exceeds the model's hidden size {shape.hidden} "
            f"(a linear bypass has rank 1 to {shape.hidden})"
        )
    return bypass_kind


def block_fractions(shape: ModelShape, executed_blocks: float | Sequence[float] | None
                     ) -> list[float]:
    """Per block, the share of decode tokens on which it runs.

    A number (mean blocks executed per token) is spread evenly over the blocks, so each
    block is priced at that share of its cost and at the rest of a bypassed block's cost:
    the expected busy time is exact, and the timeline is that of an average step. A
    sequence (one share per block, e.g. from the engine's execution trace) prices
    exactly which blocks ran.
    """
    n = shape.n_layers
    if executed_blocks is None:
        return [1.0] * n
    if isinstance(executed_blocks, (int, float)) and not isinstance(executed_blocks, bool):
        e = float(executed_blocks)
        if not (0 <= e <= n) or math.isnan(e):
            raise HarnessInputError(
                f"executed_blocks={executed_blocks!r} is outside [0, n_layers={n}]"
            )
        return [e / n] * n
    shares = [float(x) for x in executed_blocks]
    if len(shares) != n:
        raise HarnessInputError(
            f"executed_blocks has {len(shares)} per-block shares; the model has {n} blocks"
        )
    bad = [(i, x) for i, x in enumerate(shares) if not 0 <= x <= 1]
    if bad:
        raise HarnessInputError(f"per-block executed shares must be in [0, 1]; got {bad}")
    return shares


def _check_step_inputs(batch: int, context: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise HarnessInputError(f"batch must be an integer >= 1, got {batch!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise HarnessInputError(f"context must be an integer >= 1, got {context!r}")


def decode_step_ops(shape: ModelShape, batch: int, context: int, dtype_bytes: float,
                    executed_blocks: float | Sequence[float] | None = None,
                    bypass_kind: str = "identity", bypass_rank: int = 0,
                    kernel_counts: Mapping[str, int] | None = None,
                    router_kernels_per_block: int = 0,
                    router_host_us_per_block: float = 0.0) -> list[Op]:
    """The operators of one decode step of ``batch`` sequences, in launch order.

    ``context`` is the number of cached positions attention reads (the current token
    included); its K/V bytes are part of the attention op. ``executed_blocks``: None for
    all blocks, a mean number of blocks per token, or a per-block share (see
    ``block_fractions``). Each block emits its executed ops with ``count`` = its share and
    its bypass ops with ``count`` = 1 - share; ops with count 0 are left out.
    ``router_*`` add the pruning router's own cost per block (a score kernel, Python).
    """
    _check_step_inputs(batch, context)
    kind = _check_bypass(bypass_kind, bypass_rank, shape)
    if not dtype_bytes > 0:
        raise HarnessInputError(f"dtype_bytes must be > 0, got {dtype_bytes!r}")
    kc = dict(EAGER_KERNELS)
    if kernel_counts:
        unknown = sorted(set(kernel_counts) - set(EAGER_KERNELS))
        if unknown:
            raise HarnessInputError(
                f"kernel_counts names unknown op(s) {unknown}; known: {sorted(EAGER_KERNELS)}"
            )
        kc.update(kernel_counts)
    s = dtype_bytes
    b, d, ff = batch, shape.hidden, shape.intermediate
    q, kv, h = shape.q_dim, shape.kv_dim, shape.n_heads

    def norm(name: str, **kw: object) -> Op:
        # read x and the weight vector, write x; ~4 flops per element (square, sum, scale, weight)
        return Op(name, flops=4.0 * b * d, bytes=(2 * b * d + d) * s, kernels=kc[name], **kw)

    def executed_block(i: int, c: float) -> list[Op]:
        return [
            norm("attn_norm", count=c, block=i),
            linear_op("qkv", d, q + 2 * kv, b, s, kc["qkv"], count=c, block=i),
            elementwise_op("rope", 2 * b * (q + kv), b * (q + kv), 3.0 * b * (q + kv), s,
                           kc["rope"], count=c, block=i),
            elementwise_op("kv_write", 2 * b * kv, 2 * b * kv, 0.0, s, kc["kv_write"],
                           count=c, block=i),
            # QK^T and PV: 2 flops per multiply-add each; K and V of every cached position read once
            Op("attention", flops=4.0 * b * q * context + 5.0 * b * h * context,
               bytes=(2 * b * context * kv + 2 * b * q) * s, kernels=kc["attention"],
               count=c, block=i),
            linear_op("o_proj", q, d, b, s, kc["o_proj"], count=c, block=i),
            elementwise_op("attn_add", 2 * b * d, b * d, b * d, s, kc["attn_add"],
                           count=c, block=i),
            norm("mlp_norm", count=c, block=i),
            linear_op("gate_up", d, 2 * ff, b, s, kc["gate_up"], count=c, block=i),
            elementwise_op("silu_mul", 2 * b * ff, b * ff, 5.0 * b * ff, s, kc["silu_mul"],
                           count=c, block=i),
            linear_op("down", ff, d, b, s, kc["down"], count=c, block=i),
            elementwise_op("mlp_add", 2 * b * d, b * d, b * d, s, kc["mlp_add"],
                           count=c, block=i),
        ]

    def bypassed_block(i: int, c: float) -> list[Op]:
        ops = [
            norm("kv_norm", count=c, block=i),
            linear_op("kv_proj", d, 2 * kv, b, s, kc["kv_proj"], count=c, block=i),
            elementwise_op("rope_k", 2 * b * kv, b * kv, 3.0 * b * kv, s, kc["rope_k"],
                           count=c, block=i),
            elementwise_op("kv_write", 2 * b * kv, 2 * b * kv, 0.0, s, kc["kv_write"],
                           count=c, block=i),
        ]
        if kind == "linear":
            r = bypass_rank
            ops.append(Op("bypass_linear", flops=4.0 * b * d * r + b * d,
                          bytes=(2 * d * r + 3 * b * d + 2 * b * r) * s,
                          kernels=kc["bypass_linear"], count=c, block=i))
        return ops

    ops: list[Op] = [Op("embedding", flops=0.0, bytes=2 * b * d * s, kernels=kc["embedding"])]
    for i, share in enumerate(block_fractions(shape, executed_blocks)):
        if router_kernels_per_block or router_host_us_per_block:
            # the score is a norm or two of the stream: tiny, floor-bound kernels
            ops.append(Op("router", flops=4.0 * b * d if router_kernels_per_block else 0.0,
                          bytes=2 * b * d * s if router_kernels_per_block else 0.0,
                          kernels=router_kernels_per_block, block=i,
                          host_us=router_host_us_per_block))
        if share > 0:
            ops.extend(executed_block(i, share))
        if share < 1:
            ops.extend(bypassed_block(i, 1.0 - share))
    ops.append(norm("final_norm"))
    ops.append(linear_op("lm_head", d, shape.vocab, b, s, kc["lm_head"]))
    ops.append(elementwise_op("sampling", b * shape.vocab, b, b * shape.vocab, s,
                              kc["sampling"]))
    return ops


def bytes_per_token(shape: ModelShape, dtype_bytes: float = 4,
                    executed_blocks: float | Sequence[float] | None = None,
                    bypass_kind: str = "identity", bypass_rank: int = 0) -> float:
    """Weight bytes read per decoded token (batch 1), as gpt-fast counts them for its
    achieved-bandwidth figure: the embedding row, every executed block, what bypassed
    blocks still read (input norm, K/V projections, a linear bypass), the final norm and
    the LM head. KV-cache and activation traffic are not weights and are left out.
    Works for any element size (4 for an fp32 CPU run, 2 for fp16).
    """
    if not dtype_bytes > 0:
        raise HarnessInputError(f"dtype_bytes must be > 0, got {dtype_bytes!r}")
    _check_bypass(bypass_kind, bypass_rank, shape)
    shares = block_fractions(shape, executed_blocks)
    kept = sum(shares)
    weights = (shape.hidden  # embedding row of the token
               + kept * shape.block_weights()
               + (shape.n_layers - kept) * shape.bypassed_block_weights(bypass_kind,
                                                                        bypass_rank)
               + shape.hidden  # final norm
               + shape.vocab * shape.hidden)  # LM head (the embedding matrix when tied)
    return weights * dtype_bytes


def cpu_ideal_speedup(shape: ModelShape, executed_blocks: float | Sequence[float],
                      dtype_bytes: float = 4, bypass_kind: str = "identity",
                      bypass_rank: int = 0) -> float:
    """The speed-up that the weight bytes pruning did not read would give a purely
    bandwidth-bound decode: bytes per token unpruned / bytes per token pruned."""
    return (bytes_per_token(shape, dtype_bytes) /
            bytes_per_token(shape, dtype_bytes, executed_blocks, bypass_kind, bypass_rank))
