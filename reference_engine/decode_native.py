"""The decode step of ``model.decode_step`` as one call into C (csrc/rsp_decode.c), over the same fp32 weights.

Why it exists (issue 14): at batch 1 a decode step reads ~538 MB of weights through 121
matrix-vector products, so its speed is the rate at which those bytes stream. torch's MKL GEMV
and numpy's OpenBLAS GEMV stream well under what the machine can; a plain AVX-512/AVX2 GEMV split
across threads streams close to it, and doing the whole step (every block, attention, the LM
head) in one C call removes the per-op Python and dispatch cost. The math is ``decode_numpy``'s,
step for step (RMSNorm, RoPE, grouped-query attention over the valid positions, the gated MLP, the
same bypass: a bypassed block still writes its K/V, then the stream passes unchanged or through
its BypassMap); only the summation order inside the products differs, so logits equal the exact
path's to float32 rounding, not bit for bit. It is the engine's default kernel where it builds
(``engine.default_decode_kernel``, ``RSP_DECODE_KERNEL``): measured to flip no greedy token
against the torch kernel on 57 suite prompts and 16 held-out ones (results/kernel_flips.json), and
the equivalence suite re-checks pruning off against ``transformers`` on every run.
``model.decode_step(kernel="torch")`` runs transformers' own kernels. Per-unit flags and the unit
gate (``model.UnitGate``) are decided inside the same C call; the gate's dot products run on every
thread from the same data, so decisions and logits are bit-identical at 1 and 2 threads. The unit
router's per-token bookkeeping can run inside the same call too (``RouterState``, issue 16): its
thresholds before the blocks, the stream norms, the next-token entropy and the EMA updates after,
timed in C; the arrays stay the Python ``UnitRouter``'s (numpy, by pointer).

The C source is compiled on first use with the system C compiler (``$CC``, else cc, gcc or clang)
at ``-O3 -march=native`` with OpenMP when the compiler has it, and cached under the engine's cache
root (``model_loading.cache_root()/native``) keyed by a hash of the source, the compiler, its
flags and the CPU's flags; the library is written atomically (temporary file, then rename) and
loaded with ctypes. Without a compiler the kernel raises ``NativeKernelUnavailable`` naming what
is missing; nothing else in the engine needs it. Threads: ``torch.get_num_threads()`` at each call.

Must not import the harness (``rsp_bench``) or ``model`` (model imports this module; weights and
cache are read by attribute); torch only for tensors' data pointers and the logits it returns.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).parent / "csrc" / "rsp_decode.c"
ABI_VERSION = 6
BASE_FLAGS = ("-O3", "-shared", "-fPIC", "-std=c11")
OPTIONAL_FLAGS = (("-march=native", "-fopenmp"), ("-fopenmp",), ("-march=native",), ())


class NativeKernelUnavailable(RuntimeError):
    """The native decode kernel cannot be built or loaded here (no C compiler, or it failed)."""


_pp = ctypes.POINTER(ctypes.c_void_p)
_i64 = ctypes.c_int64


class _Model(ctypes.Structure):
    _fields_ = [("n_layers", _i64), ("D", _i64), ("F", _i64), ("H", _i64), ("KV", _i64), ("hd", _i64),
                ("V", _i64), ("max_positions", _i64), ("eps", ctypes.c_float),
                ("embed", ctypes.c_void_p), ("final_norm", ctypes.c_void_p), ("lm_head", ctypes.c_void_p),
                ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p),
                ("attn_norm", _pp), ("wqkv", _pp), ("wo", _pp), ("mlp_norm", _pp), ("w_gate_up", _pp),
                ("w_down", _pp)]


class _Router(ctypes.Structure):
    # csrc/rsp_decode.c rsp_router, field for field
    _fields_ = [("B", _i64), ("L", _i64)] + [(n, ctypes.c_double) for n in (
        "entropy_ref", "ent_alpha", "tau_min", "tau_max", "f_lo", "f_hi", "block_bytes", "target_bytes",
        "ctl_gain", "ctl_max")] + [
        (n, ctypes.c_void_p) for n in (
            "inv_grad_ref", "base", "tau_weight", "protect", "active", "row_done", "unit_bytes", "entropy",
            "grad", "last", "norms", "step_entropy", "bytes_saved", "units_bypassed", "counts", "times", "ctl")]


# (name, dtype, shape as a function of B and L): the arrays rsp_router points into
ROUTER_ARRAYS = (("inv_grad_ref", "float64", lambda B, L: (L,)), ("base", "float64", lambda B, L: (B,)),
                 ("tau_weight", "float64", lambda B, L: (2 * L,)), ("protect", "uint8", lambda B, L: (2 * L,)),
                 ("active", "uint8", lambda B, L: (B,)), ("row_done", "uint8", lambda B, L: (B,)),
                 ("unit_bytes", "int64", lambda B, L: (2 * L,)), ("entropy", "float64", lambda B, L: (B,)),
                 ("grad", "float64", lambda B, L: (B, L)), ("last", "uint8", lambda B, L: (2 * L,)),
                 ("norms", "float64", lambda B, L: (B, L + 1)), ("step_entropy", "float64", lambda B, L: (B,)),
                 ("bytes_saved", "int64", lambda B, L: (B,)), ("units_bypassed", "int64", lambda B, L: (B,)),
                 ("counts", "int64", lambda B, L: (5,)), ("times", "float64", lambda B, L: (7,)),
                 ("ctl", "float64", lambda B, L: (B,)))


class RouterState:
    """The unit router's state as the C step sees it: a ``rsp_router`` struct pointing into numpy
    arrays that the caller owns (``arrays``: name -> array, see ROUTER_ARRAYS for names, dtypes and
    shapes; each must stay the same object, C-contiguous). ``rebind(name, array)`` points a field at
    another array of the same kind (the engine's per-request counters). Constants are plain floats."""

    def __init__(self, batch: int, n_layers: int, arrays: dict, *, entropy_ref: float, ent_alpha: float,
                 tau_min: float, tau_max: float, f_lo: float, f_hi: float, block_bytes: float,
                 target_bytes: float = 0.0, ctl_gain: float = 0.0, ctl_max: float = 0.0):
        self.batch, self.n_layers = batch, n_layers
        self.arrays: dict = {}
        self.struct = _Router(batch, n_layers, entropy_ref, ent_alpha, tau_min, tau_max, f_lo, f_hi, block_bytes,
                              target_bytes, ctl_gain, ctl_max)
        for name, _, _ in ROUTER_ARRAYS:
            self.rebind(name, arrays[name])
        self.ref = ctypes.byref(self.struct)

    def rebind(self, name: str, array) -> None:
        spec = {n: (d, f) for n, d, f in ROUTER_ARRAYS}.get(name)
        if spec is None:
            raise ValueError(f"rsp_router has no array field {name!r}")
        dtype, shape = spec[0], spec[1](self.batch, self.n_layers)
        if str(array.dtype) != dtype or tuple(array.shape) != shape or not array.flags.c_contiguous:
            raise ValueError(f"router array {name} must be {dtype} {shape} C-contiguous, got "
                             f"{array.dtype} {tuple(array.shape)}")
        if name in ("entropy", "grad", "last", "norms", "step_entropy", "bytes_saved", "units_bypassed",
                    "counts", "times", "ctl") and not array.flags.writeable:
            raise ValueError(f"router array {name} must be writable")
        self.arrays[name] = array  # the struct holds a raw pointer: keep the array alive
        setattr(self.struct, name, array.ctypes.data)


_LIB: ctypes.CDLL | None = None


def find_compiler() -> str:
    """The C compiler to use: ``$CC`` if set, else the first of cc, gcc, clang on PATH."""
    cc = os.environ.get("CC")
    if cc:
        if shutil.which(cc.split()[0]) is None:
            raise NativeKernelUnavailable(f"the native decode kernel needs a C compiler: $CC={cc!r} is not on PATH")
        return cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    raise NativeKernelUnavailable(
        "the native decode kernel needs a C compiler and none was found (no $CC, and none of cc, gcc, "
        "clang on PATH); install one (e.g. `apt-get install gcc`) or use decode_kernel 'torch' or 'numpy'")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def _compiler_id(cc: str) -> str:
    try:
        return subprocess.run(cc.split() + ["--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeKernelUnavailable(f"the native decode kernel's C compiler {cc!r} does not run: {exc}") from exc


def library_path(cc: str | None = None) -> Path:
    """Where the compiled kernel for this source, compiler and CPU lives (built or not)."""
    from .model_loading import cache_root

    cc = cc or find_compiler()
    headers = [h.read_text() for h in sorted(SOURCE.parent.glob("*.h"))]  # rsp_router.h is part of the source
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *headers, cc, _compiler_id(cc), " ".join(BASE_FLAGS),
                                    repr(OPTIONAL_FLAGS), _cpu_flags()]).encode()).hexdigest()[:16]
    return cache_root() / "native" / f"rsp_decode-{key}.so"


