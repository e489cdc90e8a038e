"""Tune steps on the local engine with real optuna studies (SQLite storage), and the
``python -m couler_runtime.tune`` command line the static engines' steps run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import pytest

from couler import ir
from couler.engines.base import RunState, StepState, StepStatus
from couler.optimize.cache_key import item_cache_key
from couler_runtime.local import LocalEngine, Reuse
from couler_runtime.tune import close_study, open_study, report
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]

DATA = r'''
import numpy as np
from sklearn.datasets import make_classification
x, y = make_classification(n_samples=400, n_features=20, n_informative=5, flip_y=0.2,
                           random_state=0)
np.savez("/tmp/out/data.npz", xtr=x[:300], ytr=y[:300], xte=x[300:], yte=y[300:])
'''

TRAIN = r'''
import sys
import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
C, max_iter = float(sys.argv[1]), int(sys.argv[2])
d = np.load("/tmp/in/data.npz")
clf = LogisticRegression(C=C, max_iter=max_iter).fit(d["xtr"], d["ytr"])
auc = roc_auc_score(d["yte"], clf.predict_proba(d["xte"])[:, 1])
open("/tmp/out/auc", "w").write(repr(float(auc)))
'''


def _sklearn_workflow(trials: int = 6, parallel: int = 2) -> ir.Workflow:
    """data (a synthetic classification set) -> train (a logistic regression, tuned over C
    and max_iter, AUC the objective) -> use (prints best_params)."""
    data = ir.Step("data", ir.ScriptSpec("python:3.12", DATA),
                   output_artifacts=(ir.OutputArtifact("data", "/tmp/out/data.npz"),))
    train = ir.Step(
        "train", ir.ScriptSpec("python:3.12", TRAIN, args=("{{inputs.C}}",
                                                           "{{inputs.max_iter}}")),
        inputs=(ir.InputParameter("C", ir.ItemRef("C"), ir.ValueType.FLOAT),
                ir.InputParameter("max_iter", ir.ItemRef("max_iter"), ir.ValueType.INT)),
        outputs=(ir.OutputParameter("auc", ir.OutputSource.PATH, "/tmp/out/auc",
                                    ir.ValueType.FLOAT),),
        input_artifacts=(ir.InputArtifact("data", "/tmp/in/data.npz",
                                          ir.StepArtifactRef("data", "data")),),
        dependencies=(ir.Dependency("data"),),
        tune=ir.Tune(space=(ir.TuneParam("C", ir.TuneKind.LOGUNIFORM, 1e-4, 10.0),
                            ir.TuneParam("max_iter", ir.TuneKind.INT, 5, 100)),
                     objective="auc", trials=trials, parallel=parallel, seed=1))
    use = ir.Step("use", ir.ScriptSpec("python:3.12", "import sys; print(sys.argv[1])",
                                       args=("{{inputs.p}}",)),
                  inputs=(ir.InputParameter("p", ir.StepOutputRef("train", "best_params"),
                                            ir.ValueType.JSON),
                          ir.InputParameter("v", ir.StepOutputRef("train", "best_value"),
                                            ir.ValueType.FLOAT)),
                  outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
                  dependencies=(ir.Dependency("train"),))
    return ir.Workflow("tune-sk", (data, train, use))


def _step(status: object, name: str, key: str = "") -> StepStatus:
    return next(s for s in status.steps if s.step == name and s.key == key)  # type: ignore[attr-defined]


@contextmanager
def _storage(url: str) -> Iterator[optuna.storages.RDBStorage]:
    """An optuna storage whose connections are closed at the end."""
    storage = optuna.storages.RDBStorage(url)
    try:
        yield storage
    finally:
        storage.engine.dispose()


def _study(url: str, prefix: str = "") -> _Frozen:
    """The one study in ``url`` (whose name starts with ``prefix``), read and closed."""
    with _storage(url) as storage:
        names = [n for n in optuna.get_all_study_names(storage) if n.startswith(prefix)]
        assert len(names) == 1, names
        study = optuna.load_study(study_name=names[0], storage=storage)
        return _Frozen(study)


class _Frozen:
    """What the tests read of a study, copied out of its storage."""

    def __init__(self, study: optuna.study.Study) -> None:
        self.study_name = study.study_name
        self.trials = study.trials
        complete = [t for t in self.trials if t.state is optuna.trial.TrialState.COMPLETE]
        self.best_params = study.best_params if complete else {}
        self.best_value = study.best_value if complete else None


def test_a_real_study_tunes_a_logistic_regression_and_the_next_step_reads_the_best(
        tmp_path: Path) -> None:
    wf = _sklearn_workflow()
    ir.validate(wf)
    engine = LocalEngine(tmp_path / "engine")
    status = engine.run(wf)
    assert status.state is RunState.SUCCEEDED, status.message
    trials = sorted((s for s in status.steps if s.step == "train" and s.key),
                    key=lambda s: int(s.key))
    assert [s.key for s in trials] == ["0", "1", "2", "3", "4", "5"]
    assert all(s.state is StepState.SUCCEEDED for s in trials), [s.message for s in trials]
    study = _study(f"sqlite:///{tmp_path / 'engine' / 'tune.db'}")
    values = [t.value for t in study.trials if t.state is optuna.trial.TrialState.COMPLETE]
    assert len(values) == 6
    assert [float(s.outputs["auc"]) for s in trials] == values
    tune = _step(status, "train")
    assert float(tune.outputs["best_value"]) == max(values)
    best = json.loads(tune.outputs["best_params"])
    assert set(best) == {"C", "max_iter"} and 1e-4 <= best["C"] <= 10.0
    assert best == study.best_params
    assert tune.outputs["max_iter"] == str(best["max_iter"])
    assert 0.5 < max(values) <= 1.0
    assert json.loads(_step(status, "use").outputs["result"]) == best
    assert "6 trials (6 run" in tune.message


def test_trials_already_evaluated_are_reused_from_the_cache(tmp_path: Path) -> None:
    """A grid over 3 points: a cache hit for one point is not run; trial keys follow
    the parameters; the study's outputs are as if every trial ran."""
    step = ir.Step(
        "t", ir.ScriptSpec("python", "import sys; print(float(sys.argv[1]) * 2)",
                           args=("{{item.x}}",)),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT, type=ir.ValueType.FLOAT),),
        tune=ir.Tune(space=(ir.TuneParam("x", ir.TuneKind.CHOICE, choices=tuple(
            ir.Literal.of(v) for v in (1, 2, 3))),), objective="result", trials=3,
            parallel=1, sampler=ir.TuneSampler.GRID, seed=0))
    wf = ir.Workflow("tune-grid", (step,))
    ir.validate(wf)
    key = item_cache_key(wf, step, {"x": 2}, params={}, producer_keys={})
    assert key is not None
    events: list[StepStatus] = []
    engine = LocalEngine(tmp_path / "e", cache_keys=True)
    run = engine.start(wf, cached={"t[7]": Reuse(key, {"result": "40.0"})},
                       on_event=events.append)
    status = run.wait(60)
    assert status.state is RunState.SUCCEEDED, status.message
    trials = {s.key: s for s in status.steps if s.step == "t" and s.key}
    assert len(trials) == 3
    cached = [s for s in trials.values() if s.state is StepState.CACHED]
    assert len(cached) == 1 and cached[0].outputs == {"result": "40.0"}
    tune = _step(status, "t")
    assert tune.outputs["best_value"] == "40.0" and tune.outputs["x"] == "2"
    # the trials that ran report their keys, by their parameters, for the cache to keep
    ran = [s for s in trials.values() if s.state is StepState.SUCCEEDED]
    for s in ran:
        x = int(float(s.outputs["result"]) / 2)
        assert s.cache_key == item_cache_key(wf, step, {"x": x}, params={}, producer_keys={})


