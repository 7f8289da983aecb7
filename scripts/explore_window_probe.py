"""Exploration, development splits only (stop 58): does a probe that reads windows of the prompt find
instructions the pooled probe misses? Collects, per prompt, the pooled direction and the mean unit
direction of every 24-token window (stride 12) at the score's blocks, then compares on the choosing
splits (12-06f, 12-06g and the suites' SQuAD and structured prompts), at the fit script's threshold
rule (1% false alarms overall, 2% per group):

- A: the pooled probe (today's design), B: pooled plus the last window, C0: a probe on all windows
  scored by its highest window, C1: the same after one multiple-instance step (each injection's two
  top windows under C0 are its positives), D: A or C1, each at half the budget.

``--also SPLIT`` (a development split: one reported already) scores A and C1 there at the thresholds
chosen above: its injections caught, and which of its ordinary requests fire.

The fit side is subsampled (half of each fit split's ordinary requests and of the SQuAD fit
passages, 100 structured documents) to keep collection near 25 minutes on 2 cores. Nothing here is
packaged or reported; it must not be imported by the engine or the harness. Run:

    python scripts/explore_window_probe.py --cache /tmp/win/feat --also 2026-12-06i
"""
import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
import fit_instruction_probe as F  # noqa: E402
from reference_engine import ood  # noqa: E402
from reference_engine.degradation import instruction_probe as ip  # noqa: E402
from reference_engine.model import KVCache, prefill  # noqa: E402
from rsp_bench import datasets as ds  # noqa: E402

W, STRIDE = 24, 12


def collect(out: Path, also: list[str]) -> None:
    eng = F.Engine.load()
    w = eng.weights
    blocks = ood.blocks_for(w.dims.n_layers)
    prefix, suffix = ood.template_ends(eng.encode)
    out.mkdir(parents=True, exist_ok=True)

    def feats(texts: list[str], name: str) -> None:
        path = out / f"{name}.npz"
        if path.exists():
            return
        t0 = time.time()
        pooled, wins, idx = [], [], []
        with torch.no_grad():
            for i, text in enumerate(texts):
                ids = eng.encode(text)
                lo, hi = ood.content_span(ids, prefix, suffix)
                if hi - lo > ood.FIT_MAX_TOKENS:
                    ids = ids[:lo + ood.FIT_MAX_TOKENS] + ids[hi:]
                    hi = lo + ood.FIT_MAX_TOKENS
                S = len(ids)
                hidden: list = []
                cache = KVCache.allocate(w.dims, 1, S)
                prefill(w, cache, torch.tensor([ids]), torch.arange(S)[None], torch.ones(1, S, dtype=torch.bool),
                        hidden_out=hidden)
                U = [hidden[b][0, lo:hi].double() for b in blocks]
                U = [u / u.norm(dim=-1, keepdim=True).clamp_min(1e-12) for u in U]
                n = hi - lo
                pooled.append(np.concatenate([ip.unit(u.mean(0).numpy()) for u in U]))
                starts = list(range(0, max(n - W, 0) + 1, STRIDE)) or [0]
                if starts[-1] + W < n:
                    starts.append(n - W)
                for s in starts:
                    wins.append(np.concatenate([ip.unit(u[s:s + W].mean(0).numpy()) for u in U]).astype(np.float32))
                    idx.append(i)
        np.savez(path, pooled=np.array(pooled, dtype=np.float32), wins=np.array(wins), idx=np.array(idx))
        print(f"{name}: {len(texts)} prompts, {len(wins)} windows, {time.time() - t0:.0f} s", flush=True)

    rng = random.Random(0)

    def split_items(name: str) -> tuple[list[str], list[dict]]:
        items = [json.loads(line) for line in
                 open(ROOT / f"fixtures/degradation_heldout_{name}/prompts.jsonl", encoding="utf-8")]
        inj = [x["text"] for x in items if x["group"] == "odd" and F.INJECTION_KIND.search(x["kind"])]
        return inj, [x for x in items if x["group"] in F.ORDINARY]

    for name in F.FIT:
        inj, ordi = split_items(name)
        feats(inj, f"{name}-inj")
        feats([x["text"] for x in ordi if rng.random() < 0.5], f"{name}-ord-half")
    for name in (*F.CHOOSE, *also):
        inj, ordi = split_items(name)
        feats(inj, f"{name}-inj")
        feats([x["text"] for x in ordi], f"{name}-ord")
        np.save(out / f"{name}-ord-group.npy", np.array([x["group"] for x in ordi]))
        np.save(out / f"{name}-ord-kind.npy", np.array([x["kind"] for x in ordi]))
    for part in ("calibration", "heldout"):
        feats([json.loads(line)["text"] for line in open(ROOT / f"fixtures/normal_corpus/{part}.jsonl", encoding="utf-8")],
              f"normal-{part}")
    squad = ds.quick_subset(ds.load_squad(), 10**6)
    docs = ds.quick_subset(ds.load_structured(), 10**6)
    first = {q.context for q in squad[:F.SUITE_SUBSET]}
    feats([p.text for p in ds.load_prompts()], "own-prompts")
    sq_fit = [ds.squad_prompt(q) for q in squad if q.context not in first]
    feats([t for t in sq_fit if rng.random() < 0.5], "own-squad-fit-half")
    feats([ds.squad_prompt(q) for q in squad if q.context in first], "own-squad-choose")
    feats([ds.structured_prompt(d) for d in docs[F.SUITE_SUBSET:F.SUITE_SUBSET + 100]], "own-structured-fit")
    feats([ds.structured_prompt(d) for d in docs[:F.SUITE_SUBSET]], "own-structured-choose")


