"""Filter rows by a condition and keep or drop columns (a pandas query)."""
from _common import columns_param, fail, parser, read_tables, table_format, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--query", default="", help="keep rows where this holds, e.g. 'age >= 18'")
p.add_argument("--keep-columns", default="", help="comma-separated columns kept")
p.add_argument("--drop-columns", default="", help="comma-separated columns dropped")
p.add_argument("--format", default="csv")
args = p.parse_args()

for name, df in read_tables(args.in_data, "--in-data"):
    before = len(df)
    if args.query:
        try:
            df = df.query(args.query)
        except Exception as e:
            fail(f"--query {args.query!r}: {e}")
    keep, drop = columns_param(args.keep_columns), columns_param(args.drop_columns)
    unknown = [c for c in keep + drop if c not in df.columns]
    if unknown:
        fail(f"--keep-columns/--drop-columns: no such column(s) {unknown} in {name}")
    df = df[keep] if keep else df
    df = df.drop(columns=drop)
    write_table(df, args.out_data, name, table_format(args))
    print(f"{name}: {before} -> {len(df)} rows, {len(df.columns)} columns")
