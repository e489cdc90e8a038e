"""Write a Markdown report of a run: metrics, model cards, rankings and tables."""
from _common import existing, fail, parser

p = parser(__doc__, consumes=("report", "model"), produces=("report",), optional=("model",))
p.add_argument("--title", default="Model report")
p.add_argument("--notes", default="", help="a paragraph placed under the title")
args = p.parse_args()

import json
from pathlib import Path

root = existing(args.in_report, "--in-report")
lines = [f"# {args.title}", ""]
if args.notes:
    lines += [args.notes, ""]
found = 0
for path in sorted(root.rglob("*.json")):
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        continue
    found += 1
    lines += [f"## {path.relative_to(root)}", "", "| key | value |", "| --- | --- |"]
    for key, value in data.items():
        text = f"{value:.6g}" if isinstance(value, float) else json.dumps(value, default=str)
        lines.append(f"| {key} | {text[:200]} |")
    lines.append("")
for path in sorted(root.rglob("*.md")):
    found += 1
    lines += [f"## {path.relative_to(root)}", "", path.read_text(), ""]
if args.in_model:
    card = json.loads((existing(args.in_model, "--in-model") / "card.json").read_text())
    lines += ["## Model", ""] + [f"- **{k}**: {json.dumps(v, default=str)[:200]}"
                                 for k, v in card.items() if k not in ("features", "classes")]
if not found:
    fail(f"--in-report {root}: nothing to report (no .json or .md file)")
out = Path(args.out_report)
out.mkdir(parents=True, exist_ok=True)
(out / "report.md").write_text("\n".join(lines) + "\n")
print(f"report of {found} section(s) -> {out / 'report.md'}")
