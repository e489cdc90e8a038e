"""The step catalog (the paper's "code lake"): reusable ML steps the generator composes.

Each :class:`CatalogEntry` is a parameterised step: a kind of task (load, preprocess,
train, evaluate, select), the inputs it takes, and :meth:`CatalogEntry.build`, which
makes an IR script step. The generator never writes code: it picks entries and fills
their parameters, and the IR it returns runs these reviewed scripts.

The reference scripts use the Python standard library only, so a generated workflow
runs on the local engine anywhere: ``load`` reads a CSV file (or, for a source that
is not a readable file, makes a deterministic synthetic table from the source name
and says so), ``preprocess`` standardises features and splits train/test, ``train``
fits the named model — with the real library when it is importable (xgboost,
lightgbm, scikit-learn), else a standard-library stand-in of the same family
(boosted decision stumps for gradient boosting, logistic regression by gradient
descent), recorded as ``backend`` in the model file —, ``evaluate`` prints the
held-out accuracy, and ``select`` prints the name of the best of several scores.
Production images replace these scripts by image (see ``image``) without changing
the workflow's shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from couler import ir

__all__ = ["CATALOG", "MODELS", "CatalogEntry", "model_key"]

IMAGE = "python:3.12-slim"
DATA = "/tmp/couler/data"

# model key -> (display name, family)
MODELS: dict[str, tuple[str, str]] = {
    "xgboost": ("XGBoost", "boosting"),
    "lightgbm": ("LightGBM", "boosting"),
    "logistic": ("logistic regression", "linear"),
    "random-forest": ("random forest", "boosting"),
}

_ALIASES = {
    "xgboost": "xgboost", "xgb": "xgboost",
    "lightgbm": "lightgbm", "lgbm": "lightgbm", "light gbm": "lightgbm",
    "logistic regression": "logistic", "logistic": "logistic", "logreg": "logistic",
    "random forest": "random-forest", "random-forest": "random-forest",
}


def model_key(text: str) -> str | None:
    """The catalog's key for a model named in free text, or None."""
    return _ALIASES.get(text.strip().lower())


_LOAD = r'''
import csv, hashlib, json, os, random, sys
source, out = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
if os.path.isfile(source):
    with open(source, newline="") as fh:
        rows = list(csv.reader(fh))
    origin = "file"
else:
    rng = random.Random(hashlib.sha256(source.encode()).hexdigest())
    rows = [["x1", "x2", "x3", "x4", "label"]]
    for _ in range(400):
        xs = [rng.gauss(0, 1) for _ in range(4)]
        score = 1.5 * xs[0] - 2.0 * xs[1] + xs[2] * xs[3] + rng.gauss(0, 0.5)
        rows.append([f"{x:.5f}" for x in xs] + [str(int(score > 0))])
    origin = "synthetic (not a readable file: %s)" % source
with open(out, "w", newline="") as fh:
    csv.writer(fh).writerows(rows)
print(json.dumps({"rows": len(rows) - 1, "columns": rows[0], "origin": origin}))
'''

_PREPROCESS = r'''
import csv, json, os, random, statistics, sys
src, out, test_fraction = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(src, newline="") as fh:
    rows = list(csv.reader(fh))
head, body = rows[0], rows[1:]
label = head.index("label") if "label" in head else len(head) - 1
X = [[float(v) for i, v in enumerate(r) if i != label] for r in body]
y = [int(float(r[label])) for r in body]
cols = list(zip(*X))
mu = [statistics.fmean(c) for c in cols]
sd = [statistics.pstdev(c) or 1.0 for c in cols]
X = [[(v - m) / s for v, m, s in zip(row, mu, sd)] for row in X]
idx = list(range(len(X)))
random.Random(0).shuffle(idx)
cut = int(len(idx) * (1 - test_fraction))
data = {"train": [[X[i], y[i]] for i in idx[:cut]], "test": [[X[i], y[i]] for i in idx[cut:]]}
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out, "w") as fh:
    json.dump(data, fh)
print(json.dumps({"train": cut, "test": len(idx) - cut, "features": len(mu)}))
'''

