"""Evaluate a regressor's coefficient of determination (R2, explained variance)."""
from _common import evaluation_data, need, parser, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--target", default="", help="the label column (default: the model's)")
args = p.parse_args()

metrics = need("sklearn.metrics", package="scikit-learn")
model, df, y = evaluation_data(args)
truth, predicted = y.astype(float).to_numpy(), model.predict(df).astype(float)
write_metric(args.metric_file, "r2", metrics.r2_score(truth, predicted), args.out_report,
             {"explained_variance": metrics.explained_variance_score(truth, predicted),
              "rows": len(df)})
