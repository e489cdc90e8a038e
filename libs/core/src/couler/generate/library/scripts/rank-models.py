"""Rank trials or candidate models by a metric (a leaderboard) and pick the best one."""
from _common import existing, fail, parser, write_json, write_metric

p = parser(__doc__, consumes=("report",), produces=("report",), metric=True)
p.add_argument("--metric", default="auc", help="the metric in each metrics.json: auc, f1, rmse...")
p.add_argument("--mode", default="auto",
               help="max, min, or auto (min for errors: rmse, mape, mae, wer, perplexity, loss)")
args = p.parse_args()

import json
from pathlib import Path

LOWER_IS_BETTER = ("rmse", "mape", "mae", "wer", "perplexity", "loss", "log_loss", "brier",
                   "calibration_error")
mode = args.mode
if mode == "auto":
    mode = "min" if args.metric in LOWER_IS_BETTER else "max"
if mode not in ("min", "max"):
    fail(f"--mode {args.mode!r}: expected min, max or auto")
root = existing(args.in_report, "--in-report")
rows = []
for path in sorted(root.rglob("metrics.json")):
    values = json.loads(path.read_text())
    if args.metric in values:
        name = str(path.parent.relative_to(root)) if path.parent != root else root.name
        rows.append({"candidate": name, args.metric: float(values[args.metric])})
if not rows:
    fail(f"--in-report {root}: no metrics.json with {args.metric!r} under it")
rows.sort(key=lambda r: r[args.metric], reverse=mode == "max")
for rank, row in enumerate(rows, 1):
    row["rank"] = rank
write_json(Path(args.out_report) / "ranking.json",
           {"metric": args.metric, "mode": mode, "best": rows[0]["candidate"], "ranking": rows})
lines = [f"| rank | candidate | {args.metric} |", "| --- | --- | --- |"]
lines += [f"| {r['rank']} | {r['candidate']} | {r[args.metric]:.6g} |" for r in rows]
(Path(args.out_report) / "ranking.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
write_metric(args.metric_file, args.metric, rows[0][args.metric])
