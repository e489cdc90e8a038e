"""Split a table into train and test sets (stratified by the label when it is a class)."""
from _common import need, number, parser, read_table, table_format, task_of, write_table

p = parser(__doc__, consumes=("data",), produces=("data",))
p.add_argument("--test-size", default="0.2", help="the fraction of rows held out")
p.add_argument("--target", default="label", help="the label column (stratifies classes)")
p.add_argument("--stratify", default="auto", help="auto, true or false")
p.add_argument("--seed", default="42")
p.add_argument("--format", default="csv")
args = p.parse_args()

model_selection = need("sklearn.model_selection", package="scikit-learn")
df = read_table(args.in_data, "--in-data")
size = number(args.test_size, "--test-size", 0, 1)
stratify = None
if args.target in df.columns and (
        args.stratify == "true"
        or (args.stratify == "auto" and task_of(df[args.target], "auto") == "classification")):
    stratify = df[args.target]
train, test = model_selection.train_test_split(df, test_size=size, random_state=int(args.seed),
                                               stratify=stratify)
write_table(train, args.out_data, "train", table_format(args))
write_table(test, args.out_data, "test", table_format(args))
print(f"train {len(train)} rows, test {len(test)} rows (stratified: {stratify is not None})")
