"""Upsert rows into a key-value store or cache (Redis hashes) for online serving."""
from _common import env_secret, fail, need, parser, read_tables

p = parser(__doc__, consumes=("predictions", "data"), optional=("predictions", "data"))
p.add_argument("--key-column", required=True, help="the column whose value names each key")
p.add_argument("--prefix", default="couler:", help="prepended to every key")
p.add_argument("--url-env", default="REDIS_URL",
               help="the environment variable holding redis://... (a secret reference)")
p.add_argument("--ttl", default="0", help="seconds each key lives (0: forever)")
args = p.parse_args()

source = args.in_predictions or args.in_data
if not source:
    fail("give --in-predictions or --in-data (the rows to upsert)")
redis = need("redis")
client = redis.Redis.from_url(env_secret(args.url_env, "--url-env"))
count = 0
for name, df in read_tables(source, "--in-predictions/--in-data"):
    if args.key_column not in df.columns:
        fail(f"--key-column {args.key_column!r}: no such column in {name}")
    with client.pipeline() as pipe:
        for row in df.astype(str).to_dict("records"):
            key = f"{args.prefix}{row[args.key_column]}"
            pipe.hset(key, mapping=row)
            if int(args.ttl):
                pipe.expire(key, int(args.ttl))
            count += 1
        pipe.execute()
print(f"upserted {count} keys with prefix {args.prefix!r}")
