"""Fine-tune a speech recognition model (wav2vec2 CTC) on audio clips and transcripts."""
from _common import TORCH_IMAGE, fail, need, out_dir, parser, read_table, write_json

p = parser(__doc__, consumes=("data",), produces=("model",))
p.add_argument("--model", default="facebook/wav2vec2-base-960h",
               help="a Hugging Face CTC model (wav2vec2, HuBERT) name or local path")
p.add_argument("--audio-column", default="path", help="audio file paths, relative to the data")
p.add_argument("--text-column", default="transcript")
p.add_argument("--epochs", default="3")
p.add_argument("--batch-size", default="8")
p.add_argument("--learning-rate", default="0.00003")
p.add_argument("--sample-rate", default="16000")
args = p.parse_args()

from pathlib import Path

torch = need("torch", image=TORCH_IMAGE)
torchaudio = need("torchaudio", image=TORCH_IMAGE)
transformers = need("transformers", image=TORCH_IMAGE)
src = Path(args.in_data)
df = read_table(src, "--in-data", "manifest")
for column in (args.audio_column, args.text_column):
    if column not in df.columns:
        fail(f"column {column!r} (--audio-column/--text-column): not in the manifest")
rate = int(args.sample_rate)
processor = transformers.AutoProcessor.from_pretrained(args.model)
model = transformers.AutoModelForCTC.from_pretrained(args.model, ctc_loss_reduction="mean")
model.freeze_feature_encoder()
device = "cuda" if torch.cuda.is_available() else "cpu"
model.to(device)


def audio(rel):
    path = src / rel
    if not path.is_file():
        fail(f"--in-data: audio file {path} listed in the manifest is missing")
    wave, sr = torchaudio.load(str(path))
    wave = wave.mean(0)
    return torchaudio.functional.resample(wave, sr, rate).numpy() if sr != rate else wave.numpy()


rows = df.to_dict("records")
optimizer = torch.optim.AdamW(model.parameters(), lr=float(args.learning_rate))
batch = int(args.batch_size)
for epoch in range(int(args.epochs)):
    model.train()
    for start in range(0, len(rows), batch):
        part = rows[start:start + batch]
        inputs = processor([audio(r[args.audio_column]) for r in part], sampling_rate=rate,
                           return_tensors="pt", padding=True)
        targets = processor.tokenizer([str(r[args.text_column]).upper() for r in part],
                                      return_tensors="pt", padding=True).input_ids
        targets[targets == processor.tokenizer.pad_token_id] = -100
        loss = model(inputs.input_values.to(device), labels=targets.to(device)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch + 1}: CTC loss {float(loss):.4f}")
out = out_dir(args.out_model)
model.save_pretrained(out)
processor.save_pretrained(out)
write_json(out / "card.json", {"library": "transformers", "file": "config.json",
                               "task": "speech-recognition", "base": args.model,
                               "sample_rate": rate})
