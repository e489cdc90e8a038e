"""Evaluate a classifier's accuracy (and balanced accuracy, confusion matrix)."""
from _common import evaluation_data, need, parser, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--target", default="", help="the label column (default: the model's)")
args = p.parse_args()

metrics = need("sklearn.metrics", package="scikit-learn")
model, df, y = evaluation_data(args)
truth, predicted = model.encoded(y), model.encoded(model.predict(df))
write_metric(args.metric_file, "accuracy", metrics.accuracy_score(truth, predicted),
             args.out_report, {
                 "balanced_accuracy": metrics.balanced_accuracy_score(truth, predicted),
                 "confusion_matrix": metrics.confusion_matrix(truth, predicted).tolist(),
                 "classes": model.classes, "rows": len(df)})
