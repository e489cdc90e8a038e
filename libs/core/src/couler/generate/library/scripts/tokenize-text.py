"""Tokenize a text column (word tokens, or a Hugging Face tokenizer) and build a vocabulary."""
from _common import TORCH_IMAGE, fail, need, parser, read_tables, write_json, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--column", default="text", help="the text column")
p.add_argument("--tokenizer", default="words",
               help="words (lowercased word tokens) or a Hugging Face tokenizer name/path")
p.add_argument("--max-length", default="256", help="at most this many tokens per row")
p.add_argument("--min-count", default="1", help="vocabulary: words seen at least this often")
args = p.parse_args()

import collections
import re
from pathlib import Path

limit = int(args.max_length)
if args.tokenizer == "words":
    word = re.compile(r"[\w']+", re.UNICODE)

    def tokenize(text):
        return word.findall(str(text).lower())[:limit]
else:
    transformers = need("transformers", image=TORCH_IMAGE)
    hf = transformers.AutoTokenizer.from_pretrained(args.tokenizer)

    def tokenize(text):
        return hf.tokenize(str(text))[:limit]

counts = collections.Counter()
for name, df in read_tables(args.in_data, "--in-data"):
    if args.column not in df.columns:
        fail(f"--column {args.column!r}: no such column in {name}")
    tokens = df[args.column].fillna("").map(tokenize)
    counts.update(t for row in tokens for t in row)
    df = df.assign(tokens=tokens.map(" ".join), n_tokens=tokens.map(len))
    write_table(df, args.out_data, name)
vocab = [t for t, c in counts.most_common() if c >= int(args.min_count)]
write_json(Path(args.out_data) / "_vocab.json", {"tokenizer": args.tokenizer, "tokens": vocab})
print(f"{sum(counts.values())} tokens, vocabulary of {len(vocab)}")