def build(cc: str | None = None) -> Path:
    """Compile the kernel into the cache unless it is there; returns the library's path."""
    cc = cc or find_compiler()
    target = library_path(cc)
    if target.exists():
        return target
    errors = []
    for extra in OPTIONAL_FLAGS:  # the fastest flags the compiler accepts
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        except OSError as exc:
            raise NativeKernelUnavailable(f"the native decode kernel cannot be built in {target.parent}: {exc} "
                                          "(set RSP_BENCH_CACHE to a writable folder)") from exc
        os.close(fd)
        cmd = cc.split() + [*BASE_FLAGS, *extra, str(SOURCE), "-o", tmp, "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            proc = None
            errors.append(f"{' '.join(cmd)}: {exc}")
        if proc is not None and proc.returncode == 0:
            os.replace(tmp, target)
            return target
        if proc is not None:
            errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-400:]}")
        Path(tmp).unlink(missing_ok=True)
    raise NativeKernelUnavailable("the native decode kernel did not compile:\n" + "\n".join(errors))


def load_library() -> ctypes.CDLL:
    """The compiled kernel, built on first use and loaded once per process."""
    global _LIB
    if _LIB is not None:
        return _LIB
    lib = ctypes.CDLL(str(build()))
    if lib.rsp_abi_version() != ABI_VERSION:
        raise NativeKernelUnavailable(f"stale native kernel library (ABI {lib.rsp_abi_version()}, want {ABI_VERSION})")
    lib.rsp_decode_step.restype = ctypes.c_int
    lib.rsp_decode_step.argtypes = [
        ctypes.POINTER(_Model), _pp, _pp, _i64, _i64, _i64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        _i64, ctypes.c_char_p, ctypes.c_char_p, _pp, _pp, ctypes.c_void_p, _pp, _pp, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.rsp_entropy.restype = ctypes.c_int
    lib.rsp_entropy.argtypes = [ctypes.c_void_p, _i64, _i64, ctypes.c_void_p, ctypes.c_void_p]
    lib.rsp_gemv.restype = ctypes.c_int
    lib.rsp_gemv.argtypes = [ctypes.c_void_p, _i64, _i64, ctypes.c_void_p, _i64, ctypes.c_void_p, ctypes.c_int]
    _LIB = lib
    return lib


def unavailable_reason() -> str | None:
    """None when the kernel builds and loads here, else one line saying why (tests skip with it)."""
    try:
        load_library()
    except NativeKernelUnavailable as exc:
        return f"the native decode kernel cannot be built here: {str(exc).splitlines()[0]}"
    return None


def _check(t: torch.Tensor, what: str) -> int:
    if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError(f"the native decode kernel needs contiguous fp32 CPU tensors; {what} is "
                         f"{t.dtype} on {t.device}{'' if t.is_contiguous() else ', not contiguous'}")
    return t.data_ptr()


def _ptrs(ptrs: list[int]):
    return (ctypes.c_void_p * len(ptrs))(*ptrs)


class _NativeWeights:
    """The ctypes description of a ModelWeights (pointers into its tensors), built once."""

    def __init__(self, w: Any):
        d = w.dims
        self.source = w  # keeps the tensors alive while the pointers are in use
        self.n_blocks = len(w.blocks)
        if d.n_heads % d.n_kv_heads or d.head_dim > 512 or d.head_dim % 2:
            raise ValueError(f"the native decode kernel does not support heads {d.n_heads}/{d.n_kv_heads}, "
                             f"head_dim {d.head_dim}")
        self.arrays = [_ptrs([_check(getattr(b, name), f"block {i} {name}") for i, b in enumerate(w.blocks)])
                       for name in ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gate_up", "w_down")]
        for i, b in enumerate(w.blocks):  # the kernel reads the k/v rows of wqkv as wkv
            if b.wkv.data_ptr() != b.wqkv.data_ptr() + d.q_dim * d.hidden * 4:
                raise ValueError(f"block {i}: wkv is not the k/v rows of wqkv")
        m = _Model(len(w.blocks), d.hidden, d.intermediate, d.n_heads, d.n_kv_heads, d.head_dim, d.vocab,
                   w.rope_cos.shape[0], d.rms_eps, _check(w.embed, "embed"), _check(w.final_norm, "final_norm"),
                   _check(w.lm_head, "lm_head"), _check(w.rope_cos, "rope_cos"), _check(w.rope_sin, "rope_sin"),
                   *[ctypes.cast(a, _pp) for a in self.arrays])
        self.model = m
        self.ref = ctypes.byref(m)


class _NativeCache:
    def __init__(self, cache: Any):
        self.source = cache
        self.first = cache.k[0]
        self.k = _ptrs([_check(t, "cache k") for t in cache.k])
        self.v = _ptrs([_check(t, "cache v") for t in cache.v])
        self.batch, self.capacity = cache.k[0].shape[0], cache.k[0].shape[2]


_WEIGHTS: dict[int, _NativeWeights] = {}
_CACHES: dict[int, _NativeCache] = {}


def native_weights(w: Any) -> _NativeWeights:
    v = _WEIGHTS.get(id(w))
    if v is not None and v.source is w and v.n_blocks == len(w.blocks):
        return v
    v = _NativeWeights(w)
    _WEIGHTS.clear()  # only the latest weights are kept (the entry holds a reference to them)
    _WEIGHTS[id(w)] = v
    return v


def _native_cache(cache: Any) -> _NativeCache:
    c = _CACHES.get(id(cache))
    if c is not None and c.source is cache and cache.k[0] is c.first:
        return c
    c = _NativeCache(cache)
    _CACHES.clear()
    _CACHES[id(cache)] = c
    return c


def decode_step_native(w: Any, cache: Any, token_ids: torch.Tensor, positions: torch.Tensor,
                       key_valid: torch.Tensor, keep: list[bool] | None, bypass: list[Any] | None,
                       stream: torch.Tensor | None, keep_attn: list[bool] | None = None,
                       keep_mlp: list[bool] | None = None, gate: Any = None,
                       unit_bypass: list[Any] | None = None) -> torch.Tensor:
    """``model.decode_step`` in one C call (same arguments, same effects on cache and stream);
    returns fresh logits [B, V]."""
    lib = load_library()
    nw = native_weights(w)
    nc = _native_cache(cache)
    B = token_ids.shape[0]
    if nc.batch != B:
        raise ValueError(f"the KV cache holds {nc.batch} rows, the step has {B} tokens")
    tok = token_ids if token_ids.dtype == torch.int64 and token_ids.is_contiguous() else \
        token_ids.to(torch.int64).contiguous()
    pos = positions if positions.dtype == torch.int64 and positions.is_contiguous() else \
        positions.to(torch.int64).contiguous()
    valid = key_valid if key_valid.dtype == torch.bool and key_valid.stride(-1) == 1 else \
        key_valid.to(torch.bool).contiguous()
    start = cache.length
    if valid.shape[1] <= start:
        raise ValueError(f"key_valid covers {valid.shape[1]} positions, the step writes position {start}")
    keep_a = keep_m = None
    down = up = rank = None
    if keep is not None and keep_attn is None:
        keep_attn = keep_mlp = keep
    if keep_attn is not None:
        for name, flags in (("keep", keep_attn), ("keep_mlp", keep_mlp)):
            if flags is None or len(flags) != nw.n_blocks:
                raise ValueError(f"{name} has {None if flags is None else len(flags)} entries for {nw.n_blocks} blocks")
        keep_a, keep_m = bytes(bool(k) for k in keep_attn), bytes(bool(k) for k in keep_mlp)
    may_bypass_block = gate is not None or (keep_attn is not None and
                                            not all(a or m for a, m in zip(keep_attn, keep_mlp)))
    if bypass is not None and may_bypass_block and unit_bypass is None:
        down, up, rank = _bypass_pointers(bypass, nw.n_blocks)
    u_down = u_up = u_rank = None
    if unit_bypass is not None and keep_attn is not None:
        if len(unit_bypass) != 2 * nw.n_blocks:
            raise ValueError(f"unit_bypass has {len(unit_bypass)} entries for {2 * nw.n_blocks} units")
        u_down, u_up, u_rank = _bypass_pointers(unit_bypass, 2 * nw.n_blocks)
        if u_down is None:  # no unit has a map: identity bypasses, and no block maps either
            u_down, u_up, u_rank = _no_maps(2 * nw.n_blocks)
    g = [None] * 5
    if gate is not None:
        U = 2 * nw.n_blocks
        if tuple(gate.weight.shape) != (U, w.dims.hidden) or tuple(gate.log_tau.shape) != (B, U):
            raise ValueError(f"the unit gate must be weight [{U}, {w.dims.hidden}] and log_tau [{B}, {U}], got "
                             f"{tuple(gate.weight.shape)} and {tuple(gate.log_tau.shape)}")
        g = [_check(gate.weight, "gate weight"), _check(gate.bias, "gate bias"), _check(gate.log_tau, "gate log_tau"),
             _check(gate.scores, "gate scores"), gate.decisions.data_ptr()]
    rs = getattr(gate, "router_state", None)
    if rs is not None and (rs.batch != B or rs.n_layers != nw.n_blocks):
        raise ValueError(f"the router state is for batch {rs.batch} and {rs.n_layers} blocks, the step has "
                         f"{B} rows and {nw.n_blocks} blocks")
    st = None
    if stream is not None:
        st = _check(stream, "stream")
        if tuple(stream.shape) != (nw.n_blocks + 1, B, w.dims.hidden):
            raise ValueError(f"stream must be [{nw.n_blocks + 1}, {B}, {w.dims.hidden}], got {tuple(stream.shape)}")
    logits = torch.empty(B, w.dims.vocab)
    rc = lib.rsp_decode_step(nw.ref, nc.k, nc.v, nc.capacity, B, start, tok.data_ptr(), pos.data_ptr(),
                             valid.data_ptr(), valid.stride(0), keep_a, keep_m, down, up,
                             ctypes.cast(rank, ctypes.c_void_p) if rank is not None else None, u_down, u_up,
                             ctypes.cast(u_rank, ctypes.c_void_p) if u_rank is not None else None,
                             *g, st, logits.data_ptr(), torch.get_num_threads(), rs.ref if rs is not None else None)
    if rc != 0:
        why = {-1: "bad dimensions or a full KV cache", -2: "out of memory",
               -3: "a token id or position out of range"}.get(rc, "unknown")
        raise ValueError(f"native decode step failed (code {rc}: {why}; tokens {tok.tolist()}, "
                         f"positions {pos.tolist()}, cache {start}/{nc.capacity})")
    cache.length = start + 1
    return logits


_MAPS: dict[int, tuple] = {}


_NO_MAPS: dict[int, tuple] = {}


def _no_maps(n: int):
    """All-NULL unit-map pointer arrays of length n, built once per n (not per step)."""
    if n not in _NO_MAPS:
        _NO_MAPS[n] = (_ptrs([0] * n), _ptrs([0] * n), (_i64 * n)(*([0] * n)))
    return _NO_MAPS[n]


def _bypass_pointers(bypass: list[Any], n_blocks: int):
    """Pointer arrays for a list of BypassMaps (per block, or per unit), built once per list (not
    per step); the two most recent lists are kept (the block maps and the unit maps)."""
    hit = _MAPS.get(id(bypass))
    if hit is not None and hit[0] is bypass:
        return hit[2:]
    held, dp, upp, rk = [], [0] * n_blocks, [0] * n_blocks, [0] * n_blocks
    for layer, lin in enumerate(bypass):
        if lin is not None:
            dn = lin.down.detach().to(torch.float32).contiguous()
            u = lin.up.detach().to(torch.float32).contiguous()
            held += [dn, u]
            dp[layer], upp[layer], rk[layer] = dn.data_ptr(), u.data_ptr(), dn.shape[1]
    entry = (bypass, held, None, None, None) if not held else \
        (bypass, held, _ptrs(dp), _ptrs(upp), (_i64 * n_blocks)(*rk))
    while len(_MAPS) >= 2:
        _MAPS.pop(next(iter(_MAPS)))
    _MAPS[id(bypass)] = entry
    return entry[2:]


def gemv(weight: torch.Tensor, x: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    """weight [N, K] times x [B, K] transposed -> [B, N] with the kernel's GEMV (tests, roofline)."""
    lib = load_library()
    N, K = weight.shape
    x2 = x.reshape(-1, K).contiguous()
    y = torch.empty(x2.shape[0], N)
    lib.rsp_gemv(_check(weight, "weight"), N, K, _check(x2, "x"), x2.shape[0], y.data_ptr(),
                 threads or torch.get_num_threads())
    return y


def entropy(logits: torch.Tensor):
    """Next-token entropy in nats [B] (numpy float64) of logits [B, V], computed as the in-step router
    computes it (tests compare it with numpy)."""
    return entropy_and_lse(logits)[0]


def entropy_and_lse(logits: torch.Tensor):
    """(entropy, log-sum-exp), each [B] numpy float64, of logits [B, V] from one pass over them (the
    degradation check's loss is the log-sum-exp minus the target's logit; torch's logsumexp took
    twice this whole call in the check)."""
    import numpy as np

    lib = load_library()
    z = logits.reshape(-1, logits.shape[-1]).contiguous()
    out, lse = np.zeros(z.shape[0]), np.zeros(z.shape[0])
    if lib.rsp_entropy(_check(z, "logits"), z.shape[0], z.shape[1], out.ctypes.data, lse.ctypes.data) != 0:
        raise ValueError(f"entropy needs logits [B, V] with B, V >= 1, got {tuple(logits.shape)}")
    return out, lse


def _verify_fn(lib: ctypes.CDLL):
    """rsp_verify_step with its ctypes declaration (set once, on first use)."""
    try:
        fn = lib.rsp_verify_step
    except AttributeError as exc:  # cannot happen with a library built from this source (keyed by its hash)
        raise NativeKernelUnavailable("the native kernel library has no rsp_verify_step (stale build)") from exc
    if fn.argtypes is None:
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(_Model), _pp, _pp, _i64, _i64, _i64, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_int]
    return fn


def verify_native(w: Any, cache: Any, token_ids: list[int], start: int, key_valid: torch.Tensor) -> torch.Tensor:
    """Lossless mode's verify pass in one C call: every block over ``token_ids`` (the current token
    and the drafts) at cache positions start.. (batch 1, RoPE position = cache position, causal over
    the valid cache). Writes the K/V of all S positions and sets ``cache.length = start + S`` (the
    caller rolls back past rejections, as after ``speculative.verify_forward``); returns logits [S, V].

    Bit-identical to S calls of ``decode_step_native`` on the same tokens (logits and K/V, any thread
    count): the kernel computes each row as the single-token step does, only streaming each weight
    matrix once for all S rows (csrc/rsp_decode.c, rsp_verify_step).
    """
    lib = load_library()
    nw = native_weights(w)
    nc = _native_cache(cache)
    S = len(token_ids)
    if S < 1:
        raise ValueError("verify_native needs at least one token (the current one), got none")
    if nc.batch != 1:
        raise ValueError(f"verify_native runs batch 1; the KV cache holds {nc.batch} rows")
    if not isinstance(start, int) or start < 0 or start + S > nc.capacity:
        raise ValueError(f"verify_native: start {start!r} + {S} positions does not fit the KV cache "
                         f"(capacity {nc.capacity})")
    if start + S > w.rope_cos.shape[0]:
        raise ValueError(f"verify_native: positions up to {start + S - 1} exceed the model's "
                         f"{w.rope_cos.shape[0]} positions")
    bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < w.dims.vocab]
    if bad:
        raise ValueError(f"verify_native: token id {bad[0]!r} is out of range [0, {w.dims.vocab})")
    if key_valid.dim() != 2 or key_valid.shape[0] != 1 or key_valid.shape[1] < start + S:
        raise ValueError(f"verify_native: key_valid must be [1, >= {start + S}], got {tuple(key_valid.shape)}")
    valid = key_valid[0]
    if valid.dtype != torch.bool or not valid.is_contiguous():
        valid = valid.to(torch.bool).contiguous()
    tok = torch.tensor(token_ids, dtype=torch.int64)
    logits = torch.empty(S, w.dims.vocab)
    rc = _verify_fn(lib)(nw.ref, nc.k, nc.v, nc.capacity, start, S, tok.data_ptr(), valid.data_ptr(),
                         logits.data_ptr(), torch.get_num_threads())
    if rc != 0:
        why = {-1: "bad dimensions or a full KV cache", -2: "out of memory",
               -3: "a token id or position out of range"}.get(rc, "unknown")
        raise ValueError(f"native verify pass failed (code {rc}: {why}; tokens {token_ids}, "
                         f"start {start}, cache capacity {nc.capacity})")
    cache.length = start + S
    return logits
