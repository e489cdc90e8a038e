"""Balance classes by random oversampling of minority classes or undersampling the majority."""
from _common import fail, labels, need, parser, read_tables, table_format, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--target", default="label")
p.add_argument("--method", default="oversample", help="oversample or undersample")
p.add_argument("--seed", default="42")
p.add_argument("--format", default="csv")
args = p.parse_args()

pd = need("pandas")
for name, df in read_tables(args.in_data, "--in-data"):
    if name == "test":  # the held-out rows keep their real distribution
        write_table(df, args.out_data, name, table_format(args))
        continue
    counts = labels(df, args.target).value_counts()
    if args.method not in ("oversample", "undersample"):
        fail(f"--method {args.method!r}: expected oversample or undersample")
    n = counts.max() if args.method == "oversample" else counts.min()
    parts = [g.sample(n=n, replace=len(g) < n, random_state=int(args.seed))
             for _, g in df.groupby(args.target)]
    out = pd.concat(parts).sample(frac=1, random_state=int(args.seed))
    write_table(out, args.out_data, name, table_format(args))
    print(f"{name}: {dict(counts)} -> {n} rows per class")
