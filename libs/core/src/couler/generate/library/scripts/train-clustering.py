"""Cluster rows (KMeans, MiniBatchKMeans, GaussianMixture, DBSCAN, Agglomerative): segments."""
from _common import (
    design,
    fail,
    hyperparams,
    need,
    parser,
    read_table,
    save_model,
    train_card,
    write_table,
)

p = parser(__doc__, consumes=("data",), produces=("model", "predictions"))
p.add_argument("--estimator", default="KMeans",
               help="KMeans, MiniBatchKMeans, GaussianMixture, DBSCAN or AgglomerativeClustering")
p.add_argument("--clusters", default="8", help="the number of clusters (not DBSCAN)")
p.add_argument("--target", default="label", help="a label column left out of the features")
p.add_argument("--hyperparams", default="", help="a JSON object of estimator arguments")
p.add_argument("--seed", default="42")
args = p.parse_args()

need("sklearn", package="scikit-learn")
from sklearn import cluster, metrics, mixture

df = read_table(args.in_data, "--in-data", "train")
x = design(df, args.target).fillna(0)
k, seed, kwargs = int(args.clusters), int(args.seed), hyperparams(args.hyperparams)
makers = {
    "KMeans": lambda: cluster.KMeans(k, random_state=seed, n_init="auto", **kwargs),
    "MiniBatchKMeans": lambda: cluster.MiniBatchKMeans(k, random_state=seed, **kwargs),
    "GaussianMixture": lambda: mixture.GaussianMixture(k, random_state=seed, **kwargs),
    "DBSCAN": lambda: cluster.DBSCAN(**kwargs),
    "AgglomerativeClustering": lambda: cluster.AgglomerativeClustering(k, **kwargs),
}
if args.estimator not in makers:
    fail(f"--estimator {args.estimator!r}: expected {', '.join(makers)}")
model = makers[args.estimator]()
assigned = model.fit_predict(x)
found = len(set(assigned) - {-1})
silhouette = float(metrics.silhouette_score(x, assigned)) if 1 < found < len(x) else None
save_model(args.out_model, "sklearn", model, train_card(
    args, "clustering", x, None, estimator=args.estimator, clusters=found,
    silhouette=silhouette))
write_table(df.assign(cluster=assigned), args.out_predictions, "predictions")
