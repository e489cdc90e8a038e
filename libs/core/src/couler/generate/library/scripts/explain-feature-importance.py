"""Explain a model: permutation feature importance on held-out data (what drives predictions)."""
from _common import evaluation_data, need, parser, write_json

p = parser(__doc__, consumes=("model", "data"), produces=("report",))
p.add_argument("--target", default="", help="the label column (default: the model's)")
p.add_argument("--repeats", default="5")
p.add_argument("--top", default="20", help="features listed in the report")
args = p.parse_args()

from pathlib import Path

np = need("numpy")
metrics = need("sklearn.metrics", package="scikit-learn")
model, df, y = evaluation_data(args)
classify = model.task == "classification"
truth = model.encoded(y) if classify else y.astype(float).to_numpy()


def score(frame):
    predicted = model.predict(frame)
    if classify:
        return metrics.accuracy_score(truth, model.encoded(predicted))
    return -float(np.sqrt(metrics.mean_squared_error(truth, predicted.astype(float))))


rng = np.random.default_rng(0)
base = score(df)
features = [c for c in df.columns if c != model.card.get("target")]
importance = {}
for column in features:
    drops = []
    for _ in range(int(args.repeats)):
        shuffled = df.copy()
        shuffled[column] = rng.permutation(shuffled[column].to_numpy())
        drops.append(base - score(shuffled))
    importance[column] = float(np.mean(drops))
ranked = sorted(importance.items(), key=lambda kv: -kv[1])[: int(args.top)]
write_json(Path(args.out_report) / "importance.json",
           {"score": "accuracy" if classify else "-rmse", "baseline": base,
            "importance": dict(ranked)})
lines = ["| feature | importance |", "| --- | --- |"]
lines += [f"| {name} | {value:.4f} |" for name, value in ranked]
(Path(args.out_report) / "importance.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