# Trials 0 and 1 report good values and end; trial 2 reports bad ones, then holds until
# it is stopped (a barrier, not a sleep length: it ends by itself, marking `end`, only if
# nothing stops it within 300 s -- a failure of the test, however slow the machine).
REPORTING = r'''
import os, sys, time
from couler_runtime.tune import report
n = int(os.environ["COULER_TUNE_TRIAL"])
good = n < 2
for epoch in range(40):
    report(epoch, (0.9 if good else 0.1) + epoch * 0.001)
if not good:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.05)
open(os.path.join(os.environ["MARKS"], f"trial-{n}"), "w").write("end")
print(0.95 if good else 0.2)
'''


def test_a_trial_reporting_bad_intermediate_values_is_pruned(tmp_path: Path) -> None:
    step = ir.Step(
        "fit", ir.ScriptSpec("python", REPORTING, args=("{{item.lr}}",)),
        env=(ir.EnvVar("PYTHONPATH", os.pathsep.join(sys.path)),
             ir.EnvVar("MARKS", str(tmp_path))),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT, type=ir.ValueType.FLOAT),),
        tune=ir.Tune(space=(ir.TuneParam("lr", ir.TuneKind.UNIFORM, 0.0, 1.0),),
                     objective="result", trials=3, parallel=1, seed=3))
    wf = ir.Workflow("tune-prune", (step,))
    status = LocalEngine(tmp_path / "e").run(wf)
    assert status.state is RunState.SUCCEEDED, status.message
    states = {s.key: s.state for s in status.steps if s.step == "fit" and s.key}
    assert states == {"0": StepState.SUCCEEDED, "1": StepState.SUCCEEDED,
                      "2": StepState.PRUNED}
    pruned = _step(status, "fit", "2")
    assert "pruned at step" in pruned.message
    # the engine stopped the bad trial: it never reached its end (the good ones did)
    assert sorted(p.name for p in tmp_path.glob("trial-*")) == ["trial-0", "trial-1"]
    study = _study(f"sqlite:///{tmp_path / 'e' / 'tune.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE,
                                               optuna.trial.TrialState.COMPLETE,
                                               optuna.trial.TrialState.PRUNED]
    assert study.trials[2].intermediate_values  # what the trial reported reached the study
    tune = _step(status, "fit")
    assert tune.outputs["best_value"] == "0.95"
    assert "1 pruned" in tune.message


