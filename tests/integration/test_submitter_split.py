"""The submitter runs split plans: chunk after chunk, hand-offs filled, crash-safe.

Against a real nats-server and PostgreSQL; steps run for real on the local engine. The
plans come from the real optimizer service (on the same bus, ``COULER_MAX_STEPS_PER_CHUNK``
1, default retry off): every step is a chunk of its own, so each hand-off crosses a chunk
boundary as a ``x--STEP--OUTPUT`` parameter. A chunk whose hand-off the engine did not
report is a unit test of the submitter's chunk runner (tests/unit/test_submitter_chunks.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from couler import ir
from couler.engines.base import StepState
from couler.errors import NotFoundError
from couler.v1 import events_pb2
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import Plan, RunState, plan_from_proto
from tests.integration.test_submitter_service import (
    WAIT,
    RealOptimizer,
    ServiceProcess,
    ServiceThread,
    fresh_database,
    lines,
    optimizer_settings,
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

V = (ir.EnvVar("V", "{{inputs.v}}"),)  # script source takes no placeholders; env values do


def chain(name: str, marker: Path, *, fail_unless: Path | None = None,
          sleep: float = 0, hold: Path | None = None) -> ir.Workflow:
    """a -> b -> c, each reading the previous step's output; every run appends to marker.

    ``b`` fails unless ``fail_unless`` exists, and first sleeps ``sleep`` seconds (a step
    that runs until it is killed) or, with ``hold``, holds until the file ``hold`` exists:
    a barrier the test releases (at most 300 s, then it fails).
    """
    def log(step: str) -> str:
        return f"open({str(marker)!r}, 'a').write({step!r} + '\\n')\n"

    out = (ir.OutputParameter("v", source=ir.OutputSource.STDOUT),)
    gate = "" if fail_unless is None else (
        f"import os, sys\nif not os.path.exists({str(fail_unless)!r}): sys.exit(3)\n")
    a = script("a", log("a") + "print('x')", outputs=out)
    wait = (f"time.sleep({sleep})\n" if hold is None else
            f"deadline = time.monotonic() + 300\n"
            f"while not os.path.exists({str(hold)!r}):\n"
            f"    if time.monotonic() > deadline:\n"
            f"        raise SystemExit('never released')\n"
            f"    time.sleep(0.02)\n")
    b = script("b", "import os, time\n" + log("b") + wait + gate +
               "print(os.environ['V'] + 'y')", env=V,
               inputs=(ir.InputParameter("v", ir.StepOutputRef("a", "v")),), outputs=out,
               dependencies=(ir.Dependency("a"),))
    c = script("c", "import os\n" + log("c") + "print(os.environ['V'] + 'z')", env=V,
               inputs=(ir.InputParameter("v", ir.StepOutputRef("b", "v")),), outputs=out,
               dependencies=(ir.Dependency("b"),))
    return ir.Workflow(name=name, steps=(a, b, c))


@pytest.fixture
def optimizer(nats_server: NatsServer, tmp_path: Path) -> Iterator[RealOptimizer]:
    """The real optimizer, splitting every workflow into chunks of one step."""
    settings = optimizer_settings(nats_server, tmp_path / "optimizer")
    running = RealOptimizer(settings.model_copy(update={"max_steps_per_chunk": 1})).start()
    try:
        yield running
    finally:
        running.stop()


def split_plan(nats_server: NatsServer, run_id: str) -> Plan:
    """The optimizer's (split) plan for ``run_id``."""
    plan = plan_from_proto(planned(nats_server, run_id))
    assert len(plan.chunks) > 1
    return plan


def submitted_events(nats_server: NatsServer, run_id: str) -> int:
    return len(stored(nats_server, "COULER_WORKFLOW", "couler.workflow.submitted",
                      events_pb2.WorkflowSubmitted, run_id))


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("submitter-split")


@pytest.fixture
def client(nats_server: NatsServer, postgres_url: str, state: Path) -> Iterator[CoulerClient]:
    # per test: the crash test runs its own submitter, and instances share the durable
    # consumers, so none may be left running
    svc = ServiceThread(settings_for(nats_server, state, fresh_database(postgres_url))).start()
    try:
        with CoulerClient({"submitter": svc.address}, timeout=WAIT) as c:
            yield c
    finally:
        svc.stop()


