"""Build a vector index for similarity search (FAISS, or scikit-learn nearest neighbours)."""
from _common import fail, need, out_dir, parser, read_table, write_json

p = parser(__doc__, consumes=("data",), produces=("model",))
p.add_argument("--backend", default="sklearn", help="sklearn (NearestNeighbors) or faiss")
p.add_argument("--columns", default="", help="vector columns (default: _embeddings.npy, or "
               "every numeric column)")
p.add_argument("--metric", default="cosine", help="cosine or euclidean")
p.add_argument("--id-column", default="", help="the column identifying each vector")
args = p.parse_args()

from pathlib import Path

np = need("numpy")
src = Path(args.in_data)
df = read_table(src, "--in-data")
if not args.columns and (src / "_embeddings.npy").is_file():
    vectors = np.load(src / "_embeddings.npy")
else:
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] or [
        c for c in df.columns if df[c].dtype.kind in "iuf" and c != args.id_column]
    if not columns:
        fail("--columns: no numeric column to index")
    vectors = df[columns].to_numpy(dtype="float32")
vectors = np.ascontiguousarray(vectors, dtype="float32")
if args.metric == "cosine":
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
elif args.metric != "euclidean":
    fail(f"--metric {args.metric!r}: expected cosine or euclidean")
out = out_dir(args.out_model)
ids = df[args.id_column].astype(str).tolist() if args.id_column else list(map(str, range(len(df))))
if args.backend == "faiss":
    faiss = need("faiss", package="faiss-cpu")
    index = (faiss.IndexFlatIP if args.metric == "cosine" else faiss.IndexFlatL2)(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(out / "index.faiss"))
    file = "index.faiss"
elif args.backend == "sklearn":
    neighbors = need("sklearn.neighbors", package="scikit-learn")
    index = neighbors.NearestNeighbors(metric="euclidean").fit(vectors)
    need("joblib", package="scikit-learn").dump(index, out / "index.joblib")
    file = "index.joblib"
else:
    fail(f"--backend {args.backend!r}: expected sklearn or faiss")
write_json(out / "card.json", {"library": f"{args.backend}-index", "file": file,
                               "task": "similarity-search", "metric": args.metric,
                               "dimension": int(vectors.shape[1]), "ids": ids})
print(f"indexed {len(vectors)} vectors of dimension {vectors.shape[1]} ({args.backend})")
