"""Augment an image dataset (random flips, rotations, crops, color jitter) with torchvision."""
from _common import TORCH_IMAGE, fail, need, out_dir, parser, read_table, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--copies", default="2", help="augmented copies per image")
p.add_argument("--size", default="224", help="output side length in pixels")
p.add_argument("--rotation", default="15", help="maximum rotation in degrees")
p.add_argument("--seed", default="0")
args = p.parse_args()

from pathlib import Path

torch = need("torch", image=TORCH_IMAGE)
transforms = need("torchvision.transforms", image=TORCH_IMAGE, package="torchvision")
image_module = need("PIL.Image", image=TORCH_IMAGE, package="pillow")
pd = need("pandas")
torch.manual_seed(int(args.seed))
src = Path(args.in_data)
manifest = read_table(src, "--in-data", "manifest")
if "path" not in manifest.columns:
    fail(f"--in-data {src}: the manifest has no 'path' column (ingest-image-folder writes one)")
size = int(args.size)
augment = transforms.Compose([
    transforms.RandomResizedCrop(size, scale=(0.7, 1.0)), transforms.RandomHorizontalFlip(),
    transforms.RandomRotation(float(args.rotation)),
    transforms.ColorJitter(0.2, 0.2, 0.2)])
out = out_dir(args.out_data)
rows = []
for row in manifest.to_dict("records"):
    path = src / row["path"]
    if not path.is_file():
        fail(f"--in-data: image {path} listed in the manifest is missing")
    image = image_module.open(path).convert("RGB")
    for k in range(int(args.copies) + 1):
        result = image.resize((size, size)) if k == 0 else augment(image)
        rel = Path(row["path"]).with_name(f"{Path(row['path']).stem}_aug{k}.png")
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        result.save(out / rel)
        rows.append({**row, "path": str(rel), "augmented": k > 0})
write_table(pd.DataFrame(rows), out, "manifest")
print(f"{len(manifest)} images -> {len(rows)} (with {args.copies} augmented copies each)")
