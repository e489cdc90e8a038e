"""The catalog's tabular templates really run: in .venv-ml (scripts/setup-ml-venv.sh), chained
by the calling convention, and one on the local engine through COULER_LOCAL_PYTHON's map."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from couler import ir
from couler.engines.base import RunState
from couler.generate import library
from couler_runtime.local.engine import LocalEngine

ROOT = Path(__file__).resolve().parents[2]


def run(python: Path | str, tmp: Path, name: str, *args: str,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp / f"{name}.py"
    script.write_text(library.template(name).source)
    return subprocess.run([str(python), str(script), *args], capture_output=True, text=True,
                          timeout=600, check=False, env={**os.environ, **(env or {})})


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def split(ml_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("split")
    ok(run(ml_python, tmp, "ingest-local-files", "--source", "sample://breast_cancer",
           "--out-data", str(tmp / "raw")))
    assert json.loads((tmp / "raw" / "_sample.json").read_text())["sample"] == "breast_cancer"
    ok(run(ml_python, tmp, "split-train-test", "--in-data", str(tmp / "raw"),
           "--out-data", str(tmp / "split"), "--test-size", "0.25"))
    return tmp / "split"


@pytest.mark.parametrize(("template", "flags", "loader"), [
    ("train-xgboost", ("--n-estimators", "60"),
     "import xgboost; b = xgboost.Booster(); b.load_model(PATH); print(b.num_features())"),
    ("train-lightgbm", ("--n-estimators", "60"),
     "import lightgbm; print(lightgbm.Booster(model_file=PATH).num_feature())"),
    ("train-catboost", ("--iterations", "60"),
     "import catboost; m = catboost.CatBoostClassifier(); m.load_model(PATH); "
     "print(len(m.feature_names_))"),
    ("train-sklearn", ("--estimator", "RandomForestClassifier", "--hyperparams",
                       '{"n_estimators": 50}'),
     "import joblib; print(joblib.load(PATH).n_features_in_)"),
])
def test_a_tabular_model_trains_and_evaluates(ml_python: Path, split: Path, tmp_path: Path,
                                              template: str, flags: tuple[str, ...],
                                              loader: str) -> None:
    ok(run(ml_python, tmp_path, template, "--in-data", str(split),
           "--out-model", str(tmp_path / "model"), "--metric-file", str(tmp_path / "score"),
           *flags))
    # the held-out ROC AUC, measured on the split's test rows (what tuning optimizes)
    assert 0.9 < float((tmp_path / "score").read_text()) <= 1.0
    card = json.loads((tmp_path / "model" / "card.json").read_text())
    assert card["task"] == "classification" and card["classes"] == [0, 1]
    # the file is the library's own model format, loadable by the library itself
    model_file = repr(str(tmp_path / "model" / card["file"]))
    features = ok(subprocess.run([str(ml_python), "-c", loader.replace("PATH", model_file)],
                                 capture_output=True, text=True, timeout=120, check=False))
    assert int(features) == 30  # breast_cancer's features
    for metric in ("auc", "f1"):
        metric_file = tmp_path / metric / "value"
        ok(run(ml_python, tmp_path, f"evaluate-{metric}", "--in-model", str(tmp_path / "model"),
               "--in-data", str(split), "--out-report", str(tmp_path / metric),
               "--metric-file", str(metric_file)))
        value = float(metric_file.read_text())
        assert 0.5 < value <= 1.0, (template, metric, value)
        report = json.loads((tmp_path / metric / "metrics.json").read_text())
        assert report[metric] == pytest.approx(value, abs=1e-5)


def test_a_csv_file_runs_through_cleaning_encoding_and_regression(ml_python: Path,
                                                                 tmp_path: Path) -> None:
    rows = ["size,city,price"] + [
        f"{s},{c},{3 * s + (40 if c == 'paris' else 0) + (s % 7)}"
        for s in range(20, 220) for c in ("paris", "lyon")]
    rows[5] = "55,lyon,"  # a missing label value is dropped, not invented
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "houses.csv").write_text("\n".join(rows) + "\n")
    ok(run(ml_python, tmp_path, "clean-impute", "--in-data", str(tmp_path / "in"),
           "--out-data", str(tmp_path / "clean"), "--strategy", "drop"))
    ok(run(ml_python, tmp_path, "encode-categorical", "--in-data", str(tmp_path / "clean"),
           "--out-data", str(tmp_path / "enc"), "--target", "price"))
    header = (tmp_path / "enc" / "houses.csv").read_text().splitlines()[0].split(",")
    assert {"city_paris", "city_lyon"} <= set(header) and "city" not in header
    ok(run(ml_python, tmp_path, "split-train-test", "--in-data", str(tmp_path / "enc"),
           "--out-data", str(tmp_path / "split"), "--target", "price"))
    ok(run(ml_python, tmp_path, "train-sklearn", "--estimator", "Ridge", "--target", "price",
           "--in-data", str(tmp_path / "split"), "--out-model", str(tmp_path / "ridge"),
           "--metric-file", str(tmp_path / "r2")))
    assert 0.5 < float((tmp_path / "r2").read_text()) <= 1.0  # held-out R2 of a linear fit
    ok(run(ml_python, tmp_path, "evaluate-rmse", "--in-model", str(tmp_path / "ridge"),
           "--in-data", str(tmp_path / "split"), "--out-report", str(tmp_path / "r"),
           "--metric-file", str(tmp_path / "rmse")))
    assert 0 < float((tmp_path / "rmse").read_text()) < 5  # noise is at most 6 around 3*size


def test_a_missing_input_fails_naming_the_path(ml_python: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    done = run(ml_python, tmp_path, "train-xgboost", "--in-data", str(missing),
               "--out-model", str(tmp_path / "m"), "--metric-file", str(tmp_path / "s"))
    assert done.returncode != 0 and str(missing) in done.stderr
    assert not (tmp_path / "m").exists()


def test_sql_ingest_reads_the_url_from_the_named_variable(ml_python: Path,
                                                          tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "shop.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER, amount REAL)")
        conn.executemany("INSERT INTO orders VALUES (?, ?)", [(i, i * 1.5) for i in range(10)])
    ok(run(ml_python, tmp_path, "ingest-sql", "--query", "SELECT * FROM orders WHERE id < 4",
           "--url-env", "SHOP_DB", "--format", "csv", "--out-data", str(tmp_path / "out"),
           env={"SHOP_DB": f"sqlite:///{db}"}))
    assert (tmp_path / "out" / "table.csv").read_text().splitlines()[1:] == [
        "0,0.0", "1,1.5", "2,3.0", "3,4.5"]
    done = run(ml_python, tmp_path, "ingest-sql", "--query", "orders", "--url-env", "UNSET_DB",
               "--out-data", str(tmp_path / "x"))
    assert done.returncode != 0 and "'UNSET_DB' is not set" in done.stderr


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, object]]]]:
    received: list[dict[str, object]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hooks/T0", received
    server.shutdown()
    server.server_close()


def test_notify_posts_the_message_and_metrics_to_the_webhook(
        tmp_path: Path, webhook: tuple[str, list[dict[str, object]]]) -> None:
    url, received = webhook
    (tmp_path / "report" / "xgb").mkdir(parents=True)
    (tmp_path / "report" / "xgb" / "metrics.json").write_text('{"auc": 0.987}')
    done = run(sys.executable, tmp_path, "notify-webhook", "--message", "training done",
               "--channel", "#sre-alerts", "--url-env", "HOOK_URL",
               "--in-report", str(tmp_path / "report"), "--out-report", str(tmp_path / "out"),
               env={"HOOK_URL": url})
    ok(done)
    assert received == [{"text": "training done\nxgb: auc=0.987", "channel": "#sre-alerts"}]
    assert url not in done.stdout + done.stderr  # the secret URL is never printed


def test_the_local_engine_runs_a_tabular_image_step_with_the_mapped_python(
        ml_python: Path, tmp_path: Path) -> None:
    source = "import sys, xgboost\nprint(sys.executable)"
    steps = (
        ir.Step(name="tabular", body=ir.ScriptSpec(image=library.TABULAR_IMAGE, source=source),
                outputs=(ir.OutputParameter("python", source=ir.OutputSource.STDOUT),)),
        ir.Step(name="plain", body=ir.ScriptSpec(image="python:3.12",
                                                 source="import sys\nprint(sys.executable)"),
                outputs=(ir.OutputParameter("python", source=ir.OutputSource.STDOUT),)),
    )
    engine = LocalEngine(tmp_path,
                         image_python={"ghcr.io/couler-io/ml-tabular:*": str(ml_python)})
    status = engine.run(ir.Workflow(name="image-python", steps=steps))
    assert status.state is RunState.SUCCEEDED, status
    outputs = {s.step: s.outputs["python"] for s in status.steps}
    assert outputs == {"tabular": str(ml_python), "plain": sys.executable}
