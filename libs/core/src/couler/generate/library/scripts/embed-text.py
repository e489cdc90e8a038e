"""Embed a text column as dense vectors with a sentence-transformers model."""
from _common import TORCH_IMAGE, fail, need, out_dir, parser, read_table, write_json, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--column", default="text")
p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2",
               help="a sentence-transformers model name or a local path")
p.add_argument("--batch-size", default="64")
p.add_argument("--normalize", default="true", help="unit-length vectors (cosine similarity)")
args = p.parse_args()

np = need("numpy")
st = need("sentence_transformers", image=TORCH_IMAGE, package="sentence-transformers")
df = read_table(args.in_data, "--in-data")
if args.column not in df.columns:
    fail(f"--column {args.column!r}: no such column")
model = st.SentenceTransformer(args.model)
vectors = model.encode(df[args.column].fillna("").astype(str).tolist(),
                       batch_size=int(args.batch_size),
                       normalize_embeddings=args.normalize == "true", show_progress_bar=False)
out = out_dir(args.out_data)
np.save(out / "_embeddings.npy", np.asarray(vectors, dtype="float32"))
write_table(df.assign(embedding_row=range(len(df))), out, "table")
write_json(out / "_embeddings.json", {"model": args.model, "dimension": int(vectors.shape[1]),
                                      "rows": len(df), "column": args.column})
print(f"{len(df)} rows embedded, dimension {vectors.shape[1]}")
