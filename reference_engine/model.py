"""The Llama decoder as plain functions over a preallocated KV cache (after gpt-fast).

Everything the engine computes lives here: RMSNorm, RoPE, attention with grouped K/V heads,
the gated MLP, prefill over a whole prompt, and one decode step whose blocks either run or are
bypassed according to a per-step plan that the router made *before* the step started.

Weights are re-laid once at load for batch-1 decode speed: q/k/v fused into one matrix and
gate/up fused into another, so each block reads its weights in four matrix products.
The arithmetic mirrors ``transformers``' Llama (same RMSNorm, RoPE table and SDPA call) so that
with every block kept, greedy output equals ``model.generate`` token for token. The decode step
has two other kernels with the same math, equal to float32 rounding but not bit for bit:
"native" (decode_native.py: the whole step in one C call, the engine's default where a C
compiler builds it, about 1.5x this one) and "numpy" (decode_numpy.py, OpenBLAS GEMV). This
file's torch kernel is the one transformers runs, and what prefill and lossless mode use.

Units: the decode step can also bypass a block's attention and MLP apart (``keep_attn`` /
``keep_mlp``), and decide them itself from each unit's normalised input with a ``UnitGate``
(the unit router's predictor and thresholds); ``forward_units`` is the same math over a whole
teacher-forced sequence with fixed unit flags, in one pass.

Must not import the harness (``rsp_bench``) or anything from the router: this file is the math.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .decode_native import decode_step_native
from .decode_numpy import decode_step_numpy

Tensor = torch.Tensor


@dataclass(frozen=True)
class ModelDims:
    n_layers: int
    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    rope_theta: float
    max_positions: int

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


@dataclass
class BlockWeights:
    attn_norm: Tensor  # [D]
    wqkv: Tensor  # [(H + 2 KV) * hd, D]
    wkv: Tensor  # view of the k/v rows of wqkv: what a bypassed block still reads
    wo: Tensor  # [D, H * hd]
    mlp_norm: Tensor  # [D]
    w_gate_up: Tensor  # [2F, D]
    w_down: Tensor  # [D, F]


@dataclass
class ModelWeights:
    dims: ModelDims
    embed: Tensor  # [V, D]
    blocks: list[BlockWeights]
    final_norm: Tensor
    lm_head: Tensor  # [V, D], the embedding itself when tied
    rope_cos: Tensor  # [max_positions, hd]
    rope_sin: Tensor

    def bytes_per_block(self) -> int:
        b = self.blocks[0]
        return sum(t.numel() * t.element_size() for t in (b.attn_norm, b.wqkv, b.wo, b.mlp_norm, b.w_gate_up, b.w_down))


def weights_from_hf(model) -> ModelWeights:
    """Re-lay a ``transformers`` Llama-family model's weights (fused, contiguous, fp32)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    if rope.get("rope_type", "default") != "default":
        from .errors import ModelLoadError

        raise ModelLoadError(f"rope_type {rope.get('rope_type')!r} is not supported (only 'default')")
    dims = ModelDims(
        n_layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, intermediate=cfg.intermediate_size,
        n_heads=cfg.num_attention_heads, n_kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
        vocab=cfg.vocab_size, rms_eps=float(cfg.rms_norm_eps), rope_theta=theta,
        max_positions=int(cfg.max_position_embeddings),
    )
    inner = model.model
    blocks = []
    with torch.no_grad():
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous()
            blocks.append(BlockWeights(
                attn_norm=layer.input_layernorm.weight.detach(),
                wqkv=wqkv,
                wkv=wqkv[dims.q_dim:],
                wo=a.o_proj.weight.detach().contiguous(),
                mlp_norm=layer.post_attention_layernorm.weight.detach(),
                w_gate_up=torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous(),
                w_down=m.down_proj.weight.detach().contiguous(),
            ))
        cos, sin = rope_table(dims)
        return ModelWeights(
            dims=dims, embed=inner.embed_tokens.weight.detach(), blocks=blocks,
            final_norm=inner.norm.weight.detach(), lm_head=model.lm_head.weight.detach(),
            rope_cos=cos, rope_sin=sin,
        )


