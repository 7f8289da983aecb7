"""The decode step of ``model.decode_step`` in numpy, over zero-copy views of the same fp32 weights.

Why it exists: at batch 1 a decode step is 121 matrix-vector products and a few hundred tiny
ops. On the CPUs this project runs on, OpenBLAS's GEMV (through numpy) streams the weights about
1.5x faster than torch's MKL GEMV, and a numpy call on a 576-wide vector costs a fraction of a
torch op's dispatch. The math is the same as ``model.py``'s (RMSNorm, RoPE, grouped-query
attention, gated MLP, the same bypass), but the summation order inside the products is
OpenBLAS's, so logits differ from ``transformers``' in the last bits and a greedy choice between
two near-tied tokens can flip. ``model.decode_step(kernel="torch")`` stays the exact path.

Nothing is copied: the numpy arrays are views of the torch tensors (weights, KV cache, stream),
so the exact and the fast path can share one cache and one set of weights.

Must not import the harness (``rsp_bench``), torch beyond ``torch.from_numpy``, or ``model``
(model imports this module; weights and cache are read by attribute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class _NpBlock:
    attn_norm: np.ndarray
    wqkv: np.ndarray  # [(H + 2 KV) hd, D], C-contiguous: W @ x is a row-major GEMV
    wkv: np.ndarray
    wo: np.ndarray
    mlp_norm: np.ndarray
    w_gate_up: np.ndarray
    w_down: np.ndarray


@dataclass
class _NpWeights:
    source: Any  # the ModelWeights these view; a changed list of blocks rebuilds the views
    blocks: list[_NpBlock]
    embed: np.ndarray
    final_norm: np.ndarray
    lm_head: np.ndarray
    cos: np.ndarray
    sin: np.ndarray


_VIEWS: dict[int, _NpWeights] = {}


def _np(t: torch.Tensor) -> np.ndarray:
    if t.device.type != "cpu" or t.dtype != torch.float32:
        raise ValueError(f"the numpy decode kernel needs fp32 CPU tensors, got {t.dtype} on {t.device}")
    return t.detach().numpy()


def numpy_weights(w: Any) -> _NpWeights:
    """Zero-copy numpy views of a ModelWeights, built once per weights object."""
    v = _VIEWS.get(id(w))
    if v is not None and v.source is w and len(v.blocks) == len(w.blocks):
        return v
    blocks = [_NpBlock(_np(b.attn_norm), _np(b.wqkv), _np(b.wkv), _np(b.wo), _np(b.mlp_norm),
                       _np(b.w_gate_up), _np(b.w_down)) for b in w.blocks]
    v = _NpWeights(w, blocks, _np(w.embed), _np(w.final_norm), _np(w.lm_head), _np(w.rope_cos), _np(w.rope_sin))
    _VIEWS.clear()  # only the latest weights' views are kept (they hold a reference to them)
    _VIEWS[id(w)] = v
    return v


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    # x [B, D] float32: weight * x / sqrt(mean(x^2) + eps), as model.rms_norm
    var = np.einsum("bd,bd->b", x, x)[:, None] / np.float32(x.shape[1])
    return weight * (x * (np.float32(1) / np.sqrt(var + np.float32(eps))))


def _mv(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """x [B, K] times m [N, K] transposed -> [B, N]; one row takes OpenBLAS's GEMV."""
    if x.shape[0] == 1:
        return (m @ x[0])[None]
    return x @ m.T


def _low_rank_add(h: np.ndarray, lin: Any) -> np.ndarray:
    return h + (h @ _np(lin.down)) @ _np(lin.up)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    # x [B, n, hd]; cos, sin [B, 1, hd]: x * cos + rotate_half(x) * sin
    half = x.shape[-1] // 2
    rot = np.concatenate((-x[..., half:], x[..., :half]), axis=-1)
    return x * cos + rot * sin


