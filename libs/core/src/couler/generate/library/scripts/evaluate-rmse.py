"""Evaluate a regressor's root mean squared error (RMSE; MAE and R2 in the report)."""
from _common import evaluation_data, need, parser, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--target", default="", help="the label column (default: the model's)")
args = p.parse_args()

np = need("numpy")
metrics = need("sklearn.metrics", package="scikit-learn")
model, df, y = evaluation_data(args)
truth, predicted = y.astype(float).to_numpy(), model.predict(df).astype(float)
write_metric(args.metric_file, "rmse", float(np.sqrt(metrics.mean_squared_error(truth, predicted))),
             args.out_report, {"mae": metrics.mean_absolute_error(truth, predicted),
                               "r2": metrics.r2_score(truth, predicted), "rows": len(df)})
