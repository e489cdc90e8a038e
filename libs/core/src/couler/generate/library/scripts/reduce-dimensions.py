"""Reduce dimensionality with PCA or truncated SVD (the label column is kept)."""
from _common import design, fail, fitting_table, need, parser, read_tables, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--method", default="pca", help="pca or svd")
p.add_argument("--components", default="10")
p.add_argument("--target", default="label")
args = p.parse_args()

decomposition = need("sklearn.decomposition", package="scikit-learn")
pd = need("pandas")
tables = read_tables(args.in_data, "--in-data")
fit = design(fitting_table(tables), args.target).fillna(0)
k = min(int(args.components), fit.shape[1])
if args.method not in ("pca", "svd"):
    fail(f"--method {args.method!r}: expected pca or svd")
model = (decomposition.PCA(k, random_state=0) if args.method == "pca"
         else decomposition.TruncatedSVD(k, random_state=0)).fit(fit)
for name, df in tables:
    z = model.transform(design(df, args.target, list(fit.columns)).fillna(0))
    out = pd.DataFrame(z, columns=[f"component_{i}" for i in range(k)], index=df.index)
    if args.target in df.columns:
        out[args.target] = df[args.target]
    write_table(out, args.out_data, name)
print(f"{fit.shape[1]} -> {k} components, explained variance "
      f"{float(model.explained_variance_ratio_.sum()):.3f}")
