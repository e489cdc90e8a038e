"""Encode categorical columns: one-hot (dummy) or ordinal encoding."""
from _common import (
    columns_param,
    fail,
    fitting_table,
    need,
    parser,
    read_tables,
    table_format,
    write_table,
)

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--columns", default="", help="comma-separated (default: every text column)")
p.add_argument("--method", default="onehot", help="onehot or ordinal")
p.add_argument("--target", default="label", help="a column never encoded (the label)")
p.add_argument("--max-categories", default="50",
               help="rarer categories beyond this many become 'other'")
p.add_argument("--drop-first", default="false", help="drop the first dummy of each column")
p.add_argument("--format", default="csv")
args = p.parse_args()

pd = need("pandas")
tables = read_tables(args.in_data, "--in-data")
fit = fitting_table(tables)
columns = columns_param(args.columns) or [
    c for c in fit.columns if fit[c].dtype.kind in "OSUb" and c != args.target]
missing = [c for c in columns if c not in fit.columns]
if missing:
    fail(f"--columns: no such column(s) {missing}")
keep = {c: fit[c].astype(str).value_counts().index[: int(args.max_categories)].tolist()
        for c in columns}
for name, df in tables:
    df = df.copy()
    for c in columns:
        values = df[c].astype(str).where(df[c].astype(str).isin(keep[c]), "other")
        if args.method == "ordinal":
            df[c] = values.map({v: i for i, v in enumerate(keep[c])}).fillna(len(keep[c]))
        elif args.method == "onehot":
            cats = pd.Categorical(values, categories=[*keep[c], "other"])
            dummies = pd.get_dummies(cats, prefix=c, drop_first=args.drop_first == "true",
                                     dtype="int8")
            dummies.index = df.index
            df = pd.concat([df.drop(columns=[c]), dummies], axis=1)
        else:
            fail(f"--method {args.method!r}: expected onehot or ordinal")
    write_table(df, args.out_data, name, table_format(args))
print(f"{args.method}-encoded {columns} in {len(tables)} table(s)")