def test_report_is_a_no_op_outside_a_trial(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.delenv("COULER_TUNE_REPORT", raising=False)
    report(1, 0.5)
    path = tmp_path / "r"
    monkeypatch.setenv("COULER_TUNE_REPORT", str(path))
    report(1, 0.5)
    report(2, 0.25)
    assert path.read_text() == "1 0.5\n2 0.25\n"


def test_report_to_a_study_without_its_trial_names_what_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a static engine's trial (COULER_TUNE_STUDY set) reports to the study itself; a step
    # not compiled by the rewrite lacks the trial's number and the storage
    monkeypatch.delenv("COULER_TUNE_REPORT", raising=False)
    monkeypatch.delenv("COULER_TUNE_STORAGE", raising=False)
    monkeypatch.setenv("COULER_TUNE_STUDY", "wf.fit.0123")
    monkeypatch.setenv("COULER_TUNE_TRIAL", "{{item.couler_trial}}")
    with pytest.raises(RuntimeError, match="COULER_TUNE_STORAGE or COULER_TUNE_TRIAL"):
        report(0, 0.5)


def test_no_completed_trial_fails_the_step_naming_it(tmp_path: Path) -> None:
    step = ir.Step(
        "t", ir.ScriptSpec("python", "print('not a number')", args=("{{item.x}}",)),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT, type=ir.ValueType.FLOAT),),
        tune=ir.Tune(space=(ir.TuneParam("x", ir.TuneKind.UNIFORM, 0.0, 1.0),),
                     objective="result", trials=2, parallel=2))
    status = LocalEngine(tmp_path / "e").run(ir.Workflow("tune-bad", (step,)))
    assert status.state is RunState.FAILED
    tune = _step(status, "t")
    assert tune.state is StepState.FAILED
    assert "workflow 'tune-bad', step 't', field 'tune': no trial of the study completed" in \
        tune.message
    assert "is not a number" in _step(status, "t", "0").message