def rope_table(dims: ModelDims) -> tuple[Tensor, Tensor]:
    # Same expression as transformers' default RoPE init so the table is bit-identical.
    inv_freq = 1.0 / (dims.rope_theta ** (torch.arange(0, dims.head_dim, 2, dtype=torch.int64).float() / dims.head_dim))
    pos = torch.arange(dims.max_positions, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return (x * cos) + (_rotate_half(x) * sin)


@dataclass
class KVCache:
    """Preallocated keys and values, one [B, KV, T, hd] pair per layer; ``length`` positions filled."""

    k: list[Tensor]
    v: list[Tensor]
    length: int = 0
    _np: tuple | None = None  # zero-copy numpy views of k and v, made once (decode_numpy)

    def numpy_views(self) -> tuple[list, list]:
        """(k, v) as lists of numpy arrays sharing the tensors' memory; built on first use
        because a torch ``.numpy()`` call per layer per step costs more than the attention."""
        if self._np is None:
            self._np = ([t.numpy() for t in self.k], [t.numpy() for t in self.v])
        return self._np

    @classmethod
    def allocate(cls, dims: ModelDims, batch: int, capacity: int, dtype=torch.float32, device="cpu") -> "KVCache":
        shape = (batch, dims.n_kv_heads, capacity, dims.head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.n_layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.n_layers)])

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]


def _qkv(blk: BlockWeights, dims: ModelDims, x: Tensor, cos: Tensor, sin: Tensor):
    """x [B, S, D] -> q [B, H, S, hd], k, v [B, KV, S, hd] with RoPE applied."""
    B, S, _ = x.shape
    qkv = F.linear(rms_norm(x, blk.attn_norm, dims.rms_eps), blk.wqkv)
    q, k, v = qkv.split((dims.q_dim, dims.kv_dim, dims.kv_dim), dim=-1)
    q = q.view(B, S, dims.n_heads, dims.head_dim).transpose(1, 2)
    k = k.view(B, S, dims.n_kv_heads, dims.head_dim).transpose(1, 2)
    v = v.view(B, S, dims.n_kv_heads, dims.head_dim).transpose(1, 2)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def write_kv_only(blk: BlockWeights, dims: ModelDims, cache: KVCache, layer: int, x: Tensor,
                  start: int, cos: Tensor, sin: Tensor) -> None:
    """What a bypassed block still does: project its input to K/V so later tokens can attend to it."""
    B, S, _ = x.shape
    kv = F.linear(rms_norm(x, blk.attn_norm, dims.rms_eps), blk.wkv)
    k, v = kv.split((dims.kv_dim, dims.kv_dim), dim=-1)
    k = k.view(B, S, dims.n_kv_heads, dims.head_dim).transpose(1, 2)
    v = v.view(B, S, dims.n_kv_heads, dims.head_dim).transpose(1, 2)
    cache.k[layer][:, :, start:start + S] = apply_rope(k, cos, sin)
    cache.v[layer][:, :, start:start + S] = v


def block_forward(blk: BlockWeights, dims: ModelDims, cache: KVCache, layer: int, x: Tensor,
                  start: int, cos: Tensor, sin: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """Run block ``layer`` on x [B, S, D] at cache positions start..start+S-1; returns the new stream."""
    B, S, _ = x.shape
    q, k, v = _qkv(blk, dims, x, cos, sin)
    end = start + S
    cache.k[layer][:, :, start:end] = k
    cache.v[layer][:, :, start:end] = v
    keys, values = cache.k[layer][:, :, :end], cache.v[layer][:, :, :end]
    attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                          is_causal=causal and mask is None, enable_gqa=True)
    h = x + F.linear(attn.transpose(1, 2).reshape(B, S, dims.q_dim), blk.wo)
    gate, up = F.linear(rms_norm(h, blk.mlp_norm, dims.rms_eps), blk.w_gate_up).chunk(2, dim=-1)
    return h + F.linear(F.silu(gate) * up, blk.w_down)


