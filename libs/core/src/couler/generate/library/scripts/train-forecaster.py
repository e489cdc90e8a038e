"""Fit a time-series forecaster (statsmodels ExponentialSmoothing / Holt-Winters, SARIMA, ARIMA)."""
from _common import fail, need, out_dir, parser, read_table, write_json, write_table

p = parser(__doc__, consumes=("data",), produces=("model", "predictions"))
p.add_argument("--method", default="exponential-smoothing",
               help="exponential-smoothing (Holt-Winters), sarima or arima")
p.add_argument("--time-column", default="date")
p.add_argument("--value-column", default="value")
p.add_argument("--horizon", default="30", help="steps forecast (and held out to score)")
p.add_argument("--seasonal-periods", default="7", help="the season's length in steps")
p.add_argument("--order", default="1,1,1", help="ARIMA (p,d,q)")
p.add_argument("--seasonal-order", default="1,1,1", help="SARIMA seasonal (P,D,Q)")
args = p.parse_args()

pd = need("pandas")
tsa = need("statsmodels.tsa.api", package="statsmodels")
df = read_table(args.in_data, "--in-data", "train")
for column, flag in ((args.time_column, "--time-column"), (args.value_column, "--value-column")):
    if column not in df.columns:
        fail(f"{flag} {column!r}: no such column")
series = df.set_index(pd.to_datetime(df[args.time_column]))[args.value_column].astype(float)
series = series.sort_index()
if series.index.inferred_freq:
    series = series.asfreq(series.index.inferred_freq)
horizon, season = int(args.horizon), int(args.seasonal_periods)
if len(series) <= horizon + 2 * season:
    fail(f"--horizon {horizon}: the series has only {len(series)} points")
order = tuple(int(v) for v in args.order.split(","))
seasonal = (*(int(v) for v in args.seasonal_order.split(",")), season)


def fit(y):
    if args.method == "exponential-smoothing":
        return tsa.ExponentialSmoothing(y, trend="add", seasonal="add",
                                        seasonal_periods=season).fit()
    if args.method == "sarima":
        return tsa.SARIMAX(y, order=order, seasonal_order=seasonal).fit(disp=False)
    if args.method == "arima":
        return tsa.ARIMA(y, order=order).fit()
    fail(f"--method {args.method!r}: expected exponential-smoothing, sarima or arima")


import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # statsmodels' convergence chatter
    held = fit(series.iloc[:-horizon])
    forecast = held.forecast(horizon)
    final = fit(series)
predictions = pd.DataFrame({args.time_column: series.index[-horizon:],
                            "actual": series.iloc[-horizon:].to_numpy(),
                            "prediction": forecast.to_numpy()})
write_table(predictions, args.out_predictions, "predictions")
model_dir = out_dir(args.out_model)
final.save(str(model_dir / "model.pickle"))
write_json(model_dir / "card.json", {
    "library": "statsmodels", "file": "model.pickle", "task": "forecasting",
    "method": args.method, "target": args.value_column, "horizon": horizon,
    "seasonal_periods": season, "train_points": len(series)})
print(f"{args.method}: {len(series)} points, held-out forecast of {horizon} steps")
