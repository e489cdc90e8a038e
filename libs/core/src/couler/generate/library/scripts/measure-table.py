"""Measure one number from a table: its row count, or a statistic (mean, sum, min, max, a
percentile such as p99) of a column, optionally over the rows a pandas query keeps — the
value a condition compares ("if more than 200 pages changed", "unless p99 exceeds 250")."""
from _common import fail, need, parser, read_tables, write_metric

p = parser(__doc__, consumes=("data",), produces=("report",), metric=True)
p.add_argument("--stat", default="count",
               help="count, mean, sum, min, max, median, share (of rows --where keeps), "
                    "or pNN (a percentile, e.g. p99)")
p.add_argument("--column", default="", help="the column (every stat but count and share)")
p.add_argument("--where", default="", help="a pandas query keeping rows, e.g. changed == True")
args = p.parse_args()

import re

pd = need("pandas")
df = pd.concat([t for _, t in read_tables(args.in_data, "--in-data")], ignore_index=True)
total = len(df)
if args.where:
    try:
        df = df.query(args.where, engine="python")
    except Exception as e:  # pandas raises many kinds for a bad expression
        fail(f"--where {args.where!r}: {e}")
stat = args.stat.lower()
if stat == "count":
    value = len(df)
elif stat == "share":
    value = len(df) / total if total else 0.0
else:
    if args.column not in df.columns:
        fail(f"--column {args.column!r}: no such column "
             f"(columns: {', '.join(map(str, df.columns))})")
    column = pd.to_numeric(df[args.column], errors="coerce").dropna()
    if column.empty:
        fail(f"--column {args.column!r}: no numbers in it")
    percentile = re.fullmatch(r"p(\d{1,2}(?:\.\d+)?)", stat)
    if percentile:
        value = float(column.quantile(float(percentile.group(1)) / 100))
    elif stat in ("mean", "sum", "min", "max", "median"):
        value = float(getattr(column, stat)())
    else:
        fail(f"--stat {args.stat!r}: expected count, share, mean, sum, min, max, median or pNN")
write_metric(args.metric_file, "value", value, args.out_report,
             {"stat": stat, "column": args.column, "rows": len(df), "of": total})
