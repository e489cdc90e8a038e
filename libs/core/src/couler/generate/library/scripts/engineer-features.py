"""Feature engineering: date parts, log transforms, interactions and derived columns."""
from _common import columns_param, fail, need, parser, read_tables, table_format, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--date-columns", default="", help="columns expanded to year, month, weekday, hour")
p.add_argument("--log-columns", default="", help="columns replaced by log1p(value)")
p.add_argument("--interactions", default="", help="pairs a*b, comma-separated")
p.add_argument("--expressions", default="",
               help="derived columns, ';'-separated pandas expressions: ratio = a / b")
p.add_argument("--format", default="csv")
args = p.parse_args()

np = need("numpy")
pd = need("pandas")
tables = read_tables(args.in_data, "--in-data")
for name, df in tables:
    df = df.copy()
    for c in columns_param(args.date_columns):
        if c not in df.columns:
            fail(f"--date-columns: no column {c!r} in {name}")
        t = pd.to_datetime(df.pop(c), errors="coerce")
        df[f"{c}_year"], df[f"{c}_month"] = t.dt.year, t.dt.month
        df[f"{c}_weekday"], df[f"{c}_hour"] = t.dt.weekday, t.dt.hour
    for c in columns_param(args.log_columns):
        if c not in df.columns:
            fail(f"--log-columns: no column {c!r} in {name}")
        df[f"log_{c}"] = np.log1p(df.pop(c).clip(lower=0))
    for pair in columns_param(args.interactions):
        a, _, b = pair.partition("*")
        if a not in df.columns or b not in df.columns:
            fail(f"--interactions {pair!r}: both columns must exist in {name}")
        df[f"{a}_x_{b}"] = df[a] * df[b]
    for expression in filter(None, (e.strip() for e in args.expressions.split(";"))):
        try:
            df = df.eval(expression)
        except Exception as e:
            fail(f"--expressions {expression!r}: {e}")
    write_table(df, args.out_data, name, table_format(args))
    print(f"{name}: {len(df.columns)} columns")
