"""The per-unit cost predictor of the unit router, and the per-unit numbers static removal needs.

A *unit* is one block's attention (row 2l) or its MLP (row 2l+1). For unit u and the current
decode token, the router's score is

    score_u = exp(w_u . x_u + b_u)   (nats)

where x_u is the unit's own normalised input (rms(h) * attn_norm, or rms(h) * mlp_norm: the step
computes it anyway, so the decision costs one D-long dot product per unit, inside the step) and
w_u, b_u are a ridge regression, fitted offline, of log(KL_u + KL_FLOOR): the measured KL(full ||
unit-u-bypassed) in nats at that token's output when unit u alone is bypassed on the decode
tokens (teacher-forced over the model's own greedy continuations). So a score keeps the unit of
the block router's: predicted nats of output KL if the unit is bypassed now, compared with the
same threshold. A cheaper proxy label, log(||unit output|| / ||h||), is measured too and its rank
correlation with the KL label is reported beside the predictor's (``report``).

Training text (version 3, ``training_prompts()``): this module's own 48 prompts (``TRAIN_PROMPTS``,
none of them in fixtures/) and 116 plain English requests frozen in package data
(``data/training_text/plain_en.jsonl``; its README says where they come from; none is a router-curve
prompt), split by a fixed seed into a fitting and a held-out part; the ridge strength is chosen on
the held-out part. Labels (version 3): each unit bypassed at one decode token alone
(``isolated_bypass``), the cost of the decision the router makes; version 2 bypassed it on every
decode token at once (``labels="sequence"``, kept for comparison). Why: on the development prompts
the version-3 predictor led the best static removal by 5-8 top-1 points with a lower KL at 1-6
blocks' worth, version 2 by -6 to +5 (docs/unit-router.md, "More text with per-token labels").

Deep ridges (version 4): a second ridge per unit, fitted the same way on 284 prompts
(``deep_training_prompts()``: the 164 and 120 more frozen plain requests) through the same maps,
scores every request whose threshold scale starts at ``DEEP_FROM`` or above. On the development
prompts ridges on more text cost the shallow budgets and helped the deep ones, so each keeps the
budgets it is better at (docs/unit-router.md, "Version 4"). The result ships as package data
(``data/unit_predictor/<sha16>-v<N>.npz``) keyed by the weights' sha256; ``rsp-bench calibrate``
rebuilds it.

Unit maps (version 2): each unit also gets a low-rank stand-in fitted by least squares on the
fitting part, update ~ (h @ down) @ up from the stream h entering the unit (rank ``MAP_RANK``, as
calibration.py fits whole-block maps). A unit uses its map when that lowers its mean KL on a
subset of the fitting text, else identity; the KL labels are measured with that choice, so a
score predicts the cost of the bypass the kernels will actually run. A map's own bytes are read
when it is used, so ``unit_bytes`` counts them against what the bypass saves.

Also measured here, on the same text: per-unit Block Influence (ShortGPT's 1 - cos(in, out) of
the attention and of the MLP sublayer), the ranking static per-unit removal uses, and the weight
bytes a bypass of each unit does not read (``unit_bytes``).

Must not import the harness (``rsp_bench``) or the router (the router imports this).
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .calibration import fit_low_rank, atomic_write
from .isolated_bypass import forward_unit_alone
from .model import BypassMap, KVCache, ModelWeights, decode_step, forward_units, prefill

PREDICTOR_VERSION = 4  # 4: v3 plus ridges on 284 prompts for deep budgets (3: per-token labels on 164 prompts)
# Threshold scale (the router's internal sensitivity) from which the deep ridges score. On the
# development prompts the ridges on 284 prompts lowered KL and raised the lead over static removal
# from about 4.5 blocks' worth per token on and cost the shallow end (results/predictor_v3maps_284_curve_dev.json,
# results/predictor_v4_hybrid_dev.json); version 3's packaged threshold scale reaches 4.5 blocks' worth
# at about 0.05 on the tune prompts.
DEEP_FROM = 0.05
MAP_RANK = 32
MAP_CHOICE_PROMPTS = 8  # fitting prompts on which each unit's map is compared with identity
SEED = 16
KL_FLOOR = 1e-4  # nats: per-token KLs below this are noise in fp32; the log target floors there
CONTINUATION_TOKENS = 40
RIDGE_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0)  # times trace(X'X) / D

# Prompts written for this predictor (prose, QA, code, JSON, arithmetic, lists, dialogue); none is
# in fixtures/ (tests/test_router_predictor.py checks). The curve's held-out prompts are elsewhere.
TRAIN_PROMPTS = (
    "Describe how a bicycle gear system works to a ten-year-old.",
    "Why do onions make people cry? Answer briefly.",
    "Write a haiku about autumn rain on a tin roof.",
    "List five common mistakes new gardeners make.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Write a Python function that reverses the words in a sentence.",
    "Convert this to JSON with keys name, age, city: Maria is 34 and lives in Porto.",
    "What is 144 divided by 12? Explain each step.",
    "Explain the difference between weather and climate in two sentences.",
    "Write a polite email declining a meeting invitation for Friday.",
    "Give a recipe for a simple tomato soup.",
    "In SQL, how do I count the rows of a table named orders grouped by customer_id?",
    "Summarize: The museum reopened after a two-year renovation that added 3,000 square metres "
    "of gallery space and a rooftop garden, funded partly by a public campaign.",
    "Tell me a fun fact about octopuses.",
    "What does the acronym HTTP stand for and what is it used for?",
    "Write a short dialogue between a baker and a customer who wants a birthday cake.",
    "Explain what a prime number is and give four examples.",
    "Write a JavaScript snippet that sums an array of numbers.",
    "Extract the date and the amount from: Invoice 4471, issued 12 March 2024, total due 318.50 EUR.",
    "What are the three states of matter? Give an example of each.",
    "Translate to Spanish: Where is the nearest train station?",
    "Write a limerick about a forgetful robot.",
    "How many minutes are there in a week? Show the calculation.",
    "Explain recursion using an everyday analogy.",
    "Give three arguments for and three against working from home.",
    "Produce a JSON list of three fruits with their colours.",
    "Write the opening paragraph of a mystery novel set in a snowed-in hotel.",
    "What is photosynthesis? Keep it under fifty words.",
    "Write a bash command that finds all .log files larger than 10 MB.",
    "Compare cats and dogs as pets in a short table.",
    "If a train leaves at 14:20 and the trip takes 2 hours 55 minutes, when does it arrive?",
    "Explain why the moon shows phases.",
    "Rewrite this sentence in the passive voice: The committee approved the new budget.",
    "Name four planets of the solar system and one fact about each.",
    "What is the difference between a list and a tuple in Python?",
    "Write a thank-you note to a neighbour who watered my plants.",
    "Describe the water cycle step by step.",
    "Answer yes or no, then explain: is a tomato a fruit?",
    "Write a C function that returns the maximum of three integers.",
    "Give me a packing list for a weekend hiking trip.",
    "What causes tides on Earth?",
    "Parse this into fields: 'Order #982 - 3 x blue mug - shipped 2023-11-02 - Leeds'.",
    "Explain compound interest with an example of 1,000 dollars at 5 percent.",
    "Write two sentences about the history of the printing press.",
    "Suggest three names for a coffee shop run by astronomers.",
    "How do vaccines train the immune system? Answer simply.",
    "Write a regular expression that matches a five-digit postal code.",
    "Tell a very short story about a fox who learns to swim.",
)


TRAINING_TEXT_FILE = Path(__file__).resolve().parent / "data" / "training_text" / "plain_en.jsonl"
DEEP_TEXT_FILE = TRAINING_TEXT_FILE.with_name("plain_en_more.jsonl")


@lru_cache(maxsize=1)
def training_prompts() -> tuple[str, ...]:
    """The packaged predictor's training text: ``TRAIN_PROMPTS`` and the frozen plain English
    requests of ``TRAINING_TEXT_FILE``, in that order (the seed split depends on it)."""
    extra = [json.loads(line)["text"] for line in TRAINING_TEXT_FILE.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    return TRAIN_PROMPTS + tuple(extra)


@lru_cache(maxsize=1)
def deep_training_prompts() -> tuple[str, ...]:
    """The deep ridges' training text: ``training_prompts()`` and the 120 frozen plain English
    requests of ``DEEP_TEXT_FILE``, in that order (the seed split depends on it)."""
    more = [json.loads(line)["text"] for line in DEEP_TEXT_FILE.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return training_prompts() + tuple(more)


def unit_bytes(w: ModelWeights, maps: "list[BypassMap | None] | None" = None) -> tuple[np.ndarray, int]:
    """Weight bytes per decode token that bypassing each unit does not read ([2L]), and the bytes
    of one whole block (the "block's worth" budgets are counted in). Attention saves its q and o
    projections (its k/v still run, for the cache); the MLP saves gate, up and down. A unit with a
    map (``maps[u]``) reads the map instead: its bytes are subtracted."""
    d = w.dims
    b = w.blocks[0]
    el = b.wqkv.element_size()
    attn = (d.q_dim * d.hidden + d.hidden * d.q_dim) * el
    mlp = (b.w_gate_up.numel() + b.w_down.numel()) * el
    saved = np.array([attn, mlp] * d.n_layers, dtype=np.int64)
    for u, m in enumerate(maps or []):
        if m is not None:
            saved[u] -= (m.down.numel() + m.up.numel()) * m.down.element_size()
    return saved, w.bytes_per_block()


@dataclass
class UnitPredictor:
    """The fitted predictor and per-unit calibration; unit rows 2l (attention), 2l+1 (MLP)."""

    weights_sha256: str
    weight: np.ndarray  # [2L, D] float32
    bias: np.ndarray  # [2L] float32: log nats
    impact: np.ndarray  # [2L] nats: mean KL with the unit alone bypassed (fitting part)
    block_influence: np.ndarray  # [2L] ShortGPT 1 - cos(in, out) per sublayer, all training positions
    report: dict = field(default_factory=dict)  # Spearman figures, sizes, times, seed
    version: int = PREDICTOR_VERSION
    map_down: np.ndarray | None = None  # [2L, D, r] float32 (zeros where unused)
    map_up: np.ndarray | None = None  # [2L, r, D]
    map_use: np.ndarray | None = None  # [2L] bool: the unit's bypass takes its map
    # Version 4: ridges fitted on more text with the same maps, scoring from threshold scale
    # ``deep_from`` up (None: the one ridge scores at every scale).
    deep_weight: np.ndarray | None = None  # [2L, D]
    deep_bias: np.ndarray | None = None  # [2L]
    deep_from: float | None = None

    @property
    def n_units(self) -> int:
        return int(self.weight.shape[0])

    def bypass_maps(self) -> "list[BypassMap | None]":
        """Per unit, its map as the decode kernels take it (``decode_step(unit_bypass=...)``), or
        None (identity); built once, so the native kernel's pointer arrays are built once too."""
        if getattr(self, "_maps", None) is None:
            use = self.map_use if self.map_use is not None else np.zeros(self.n_units, bool)
            self._maps = [BypassMap(torch.from_numpy(np.ascontiguousarray(self.map_down[u])),
                                    torch.from_numpy(np.ascontiguousarray(self.map_up[u]))) if use[u] else None
                          for u in range(self.n_units)]
        return self._maps

    def ridges_for(self, scale: float) -> tuple[str, np.ndarray, np.ndarray]:
        """(name, weight, bias) of the ridges that score a request whose threshold scale starts at
        ``scale``: "deep" from ``deep_from`` up, else "shallow". Chosen once per request, so the
        share controller's later moves never swap them mid-request."""
        if self.deep_weight is not None and self.deep_from is not None and scale >= self.deep_from:
            return "deep", self.deep_weight, self.deep_bias
        return "shallow", self.weight, self.bias

    def log_scores(self, x: np.ndarray, unit: int) -> np.ndarray:
        """x [N, D] inputs of ``unit`` -> predicted log nats [N] (what the step computes)."""
        return x @ self.weight[unit] + self.bias[unit]


