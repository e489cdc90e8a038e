# --- the catalog's shared helpers (scripts/_common.py), inlined by the loader ---
# Standard library only at the top: pandas, numpy and the ML libraries are imported when
# used, so that ``--help`` works anywhere and a missing library fails with a clear message.
import argparse
import json
import os
import sys
from pathlib import Path

TABULAR_IMAGE = "ghcr.io/couler-io/ml-tabular:0.1"
TORCH_IMAGE = "ghcr.io/couler-io/ml-torch:0.1"
TABLE_SUFFIXES = (".csv", ".parquet", ".jsonl", ".json", ".tsv")
UNSAFE_FEATURE_CHARS = str.maketrans({"[": "(", "]": ")", "<": "lt", ",": "_", '"': ""})


def fail(message, code=2):
    """Exit non-zero with ``message`` on standard error."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def need(module, image=TABULAR_IMAGE, package=""):
    """Import ``module`` or exit naming the package and the image that has it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        local = (" or, on the local engine, .venv-ml (scripts/setup-ml-venv.sh) mapped by "
                 "COULER_LOCAL_PYTHON") if image == TABULAR_IMAGE else ""
        fail(f"this step needs the Python package {package or module!r} ({e}); run it in "
             f"the image {image}{local}")


def parser(description, consumes=(), produces=(), metric=False, optional=()):
    """The step's argument parser with the catalog's calling convention."""
    p = argparse.ArgumentParser(description=description)
    for kind in consumes:
        p.add_argument(f"--in-{kind}", required=kind not in optional, metavar="DIR",
                       help=f"the {kind} directory this step reads")
    for kind in produces:
        p.add_argument(f"--out-{kind}", required=True, metavar="DIR",
                       help=f"the {kind} directory this step writes")
    if metric:
        p.add_argument("--metric-file", required=True, metavar="PATH",
                       help="where the metric's value is written (one number)")
    return p


def env_secret(variable, what):
    """The value of the environment variable named ``variable`` (a secret reference)."""
    if not variable:
        fail(f"{what}: no environment variable named (give the parameter)")
    value = os.environ.get(variable, "")
    if not value:
        fail(f"{what}: the environment variable {variable!r} is not set (map the secret to it)")
    return value


def out_dir(path):
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def existing(path, flag):
    p = Path(path)
    if not p.exists():
        fail(f"{flag} {p}: no such file or directory")
    return p


def table_files(path, flag):
    """The table files under ``path`` (a file or a directory), sorted by name."""
    p = existing(path, flag)
    if p.is_file():
        return [p]
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in TABLE_SUFFIXES
                   and not f.name.startswith(("_", ".")) and f.name != "card.json")
    if not files:
        fail(f"{flag} {p}: no table in it (looked for {', '.join(TABLE_SUFFIXES)} files)")
    return files


def find_table(path, flag, name=None):
    """The one table in ``path``: the file called ``name`` (any suffix) when there is one."""
    files = table_files(path, flag)
    if name:
        named = [f for f in files if f.stem == name]
        if named:
            return named[0]
    if len(files) == 1:
        return files[0]
    fail(f"{flag} {path}: {len(files)} tables and none called {name!r} "
         f"({', '.join(f.name for f in files[:5])})")


def load_table(path):
    pd = need("pandas")
    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".jsonl":
        return pd.read_json(path, lines=True)
    if path.suffix == ".json":
        return pd.read_json(path)
    return pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",")


def read_table(path, flag, name=None):
    """The table in ``path`` (a pandas DataFrame); see :func:`find_table`."""
    return load_table(find_table(path, flag, name))


def write_table(df, directory, name="table", fmt="csv"):
    """Write ``df`` as ``directory/name.fmt`` and return the path."""
    d = out_dir(directory)
    if fmt == "parquet":
        path = d / f"{name}.parquet"
        df.to_parquet(path, index=False)
    elif fmt == "jsonl":
        path = d / f"{name}.jsonl"
        df.to_json(path, orient="records", lines=True)
    elif fmt == "csv":
        path = d / f"{name}.csv"
        df.to_csv(path, index=False)
    else:
        fail(f"--format {fmt!r}: expected csv, parquet or jsonl")
    return path


def write_json(path, obj):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_metric(path, name, value, report_dir=None, extra=None):
    """Write the metric to ``--metric-file`` (one number) and, with ``report_dir``, to
    its ``metrics.json``; print it."""
    value = float(value)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{value:.6g}\n")
    if report_dir:
        write_json(Path(report_dir) / "metrics.json", {name: value, **(extra or {})})
    print(json.dumps({name: value, **(extra or {})}, default=str))


