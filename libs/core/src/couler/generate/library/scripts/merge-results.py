"""Merge results: concatenate shards or predictions, or join tables on a key."""
from _common import columns_param, fail, need, parser, read_tables, table_format, write_table

p = parser(__doc__, consumes=("predictions", "data"), produces=("data",),
           optional=("predictions", "data"))
p.add_argument("--on", default="", help="join on these comma-separated key columns ('' = stack)")
p.add_argument("--how", default="inner", help="inner, left, right or outer (joins)")
p.add_argument("--format", default="csv")
args = p.parse_args()

pd = need("pandas")
tables = []
for kind in ("data", "predictions"):
    path = getattr(args, f"in_{kind}")
    if path:
        tables += read_tables(path, f"--in-{kind}")
if not tables:
    fail("give --in-data and/or --in-predictions (the tables to merge)")
keys = columns_param(args.on)
if keys:
    merged = tables[0][1]
    for name, df in tables[1:]:
        missing = [k for k in keys if k not in df.columns or k not in merged.columns]
        if missing:
            fail(f"--on: key column(s) {missing} missing in {name}")
        merged = merged.merge(df, on=keys, how=args.how, suffixes=("", f"_{name}"))
else:
    merged = pd.concat([df for _, df in tables], ignore_index=True)
write_table(merged, args.out_data, "table", table_format(args))
print(f"merged {len(tables)} table(s) -> {len(merged)} rows")
