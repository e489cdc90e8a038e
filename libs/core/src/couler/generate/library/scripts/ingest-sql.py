"""Run a SQL query on a database or warehouse (SQLAlchemy URL from a secret) into a table."""
from _common import env_secret, fail, need, out_dir, parser, write_table

p = parser(__doc__, produces=("data",))
p.add_argument("--query", required=True, help="the SELECT statement (or a table name)")
p.add_argument("--url-env", default="DATABASE_URL",
               help="the environment variable holding the SQLAlchemy URL, e.g. "
                    "postgresql://, mysql+pymysql://, snowflake://, bigquery://, "
                    "redshift+redshift_connector:// (a secret reference)")
p.add_argument("--format", default="parquet", help="csv, parquet or jsonl")
p.add_argument("--chunksize", default="0", help="rows per fetch (0: all at once)")
args = p.parse_args()

url = env_secret(args.url_env, "--url-env")
sqlalchemy = need("sqlalchemy", package="SQLAlchemy")
pd = need("pandas")
query = args.query.strip()
if " " not in query:  # a bare table name
    query = f"SELECT * FROM {query}"
try:
    engine = sqlalchemy.create_engine(url)
except Exception as e:  # a bad URL or a missing driver; never echo the URL (credentials)
    fail(f"--url-env {args.url_env}: cannot connect with its URL ({type(e).__name__}: "
         f"{str(e).replace(url, '***')[:200]}); the ml-tabular image has the Postgres, MySQL, "
         "Snowflake, BigQuery and Redshift drivers")
try:
    with engine.connect() as conn:
        chunks = int(args.chunksize) or None
        result = pd.read_sql(sqlalchemy.text(query), conn, chunksize=chunks)
        df = pd.concat(list(result), ignore_index=True) if chunks else result
except Exception as e:
    fail(f"--query: the database refused it ({type(e).__name__}: "
         f"{str(e).replace(url, '***')[:300]})")
finally:
    engine.dispose()
path = write_table(df, out_dir(args.out_data), "table", args.format)
print(f"{len(df)} rows, {len(df.columns)} columns -> {path}")
