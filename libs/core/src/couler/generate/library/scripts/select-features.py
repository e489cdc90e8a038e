"""Select the most informative features (univariate k-best, variance threshold, model-based)."""
from _common import (
    design,
    fail,
    fitting_table,
    labels,
    need,
    parser,
    read_tables,
    table_format,
    task_of,
    write_table,
)

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--method", default="kbest", help="kbest, variance or model (random forest)")
p.add_argument("--k", default="20", help="features kept (kbest, model)")
p.add_argument("--threshold", default="0.0", help="minimum variance (variance)")
p.add_argument("--target", default="label")
p.add_argument("--format", default="csv")
args = p.parse_args()

fs = need("sklearn.feature_selection", package="scikit-learn")
ensemble = need("sklearn.ensemble", package="scikit-learn")
tables = read_tables(args.in_data, "--in-data")
fit = fitting_table(tables)
x = design(fit, args.target).fillna(0)
numeric = [c for c in fit.columns if fit[c].dtype.kind in "iufb" and c != args.target]
x = x[numeric]
k = min(int(args.k), len(numeric))
if args.method == "variance":
    selector = fs.VarianceThreshold(float(args.threshold)).fit(x)
else:
    y = labels(fit, args.target)
    classify = task_of(y, "auto") == "classification"
    if args.method == "kbest":
        score = fs.mutual_info_classif if classify else fs.mutual_info_regression
        selector = fs.SelectKBest(score, k=k).fit(x, y)
    elif args.method == "model":
        forest = (ensemble.RandomForestClassifier if classify else
                  ensemble.RandomForestRegressor)(n_estimators=100, random_state=0)
        selector = fs.SelectFromModel(forest, max_features=k, threshold=-float("inf")).fit(x, y)
    else:
        fail(f"--method {args.method!r}: expected kbest, variance or model")
chosen = [c for c, keep in zip(numeric, selector.get_support()) if keep]
dropped = [c for c in numeric if c not in chosen]
for name, df in tables:
    write_table(df.drop(columns=dropped), args.out_data, name, table_format(args))
print(f"kept {len(chosen)} of {len(numeric)} features: {chosen[:20]}")
