"""Score data with a trained anomaly detector and count the anomalies (rows or windows the
model flags); the count is the step's metric."""
from _common import Predictor, need, parser, read_tables, write_metric, write_table

p = parser(__doc__, consumes=("model", "data"), produces=("predictions", "report"), metric=True)
p.add_argument("--id-column", default="", help="a column copied to the predictions")
args = p.parse_args()

pd = need("pandas")
model = Predictor(args.in_model)
flagged = 0
total = 0
for name, df in read_tables(args.in_data, "--in-data"):
    out = pd.DataFrame(index=df.index)
    if args.id_column and args.id_column in df.columns:
        out[args.id_column] = df[args.id_column]
    flags = model.predict(df)
    out["anomaly"] = flags
    flagged += int(pd.Series(flags).astype(int).sum())
    total += len(df)
    write_table(out, args.out_predictions, "predictions" if name == "table" else name)
print(f"{flagged} of {total} rows flagged")
write_metric(args.metric_file, "anomalies", flagged, args.out_report, {"rows": total})
