"""Evaluate a classifier's ROC AUC on held-out data (one-vs-rest for many classes)."""
from _common import evaluation_data, fail, need, parser, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--target", default="", help="the label column (default: the model's)")
args = p.parse_args()

metrics = need("sklearn.metrics", package="scikit-learn")
model, df, y = evaluation_data(args)
proba = model.proba(df)
if proba is None:
    fail(f"--in-model {args.in_model}: the model gives no probabilities (AUC needs scores)")
truth = model.encoded(y)
if proba.shape[1] == 2:
    auc = metrics.roc_auc_score(truth, proba[:, 1])
else:
    auc = metrics.roc_auc_score(truth, proba, multi_class="ovr", labels=list(range(proba.shape[1])))
write_metric(args.metric_file, "auc", auc, args.out_report, {"rows": len(df)})
