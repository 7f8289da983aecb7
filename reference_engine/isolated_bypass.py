"""Per-token bypass labels: what bypassing one unit at one decode token *alone* does to that token.

``Engine.teacher_forced`` and ``model.forward_units`` bypass a unit on every decode position at
once, so the KL at position t carries the damage of every earlier bypass too (through the K/V
the later blocks read). The router decides per token; this module measures the cost of that
decision alone: for every decode position t at once, the output at t when unit u is bypassed at
t only, every earlier position running in full. It is one pass from the unit's block on: each
position's modified stream attends to the clean keys and values of the positions before it (from
a clean pass's ``record``) and to its own, modified, key and value.

Used to train the unit predictor's labels (``unit_predictor.collect(labels="token")``). Must not
import the router, the engine or the harness.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .model import BypassMap, ModelWeights, _qkv, logits_from_hidden, rms_norm


def _mlp(blk, dims, h: Tensor) -> Tensor:
    g, u = F.linear(rms_norm(h, blk.mlp_norm, dims.rms_eps), blk.w_gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(g) * u, blk.w_down)


def forward_unit_alone(w: ModelWeights, record: dict, start: int, unit: int,
                       unit_map: BypassMap | None = None) -> Tensor:
    """Logits [T - start, V] for positions start - 1 .. T - 2 (the rows ``forward_units`` returns),
    where the output at each decode position t >= start is the model's with ``unit`` (2l: block
    l's attention, 2l + 1: its MLP) bypassed at t alone, by ``unit_map`` or identity. ``record``:
    the ``record`` dict of a clean ``forward_units`` pass over the same ids. A bypassed attention
    still writes its K/V from its input, as the decode kernels do, so its block's keys are clean."""
    dims = w.dims
    layer0, is_mlp = divmod(unit, 2)
    T = record["h"][0].shape[0]
    dec = torch.zeros(1, T, 1, dtype=torch.bool)
    dec[:, start:] = True
    blk = w.blocks[layer0]
    h, h_mid, h_out = record["h"][layer0][None], record["h_mid"][layer0][None], record["h"][layer0 + 1][None]
    if is_mlp:
        stand_in = 0.0 if unit_map is None else (h_mid @ unit_map.down) @ unit_map.up
        hm = torch.where(dec, h_mid + stand_in, h_out)
    else:
        stand_in = 0.0 if unit_map is None else (h @ unit_map.down) @ unit_map.up
        h2 = torch.where(dec, h + stand_in, h_mid)
        hm = h2 + _mlp(blk, dims, h2)
    positions = torch.arange(T)[None]
    cos, sin = w.rope_cos[positions][:, None], w.rope_sin[positions][:, None]
    earlier = torch.ones(T, T, dtype=torch.bool).tril(-1)  # key s < query t
    rep = dims.n_heads // dims.n_kv_heads
    scale = 1.0 / math.sqrt(dims.head_dim)
    for layer in range(layer0 + 1, dims.n_layers):
        blk = w.blocks[layer]
        q, k, v = _qkv(blk, dims, hm, cos, sin)
        _, kc, vc = _qkv(blk, dims, record["h"][layer][None], cos, sin)
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        kc, vc = kc.repeat_interleave(rep, 1), vc.repeat_interleave(rep, 1)
        s_earlier = (q @ kc.transpose(-1, -2) * scale).masked_fill(~earlier, float("-inf"))
        s_own = (q * k).sum(-1, keepdim=True) * scale
        p = torch.softmax(torch.cat([s_earlier, s_own], -1), -1)
        attn = p[..., :T] @ vc + p[..., T:] * v
        h2 = hm + F.linear(attn.transpose(1, 2).reshape(1, T, dims.q_dim), blk.wo)
        hm = h2 + _mlp(blk, dims, h2)
    return logits_from_hidden(w, hm[0, start - 1:T - 1])


def forward_units_per_position(w: ModelWeights, ids: Tensor, start: int, skip: Tensor,
                               unit_bypass: "list[BypassMap | None] | None" = None) -> Tensor:
    """Teacher-forced pass over ``ids`` [1, T] where unit u is bypassed at decode position t when
    ``skip[t, u]`` ([T, 2L] bool; rows before ``start`` are ignored): what a per-token router does
    with those decisions, each bypassed unit taking its map ``unit_bypass[u]`` or identity, a
    bypassed attention still writing its K/V. Returns the rows ``model.forward_units`` returns."""
    dims = w.dims
    T = ids.shape[1]
    skip = skip.clone()
    skip[:start] = False
    positions = torch.arange(T)[None]
    cos, sin = w.rope_cos[positions][:, None], w.rope_sin[positions][:, None]
    h = F.embedding(ids, w.embed)
    for layer in range(dims.n_layers):
        blk = w.blocks[layer]
        q, k, v = _qkv(blk, dims, h, cos, sin)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        a = F.linear(attn.transpose(1, 2).reshape(1, T, dims.q_dim), blk.wo)
        sa, sm = skip[:, 2 * layer][None, :, None], skip[:, 2 * layer + 1][None, :, None]
        am = unit_bypass[2 * layer] if unit_bypass is not None else None
        h2 = h + torch.where(sa, 0.0 if am is None else (h @ am.down) @ am.up, a)
        m = _mlp(blk, dims, h2)
        mm = unit_bypass[2 * layer + 1] if unit_bypass is not None else None
        h = h2 + torch.where(sm, 0.0 if mm is None else (h2 @ mm.down) @ mm.up, m)
    return logits_from_hidden(w, h[0, start - 1:T - 1])
