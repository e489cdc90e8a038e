"""Workflows from the offline planner really run on the local engine."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from couler.engines.base import RunState, StepState
from couler.generate import plan
from couler_runtime.local import LocalEngine


def outputs(status: object, step: str) -> dict[str, str]:
    found = [s for s in status.steps if s.step == step and not s.key]  # type: ignore[attr-defined]
    assert found, step
    assert found[0].state is StepState.SUCCEEDED, found[0].message
    return dict(found[0].outputs)


def test_two_models_on_a_real_csv_keep_the_better(tmp_path: Path) -> None:
    table = tmp_path / "churn.csv"
    rng = random.Random(1)
    with table.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["tenure", "spend", "label"])
        for _ in range(120):
            tenure, spend = rng.uniform(0, 10), rng.uniform(0, 5)
            w.writerow([f"{tenure:.3f}", f"{spend:.3f}", int(tenure < 4)])
    wf, _ = plan(f"train an XGBoost and a logistic regression on {table}, keep the better one")
    status = LocalEngine(tmp_path / "runs").run(wf)
    assert status.state is RunState.SUCCEEDED, status.message
    summary = json.loads(outputs(status, "load-table")["summary"])
    assert summary == {"rows": 120, "columns": ["tenure", "spend", "label"], "origin": "file"}
    scores = {m: float(outputs(status, f"evaluate-{m}")["score"]) for m in ("xgboost", "logistic")}
    assert all(0.8 <= s <= 1.0 for s in scores.values()), scores  # the label is learnable
    best = outputs(status, "select-best")["best"]
    assert scores[best] == max(scores.values())


def test_a_sweep_runs_one_trial_per_value(tmp_path: Path) -> None:
    wf, _ = plan("sweep batch sizes 8, 64 for a logistic regression")
    status = LocalEngine(tmp_path).run(wf)
    assert status.state is RunState.SUCCEEDED, status.message
    trials = sorted(s.key for s in status.steps if s.step == "sweep" and s.key)
    assert trials == ["0", "1"]
    scores = json.loads(outputs(status, "sweep")["score"])
    assert len(scores) == 2 and all(0.0 <= float(s) <= 1.0 for s in scores)
    assert outputs(status, "select-best")["best"] in ("batch_size=8", "batch_size=64")
