"""Normalize numeric features: standardize (z-score), min-max scale or robust-scale."""
from _common import (
    columns_param,
    fail,
    fitting_table,
    need,
    parser,
    read_tables,
    table_format,
    write_table,
)

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--method", default="standard", help="standard (z-score), minmax or robust")
p.add_argument("--columns", default="", help="comma-separated columns (default: every number)")
p.add_argument("--target", default="label", help="a column never scaled (the label)")
p.add_argument("--format", default="csv")
args = p.parse_args()

preprocessing = need("sklearn.preprocessing", package="scikit-learn")
scalers = {"standard": preprocessing.StandardScaler, "minmax": preprocessing.MinMaxScaler,
           "robust": preprocessing.RobustScaler}
if args.method not in scalers:
    fail(f"--method {args.method!r}: expected {', '.join(scalers)}")
tables = read_tables(args.in_data, "--in-data")
fit = fitting_table(tables)
columns = columns_param(args.columns) or [
    c for c in fit.columns if fit[c].dtype.kind in "iuf" and c != args.target]
missing = [c for c in columns if c not in fit.columns]
if missing:
    fail(f"--columns: no such column(s) {missing}")
scaler = scalers[args.method]().fit(fit[columns])
for name, df in tables:
    df = df.copy()
    df[columns] = scaler.transform(df[columns])
    write_table(df, args.out_data, name, table_format(args))
print(f"{args.method}-scaled {len(columns)} column(s) in {len(tables)} table(s)")