@pytest.mark.usefixtures("optimizer")
def test_chunks_run_in_order_and_hand_off_outputs(client: CoulerClient,
                                                  nats_server: NatsServer, state: Path,
                                                  tmp_path: Path) -> None:
    wf = chain(unique("split"), tmp_path / "m")
    sub = client.submitter.submit(wf)
    plan = split_plan(nats_server, sub.run_id)
    assert [c.steps for c in plan.chunks] == [("a",), ("b",), ("c",)]
    run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
    assert run.state is RunState.SUCCEEDED, run.message
    # the value crossed two chunk boundaries as hand-off parameters
    assert run.step("c").outputs == {"v": "xyz"}
    assert {s.name: s.state for s in run.steps} == dict.fromkeys("abc", StepState.SUCCEEDED)
    assert lines(tmp_path / "m") == ["a", "b", "c"]
    # Logs come from the chunk's engine run that ran the step
    assert client.submitter.logs(sub.run_id, "c") == "xyz\n"
    # each chunk was its own engine run; no run of the whole workflow
    runs = state / "runs"
    assert sorted(p.name for p in runs.iterdir() if p.name.startswith(sub.run_id)) == sorted(
        f"{sub.run_id}-{c.name}" for c in plan.chunks)
    assert submitted_events(nats_server, sub.run_id) == 1


@pytest.mark.usefixtures("optimizer")
def test_independent_chunks_run_side_by_side(client: CoulerClient,
                                             nats_server: NatsServer) -> None:
    """Two branches in two chunks, joined by a third: both branch outputs reach the join."""
    out = (ir.OutputParameter("v", source=ir.OutputSource.STDOUT),)
    left = script("left", "print('L')", outputs=out)
    right = script("right", "print('R')", outputs=out)
    join = script("join", "import os\nprint(os.environ['L'] + os.environ['R'])",
                  outputs=out, env=(ir.EnvVar("L", "{{inputs.l}}"), ir.EnvVar("R", "{{inputs.r}}")),
                  inputs=(ir.InputParameter("l", ir.StepOutputRef("left", "v")),
                          ir.InputParameter("r", ir.StepOutputRef("right", "v"))),
                  dependencies=(ir.Dependency("left"), ir.Dependency("right")))
    wf = ir.Workflow(name=unique("fan"), steps=(left, right, join))
    sub = client.submitter.submit(wf)
    plan = split_plan(nats_server, sub.run_id)
    roots = [c for c in plan.chunks if not c.depends_on]
    assert len(roots) == 2  # the branches do not wait for each other
    run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
    assert run.state is RunState.SUCCEEDED, run.message
    assert run.step("join").outputs == {"v": "LR"}


