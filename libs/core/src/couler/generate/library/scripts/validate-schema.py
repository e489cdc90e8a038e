"""Validate tables against a schema (columns, types, ranges, allowed values, nulls)."""
from _common import as_json, existing, fail, parser, read_tables, write_json, write_table

p = parser(__doc__, consumes=("data",), produces=("data", "report"))
p.add_argument("--schema", required=True,
               help='JSON, or a path to a JSON file: {"columns": {"age": {"type": "number", '
                    '"min": 0, "max": 120, "nullable": false}, "plan": {"values": ["a","b"]}}}')
p.add_argument("--on-error", default="fail", help="fail (exit 1) or report (pass the data on)")
args = p.parse_args()

from pathlib import Path

text = args.schema
if not text.lstrip().startswith("{"):
    text = existing(text, "--schema").read_text()
schema = as_json(text, "--schema")
columns = schema.get("columns")
if not isinstance(columns, dict) or not columns:
    fail('--schema: expected {"columns": {NAME: {...}}} with at least one column')
kinds = {"number": "iuf", "integer": "iu", "string": "OSU", "bool": "b", "datetime": "M"}
problems = []
tables = read_tables(args.in_data, "--in-data")
for name, df in tables:
    for column, rule in columns.items():
        if column not in df.columns:
            if rule.get("required", True):
                problems.append(f"{name}: column {column!r} is missing")
            continue
        values = df[column]
        kind = rule.get("type")
        if kind and kind not in kinds:
            fail(f"--schema: column {column!r} has an unknown type {kind!r} ({', '.join(kinds)})")
        if kind and values.dtype.kind not in kinds[kind] and not values.isna().all():
            problems.append(f"{name}: column {column!r} is {values.dtype}, not {kind}")
        if not rule.get("nullable", True) and values.isna().any():
            problems.append(f"{name}: column {column!r} has {int(values.isna().sum())} nulls")
        if "min" in rule and (values < rule["min"]).any():
            problems.append(f"{name}: column {column!r} has values below {rule['min']}")
        if "max" in rule and (values > rule["max"]).any():
            problems.append(f"{name}: column {column!r} has values above {rule['max']}")
        if "values" in rule:
            bad = sorted(set(values.dropna().astype(str)) - {str(v) for v in rule["values"]})
            if bad:
                problems.append(f"{name}: column {column!r} has unexpected values {bad[:5]}")
    extra = sorted(set(df.columns) - set(columns))
    if schema.get("strict") and extra:
        problems.append(f"{name}: columns not in the schema: {extra[:10]}")
write_json(Path(args.out_report) / "validation.json",
           {"valid": not problems, "problems": problems, "tables": [n for n, _ in tables]})
for problem in problems:
    print(problem)
if problems and args.on_error == "fail":
    fail(f"{len(problems)} schema violation(s); see above", code=1)
for name, df in tables:
    write_table(df, args.out_data, name)
print(f"{len(tables)} table(s) checked, {len(problems)} problem(s)")
