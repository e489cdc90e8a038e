"""Tune steps on Tekton: ``expand_tune(slots=True)`` compiled into a Pipeline (checked
against the vendored Tekton schemas) and run on this host by the Tekton stand-in
(tests/unit/tekton_sim.py: each task a process, Tekton's ordering and substitution), with a
real optuna study in SQLite behind the storage secret.

The same rewrite also runs on the local engine, as an IR workflow, and must give the same
study: the slots are the engine-independent part.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from couler import ir
from couler.compilers import tekton
from couler.engines.base import RunState
from couler.errors import UnsupportedFeatureError
from couler.optimize.tune import DEFAULT_IMAGE, expand_tune, round_sizes
from couler_runtime.local import LocalEngine
from tests.conformance.expected import EXPECTED
from tests.conformance.loader import load_program
from tests.integration.test_tune_static_prune import PROGRAM as PRUNE_PROGRAM
from tests.integration.test_tune_static_prune import _check_study, _trials
from tests.unit.tekton_sim import run_pipeline
from tests.unit.test_tekton_compiler import schema_errors

ROOT = Path(__file__).resolve().parents[2]
TUNE = ROOT / "tests" / "conformance" / "programs" / "tune.py"


def _compile(wf: ir.Workflow) -> list[dict[str, object]]:
    docs = tekton.compile_workflow(wf)
    for doc in docs:
        assert schema_errors(doc) == [], doc.get("kind")
    return docs


def _study(url: str) -> list[optuna.trial.FrozenTrial]:
    return _trials(url)


def test_the_tune_conformance_program_runs_as_rounds_of_tasks(tmp_path: Path) -> None:
    wf = load_program(TUNE)
    docs = _compile(wf)
    names = [t["name"] for t in docs[0]["spec"]["tasks"]]  # type: ignore[index]
    # 3 trials, 2 at once: a round of two trial tasks, then a round of one
    assert names == ["trial-ask-0", "trial-0-0", "trial-0-1", "trial-tell-0",
                     "trial-ask-1", "trial-1-0", "trial-tell-1", "trial", "use"]
    url = f"sqlite:///{tmp_path / 'study.db'}"
    run = run_pipeline(docs, tmp_path / "run", secrets={("couler-tune", "url"): url})
    failed = {n: r.stderr for n, r in run.tasks.items() if r.state != "succeeded"}
    assert failed == {} and run.status == "Succeeded"
    expected = EXPECTED["tune"]["steps"]
    assert run.tasks["trial"].results == expected["trial"]["outputs"]
    assert run.tasks["use"].stdout[0].strip() == "2"  # the best x, read by the next step
    trials = _study(url)
    # the grid: each x once, each told its objective -(x - 2)^2
    assert sorted((t.params["x"], t.value) for t in trials) == [(1, -1.0), (2, 0.0), (3, -1.0)]
    # the study is the run's own: its name holds the PipelineRun's uid
    (name,) = optuna.get_all_study_names(optuna.storages.RDBStorage(url))
    assert name.startswith("conf-tune.trial.")
    again = run_pipeline(docs, tmp_path / "again", secrets={("couler-tune", "url"): url})
    assert again.status == "Succeeded" and again.uid != run.uid
    assert len(optuna.get_all_study_names(optuna.storages.RDBStorage(url))) == 2


def test_trials_prune_themselves_on_tekton(tmp_path: Path) -> None:
    docs = _compile(load_program(PRUNE_PROGRAM))
    trial = next(t for t in docs[0]["spec"]["tasks"]  # type: ignore[index]
                 if t["name"] == "fit-2-0")
    env = {e["name"]: e for e in trial["taskSpec"]["steps"][0]["env"]}
    assert env["COULER_TUNE_TRIAL"]["value"] == "$(params.tune-trial)"
    assert env["COULER_TUNE_STORAGE"]["valueFrom"]["secretKeyRef"] == {
        "name": "couler-tune", "key": "url"}
    url = f"sqlite:///{tmp_path / 'study.db'}"
    run = run_pipeline(docs, tmp_path / "run", secrets={("couler-tune", "url"): url})
    assert run.status == "Succeeded", {n: r.stderr for n, r in run.tasks.items()}
    _check_study(_trials(url))
    assert run.tasks["fit-2-0"].results["score"] == "pruned"
    assert run.tasks["fit"].results["best_value"] == "0.95"


def test_the_slots_rewrite_gives_the_same_study_on_the_local_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wf = expand_tune(load_program(PRUNE_PROGRAM), slots=True)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    engine = LocalEngine(tmp_path / "e", secrets={("couler-tune", "url"): url},
                         image_commands={DEFAULT_IMAGE: []})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    status = engine.run(wf)
    assert status.state is RunState.SUCCEEDED, [(s.step, s.message) for s in status.steps
                                                if s.message]
    _check_study(_trials(url))


# the trial's arguments to stderr (the test reads them), a number as its objective
_ECHO = "import sys; print(sys.argv[1:], file=sys.stderr); print(len(sys.argv))"


def _space_wf(trials: int, parallel: int, args: tuple[str, ...],
              inputs: tuple[ir.InputParameter, ...] = ()) -> ir.Workflow:
    trial = ir.Step(
        "t", ir.ContainerSpec("python:3.12-alpine", command=("python3", "-c", _ECHO),
                              args=args),
        inputs=inputs,
        outputs=(ir.OutputParameter("v", ir.OutputSource.STDOUT, "", ir.ValueType.FLOAT),),
        tune=ir.Tune(space=(ir.TuneParam("lr", ir.TuneKind.UNIFORM, low=0.1, high=0.2),
                            ir.TuneParam("depth", ir.TuneKind.INT, low=2, high=9)),
                     objective="v", trials=trials, parallel=parallel,
                     sampler=ir.TuneSampler.RANDOM, pruner=ir.TunePruner.NONE, seed=1))
    return ir.Workflow(name="space", steps=(trial,))


def test_each_round_has_as_many_trial_tasks_as_it_asks_for() -> None:
    wf = _space_wf(7, 3, ("{{item.lr}}",))
    assert round_sizes(wf.steps[0].tune) == [3, 3, 1]  # type: ignore[arg-type]
    tasks = {t["name"]: t for t in _compile(wf)[0]["spec"]["tasks"]}  # type: ignore[index]
    assert [n for n in tasks if n.startswith("t-") and n[2].isdigit()] == [
        "t-0-0", "t-0-1", "t-0-2", "t-1-0", "t-1-1", "t-1-2", "t-2-0"]
    ask = tasks["t-ask-2"]["taskSpec"]["steps"][0]["args"]
    assert ask[ask.index("--n") + 1] == "1"
    tell = tasks["t-tell-1"]
    assert tell["runAfter"] == ["t-ask-1", "t-1-0", "t-1-1", "t-1-2"]
    values = {p["name"]: p["value"] for p in tell["params"]}
    assert values["value-2"] == "$(tasks.t-1-2.results.v)"
    assert values["trial-2"] == "$(tasks.t-ask-1.results.t2-trial)"
    # no pruner: a trial is not told its study
    env = tasks["t-0-0"]["taskSpec"]["steps"][0].get("env", [])
    assert [e["name"] for e in env] == []


def test_item_placeholders_in_text_and_inputs_read_the_slot(tmp_path: Path) -> None:
    wf = _space_wf(2, 2, ("{{item.depth}}", "{{inputs.rate}}"),
                   inputs=(ir.InputParameter("rate", ir.ItemRef("lr"), ir.ValueType.FLOAT),))
    docs = _compile(wf)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    run = run_pipeline(docs, tmp_path / "run", secrets={("couler-tune", "url"): url})
    assert run.status == "Succeeded", {n: r.stderr for n, r in run.tasks.items()}
    trials = {t.number: t for t in _study(url)}
    for k in range(2):
        depth, rate = ast.literal_eval(run.tasks[f"t-0-{k}"].stderr[0])  # a printed list
        number = int(run.tasks["t-ask-0"].results[f"t{k}-trial"])
        params = trials[number].params
        assert int(depth) == params["depth"] and float(rate) == params["lr"]
    assert trials[0].params != trials[1].params


def test_a_study_that_cannot_fill_the_round_fails_the_ask(tmp_path: Path) -> None:
    spec = ir.Tune(space=(ir.TuneParam("x", ir.TuneKind.INT, low=0, high=9),),
                   objective="v", trials=2, parallel=2, sampler=ir.TuneSampler.RANDOM,
                   pruner=ir.TunePruner.NONE, seed=0)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    base = [sys.executable, "-m", "couler_runtime.tune"]
    common = ["--study", "s", "--spec", ir.to_json(spec), "--storage", url]
    out = tmp_path / "slots"
    first = subprocess.run([*base, "ask", *common, "--n", "2", "--slots-out", str(out)],
                           capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in out.iterdir()) == ["study", "t0", "t0-p0", "t0-trial",
                                                     "t1", "t1-p0", "t1-trial"]
    numbers = [(out / f"t{k}-trial").read_text() for k in range(2)]
    told = subprocess.run([*base, "tell", *common, "--trial", numbers[0], "--value", "0.5",
                           "--trial", numbers[1], "--value", "oops"],
                          capture_output=True, text=True, check=False)
    assert told.returncode == 0, told.stderr
    states = [t.state for t in _study(url)]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL]
    # the budget is spent: a round of two cannot be filled, and says why
    second = subprocess.run([*base, "ask", *common, "--n", "2", "--slots-out", str(out)],
                            capture_output=True, text=True, check=False)
    assert second.returncode == 1
    assert "'s'" in second.stderr and "0 trials left" in second.stderr
    mixed = subprocess.run([*base, "tell", *common, "--trials", "[0]", "--value", "1"],
                           capture_output=True, text=True, check=False)
    assert mixed.returncode == 2 and "--trial and --value" in mixed.stderr


def test_the_runs_own_values_are_tekton_context_variables() -> None:
    step = ir.Step("a", ir.ContainerSpec("x", args=("{{workflow.name}}", "{{workflow.uid}}")))
    hook = ir.Step("h", ir.ContainerSpec("x", args=("{{workflow.status}}",)))
    wf = ir.Workflow(name="w", steps=(step,),
                     exit_hooks=(ir.ExitHook(ir.RunStatus("any"), (hook,)),))
    pipeline = _compile(wf)[0]["spec"]
    (task,) = pipeline["tasks"]  # type: ignore[index]
    assert task["params"] == [
        {"name": "couler-run-name", "value": "$(context.pipelineRun.name)"},
        {"name": "couler-run-uid", "value": "$(context.pipelineRun.uid)"}]
    assert task["taskSpec"]["steps"][0]["args"] == ["$(params.couler-run-name)",
                                                    "$(params.couler-run-uid)"]
    (final,) = pipeline["finally"]  # type: ignore[index]
    assert final["params"] == [{"name": "couler-run-status", "value": "$(tasks.status)"}]
    outside = ir.Workflow(name="w", steps=(
        ir.Step("a", ir.ContainerSpec("x", args=("{{workflow.status}}",))),))
    with pytest.raises(UnsupportedFeatureError, match=r"'a'.*exit hook"):
        tekton.compile_workflow(outside)