def _trial_states(db: Path) -> list[str]:
    """The states of the trials in an optuna SQLite file, read only (opening it with optuna
    would create its tables, racing the engine that is creating them)."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return [str(r[0]) for r in conn.execute("SELECT state FROM trials ORDER BY number")]
    except sqlite3.OperationalError:  # not created yet, or locked
        return []


# Every trial logs its execution; the third and later hold until the gate file exists
# (the test opens it after the crash): the crash finds two trials done and the third
# running, however slow the machine.
SLOW = r'''
import sys, time, pathlib
log, gate = pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
with log.open("a") as f:
    f.write(sys.argv[1] + "\n")
if len(log.read_text().splitlines()) >= 3:
    deadline = time.monotonic() + 300
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
print(float(sys.argv[1]))
'''

RUNNER = r'''
import sys
from pathlib import Path
from typing import Any
from couler import ir
from couler_runtime.local import LocalEngine
wf = ir.from_json(ir.Workflow, Path(sys.argv[2]).read_text())
run = LocalEngine(sys.argv[1]).start(wf)
print(run.run_dir, flush=True)
run.wait()
'''


def test_a_crashed_run_resumes_its_study_without_rerunning_completed_trials(
        tmp_path: Path) -> None:
    log, gate = tmp_path / "executions.log", tmp_path / "gate"
    step = ir.Step(
        "slow", ir.ScriptSpec("python", SLOW, args=("{{item.x}}", str(log), str(gate))),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT, type=ir.ValueType.FLOAT),),
        tune=ir.Tune(space=(ir.TuneParam("x", ir.TuneKind.UNIFORM, 0.0, 1.0),),
                     objective="result", trials=5, parallel=1, seed=5))
    wf = ir.Workflow("tune-resume", (step,))
    wf_file = tmp_path / "wf.json"
    wf_file.write_text(ir.to_json(wf))
    work = tmp_path / "engine"
    storage = f"sqlite:///{work / 'tune.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(work), str(wf_file)],
                            stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        run_dir = Path(proc.stdout.readline().strip())
        # crash it with 2 trials done and the 3rd running (held at the gate)
        eventually(lambda: log.exists() and len(log.read_text().splitlines()) == 3,
                   "the third trial running", deadline=120)
        states = _trial_states(work / "tune.db")
        assert states.count("COMPLETE") == 2 and len(states) == 3, states
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the engine and its trial's process
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    gate.touch()
    done_before = {t.params["x"] for t in _study(storage).trials
                   if t.state is optuna.trial.TrialState.COMPLETE}
    runs_before = len(log.read_text().splitlines())
    status = LocalEngine(work).resume(run_dir).wait(120)
    assert status.state is RunState.SUCCEEDED, status.message
    study = _study(storage)
    complete_after = [t for t in study.trials if t.state is optuna.trial.TrialState.COMPLETE]
    assert len(complete_after) == 5
    executed = [float(x) for x in log.read_text().splitlines()]
    # each completed trial ran once; the resumed run ran only what was missing
    assert len(executed) - runs_before == 5 - len(done_before)
    assert not done_before & set(executed[runs_before:])
    assert {t.params["x"] for t in complete_after} == done_before | set(executed[runs_before:])
    tune = _step(status, "slow")
    assert float(tune.outputs["best_value"]) == max(t.value for t in complete_after)
    records = {s.key: s.state for s in status.steps if s.step == "slow" and s.key}
    assert sum(state is StepState.SUCCEEDED for state in records.values()) == 5


# --------------------------------------------------------------------------- the CLI

SPEC = ir.Tune(space=(ir.TuneParam("lr", ir.TuneKind.LOGUNIFORM, 1e-4, 1e-1),
                      ir.TuneParam("depth", ir.TuneKind.INT, 2, 8)),
               objective="auc", trials=3, parallel=2, seed=1)


def _cli(*args: str, storage: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "COULER_TUNE_STORAGE": storage}
    return subprocess.run([sys.executable, "-m", "couler_runtime.tune", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_ask_tell_best_against_sqlite(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    common = ["--study", "wf.train.abc", "--spec", ir.to_json(SPEC), "--context", "data-v1"]
    asked = _cli("ask", *common, "--n", "2", "--params-out", str(tmp_path / "p.json"),
                 "--trials-out", str(tmp_path / "t.json"), storage=storage)
    assert asked.returncode == 0, asked.stderr
    params = json.loads(asked.stdout)
    assert len(params) == 2 and all(set(p) == {"lr", "depth"} for p in params)
    assert json.loads((tmp_path / "p.json").read_text()) == params
    assert json.loads((tmp_path / "t.json").read_text()) == [0, 1]
    told = _cli("tell", *common, "--trials", "[0, 1]", "--values", '["0.7", 0.8]',
                storage=storage)
    assert told.returncode == 0, told.stderr
    second = _cli("ask", *common, "--n", "2", "--trials-out", str(tmp_path / "t.json"),
                  storage=storage)
    assert len(json.loads(second.stdout)) == 1  # the budget is 3
    told = _cli("tell", *common, "--trials", (tmp_path / "t.json").read_text(),
                "--values", '["oops"]', storage=storage)
    assert told.returncode == 0, told.stderr
    assert json.loads(_cli("ask", *common, "--n", "2", storage=storage).stdout) == []
    best = _cli("best", *common, "--out", f"best_value={tmp_path / 'out' / 'best_value'}",
                "--out", f"depth={tmp_path / 'out' / 'params' / 'depth'}", storage=storage)
    assert best.returncode == 0, best.stderr
    outputs = json.loads(best.stdout)
    assert outputs["best_value"] == "0.8"
    assert json.loads(outputs["best_params"]) == params[1]
    assert (tmp_path / "out" / "best_value").read_text() == "0.8"
    assert (tmp_path / "out" / "params" / "depth").read_text() == str(params[1]["depth"])
    study = _study(storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "FAIL"]
    assert study.study_name.startswith("wf.train.abc.")  # the context is in the name


def test_ask_writes_text_params_and_tell_takes_trial_numbers_as_floats(
        tmp_path: Path) -> None:
    """What KFP's map and list rendering need (couler.compilers.kfp: --text-params)."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    common = ["--study", "wf.train.kfp", "--spec", ir.to_json(SPEC)]
    asked = _cli("ask", *common, "--n", "2", "--text-params", storage=storage)
    assert asked.returncode == 0, asked.stderr
    params = json.loads(asked.stdout)
    assert all(isinstance(v, str) for p in params for v in p.values())
    assert all(str(int(p["depth"])) == p["depth"] for p in params)  # "5", not "5.0"
    told = _cli("tell", *common, "--trials", "[0.0, 1.0]", "--values", '["0.7", "0.8"]',
                storage=storage)
    assert told.returncode == 0, told.stderr
    study = _study(storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert all(isinstance(t.params["depth"], int) for t in study.trials)  # its own types
    bad = _cli("tell", *common, "--trials", "[0.5]", "--values", '["0.7"]', storage=storage)
    assert bad.returncode != 0 and "not a trial number" in bad.stderr


def test_cli_errors(tmp_path: Path) -> None:
    bad = _cli("best", "--study", "s", "--spec", "{", storage=f"sqlite:///{tmp_path}/x.db")
    assert bad.returncode == 2 and "--spec is not a tune spec" in bad.stderr
    empty = _cli("best", "--study", "s", "--spec", ir.to_json(SPEC),
                 storage=f"sqlite:///{tmp_path}/x.db")
    assert empty.returncode == 1 and "no trial of the study completed" in empty.stderr
    nostore = _cli("best", "--study", "s", "--spec", ir.to_json(SPEC), storage="")
    assert nostore.returncode == 2 and "COULER_TUNE_STORAGE" in nostore.stderr


def test_the_rewritten_workflow_runs_on_the_local_engine(tmp_path: Path) -> None:
    """The static engines' rounds (ask -> mapped trials -> tell, then best) run for real
    on the local engine: the same study, the same outputs for later steps."""
    from couler.optimize.tune import DEFAULT_IMAGE, expand_tune

    trial = ir.Step(
        "t", ir.ScriptSpec("python", "import sys; x = float(sys.argv[1]); print(-(x - 0.3) ** 2)",
                           args=("{{item.x}}",)),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT, type=ir.ValueType.FLOAT),),
        tune=ir.Tune(space=(ir.TuneParam("x", ir.TuneKind.UNIFORM, 0.0, 1.0),),
                     objective="result", trials=5, parallel=2, seed=2))
    use = ir.Step("use", ir.ScriptSpec("python", "import sys; print(sys.argv[1])",
                                       args=("{{inputs.x}}",)),
                  inputs=(ir.InputParameter("x", ir.StepOutputRef("t", "x"),
                                            ir.ValueType.FLOAT),),
                  outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
                  dependencies=(ir.Dependency("t"),))
    wf = expand_tune(ir.Workflow("tune-static", (trial, use)))
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    engine = LocalEngine(tmp_path / "e", secrets={("couler-tune", "url"): storage},
                         image_commands={DEFAULT_IMAGE: []})
    env_path = os.pathsep.join(sys.path)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path
    try:
        status = engine.run(wf)
        again = engine.run(wf)  # the study is finished: every round asks for nothing
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    assert status.state is RunState.SUCCEEDED, [(s.step, s.key, s.message) for s in status.steps
                                                if s.message]
    study = _study(storage)
    values = [t.value for t in study.trials if t.state is optuna.trial.TrialState.COMPLETE]
    assert len(values) == 5
    best = _step(status, "t")
    assert float(best.outputs["best_value"]) == max(values)
    assert _step(status, "use").outputs["result"] == best.outputs["x"]
    assert json.loads(best.outputs["best_params"]) == study.best_params
    assert again.state is RunState.SUCCEEDED, again.message
    assert _step(again, "t-ask-0").outputs["params"] == "[]"
    assert not [s for s in again.steps if s.step == "t-0" and s.key]
    assert _step(again, "t").outputs == best.outputs
    assert len(_study(storage).trials) == 5