@pytest.mark.usefixtures("optimizer")
def test_a_failed_chunk_stops_the_rest_and_retry_goes_on_from_it(
        client: CoulerClient, nats_server: NatsServer, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    wf = chain(unique("split-fail"), tmp_path / "m", fail_unless=gate)
    sub = client.submitter.submit(wf)
    plan = split_plan(nats_server, sub.run_id)
    run = wait_state(client, sub.run_id, RunState.FAILED, RunState.SUCCEEDED)
    assert run.state is RunState.FAILED
    failed_chunk = next(c.name for c in plan.chunks if "b" in c.steps)
    assert run.message.startswith(f"chunk {failed_chunk}: "), run.message
    assert run.step("a").state is StepState.SUCCEEDED
    assert run.step("b").state is StepState.FAILED
    assert run.step("c").state is StepState.SKIPPED
    assert f"chunk {failed_chunk} failed" in run.step("c").message
    assert lines(tmp_path / "m") == ["a", "b"]

    gate.touch()
    client.submitter.retry(sub.run_id)
    run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
    assert run.state is RunState.SUCCEEDED, run.message
    assert run.retries == 1
    assert run.step("c").outputs == {"v": "xyz"}
    # a's chunk succeeded and was reused; b's retried from its failure point; c ran once
    assert lines(tmp_path / "m") == ["a", "b", "b", "c"]


@pytest.mark.usefixtures("optimizer")
def test_cancel_stops_the_running_chunk_and_starts_no_other(
        client: CoulerClient, nats_server: NatsServer, tmp_path: Path) -> None:
    wf = chain(unique("split-cancel"), tmp_path / "m", sleep=60)
    sub = client.submitter.submit(wf)
    split_plan(nats_server, sub.run_id)
    wait_for("b to start", lambda: "b" in lines(tmp_path / "m"))
    run = client.submitter.cancel(sub.run_id, "enough")
    run = wait_state(client, sub.run_id, RunState.CANCELLED, RunState.FAILED,
                     RunState.SUCCEEDED)
    assert run.state is RunState.CANCELLED, run.message
    assert run.step("b").state is StepState.CANCELLED
    assert run.step("c").state is StepState.SKIPPED
    assert lines(tmp_path / "m") == ["a", "b"]


@pytest.mark.usefixtures("optimizer")
@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_a_restarted_submitter_resumes_a_split_run(nats_server: NatsServer, postgres_url: str,
                                                   tmp_path: Path, how: str) -> None:
    """SIGKILL (a crash) or SIGTERM (a shutdown, which interrupts the running chunk) while
    the second chunk runs: the restarted submitter picks the chunk up (not started twice),
    the first chunk is not run again, and the third follows."""
    env = process_env(nats_server, postgres_url, tmp_path)
    marker, hold = tmp_path / "m", tmp_path / "release"
    wf = chain(unique("split-crash"), marker, hold=hold)
    first = ServiceProcess(env, tmp_path / "submitter.log").start()
    second: ServiceProcess | None = None
    try:
        with CoulerClient({"submitter": first.address}, timeout=WAIT) as client:
            sub = client.submitter.submit(wf)
            plan = split_plan(nats_server, sub.run_id)
            wait_for("b to start", lambda: "b" in lines(marker))
        if how == "sigkill":
            first.kill()
        else:
            first.stop()
            assert first.proc is not None and first.proc.returncode == 0
        runs = tmp_path / "state" / "runs"
        wait_for("b's process to die with the submitter",
                 lambda: not processes_in(runs / f"{sub.run_id}-{plan.chunks[1].name}"))
        hold.touch()  # b, started again by the restarted submitter, runs to its end
        second = ServiceProcess(env, tmp_path / "submitter.log").start()
        with CoulerClient({"submitter": second.address}, timeout=WAIT) as client:
            run = client.submitter.wait(sub.run_id, timeout=WAIT)
        assert run.state is RunState.SUCCEEDED, run.message
        assert run.step("c").outputs == {"v": "xyz"}
        # a ran once; b's interrupted attempt counts, it finished as attempt 2; c once
        assert lines(marker) == ["a", "b", "b", "c"]
        assert run.step("a").attempts == 1
        assert run.step("b").attempts == 2
        assert submitted_events(nats_server, sub.run_id) == 1
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.kill()
        if second is not None:
            second.stop()


def test_logs_of_a_run(client: CoulerClient, nats_server: NatsServer, tmp_path: Path,
                      optimizer: RealOptimizer) -> None:
    """Logs: the step's text from the engine, the end of it when long, clear errors."""
    noisy = script("noisy", "import sys\nprint('x' * 5000)\nprint('oops', file=sys.stderr)")
    wf = ir.Workflow(name=unique("logs"), steps=(noisy,))
    optimizer.stop()  # no plan yet: the run waits for it
    sub = client.submitter.submit(wf)
    with pytest.raises(NotFoundError, match="has not reached its engine"):
        client.submitter.logs(sub.run_id, "noisy")
    optimizer.start()
    run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
    assert run.state is RunState.SUCCEEDED, run.message
    text = client.submitter.logs(sub.run_id, "noisy")
    assert text.startswith("x" * 5000) and "oops" in text  # stdout, then stderr
    tail = client.submitter.logs(sub.run_id, "noisy", max_bytes=10)
    assert len(tail.encode()) <= 10 and "oops" in tail
    with pytest.raises(NotFoundError, match=r"has no step 'nope' \(its steps: noisy\)"):
        client.submitter.logs(sub.run_id, "nope")
    with pytest.raises(NotFoundError, match="run 'run-does-not-exist' does not exist"):
        client.submitter.logs("run-does-not-exist", "noisy")
    dry = client.submitter.submit(wf, engine="dryrun")
    wait_state(client, dry.run_id, RunState.SUCCEEDED, RunState.FAILED)
    with pytest.raises(NotFoundError, match="dry run"):
        client.submitter.logs(dry.run_id, "noisy")
