"""Generated workflows really run on the local engine: the catalog's tabular scripts in
.venv-ml (scripts/setup-ml-venv.sh), mapped from their image (LocalEngine(image_python=...))."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from couler.engines.base import RunState, StepState
from couler.generate.library import TABULAR_IMAGE, TEMPLATES
from couler.generate.llm import generate_with_llm
from couler.generate.planner import plan
from couler_runtime.local import LocalEngine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ml_python() -> Path:
    """.venv-ml's interpreter, made by the setup script when absent (idempotent)."""
    subprocess.run([str(ROOT / "scripts" / "setup-ml-venv.sh")], check=True, timeout=900)
    return ROOT / ".venv-ml" / "bin" / "python"


def engine(tmp: Path, python: Path) -> LocalEngine:
    return LocalEngine(tmp / "runs", image_python={TABULAR_IMAGE: str(python)})


def states(status: Any) -> dict[str, StepState]:
    return {s.step: s.state for s in status.steps if not s.key}


def outputs(status: Any, step: str) -> dict[str, str]:
    [found] = [s for s in status.steps if s.step == step and not s.key]
    assert found.state is StepState.SUCCEEDED, found.message
    return dict(found.outputs)


def test_a_planned_condition_with_an_else_branch_runs(ml_python: Path, tmp_path: Path) -> None:
    wf, _ = plan("Load sample://breast_cancer, train an XGBoost model and evaluate its AUC. "
                 f"Write a report only if the AUC is above 0.8, otherwise write the data to "
                 f"{tmp_path / 'low'}.")
    status = engine(tmp_path, ml_python).run(wf)
    assert status.state is RunState.SUCCEEDED, status.message
    auc = float(outputs(status, "evaluate-auc")["auc"])
    assert 0.8 < auc <= 1.0  # the sample's label is learnable
    got = states(status)
    assert got["write-report"] is StepState.SUCCEEDED
    [other] = [name for name in got if name.startswith("write-data")]
    assert got[other] is StepState.SKIPPED
    assert not (tmp_path / "low").exists()


class Scripted:
    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)

    def __call__(self, messages: Sequence[Any]) -> str:
        return self.answers.pop(0)


def test_an_llm_spec_runs_as_assembled(ml_python: Path, tmp_path: Path) -> None:
    spec = {"name": "llm-spec", "steps": [
        {"name": "load", "template": "ingest-local-files",
         "params": {"source": "sample://breast_cancer"}},
        {"name": "split", "template": "split-train-test", "params": {"test-size": "0.3"},
         "after": ["load"]},
        {"name": "fit", "template": "train-sklearn",
         "params": {"estimator": "LogisticRegression", "hyperparams": '{"max_iter": 2000}'},
         "after": ["split"]},
        {"name": "score", "template": "evaluate-f1", "after": ["fit"]},
        {"name": "summary", "template": "write-report", "after": ["score"],
         "when": {"step": "score", "metric": "f1", "op": ">=", "value": 0.5}},
    ]}
    wf, report = generate_with_llm("train a logistic regression on the breast cancer sample",
                                   Scripted("Here it is: " + json.dumps(spec)),
                                   templates=TEMPLATES)
    assert report.rounds == 1
    status = engine(tmp_path, ml_python).run(wf)
    assert status.state is RunState.SUCCEEDED, status.message
    assert 0.5 <= float(outputs(status, "score")["f1"]) <= 1.0
    assert states(status)["summary"] is StepState.SUCCEEDED

