"""Evaluate a forecast against actuals: MAPE (RMSE, MAE and sMAPE in the report)."""
from _common import fail, need, parser, read_table, write_metric

p = parser(__doc__, consumes=("predictions",), produces=("report",), metric=True)
p.add_argument("--actual-column", default="actual")
p.add_argument("--prediction-column", default="prediction")
args = p.parse_args()

np = need("numpy")
df = read_table(args.in_predictions, "--in-predictions", "predictions")
for column, flag in ((args.actual_column, "--actual-column"),
                     (args.prediction_column, "--prediction-column")):
    if column not in df.columns:
        fail(f"{flag} {column!r}: no such column")
actual = df[args.actual_column].astype(float).to_numpy()
predicted = df[args.prediction_column].astype(float).to_numpy()
if (actual == 0).any():
    fail(f"--actual-column: {int((actual == 0).sum())} actual values are 0 (MAPE is undefined)")
error = predicted - actual
write_metric(args.metric_file, "mape", float(np.mean(np.abs(error / actual))), args.out_report, {
    "rmse": float(np.sqrt(np.mean(error ** 2))), "mae": float(np.mean(np.abs(error))),
    "smape": float(np.mean(2 * np.abs(error) / (np.abs(actual) + np.abs(predicted)))),
    "points": len(df)})
