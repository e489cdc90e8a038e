"""Fine-tune a causal language model (GPT-2, Llama, Mistral, Qwen) with LoRA adapters (peft)."""
from _common import TORCH_IMAGE, fail, need, out_dir, parser, read_table, write_json

p = parser(__doc__, consumes=("data",), produces=("model",))
p.add_argument("--model", default="gpt2", help="a Hugging Face causal LM name or local path")
p.add_argument("--text-column", default="text")
p.add_argument("--epochs", default="1")
p.add_argument("--batch-size", default="8")
p.add_argument("--learning-rate", default="0.0002")
p.add_argument("--max-length", default="512")
p.add_argument("--lora-r", default="8", help="LoRA rank (0: train every weight)")
args = p.parse_args()

torch = need("torch", image=TORCH_IMAGE)
transformers = need("transformers", image=TORCH_IMAGE)
df = read_table(args.in_data, "--in-data", "train")
if args.text_column not in df.columns:
    fail(f"--text-column {args.text_column!r}: no such column")
tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
model = transformers.AutoModelForCausalLM.from_pretrained(args.model)
if int(args.lora_r) > 0:
    peft = need("peft", image=TORCH_IMAGE)
    model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=int(args.lora_r),
                                                       lora_alpha=2 * int(args.lora_r)))
device = "cuda" if torch.cuda.is_available() else "cpu"
model.to(device)
texts = df[args.text_column].fillna("").astype(str).tolist()
optimizer = torch.optim.AdamW(model.parameters(), lr=float(args.learning_rate))
batch = int(args.batch_size)
for epoch in range(int(args.epochs)):
    model.train()
    for start in range(0, len(texts), batch):
        enc = tokenizer(texts[start:start + batch], truncation=True, padding=True,
                        max_length=int(args.max_length), return_tensors="pt").to(device)
        target = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
        loss = model(**enc, labels=target).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch + 1}: loss {float(loss):.4f}")
out = out_dir(args.out_model)
model.save_pretrained(out)
tokenizer.save_pretrained(out)
write_json(out / "card.json", {"library": "transformers", "file": "config.json",
                               "task": "causal-lm", "base": args.model,
                               "text_column": args.text_column, "lora_r": int(args.lora_r)})