def decode_step_numpy(w: Any, cache: Any, token_ids: torch.Tensor, positions: torch.Tensor,
                      key_valid: torch.Tensor, keep: list[bool] | None, bypass: list[Any] | None,
                      stream: torch.Tensor | None, keep_attn: list[bool] | None = None,
                      keep_mlp: list[bool] | None = None, gate: Any = None,
                      unit_bypass: list[Any] | None = None) -> torch.Tensor:
    """``model.decode_step`` with numpy kernels (same arguments, same effects on cache and
    stream); returns logits [B, V] as a torch tensor sharing the numpy result's memory.
    ``keep_attn`` / ``keep_mlp`` (both given, already combined with ``keep`` by model.decode_step)
    and ``gate`` (model.UnitGate) decide attention and MLP apart, as the torch kernel does."""
    d = w.dims
    nw = numpy_weights(w)
    start = cache.length
    end = start + 1
    B = token_ids.shape[0]
    H, KV, hd = d.n_heads, d.n_kv_heads, d.head_dim
    G, F = H // KV, d.intermediate
    eps = d.rms_eps
    scale = np.float32(1.0 / np.sqrt(hd))
    tok = token_ids.numpy()
    pos = positions.numpy()
    h = nw.embed[tok]  # [B, D], a copy: the embedding table is never written
    cos, sin = nw.cos[pos][:, None, :], nw.sin[pos][:, None, :]
    valid = key_valid[:, :end].numpy()
    # Decode attends to every valid cached position (the query is the last one): only padding
    # is masked. An additive -inf bias is what SDPA applies for a boolean mask.
    bias = None if valid.all() else np.where(valid, np.float32(0), np.float32(-np.inf))[:, None, None, :]
    st = stream.numpy() if stream is not None else None
    cache_k, cache_v = cache.numpy_views()
    units = keep_attn is not None
    if gate is not None:
        g_w, g_b, g_tau = gate.weight.numpy(), gate.bias.numpy(), gate.log_tau.numpy()
        g_s, g_d = gate.scores.numpy(), gate.decisions.numpy()

    def decide(unit: int, x: np.ndarray, run: bool) -> bool:
        # returns whether the unit runs; scores and decisions go back to the caller's buffers
        if gate is None:
            return run
        if not run:
            g_s[:, unit], g_d[unit] = -np.inf, 1
            return False
        s_u = x @ g_w[unit] + g_b[unit]
        g_s[:, unit] = s_u
        by = bool((s_u < g_tau[:, unit]).all())
        g_d[unit] = 1 if by else 0
        return not by

    if st is not None:
        st[0] = h
    with np.errstate(over="ignore"):  # exp(-g) overflows to inf for very negative g: silu -> -0, as torch
        for layer, blk in enumerate(nw.blocks):
            run = keep is None or keep[layer]
            x = _rms(h, blk.attn_norm, eps)
            kc, vc = cache_k[layer], cache_v[layer]  # [B, KV, T, hd]
            if units:
                run_attn = decide(2 * layer, x, keep_attn[layer])
                h = _unit_attn(blk, x, h, kc, vc, start, end, cos, sin, bias, scale, run_attn, B, H, KV, hd, G)
                if not run_attn and unit_bypass is not None and unit_bypass[2 * layer] is not None:
                    h = _low_rank_add(h, unit_bypass[2 * layer])
                xm = _rms(h, blk.mlp_norm, eps)
                if decide(2 * layer + 1, xm, keep_mlp[layer]):
                    gu = _mv(xm, blk.w_gate_up)
                    g = gu[:, :F]
                    h = h + _mv(g / (np.float32(1) + np.exp(-g)) * gu[:, F:], blk.w_down)
                elif unit_bypass is not None:
                    if unit_bypass[2 * layer + 1] is not None:
                        h = _low_rank_add(h, unit_bypass[2 * layer + 1])
                elif not run_attn:
                    lin = bypass[layer] if bypass is not None else None
                    if lin is not None:
                        h = _low_rank_add(h, lin)
                if st is not None:
                    st[layer + 1] = h
                continue
            # A whole block: the same two units, both run or both bypassed (K/V written either way).
            h = _unit_attn(blk, x, h, kc, vc, start, end, cos, sin, bias, scale, run, B, H, KV, hd, G)
            if run:
                gu = _mv(_rms(h, blk.mlp_norm, eps), blk.w_gate_up)
                g = gu[:, :F]
                h = h + _mv(g / (np.float32(1) + np.exp(-g)) * gu[:, F:], blk.w_down)
            else:
                lin = bypass[layer] if bypass is not None else None
                if lin is not None:
                    h = _low_rank_add(h, lin)
            if st is not None:
                st[layer + 1] = h
    cache.length = end
    return torch.from_numpy(_mv(_rms(h, nw.final_norm, eps), nw.lm_head))


def _unit_attn(blk: _NpBlock, x: np.ndarray, h: np.ndarray, kc: np.ndarray, vc: np.ndarray, start: int,
               end: int, cos: np.ndarray, sin: np.ndarray, bias: np.ndarray | None, scale: np.float32,
               run: bool, B: int, H: int, KV: int, hd: int, G: int) -> np.ndarray:
    """The attention unit of one block (K/V always written); returns the stream after it."""
    qd, kvd = H * hd, KV * hd
    if run:
        qkv = _mv(x, blk.wqkv)
        q = _rope(qkv[:, :qd].reshape(B, H, hd), cos, sin)
        kv = qkv[:, qd:]
    else:
        kv = _mv(x, blk.wkv)
    kc[:, :, start] = _rope(kv[:, :kvd].reshape(B, KV, hd), cos, sin)
    vc[:, :, start] = kv[:, kvd:].reshape(B, KV, hd)
    if not run:
        return h
    scores = np.matmul(q.reshape(B, KV, G, hd), kc[:, :, :end].transpose(0, 1, 3, 2))  # [B, KV, G, T]
    scores *= scale
    if bias is not None:
        scores += bias
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    attn = np.matmul(scores, vc[:, :, :end]).reshape(B, qd)
    return h + _mv(attn, blk.wo)
