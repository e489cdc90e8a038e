"""Pruning on the static engines' rewrite (``couler.optimize.tune.expand_tune``): the trials
report intermediate values to the study themselves, through ``couler_runtime.tune.report``.

The same program (tests/data/programs/tune_prune.py) runs twice: rewritten, on the local
engine (each step a process), and compiled for Apache Airflow, run with ``dag.test()`` by
tests/conformance/airflow_runner.py in ``.venv-airflow``. Trials 0 and 1 report good values,
the later ones bad values for 40 slow epochs: the median pruner must stop them at their
first report, the rounds go on, and the best step reads the completed trials only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from couler.engines.base import RunState, StepState
from couler.optimize.tune import DEFAULT_IMAGE, expand_tune
from couler_runtime.local import LocalEngine
from tests.conformance.loader import load_program

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "data" / "programs" / "tune_prune.py"
AIRFLOW_PYTHON = ROOT / ".venv-airflow" / "bin" / "python"
RUNNER = ROOT / "tests" / "conformance" / "airflow_runner.py"


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage(url)
    try:
        names = optuna.get_all_study_names(storage)
        assert len(names) == 1, names
        return optuna.load_study(study_name=names[0], storage=storage).trials
    finally:
        storage.engine.dispose()


def _check_study(trials: list[optuna.trial.FrozenTrial]) -> None:
    state = optuna.trial.TrialState
    assert [t.state for t in trials] == [state.COMPLETE, state.COMPLETE, state.PRUNED,
                                         state.PRUNED]
    assert [t.value for t in trials[:2]] == [0.95, 0.95]
    for t in trials[2:]:
        # stopped at its first report: the 39 slow epochs after it never ran
        assert list(t.intermediate_values) == [0], t.intermediate_values
        assert t.intermediate_values[0] == pytest.approx(0.1)


def test_trials_prune_themselves_on_the_rewritten_workflow(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    wf = expand_tune(load_program(PROGRAM))
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    engine = LocalEngine(tmp_path / "e", secrets={("couler-tune", "url"): storage},
                         image_commands={DEFAULT_IMAGE: []})
    # the trials import couler_runtime
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    status = engine.run(wf)
    assert status.state is RunState.SUCCEEDED, [(s.step, s.key, s.message)
                                                for s in status.steps if s.message]
    _check_study(_trials(storage))
    rounds = {s.step: s for s in status.steps if s.key == "0"}  # each round maps one trial
    assert rounds["fit-2"].outputs["score"] == "pruned"
    assert rounds["fit-0"].outputs["score"] == "0.95"
    best = next(s for s in status.steps if s.step == "fit" and not s.key)
    assert best.outputs["best_value"] == "0.95"
    use = next(s for s in status.steps if s.step == "use" and not s.key)
    assert use.state is StepState.SUCCEEDED


def test_trials_prune_themselves_on_airflow(tmp_path: Path) -> None:
    if not AIRFLOW_PYTHON.exists():
        pytest.fail(f"{AIRFLOW_PYTHON} is missing: run scripts/setup-engine-venv.sh airflow",
                    pytrace=False)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
           and not k.startswith("AIRFLOW")}
    proc = subprocess.run(
        [str(AIRFLOW_PYTHON), str(RUNNER), str(ROOT), str(tmp_path), "240", str(PROGRAM)],
        cwd=tmp_path, env=env, text=True, capture_output=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("COULER-JSON "))
    run: dict[str, Any] = json.loads(line.removeprefix("COULER-JSON "))["tune_prune"]
    assert run["state"] == "succeeded", json.dumps(run, indent=1)[-4000:]
    steps = run["steps"]
    assert json.loads(steps["fit-2"]["outputs"]["score"]) == ["pruned"]
    assert json.loads(steps["fit-1"]["outputs"]["score"]) == ["0.95"]
    assert steps["fit"]["outputs"]["best_value"] == "0.95"
    _check_study(_trials(f"sqlite:///{tmp_path / 'tune.db'}"))