def logits_from_hidden(w: ModelWeights, h: Tensor, head: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """Logits of final-stream rows ``h`` [..., D]. ``head`` maps final-normed rows [m, D] to logits
    (an engine on the native kernel passes its GEMV, so a prompt's first token is computed as
    every later one is); None: F.linear."""
    x = rms_norm(h, w.final_norm, w.dims.rms_eps)
    return F.linear(x, w.lm_head) if head is None else head(x)


def attention_mask(key_valid: Tensor, start: int, length: int) -> Tensor | None:
    """Bool mask [B, 1, S, start+S] for S new queries at ``start``: causal and no padded keys.

    ``key_valid`` [B, capacity] marks real (non-padding) positions. Returns None when nothing is
    masked beyond causality for a single query, so batch-1 decode takes SDPA's unmasked path,
    as ``transformers`` does.
    """
    end = start + length
    valid = key_valid[:, :end]
    if length == 1:
        if bool(valid.all()):
            return None
        return valid[:, None, None, :]
    q_pos = torch.arange(start, end, device=key_valid.device)[:, None]
    k_pos = torch.arange(end, device=key_valid.device)[None, :]
    causal = k_pos <= q_pos  # [S, end]
    mask = causal[None, None] & valid[:, None, None, :]
    # A padded query would attend to nothing and SDPA would return NaN; let it see itself.
    mask = mask | (k_pos == q_pos)[None, None]
    return mask


def prefill(w: ModelWeights, cache: KVCache, input_ids: Tensor, positions: Tensor,
            key_valid: Tensor, hidden_out: list[Tensor] | None = None,
            head: Callable[[Tensor], Tensor] | None = None, logits: bool = True) -> Tensor | None:
    """Run every block over the prompt [B, S] (prefill is never pruned). Returns last-position logits
    [B, V] (``logits_from_hidden`` with ``head``), or None with ``logits=False``: the caller then
    computes them from the final stream itself (the engine, in one pass with the degradation
    check's rows).

    If ``hidden_out`` is a list, the residual stream entering each block and the final stream are
    appended to it ([B, S, D] each), for calibration and the degradation detector.
    """
    dims = w.dims
    S = input_ids.shape[1]
    h = F.embedding(input_ids, w.embed)
    cos, sin = w.rope_cos[positions][:, None], w.rope_sin[positions][:, None]
    padded = not bool(key_valid[:, :S].all())
    mask = attention_mask(key_valid, 0, S) if padded else None
    for layer, blk in enumerate(w.blocks):
        if hidden_out is not None:
            hidden_out.append(h)
        h = block_forward(blk, dims, cache, layer, h, 0, cos, sin, mask, causal=True)
    if hidden_out is not None:
        hidden_out.append(h)
    cache.length = S
    return logits_from_hidden(w, h[:, -1], head) if logits else None


@dataclass
class BypassMap:
    """Low-rank linear stand-in for a bypassed block: h + (h @ down) @ up."""

    down: Tensor  # [D, r]
    up: Tensor  # [r, D]


DECODE_KERNELS = ("torch", "numpy", "native")


@dataclass
class UnitGate:
    """A per-unit router decision made inside the decode step, from this token's own input.

    Units: row 2l is block l's attention, row 2l+1 its MLP. Before unit u runs, the step computes
    its normalised input x_u (rms(h) * attn_norm for attention, rms(h) * mlp_norm for the MLP, which
    the unit needs anyway) and the predicted log cost ``s_u = weight[u] . x_u + bias[u]`` (log
    nats). The unit is bypassed when ``s_u < log_tau[b, u]`` for every row b. ``log_tau`` is -inf
    for a unit that must run (blacklisted). The step writes ``scores`` [B, 2L] (s_u; -inf for a unit
    that a fixed flag already bypassed) and ``decisions`` [2L] (1 = bypassed) back for the caller.
    All tensors fp32 / uint8, contiguous, CPU (the native kernel reads them by pointer).
    """

    weight: Tensor  # [2L, D]
    bias: Tensor  # [2L]
    log_tau: Tensor  # [B, 2L]
    scores: Tensor  # [B, 2L], written by the step
    decisions: Tensor  # [2L] uint8, written by the step
    # decode_native.RouterState or None: the native kernel then also runs the unit router's per-token
    # bookkeeping (thresholds into log_tau, norms, entropy, EMAs) inside the call; other kernels ignore it
    router_state: object = None

    @classmethod
    def allocate(cls, weight: Tensor, bias: Tensor, batch: int) -> "UnitGate":
        n = weight.shape[0]
        return cls(weight.float().contiguous(), bias.float().contiguous(),
                   torch.full((batch, n), float("-inf")), torch.zeros(batch, n), torch.zeros(n, dtype=torch.uint8))


def _gate_says_bypass(gate: UnitGate, unit: int, x: Tensor) -> bool:
    """x [B, D]: this unit's normalised input. Records the score and returns the decision."""
    s = torch.mv(x, gate.weight[unit]) + gate.bias[unit]
    gate.scores[:, unit] = s
    by = bool((s < gate.log_tau[:, unit]).all())
    gate.decisions[unit] = 1 if by else 0
    return by


def _unit_block(blk: BlockWeights, dims: ModelDims, cache: KVCache, layer: int, h: Tensor, start: int,
                cos: Tensor, sin: Tensor, mask: Tensor | None, run_attn: bool, run_mlp: bool,
                gate: UnitGate | None, lin: "BypassMap | None", attn_map: "BypassMap | None" = None,
                mlp_map: "BypassMap | None" = None) -> Tensor:
    """One decode block with attention and MLP decided apart; h [B, 1, D]. The same ops as
    ``block_forward`` when both run, so the kept path stays bit-identical to it. A bypassed unit
    adds its own map's (h @ down) @ up when it has one (``attn_map`` / ``mlp_map``); ``lin``, the
    whole block's map, applies only when both units are bypassed (callers pass unit maps or it)."""
    B = h.shape[0]
    x = rms_norm(h, blk.attn_norm, dims.rms_eps)
    u = 2 * layer
    if run_attn and gate is not None and _gate_says_bypass(gate, u, x[:, 0]):
        run_attn = False
    elif gate is not None and not run_attn:
        gate.scores[:, u] = float("-inf")
        gate.decisions[u] = 1
    if run_attn:
        qkv = F.linear(x, blk.wqkv)
        q, k, v = qkv.split((dims.q_dim, dims.kv_dim, dims.kv_dim), dim=-1)
        q = apply_rope(q.view(B, 1, dims.n_heads, dims.head_dim).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(B, 1, dims.n_kv_heads, dims.head_dim).transpose(1, 2), cos, sin)
        v = v.view(B, 1, dims.n_kv_heads, dims.head_dim).transpose(1, 2)
        cache.k[layer][:, :, start:start + 1] = k
        cache.v[layer][:, :, start:start + 1] = v
        keys, values = cache.k[layer][:, :, :start + 1], cache.v[layer][:, :, :start + 1]
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=False, enable_gqa=True)
        h2 = h + F.linear(attn.transpose(1, 2).reshape(B, 1, dims.q_dim), blk.wo)
    else:
        write_kv_only(blk, dims, cache, layer, h, start, cos, sin)
        h2 = h if attn_map is None else h + (h @ attn_map.down) @ attn_map.up
    xm = rms_norm(h2, blk.mlp_norm, dims.rms_eps)
    if run_mlp and gate is not None and _gate_says_bypass(gate, u + 1, xm[:, 0]):
        run_mlp = False
    elif gate is not None and not run_mlp:
        gate.scores[:, u + 1] = float("-inf")
        gate.decisions[u + 1] = 1
    if run_mlp:
        gate_, up = F.linear(xm, blk.w_gate_up).chunk(2, dim=-1)
        return h2 + F.linear(F.silu(gate_) * up, blk.w_down)
    if mlp_map is not None:
        return h2 + (h2 @ mlp_map.down) @ mlp_map.up
    if not run_attn and lin is not None:  # the whole block bypassed: its calibrated linear stand-in
        return h + (h @ lin.down) @ lin.up
    return h2


