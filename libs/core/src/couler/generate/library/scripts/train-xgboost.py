"""Train an XGBoost gradient-boosted tree model (classifier or regressor)."""
from _common import hyperparams, need, parser, train_tabular

p = parser(__doc__, consumes=("data",), produces=("model",), metric=True)
p.add_argument("--target", default="label", help="the label column")
p.add_argument("--task", default="auto", help="auto, classification or regression")
p.add_argument("--n-estimators", default="300", help="boosting rounds")
p.add_argument("--learning-rate", default="0.1")
p.add_argument("--max-depth", default="6")
p.add_argument("--hyperparams", default="", help="a JSON object of more XGBoost arguments")
p.add_argument("--seed", default="42")
args = p.parse_args()

xgb = need("xgboost", package="xgboost")
kwargs = dict(n_estimators=int(args.n_estimators), learning_rate=float(args.learning_rate),
              max_depth=int(args.max_depth), random_state=int(args.seed), n_jobs=2,
              **hyperparams(args.hyperparams))
train_tabular(args, "xgboost", xgb.__version__, (xgb.XGBClassifier, xgb.XGBRegressor), kwargs)