def test_open_study_resumes_by_name(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    first = open_study(storage, "n", SPEC)
    first.tell(first.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), 0.5)
    close_study(first)
    again = open_study(storage, "n", SPEC)
    assert [t.value for t in again.trials] == [0.5]
    close_study(again)


def test_a_study_in_postgres(tmp_path: Path, postgres_server: Any) -> None:
    """Production storage: the study in PostgreSQL (COULER_TUNE_STORAGE), through the
    local engine and the static engines' command line alike."""
    step = ir.Step(
        "t", ir.ScriptSpec("python", "import sys; x = float(sys.argv[1]); print(1 - x * x)",
                           args=("{{item.x}}",)),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT, type=ir.ValueType.FLOAT),),
        tune=ir.Tune(space=(ir.TuneParam("x", ir.TuneKind.UNIFORM, -1.0, 1.0),),
                     objective="result", trials=4, parallel=2, seed=1))
    wf = ir.Workflow("tune-pg", (step,))
    status = LocalEngine(tmp_path / "e", tune_storage=postgres_server.url).run(wf)
    assert status.state is RunState.SUCCEEDED, status.message
    assert not (tmp_path / "e" / "tune.db").exists()
    study = _study(postgres_server.url, "tune-pg.t.")
    assert len(study.trials) == 4
    assert float(_step(status, "t").outputs["best_value"]) == study.best_value
    common = ["--study", "pg-cli", "--spec", ir.to_json(SPEC)]
    asked = _cli("ask", *common, "--n", "2", storage=postgres_server.url)
    assert asked.returncode == 0, asked.stderr
    assert len(json.loads(asked.stdout)) == 2


def test_a_second_run_finds_the_finished_study_and_runs_no_trial(tmp_path: Path) -> None:
    step = ir.Step(
        "t", ir.ScriptSpec("python", "import sys; print(float(sys.argv[1]) + 1)",
                           args=("{{item.x}}",)),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT, type=ir.ValueType.FLOAT),),
        tune=ir.Tune(space=(ir.TuneParam("x", ir.TuneKind.INT, 0, 9),), objective="result",
                     trials=3, parallel=3, sampler=ir.TuneSampler.RANDOM, seed=2))
    wf = ir.Workflow("tune-again", (step,))
    engine = LocalEngine(tmp_path / "e")
    first = engine.run(wf)
    assert first.state is RunState.SUCCEEDED, first.message
    second = engine.run(wf)
    assert second.state is RunState.SUCCEEDED, second.message
    assert [s for s in second.steps if s.key] == []
    assert _step(second, "t").outputs == _step(first, "t").outputs
    assert "the study had finished its trials before" in _step(second, "t").message
    assert len(_study(f"sqlite:///{tmp_path / 'e' / 'tune.db'}").trials) == 3
