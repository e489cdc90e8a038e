"""The submitter's outbox against a real nats-server that goes away and comes back.

While NATS is down a run goes on (its steps change in the store and over gRPC Get), its
events wait in the outbox; once NATS is back each of them is stored exactly once, in order
per run -- also when the submitter is SIGKILLed in between and another one drains the
outbox at its start. A graceful stop while NATS is down records nothing about the runs it
interrupts (not failed, not cancelled): the next start resumes them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest

from couler import ir
from couler.engines.base import StepState
from couler.v1 import events_pb2
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState, step_record_from_proto
from couler_submitter.store import RunStore
from tests.integration import test_submitter_service as submitter_service
from tests.integration.test_submitter_service import (
    WAIT,
    ServiceProcess,
    ServiceThread,
    lines,
    marker_workflow,
    planned,
    process_env,
    script,
    settings_for,
    stored,
    unique,
    wait_for,
    wait_state,
)
from tests.servers import NatsServer, processes_in

# the real optimizer plans the runs (tests/integration/test_submitter_service.py)
optimizer = submitter_service.optimizer


@pytest.fixture
def nats_restored(nats_server: NatsServer) -> Iterator[NatsServer]:
    """The session's NATS, started again after the test whatever happened to it."""
    yield nats_server
    if not nats_server.running:
        nats_server.start()


def three_steps(name: str, marker: Path) -> ir.Workflow:
    """a → b → c; ``a`` waits for ``marker`` to exist, so the test decides when it ends."""
    a = script("a", f"import os, time\nwhile not os.path.exists({str(marker)!r}): "
                    "time.sleep(0.05)\nprint('a')")
    b = script("b", "print('b')", dependencies=(ir.Dependency("a"),))
    c = script("c", "print('c')", dependencies=(ir.Dependency("b"),))
    return ir.Workflow(name=name, steps=(a, b, c))


def step_events(nats_server: NatsServer, run_id: str) -> list[tuple[str, str, int]]:
    """``(step, state, attempts)`` of the run's step events in the order JetStream stored
    them; the msg ids are checked to be unique."""
    events = stored(nats_server, "COULER_STEP", "couler.step.>", events_pb2.StepEvent, run_id)
    ids = [h["Nats-Msg-Id"] for _, _, h in events]
    assert len(ids) == len(set(ids)), f"a step event was stored twice: {ids}"
    out = []
    for _, message, _ in events:
        rec = step_record_from_proto(message.step)
        out.append((rec.name, rec.state.value, rec.attempts))
    return out


def assert_once_in_order(events: list[tuple[str, str, int]]) -> None:
    """Each step's events once each, in lifecycle order; the chain's steps in order."""
    counts = collections.Counter(events)
    assert all(n == 1 for n in counts.values()), counts
    steps = [name for name, _, _ in events]
    assert sorted(set(steps), key=steps.index) == ["a", "b", "c"]
    # every event of a step comes before every event of the next one (a chain)
    last_of = {name: max(i for i, s in enumerate(steps) if s == name) for name in "abc"}
    first_of = {name: steps.index(name) for name in "abc"}
    assert last_of["a"] < first_of["b"] and last_of["b"] < first_of["c"]
    for name in "abc":
        states = [state for s, state, _ in events if s == name]
        assert states[-1] == "succeeded" and "succeeded" not in states[:-1], states


def finished_events(nats_server: NatsServer, run_id: str) -> list[events_pb2.WorkflowFinished]:
    return [m for _, m, _ in stored(nats_server, "COULER_WORKFLOW", "couler.workflow.finished",
                                    events_pb2.WorkflowFinished, run_id)]


