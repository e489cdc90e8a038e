"""Run a pretrained model over data with a Hugging Face pipeline: transcribe speech, detect
objects, classify or tag text, summarize, translate, generate, embed images or text."""
from _common import TORCH_IMAGE, fail, need, parser, read_tables, table_files, write_table

p = parser(__doc__, consumes=("data",), produces=("predictions",))
p.add_argument("--model", required=True, help="a model id or a local model directory")
p.add_argument("--pipeline", default="auto",
               help="the pipeline task (automatic-speech-recognition, object-detection, "
                    "text-classification, token-classification, summarization, translation, "
                    "text-generation, feature-extraction, image-feature-extraction, …); auto: "
                    "from the model's config")
p.add_argument("--column", default="", help="the input column (default: text, path or the "
                                            "files themselves)")
p.add_argument("--batch-size", default="8")
p.add_argument("--device", default="auto", help="auto, cpu or cuda")
args = p.parse_args()

import json
from pathlib import Path

transformers = need("transformers", TORCH_IMAGE)
torch = need("torch", TORCH_IMAGE)
pd = need("pandas", TORCH_IMAGE)
device = (0 if torch.cuda.is_available() else -1) if args.device == "auto" else (
    0 if args.device == "cuda" else -1)
kwargs = {"model": args.model, "device": device}
if args.pipeline != "auto":
    kwargs["task"] = args.pipeline
try:
    pipe = transformers.pipeline(**kwargs)
except (OSError, ValueError) as e:
    fail(f"--model {args.model}: {e}")
root = Path(args.in_data)
media = [f for f in root.rglob("*") if f.is_file() and f.suffix.lower() in (
    ".wav", ".mp3", ".flac", ".ogg", ".jpg", ".jpeg", ".png", ".bmp", ".webp")]
if media and not args.column:
    inputs, ids = [str(f) for f in sorted(media)], [str(f.relative_to(root)) for f in sorted(media)]
else:
    table_files(root, "--in-data")
    frames = pd.concat([df for _, df in read_tables(root, "--in-data")], ignore_index=True)
    column = args.column or next((c for c in ("text", "path", "file", "audio", "image")
                                  if c in frames.columns), "")
    if column not in frames.columns:
        fail(f"--column {column!r}: no such column (columns: {', '.join(frames.columns)})")
    inputs, ids = frames[column].astype(str).tolist(), list(range(len(frames)))
results = pipe(inputs, batch_size=int(args.batch_size))
rows = [{"id": i, "prediction": json.dumps(r, default=lambda o: getattr(o, "tolist", str)(o))}
        for i, r in zip(ids, results)]
write_table(pd.DataFrame(rows), args.out_predictions, "predictions")
print(f"{len(rows)} inputs through {args.model} ({pipe.task})")
