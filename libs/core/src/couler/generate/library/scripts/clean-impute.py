"""Clean a table: drop duplicate rows and mostly-empty columns, impute missing values."""
from _common import fail, fitting_table, number, parser, read_tables, table_format, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--strategy", default="median",
               help="median, mean, most_frequent, constant or drop (drop incomplete rows)")
p.add_argument("--fill-value", default="0", help="the value of the constant strategy")
p.add_argument("--max-missing", default="0.5",
               help="drop columns missing more than this fraction of values")
p.add_argument("--drop-duplicates", default="true")
p.add_argument("--format", default="csv")
args = p.parse_args()

if args.strategy not in ("median", "mean", "most_frequent", "constant", "drop"):
    fail(f"--strategy {args.strategy!r}: expected median, mean, most_frequent, constant or drop")
max_missing = number(args.max_missing, "--max-missing", 0, 1)
tables = read_tables(args.in_data, "--in-data")
fit = fitting_table(tables)
drop = [c for c in fit.columns if fit[c].isna().mean() > max_missing]
fit = fit.drop(columns=drop)
fills = {}
for c in fit.columns:
    numeric = fit[c].dtype.kind in "iuf"
    if args.strategy == "constant":
        fills[c] = float(args.fill_value) if numeric else args.fill_value
    elif args.strategy in ("median", "mean") and numeric:
        fills[c] = getattr(fit[c], args.strategy)()
    elif args.strategy != "drop" and not fit[c].mode().empty:
        fills[c] = fit[c].mode().iloc[0]
for name, df in tables:
    before = len(df)
    df = df.drop(columns=[c for c in drop if c in df.columns])
    if args.drop_duplicates.lower() == "true":
        df = df.drop_duplicates()
    missing = int(df.isna().sum().sum())
    df = df.dropna() if args.strategy == "drop" else df.fillna(fills)
    write_table(df, args.out_data, name, table_format(args))
    print(f"{name}: {before} -> {len(df)} rows, {missing} missing values handled, "
          f"dropped columns {drop}")
