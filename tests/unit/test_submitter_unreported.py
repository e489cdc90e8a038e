"""Steps an engine never reported get a terminal record when the run ends (no sockets).

The decision (:func:`couler_submitter.unreported.unreported_steps`) is pure; the store's
guard (``RunStore.put_steps(..., unreported=...)``) runs on an SQLite file; the use case
runs in the real :class:`Submitter` with a scripted remote engine behind the real
:class:`AdapterRunner` and :class:`FakeEvents` for the bus.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from couler import ir
from couler.api.handles import SecretMaterial
from couler.engines.base import RunState as EngineRunState
from couler.engines.base import RunStatus, StepState, StepStatus
from couler_runtime.rpc.records import Plan, RunState, StepRecord
from couler_submitter.engines import AdapterRunner
from couler_submitter.model import RunOptions, RunRequest
from couler_submitter.service import Submitter
from couler_submitter.store import Finish, RunStore
from couler_submitter.unreported import unreported_steps
from tests.unit.test_submitter_outbox import WAIT, FakeEvents, until

NOT_FIRED = "exit hook on failed did not fire: the run succeeded"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    s = RunStore(f"sqlite:///{tmp_path / 'submitter.db'}")
    yield s
    s.close()


def step(name: str, *, body: ir.StepBody | None = None,
         dependencies: tuple[ir.Dependency, ...] = ()) -> ir.Step:
    return ir.Step(name=name, body=body or ir.ContainerSpec(image="alpine", command=("true",)),
                   dependencies=dependencies)


def hooked(name: str = "hooked") -> ir.Workflow:
    """work -> after; exit hooks: always (any), mourn (failed), celebrate (succeeded)."""
    return ir.Workflow(name=name, steps=(step("work"), step(
        "after", dependencies=(ir.Dependency("work"),))), exit_hooks=(
        ir.ExitHook(ir.RunStatus.ANY, (step("always"),)),
        ir.ExitHook(ir.RunStatus.FAILED, (step("mourn"),)),
        ir.ExitHook(ir.RunStatus.SUCCEEDED, (step("celebrate"),))))


def by_name(records: Sequence[StepRecord]) -> dict[str, tuple[StepState, str]]:
    return {r.name: (r.state, r.message) for r in records}


# --------------------------------------------------------------------------- the decision


def test_hooks_that_did_not_fire_are_skipped_saying_why() -> None:
    got = unreported_steps(hooked(), {"work", "after", "always", "celebrate"}, engine="argo",
                           state=RunState.SUCCEEDED, at=12.5)
    assert by_name(got) == {"mourn": (StepState.SKIPPED, NOT_FIRED)}
    assert (got[0].finished_at, got[0].attempts, got[0].started_at, got[0].key) == (
        12.5, 0, None, "")
    got = unreported_steps(hooked(), {"work", "always", "mourn"}, engine="kfp",
                           state=RunState.FAILED, at=1.0)
    assert by_name(got) == {
        "after": (StepState.SKIPPED, "not run by kfp: the run failed"),
        "celebrate": (StepState.SKIPPED,
                      "exit hook on succeeded did not fire: the run failed")}


def test_a_cancelled_run_cancels_what_never_started_and_no_hook_fired() -> None:
    got = unreported_steps(hooked(), {"work"}, engine="argo", state=RunState.CANCELLED,
                           at=1.0)
    why = "did not fire: the run was cancelled"
    assert by_name(got) == {
        "after": (StepState.CANCELLED, "not run by argo: the run was cancelled"),
        "always": (StepState.SKIPPED, f"exit hook on any {why}"),
        "mourn": (StepState.SKIPPED, f"exit hook on failed {why}"),
        "celebrate": (StepState.SKIPPED, f"exit hook on succeeded {why}")}


def test_nothing_is_decided_before_the_run_ends_nor_for_what_was_reported() -> None:
    everything = {"work", "after", "always", "mourn", "celebrate"}
    for state in (RunState.PENDING, RunState.RUNNING):
        assert unreported_steps(hooked(), set(), engine="argo", state=state, at=1.0) == []
    assert unreported_steps(hooked(), everything, engine="argo", state=RunState.FAILED,
                            at=1.0) == []


def test_a_group_whose_inner_steps_were_reported_ran() -> None:
    """Engines report an inline sub-workflow by its inner steps: ``outer/inner`` (local),
    ``outer-inner`` (Tekton), ``outer.inner`` (Airflow), at every level."""
    inner = step("h", body=ir.SubWorkflowSpec("h", steps=(step("x"),)))
    group = step("g", body=ir.SubWorkflowSpec("g", steps=(step("a"), inner)))
    wf = ir.Workflow(name="groups", steps=(group,))
    for reported in ({"g/a"}, {"g-a"}, {"g.h.x"}, {"g-h-x"}):
        assert unreported_steps(wf, reported, engine="tekton", state=RunState.SUCCEEDED,
                                at=1.0) == [], reported
    # A name that only looks alike is no inner step of the group.
    assert by_name(unreported_steps(wf, {"g-b", "ga"}, engine="tekton",
                                    state=RunState.SUCCEEDED, at=1.0)) == {
        "g": (StepState.SKIPPED, "not run by tekton: the run succeeded")}


# --------------------------------------------------------------------------- the store


def test_the_store_writes_them_only_with_the_end_and_never_over_a_record(
        store: RunStore) -> None:
    store.create_run("r1", RunRequest(hooked(), None, RunOptions("argo")))
    store.update_run("r1", state=RunState.RUNNING)
    # "work" was reported earlier (as map items, say): a record under any key counts.
    store.put_steps("r1", [StepRecord("work", StepState.SUCCEEDED, key="0", attempts=1)])
    unreported = [StepRecord("work", StepState.SKIPPED, message="would be a lie"),
                  StepRecord("after", StepState.SKIPPED, message="in this batch"),
                  StepRecord("mourn", StepState.SKIPPED, finished_at=5.0, message=NOT_FIRED)]
    before = store.pending_events(100)
    # Not ending the run (it is not in the states the end expects): nothing is added.
    not_now = Finish(RunState.SUCCEEDED, "", 5.0, (RunState.PENDING,))
    run = store.put_steps("r1", [], finish=not_now, unreported=unreported)
    assert run.state is RunState.RUNNING and run.step_count == 1
    end = Finish(RunState.SUCCEEDED, "", 5.0, (RunState.PENDING, RunState.RUNNING))
    run = store.put_steps("r1", [StepRecord("after", StepState.SUCCEEDED, attempts=1)],
                          finish=end, unreported=unreported)
    assert (run.state, run.step_count) == (RunState.SUCCEEDED, 3)
    got = {(s.name, s.key): (s.state, s.message) for s in store.get_run("r1").steps}
    assert got == {("work", "0"): (StepState.SUCCEEDED, ""),
                   ("after", ""): (StepState.SUCCEEDED, ""),
                   ("mourn", ""): (StepState.SKIPPED, NOT_FIRED)}
    # Its event is queued with the others, before the run's end.
    kinds = [e.kind for e in store.pending_events(100)[len(before):]]
    assert kinds == ["step", "step", "finished"]


# --------------------------------------------------------------------------- the use case


class ScriptedEngine:
    """A remote engine (an EngineAdapter) that reports ``steps`` while running, then ends
    ``state`` once ``release`` is set, reporting nothing more."""

    def __init__(self, steps: Sequence[StepStatus], state: EngineRunState) -> None:
        self.steps = tuple(steps)
        self.state = state
        self.release = threading.Event()

    def submit(self, wf: ir.Workflow, secrets: Sequence[SecretMaterial] = (), *,
               idempotency_key: str | None = None) -> str:
        return f"remote-{idempotency_key}"

    def status(self, run_id: str) -> RunStatus:
        return RunStatus(run_id, "hooked", self.state, self.steps, 1.0, 9.0)

    def watch(self, run_id: str, timeout: float | None = None) -> Iterator[RunStatus]:
        yield RunStatus(run_id, "hooked", EngineRunState.RUNNING, self.steps, 1.0)
        self.release.wait(WAIT)
        yield self.status(run_id)

    def logs(self, run_id: str, step: str, key: str = "") -> str:
        return ""

    def cancel(self, run_id: str) -> None:
        return None


def test_a_run_records_and_publishes_the_hooks_its_engine_never_reported(
        store: RunStore, tmp_path: Path) -> None:
    done = [StepStatus(name, StepState.SUCCEEDED, attempts=1, started_at=2.0, finished_at=3.0)
            for name in ("work", "after", "always", "celebrate")]
    engine = ScriptedEngine(done, EngineRunState.SUCCEEDED)
    events = FakeEvents()

    async def scenario() -> None:
        sub = Submitter(store, events, {"argo": AdapterRunner("argo", engine)}, blobs=None,
                        runs_dir=tmp_path / "runs", outbox_interval=0.05)
        await sub.start()
        try:
            run_id, _ = await sub.submit(workflow=hooked(), options=RunOptions("argo"))
            await until(lambda: store.header(run_id).state is RunState.PLANNING, "planning")
            await sub.optimized(run_id, Plan(workflow=hooked(), engine="argo"))
            # What the engine reported is recorded before it ends: the end comes alone.
            await until(lambda: store.header(run_id).step_count == 4, "the reported steps")
            engine.release.set()
            await until(lambda: store.header(run_id).state.terminal, "the end")
            assert await sub.drained(WAIT)
        finally:
            await sub.close()

    asyncio.run(asyncio.wait_for(scenario(), WAIT))
    (run,) = [store.get_run(r.run_id) for r in store.list_runs()[0]]
    assert run.state is RunState.SUCCEEDED
    assert by_name(run.steps) == {
        **{n: (StepState.SUCCEEDED, "") for n in ("work", "after", "always", "celebrate")},
        "mourn": (StepState.SKIPPED, NOT_FIRED)}
    assert run.step("mourn").finished_at == 9.0  # when the run ended
    steps = [e for e in events.sent if e[0] == "step"]
    assert ("step", run.run_id, "mourn", "skipped") in steps
    assert events.sent[-1][0] == "finished" and events.sent.index(
        ("step", run.run_id, "mourn", "skipped")) < len(events.sent) - 1
