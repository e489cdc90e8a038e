"""Evaluate a classifier's probability calibration: expected calibration error and Brier score."""
from _common import evaluation_data, fail, need, parser, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--target", default="", help="the label column (default: the model's)")
p.add_argument("--bins", default="10")
args = p.parse_args()

import itertools

np = need("numpy")
metrics = need("sklearn.metrics", package="scikit-learn")
model, df, y = evaluation_data(args)
proba = model.proba(df)
if proba is None:
    fail(f"--in-model {args.in_model}: the model gives no probabilities to calibrate")
truth = model.encoded(y)
confidence, predicted = proba.max(axis=1), proba.argmax(axis=1)
edges = np.linspace(0, 1, int(args.bins) + 1)
ece, table = 0.0, []
for lo, hi in itertools.pairwise(edges):
    inside = (confidence > lo) & (confidence <= hi)
    if inside.any():
        accuracy = float((predicted[inside] == truth[inside]).mean())
        mean = float(confidence[inside].mean())
        ece += inside.mean() * abs(accuracy - mean)
        table.append({"bin": [float(lo), float(hi)], "rows": int(inside.sum()),
                      "accuracy": accuracy, "confidence": mean})
onehot = np.eye(proba.shape[1])[truth]
brier = float(((proba - onehot) ** 2).sum(axis=1).mean())
write_metric(args.metric_file, "calibration_error", ece, args.out_report,
             {"brier": brier, "bins": table, "rows": len(df)})
