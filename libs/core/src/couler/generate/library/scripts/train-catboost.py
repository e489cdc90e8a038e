"""Train a CatBoost gradient-boosted tree model (classifier or regressor)."""
from _common import hyperparams, need, parser, train_tabular

p = parser(__doc__, consumes=("data",), produces=("model",), metric=True)
p.add_argument("--target", default="label", help="the label column")
p.add_argument("--task", default="auto", help="auto, classification or regression")
p.add_argument("--iterations", default="300", help="boosting rounds")
p.add_argument("--learning-rate", default="0.1")
p.add_argument("--depth", default="6")
p.add_argument("--hyperparams", default="", help="a JSON object of more CatBoost arguments")
p.add_argument("--seed", default="42")
args = p.parse_args()

cb = need("catboost")
kwargs = dict(iterations=int(args.iterations), learning_rate=float(args.learning_rate),
              depth=int(args.depth), random_seed=int(args.seed), thread_count=2,
              verbose=False, allow_writing_files=False, **hyperparams(args.hyperparams))
train_tabular(args, "catboost", cb.__version__, (cb.CatBoostClassifier, cb.CatBoostRegressor),
              kwargs)
