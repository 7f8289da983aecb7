"""Exploration for a next detector (stop 56; development splits only, no project figure): can a linear
probe on the model's pooled hidden states (the score's own features, ``ood.collect``) tell planted or
direct injections from ordinary requests on splits it was not fitted on?

Injections are the odd items whose kind name says so (the regex below); ordinary items are 150 drawn
per split from data requests, plain English and plain requests in other languages. Two arrangements:
fit on 12-06b and 12-06c, threshold at 2% false alarms on 12-06d's ordinary items, report on 12-06e-g;
fit on 12-06b-d, threshold on 12-06e and 12-06f, report on 12-06g. Every one of these splits is a
development split (each was measured once before), so nothing here is a held-out figure. Prints the
probe's, the text rules' and their union's rates. About 7 minutes on 2 cores:

    python scripts/explore_injection_probe.py

Must not be imported by the engine or the harness; imports ``reference_engine`` and scikit-learn.
"""
import json, random, re, sys, time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from reference_engine import Engine, ood
from reference_engine.degradation.text_rules import text_anomaly_reasons
INJ = re.compile(r'directive|inject|override|jailbreak|ploy|demand|claim|persona|prompt|instruction|secret|rule|game|consent|alter_ego|exfil|smuggl|refusal|prefix|threat|polic|agent|planted|dan_|roleplay|grandma|developer_mode|sudo|penalty|dual_answer|villain|acrostic|unrestricted|leak|extraction|ignore|twin|priming|beacon|markdown_image|exempt|switch|console|banner|forbidden|bedtime|opposite|filter_dodge|concatenation|obey|forgery|hijack')
ORD = ('data_request', 'plain_en', 'plain_language')
rng = random.Random(0)
def load(s, n_ord):
    items = [json.loads(l) for l in open(ROOT / f'fixtures/degradation_heldout_2026-12-06{s}/prompts.jsonl', encoding='utf-8')]
    inj = [x['text'] for x in items if x['group'] == 'odd' and INJ.search(x['kind'])]
    ordi = [x['text'] for x in items if x['group'] in ORD]
    rng.shuffle(ordi)
    return inj, ordi[:n_ord]
e = Engine.load()
w = e.weights
def feats(texts):
    st = ood.collect(w, e.encode, texts)
    return np.array([np.concatenate([s.pooled[b] for b in sorted(s.pooled)]) for s in st])
R = {"prompt_injection", "embedded_instruction", "special_token_text"}
data = {}
t0 = time.time()
for s, n in (('b', 150), ('c', 150), ('d', 150), ('e', 150), ('f', 150), ('g', 150)):
    inj, ordi = load(s, n)
    data[s] = (feats(inj), feats(ordi), [bool(R & set(text_anomaly_reasons(t))) for t in inj],
               [bool(R & set(text_anomaly_reasons(t))) for t in ordi])
    print(s, len(inj), len(ordi), f"{time.time()-t0:.0f} s", flush=True)
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
def xy(splits):
    X = np.concatenate([np.concatenate([data[s][0], data[s][1]]) for s in splits])
    y = np.concatenate([np.r_[np.ones(len(data[s][0])), np.zeros(len(data[s][1]))] for s in splits])
    return X, y
for fit, choose, test in ((('b', 'c'), ('d',), ('e', 'f', 'g')), (('b', 'c', 'd'), ('e', 'f'), ('g',))):
    X, y = xy(fit); sc = StandardScaler().fit(X)
    for C in (0.01, 0.1, 1.0):
        m = LogisticRegression(C=C, max_iter=2000).fit(sc.transform(X), y)
        Xc, yc = xy(choose); pc = m.decision_function(sc.transform(Xc))
        thr = np.quantile(pc[yc == 0], 0.98)  # 2% false alarms on the choosing split's ordinary items
        Xt, yt = xy(test); pt = m.decision_function(sc.transform(Xt))
        tpr = (pt[yt == 1] > thr).mean(); fpr = (pt[yt == 0] > thr).mean()
        rules_inj = np.concatenate([data[s][2] for s in test]); rules_ord = np.concatenate([data[s][3] for s in test])
        union = ((pt[yt == 1] > thr) | rules_inj).mean()
        print(f"fit {fit} choose {choose} test {test} C={C}: probe TPR {tpr:.3f} FPR {fpr:.3f} | rules TPR {rules_inj.mean():.3f} FPR {rules_ord.mean():.3f} | union TPR {union:.3f}")