def predictor_path(folder: Path, weights_sha256: str) -> Path:
    return folder / "unit_predictor" / f"{weights_sha256[:16]}-v{PREDICTOR_VERSION}.npz"


def save(p: UnitPredictor, folder: Path) -> Path:
    """Write atomically (temporary file, then rename)."""
    path = predictor_path(folder, p.weights_sha256)
    buf = io.BytesIO()
    meta = json.dumps({"version": p.version, "weights_sha256": p.weights_sha256, "report": p.report})
    # maps stored as float16 (half the package data; a stand-in's last bits do not matter), used as fp32
    maps = {} if p.map_use is None else {"map_down": p.map_down.astype(np.float16),
                                         "map_up": p.map_up.astype(np.float16), "map_use": p.map_use}
    deep = {} if p.deep_weight is None else {"deep_weight": p.deep_weight.astype(np.float32),
                                             "deep_bias": p.deep_bias.astype(np.float32),
                                             "deep_from": np.float64(p.deep_from)}
    np.savez(buf, weight=p.weight.astype(np.float32), bias=p.bias.astype(np.float32), impact=p.impact,
             block_influence=p.block_influence, meta=np.frombuffer(meta.encode(), dtype=np.uint8), **maps, **deep)
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(buf.getvalue()))
    return path


