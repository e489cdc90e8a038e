"""Measure data drift between a reference table and the current data: a two-sample test per
column (Kolmogorov-Smirnov for numbers, chi-squared for categories); the drift share is the
fraction of columns that drifted."""
from _common import fail, need, parser, read_table, read_tables, write_json, write_metric

p = parser(__doc__, consumes=("data",), produces=("data", "report"), metric=True)
p.add_argument("--reference", required=True,
               help="the reference table: a path or URL the step can read (csv, parquet, jsonl)")
p.add_argument("--threshold", default="0.05", help="p-value under which a column drifted")
p.add_argument("--columns", default="", help="comma-separated columns (default: shared ones)")
args = p.parse_args()

import shutil
from pathlib import Path

pd = need("pandas")
stats = need("scipy.stats", package="scipy")
ref_path = args.reference
if "://" in ref_path:
    fsspec = need("fsspec")
    try:
        with fsspec.open(ref_path, "rb") as fh:
            reference = (pd.read_parquet(fh) if ref_path.endswith(".parquet")
                         else pd.read_csv(fh))
    except (FileNotFoundError, OSError, ValueError) as e:
        fail(f"--reference {ref_path}: {e}")
else:
    reference = read_table(ref_path, "--reference")
current = pd.concat([df for _, df in read_tables(args.in_data, "--in-data")], ignore_index=True)
columns = [c.strip() for c in args.columns.split(",") if c.strip()] or [
    c for c in current.columns if c in reference.columns]
if not columns:
    fail("no column is in both the reference and the current data")
alpha = float(args.threshold)
rows = []
for c in columns:
    a, b = reference[c].dropna(), current[c].dropna()
    if a.empty or b.empty:
        continue
    if a.dtype.kind in "iuf" and b.dtype.kind in "iuf":
        test, pvalue = "ks", float(stats.ks_2samp(a, b).pvalue)
    else:
        table = pd.crosstab(pd.concat([a, b]).astype(str),
                            ["reference"] * len(a) + ["current"] * len(b))
        test, pvalue = "chi2", float(stats.chi2_contingency(table)[1]) if len(table) > 1 else 1.0
    rows.append({"column": c, "test": test, "p_value": pvalue, "drifted": pvalue < alpha})
share = sum(r["drifted"] for r in rows) / max(1, len(rows))
write_json(Path(args.out_report) / "drift.json", {"drift_share": share, "columns": rows})
shutil.copytree(args.in_data, args.out_data, dirs_exist_ok=True)
write_metric(args.metric_file, "drift_share", share, args.out_report)
