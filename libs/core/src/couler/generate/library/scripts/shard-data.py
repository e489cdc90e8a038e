"""Shard a table into N parts (round-robin, or by the hash of a key column) for parallel work."""
from _common import fail, need, parser, read_table, table_format, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--shards", default="4", help="the number of parts")
p.add_argument("--key", default="", help="a column whose rows stay together (hash partitioning)")
p.add_argument("--format", default="csv")
args = p.parse_args()

pd = need("pandas")
n = int(args.shards)
if n < 1:
    fail(f"--shards {args.shards}: must be at least 1")
df = read_table(args.in_data, "--in-data")
if args.key:
    if args.key not in df.columns:
        fail(f"--key {args.key!r}: no such column")
    part = pd.util.hash_pandas_object(df[args.key], index=False) % n
else:
    part = pd.Series(range(len(df)), index=df.index) % n
for k in range(n):
    write_table(df[part.to_numpy() == k], args.out_data, f"part-{k:05d}", table_format(args))
print(f"{len(df)} rows -> {n} shards")
