"""Lossless mode's torch verify pass: every block over S positions (batch 1) with torch products.

Used when the engine's decode kernel is "torch" or "numpy" (``speculative``; on the native kernel
lossless mode runs the exact ``decode_native.verify_native``). It multiplies matrices where decode
multiplies a matrix by a vector, so its logits are the off path's plus ~1e-4 of rounding, and
``speculative`` certifies each token it accepts with a logit margin.

Cheap arithmetic: ``F.linear`` on 2..13 rows made MKL pack each weight matrix (a 2-row pass cost
~1.8 plain steps) and SDPA with a mask took its slow math path (~25% of a step): the verify pass
writes its products as ``weight @ x^T`` and groups the query heads that share a K/V head into three
small batched products instead.

Must not import the harness (``rsp_bench``) or ``speculative``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .model import BlockWeights, KVCache, ModelDims, ModelWeights, apply_rope, rms_norm

Tensor = torch.Tensor


def _lin(x: Tensor, weight: Tensor) -> Tensor:
    """x [S, D] times weight [N, D] transposed, as weight @ x^T.

    Why not F.linear: for 2..13 rows MKL's GEMM path packs each weight matrix first, nearly
    doubling a verify pass (~1.8 plain steps at 2 positions). As weight @ x^T (tall and skinny)
    the product streams the weight about as decode does. x must be row-major: elementwise ops on
    the transposed result come out column-major, and that layout made the down projection 3x
    slower.
    """
    return (weight @ x.contiguous().t()).t()


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """Grouped-query attention of q [H, S, hd] over k, v [KV, T, hd] with an additive bias [S, T].

    Why not SDPA: with an explicit mask the CPU SDPA takes its math path, which repeats K/V for
    every query head and cost ~25% of a plain step here; grouping the queries that share a K/V
    head is three small batched products.
    """
    H, S, hd = q.shape
    KV, T, _ = k.shape
    G = H // KV
    scores = (q.reshape(KV, G * S, hd) @ k.transpose(1, 2)) * hd ** -0.5
    probs = torch.softmax(scores.view(KV, G, S, T) + bias, dim=-1)
    return (probs.view(KV, G * S, T) @ v).view(H, S, hd)


def _verify_block(blk: BlockWeights, dims: ModelDims, cache: KVCache, layer: int, x: Tensor, start: int,
                  cos: Tensor, sin: Tensor, bias: Tensor) -> Tensor:
    """model.block_forward for batch 1, x [S, D], with its products written as ``_lin``."""
    S = x.shape[0]
    qkv = _lin(rms_norm(x, blk.attn_norm, dims.rms_eps), blk.wqkv)
    q, k, v = qkv.split((dims.q_dim, dims.kv_dim, dims.kv_dim), dim=-1)
    q = apply_rope(q.reshape(S, dims.n_heads, dims.head_dim).transpose(0, 1), cos, sin)
    k = apply_rope(k.reshape(S, dims.n_kv_heads, dims.head_dim).transpose(0, 1), cos, sin)
    v = v.reshape(S, dims.n_kv_heads, dims.head_dim).transpose(0, 1)
    end = start + S
    cache.k[layer][0, :, start:end] = k
    cache.v[layer][0, :, start:end] = v
    attn = _attend(q, cache.k[layer][0, :, :end], cache.v[layer][0, :, :end], bias)
    h = x + _lin(attn.transpose(0, 1).reshape(S, dims.q_dim), blk.wo)
    gate, up = _lin(rms_norm(h, blk.mlp_norm, dims.rms_eps), blk.w_gate_up).chunk(2, dim=-1)
    return h + _lin(F.silu(gate) * up, blk.w_down)


def verify_forward(w: ModelWeights, cache: KVCache, token_ids: list[int], start: int,
                   key_valid: Tensor) -> Tensor:
    """Every block over ``token_ids`` at cache positions start.. (batch 1); logits [S, V].

    Writes the K/V of all S positions; the caller rolls ``cache.length`` back past rejections.
    """
    S = len(token_ids)
    pos = torch.arange(start, start + S)
    h = F.embedding(torch.tensor(token_ids), w.embed)
    cos, sin = w.rope_cos[pos], w.rope_sin[pos]
    keys = torch.arange(start + S)
    hidden = (keys[None, :] > pos[:, None]) | ~key_valid[0, :start + S]  # future or padding
    bias = torch.zeros(S, start + S).masked_fill_(hidden, float("-inf"))
    for layer, blk in enumerate(w.blocks):
        h = _verify_block(blk, w.dims, cache, layer, h, start, cos, sin, bias)
    cache.length = start + S
    return _lin(rms_norm(h, w.final_norm, w.dims.rms_eps), w.lm_head)