Features = tuple[np.ndarray, np.ndarray, np.ndarray]  # pooled rows, window rows, each window's prompt


def _load(folder: Path, name: str) -> Features:
    z = np.load(folder / f"{name}.npz")
    return z["pooled"].astype(np.float64), z["wins"].astype(np.float64), z["idx"]


def _pooled(sets: list[Features]) -> np.ndarray:
    return np.vstack([s[0] for s in sets])


def _last(sets: list[Features]) -> np.ndarray:
    """The last window of each prompt."""
    out = []
    for p, w, idx in sets:
        last = {i: j for j, i in enumerate(idx)}
        out.append(w[[last[i] for i in range(len(p))]])
    return np.vstack(out)


class _Linear:
    """Version 1 of the instruction probe (stops 57-66): a logistic model on the standardised pooled
    directions. The packaged probe is a small network since stop 67; this exploration compared
    linear probes and keeps its own."""

    def __init__(self, mu: np.ndarray, sd: np.ndarray, w: np.ndarray) -> None:
        self.mu, self.sd, self.coef, self.bias = mu, sd, w[:-1], float(w[-1])

    def log_odds(self, x: np.ndarray) -> np.ndarray:
        return ((np.atleast_2d(x) - self.mu) / self.sd) @ self.coef + self.bias


def _fit_linear(blocks: tuple[int, ...], pos: np.ndarray, neg: np.ndarray, ridge: float) -> _Linear:
    """The two classes weighing the same, as version 1's fit did (``blocks`` names them only)."""
    X = np.vstack([pos, neg])
    mu, sd = X.mean(0), X.std(0) + 1e-6
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    wts = np.r_[np.full(len(pos), 0.5 / len(pos)), np.full(len(neg), 0.5 / len(neg))]
    return _Linear(mu, sd, ip.fit_logistic((X - mu) / sd, y, wts, ridge))


def _max_window(probe: _Linear, sets: list[Features]) -> np.ndarray:
    """Each prompt's highest window score."""
    out = []
    for p, w, idx in sets:
        m = np.full(len(p), -np.inf)
        np.maximum.at(m, idx, probe.log_odds(w))
        out.append(m)
    return np.concatenate(out)


def _window_probe(pos: list[Features], negw: np.ndarray, ridge: float) -> tuple[_Linear, _Linear]:
    """C0 on all windows, then C1 on each injection's two top windows under C0."""
    c0 = _fit_linear((22, 27), np.vstack([w for _, w, _ in pos]), negw, ridge)
    tops = []
    for p, w, idx in pos:
        s = c0.log_odds(w)
        for i in range(len(p)):
            js = np.flatnonzero(idx == i)
            tops.append(w[js[np.argsort(-s[js])[:2]]])
    return c0, _fit_linear((22, 27), np.vstack(tops), negw, ridge)


