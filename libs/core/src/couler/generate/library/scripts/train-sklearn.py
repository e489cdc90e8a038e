"""Train any scikit-learn estimator named by a parameter (classifier or regressor)."""
from _common import fail, hyperparams, need, parser, save_model, train_card, training_data

p = parser(__doc__, consumes=("data",), produces=("model",))
p.add_argument("--estimator", default="RandomForestClassifier",
               help="a scikit-learn class: RandomForestClassifier, LogisticRegression, Ridge, "
                    "Lasso, ElasticNet, LinearSVC, SVC, MultinomialNB, KNeighborsClassifier, "
                    "GradientBoostingRegressor, ...")
p.add_argument("--target", default="label", help="the label column")
p.add_argument("--hyperparams", default="", help="a JSON object of estimator arguments")
p.add_argument("--seed", default="42")
args = p.parse_args()

need("sklearn", package="scikit-learn")
from sklearn.base import is_classifier, is_regressor
from sklearn.utils import all_estimators

classes_by_name = dict(all_estimators())
if args.estimator not in classes_by_name:
    near = [n for n in classes_by_name if args.estimator.lower() in n.lower()][:8]
    fail(f"--estimator {args.estimator!r}: not a scikit-learn estimator"
         + (f" (did you mean {', '.join(near)}?)" if near else ""))
cls = classes_by_name[args.estimator]
kwargs = hyperparams(args.hyperparams)
if "random_state" in cls().get_params() and "random_state" not in kwargs:
    kwargs["random_state"] = int(args.seed)
estimator = cls(**kwargs)
if not (is_classifier(estimator) or is_regressor(estimator)):
    fail(f"--estimator {args.estimator}: neither a classifier nor a regressor "
         "(train-anomaly-detector and train-clustering take the others)")
task = "classification" if is_classifier(estimator) else "regression"
df, x, y, task, classes = training_data(args, task)
try:
    estimator.fit(x.fillna(0), y)
except ValueError as e:
    fail(f"--estimator {args.estimator}: fitting failed: {e}")
score = float(estimator.score(x.fillna(0), y))
save_model(args.out_model, "sklearn", estimator, train_card(
    args, task, x, classes, estimator=args.estimator, params=kwargs, train_score=score))
