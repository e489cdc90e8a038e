"""Edge conditions and depends expressions on Tekton: the step-status rewrite, run.

The conformance programs are compiled, schema-checked and run by a stand-in for the
Tekton controller (:mod:`tests.unit.tekton_sim`, /bin/sh on this machine); each step's
outcome (its ``couler-status`` result) and the PipelineRun's status must be the expected
answers written from docs/semantics.md (tests/conformance/expected.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from couler import ir
from couler.compilers import tekton
from couler.engines.base import Feature
from couler.errors import UnsupportedFeatureError
from couler.semantics import differences
from tests.conformance.expected import EXPECTED
from tests.conformance.harness import LOCAL_SECRETS
from tests.conformance.loader import load_program, program_paths
from tests.unit.tekton_sim import PipelineRun, run_pipeline
from tests.unit.test_tekton_compiler import compile_ok, ctr, tasks, wf_of

ROOT = Path(__file__).resolve().parents[2]
S = ir.Step
F = ir.EdgeCondition
STATE = {"Succeeded": "succeeded", "Failed": "failed", "Skipped": "skipped",
         "Omitted": "skipped"}  # Couler records a step that was not run as skipped
EDGE_PROGRAMS = ["edge_conditions", "omitted_upstream", "strict_succeeded", "depends_expr",
                 "map_outcomes", "unusual_edges"]


def _program(stem: str) -> ir.Workflow:
    (path,) = [p for p in program_paths() if p.stem == stem]
    return load_program(path)


def _outcome(status: Any) -> str:
    if isinstance(status, list):  # a map: its items'
        for s in ("Failed", "Succeeded", "Skipped"):
            if s in status:
                return STATE[s]
        return "skipped"
    return STATE[status]


def step_view(run: PipelineRun, name: str) -> tuple[str, dict[str, Any]]:
    """A step's state and results from its tasks: the last attempt task of a memory
    ladder, a bounded map's batches together; ``couler-status`` decides where written.
    ``G/S`` is step ``S`` of inline sub-workflow ``G``, task ``G-S``."""
    name = name.replace("/", "-")
    rungs = sorted((int(t.rsplit("-mem", 1)[1]), t) for t in run.tasks
                   if t.startswith(f"{name}-mem") and t.rsplit("-mem", 1)[1].isdigit())
    batches = sorted(t for t in run.tasks if t.startswith(f"{name}-batch"))
    names = [rungs[-1][1]] if rungs else [name, *batches]
    parts = [run.tasks[t] for t in names if t in run.tasks]
    if not parts:
        return "not run", {}
    results: dict[str, Any] = dict(parts[0].results)
    for part in parts[1:]:
        results = {k: [*v, *part.results.get(k, [])] for k, v in results.items()}
    if "couler-status" in results:
        return _outcome(results["couler-status"]), results
    state = "failed" if any(p.state == "failed" for p in parts) else parts[0].state
    return state, results


def _group_view(run: PipelineRun, wf: ir.Workflow, name: str) -> str | None:
    """An inline sub-workflow's state from its steps' tasks, or None if not a group."""
    group = wf.step(name)
    if group is None or not isinstance(group.body, ir.SubWorkflowSpec):
        return None
    states = {step_view(run, f"{name}-{s.name}")[0] for s in group.body.steps}
    return next((s for s in ("failed", "succeeded", "skipped") if s in states), "not run")


def _compare(expected: dict[str, Any], run: PipelineRun, wf: ir.Workflow | None = None,
             ) -> list[str]:
    problems = []
    if run.status.lower() != expected["state"]:
        problems.append(f"run {run.status} != {expected['state']}")
    for name, want in expected["steps"].items():
        state, results = step_view(run, name)
        grouped = _group_view(run, wf, name) if wf is not None else None
        state = grouped or state
        if state != want["state"]:
            problems.append(f"{name}: {state} != {want['state']}")
        for out, value in want.get("outputs", {}).items():
            got = results.get(out, "")
            text = json.dumps([str(g).rstrip("\n") for g in got]) if isinstance(got, list) \
                else str(got).rstrip("\n")
            if text != value:
                problems.append(f"{name}.{out}: {got!r} != {value!r}")
    return problems


@pytest.mark.parametrize("program", EDGE_PROGRAMS)
def test_edge_program_runs_as_on_the_local_engine(program: str, tmp_path: Path) -> None:
    docs = compile_ok(_program(program))
    run = run_pipeline(docs, tmp_path)
    assert _compare(EXPECTED[program], run) == []
    # the TaskRuns of steps never fail: a failure is a status, and only S7 ends the run
    steps = {s.name for s in _program(program).steps}
    assert all(run.tasks[n].state == "succeeded" for n in steps)
    assert run.tasks["couler-run-status"].state == ("failed" if run.status == "Failed"
                                                    else "succeeded")


def test_an_unhandled_failure_on_one_branch_lets_the_other_finish(tmp_path: Path) -> None:
    # S7 without fail-fast: `slow-branch` starts after `broken` failed and still runs
    wf = wf_of(S("broken", ctr("sh", "-c", "exit 2")),
               S("handler", ctr("sh", "-c", "true"), dependencies=(ir.Dependency("broken",
                                                                              F.FAILED),)),
               S("first", ctr("sh", "-c", "true")),
               S("slow-branch", ctr("sh", "-c", "true"), dependencies=(ir.Dependency("first"),)),
               S("after-broken", ctr("sh", "-c", "true"),
                 dependencies=(ir.Dependency("broken"),)))
    run = run_pipeline(compile_ok(wf), tmp_path)
    status = {n: r.results.get("couler-status") for n, r in run.tasks.items()}
    assert status["slow-branch"] == "Succeeded" and status["handler"] == "Succeeded"
    assert status["after-broken"] == "Omitted"
    assert run.status == "Failed"  # after-broken, a leaf, carries broken's failure


def test_when_is_tested_in_the_script_and_skipped_is_not_omitted(tmp_path: Path) -> None:
    out = ir.OutputParameter("out", ir.OutputSource.STDOUT)
    yes = ir.Condition(ir.StepOutputRef("check", "out"), ir.CompareOp.EQ, ir.Literal.of("yes"))
    wf = wf_of(S("check", ctr("echo", "yes"), outputs=(out,)),
               S("ship", ctr("true"), dependencies=(ir.Dependency("check"),),
                 when=ir.When(yes, expect=False)),
               S("strict", ctr("true"), dependencies=(ir.Dependency("ship", F.SUCCEEDED_ONLY),)),
               S("skipped-only", ctr("true"), dependencies=(ir.Dependency("ship", F.SKIPPED),)))
    docs = compile_ok(wf)
    assert "when" not in tasks(docs)["ship"]  # no Tekton when: it would make `ship` absent
    run = run_pipeline(docs, tmp_path)
    status = {n: r.results.get("couler-status") for n, r in run.tasks.items()}
    assert (status["ship"], status["strict"], status["skipped-only"]) == (
        "Skipped", "Omitted", "Succeeded")
    assert run.status == "Succeeded"


def test_retry_policy_in_status_mode_goes_through_the_wrapper(tmp_path: Path) -> None:
    flaky = ("if [ -e /tmp/seen ]; then exit 0; fi; touch /tmp/seen; exit 5")
    wf = wf_of(S("flaky", ctr("sh", "-c", flaky), retry=ir.RetryPolicy(limit=2)),
               S("any", ctr("true"), dependencies=(ir.Dependency("flaky", F.ANY),)))
    docs = compile_ok(wf)
    assert "retries" not in tasks(docs)["flaky"]  # the step exits 0 to Tekton: no retries
    run = run_pipeline(docs, tmp_path)
    flaky_run = run.tasks["flaky"]
    assert flaky_run.results["couler-status"] == "Succeeded"
    assert flaky_run.results["couler-attempts"] == "2"


def test_workflows_without_edge_conditions_compile_as_before() -> None:
    docs = compile_ok(_program("skip_propagation"))
    assert "couler-run-status" not in tasks(docs)
    assert all("onError" not in t["taskSpec"]["steps"][0] for t in docs[0]["spec"]["tasks"])


def test_edges_with_a_loop_in_the_workflow_are_refused() -> None:
    loop = ir.Loop(ir.Condition(ir.Literal.of(1), ir.CompareOp.EQ, ir.Literal.of(2)), 2)
    wf = wf_of(S("a", ctr("true"), loop=loop),
               S("b", ctr("true"), dependencies=(ir.Dependency("a", F.ANY),)))
    with pytest.raises(UnsupportedFeatureError) as err:
        tekton.compile_workflow(wf)
    assert err.value.step == "b" and Feature.EDGE_CONDITIONS.value in str(err.value)


def test_the_run_status_task_name_is_reserved() -> None:
    wf = wf_of(S("couler-run-status", ctr("true")),
               S("b", ctr("true"), dependencies=(ir.Dependency("couler-run-status", F.ANY),)))
    with pytest.raises(UnsupportedFeatureError, match="reserved"):
        tekton.compile_workflow(wf)


def test_sim_reproduces_tekton_fail_fast_outside_status_mode(tmp_path: Path) -> None:
    # the stand-in is faithful where Tekton is strict: E1 (docs/semantics.md)
    wf = wf_of(S("broken", ctr("sh", "-c", "exit 1")),
               S("after", ctr("true"), dependencies=(ir.Dependency("broken"),)))
    run = run_pipeline(compile_ok(wf), tmp_path)
    assert run.status == "Failed" and "after" not in run.tasks


# --------------------------------------------------------------------------- artifacts


def test_artifacts_program_passes_the_file_through_the_workspace(tmp_path: Path) -> None:
    docs = compile_ok(_program("artifacts"))
    binding = {w["name"]: w for w in docs[1]["spec"]["workspaces"]}["couler-artifacts"]
    assert binding["volumeClaimTemplate"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    run = run_pipeline(docs, tmp_path)
    assert run.status == "Succeeded"
    assert run.tasks["consumer"].results["seen"].rstrip("\n") == \
        EXPECTED["artifacts"]["steps"]["consumer"]["outputs"]["seen"]
    stored = tmp_path / "workspaces" / "couler-artifacts" / "producer" / "report"
    assert stored.read_text() == "artifact-payload\n"


def _art_step(name: str, script: str, **kw: Any) -> ir.Step:
    return S(name, ctr("sh", "-c", script), **kw)


def test_a_directory_artifact_and_a_missing_one(tmp_path: Path) -> None:
    out = ir.OutputArtifact("data", "/tmp/data")
    src = ir.StepArtifactRef("make", "data")
    wf = wf_of(_art_step("make", "mkdir -p /tmp/data/sub && echo x > /tmp/data/sub/f",
                         output_artifacts=(out,)),
               _art_step("use", "test \"$(cat /tmp/in/sub/f)\" = x",
                         input_artifacts=(ir.InputArtifact("data", "/tmp/in", src),),
                         dependencies=(ir.Dependency("make"),)),
               _art_step("broken", "exit 1", output_artifacts=(ir.OutputArtifact(
                   "lost", "/tmp/lost"),)),
               _art_step("late", "true", input_artifacts=(ir.InputArtifact(
                   "lost", "/tmp/lost", ir.StepArtifactRef("broken", "lost")),),
                   dependencies=(ir.Dependency("broken", F.ANY),)))
    run = run_pipeline(compile_ok(wf), tmp_path)
    status = {n: r.results.get("couler-status") for n, r in run.tasks.items()}
    assert status["use"] == "Succeeded"  # the directory arrived whole
    assert status["late"] == "Failed"  # its input was never stored: a failure, recorded
    assert run.status == "Failed"


def test_artifacts_from_object_stores_and_read_from_mapped_steps_are_refused() -> None:
    s3 = ir.ArtifactLocation(ir.StorageKind.S3, bucket="b", key="k")
    with pytest.raises(UnsupportedFeatureError, match="s3 storage"):
        tekton.compile_workflow(wf_of(_art_step("a", "true", input_artifacts=(
            ir.InputArtifact("x", "/tmp/x", s3),))))
    mapped = _art_step("m", "true", output_artifacts=(ir.OutputArtifact("x", "/tmp/x"),),
                       inputs=(ir.InputParameter("i", ir.ItemRef()),),
                       foreach=ir.ForEach(items=(ir.Literal.of(1),)))
    compile_ok(wf_of(mapped))  # each item keeps its own (see below)
    reader = _art_step("r", "true", dependencies=(ir.Dependency("m"),), input_artifacts=(
        ir.InputArtifact("x", "/tmp/x", ir.StepArtifactRef("m", "x")),))
    with pytest.raises(UnsupportedFeatureError, match="not a single container or script"):
        tekton.compile_workflow(wf_of(mapped, reader))


def test_artifacts_inside_an_inline_sub_workflow_follow_the_renamed_steps(tmp_path: Path,
                                                                          ) -> None:
    inner = (_art_step("w", "echo hi > /tmp/a", output_artifacts=(ir.OutputArtifact(
                 "a", "/tmp/a"),)),
             _art_step("r", "cat /tmp/b > /tmp/o", input_artifacts=(ir.InputArtifact(
                 "a", "/tmp/b", ir.StepArtifactRef("w", "a")),),
                 outputs=(ir.OutputParameter("o", ir.OutputSource.PATH, "/tmp/o"),),
                 dependencies=(ir.Dependency("w"),)))
    group = S("grp", ir.SubWorkflowSpec(name="grp", steps=inner))
    run = run_pipeline(compile_ok(wf_of(group)), tmp_path)
    assert run.status == "Succeeded" and run.tasks["grp-r"].results["o"] == "hi\n"


# --------------------------------------------------------------------------- bounded maps


def test_map_static_runs_in_batches_of_its_parallelism(tmp_path: Path) -> None:
    docs = compile_ok(_program("map_static"))
    by_name = tasks(docs)
    assert list(by_name) == ["square", "square-batch2"]
    assert by_name["square-batch2"]["runAfter"] == ["square"]  # at most 2 at once
    items = [[p["value"] for p in inc["params"]] for t in by_name.values()
             for inc in t["matrix"]["include"]]
    assert items == [["1"], ["2"], ["3"]]  # every item once, in order
    run = run_pipeline(docs, tmp_path)
    assert run.status == "Succeeded"
    squares = run.tasks["square"].results["square"] + run.tasks["square-batch2"].results["square"]
    assert squares == json.loads(EXPECTED["map_static"]["steps"]["square"]["outputs"]["square"])


def test_edges_from_a_bounded_map_read_every_batch(tmp_path: Path) -> None:
    mixed = S("mixed", ctr("sh", "-c", "exit {{inputs.code}}"),
              inputs=(ir.InputParameter("code", ir.ItemRef()),),
              foreach=ir.ForEach(items=(ir.Literal.of(1), ir.Literal.of(1), ir.Literal.of(0)),
                                 parallelism=2))
    wf = wf_of(mixed,
               S("salvage", ctr("true"), dependencies=(ir.Dependency("mixed", F.ANY_SUCCEEDED),)),
               S("give-up", ctr("true"), dependencies=(ir.Dependency("mixed", F.ALL_FAILED),)))
    docs = compile_ok(wf)
    assert tasks(docs)["salvage"]["runAfter"] == ["mixed", "mixed-batch2"]
    run = run_pipeline(docs, tmp_path)
    status = {n: r.results.get("couler-status") for n, r in run.tasks.items()}
    # only the second batch's item succeeded: salvage sees it, give-up does not run
    assert (status["salvage"], status["give-up"]) == ("Succeeded", "Omitted")
    assert run.tasks["couler-run-status"].state == "failed"  # give-up carries the failure


def test_a_bounded_map_over_an_upstream_list_is_refused() -> None:
    out = ir.OutputParameter("xs", ir.OutputSource.STDOUT, type=ir.ValueType.LIST)
    wf = wf_of(S("list", ctr("echo", "[1]"), outputs=(out,)),
               S("each", ctr("echo", "{{item}}"), dependencies=(ir.Dependency("list"),),
                 foreach=ir.ForEach(source=ir.StepOutputRef("list", "xs"), parallelism=2)))
    with pytest.raises(UnsupportedFeatureError) as err:
        tekton.compile_workflow(wf)
    assert err.value.step == "each" and err.value.feature == Feature.MAP_PARALLELISM.value


def test_exit_hooks_see_the_status_the_run_status_task_decides(tmp_path: Path) -> None:
    wf = wf_of(S("broken", ctr("sh", "-c", "exit 1")),
               S("after", ctr("true"), dependencies=(ir.Dependency("broken"),)),
               S("cleanup", ctr("true"), dependencies=(ir.Dependency("broken", F.ANY),)),
               exit_hooks=(ir.ExitHook(ir.RunStatus.FAILED, (S("alert", ctr("true")),)),
                           ir.ExitHook(ir.RunStatus.SUCCEEDED, (S("party", ctr("true")),))))
    docs = compile_ok(wf)
    assert "onError" not in tasks(docs, "finally")["alert"]["taskSpec"]["steps"][0]
    run = run_pipeline(docs, tmp_path)
    assert run.status == "Failed"  # `after`, a leaf, was not run because broken failed
    assert (run.tasks["alert"].state, run.tasks["party"].state) == ("succeeded", "skipped")


# --------------------------------------------------------------------------- every program

# Programs the stand-in cannot run, and why (not Tekton's doing).
NOT_RUN_HERE = {
    "job_step": "its Job needs a Kubernetes API (test_tekton_job.py runs its script "
                "against a fake kubectl)",
    "placement": "its volume is mounted at a fixed path the stand-in cannot mount",
    "subworkflow_ref": "its child PipelineRun needs a Kubernetes API and a Tekton "
                       "controller (test_tekton_job.py runs its script against a fake "
                       "kubectl)",
    "retry_timeout": "a Tekton retry is a new pod: the marker file the program leaves in "
                     "its working directory for the next attempt is gone (the stand-in does "
                     "not model retries)",
}
# docs/semantics.md E1: without the step-status rewrite, a failed task stops Tekton from
# starting more tasks; the steps it kept from starting are the only difference.
FAIL_FAST = {"sibling_whens", "skip_propagation"}


def _compiled_programs() -> list[str]:
    out = []
    for path in program_paths():
        try:
            tekton.compile_workflow(load_program(path))
        except UnsupportedFeatureError:
            continue
        out.append(path.stem)
    return out


COMPILED = _compiled_programs()


def test_the_programs_not_run_here_are_compiled_ones() -> None:
    assert set(NOT_RUN_HERE) < set(COMPILED) and set(FAIL_FAST) < set(COMPILED)
    assert len(COMPILED) >= 20


@pytest.mark.parametrize("program", [p for p in COMPILED if p not in NOT_RUN_HERE])
def test_every_compiled_program_runs_as_expected(program: str, tmp_path: Path,
                                                            ) -> None:
    wf = _program(program)
    # a tune step's study: the storage secret's URL (a new SQLite file)
    secrets = {**LOCAL_SECRETS, ("couler-tune", "url"): f"sqlite:///{tmp_path / 'tune.db'}"}
    run = run_pipeline(compile_ok(wf), tmp_path / "run", secrets=secrets)
    problems = _compare(EXPECTED[program], run, wf)
    if program in FAIL_FAST:
        assert problems and all(p.split(": ", 1)[1].startswith("not run != ") for p in problems)
        assert run.status.lower() == EXPECTED[program]["state"] == "failed"
        return
    assert problems == []


def test_fail_fast_is_warned_only_where_the_step_status_rewrite_is_not_used() -> None:
    def ids(program: str) -> set[str]:
        return {w.exception.id for w in differences(_program(program), "tekton")}

    assert "E1" not in ids("edge_conditions")  # independent branches run to completion
    assert "E1" in ids("skip_propagation") and "E1" in ids("sibling_whens")
    assert "E5" in ids("unusual_edges")


@pytest.mark.parametrize("value, ran", [("0.9", {"ship"}), ("0.97", {"ship", "celebrate"}),
                                        ("0.5", set()), ("n/a", set())])
def test_an_ordered_when_in_status_mode_is_tested_as_numbers(tmp_path: Path, value: str,
                                                             ran: set[str]) -> None:
    # an edge on any outcome puts the workflow in status mode: the script tests the when
    # (a value that is not a number makes an ordered comparison false)
    score = ir.Step("score", ctr("sh", "-c", f"echo {value}"),
                    outputs=(ir.OutputParameter("auc", ir.OutputSource.STDOUT),))
    dep = (ir.Dependency("score"),)
    auc = ir.StepOutputRef("score", "auc")
    wf = wf_of(score,
               ir.Step("ship", ctr("echo", "ship"), dependencies=dep, when=ir.When(
                   ir.Condition(auc, ir.CompareOp.GE, ir.Literal.of(0.8)))),
               ir.Step("celebrate", ctr("echo", "!"), dependencies=dep, when=ir.When(
                   ir.Condition(auc, ir.CompareOp.GT, ir.Literal.of(0.95)))),
               ir.Step("tidy", ctr("true"), dependencies=(
                   ir.Dependency("score", ir.EdgeCondition.ANY),)))
    docs = compile_ok(wf)
    assert "ship-when" not in tasks(docs)  # no guard task: the script tests it
    run = run_pipeline(docs, tmp_path)
    assert run.status == "Succeeded"
    states = {n: step_view(run, n)[0] for n in ("ship", "celebrate")}
    assert {n for n, s in states.items() if s == "succeeded"} == ran
    assert all(s == "skipped" for n, s in states.items() if n not in ran)


def test_each_item_of_a_map_keeps_its_own_artifacts(tmp_path: Path) -> None:
    # a map's items write their artifacts under their TaskRun's name: none overwrites another
    source = ir.Step("source", ctr("sh", "-c", "mkdir -p /tmp/d && echo rows > /tmp/d/t.csv"),
                     output_artifacts=(ir.OutputArtifact("data", "/tmp/d"),))
    train = ir.Step(
        "train", ctr("sh", "-c", "mkdir -p /tmp/m && cat /tmp/in/t.csv > /tmp/m/card && "
                     "echo {{item}} >> /tmp/m/card"),
        dependencies=(ir.Dependency("source"),),
        input_artifacts=(ir.InputArtifact("data", "/tmp/in", ir.StepArtifactRef("source",
                                                                                "data")),),
        output_artifacts=(ir.OutputArtifact("model", "/tmp/m"),),
        foreach=ir.ForEach(items=tuple(ir.Literal.of(r) for r in ("eu", "us", "apac"))))
    docs = compile_ok(wf_of(source, train))
    run = run_pipeline(docs, tmp_path)
    assert run.status == "Succeeded"
    stored = tmp_path / "workspaces" / "couler-artifacts" / "train"
    cards = sorted((d / "model" / "card").read_text() for d in stored.iterdir())
    assert cards == ["rows\napac\n", "rows\neu\n", "rows\nus\n"]


def test_a_looped_steps_artifacts_are_still_refused() -> None:
    step = ir.Step("again", ctr("sh", "-c", "echo 1 > /tmp/x"),
                   outputs=(ir.OutputParameter("n", ir.OutputSource.STDOUT),),
                   output_artifacts=(ir.OutputArtifact("x", "/tmp/x"),),
                   loop=ir.Loop(ir.Condition(ir.StepOutputRef("again", "n"), ir.CompareOp.EQ,
                                             ir.Literal.of("2")), 3))
    with pytest.raises(UnsupportedFeatureError, match="looped step"):
        tekton.compile_workflow(wf_of(step))