def number(text, flag, low=None, high=None):
    try:
        value = float(text)
    except ValueError:
        fail(f"{flag} {text!r}: not a number")
    if (low is not None and value < low) or (high is not None and value > high):
        fail(f"{flag} {text!r}: must be between {low} and {high}")
    return value


def as_json(text, flag):
    if not text:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        fail(f"{flag}: not JSON ({e})")


def columns_param(text):
    """A comma-separated list of column names ("" -> [])."""
    return [c.strip() for c in text.split(",") if c.strip()]


# --- sample data: only for a ``sample://NAME`` source --------------------------------
SAMPLES = ("breast_cancer", "iris", "wine", "diabetes", "digits", "timeseries", "ratings",
           "text", "transactions", "transcripts")


def sample_table(name):
    """The sample table ``name``: a dataset bundled with scikit-learn, or a generated
    table (seeded); the caller labels the output as sample data."""
    pd = need("pandas")
    np = need("numpy")
    if name in ("breast_cancer", "iris", "wine", "diabetes", "digits"):
        datasets = need("sklearn.datasets", package="scikit-learn")
        frame = getattr(datasets, f"load_{name}")(as_frame=True).frame
        return frame.rename(columns={"target": "label"})
    rng = np.random.default_rng(0)
    if name == "timeseries":
        t = np.arange(730)
        value = 100 + 0.05 * t + 10 * np.sin(2 * np.pi * t / 7) + rng.normal(0, 2, t.size)
        return pd.DataFrame({"date": pd.date_range("2024-01-01", periods=t.size, freq="D"),
                             "value": value.round(3)})
    if name == "ratings":
        users, items = 200, 60
        taste = rng.normal(size=(users, 4)) @ rng.normal(size=(4, items))
        rows = [(u, i, float(np.clip(np.round(3 + taste[u, i]), 1, 5)))
                for u in range(users) for i in rng.choice(items, 15, replace=False)]
        return pd.DataFrame(rows, columns=["user", "item", "rating"])
    if name == "text":
        good = ["great", "excellent", "loved", "wonderful", "fast", "helpful"]
        bad = ["terrible", "awful", "hated", "broken", "slow", "rude"]
        nouns = ["service", "product", "delivery", "support", "app", "price"]
        rows = []
        for k in range(400):
            label = int(k % 2)
            words = rng.choice(good if label else bad, 2)
            rows.append((f"the {rng.choice(nouns)} was {words[0]} and {words[1]}", label))
        return pd.DataFrame(rows, columns=["text", "label"])
    if name == "transactions":
        n = 2000
        amount = rng.lognormal(3, 1, n).round(2)
        hour = rng.integers(0, 24, n)
        category = rng.choice(["grocery", "travel", "online", "fuel"], n)
        risk = 0.002 * amount + (hour < 5) * 1.5 + (category == "online") * 0.8
        fraud = (risk + rng.normal(0, 0.5, n) > 2.2).astype(int)
        return pd.DataFrame({"amount": amount, "hour": hour, "category": category,
                             "label": fraud})
    if name == "transcripts":
        refs = ["turn the lights on", "what is the weather today", "play some music",
                "set a timer for ten minutes", "call my mother"]
        hyps = ["turn the light on", "what is the weather today", "play sum music",
                "set a timer for ten minutes", "call my brother"]
        return pd.DataFrame({"reference": refs, "prediction": hyps})
    fail(f"--source sample://{name}: no such sample (samples: {', '.join(SAMPLES)})")


def write_sample(name, out, fmt="csv"):
    """Write the sample table ``name`` to ``out``, labelled as sample data."""
    df = sample_table(name)
    path = write_table(df, out, "table", fmt)
    write_json(Path(out) / "_sample.json", {
        "sample": name, "rows": len(df),
        "note": "sample data (a sample:// source), not data from a real source"})
    print(f"sample data: sample://{name} ({len(df)} rows) -> {path}", file=sys.stderr)
    return path


# --- tabular models -------------------------------------------------------------------
def design(df, target, features=None):
    """Features as a float matrix: numbers as they are, other columns one-hot encoded;
    with ``features`` (a trained model's), the same columns in the same order."""
    pd = need("pandas")
    x = df.drop(columns=[target]) if target and target in df.columns else df
    x = pd.get_dummies(x, dummy_na=False)
    x.columns = [str(c).translate(UNSAFE_FEATURE_CHARS) for c in x.columns]
    if features is not None:
        x = x.reindex(columns=features, fill_value=0)
    return x.astype("float64")


