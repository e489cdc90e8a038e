"""Score a table with a trained model in batch (labels, values or anomaly flags; probabilities)."""
from _common import Predictor, need, parser, read_tables, write_table

p = parser(__doc__, consumes=("model", "data"), produces=("predictions",))
p.add_argument("--id-column", default="", help="a column copied to the predictions (row ids)")
p.add_argument("--keep-columns", default="false", help="copy every input column as well")
p.add_argument("--format", default="csv")
args = p.parse_args()

pd = need("pandas")
model = Predictor(args.in_model)
total = 0
for name, df in read_tables(args.in_data, "--in-data"):
    out = df.copy() if args.keep_columns == "true" else pd.DataFrame(index=df.index)
    if args.id_column and args.id_column in df.columns:
        out[args.id_column] = df[args.id_column]
    target = model.card.get("target")
    if target and target in df.columns:
        out[target] = df[target]
    out["prediction"] = model.predict(df)
    proba = model.proba(df)
    if proba is not None:
        for k, c in enumerate(model.classes):
            out[f"proba_{c}"] = proba[:, k]
    write_table(out, args.out_predictions, "predictions" if name == "table" else name,
                args.format)
    total += len(df)
print(f"{total} rows scored with the {model.library} model")
