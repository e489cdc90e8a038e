"""Resample a time series to a regular frequency and interpolate the gaps."""
from _common import fail, need, parser, read_table, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--time-column", default="date")
p.add_argument("--freq", default="D", help="a pandas frequency: h, D, W, MS, ...")
p.add_argument("--agg", default="mean", help="mean, sum, min, max, last or first")
p.add_argument("--interpolate", default="linear", help="linear, time, ffill, bfill or none")
p.add_argument("--group", default="", help="a column of series ids: each is resampled alone")
p.add_argument("--format", default="csv")
args = p.parse_args()

pd = need("pandas")
df = read_table(args.in_data, "--in-data")
if args.time_column not in df.columns:
    fail(f"--time-column {args.time_column!r}: no such column")
if args.agg not in ("mean", "sum", "min", "max", "last", "first"):
    fail(f"--agg {args.agg!r}: expected mean, sum, min, max, last or first")
df[args.time_column] = pd.to_datetime(df[args.time_column], errors="coerce")
if df[args.time_column].isna().all():
    fail(f"--time-column {args.time_column!r}: no value parses as a date/time")


def regular(frame):
    frame = frame.set_index(args.time_column).sort_index().select_dtypes("number")
    out = getattr(frame.resample(args.freq), args.agg)()
    if args.interpolate in ("ffill", "bfill"):
        out = getattr(out, args.interpolate)()
    elif args.interpolate != "none":
        out = out.interpolate(method=args.interpolate)
    return out


if args.group:
    parts = [regular(g).assign(**{args.group: k}) for k, g in df.groupby(args.group)]
    out = pd.concat(parts)
else:
    out = regular(df)
out = out.reset_index()
write_table(out, args.out_data, "table", args.format)
print(f"{len(df)} rows -> {len(out)} rows at frequency {args.freq}")
