"""The submitter's chunk runner (couler_submitter.chunks.ChunkedRun) against a fake of its
engine port (no sockets).

What a split plan's run does when its engine reports no value for a hand-off: the chunk
that needs it is not started on a guess; the run fails naming the workflow, chunk, step and
output, and the steps not run are SKIPPED. The real optimizer and the local engine never
produce that (the optimizer asks only for outputs a step declares, the local engine reports
them all), so :class:`FakeRunner` -- a fake of the submitter's ``Runner`` port that reports
each step succeeded with the outputs it is told -- plays an engine that drops one. Split
plans run end to end in tests/integration/test_submitter_split.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from couler import ir
from couler.engines.base import RunState, RunStatus, StepState, StepStatus
from couler.optimize.split import Budget, split_workflow
from couler_runtime.local import Reuse
from couler_runtime.rpc.records import Chunk
from couler_submitter.chunks import ChunkedRun, chunk_run_id
from couler_submitter.engines import OnSample, OnStep, RunHandle


class FakeHandle:
    def __init__(self, status: RunStatus) -> None:
        self.status = status

    def wait(self) -> RunStatus:
        return self.status

    def cancel(self) -> None:
        return None

    def artifact_path(self, step: str, artifact: str) -> Path | None:
        return None


class FakeRunner:
    """A fake of the submitter's engine port: every run it starts succeeds at once, each
    step reporting ``outputs``; records what it started, with which parameters."""

    name = "fake"

    def __init__(self, outputs: Mapping[str, str]) -> None:
        self.outputs = dict(outputs)
        self.started: list[tuple[str, dict[str, str]]] = []

    def start(self, run_id: str, wf: ir.Workflow, parameters: Mapping[str, str],
              cached: Mapping[str, Reuse], on_event: OnStep, *,
              on_sample: OnSample | None = None) -> RunHandle:
        self.started.append((run_id, dict(parameters)))
        steps = tuple(StepStatus(s.name, StepState.SUCCEEDED, attempts=1,
                                 outputs=dict(self.outputs)) for s in wf.steps)
        for step in steps:
            on_event(step)
        return FakeHandle(RunStatus(run_id, wf.name, RunState.SUCCEEDED, steps))

    def resume(self, run_id: str, on_event: OnStep, *,
               on_sample: OnSample | None = None) -> RunHandle | None:
        return None

    def retry(self, run_id: str, on_event: OnStep, *,
              on_sample: OnSample | None = None) -> RunHandle | None:
        return None

    def interrupt(self, run_id: str, handle: RunHandle) -> None:
        return None

    def logs(self, engine_run_id: str, step: str, key: str) -> str:
        return ""


def chain() -> ir.Workflow:
    """a -> b -> c, each reading output ``v`` of the one before."""
    out = (ir.OutputParameter("v", source=ir.OutputSource.STDOUT),)

    def step(name: str, before: str = "") -> ir.Step:
        return ir.Step(
            name=name, body=ir.ContainerSpec(image="alpine", command=("echo", "{{inputs.v}}"
                                                                      if before else name)),
            inputs=(ir.InputParameter("v", ir.StepOutputRef(before, "v")),) if before else (),
            outputs=out, dependencies=(ir.Dependency(before),) if before else ())

    return ir.Workflow(name="chain", steps=(step("a"), step("b", "a"), step("c", "b")))


def chunks_of(wf: ir.Workflow) -> tuple[Chunk, ...]:
    """The optimizer's split of ``wf`` into chunks of one step."""
    result = split_workflow(wf, Budget(max_steps=1), measure=lambda w: 0)
    return tuple(Chunk(c.name, c.steps, c.depends_on, c.workflow, c.size_bytes)
                 for c in result.chunks)


def run(runner: FakeRunner, wf: ir.Workflow, chunks: tuple[Chunk, ...]
        ) -> tuple[RunStatus, list[StepStatus]]:
    events: list[StepStatus] = []
    status = ChunkedRun(runner, "run-1", workflow=wf, chunks=chunks, parameters={},
                        cached={}, on_event=events.append).wait()
    return status, events


def test_the_hand_offs_carry_the_reported_outputs() -> None:
    wf = chain()
    chunks = chunks_of(wf)
    assert [c.steps for c in chunks] == [("a",), ("b",), ("c",)]
    runner = FakeRunner({"v": "x"})
    status, _ = run(runner, wf, chunks)
    assert status.state is RunState.SUCCEEDED, status.message
    assert runner.started == [
        (chunk_run_id("run-1", chunks[0].name), {}),
        (chunk_run_id("run-1", chunks[1].name), {"x--a--v": "x"}),
        (chunk_run_id("run-1", chunks[2].name), {"x--b--v": "x"})]


def test_a_hand_off_the_engine_did_not_report_fails_naming_chunk_step_and_output() -> None:
    wf = chain()
    first, second, third = chunks_of(wf)
    assert second.workflow is not None
    # the second chunk asks for an output step a never reports
    bad = ir.Workflow(name=second.workflow.name, steps=second.workflow.steps,
                      parameters=(*second.workflow.parameters, ir.Parameter("x--a--nothing")))
    chunks = (first, Chunk(second.name, second.steps, second.depends_on, bad), third)
    runner = FakeRunner({"v": "x"})
    status, events = run(runner, wf, chunks)
    assert status.state is RunState.FAILED
    for part in (wf.name, repr(second.name), "'x--a--nothing'", "step 'a'", "output 'nothing'"):
        assert part in status.message, status.message
    assert [r for r, _ in runner.started] == [chunk_run_id("run-1", first.name)]  # no guess
    assert {s.step: s.state for s in status.steps} == {
        "a": StepState.SUCCEEDED, "b": StepState.SKIPPED, "c": StepState.SKIPPED}
    assert {s.step for s in events if s.state is StepState.SKIPPED} == {"b", "c"}
