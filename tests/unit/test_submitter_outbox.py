"""The submitter's use cases against small fakes: the outbox, paged records, watch deltas.

The store is the real :class:`RunStore` on an SQLite file; the events go to
:class:`FakeEvents` (which can play a NATS that is away, or one that refuses a message);
the engine is the dry run. No sockets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from couler import ir
from couler.engines.base import RunState as EngineRunState
from couler.engines.base import RunStatus, StepSample, StepState, StepStatus
from couler.errors import RetryableError, UserError
from couler.ir.limits import SizeLimits
from couler_runtime.rpc.records import Plan, Run, RunState, StepRecord, UtilizationSample
from couler_submitter.engines import DryRunRunner, _topological
from couler_submitter.model import RunOptions, RunRequest
from couler_submitter.service import Submitter
from couler_submitter.store import EventKind, Finish, RunStore

T = TypeVar("T")
WAIT = 60.0  # a bound on waiting, never an assertion about speed


class FakeEvents:
    """Records what it is asked to publish, in call order (as the bus's connection would
    send it); ``down`` plays a NATS that is away, ``refuse`` steps it can never take."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, ...]] = []
        self.down = False
        self.refuse: set[str] = set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.traces: list[str] = []
        self.samples: list[UtilizationSample] = []

    async def _send(self, event: tuple[str, ...]) -> None:
        if self.down:
            raise RetryableError("publish: ConnectionReconnectingError")
        if len(event) > 2 and event[2] in self.refuse:
            raise UserError(f"publish of step {event[2]!r}: refused by the bus")
        self.sent.append(event)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # the acknowledgement comes later
        finally:
            self.in_flight -= 1

    async def requested(self, run: Run, request: RunRequest) -> None:
        name = request.workflow.name if request.workflow else ""
        await self._send(("requested", run.run_id, name))

    async def submitted(self, run: Run) -> None:
        await self._send(("submitted", run.run_id))

    async def step(self, run: Run, rec: StepRecord) -> None:
        await self._send(("step", run.run_id, rec.name, rec.state.value))

    async def utilization(self, sample: UtilizationSample) -> None:
        await self._send(("utilization", sample.run_id, sample.step))

    async def utilization_batch(self, run: Run, samples: Sequence[UtilizationSample]) -> None:
        await self._send(("samples", run.run_id, str(len(samples))))
        self.samples += samples

    async def finished(self, run: Run) -> None:
        await self._send(("finished", run.run_id, run.state.value, str(run.step_count)))


