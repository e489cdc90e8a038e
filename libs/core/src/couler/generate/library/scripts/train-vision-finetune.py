"""Fine-tune a pretrained torchvision image classifier (ResNet, EfficientNet, ViT) on images;
the metric is the accuracy on held-out images (the manifest's ``split == "validation"`` rows,
else a seeded 10 %)."""
from _common import TORCH_IMAGE, fail, need, out_dir, parser, read_table, write_json, write_metric

p = parser(__doc__, consumes=("data",), produces=("model",), metric=True)
p.add_argument("--model", default="resnet18",
               help="a torchvision.models name: resnet18, resnet50, efficientnet_b0, vit_b_16")
p.add_argument("--epochs", default="3")
p.add_argument("--batch-size", default="32")
p.add_argument("--learning-rate", default="0.001")
p.add_argument("--size", default="224", help="input side length in pixels")
p.add_argument("--pretrained", default="true", help="start from ImageNet weights")
p.add_argument("--target", default="label", help="the manifest's label column")
args = p.parse_args()

from pathlib import Path

torch = need("torch", image=TORCH_IMAGE)
tv = need("torchvision", image=TORCH_IMAGE)
image_module = need("PIL.Image", image=TORCH_IMAGE, package="pillow")
src = Path(args.in_data)
manifest = read_table(src, "--in-data", "manifest")
if "path" not in manifest.columns or args.target not in manifest.columns:
    fail(f"--in-data {src}: the manifest needs 'path' and {args.target!r} columns")
classes = sorted(manifest[args.target].astype(str).unique())
if "split" in manifest.columns and (manifest["split"] == "validation").any():
    held = manifest["split"] == "validation"
else:
    held = manifest.index.isin(manifest.sample(frac=0.1, random_state=0).index)
validation, manifest = manifest[held].reset_index(drop=True), manifest[~held].reset_index(drop=True)
if validation.empty:
    fail(f"--in-data {src}: too few images to hold any out for validation")
if len(classes) < 2:
    fail(f"--target {args.target!r}: fewer than two classes")
t = tv.transforms
prep = t.Compose([t.Resize((int(args.size), int(args.size))), t.ToTensor(),
                  t.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


class Images(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, k):
        row = self.rows.iloc[k]
        path = src / row["path"]
        if not path.is_file():
            fail(f"--in-data: image {path} listed in the manifest is missing")
        label = classes.index(str(row[args.target]))
        return prep(image_module.open(path).convert("RGB")), label


if not hasattr(tv.models, args.model):
    fail(f"--model {args.model!r}: not in torchvision.models")
model = tv.models.get_model(args.model, weights="DEFAULT" if args.pretrained == "true" else None)
head = "fc" if hasattr(model, "fc") else None
if head:
    model.fc = torch.nn.Linear(model.fc.in_features, len(classes))
elif hasattr(model, "classifier"):
    last = model.classifier[-1]
    model.classifier[-1] = torch.nn.Linear(last.in_features, len(classes))
elif hasattr(model, "heads"):
    model.heads.head = torch.nn.Linear(model.heads.head.in_features, len(classes))
device = "cuda" if torch.cuda.is_available() else "cpu"
model.to(device)
loader = torch.utils.data.DataLoader(Images(manifest), batch_size=int(args.batch_size),
                                     shuffle=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=float(args.learning_rate))
loss_fn = torch.nn.CrossEntropyLoss()
for epoch in range(int(args.epochs)):
    model.train()
    total = correct = 0
    for images, target in loader:
        images, target = images.to(device), target.to(device)
        optimizer.zero_grad()
        logits = model(images)
        loss = loss_fn(logits, target)
        loss.backward()
        optimizer.step()
        correct += int((logits.argmax(1) == target).sum())
        total += len(target)
    print(f"epoch {epoch + 1}: loss {float(loss):.4f}, train accuracy {correct / total:.3f}")
model.eval()
hits = seen = 0
with torch.no_grad():
    for images, target in torch.utils.data.DataLoader(Images(validation),
                                                      batch_size=int(args.batch_size)):
        hits += int((model(images.to(device)).argmax(1).cpu() == target).sum())
        seen += len(target)
out = out_dir(args.out_model)
torch.save(model.state_dict(), out / "model.pt")
write_json(out / "card.json", {"library": "torchvision", "file": "model.pt", "task":
                               "classification", "architecture": args.model, "classes": classes,
                               "size": int(args.size), "target": args.target})
write_metric(args.metric_file, "accuracy", hits / seen, extra={"validation_images": seen})