def labels(df, target, flag="--target"):
    if target not in df.columns:
        fail(f"{flag} {target!r}: no such column (columns: {', '.join(map(str, df.columns))})")
    return df[target]


def task_of(y, task):
    """"classification" or "regression" (``task`` "auto" decides by the target)."""
    if task in ("classification", "regression"):
        return task
    if task != "auto":
        fail(f"--task {task!r}: expected auto, classification or regression")
    if y.dtype.kind in "ObUS" or str(y.dtype) == "category":
        return "classification"
    if y.dtype.kind in "iu" and y.nunique() <= 20:
        return "classification"
    return "regression"


def encode_labels(y):
    """Class labels -> 0..K-1 and the classes in that order."""
    classes = sorted(y.unique().tolist(), key=str)
    index = {c: i for i, c in enumerate(classes)}
    return y.map(index).astype("int64").to_numpy(), classes


def training_data(args, task="auto"):
    """(frame, X, y, task, classes) of the training table in ``--in-data``."""
    df = read_table(args.in_data, "--in-data", "train")
    y = labels(df, args.target)
    if y.isna().any():
        fail(f"--target {args.target!r}: {int(y.isna().sum())} rows have no value "
             "(impute or drop them first)")
    task = task_of(y, task)
    x = design(df, args.target)
    classes = None
    if task == "classification":
        y, classes = encode_labels(y)
    else:
        y = y.astype("float64").to_numpy()
    return df, x, y, task, classes


MODEL_FILES = {"xgboost": "model.json", "lightgbm": "model.txt", "catboost": "model.cbm",
               "sklearn": "model.joblib", "statsmodels": "model.pickle"}


def save_model(directory, library, model, card):
    """Save ``model`` in its library's own format and ``card.json`` beside it."""
    d = out_dir(directory)
    path = d / MODEL_FILES[library]
    if library == "xgboost":
        model.save_model(str(path))
    elif library == "lightgbm":
        model.booster_.save_model(str(path))
    elif library == "catboost":
        model.save_model(str(path))
    elif library == "statsmodels":
        model.save(str(path))
    else:
        need("joblib", package="scikit-learn").dump(model, path)
    write_json(d / "card.json", {**card, "library": library, "file": path.name})
    print(json.dumps({"model": str(path), **{k: v for k, v in card.items()
                                            if k not in ("features", "classes")}},
                     default=str))
    return path


def train_card(args, task, x, classes, **extra):
    """The model card of a trained tabular model (``card.json``)."""
    return {"target": args.target, "task": task, "features": list(x.columns),
            "classes": classes, "train_rows": len(x), **extra}


def hyperparams(text):
    """The ``--hyperparams`` JSON object (extra keyword arguments of the estimator)."""
    value = as_json(text, "--hyperparams")
    if not isinstance(value, dict):
        fail(f"--hyperparams {text!r}: expected a JSON object")
    return value


def read_card(directory, flag="--in-model"):
    path = existing(directory, flag) / "card.json"
    if not path.is_file():
        fail(f"{flag} {directory}: no card.json (not a model written by a catalog step)")
    return json.loads(path.read_text())