def decode_step(w: ModelWeights, cache: KVCache, token_ids: Tensor, positions: Tensor,
                key_valid: Tensor, keep: list[bool] | None, bypass: list[BypassMap | None] | None,
                stream: Tensor | None, kernel: str = "torch", keep_attn: list[bool] | None = None,
                keep_mlp: list[bool] | None = None, gate: UnitGate | None = None,
                unit_bypass: list[BypassMap | None] | None = None) -> Tensor:
    """Decode one token per row. ``token_ids`` [B], ``positions`` [B] (RoPE positions).

    ``keep[l]`` False bypasses block l (identity, or its BypassMap when one is given) after writing
    its K/V. ``stream`` [L+1, B, D], when given, receives the residual stream at every block
    boundary so the router can measure updates without extra work inside the loop.
    ``kernel``: "torch" (the exact path: the same kernels as ``transformers``, bit for bit) or
    "numpy" (``decode_numpy``: same math over zero-copy numpy views; OpenBLAS sums in another
    order, so logits differ in the last bits) or "native" (``decode_native``: the same math as
    numpy's in one C call, compiled on first use; needs a C compiler). Returns logits [B, V].

    Units: ``keep_attn[l]`` / ``keep_mlp[l]`` False bypass block l's attention (its K/V are still
    written) or MLP alone; a unit runs only if ``keep`` and its own flag allow it. ``gate``
    (UnitGate) may bypass more units, decided inside the step from each unit's input. A block
    whose two units are both bypassed takes its BypassMap, as with ``keep[l]`` False, unless
    ``unit_bypass`` [2L] is given: then each bypassed unit u takes its own map ``unit_bypass[u]``
    (None: identity) from the stream entering it, and block maps are not used on the unit path.
    """
    units = keep_attn is not None or keep_mlp is not None or gate is not None
    if units:
        L = w.dims.n_layers
        for name, flags in (("keep_attn", keep_attn), ("keep_mlp", keep_mlp), ("keep", keep)):
            if flags is not None and len(flags) != L:
                raise ValueError(f"{name} has {len(flags)} entries for {L} blocks")
        base = [True] * L if keep is None else [bool(k) for k in keep]
        keep_attn = [b and (keep_attn is None or bool(a)) for b, a in zip(base, keep_attn or base)]
        keep_mlp = [b and (keep_mlp is None or bool(m)) for b, m in zip(base, keep_mlp or base)]
        keep = None
    if kernel == "numpy":
        return decode_step_numpy(w, cache, token_ids, positions, key_valid, keep, bypass, stream,
                                 keep_attn, keep_mlp, gate, unit_bypass)
    if kernel == "native":
        return decode_step_native(w, cache, token_ids, positions, key_valid, keep, bypass, stream,
                                  keep_attn, keep_mlp, gate, unit_bypass)
    if kernel != "torch":
        raise ValueError(f"decode kernel must be one of {DECODE_KERNELS}, got {kernel!r}")
    dims = w.dims
    start = cache.length
    h = F.embedding(token_ids, w.embed)[:, None, :]
    cos, sin = w.rope_cos[positions][:, None, None], w.rope_sin[positions][:, None, None]
    mask = attention_mask(key_valid, start, 1)
    if stream is not None:
        stream[0].copy_(h[:, 0])
    for layer, blk in enumerate(w.blocks):
        if units:
            if unit_bypass is not None:
                h = _unit_block(blk, dims, cache, layer, h, start, cos, sin, mask, keep_attn[layer],
                                keep_mlp[layer], gate, None, unit_bypass[2 * layer], unit_bypass[2 * layer + 1])
            else:
                h = _unit_block(blk, dims, cache, layer, h, start, cos, sin, mask, keep_attn[layer],
                                keep_mlp[layer], gate, bypass[layer] if bypass is not None else None)
        elif keep is None or keep[layer]:
            h = block_forward(blk, dims, cache, layer, h, start, cos, sin, mask, causal=False)
        else:
            write_kv_only(blk, dims, cache, layer, h, start, cos, sin)
            lin = bypass[layer] if bypass is not None else None
            if lin is not None:
                h = h + (h @ lin.down) @ lin.up
        if stream is not None:
            stream[layer + 1].copy_(h[:, 0])
    cache.length = start + 1
    return logits_from_hidden(w, h[:, 0])


