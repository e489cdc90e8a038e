"""Evaluate a recommender: recall@k and precision@k of held-out interactions."""
from _common import fail, need, parser, read_card, read_table, write_metric

p = parser(__doc__, consumes=("model", "data"), produces=("report",), metric=True)
p.add_argument("--k", default="10")
p.add_argument("--exclude-seen", default="true", help="skip items in the training data")
args = p.parse_args()

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
k = int(args.k)
truth = {}
for u, i in zip(test[card["user_column"]].astype(str), test[card["item_column"]].astype(str)):
    if u in users and i in items:
        truth.setdefault(u, set()).add(i)
if not truth:
    fail("--in-data: no held-out interaction of a known user and item")
names = np.array(card["items"])
recall, precision = [], []
for u, relevant in truth.items():
    scores = factors["users"][users[u]] @ factors["items"].T
    for i in seen.get(u, ()):
        scores[items[i]] = -np.inf
    top = set(names[np.argsort(-scores)[:k]])
    hits = len(top & relevant)
    recall.append(hits / len(relevant))
    precision.append(hits / k)
write_metric(args.metric_file, "recall_at_k", float(np.mean(recall)), args.out_report,
             {"k": k, "precision_at_k": float(np.mean(precision)), "users": len(truth)})
