"""Evaluate a classifier's top-k accuracy (the true class among the k most likely)."""
from _common import evaluation_data, fail, need, parser, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--target", default="", help="the label column (default: the model's)")
p.add_argument("--k", default="5")
args = p.parse_args()

metrics = need("sklearn.metrics", package="scikit-learn")
model, df, y = evaluation_data(args)
proba = model.proba(df)
if proba is None:
    fail(f"--in-model {args.in_model}: the model gives no probabilities (top-k needs scores)")
k = min(int(args.k), proba.shape[1])
scores = proba[:, 1] if proba.shape[1] == 2 else proba
value = metrics.top_k_accuracy_score(model.encoded(y), scores, k=k,
                                     labels=list(range(proba.shape[1])))
write_metric(args.metric_file, "top_k_accuracy", value, args.out_report, {"k": k, "rows": len(df)})