def forward_units(w: ModelWeights, ids: Tensor, start: int, keep_attn: list[bool] | None = None,
                  keep_mlp: list[bool] | None = None, bypass: list[BypassMap | None] | None = None,
                  first_layer: int = 0, h_in: Tensor | None = None, record: dict | None = None,
                  unit_bypass: list[BypassMap | None] | None = None) -> Tensor:
    """Teacher-forced pass over one whole sequence ``ids`` [1, T] with units bypassed at the decode
    positions (>= ``start``) only: the same math as ``start`` prefill then T - start decode steps
    with those fixed ``keep_attn`` / ``keep_mlp`` flags (a bypassed unit's K/V are still written from
    its input; both units off takes the BypassMap, or with ``unit_bypass`` [2L] each bypassed unit
    its own map, as decode_step does), in one pass instead of T - start steps.

    ``first_layer`` / ``h_in`` [1, T, D]: start from the stream entering that block (calibration
    re-runs only the blocks after the one it bypasses). ``record``, when a dict, receives per layer
    the stream entering it ("h"), the stream between its attention and MLP ("h_mid"), the units'
    normalised inputs ("x_attn", "x_mlp") and their output
    norms ("n_attn", "n_mlp"), each [T, ...]. Returns logits [T - start, V] for positions
    start - 1 .. T - 2, the ones ``Engine.teacher_forced`` returns for the continuation ids[start:].
    """
    dims = w.dims
    T = ids.shape[1]
    positions = torch.arange(T)[None]
    cos, sin = w.rope_cos[positions][:, None], w.rope_sin[positions][:, None]
    h = F.embedding(ids, w.embed) if h_in is None else h_in
    dec = torch.zeros(1, T, 1, dtype=torch.bool)
    dec[:, start:] = True
    for layer in range(first_layer, dims.n_layers):
        blk = w.blocks[layer]
        ka = keep_attn is None or keep_attn[layer]
        km = keep_mlp is None or keep_mlp[layer]
        x = rms_norm(h, blk.attn_norm, dims.rms_eps)
        q, k, v = _qkv(blk, dims, h, cos, sin)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        a = F.linear(attn.transpose(1, 2).reshape(1, T, dims.q_dim), blk.wo)
        am = unit_bypass[2 * layer] if unit_bypass is not None and not ka else None
        h2 = h + (a if ka else torch.where(dec, 0.0 if am is None else (h @ am.down) @ am.up, a))
        xm = rms_norm(h2, blk.mlp_norm, dims.rms_eps)
        g, u = F.linear(xm, blk.w_gate_up).chunk(2, dim=-1)
        m = F.linear(F.silu(g) * u, blk.w_down)
        mm = unit_bypass[2 * layer + 1] if unit_bypass is not None and not km else None
        h3 = h2 + (m if km else torch.where(dec, 0.0 if mm is None else (h2 @ mm.down) @ mm.up, m))
        if not ka and not km and unit_bypass is None and bypass is not None and bypass[layer] is not None:
            lin = bypass[layer]
            h3 = torch.where(dec, h + (h @ lin.down) @ lin.up, h3)
        if record is not None:
            for key, val in (("h", h[0]), ("h_mid", h2[0]), ("x_attn", x[0]), ("x_mlp", xm[0]),
                             ("n_attn", a[0].norm(dim=-1)),
                             ("n_mlp", m[0].norm(dim=-1))):
                record.setdefault(key, []).append(val)
        h = h3
    if record is not None:
        record.setdefault("h", []).append(h[0])
    return logits_from_hidden(w, h[0, start - 1:T - 1])
