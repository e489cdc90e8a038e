"""Workflows the offline planner generates really run on the local engine: the catalog's
tabular templates in .venv-ml, data handed from step to step by kind, a condition on a
measured metric, and a missing input failing the step that needs it."""

from __future__ import annotations

from pathlib import Path

from couler.engines.base import RunState, StepState
from couler.generate.planner import plan
from couler_runtime.local.engine import LocalEngine


def _engine(tmp: Path, ml_python: Path) -> LocalEngine:
    return LocalEngine(tmp / "runs", max_workers=2,
                       image_python={"ghcr.io/couler-io/ml-tabular:*": str(ml_python)})


def test_a_generated_comparison_trains_evaluates_and_ranks(tmp_path: Path,
                                                           ml_python: Path) -> None:
    wf, report = plan("Load sample://breast_cancer, split it into train and test, then train "
                      "XGBoost and a random forest side by side, and keep the model with the "
                      "better AUC.")
    assert {"ingest-local-files", "split-train-test", "train-xgboost", "train-sklearn",
            "rank-models"} <= set(report.catalog_entries)
    status = _engine(tmp_path, ml_python).run(wf)
    assert status.state is RunState.SUCCEEDED, [(s.step, s.message) for s in status.steps]
    by_template = {next(t.template for t in wf.steps if t.name == s.step): s
                   for s in status.steps}
    evaluations = [s for s in status.steps if s.step.startswith("evaluate")]
    assert len(evaluations) == 2  # one measurement per model, added for the ranking
    for s in evaluations:
        assert 0.5 < float(s.outputs["auc"]) <= 1.0
    best = float(by_template["rank-models"].outputs["best"])
    assert best == max(float(s.outputs["auc"]) for s in evaluations)


def test_a_condition_on_a_measured_metric_decides_a_branch(tmp_path: Path,
                                                           ml_python: Path) -> None:
    wf, _ = plan("Read sample://breast_cancer, split it, train a logistic regression with "
                 "scikit-learn and evaluate its accuracy. If accuracy is above 0.99, write "
                 "the report; otherwise post a warning to the #ml channel on Slack.")
    conditional = [s for s in wf.steps if s.when is not None]
    assert len(conditional) == 2 and {s.when.expect for s in conditional if s.when} == {
        True, False}
    status = _engine(tmp_path, ml_python).run(wf, parameters={})
    states = {s.step: s.state for s in status.steps}
    accuracy = next(float(s.outputs["accuracy"]) for s in status.steps
                    if "accuracy" in s.outputs)
    # exactly the branch the measured accuracy chose ran; the other was skipped
    for s in conditional:
        assert s.when is not None
        chosen = s.when.expect == (accuracy > 0.99)
        assert (states[s.name] is not StepState.SKIPPED) == chosen, (s.name, states[s.name],
                                                                     accuracy)

def test_a_missing_data_file_fails_the_step_that_reads_it(tmp_path: Path,
                                                          ml_python: Path) -> None:
    missing = tmp_path / "nowhere" / "table.csv"
    wf, _ = plan(f"Load {missing}, then train LightGBM on it.")
    status = _engine(tmp_path, ml_python).run(wf)
    assert status.state is RunState.FAILED
    load = next(s for s in status.steps if s.step.startswith("load"))
    assert load.state is StepState.FAILED
    assert str(missing) in (load.message or "") + (load.failure_reason or "") or \
        str(missing) in _log(tmp_path, load.step)


def _log(tmp: Path, step: str) -> str:
    return "".join(p.read_text(errors="replace") for p in (tmp / "runs").rglob("*.log")
                   if step in str(p))


def test_a_generated_tuning_study_runs_its_trials(tmp_path: Path, ml_python: Path) -> None:
    wf, _ = plan("Load sample://breast_cancer, split it, then tune XGBoost with 4 trials "
                      "of Bayesian optimization.")
    [tuned] = [s for s in wf.steps if s.tune is not None]
    assert tuned.tune is not None and tuned.tune.trials == 4
    assert tuned.tune.objective == "validation_score"
    assert {p.name for p in tuned.tune.space} >= {"learning_rate", "max_depth"}
    status = _engine(tmp_path, ml_python).run(wf)
    assert status.state is RunState.SUCCEEDED, [(s.step, s.message) for s in status.steps]
    result = next(s for s in status.steps if s.step == tuned.name)
    assert 0.5 < float(result.outputs["best_value"]) <= 1.0


def test_a_generated_recommender_is_measured_by_the_metric_asked(tmp_path: Path,
                                                                  ml_python: Path) -> None:
    wf, _ = plan("Load sample://ratings, train an SVD recommender on it and evaluate its "
                 "NDCG@5.")
    [evaluation] = [s for s in wf.steps if s.template == "evaluate-recommender"]
    status = _engine(tmp_path, ml_python).run(wf)
    assert status.state is RunState.SUCCEEDED, [(s.step, s.message) for s in status.steps]
    result = next(s for s in status.steps if s.step == evaluation.name)
    assert 0.0 <= float(result.outputs["score"]) <= 1.0
    report = next((tmp_path / "runs").rglob("metrics.json"), None)
    assert report is not None and "ndcg_at_k" in report.read_text()
