"""Fine-tune a Hugging Face transformer for text classification (optionally LoRA via peft)."""
from _common import TORCH_IMAGE, fail, labels, need, out_dir, parser, read_table, write_json

p = parser(__doc__, consumes=("data",), produces=("model",))
p.add_argument("--model", default="distilbert-base-uncased",
               help="a Hugging Face model name or local path (BERT, RoBERTa, DeBERTa, ...)")
p.add_argument("--text-column", default="text")
p.add_argument("--target", default="label")
p.add_argument("--epochs", default="2")
p.add_argument("--batch-size", default="16")
p.add_argument("--learning-rate", default="0.00002")
p.add_argument("--max-length", default="128")
p.add_argument("--lora", default="false", help="train LoRA adapters (peft) instead of all weights")
args = p.parse_args()

torch = need("torch", image=TORCH_IMAGE)
transformers = need("transformers", image=TORCH_IMAGE)
df = read_table(args.in_data, "--in-data", "train")
if args.text_column not in df.columns:
    fail(f"--text-column {args.text_column!r}: no such column")
classes = sorted(labels(df, args.target).astype(str).unique())
tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
model = transformers.AutoModelForSequenceClassification.from_pretrained(
    args.model, num_labels=len(classes))
if args.lora == "true":
    peft = need("peft", image=TORCH_IMAGE)
    model = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16,
                                                       lora_dropout=0.1))
device = "cuda" if torch.cuda.is_available() else "cpu"
model.to(device)
texts = df[args.text_column].fillna("").astype(str).tolist()
y = torch.tensor([classes.index(str(v)) for v in df[args.target]])
optimizer = torch.optim.AdamW(model.parameters(), lr=float(args.learning_rate))
batch = int(args.batch_size)
for epoch in range(int(args.epochs)):
    model.train()
    order = torch.randperm(len(texts))
    for start in range(0, len(texts), batch):
        idx = order[start:start + batch]
        enc = tokenizer([texts[k] for k in idx], truncation=True, padding=True,
                        max_length=int(args.max_length), return_tensors="pt").to(device)
        loss = model(**enc, labels=y[idx].to(device)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch + 1}: loss {float(loss):.4f}")
out = out_dir(args.out_model)
model.save_pretrained(out)
tokenizer.save_pretrained(out)
write_json(out / "card.json", {"library": "transformers", "file": "config.json",
                               "task": "classification", "base": args.model, "classes": classes,
                               "text_column": args.text_column, "target": args.target,
                               "lora": args.lora == "true"})