def compare(folder: Path, also: list[str]) -> None:
    L = lambda name: _load(folder, name)  # noqa: E731
    fit_pos = [L(f"{s}-inj") for s in F.FIT]
    fit_neg = [L(f"{s}-ord-half") for s in F.FIT] + [L(n) for n in (
        "normal-calibration", "own-prompts", "own-squad-fit-half", "own-structured-fit")]
    ch_inj = [L(f"{s}-inj") for s in F.CHOOSE]
    extra = ("normal-heldout", "own-squad-choose", "own-structured-choose")
    ch_ord = [L(f"{s}-ord") for s in F.CHOOSE] + [L(n) for n in extra]
    groups = np.concatenate([np.load(folder / f"{s}-ord-group.npy") for s in F.CHOOSE]
                            + [np.full(len(L(n)[0]), n) for n in extra])

    def report(name: str, s_ord: np.ndarray, s_inj: np.ndarray, far: float = 0.01) -> float:
        thr = F.threshold(s_ord, groups, far)
        fa = s_ord > thr
        by = {str(g): int(fa[groups == g].sum()) for g in sorted(set(groups)) if fa[groups == g].sum()}
        print(f"{name}: injections {(s_inj > thr).sum()}/{len(s_inj)}, false alarms {fa.sum()}/{len(s_ord)} {by}",
              flush=True)
        return thr

    chosen: dict[str, tuple] = {}  # name -> (score of a list of Features, threshold)
    for ridge in (0.003, 0.03):
        a = _fit_linear((22, 27), _pooled(fit_pos), _pooled(fit_neg), ridge)
        thr = report(f"A pooled r={ridge}", a.log_odds(_pooled(ch_ord)), a.log_odds(_pooled(ch_inj)))
        if ridge == 0.003:
            chosen["A pooled r=0.003"] = (lambda sets, a=a: a.log_odds(_pooled(sets)), thr)
        b = _fit_linear((22, 27), np.c_[_pooled(fit_pos), _last(fit_pos)], np.c_[_pooled(fit_neg), _last(fit_neg)], ridge)
        report(f"B pooled+last r={ridge}", b.log_odds(np.c_[_pooled(ch_ord), _last(ch_ord)]),
               b.log_odds(np.c_[_pooled(ch_inj), _last(ch_inj)]))
    rng = np.random.default_rng(0)
    negw = []  # up to 6 random windows of each ordinary prompt
    for p, w, idx in fit_neg:
        for i in range(len(p)):
            js = np.flatnonzero(idx == i)
            negw.append(w[rng.choice(js, min(6, len(js)), replace=False)])
    negw = np.vstack(negw)
    a = _fit_linear((22, 27), _pooled(fit_pos), _pooled(fit_neg), 0.003)
    sa_o, sa_i = a.log_odds(_pooled(ch_ord)), a.log_odds(_pooled(ch_inj))
    for ridge in (0.01, 0.1):
        c0, c1 = _window_probe(fit_pos, negw, ridge)
        report(f"C0 all windows r={ridge}", _max_window(c0, ch_ord), _max_window(c0, ch_inj))
        sc_o, sc_i = _max_window(c1, ch_ord), _max_window(c1, ch_inj)
        thr = report(f"C1 top windows r={ridge}", sc_o, sc_i)
        chosen[f"C1 r={ridge}"] = (lambda sets, c1=c1: _max_window(c1, sets), thr)
        ta, tc = F.threshold(sa_o, groups, 0.005), F.threshold(sc_o, groups, 0.005)
        fa, hit = (sa_o > ta) | (sc_o > tc), (sa_i > ta) | (sc_i > tc)
        print(f"D A or C1 (half budget each) r={ridge}: injections {hit.sum()}/{len(hit)}, "
              f"false alarms {fa.sum()}/{len(fa)}", flush=True)
    for name in also:
        inj, ordi = [L(f"{name}-inj")], [L(f"{name}-ord")]
        og = np.load(folder / f"{name}-ord-group.npy")
        kinds = np.load(folder / f"{name}-ord-kind.npy")
        for design, (score, thr) in chosen.items():
            fa = score(ordi) > thr
            print(f"{name}, {design}: injections {(score(inj) > thr).sum()}/{len(inj[0][0])}, ordinary false alarms "
                  f"{fa.sum()}/{len(fa)} { {str(g): int(fa[og == g].sum()) for g in sorted(set(og))} }, data kinds "
                  f"{sorted(set(str(k) for k in kinds[fa & (og == 'data_request')]))}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True, help="folder for the window features (reused when present)")
    ap.add_argument("--also", action="append", default=[], metavar="SPLIT",
                    help="a development split (reported already) to score at the chosen thresholds")
    a = ap.parse_args(argv)
    for name in a.also:
        if not (ROOT / f"fixtures/degradation_heldout_{name}/prompts.jsonl").is_file():
            ap.error(f"--also {name!r}: no fixtures/degradation_heldout_{name}/prompts.jsonl")
        if name in (*F.FIT, *F.CHOOSE):
            ap.error(f"--also {name!r} is a fit or choosing split already")
        if not (ROOT / f"results/degradation_heldout_{name}.json").is_file():
            # a split with no report yet is blind: comparing designs on it would spend it
            ap.error(f"--also {name!r} has no report in results/ yet: it is still held out")
    collect(a.cache, a.also)
    compare(a.cache, a.also)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
