"""Train an anomaly / outlier detector (IsolationForest, OneClassSVM, LocalOutlierFactor)."""
from _common import design, fail, hyperparams, need, parser, read_table, save_model, train_card

p = parser(__doc__, consumes=("data",), produces=("model",))
p.add_argument("--estimator", default="IsolationForest",
               help="IsolationForest, OneClassSVM, LocalOutlierFactor or EllipticEnvelope")
p.add_argument("--contamination", default="0.05", help="the expected share of anomalies")
p.add_argument("--target", default="label", help="a label column left out of the features")
p.add_argument("--hyperparams", default="", help="a JSON object of estimator arguments")
p.add_argument("--seed", default="42")
args = p.parse_args()

need("sklearn", package="scikit-learn")
from sklearn import covariance, ensemble, neighbors, svm

df = read_table(args.in_data, "--in-data", "train")
x = design(df, args.target).fillna(0)
kwargs = hyperparams(args.hyperparams)
contamination = float(args.contamination)
if args.estimator == "IsolationForest":
    model = ensemble.IsolationForest(contamination=contamination,
                                     random_state=int(args.seed), **kwargs)
elif args.estimator == "OneClassSVM":
    model = svm.OneClassSVM(nu=contamination, **kwargs)
elif args.estimator == "LocalOutlierFactor":
    model = neighbors.LocalOutlierFactor(contamination=contamination, novelty=True, **kwargs)
elif args.estimator == "EllipticEnvelope":
    model = covariance.EllipticEnvelope(contamination=contamination,
                                        random_state=int(args.seed), **kwargs)
else:
    fail(f"--estimator {args.estimator!r}: expected IsolationForest, OneClassSVM, "
         "LocalOutlierFactor or EllipticEnvelope")
model.fit(x)
flagged = int((model.predict(x) == -1).sum())
save_model(args.out_model, "sklearn", model, train_card(
    args, "anomaly", x, None, estimator=args.estimator, flagged_in_training=flagged))
