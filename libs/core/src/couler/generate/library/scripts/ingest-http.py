"""Download a file over HTTP(S) (a CSV, Parquet or JSON export, an archive, an API dump)."""
from _common import env_secret, fail, out_dir, parser, write_sample

p = parser(__doc__, produces=("data",))
p.add_argument("--url", required=True, help="the http(s):// URL (or sample://NAME)")
p.add_argument("--filename", default="", help="the file name to save as (default: the URL's)")
p.add_argument("--token-env", default="",
               help="an environment variable holding a bearer token (a secret reference)")
p.add_argument("--timeout", default="60", help="seconds")
p.add_argument("--format", default="csv", help="file format for a sample:// source")
args = p.parse_args()

if args.url.startswith("sample://"):
    write_sample(args.url[len("sample://"):], args.out_data, args.format)
    raise SystemExit(0)
import shutil
import urllib.error
import urllib.parse
import urllib.request

parts = urllib.parse.urlsplit(args.url)
if parts.scheme not in ("http", "https"):
    fail(f"--url {args.url!r}: expected an http:// or https:// URL")
request = urllib.request.Request(args.url, headers={"User-Agent": "couler-catalog/0.1"})
if args.token_env:
    request.add_header("Authorization", f"Bearer {env_secret(args.token_env, '--token-env')}")
name = args.filename or parts.path.rstrip("/").rsplit("/", 1)[-1] or "download"
target = out_dir(args.out_data) / name
try:
    with urllib.request.urlopen(request, timeout=float(args.timeout)) as response, \
            open(target, "wb") as fh:
        shutil.copyfileobj(response, fh)
except urllib.error.HTTPError as e:
    fail(f"--url {args.url}: HTTP {e.code} {e.reason}")
except (urllib.error.URLError, OSError) as e:
    fail(f"--url {args.url}: {e}")
print(f"downloaded {target.stat().st_size} bytes from {args.url} -> {target}")
