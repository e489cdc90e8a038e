"""Write tables back to a database or warehouse table (SQLAlchemy URL from a secret)."""
from _common import env_secret, fail, need, parser, read_tables

p = parser(__doc__, consumes=("predictions", "data"), optional=("predictions", "data"))
p.add_argument("--table", required=True, help="the destination table, e.g. analytics.scores")
p.add_argument("--url-env", default="DATABASE_URL",
               help="the environment variable holding the SQLAlchemy URL (Postgres, MySQL, "
                    "Snowflake, BigQuery, Redshift; a secret reference)")
p.add_argument("--if-exists", default="append", help="append, replace or fail")
p.add_argument("--chunksize", default="10000")
args = p.parse_args()

source = args.in_predictions or args.in_data
if not source:
    fail("give --in-predictions or --in-data (the rows to write)")
if args.if_exists not in ("append", "replace", "fail"):
    fail(f"--if-exists {args.if_exists!r}: expected append, replace or fail")
url = env_secret(args.url_env, "--url-env")
sqlalchemy = need("sqlalchemy", package="SQLAlchemy")
pd = need("pandas")
schema, _, table = args.table.rpartition(".")
frame = pd.concat([df for _, df in read_tables(source, "--in-predictions/--in-data")],
                  ignore_index=True)
engine = sqlalchemy.create_engine(url)
try:
    with engine.begin() as conn:
        frame.to_sql(table, conn, schema=schema or None, if_exists=args.if_exists, index=False,
                     chunksize=int(args.chunksize))
except Exception as e:
    fail(f"--table {args.table}: the database refused the rows ({type(e).__name__}: "
         f"{str(e).replace(url, '***')[:300]})")
finally:
    engine.dispose()
print(f"wrote {len(frame)} rows to {args.table} ({args.if_exists})")
