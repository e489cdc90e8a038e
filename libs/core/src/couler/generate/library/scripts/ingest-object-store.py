"""Download objects (a file or a prefix) from S3, GCS or Azure Blob storage with fsspec."""
from _common import fail, need, out_dir, parser, write_sample

p = parser(__doc__, produces=("data",))
p.add_argument("--source", required=True,
               help="s3://bucket/key, gs://bucket/prefix/, az://container/path (or sample://NAME)")
p.add_argument("--endpoint", default="", help="an S3-compatible endpoint URL (MinIO, R2, ...)")
p.add_argument("--key-env", default="AWS_ACCESS_KEY_ID",
               help="the environment variable holding the access key")
p.add_argument("--secret-env", default="AWS_SECRET_ACCESS_KEY",
               help="the environment variable holding the secret key")
p.add_argument("--format", default="csv", help="file format for a sample:// source")
args = p.parse_args()

if args.source.startswith("sample://"):
    write_sample(args.source[len("sample://"):], args.out_data, args.format)
    raise SystemExit(0)
import os

fsspec = need("fsspec")
options = {}
if args.source.startswith("s3://"):
    if args.endpoint:
        options["client_kwargs"] = {"endpoint_url": args.endpoint}
    if os.environ.get(args.key_env) and os.environ.get(args.secret_env):
        options.update(key=os.environ[args.key_env], secret=os.environ[args.secret_env])
try:
    fs, path = fsspec.core.url_to_fs(args.source, **options)
except (ImportError, ValueError) as e:
    fail(f"--source {args.source}: no filesystem for it ({e}); s3fs, gcsfs and adlfs are in "
         "the ml-tabular image")
if not fs.exists(path):
    fail(f"--source {args.source}: no such object or prefix")
out = out_dir(args.out_data)
if fs.isdir(path):
    fs.get(path.rstrip("/") + "/", str(out) + "/", recursive=True)
else:
    fs.get(path, str(out / path.rstrip("/").rsplit("/", 1)[-1]))
files = [f for f in out.rglob("*") if f.is_file()]
print(f"downloaded {len(files)} file(s), {sum(f.stat().st_size for f in files)} bytes "
      f"from {args.source}")
