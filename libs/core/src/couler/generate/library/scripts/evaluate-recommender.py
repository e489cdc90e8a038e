"""Evaluate a recommender on held-out interactions: recall@k, precision@k, NDCG@k, hit rate@k
and MAP@k (the one --metric names is the step's metric)."""
from _common import fail, need, parser, read_card, read_table, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--k", default="10")
p.add_argument("--exclude-seen", default="true", help="skip items in the training data")
p.add_argument("--metric", default="recall", help="recall, precision, ndcg, hit_rate or map, "
               "optionally @K (ndcg@10 sets --k 10)")
args = p.parse_args()

import re

chosen = re.fullmatch(r"\s*(recall|precision|ndcg|hit[ _-]?rate|map)(?:\s*(?:@|at)\s*(\d+))?\s*",
                      args.metric.lower())
if chosen is None:
    fail(f"--metric {args.metric!r}: expected recall, precision, ndcg, hit_rate or map "
         "(optionally @K)")
metric = chosen.group(1).replace(" ", "_").replace("-", "_").replace("hitrate", "hit_rate")

from pathlib import Path

np = need("numpy")
card = read_card(args.in_model)
if card.get("task") != "recommendation":
    fail(f"--in-model {args.in_model}: not a recommender (task {card.get('task')!r})")
factors = np.load(Path(args.in_model) / card["file"])
users = {u: k for k, u in enumerate(card["users"])}
items = {v: k for k, v in enumerate(card["items"])}
test = read_table(args.in_data, "--in-data", "test")
seen = {}
train_files = [f for f in Path(args.in_data).glob("train.*")]
if args.exclude_seen == "true" and train_files:
    train = read_table(args.in_data, "--in-data", "train")
    for u, i in zip(train[card["user_column"]].astype(str), train[card["item_column"]].astype(str)):
        seen.setdefault(u, set()).add(i)
k = int(chosen.group(2) or args.k)
truth = {}
for u, i in zip(test[card["user_column"]].astype(str), test[card["item_column"]].astype(str)):
    if u in users and i in items:
        truth.setdefault(u, set()).add(i)
if not truth:
    fail("--in-data: no held-out interaction of a known user and item")
names = np.array(card["items"])
per_user = {"recall": [], "precision": [], "ndcg": [], "hit_rate": [], "map": []}
for u, relevant in truth.items():
    scores = factors["users"][users[u]] @ factors["items"].T
    for i in seen.get(u, ()):
        scores[items[i]] = -np.inf
    ranked = list(names[np.argsort(-scores)[:k]])
    hit = [item in relevant for item in ranked]
    hits = sum(hit)
    per_user["recall"].append(hits / len(relevant))
    per_user["precision"].append(hits / k)
    per_user["hit_rate"].append(float(hits > 0))
    dcg = sum(1 / np.log2(r + 2) for r, h in enumerate(hit) if h)
    ideal = sum(1 / np.log2(r + 2) for r in range(min(len(relevant), k)))
    per_user["ndcg"].append(dcg / ideal)
    precisions = [sum(hit[: r + 1]) / (r + 1) for r, h in enumerate(hit) if h]
    per_user["map"].append(sum(precisions) / min(len(relevant), k))
means = {name: float(np.mean(values)) for name, values in per_user.items()}
write_metric(args.metric_file, f"{metric}_at_k", means[metric], args.out_report,
             {"k": k, "users": len(truth), **{f"{n}_at_k": v for n, v in means.items()}})
