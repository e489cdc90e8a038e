"""Evaluate a causal language model's perplexity on held-out text."""
from _common import TORCH_IMAGE, fail, need, parser, read_card, read_table, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--text-column", default="text")
p.add_argument("--max-length", default="512")
args = p.parse_args()

import math

torch = need("torch", image=TORCH_IMAGE)
transformers = need("transformers", image=TORCH_IMAGE)
card = read_card(args.in_model)
df = read_table(args.in_data, "--in-data", "test")
if args.text_column not in df.columns:
    fail(f"--text-column {args.text_column!r}: no such column")
if card.get("lora_r"):
    peft = need("peft", image=TORCH_IMAGE)
    model = peft.AutoPeftModelForCausalLM.from_pretrained(args.in_model)
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(args.in_model)
tokenizer = transformers.AutoTokenizer.from_pretrained(args.in_model)
device = "cuda" if torch.cuda.is_available() else "cpu"
model.to(device).eval()
nll, tokens = 0.0, 0
with torch.no_grad():
    for text in df[args.text_column].fillna("").astype(str):
        ids = tokenizer(text, return_tensors="pt", truncation=True,
                        max_length=int(args.max_length)).input_ids.to(device)
        if ids.shape[1] < 2:
            continue
        n = ids.shape[1] - 1
        nll += float(model(ids, labels=ids).loss) * n
        tokens += n
if not tokens:
    fail(f"--text-column {args.text_column!r}: no text of two tokens or more")
write_metric(args.metric_file, "perplexity", math.exp(nll / tokens), args.out_report,
             {"tokens": tokens, "mean_nll": nll / tokens})
