"""Evaluate a classifier's F1 score on held-out data (binary, macro, micro or weighted)."""
from _common import evaluation_data, need, parser, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--target", default="", help="the label column (default: the model's)")
p.add_argument("--average", default="auto", help="auto (binary for two classes, else macro), "
               "binary, macro, micro or weighted")
args = p.parse_args()

metrics = need("sklearn.metrics", package="scikit-learn")
model, df, y = evaluation_data(args)
truth, predicted = model.encoded(y), model.encoded(model.predict(df))
average = args.average
if average == "auto":
    average = "binary" if len(model.classes) == 2 else "macro"
f1 = metrics.f1_score(truth, predicted, average=average)
write_metric(args.metric_file, "f1", f1, args.out_report, {
    "average": average, "rows": len(df),
    "precision": metrics.precision_score(truth, predicted, average=average, zero_division=0),
    "recall": metrics.recall_score(truth, predicted, average=average, zero_division=0)})
