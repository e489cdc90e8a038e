"""Train a recommender by matrix factorization (implicit ALS/BPR, or scikit-learn NMF/SVD)."""
from _common import fail, need, out_dir, parser, read_table, write_json

p = parser(__doc__, consumes=("data",), produces=("model",))
p.add_argument("--algorithm", default="als",
               help="als or bpr (the implicit library), nmf or svd (scikit-learn)")
p.add_argument("--user-column", default="user")
p.add_argument("--item-column", default="item")
p.add_argument("--rating-column", default="rating", help="interaction strength ('' = 1)")
p.add_argument("--factors", default="32")
p.add_argument("--iterations", default="15")
p.add_argument("--regularization", default="0.05")
p.add_argument("--seed", default="42")
args = p.parse_args()
args.algorithm = args.algorithm.strip().lower()  # "ALS", "SVD" as a request spells them

np = need("numpy")
sparse = need("scipy.sparse", package="scipy")
df = read_table(args.in_data, "--in-data", "train")
for column in (args.user_column, args.item_column):
    if column not in df.columns:
        fail(f"column {column!r} (--user-column/--item-column): no such column")
users = sorted(df[args.user_column].astype(str).unique())
items = sorted(df[args.item_column].astype(str).unique())
u = df[args.user_column].astype(str).map({v: i for i, v in enumerate(users)}).to_numpy()
i = df[args.item_column].astype(str).map({v: k for k, v in enumerate(items)}).to_numpy()
r = (df[args.rating_column].astype(float).to_numpy() if args.rating_column
     else np.ones(len(df)))
matrix = sparse.csr_matrix((r, (u, i)), shape=(len(users), len(items)))
factors, iterations = int(args.factors), int(args.iterations)
if args.algorithm in ("als", "bpr"):
    implicit = need("implicit")
    cls = (implicit.cpu.als.AlternatingLeastSquares if args.algorithm == "als"
           else implicit.cpu.bpr.BayesianPersonalizedRanking)
    model = cls(factors=factors, iterations=iterations,
                regularization=float(args.regularization), random_state=int(args.seed))
    model.fit(matrix, show_progress=False)
    user_factors, item_factors = np.asarray(model.user_factors), np.asarray(model.item_factors)
elif args.algorithm in ("nmf", "svd"):
    decomposition = need("sklearn.decomposition", package="scikit-learn")
    k = min(factors, min(matrix.shape) - 1)
    if args.algorithm == "nmf":
        model = decomposition.NMF(k, max_iter=max(iterations, 200), init="nndsvda",
                                  alpha_W=float(args.regularization), random_state=int(args.seed))
        user_factors = model.fit_transform(matrix)
        item_factors = model.components_.T
    else:
        model = decomposition.TruncatedSVD(k, n_iter=iterations, random_state=int(args.seed))
        user_factors = model.fit_transform(matrix)
        item_factors = model.components_.T
else:
    fail(f"--algorithm {args.algorithm!r}: expected als, bpr, nmf or svd")
out = out_dir(args.out_model)
np.savez(out / "factors.npz", users=user_factors, items=item_factors)
write_json(out / "card.json", {
    "library": "factors", "file": "factors.npz", "task": "recommendation",
    "algorithm": args.algorithm, "users": users, "items": items,
    "user_column": args.user_column, "item_column": args.item_column, "factors": factors,
    "interactions": int(matrix.nnz)})
print(f"{args.algorithm}: {len(users)} users x {len(items)} items, {matrix.nnz} interactions")