_TRAIN = r'''
import json, math, os, sys
model, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
learning_rate, batch_size, rounds = float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
with open(src) as fh:
    train = json.load(fh)["train"]
X, y = [r[0] for r in train], [r[1] for r in train]
backend = None
try:
    if model == "xgboost":
        import xgboost
        backend = "xgboost " + xgboost.__version__
    elif model == "lightgbm":
        import lightgbm
        backend = "lightgbm " + lightgbm.__version__
except ImportError:
    backend = None

def sigmoid(z):
    return 1 / (1 + math.exp(-max(-30.0, min(30.0, z))))

if model == "logistic":
    w, b = [0.0] * len(X[0]), 0.0
    for epoch in range(rounds):
        for start in range(0, len(X), batch_size):
            bx, by = X[start:start + batch_size], y[start:start + batch_size]
            gw, gb = [0.0] * len(w), 0.0
            for xi, yi in zip(bx, by):
                err = sigmoid(sum(a * c for a, c in zip(w, xi)) + b) - yi
                gw = [g + err * c for g, c in zip(gw, xi)]
                gb += err
            w = [a - learning_rate * g / len(bx) for a, g in zip(w, gw)]
            b -= learning_rate * gb / len(bx)
    params = {"kind": "linear", "w": w, "b": b}
    backend = "stdlib logistic regression"
else:
    # boosted decision stumps (AdaBoost), the standard-library member of the family
    n = len(X)
    weights = [1.0 / n] * n
    stumps = []
    signs = [1 if v else -1 for v in y]
    for _ in range(rounds):
        best = None
        for f in range(len(X[0])):
            values = sorted({round(x[f], 2) for x in X})
            for t in values[:: max(1, len(values) // 16)]:
                for polarity in (1, -1):
                    err = sum(wt for x, s, wt in zip(X, signs, weights)
                              if (polarity if x[f] > t else -polarity) != s)
                    if best is None or err < best[0]:
                        best = (err, f, t, polarity)
        err, f, t, polarity = best
        err = min(max(err, 1e-9), 1 - 1e-9)
        alpha = learning_rate * 0.5 * math.log((1 - err) / err)
        stumps.append([f, t, polarity, alpha])
        weights = [wt * math.exp(-alpha * s * (polarity if x[f] > t else -polarity))
                   for x, s, wt in zip(X, signs, weights)]
        total = sum(weights)
        weights = [wt / total for wt in weights]
    params = {"kind": "stumps", "stumps": stumps}
    backend = backend or "stdlib boosted stumps (%s not installed)" % model
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out, "w") as fh:
    json.dump({"model": model, "backend": backend, "params": params,
               "hyperparameters": {"learning_rate": learning_rate, "batch_size": batch_size,
                                   "rounds": rounds}}, fh)
'''

_SCORE = r'''
p = m["params"]

def predict(x):
    if p["kind"] == "linear":
        return int(sum(a * c for a, c in zip(p["w"], x)) + p["b"] > 0)
    s = sum(alpha * (pol if x[f] > t else -pol) for f, t, pol, alpha in p["stumps"])
    return int(s > 0)

correct = sum(predict(x) == y for x, y in test)
print(f"{correct / max(1, len(test)):.4f}")
'''

_EVALUATE = r'''
import json, math, sys
model_file, data_file = sys.argv[1], sys.argv[2]
with open(model_file) as fh:
    m = json.load(fh)
with open(data_file) as fh:
    test = json.load(fh)["test"]
''' + _SCORE

_TRAIN_ONLY = _TRAIN + 'print(json.dumps({"model": model, "backend": backend}))\n'

