"""Upload results (predictions, reports, models, data) to S3, GCS or Azure Blob with fsspec."""
from _common import existing, fail, need, parser

p = parser(__doc__, consumes=("predictions", "report", "model", "data"),
           optional=("predictions", "report", "model", "data"))
p.add_argument("--destination", required=True, help="s3://bucket/prefix/, gs://..., az://...")
p.add_argument("--endpoint", default="", help="an S3-compatible endpoint URL (MinIO, R2, ...)")
args = p.parse_args()

sources = [(k, getattr(args, f"in_{k}")) for k in ("predictions", "report", "model", "data")
           if getattr(args, f"in_{k}")]
if not sources:
    fail("give at least one of --in-predictions, --in-report, --in-model, --in-data")
fsspec = need("fsspec")
options = {"client_kwargs": {"endpoint_url": args.endpoint}} if args.endpoint else {}
fs, root = fsspec.core.url_to_fs(args.destination, **options)
count = 0
for kind, path in sources:
    local = existing(path, f"--in-{kind}")
    fs.put(str(local) + "/", f"{root.rstrip('/')}/{kind}/", recursive=True)
    count += sum(1 for f in local.rglob("*") if f.is_file())
print(f"uploaded {count} file(s) to {args.destination}")
