"""Copy local or mounted files (a file, a directory or a glob: CSV, Parquet, JSON) in."""
from _common import fail, out_dir, parser, write_sample

p = parser(__doc__, produces=("data",))
p.add_argument("--source", required=True,
               help="a path, a directory or a glob on a mounted volume (or sample://NAME)")
p.add_argument("--format", default="csv", help="file format for a sample:// source")
args = p.parse_args()

if args.source.startswith("sample://"):
    write_sample(args.source[len("sample://"):], args.out_data, args.format)
    raise SystemExit(0)
import glob
import shutil
from pathlib import Path

out = out_dir(args.out_data)
matches = sorted(glob.glob(args.source, recursive=True))
if not matches:
    fail(f"--source {args.source}: no such file or directory")
copied = 0
for match in map(Path, matches):
    if match.is_dir():
        shutil.copytree(match, out / match.name, dirs_exist_ok=True)
        copied += sum(1 for f in match.rglob("*") if f.is_file())
    else:
        shutil.copy2(match, out / match.name)
        copied += 1
print(f"copied {copied} file(s) from {args.source}")
