"""The console's DAG layout (couler_monitor.console.graph): layers by dependency depth, exit
hooks in a last column, map items as marks, the state shown for a finished run's steps."""

from __future__ import annotations

from couler.engines.base import StepState
from couler.v1 import workflow_pb2
from couler_monitor.console import GAP_X, NODE_W, PAD, graph, shown_state
from couler_runtime.rpc.records import Run, RunState, StepRecord


def plan(*steps: tuple[str, tuple[str, ...]], hooks: tuple[str, ...] = ()) -> bytes:
    wf = workflow_pb2.Workflow(name="wf")
    for name, ups in steps:
        wf.steps.append(workflow_pb2.Step(
            name=name, dependencies=[workflow_pb2.Dependency(step=u) for u in ups]))
    if hooks:
        wf.exit_hooks.append(workflow_pb2.ExitHook(
            on=workflow_pb2.RUN_STATUS_SUCCEEDED,
            steps=[workflow_pb2.Step(name=h) for h in hooks]))
    return wf.SerializeToString()


def column(x: int) -> int:
    return (x - PAD) // (NODE_W + GAP_X)


def test_layers_follow_the_deepest_upstream_step_and_hooks_come_last() -> None:
    run = Run(run_id="r", state=RunState.RUNNING, workflow="wf", steps=(
        StepRecord("a", StepState.SUCCEEDED),
        *(StepRecord("fan", StepState.SUCCEEDED if i else StepState.FAILED, key=str(i))
          for i in range(3))))
    g = graph(run, plan(("a", ()), ("b", ("a",)), ("fan", ("a",)), ("c", ("b", "fan")),
                        ("d", ("a", "c")), hooks=("notify",)))
    at = {n.name: column(n.x) for n in g.nodes}
    assert at == {"a": 0, "b": 1, "fan": 1, "c": 2, "d": 3, "notify": 4}
    assert len(g.edges) == 6 and g.planned
    by = {n.name: n for n in g.nodes}
    assert [m[2] for m in by["fan"].marks] == ["failed", "succeeded", "succeeded"]
    assert by["fan"].state == "failed"  # an item failed
    assert by["notify"].hook == "succeeded" and by["b"].state == "pending"


def test_a_long_chain_is_laid_out_without_recursion() -> None:
    n = 20_000
    steps = [(f"s{i}", (f"s{i - 1}",) if i else ()) for i in range(n)]
    g = graph(Run(run_id="r", state=RunState.RUNNING), plan(*steps))
    assert column(g.nodes[-1].x) == n - 1


def test_a_finished_runs_steps_without_an_end_are_unreported_not_pending() -> None:
    done = Run(run_id="r", state=RunState.SUCCEEDED)
    assert shown_state(done, "pending")[0] == "unreported"
    assert shown_state(done, "")[0] == "unreported"
    assert shown_state(done, "skipped") == ("skipped", "")
    assert shown_state(Run(run_id="r", state=RunState.RUNNING), "") == ("pending", "")
    g = graph(done, plan(("a", ()), hooks=("notify",)))
    assert {n.name: n.state for n in g.nodes} == {"a": "unreported", "notify": "unreported"}


def test_without_a_plan_the_recorded_steps_are_drawn_without_edges() -> None:
    run = Run(run_id="r", state=RunState.RUNNING,
              steps=(StepRecord("x", StepState.RUNNING), StepRecord("y", StepState.PENDING)))
    for stored in (None, b"\xff\xff not a protobuf"):
        g = graph(run, stored)
        assert [n.name for n in g.nodes] == ["x", "y"] and g.edges == ()
