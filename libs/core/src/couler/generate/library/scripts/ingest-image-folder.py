"""Collect an image folder (one sub-folder per class) into a manifest and a copy of the images."""
from _common import fail, need, out_dir, parser, write_table

p = parser(__doc__, produces=("data",))
p.add_argument("--source", required=True, help="a directory: SOURCE/<label>/<image>")
p.add_argument("--extensions", default=".jpg,.jpeg,.png,.bmp,.webp")
args = p.parse_args()

import shutil
from pathlib import Path

source = Path(args.source)
if not source.is_dir():
    fail(f"--source {source}: no such directory")
extensions = {e.strip().lower() for e in args.extensions.split(",") if e.strip()}
out = out_dir(args.out_data)
rows = []
for image in sorted(source.rglob("*")):
    if image.is_file() and image.suffix.lower() in extensions:
        rel = image.relative_to(source)
        label = rel.parts[0] if len(rel.parts) > 1 else ""
        target = out / "images" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(image, target)
        rows.append({"path": str(Path("images") / rel), "label": label})
if not rows:
    fail(f"--source {source}: no image ({', '.join(sorted(extensions))}) in it")
pd = need("pandas")
write_table(pd.DataFrame(rows), out, "manifest")
print(f"{len(rows)} images in {len({r['label'] for r in rows})} classes")