class Predictor:
    """A saved tabular model: ``predict`` (labels or values) and ``proba`` (classes)."""

    def __init__(self, directory, flag="--in-model"):
        self.card = card = read_card(directory, flag)
        self.task = card.get("task", "classification")
        self.classes = card.get("classes")
        self.library = library = card["library"]
        path = Path(directory) / card["file"]
        if not path.is_file():
            fail(f"{flag} {directory}: the model file {card['file']} is missing")
        classify = self.task == "classification"
        if library == "xgboost":
            xgb = need("xgboost", package="xgboost")
            self.model = xgb.XGBClassifier() if classify else xgb.XGBRegressor()
            self.model.load_model(str(path))
        elif library == "lightgbm":
            self.model = need("lightgbm").Booster(model_file=str(path))
        elif library == "catboost":
            cb = need("catboost")
            self.model = cb.CatBoostClassifier() if classify else cb.CatBoostRegressor()
            self.model.load_model(str(path))
        elif library == "sklearn":
            self.model = need("joblib", package="scikit-learn").load(path)
        else:
            fail(f"{flag} {directory}: a {library} model cannot make tabular predictions")

    def matrix(self, df):
        return design(df, self.card.get("target"), self.card["features"])

    def proba(self, df):
        """Class probabilities (rows x classes), or None (no probabilities)."""
        np = need("numpy")
        if self.task != "classification":
            return None
        x = self.matrix(df)
        if self.library == "lightgbm":
            p = np.asarray(self.model.predict(x))
            return np.column_stack([1 - p, p]) if p.ndim == 1 else p
        if hasattr(self.model, "predict_proba"):
            try:
                return np.asarray(self.model.predict_proba(x))
            except AttributeError:  # e.g. SVC without probability=True
                return None
        return None

    def predict(self, df):
        np = need("numpy")
        x = self.matrix(df)
        if self.task == "anomaly":  # scikit-learn's outlier detectors: -1 is an outlier
            return (np.asarray(self.model.predict(x)) == -1).astype("int64")
        if self.task != "classification":
            return np.asarray(self.model.predict(x), dtype="float64").ravel()
        p = self.proba(df)
        index = p.argmax(axis=1) if p is not None else np.asarray(
            self.model.predict(x)).ravel().astype("int64")
        return np.asarray(self.classes, dtype=object)[index]

    def encoded(self, y):
        """True labels as class indices (the model's classes; unknown ones fail)."""
        index = {str(c): i for i, c in enumerate(self.classes)}
        unknown = sorted({str(v) for v in y} - set(index))
        if unknown:
            fail(f"the evaluation data has classes the model does not know: {unknown[:5]}")
        return need("numpy").array([index[str(v)] for v in y])


def evaluation_data(args):
    """(predictor, frame, true target) for an evaluation step: the ``test`` table of
    ``--in-data`` (or its only table)."""
    model = Predictor(args.in_model)
    df = read_table(args.in_data, "--in-data", "test")
    target = args.target or model.card.get("target")
    return model, df, labels(df, target)


def read_tables(path, flag):
    """Every table in ``path`` as (name, frame), e.g. train and test after a split."""
    files = table_files(path, flag)
    names = [str(f.relative_to(path).with_suffix("")) if Path(path).is_dir() else f.stem
             for f in files]
    return [(n.replace(os.sep, "__"), load_table(f)) for n, f in zip(names, files)]


def fitting_table(tables):
    """The table a transformation is fitted on: ``train`` when there is one (no leakage
    from the test rows), else all of them."""
    pd = need("pandas")
    train = [df for name, df in tables if name == "train"]
    return train[0] if train else pd.concat([df for _, df in tables], ignore_index=True)


def table_format(args):
    return getattr(args, "format", "csv") or "csv"
# --- end of the shared helpers ---


def report_validation(args):
    """Score the model just saved in ``--out-model`` on the held-out ``test`` table of
    ``--in-data`` (ROC AUC for two classes, else accuracy; R2 for regression) and write it
    to ``--metric-file`` as the step's ``validation_score`` (what tuning optimizes). With no
    ``test`` table the training rows are scored, and the report says so."""
    metrics = need("sklearn.metrics", package="scikit-learn")
    model = Predictor(args.out_model, "--out-model")
    tables = dict(read_tables(args.in_data, "--in-data"))
    split = "test" if "test" in tables else "train"
    if split == "train":
        print("warning: --in-data has no test table; the validation score is measured on the "
              "training rows (split the data first for a held-out score)", file=sys.stderr)
        df = tables.get("train", next(iter(tables.values())))
    else:
        df = tables["test"]
    truth = labels(df, model.card.get("target") or args.target)
    if model.task == "classification":
        y = model.encoded(truth)
        proba = model.proba(df)
        if proba is not None and proba.shape[1] == 2 and len(set(y)) == 2:
            measure, value = "auc", metrics.roc_auc_score(y, proba[:, 1])
        else:
            measure = "accuracy"
            value = metrics.accuracy_score([str(v) for v in truth],
                                           [str(v) for v in model.predict(df)])
    else:
        measure, value = "r2", metrics.r2_score(truth.astype("float64"), model.predict(df))
    write_metric(args.metric_file, "validation_score", value,
                 extra={"measure": measure, "split": split, "rows": len(df)})


def train_tabular(args, library, version, estimators, params):
    """Fit ``estimators`` (classifier, regressor) — the one the target calls for — with
    ``params``, save it in ``--out-model`` with its card and report the held-out score."""
    _, x, y, task, classes = training_data(args, args.task)
    classifier, regressor = estimators
    model = (classifier if task == "classification" else regressor)(**params)
    model.fit(x, y)
    save_model(args.out_model, library, model, train_card(
        args, task, x, classes, estimator=type(model).__name__, params=params,
        version=version, train_score=float(model.score(x, y))))
    report_validation(args)