class TestOutbox:
    @pytest.mark.usefixtures("optimizer")
    def test_a_run_goes_on_while_nats_is_down_and_its_events_follow_once_in_order(
            self, nats_restored: NatsServer, tmp_path: Path) -> None:
        nats_server = nats_restored
        settings = settings_for(nats_server, tmp_path, f"sqlite:///{tmp_path / 's.db'}")
        marker = tmp_path / "go"
        wf = three_steps(unique("outbox"), marker)
        svc = ServiceThread(settings).start()
        try:
            with CoulerClient({"submitter": svc.address}, timeout=WAIT) as client:
                sub = client.submitter.submit(wf)
                planned(nats_server, sub.run_id)
                wait_for("step a running", lambda: client.submitter.get(sub.run_id).state
                         is RunState.RUNNING)
                nats_server.stop()
                marker.touch()  # the run goes on without NATS
                run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
                assert run.state is RunState.SUCCEEDED, run.message
                assert [(s.name, s.state) for s in run.steps] == [
                    ("a", StepState.SUCCEEDED), ("b", StepState.SUCCEEDED),
                    ("c", StepState.SUCCEEDED)]
                # nothing could be published: the events wait in the outbox
                waiting = RunStore(settings.database_url)
                try:
                    assert waiting.outbox_size() > 0
                finally:
                    waiting.close()
                nats_server.start()
                wait_for("the finished event", lambda: finished_events(nats_server,
                                                                       sub.run_id))
            events = step_events(nats_server, sub.run_id)
            assert_once_in_order(events)
            assert ("c", "succeeded", 1) in events
            [finished] = finished_events(nats_server, sub.run_id)
            assert finished.run.step_count == 3 and len(finished.run.steps) == 0
        finally:
            svc.stop()
        store = RunStore(settings.database_url)
        try:
            assert store.outbox_size() == 0 and store.dead_events() == []
        finally:
            store.close()

    @pytest.mark.usefixtures("optimizer")
    def test_a_killed_submitter_loses_no_event(self, nats_restored: NatsServer,
                                               postgres_url: str, tmp_path: Path) -> None:
        nats_server = nats_restored
        env = process_env(nats_server, postgres_url, tmp_path)
        marker = tmp_path / "go"
        wf = three_steps(unique("killed"), marker)
        first = ServiceProcess(env, tmp_path / "submitter.log").start()
        second: ServiceProcess | None = None
        try:
            with CoulerClient({"submitter": first.address}, timeout=WAIT) as client:
                sub = client.submitter.submit(wf)
                planned(nats_server, sub.run_id)
                wait_for("step a running", lambda: client.submitter.get(sub.run_id).state
                         is RunState.RUNNING)
                nats_server.stop()
                marker.touch()
                run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
                assert run.state is RunState.SUCCEEDED, run.message
            first.kill()  # its events are committed, none published
            nats_server.start()
            second = ServiceProcess(env, tmp_path / "submitter.log").start()
            wait_for("the finished event", lambda: finished_events(nats_server, sub.run_id))
            assert_once_in_order(step_events(nats_server, sub.run_id))
            assert len(finished_events(nats_server, sub.run_id)) == 1
        finally:
            if first.proc is not None and first.proc.poll() is None:
                first.kill()
            if second is not None:
                second.stop()
        assert "Traceback" not in (tmp_path / "submitter.log").read_text()

    @pytest.mark.usefixtures("optimizer")
    def test_a_stop_while_nats_is_down_interrupts_runs_without_failing_them(
            self, nats_restored: NatsServer, tmp_path: Path) -> None:
        nats_server = nats_restored
        settings = settings_for(nats_server, tmp_path, f"sqlite:///{tmp_path / 's.db'}")
        marker = tmp_path / "m"
        wf = marker_workflow(unique("down"), marker, sleep=300)
        svc = ServiceThread(settings).start()
        try:
            with CoulerClient({"submitter": svc.address}, timeout=WAIT) as client:
                sub = client.submitter.submit(wf)
                planned(nats_server, sub.run_id)
                wait_for("the second step", lambda: "second-start" in lines(marker))
            nats_server.stop()
        finally:
            svc.stop()
        store = RunStore(settings.database_url)
        try:
            run = store.header(sub.run_id)
            assert run.state is RunState.RUNNING and run.message == ""
            assert store.dead_events() == []
        finally:
            store.close()
        assert processes_in(tmp_path / "runs" / sub.run_id) == []
        nats_server.start()
        marker.write_text("first\n")
        svc = ServiceThread(settings).start()
        try:
            with CoulerClient({"submitter": svc.address}, timeout=WAIT) as client:
                wait_for("the step running again",
                         lambda: lines(marker).count("second-start") == 1)
                client.submitter.cancel(sub.run_id, reason="done testing")
                run = wait_state(client, sub.run_id, RunState.CANCELLED)
        finally:
            svc.stop()
        assert run.step("first").attempts == 1  # not run again
        assert run.message == "cancelled: done testing"
