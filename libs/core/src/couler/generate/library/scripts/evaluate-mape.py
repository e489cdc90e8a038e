"""Evaluate a regressor's mean absolute percentage error (MAPE, a fraction)."""
from _common import evaluation_data, fail, need, parser, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--target", default="", help="the label column (default: the model's)")
args = p.parse_args()

metrics = need("sklearn.metrics", package="scikit-learn")
model, df, y = evaluation_data(args)
truth, predicted = y.astype(float).to_numpy(), model.predict(df).astype(float)
if (truth == 0).any():
    fail(f"--target: {int((truth == 0).sum())} true values are 0 (MAPE is undefined; use rmse)")
write_metric(args.metric_file, "mape", metrics.mean_absolute_percentage_error(truth, predicted),
             args.out_report, {"rows": len(df)})