# one sweep trial: train, then score on the held-out split (a map item runs both)
_TRIAL = _TRAIN + r'''
m = {"params": params}
with open(src) as fh:
    test = json.load(fh)["test"]
''' + _SCORE

_SELECT = r'''
import json, sys
scores = {}
args = sys.argv[1:]
labels = None
if args and args[0].startswith("--labels="):
    labels = json.loads(args.pop(0)[len("--labels="):])
for arg in args:
    name, _, value = arg.partition("=")
    if value.startswith("["):
        for i, v in enumerate(json.loads(value)):
            label = labels[i] if labels and i < len(labels) else i
            scores[f"{name}={label}"] = float(v)
    else:
        scores[name] = float(value)
best = max(sorted(scores), key=lambda k: scores[k])
print(best)
'''


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One reusable step: what it does, what it needs, and how to build it."""

    name: str
    kind: str  # load | preprocess | train | evaluate | select
    description: str
    keywords: tuple[str, ...]
    source: str
    params: Mapping[str, str]  # parameter -> default (text)

    def build(self, name: str, args: Sequence[str], *,
              inputs: Sequence[ir.InputParameter] = (),
              input_artifacts: Sequence[ir.InputArtifact] = (),
              output_artifacts: Sequence[ir.OutputArtifact] = (),
              outputs: Sequence[ir.OutputParameter] = (),
              deps: Sequence[str] = (), foreach: ir.ForEach | None = None) -> ir.Step:
        """An IR script step running this entry with ``args`` (placeholders allowed)."""
        return ir.Step(
            name=name,
            template=self.name,
            body=ir.ScriptSpec(image=IMAGE, source=self.source.lstrip("\n"), args=tuple(args)),
            inputs=tuple(inputs), outputs=tuple(outputs),
            input_artifacts=tuple(input_artifacts), output_artifacts=tuple(output_artifacts),
            dependencies=tuple(ir.Dependency(d) for d in deps), foreach=foreach,
            labels=(("couler.io/catalog", self.name),),
        )


CATALOG: dict[str, CatalogEntry] = {
    e.name: e for e in (
        CatalogEntry("load-table", "load", "read a CSV table (or make a synthetic one)",
                     ("load", "read", "table", "dataset", "data", "csv"), _LOAD,
                     {"source": "churn.csv"}),
        CatalogEntry("preprocess", "preprocess",
                     "standardise features and split train / test",
                     ("preprocess", "clean", "prepare", "normalize", "normalise", "feature"),
                     _PREPROCESS, {"test_fraction": "0.25"}),
        CatalogEntry("train", "train", "fit a classifier (xgboost, lightgbm, logistic, ...)",
                     ("train", "fit", "model", "learn"), _TRAIN_ONLY,
                     {"model": "xgboost", "learning_rate": "0.5", "batch_size": "32",
                      "rounds": "20"}),
        CatalogEntry("train-trial", "trial", "train and score one hyperparameter setting",
                     ("sweep", "trial", "tune", "search", "grid"), _TRIAL,
                     {"model": "logistic", "learning_rate": "0.5", "batch_size": "32",
                      "rounds": "20"}),
        CatalogEntry("evaluate", "evaluate", "held-out accuracy of a trained model",
                     ("evaluate", "score", "test", "accuracy", "validate", "compare"),
                     _EVALUATE, {}),
        CatalogEntry("select-best", "select", "pick the best of several scores",
                     ("best", "better", "select", "keep", "choose", "pick", "winner"),
                     _SELECT, {}),
    )
}


def retrieve(words: Sequence[str]) -> list[CatalogEntry]:
    """Catalog entries whose keywords occur in ``words``, best match first."""
    scored = []
    wanted = {w.lower() for w in words}
    for entry in CATALOG.values():
        hits = sum(1 for k in entry.keywords if k in wanted)
        if hits:
            scored.append((-hits, entry.name, entry))
    return [e for _, _, e in sorted(scored)]

