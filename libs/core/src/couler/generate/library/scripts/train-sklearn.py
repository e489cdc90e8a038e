"""Train any scikit-learn estimator named by a parameter (classifier or regressor)."""
from _common import (
    fail,
    hyperparams,
    need,
    parser,
    report_validation,
    save_model,
    train_card,
    training_data,
)

p = parser(__doc__, consumes=("data",), produces=("model",), metric=True)
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
# Friendly names ("random forest", "linear SVM", "naive Bayes") name a family; the data's
# target decides between its classifier and its regressor.
ALIASES = {"logisticregression": "LogisticRegression", "logreg": "LogisticRegression",
           "linearsvm": "LinearSVC", "linearsvc": "LinearSVC", "svm": "SVC",
           "naivebayes": "GaussianNB", "multinomialnaivebayes": "MultinomialNB",
           "multinomialnb": "MultinomialNB", "gaussiannaivebayes": "GaussianNB",
           "knn": "KNeighbors", "knearestneighbors": "KNeighbors", "kneighbors": "KNeighbors",
           "gradientboosting": "GradientBoosting", "gbm": "GradientBoosting",
           "gradientboostedtrees": "GradientBoosting", "decisiontree": "DecisionTree",
           "mlp": "MLP", "neuralnetwork": "MLP", "perceptron": "Perceptron",
           "linearregression": "LinearRegression", "ols": "LinearRegression",
           "elasticnet": "ElasticNet", "ridge": "Ridge", "lasso": "Lasso",
           "extratrees": "ExtraTrees", "adaboost": "AdaBoost", "randomforest": "RandomForest",
           "histgradientboosting": "HistGradientBoosting", "sgd": "SGD"}


def resolve(name, task):
    if name in classes_by_name:
        return name
    key = "".join(ch for ch in name.lower() if ch.isalnum())
    for suffix in ("classifier", "regressor", "regression", "model", "estimator"):
        if key.endswith(suffix) and key[: -len(suffix)] in ALIASES:
            key = key[: -len(suffix)]
    stem = ALIASES.get(key, key)
    want = "Classifier" if task == "classification" else "Regressor"
    for candidate in (stem, stem + want, stem + ("C" if task == "classification" else "R")):
        for known in classes_by_name:
            if known.lower() == candidate.lower():
                return known
    near = [n for n in classes_by_name if key[:6] and key[:6] in n.lower()][:8]
    fail(f"--estimator {name!r}: not a scikit-learn estimator"
         + (f" (did you mean {', '.join(near)}?)" if near else ""))


df, x, y, task, classes = training_data(args)
name = resolve(args.estimator, task)
cls = classes_by_name[name]
kwargs = hyperparams(args.hyperparams)
if "random_state" in cls().get_params() and "random_state" not in kwargs:
    kwargs["random_state"] = int(args.seed)
estimator = cls(**kwargs)
if not (is_classifier(estimator) or is_regressor(estimator)):
    fail(f"--estimator {name}: neither a classifier nor a regressor "
         "(train-anomaly-detector and train-clustering take the others)")
if task != ("classification" if is_classifier(estimator) else "regression"):
    df, x, y, task, classes = training_data(
        args, "classification" if is_classifier(estimator) else "regression")
try:
    estimator.fit(x.fillna(0), y)
except ValueError as e:
    fail(f"--estimator {args.estimator}: fitting failed: {e}")
score = float(estimator.score(x.fillna(0), y))
save_model(args.out_model, "sklearn", estimator, train_card(
    args, task, x, classes, estimator=name, params=kwargs, train_score=score))
report_validation(args)