def load(folder: Path, weights_sha256: str) -> UnitPredictor | None:
    """The stored predictor for these weights, or None (missing, damaged or another version)."""
    path = predictor_path(folder, weights_sha256)
    if not path.is_file():
        return None
    try:
        with np.load(path) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            p = UnitPredictor(meta["weights_sha256"], z["weight"].astype(np.float32), z["bias"].astype(np.float32),
                              z["impact"], z["block_influence"], meta.get("report", {}), meta["version"],
                              *((z["map_down"].astype(np.float32), z["map_up"].astype(np.float32),
                                 z["map_use"].astype(bool)) if "map_use" in z.files else (None, None, None)),
                              *((z["deep_weight"].astype(np.float32), z["deep_bias"].astype(np.float32),
                                 float(z["deep_from"])) if "deep_weight" in z.files else ()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # damaged: retrained, never trusted
    if p.version != PREDICTOR_VERSION or p.weights_sha256 != weights_sha256:
        return None
    return p


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        sv = v[order]
        i = 0
        while i < len(v):  # average the ranks of tied values
            j = i
            while j + 1 < len(v) and sv[j + 1] == sv[i]:
                j += 1
            if j > i:
                r[order[i:j + 1]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(np.asarray(a, float)), ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def greedy_continuation(w: ModelWeights, ids: list[int], n: int, eos_id: int | None, kernel: str = "torch") -> list[int]:
    """The unpruned model's greedy continuation of ``ids`` (at most n tokens, stops at EOS)."""
    S = len(ids)
    cache = KVCache.allocate(w.dims, 1, S + n)
    valid = torch.ones(1, S + n, dtype=torch.bool)
    logits = prefill(w, cache, torch.tensor([ids]), torch.arange(S)[None], valid)
    out: list[int] = []
    for i in range(n):
        nxt = int(logits.argmax(-1))
        out.append(nxt)
        if nxt == eos_id or i == n - 1:
            break
        logits = decode_step(w, cache, torch.tensor([nxt]), torch.tensor([S + i]), valid, None, None, None, kernel=kernel)
    return out


def _kl_rows(ref_logp: torch.Tensor, logits: torch.Tensor) -> np.ndarray:
    logp = torch.log_softmax(logits.double(), -1)
    return (ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp(min=0).numpy()


@dataclass
class UnitSamples:
    """Per decode position of the training text: unit inputs, labels, and which prompt it came from."""

    x: list[np.ndarray]  # 2L arrays [N, D]
    kl: np.ndarray  # [2L, N] nats
    proxy: np.ndarray  # [2L, N] log(||unit out|| / ||h||)
    prompt: np.ndarray  # [N] prompt index
    block_influence: np.ndarray  # [2L]


def collect(w: ModelWeights, sequences: list[tuple[list[int], int]],
            progress: Callable[[str], None] | None = None,
            maps: "list[BypassMap | None] | None" = None, labels: str = "sequence") -> UnitSamples:
    """Measure features and labels on (ids, prompt length) sequences, teacher-forced; a unit's
    label is the KL of its bypass with its map ``maps[u]`` where one is given. ``labels``:
    "sequence", the unit bypassed on every decode position (the KL at t carries the earlier
    bypasses too), or "token", bypassed at t alone (isolated_bypass.forward_unit_alone)."""
    if labels not in ("sequence", "token"):
        raise ValueError(f"labels must be 'sequence' or 'token', got {labels!r}")
    say = progress or (lambda _m: None)
    L = w.dims.n_layers
    xs: list[list[np.ndarray]] = [[] for _ in range(2 * L)]
    kl = [[] for _ in range(2 * L)]
    proxy = [[] for _ in range(2 * L)]
    prompt_of = []
    bi_sum, bi_n = np.zeros(2 * L), 0
    with torch.no_grad():
        for p, (ids, S) in enumerate(sequences):
            seq = torch.tensor([ids])
            rec: dict = {}
            ref = forward_units(w, seq, S, record=rec)
            ref_logp = torch.log_softmax(ref.double(), -1)
            # logits row j is position S-1+j: row 0 is prefill's, rows 1.. are the decode positions
            # S..T-2 (the last token's output predicts nothing that is scored).
            n_dec = len(ids) - 1 - S
            if n_dec < 1:
                continue
            pos = slice(S, S + n_dec)
            for layer in range(L):
                h, h_mid, h_out = rec["h"][layer], rec["h_mid"][layer], rec["h"][layer + 1]
                for k, (xkey, nkey, a, b_) in enumerate((("x_attn", "n_attn", h, h_mid), ("x_mlp", "n_mlp", h_mid, h_out))):
                    u = 2 * layer + k
                    xs[u].append(rec[xkey][layer][pos].numpy().astype(np.float32))
                    rel = rec[nkey][layer] / a.norm(dim=-1).clamp(min=1e-9)
                    proxy[u].append(np.log(np.maximum(rel[pos].numpy(), 1e-9)))
                    bi_sum[u] += float((1 - torch.nn.functional.cosine_similarity(a, b_, dim=-1)).sum())
            bi_n += len(ids)
            for layer in range(L):
                for k in range(2):
                    ka = [True] * L
                    km = [True] * L
                    (ka if k == 0 else km)[layer] = False
                    if labels == "token":
                        logits = forward_unit_alone(w, rec, S, 2 * layer + k, maps[2 * layer + k] if maps else None)
                    else:
                        logits = forward_units(w, seq, S, ka, km, first_layer=layer, h_in=rec["h"][layer][None],
                                               unit_bypass=maps)
                    kl[2 * layer + k].append(_kl_rows(ref_logp[1:], logits[1:]))
            prompt_of.append(np.full(n_dec, p))
            say(f"unit predictor: labels {p + 1}/{len(sequences)}")
    return UnitSamples([np.concatenate(x) for x in xs], np.stack([np.concatenate(k) for k in kl]),
                       np.stack([np.concatenate(q) for q in proxy]), np.concatenate(prompt_of), bi_sum / max(bi_n, 1))


def fit_unit_maps(w: ModelWeights, sequences: list[tuple[list[int], int]], rank: int = MAP_RANK,
                  choice_sequences: int = MAP_CHOICE_PROMPTS,
                  progress: Callable[[str], None] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Per unit, a low-rank map of its update from the stream entering it, fitted on the decode
    positions of ``sequences``; then, on the first ``choice_sequences`` of them, whether the map
    or identity costs less mean KL when the unit alone is bypassed. Returns down [2L, D, r],
    up [2L, r, D], use [2L] and the mean KLs both ways."""
    say = progress or (lambda _m: None)
    L, D = w.dims.n_layers, w.dims.hidden
    xs: list[list[torch.Tensor]] = [[] for _ in range(2 * L)]
    ys: list[list[torch.Tensor]] = [[] for _ in range(2 * L)]
    with torch.no_grad():
        for ids, S in sequences:
            rec: dict = {}
            forward_units(w, torch.tensor([ids]), S, record=rec)
            for layer in range(L):
                h, h_mid, h_out = rec["h"][layer][S:], rec["h_mid"][layer][S:], rec["h"][layer + 1][S:]
                xs[2 * layer].append(h)
                ys[2 * layer].append(h_mid - h)
                xs[2 * layer + 1].append(h_mid)
                ys[2 * layer + 1].append(h_out - h_mid)
        down = np.zeros((2 * L, D, rank), np.float32)
        up = np.zeros((2 * L, rank, D), np.float32)
        for u in range(2 * L):
            dn, u_ = fit_low_rank(torch.cat(xs[u]), torch.cat(ys[u]), rank)
            down[u], up[u] = dn.numpy(), u_.numpy()
        del xs, ys
        say("unit predictor: maps fitted")
        candidate = [BypassMap(torch.from_numpy(down[u]), torch.from_numpy(up[u])) for u in range(2 * L)]
        kl_id, kl_map = np.zeros(2 * L), np.zeros(2 * L)
        for i, (ids, S) in enumerate(sequences[:choice_sequences]):
            say(f"unit predictor: map or identity {i + 1}/{min(choice_sequences, len(sequences))}")
            seq = torch.tensor([ids])
            rec = {}
            ref_logp = torch.log_softmax(forward_units(w, seq, S, record=rec).double(), -1)[1:]
            for u in range(2 * L):
                ka, km = [True] * L, [True] * L
                (ka if u % 2 == 0 else km)[u // 2] = False
                for store, maps in ((kl_id, None), (kl_map, candidate)):
                    logits = forward_units(w, seq, S, ka, km, first_layer=u // 2, h_in=rec["h"][u // 2][None],
                                           unit_bypass=maps)
                    store[u] += float(_kl_rows(ref_logp, logits[1:]).mean())
        n = max(min(choice_sequences, len(sequences)), 1)
        kl_id, kl_map = kl_id / n, kl_map / n
    use = kl_map < kl_id
    say(f"unit predictor: maps chosen for {int(use.sum())} of {2 * L} units")
    return down, up, use, {"map_rank": rank, "map_choice_prompts": n, "map_used_units": int(use.sum()),
                           "kl_identity_mean": kl_id.tolist(), "kl_map_mean": kl_map.tolist()}


def fit_ridge(x: np.ndarray, y: np.ndarray, lam_rel: float) -> tuple[np.ndarray, float]:
    """Ridge regression y ~ x . w + b (centred; lam = lam_rel * trace(X'X) / D), in float64."""
    xm, ym = x.mean(0), y.mean()
    xc = (x - xm).astype(np.float64)
    gram = xc.T @ xc
    lam = lam_rel * np.trace(gram) / x.shape[1] + 1e-12
    wv = np.linalg.solve(gram + lam * np.eye(x.shape[1]), xc.T @ (y - ym))
    return wv.astype(np.float32), float(ym - xm @ wv)


def choose_ridge(x_fit: np.ndarray, y_fit: np.ndarray, x_held: np.ndarray, y_held: np.ndarray
                 ) -> tuple[float, np.ndarray, float]:
    """(strength, weights, bias) of the ridge in ``RIDGE_GRID`` with the lowest held-out squared error."""
    best = None
    for lam in RIDGE_GRID:
        wv, b = fit_ridge(x_fit, y_fit, lam)
        err = float(np.mean((x_held @ wv + b - y_held) ** 2))
        if best is None or err < best[0]:
            best = (err, lam, wv, b)
    return best[1], best[2], best[3]


def _continuations(w: ModelWeights, encode: Callable[[str], list[int]], eos_id: int | None, prompts: tuple[str, ...],
                   continuation_tokens: int, kernel: str, say: Callable[[str], None],
                   known: dict[str, tuple[list[int], int]] | None = None) -> list[tuple[list[int], int]]:
    """(prompt + greedy continuation ids, prompt length) per prompt; ``known`` ones are reused."""
    known = known or {}
    sequences = []
    for i, prompt in enumerate(prompts):
        if prompt not in known:
            ids = encode(prompt)
            known[prompt] = (ids + greedy_continuation(w, ids, continuation_tokens, eos_id, kernel), len(ids))
        sequences.append(known[prompt])
        say(f"unit predictor: continuations {i + 1}/{len(prompts)}")
    return sequences


def _held_out(n: int) -> set[int]:
    """The fixed seed split: a quarter of the prompts held out to choose each ridge's strength."""
    return set(np.random.default_rng(SEED).permutation(n)[: max(1, n // 4)].tolist())


def _fit_ridges(w: ModelWeights, sequences: list[tuple[list[int], int]], maps: "list[BypassMap | None]",
                progress: Callable[[str], None] | None, labels: str) -> tuple[np.ndarray, np.ndarray, UnitSamples,
                                                                               np.ndarray, dict]:
    """Labels on ``sequences`` through ``maps``, then one ridge per unit (strength chosen on the
    held-out quarter): weight, bias, the samples, the fitting rows and the ranking report."""
    L = w.dims.n_layers
    held = _held_out(len(sequences))
    samples = collect(w, sequences, progress, maps, labels=labels)
    is_held = np.array([p in held for p in samples.prompt])
    fit_rows, held_rows = ~is_held, is_held
    target = np.log(samples.kl + KL_FLOOR)
    weight = np.zeros((2 * L, w.dims.hidden), np.float32)
    bias = np.zeros(2 * L, np.float32)
    pred_held = np.zeros((2 * L, int(held_rows.sum())))
    chosen = []
    for u in range(2 * L):
        lam, wv, b = choose_ridge(samples.x[u][fit_rows], target[u][fit_rows], samples.x[u][held_rows],
                                  target[u][held_rows])
        chosen.append(lam)
        weight[u], bias[u] = wv, b
        pred_held[u] = samples.x[u][held_rows] @ wv + b
    kl_h = samples.kl[:, held_rows]
    report = {
        "prompts": len(sequences), "held_out_prompts": len(held),
        "positions_fit": int(fit_rows.sum()), "positions_held_out": int(held_rows.sum()),
        "spearman_predicted_vs_kl_pooled": spearman(pred_held.ravel(), kl_h.ravel()),
        "spearman_predicted_vs_kl_within_unit_mean": float(np.mean([spearman(pred_held[u], kl_h[u]) for u in range(2 * L)])),
        "ridge_lambda_rel": chosen,
    }
    return weight, bias, samples, fit_rows, report


def train(w: ModelWeights, encode: Callable[[str], list[int]], eos_id: int | None, weights_sha256: str,
          progress: Callable[[str], None] | None = None, prompts: tuple[str, ...] | None = None,
          continuation_tokens: int = CONTINUATION_TOKENS, kernel: str = "torch",
          labels: str = "token", deep_prompts: tuple[str, ...] | None = None) -> UnitPredictor:
    """Fit the predictor on ``prompts`` (default ``training_prompts()``; fixed seed split: 3/4
    fitting, 1/4 held out). ``labels`` as ``collect`` takes them: "token" (version 3: each unit
    bypassed at one token alone, the cost the router's per-token decision actually causes) or
    "sequence" (version 2's: bypassed on every decode token at once). Then the deep ridges (version
    4): the same labels on ``deep_prompts`` (default ``deep_training_prompts()``; an empty tuple
    skips them) through the maps just fitted, one more ridge per unit, scoring from ``DEEP_FROM``.
    About 35 + 60 min on 2 CPU cores for the embedded 135M model."""
    prompts = training_prompts() if prompts is None else tuple(prompts)
    deep_prompts = deep_training_prompts() if deep_prompts is None else tuple(deep_prompts)
    if labels not in ("sequence", "token"):
        raise ValueError(f"labels must be 'sequence' or 'token', got {labels!r}")
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    L = w.dims.n_layers
    sequences = _continuations(w, encode, eos_id, prompts, continuation_tokens, kernel, say)
    held = _held_out(len(prompts))
    fitting = [sq for i, sq in enumerate(sequences) if i not in held]
    down, up, use, map_report = fit_unit_maps(w, fitting, rank=max(1, min(MAP_RANK, w.dims.hidden // 4)),
                                              progress=progress)
    plain_bytes, _ = unit_bytes(w)
    use &= 2 * down[0].size * 4 < plain_bytes  # a map must cost fewer bytes than the unit it stands in for
    maps = [BypassMap(torch.from_numpy(down[u]), torch.from_numpy(up[u])) if use[u] else None for u in range(2 * L)]
    weight, bias, samples, fit_rows, ridge_report = _fit_ridges(w, sequences, maps, progress, labels)
    held_rows = ~fit_rows
    kl_h, proxy_h = samples.kl[:, held_rows], samples.proxy[:, held_rows]
    impact = samples.kl[:, fit_rows].mean(1)
    # the proxy as a score: the block router's form, impact * rel / mean rel, per unit
    proxy_score = impact[:, None] * np.exp(proxy_h - samples.proxy[:, fit_rows].mean(1)[:, None])
    report = {
        "seed": SEED, **ridge_report, "continuation_tokens": continuation_tokens, "kl_floor": KL_FLOOR, "labels": labels,
        "spearman_proxy_vs_kl_pooled": spearman(proxy_score.ravel(), kl_h.ravel()),
        "spearman_impact_only_vs_kl_pooled": spearman(np.repeat(impact[:, None], kl_h.shape[1], 1).ravel(), kl_h.ravel()),
        "spearman_proxy_vs_kl_within_unit_mean": float(np.mean([spearman(proxy_h[u], kl_h[u]) for u in range(2 * L)])),
        **map_report,
    }
    deep_weight = deep_bias = deep_from = None
    if deep_prompts:
        t1 = time.perf_counter()
        deep_seq = _continuations(w, encode, eos_id, deep_prompts, continuation_tokens, kernel, say,
                                  known=dict(zip(prompts, sequences)))
        deep_weight, deep_bias, _, _, deep_report = _fit_ridges(w, deep_seq, maps, progress, labels)
        deep_from = DEEP_FROM
        report["deep"] = {**deep_report, "from_scale": DEEP_FROM, "train_seconds": round(time.perf_counter() - t1, 1)}
    report["train_seconds"] = round(time.perf_counter() - t0, 1)
    say(f"unit predictor: done in {report['train_seconds']} s")
    return UnitPredictor(weights_sha256, weight, bias, impact, samples.block_influence, report,
                         PREDICTOR_VERSION, down, up, use, deep_weight, deep_bias, deep_from)