def chain(n: int, name: str = "chain") -> ir.Workflow:
    steps = [ir.Step(name="s0", body=ir.ContainerSpec(image="alpine", command=("echo", "0")))]
    steps += [ir.Step(name=f"s{i}", body=ir.ContainerSpec(image="alpine", command=("echo",)),
                      dependencies=(ir.Dependency(f"s{i - 1}"),)) for i in range(1, n)]
    return ir.Workflow(name=name, steps=tuple(steps))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    s = RunStore(f"sqlite:///{tmp_path / 'submitter.db'}")
    yield s
    s.close()


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(fn(), WAIT))


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(int(WAIT / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def submitter(store: RunStore, events: FakeEvents, tmp_path: Path, **kw: object) -> Submitter:
    return Submitter(store, events, {"dryrun": DryRunRunner()}, blobs=None,
                     runs_dir=tmp_path / "runs", outbox_interval=0.05, **kw)  # type: ignore[arg-type]


def drain(store: RunStore, tmp_path: Path) -> FakeEvents:
    """Start a submitter on ``store``, wait until its outbox is sent, close it; what it sent."""
    events = FakeEvents()

    async def scenario() -> None:
        sub = submitter(store, events, tmp_path)
        await sub.start()
        try:
            assert await sub.drained(WAIT)
        finally:
            await sub.close()

    run_async(scenario)
    return events


def test_every_event_goes_out_once_in_order_also_after_nats_was_away(
        store: RunStore, tmp_path: Path) -> None:
    events = FakeEvents()

    async def scenario() -> tuple[Run, list[tuple[str, ...]]]:
        sub = submitter(store, events, tmp_path)
        await sub.start()
        try:
            events.down = True  # NATS is away: the run goes on, its events wait
            run_id, _ = await sub.submit(workflow=chain(600), options=RunOptions("dryrun"))
            await until(lambda: store.header(run_id).state is RunState.ACCEPTED, "accepted")
            assert events.sent == []
            events.down = False  # back: requested goes out, the run moves to PLANNING
            await until(lambda: store.header(run_id).state is RunState.PLANNING, "planning")
            events.down = True
            plan = Plan(workflow=chain(600), engine="dryrun")
            await sub.optimized(run_id, plan)
            await until(lambda: store.header(run_id).state is RunState.SUCCEEDED, "the run")
            # Every change is recorded (and readable) while nothing could be published.
            assert store.header(run_id).step_count == 600
            assert store.outbox_size() == 600 + 2  # steps, submitted, finished
            assert [e[0] for e in events.sent] == ["requested"]
            events.down = False
            assert await sub.drained(WAIT)
            return store.header(run_id), list(events.sent)
        finally:
            await sub.close()

    run, sent = run_async(scenario)
    assert [e[0] for e in sent] == ["requested", "submitted", *["step"] * 600, "finished"]
    assert [e[2] for e in sent if e[0] == "step"] == [f"s{i}" for i in range(600)]
    assert sent[-1] == ("finished", run.run_id, "succeeded", "600")
    assert store.outbox_size() == 0 and store.dead_events() == []
    assert events.most_in_flight > 1  # pipelined: not one acknowledgement at a time


def test_an_event_that_can_never_go_out_is_set_aside_and_the_rest_go_on(
        store: RunStore, tmp_path: Path) -> None:
    events = FakeEvents()
    events.refuse = {"s3"}

    async def scenario() -> str:
        sub = submitter(store, events, tmp_path)
        await sub.start()
        try:
            run_id, _ = await sub.submit(workflow=chain(6), options=RunOptions("dryrun"))
            await until(lambda: store.header(run_id).state is RunState.PLANNING, "planning")
            await sub.optimized(run_id, Plan(workflow=chain(6), engine="dryrun"))
            await until(lambda: store.header(run_id).state is RunState.SUCCEEDED, "the run")
            assert await sub.drained(WAIT)
            return run_id
        finally:
            await sub.close()

    run_id = run_async(scenario)
    steps = [e[2] for e in events.sent if e[0] == "step"]
    assert steps == ["s0", "s1", "s2", "s4", "s5"] and events.sent[-1][0] == "finished"
    [(_, dead_run, kind, reason)] = store.dead_events()
    assert (dead_run, kind) == (run_id, "step") and "refused by the bus" in reason


def test_start_up_publishes_what_a_previous_process_left(
        store: RunStore, tmp_path: Path) -> None:
    """Rows committed but not published before a crash go out at the next start, and
    garbage in the outbox never blocks or crashes the start."""
    store.create_run("run-left", RunRequest(chain(2), None, RunOptions("dryrun")))
    store.put_steps("run-left", [StepRecord("s0", StepState.SUCCEEDED, attempts=1)])
    store.update_run("run-left", state=RunState.FAILED, emit=(EventKind.FINISHED,))
    # A row whose payload no longer decodes (a bug, a manual edit): set aside, not fatal.
    with store._sessions() as session, session.begin():
        from couler_submitter.store import OutboxRow
        session.add(OutboxRow(run_id="run-left", kind="step", payload=b"\xff\x00garbage",
                              created_at=0.0))
    events = drain(store, tmp_path)
    assert [e[0] for e in events.sent] == ["requested", "step", "finished"]
    assert [d[2] for d in store.dead_events()] == ["step"]
    assert "does not decode" in store.dead_events()[0][3]
    assert store.outbox_size() == 0


def test_get_pages_and_watch_sends_only_what_changed(store: RunStore, tmp_path: Path) -> None:
    events = FakeEvents()

    async def scenario() -> tuple[list[Run], list[list[tuple[Run, bool]]]]:
        sub = submitter(store, events, tmp_path)
        await sub.start()
        try:
            run_id, _ = await sub.submit(workflow=chain(2500), options=RunOptions("dryrun"))
            records = [StepRecord(f"s{i}", StepState.RUNNING) for i in range(2500)]
            await asyncio.to_thread(store.put_steps, run_id, records, state=RunState.RUNNING)
            pages = [await sub.get(run_id, page_size=1000)]
            while pages[-1].next_step_page_token:
                pages.append(await sub.get(run_id, page_size=1000,
                                           page_token=pages[-1].next_step_page_token))
            rounds: list[list[tuple[Run, bool]]] = [[]]
            watch = sub.watch(run_id, page_size=1000)
            async for run, more in watch:
                rounds[-1].append((run, more))
                if more:
                    continue
                if len(rounds) == 1:  # after the snapshot: two steps change, one is new
                    await asyncio.to_thread(store.put_steps, run_id, [
                        StepRecord("s7", StepState.SUCCEEDED, attempts=1),
                        StepRecord("extra", StepState.RUNNING)])
                    rounds.append([])
                elif len(rounds) == 2:
                    await asyncio.to_thread(store.update_run, run_id,
                                            state=RunState.SUCCEEDED)
                    rounds.append([])
            return pages, rounds
        finally:
            await sub.close()

    pages, rounds = run_async(scenario)
    assert [len(p.steps) for p in pages] == [1000, 1000, 500]
    assert [s.name for p in pages for s in p.steps] == [f"s{i}" for i in range(2500)]
    assert {p.step_count for p in pages} == {2500} and pages[-1].next_step_page_token == ""
    snapshot, change, end = rounds
    # The snapshot: all steps, a page per message, in order; `more` on all but the last.
    assert [m for _, m in snapshot] == [True, True, False]
    assert [s.name for r, _ in snapshot for s in r.steps] == [f"s{i}" for i in range(2500)]
    # Then only what changed, in the order the steps were first seen.
    [(changed, more)] = change
    assert not more and [(s.name, s.state) for s in changed.steps] == [
        ("s7", StepState.SUCCEEDED), ("extra", StepState.RUNNING)]
    assert changed.step_count == 2501
    [(last, _)] = end
    assert last.state is RunState.SUCCEEDED and last.steps == ()
    revisions = [r.revision for r, _ in (snapshot[-1], change[0], end[0])]
    assert revisions == sorted(set(revisions))


def test_submit_refuses_values_over_the_limits_naming_them(store: RunStore,
                                                           tmp_path: Path) -> None:
    events = FakeEvents()
    limits = SizeLimits(max_value_bytes=4096)
    big = dataclasses.replace(chain(3), steps=(
        chain(3).steps[0], dataclasses.replace(chain(3).steps[1], body=ir.ContainerSpec(
            image="alpine", command=("echo", "x" * 5000))), chain(3).steps[2]))

    async def scenario() -> None:
        sub = submitter(store, events, tmp_path, limits=limits)
        await sub.start()
        try:
            with pytest.raises(Exception) as info:
                await sub.submit(workflow=big, options=RunOptions("dryrun"))
            assert "workflow 'chain', step 's1', field 'command[1]'" in str(info.value)
            assert "over the limit of 4 KiB per value" in str(info.value)
            with pytest.raises(Exception, match=r"field 'parameters\.p'"):
                await sub.submit(workflow=chain(2), options=RunOptions(
                    "dryrun", parameters={"p": "v" * 5000}))
            with pytest.raises(UserError, match="field 'text': the request is over"):
                await sub.submit(text="t" * 5000, options=RunOptions("dryrun"))
        finally:
            await sub.close()

    run_async(scenario)
    assert store.list_runs()[0] == []  # nothing was accepted


def test_the_dry_run_order_is_topological_and_linear() -> None:
    wf = ir.Workflow(name="w", steps=(
        ir.Step(name="c", body=ir.ContainerSpec(image="a"),
                dependencies=(ir.Dependency("a"), ir.Dependency("b"))),
        ir.Step(name="b", body=ir.ContainerSpec(image="a"), dependencies=(ir.Dependency("a"),)),
        ir.Step(name="a", body=ir.ContainerSpec(image="a")),
        ir.Step(name="d", body=ir.ContainerSpec(image="a")),
    ))
    assert [s.name for s in _topological(wf)] == ["a", "d", "b", "c"]
    big = chain(100_000)
    assert [s.name for s in _topological(big)][-3:] == ["s99997", "s99998", "s99999"]


def test_events_committed_on_the_loop_and_in_threads_go_out_once_in_order(
        store: RunStore, tmp_path: Path) -> None:
    """Small changes commit on the loop and reach the sender as committed; a large batch of
    step changes commits in a thread, and the sender reads the table for it. Either way
    every event goes out once, in each run's order."""
    events = FakeEvents()
    sizes = {"big": 300, "small-a": 3, "small-b": 4, "small-c": 2}

    async def scenario() -> dict[str, str]:
        sub = submitter(store, events, tmp_path)
        await sub.start()
        try:
            ids = {}
            for name, n in sizes.items():  # all at once: their commits interleave
                ids[name], _ = await sub.submit(workflow=chain(n, name),
                                                options=RunOptions("dryrun"))
            for run_id in ids.values():
                await until(lambda r=run_id: store.header(r).state is not RunState.ACCEPTED,
                            "planning")
            await asyncio.gather(*(sub.optimized(ids[name], Plan(
                workflow=chain(n, name), engine="dryrun")) for name, n in sizes.items()))
            for run_id in ids.values():
                await until(lambda r=run_id: store.header(r).state is RunState.SUCCEEDED,
                            "the runs")
            assert await sub.drained(WAIT)
            return ids
        finally:
            await sub.close()

    ids = run_async(scenario)
    assert len(events.sent) == len(set(events.sent))  # none twice
    for name, n in sizes.items():
        mine = [e for e in events.sent if e[1] == ids[name]]
        assert [e[0] for e in mine] == ["requested", "submitted", *["step"] * n, "finished"]
        assert [e[2] for e in mine if e[0] == "step"] == [f"s{i}" for i in range(n)]
    assert store.outbox_size() == 0


def test_an_event_another_writer_queued_goes_out_at_the_next_look(
        store: RunStore, tmp_path: Path) -> None:
    """The sender takes this process's commits as they come, and still reads the table now
    and then: a row queued by another writer of the same database is published too."""
    events = FakeEvents()

    async def scenario() -> str:
        sub = submitter(store, events, tmp_path)
        await sub.start()
        try:
            run_id, _ = await sub.submit(workflow=chain(2), options=RunOptions("dryrun"))
            await until(lambda: ("requested", run_id, "chain") in events.sent, "requested")
            # not through the submitter: nothing wakes its sender
            await asyncio.to_thread(store.update_run, run_id, state=RunState.CANCELLED,
                                    emit=(EventKind.FINISHED,))
            await until(lambda: any(e[0] == "finished" for e in events.sent), "the look")
            return run_id
        finally:
            await sub.close()

    run_id = run_async(scenario)
    assert events.sent[-1] == ("finished", run_id, "cancelled", "0")
    assert store.outbox_size() == 0


def test_the_end_commits_with_the_last_step_changes(store: RunStore) -> None:
    store.create_run("r1", RunRequest(chain(2), None, RunOptions("dryrun")))
    store.update_run("r1", state=RunState.PENDING)
    end = Finish(RunState.SUCCEEDED, "", 123.0, (RunState.PENDING, RunState.RUNNING))
    before = store.header("r1").revision
    run = store.put_steps("r1", [StepRecord("s0", StepState.SUCCEEDED, attempts=1),
                                 StepRecord("s1", StepState.SUCCEEDED, attempts=1)],
                          state=RunState.RUNNING, finish=end)
    assert (run.state, run.finished_at, run.step_count) == (RunState.SUCCEEDED, 123.0, 2)
    assert run.revision == before + 3  # a revision per step change, one for the end
    assert [e.kind for e in store.pending_events(10)] == [
        "requested", "step", "step", "finished"]
    # A run that ended meanwhile (cancelled) keeps its end; the steps are still recorded.
    store.create_run("r2", RunRequest(chain(1), None, RunOptions("dryrun")))
    store.update_run("r2", state=RunState.CANCELLED, message="cancelled")
    run = store.put_steps("r2", [StepRecord("s0", StepState.CANCELLED)], finish=end)
    assert (run.state, run.message, run.step_count) == (RunState.CANCELLED, "cancelled", 1)
    assert [e.kind for e in store.pending_events(10) if e.run_id == "r2"] == [
        "requested", "step"]


class _Held:
    """A run of one step ``s0`` that samples it while it runs and ends when released."""

    def __init__(self, run_id: str, on_event: Callable[[StepStatus], None],
                 on_sample: Callable[[StepSample], None] | None,
                 release: threading.Event) -> None:
        self._run_id, self._on_event, self._on_sample = run_id, on_event, on_sample
        self._release = release
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _sample(self, i: int) -> None:
        if self._on_sample is not None:
            self._on_sample(StepSample("s0", at=1_700_000_000.0 + i, cpu=0.5,
                                       memory_bytes=1 << 20, interval_seconds=1.0))

    def _main(self) -> None:
        self._on_event(StepStatus("s0", StepState.RUNNING, attempts=1, started_at=time.time()))
        for i in range(3):
            self._sample(i)
        self._release.wait()
        self._sample(3)  # the last one: before the step's end, as the engines send it
        self._on_event(StepStatus("s0", StepState.SUCCEEDED, attempts=1, exit_code=0,
                                  finished_at=time.time()))

    def wait(self) -> RunStatus:
        self._thread.join()
        return RunStatus(self._run_id, "chain", EngineRunState.SUCCEEDED,
                         finished_at=time.time())

    def cancel(self) -> None:
        self._release.set()

    def artifact_path(self, step: str, artifact: str) -> None:
        return None


class SamplingRunner(DryRunRunner):
    """The dry run's name, runs of :class:`_Held`."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def start(self, run_id: str, wf: ir.Workflow, parameters: Mapping[str, str],
              cached: Mapping[str, Any], on_event: Callable[[StepStatus], None], *,
              on_sample: Callable[[StepSample], None] | None = None) -> Any:
        return _Held(run_id, on_event, on_sample, self.release)


def test_samples_go_out_in_batches_while_a_step_runs_and_the_last_with_its_end(
        store: RunStore, tmp_path: Path) -> None:
    events = FakeEvents()
    runner = SamplingRunner()

    async def scenario() -> tuple[str, list[tuple[str, ...]]]:
        sub = Submitter(store, events, {"dryrun": runner}, blobs=None,  # type: ignore[dict-item]
                        runs_dir=tmp_path / "runs", outbox_interval=0.05, metrics_interval=0.05)
        await sub.start()
        try:
            run_id, _ = await sub.submit(workflow=chain(1), options=RunOptions("dryrun"))
            await until(lambda: store.header(run_id).state is RunState.PLANNING, "planning")
            await sub.optimized(run_id, Plan(workflow=chain(1), engine="dryrun"))
            # the three samples of the running step go out without any step change
            await until(lambda: len(events.samples) == 3, "the samples of the running step")
            assert store.header(run_id).state is RunState.RUNNING
            runner.release.set()
            await until(lambda: store.header(run_id).state is RunState.SUCCEEDED, "the end")
            assert await sub.drained(WAIT)
            return run_id, list(events.sent)
        finally:
            await sub.close()

    run_id, sent = run_async(scenario)
    kinds = [e[0] for e in sent]
    assert kinds.count("finished") == 1 and "utilization" not in kinds  # no peak sample
    assert [s.at - 1_700_000_000.0 for s in events.samples] == [0, 1, 2, 3]
    assert all((s.run_id, s.workflow, s.step, s.attempt, s.interval_seconds)
               == (run_id, "chain", "s0", 1, 1.0) for s in events.samples)
    # the last sample is queued with the step's end, before it (and before the run's end)
    last = max(i for i, e in enumerate(sent) if e[0] == "samples")
    assert last < kinds.index("finished")
    assert last < max(i for i, e in enumerate(sent) if e[:4] == ("step", run_id, "s0",
                                                               "succeeded"))


def test_a_single_sample_left_by_an_older_submitter_still_goes_out(
        store: RunStore, tmp_path: Path) -> None:
    from couler_runtime.rpc.records import utilization_sample_to_proto

    store.create_run("r1", RunRequest(chain(1), None, RunOptions("dryrun")))
    row = store.header("r1")
    with store._write() as conn:  # what put_steps queued before the time series
        store._queue(conn, [store._entry(row, EventKind.UTILIZATION, time.time(),
                                         utilization_sample_to_proto(UtilizationSample(
                                             "r1", "chain", "s0", 1.0, 0.5, 1 << 20))
                                         .SerializeToString())])
    events = drain(store, tmp_path)
    assert ("utilization", "r1", "s0") in events.sent
    assert store.outbox_size() == 0 and store.dead_events() == []
