"""The submitter service against a real nats-server and PostgreSQL (and SQLite).

The service runs as in production -- ``serve(settings, build)`` with its gRPC server on
127.0.0.1:0 and its durable consumers on JetStream -- on an asyncio loop in a thread (the
crash test runs it as a subprocess, ``python -m couler_submitter.main``, and SIGKILLs it).
The tests call it with the blocking ``CoulerClient`` and read what it published from the
JetStream streams (what was stored, duplicates dropped).

The plans come from the real optimizer service (fixture ``optimizer``: in a thread on the
same nats-server, with the default retry policy off so that a step runs once, and without a
cache unless a test gives it the real cache service): it answers the submitter's
``couler.workflow.requested`` as in production, and :func:`planned` waits for its answer.
A text is refused by the real generator (fixture ``generator``, its offline planner).
Steps run for real as local processes. Only one submitter and one optimizer run at a time:
instances share the durable consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc
import nats
import psutil  # type: ignore[import-untyped]
import pytest
from google.protobuf.message import Message
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from couler import ir
from couler.api.handles import SecretMaterial
from couler.engines.base import RunState as EngineRunState
from couler.engines.base import RunStatus, StepState, StepStatus
from couler.errors import CoulerError, NotFoundError, UserError, ValidationError
from couler.optimize.cache_key import workflow_keys
from couler.v1 import common_pb2, events_pb2
from couler_cache.main import CacheSettings
from couler_cache.main import build as build_cache
from couler_generator.main import GeneratorSettings
from couler_generator.main import build as build_generator
from couler_optimizer.main import OptimizerSettings
from couler_optimizer.main import build as build_optimizer
from couler_runtime.blobs import LocalBlobStore
from couler_runtime.bus import Bus
from couler_runtime.client import CoulerClient
from couler_runtime.local.artifacts import digest_path, is_packed_directory
from couler_runtime.rpc.records import (
    CacheEntry,
    Plan,
    Run,
    RunState,
    StepRecord,
    StoredArtifact,
    run_from_proto,
    step_record_from_proto,
)
from couler_runtime.service import READY_PREFIX
from couler_runtime.settings import SettingsError
from couler_submitter.main import SubmitterSettings, build
from couler_submitter.model import RunOptions, RunRequest
from couler_submitter.store import RunStore
from tests.integration.test_argo_adapter import T0 as ARGO_T0
from tests.integration.test_argo_adapter import node as argo_node
from tests.integration.test_argo_adapter import set_status as argo_status
from tests.integration.test_cache_service import _purge_steps as purge_steps
from tests.k8s_fake import FakeKube
from tests.servers import NatsServer, create_database, processes_in
from tests.service_thread import Builder
from tests.service_thread import ServiceThread as RunningService
from tests.workflows import make_and_use

WAIT = 90.0  # a bound on waiting, never an assertion about speed
T = TypeVar("T")
PY = "python:3.12"
# the optimizer's passes, in order (couler.optimize)
PASSES = ["validate", "prune_cached", "substitute_cached", "right_size", "default_retry",
          "split", "compile"]


# ----------------------------------------------------------------------------- harness


def ServiceThread(settings: SubmitterSettings,
                  builder: Builder = build
                  ) -> RunningService[SubmitterSettings]:
    """The submitter service running in a thread (tests/service_thread.py)."""
    return RunningService(settings, builder)


def wait_for(what: str, check: Callable[[], T | None], timeout: float = WAIT) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            got = check()
            if got:
                return got
            deadline.wait(0.05)
    finally:
        timer.cancel()
    raise AssertionError(f"timed out waiting for {what}")


def fresh_database(base_url: str) -> str:
    """A new, empty PostgreSQL database on the session's server; its URL."""
    return create_database(base_url, "submitter")


def settings_for(nats_server: NatsServer, state: Path, database_url: str,
                 **extra: Any) -> SubmitterSettings:
    return SubmitterSettings.load(
        "submitter", nats_url=nats_server.url, grpc_address="127.0.0.1:0", state_dir=state,
        database_url=database_url, artifacts=str(state / "blobs"), auth_token=None,
        otel_endpoint=None, runs_dir=str(state / "runs"), max_workers=4,
        engines="local,dryrun", outbox_interval=1.0,
        bus_insecure=True, **extra)  # the logic on an open bus: see test_bus_security.py


# ----------------------------------------------------------------------------- the bus


async def _publish(url: str, subject: str, message: Message, msg_id: str,
                   headers: dict[str, str] | None) -> None:
    bus = await Bus.connect(url, name="submitter-test")
    try:
        await bus.ensure_streams()
        await bus.publish(subject, message, msg_id=msg_id, headers=headers)
    finally:
        await bus.close()


def publish(nats_server: NatsServer, subject: str, message: Message, msg_id: str,
            headers: dict[str, str] | None = None) -> None:
    asyncio.run(_publish(nats_server.url, subject, message, msg_id, headers))


async def _read(url: str, stream: str, subject: str) -> list[tuple[str, bytes, dict[str, str]]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            subject, stream=stream,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE))
        # Read exactly what the stream held when the consumer was made (no timing guess).
        expected = (await sub.consumer_info()).num_pending or 0
        out: list[tuple[str, bytes, dict[str, str]]] = []
        while len(out) < expected:
            try:
                msgs = await sub.fetch(min(512, expected - len(out)), timeout=WAIT)
            except (nats.errors.TimeoutError, TimeoutError):
                break  # cannot happen while messages are pending; the caller's asserts tell
            out += [(m.subject, m.data, dict(m.headers or {})) for m in msgs]
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


M = TypeVar("M", bound=Message)


def stored(nats_server: NatsServer, stream: str, subject: str, message_type: type[M],
           run_id: str) -> list[tuple[str, M, dict[str, str]]]:
    """The messages the stream holds on ``subject`` about run ``run_id``, in order.

    The session's NATS is shared with other test modules, which publish their own
    message types on the same subjects: only bodies of ``message_type`` are read.
    """
    got = []
    for subj, data, headers in asyncio.run(_read(nats_server.url, stream, subject)):
        if headers.get("couler-event-type") != message_type.DESCRIPTOR.full_name:
            continue
        msg = message_type.FromString(data)
        rid = msg.run.run_id if isinstance(msg, events_pb2.WorkflowFinished) else \
            getattr(msg, "run_id", "")
        if rid == run_id:
            got.append((subj, msg, headers))
    return got


class RealOptimizer:
    """The optimizer service in a thread on the submitter's bus; stopped and started again
    by a test that needs a run requested while no optimizer serves."""

    def __init__(self, settings: OptimizerSettings) -> None:
        self.settings = settings
        self.service: RunningService[OptimizerSettings] | None = None

    def start(self) -> RealOptimizer:
        self.service = RunningService(self.settings, build_optimizer).start()
        return self

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None


def optimizer_settings(nats_server: NatsServer, state: Path, *, cache_address: str = "",
                       **extra: Any) -> OptimizerSettings:
    """The optimizer's settings: no default retry (a failing step here fails once), the
    cache at ``cache_address`` ("" for none: no step is reused), and ``extra``."""
    return OptimizerSettings.load(
        "optimizer", nats_url=nats_server.url, grpc_address="127.0.0.1:0", state_dir=state,
        database_url=f"sqlite:///{state / 'optimizer.db'}", cache_address=cache_address,
        auth_token=None, otel_endpoint=None, default_retry=False, bus_insecure=True, **extra)


@pytest.fixture
def optimizer(nats_server: NatsServer, tmp_path: Path) -> Iterator[RealOptimizer]:
    """The real optimizer, planning what the submitter requests, for one test."""
    running = RealOptimizer(optimizer_settings(nats_server, tmp_path / "optimizer")).start()
    try:
        yield running
    finally:
        running.stop()


class CachedOptimizer:
    """The real cache service (its artifacts: the submitter's store) and an optimizer that
    asks it; ``client`` talks to the cache."""

    def __init__(self, cache: RunningService[CacheSettings], optimizer: RealOptimizer) -> None:
        self.cache = cache
        self.optimizer = optimizer
        self.client = CoulerClient({"cache": cache.address}, timeout=WAIT)

    def entry(self, key: str) -> CacheEntry:
        """The entry of ``key`` once the cache has it (it commits from step events)."""
        def find() -> CacheEntry | None:
            try:
                return self.client.cache.show(key).entry
            except NotFoundError:
                return None

        return wait_for(f"the cache entry {key}", find)


def start_cached_optimizer(nats_server: NatsServer, state: Path, tmp_path: Path
                           ) -> CachedOptimizer:
    """A cache service on the submitter's artifact store (``state / "blobs"``) and an
    optimizer asking it. The cache starts from an empty step stream (the session's NATS
    carries other modules' step events), so that it commits only this test's steps."""
    asyncio.run(purge_steps(nats_server.url))
    cache = RunningService(CacheSettings.load(
        "cache", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
        state_dir=tmp_path / "cache", database_url=f"sqlite:///{tmp_path / 'cache.db'}",
        artifacts=str(state / "blobs"), auth_token=None, otel_endpoint=None,
        bus_insecure=True), build_cache).start()
    try:
        optimizer = RealOptimizer(optimizer_settings(
            nats_server, tmp_path / "optimizer", cache_address=cache.address)).start()
    except BaseException:
        cache.stop()
        raise
    return CachedOptimizer(cache, optimizer)


@pytest.fixture
def cached_optimizer(nats_server: NatsServer, state: Path, tmp_path: Path
                     ) -> Iterator[CachedOptimizer]:
    """The real optimizer asking the real cache, for one test."""
    both = start_cached_optimizer(nats_server, state, tmp_path)
    try:
        yield both
    finally:
        both.client.close()
        both.optimizer.stop()
        both.cache.stop()


GeneratorService = RunningService[GeneratorSettings]


@pytest.fixture
def generator(nats_server: NatsServer, tmp_path: Path) -> Iterator[GeneratorService]:
    """The real generator (its offline planner) answering text requests, for one test."""
    running = RunningService(GeneratorSettings.load(
        "generator", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
        state_dir=tmp_path / "generator", llm_base_url="", llm_model="", auth_token=None,
        otel_endpoint=None, bus_insecure=True), build_generator).start()
    try:
        yield running
    finally:
        running.stop()


def planned(nats_server: NatsServer, run_id: str) -> common_pb2.Plan:
    """The plan the optimizer published for run ``run_id`` (waits for it)."""
    got = wait_for(f"the optimizer's plan for {run_id}", lambda: stored(
        nats_server, "COULER_WORKFLOW", "couler.workflow.optimized",
        events_pb2.WorkflowOptimized, run_id))
    return got[0][1].plan


def deliver_again(nats_server: NatsServer, run_id: str, msg_id: str) -> None:
    """Publish the optimizer's plan for ``run_id`` once more under ``msg_id`` (a delivery
    JetStream does not drop as a duplicate, as after a republish)."""
    [(_, message, headers), *_] = stored(nats_server, "COULER_WORKFLOW",
                                         "couler.workflow.optimized",
                                         events_pb2.WorkflowOptimized, run_id)
    publish(nats_server, "couler.workflow.optimized", message, msg_id,
            {k: v for k, v in headers.items() if k == "traceparent"})


# ----------------------------------------------------------------------------- workflows


def script(name: str, source: str, **kw: Any) -> ir.Step:
    return ir.Step(name=name, body=ir.ScriptSpec(image=PY, source=source), **kw)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def greeting_workflow(name: str) -> ir.Workflow:
    hello = script(
        "hello", "import pathlib, time\ntime.sleep(1)\n"
        "pathlib.Path('/tmp/out/greeting.txt').write_text('hello artifact')\nprint('hello')",
        outputs=(ir.OutputParameter("said", source=ir.OutputSource.STDOUT),),
        output_artifacts=(ir.OutputArtifact("greeting", "/tmp/out/greeting.txt"),))
    shout = ir.Step(
        name="shout", body=ir.ContainerSpec(image="alpine", command=(
            "sh", "-c", "echo {{inputs.x}} | tr a-z A-Z")),
        inputs=(ir.InputParameter("x", ir.StepOutputRef("hello", "said")),),
        outputs=(ir.OutputParameter("loud", source=ir.OutputSource.STDOUT),),
        dependencies=(ir.Dependency("hello"),))
    return ir.Workflow(name=name, steps=(hello, shout))


def declaring(wf: ir.Workflow, *names: str) -> ir.Workflow:
    """``wf`` with string parameters ``names`` (default "") declared."""
    params = tuple(ir.Parameter(n, default=ir.Literal.of("")) for n in names)
    return dataclasses.replace(wf, parameters=(*wf.parameters, *params))


def marker_workflow(name: str, marker: Path, *, second: str = "", sleep: float = 0,
                    gate: Path | None = None) -> ir.Workflow:
    """``first`` appends a line to ``marker``; ``second`` (after it) runs ``second`` code,
    or marks its start and end, between them sleeping ``sleep`` s (a step that runs until
    it is killed) or, with ``gate``, holding until the file ``gate`` exists: a barrier the
    test releases (at most 300 s, then it fails)."""
    first = script("first", f"open({str(marker)!r}, 'a').write('first\\n')\nprint('one')",
                   outputs=(ir.OutputParameter("said", source=ir.OutputSource.STDOUT),))
    hold = (f"time.sleep({sleep})\n" if gate is None else
            f"deadline = time.monotonic() + 300\n"
            f"while not os.path.exists({str(gate)!r}):\n"
            f"    if time.monotonic() > deadline:\n"
            f"        raise SystemExit('never released')\n"
            f"    time.sleep(0.02)\n")
    body = second or (f"import os, time\nopen({str(marker)!r}, 'a').write('second-start\\n')\n"
                      f"{hold}open({str(marker)!r}, 'a').write('second-end\\n')")
    return ir.Workflow(name=name, steps=(
        first, script("second", body, dependencies=(ir.Dependency("first"),))))


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ----------------------------------------------------------------------------- store


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'submitter.db'}"
    url: str = fresh_database(request.getfixturevalue("postgres_url"))
    return url


class TestStore:
    """The run records on SQLite and PostgreSQL."""

    def test_idempotency_key_is_enforced_by_the_database(self, store_url: str) -> None:
        store = RunStore(store_url)
        try:
            wf = greeting_workflow("idem")
            request = RunRequest(wf, None, RunOptions(parameters={"a": "1"}))

            def create(i: int) -> tuple[str, bool]:
                run, created = store.create_run(f"run-{i}", request, idempotency_key="same")
                return run.run_id, created

            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(create, range(16)))
            winners = [rid for rid, created in results if created]
            assert len(winners) == 1
            assert {rid for rid, _ in results} == set(winners)
            run = store.get_run(winners[0])
            assert (run.state, run.workflow, run.revision) == (RunState.ACCEPTED, "idem", 1)
            assert run.parameters == {"a": "1"} and run.idempotency_key == "same"
            assert store.request(run.run_id).workflow == wf
            listed, more = store.list_runs(workflow="idem", limit=10)
            assert [r.run_id for r in listed] == winners and not more
            # Without a key every submit is a run of its own.
            assert store.create_run("run-a", request)[1] and store.create_run("run-b", request)[1]
        finally:
            store.close()

    def test_steps_and_revisions(self, store_url: str) -> None:
        store = RunStore(store_url)
        try:
            run, _ = store.create_run("run-s", RunRequest(None, "some text", RunOptions()))
            assert store.update_run("run-s", expect=(RunState.RUNNING,),
                                    state=RunState.FAILED) is None  # not in that state
            pending = store.update_run("run-s", state=RunState.PENDING, engine_run_id="e1")
            assert pending is not None and pending.revision == run.revision + 1
            rec = StepRecord("a", StepState.SUCCEEDED, attempts=1, outputs={"x": "1"},
                             cache_key="k" * 64, failure_class=None,
                             artifacts={"d": StoredArtifact("sha256:" + "0" * 64, 3, "file:///x")})
            after = store.put_step("run-s", rec, state=RunState.RUNNING, started_at=5.0)
            assert after.state is RunState.RUNNING and after.started_at == 5.0
            assert after.revision == pending.revision + 1
            failed = StepRecord("b", StepState.FAILED, attempts=2, exit_code=1,
                                failure_class=ir.FailureClass.USER,
                                failure_reason="user error: the same exit code 1 and error "
                                               "twice; not retried")
            store.put_step("run-s", failed)
            store.put_step("run-s", rec)  # an update keeps the step's place
            steps = store.get_run("run-s").steps
            assert [s.name for s in steps] == ["a", "b"] and steps == (rec, failed)
            with pytest.raises(NotFoundError, match="run 'nope'"):
                store.get_run("nope")
            tpl = store.put_template("nightly", greeting_workflow("t"), "dryrun")
            assert store.get_template("nightly") == tpl and store.templates() == [tpl]
        finally:
            store.close()


# ----------------------------------------------------------------------------- service


@pytest.fixture(scope="class")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("submitter")


@pytest.fixture(scope="class")
def service(nats_server: NatsServer, postgres_url: str, state: Path) -> Iterator[ServiceThread]:
    svc = ServiceThread(settings_for(nats_server, state, fresh_database(postgres_url))).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="class")
def client(service: ServiceThread) -> Iterator[CoulerClient]:
    with CoulerClient({"submitter": service.address}, timeout=WAIT) as c:
        yield c


def wait_state(client: CoulerClient, run_id: str, *states: RunState) -> Run:
    def check() -> Run | None:
        run = client.submitter.get(run_id)
        return run if run.state in states else None

    return wait_for(f"run {run_id} in {states}", check)


class TestService:
    """Submit → (the test plays the optimizer) → local engine → events, on PostgreSQL."""

    @pytest.mark.usefixtures("optimizer")
    def test_a_workflow_runs_to_success_and_every_step_is_reported(
            self, client: CoulerClient, nats_server: NatsServer, service: ServiceThread,
            state: Path) -> None:
        wf = declaring(greeting_workflow(unique("greet")), "p")
        sub = client.submitter.submit(wf, parameters={"p": "v"})
        assert sub.created
        seen: list[Run] = []
        watcher = threading.Thread(target=lambda: seen.extend(
            client.submitter.watch(sub.run_id, timeout=WAIT)))
        watcher.start()
        plan = planned(nats_server, sub.run_id)
        watcher.join(WAIT)
        run = seen[-1]
        assert run.state is RunState.SUCCEEDED, run.message
        # Watch: the states in order, revisions strictly increasing, RUNNING seen on the way.
        order = [RunState.ACCEPTED, RunState.PLANNING, RunState.PENDING, RunState.RUNNING,
                 RunState.SUCCEEDED]
        ranks = [order.index(r.state) for r in seen]
        assert ranks == sorted(ranks) and RunState.RUNNING in {r.state for r in seen}
        revisions = [r.revision for r in seen]
        assert revisions == sorted(set(revisions))
        # The record.
        assert run.engine == "local" and run.engine_run_id == sub.run_id
        assert run.workflow == wf.name and run.workflow_digest == plan.workflow_digest
        assert run.parameters == {"p": "v"}
        assert [p.name for p in run.passes] == [p.name for p in plan.passes] == PASSES
        assert run.started_at and run.finished_at and run.finished_at >= run.started_at
        hello, shout = run.step("hello"), run.step("shout")
        assert hello.state is StepState.SUCCEEDED and hello.attempts == 1
        assert hello.outputs == {"said": "hello"} and shout.outputs == {"loud": "HELLO"}
        assert len(hello.cache_key) == 64 and not hello.cached
        assert hello.peak_memory_bytes and hello.peak_memory_bytes > 0
        # The output artifact went to the artifact store, content-addressed.
        content = b"hello artifact"
        digest = "sha256:" + hashlib.sha256(content).hexdigest()
        art = hello.artifacts["greeting"]
        assert (art.digest, art.size_bytes) == (digest, len(content))
        blobs = LocalBlobStore(state / "blobs")
        assert blobs.get_bytes("sha256/" + digest.removeprefix("sha256:")) == content
        assert art.uri.startswith("file://")
        # Events: requested, submitted, steps (running and succeeded), metrics, finished.
        requested = stored(nats_server, "COULER_WORKFLOW", "couler.workflow.requested",
                           events_pb2.WorkflowRequested, sub.run_id)
        assert len(requested) == 1
        assert requested[0][2]["Nats-Msg-Id"] == f"{sub.run_id}.requested"
        assert requested[0][1].workflow.name == wf.name
        submitted = stored(nats_server, "COULER_WORKFLOW", "couler.workflow.submitted",
                           events_pb2.WorkflowSubmitted, sub.run_id)
        assert [(m.engine, m.engine_run_id) for _, m, _ in submitted] == [("local", sub.run_id)]
        steps = stored(nats_server, "COULER_STEP", "couler.step.>", events_pb2.StepEvent,
                       sub.run_id)
        by_id = {h["Nats-Msg-Id"]: (s, m) for s, m, h in steps}
        key = f"{sub.run_id}.hello..1.succeeded"
        assert by_id[key][0] == "couler.step.succeeded"
        event = step_record_from_proto(by_id[key][1].step)
        assert event.artifacts["greeting"].digest == digest and event.cache_key
        assert f"{sub.run_id}.shout..1.running" in by_id
        # the submit's trace goes on through the optimizer's plan and the run
        trace_id = requested[0][2]["traceparent"].split("-")[1]
        [(_, _, plan_headers)] = stored(nats_server, "COULER_WORKFLOW",
                                        "couler.workflow.optimized",
                                        events_pb2.WorkflowOptimized, sub.run_id)
        assert plan_headers["traceparent"].split("-")[1] == trace_id
        assert all(h["traceparent"].split("-")[1] == trace_id for _, _, h in steps)
        assert f"{sub.run_id}.shout..1.succeeded" in by_id
        # The cache learns what each entry was computed from: shout read hello's output.
        shouted = step_record_from_proto(by_id[f"{sub.run_id}.shout..1.succeeded"][1].step)
        assert shouted.cache_lineage == (hello.cache_key,)
        assert shouted.started_at and shouted.finished_at  # its cost, for the cache
        batches = stored(nats_server, "COULER_METRICS", "couler.metrics.batch",
                         events_pb2.UtilizationBatch, sub.run_id)
        samples = [m for _, b, _ in batches for m in b.samples]
        assert "hello" in {m.step for m in samples}  # ran a second: sampled
        assert all(m.memory_bytes > 0 and m.attempt == 1 and m.interval_seconds > 0
                   for m in samples)
        assert all(h["Nats-Msg-Id"].startswith(f"{sub.run_id}.metrics.") for _, _, h in batches)
        # the time series replaced the one peak per attempt on couler.metrics.utilization
        assert not stored(nats_server, "COULER_METRICS", "couler.metrics.utilization",
                          common_pb2.UtilizationSample, sub.run_id)
        finished = stored(nats_server, "COULER_WORKFLOW", "couler.workflow.finished",
                          events_pb2.WorkflowFinished, sub.run_id)
        assert len(finished) == 1 and finished[0][2]["Nats-Msg-Id"] == f"{sub.run_id}.finished.0"
        final = run_from_proto(finished[0][1].run)
        # The final record without its steps (they went out as step events), counted.
        assert final.state is RunState.SUCCEEDED and final.steps == ()
        assert final.step_count == 2 and final.revision == run.revision
        # A watch of a finished run yields once and ends.
        assert [r.state for r in client.submitter.watch(sub.run_id)] == [RunState.SUCCEEDED]

    @pytest.mark.usefixtures("optimizer")
    def test_logs_of_a_map_step_name_its_items_and_each_item_has_its_own(
            self, client: CoulerClient, nats_server: NatsServer) -> None:
        wf = ir.Workflow(unique("logs-map"), (ir.Step(
            name="sq", body=ir.ContainerSpec(image="alpine", command=("echo",),
                                             args=("item", "{{item}}")),
            foreach=ir.ForEach(items=(ir.Literal.of("a"), ir.Literal.of("b"),
                                      ir.Literal.of("c")))),))
        sub = client.submitter.submit(wf)
        planned(nats_server, sub.run_id)
        run = client.submitter.wait(sub.run_id, timeout=WAIT)
        assert run.state is RunState.SUCCEEDED, run.message
        assert run.step("sq").attempts == 1  # three items, each run once
        with pytest.raises(UserError, match=r"step 'sq' is a map step: each item has logs of "
                                            r"its own; .*--key KEY; keys: 0, 1, 2\)"):
            client.submitter.logs(sub.run_id, "sq")
        assert client.submitter.logs(sub.run_id, "sq", "1") == "item b\n"

    def test_the_same_idempotency_key_starts_one_run(
            self, client: CoulerClient, nats_server: NatsServer) -> None:
        wf = greeting_workflow(unique("idem"))
        key = unique("key")
        first = client.submitter.submit(wf, idempotency_key=key)
        again = client.submitter.submit(wf, idempotency_key=key)
        assert first.created and not again.created and again.run_id == first.run_id
        assert len(client.submitter.list(workflow=wf.name).runs) == 1
        assert client.submitter.get(first.run_id).idempotency_key == key
        wait_for("the request", lambda: stored(
            nats_server, "COULER_WORKFLOW", "couler.workflow.requested",
            events_pb2.WorkflowRequested, first.run_id))
        assert client.submitter.cancel(first.run_id).state is RunState.CANCELLED

    def test_a_text_request_carries_the_text(self, client: CoulerClient,
                                             nats_server: NatsServer) -> None:
        text = "preprocess data/sales.csv, train a random forest and evaluate it"
        sub = client.submitter.submit(text, constraints=["at most 8 steps"], tenant="acme")
        got = wait_for("the request", lambda: stored(
            nats_server, "COULER_WORKFLOW", "couler.workflow.requested",
            events_pb2.WorkflowRequested, sub.run_id))
        [(_, msg, headers)] = got
        assert msg.WhichOneof("source") == "text" and msg.text == text
        assert msg.options.engine == "local" and list(msg.options.constraints) == [
            "at most 8 steps"]
        assert headers["couler-tenant"] == "acme"
        run = wait_state(client, sub.run_id, RunState.PLANNING)
        assert run.workflow == ""  # known once generated
        # no generator serves here: the run is cancelled, so a later one does not run it
        assert client.submitter.cancel(sub.run_id).state is RunState.CANCELLED

    def test_a_rejected_run_fails_with_the_reason(self, client: CoulerClient,
                                                  nats_server: NatsServer,
                                                  generator: GeneratorService) -> None:
        """The real generator cannot plan the text and says so; the run fails with its
        reason (the issue lines of a rejection: tests/unit/test_submitter_rejection.py)."""
        sub = client.submitter.submit("book me a flight to Paris")
        run = wait_state(client, sub.run_id, RunState.FAILED)
        assert run.message.startswith("rejected by the generator: "), run.message
        assert "cannot plan" in run.message and "book me a flight" in run.message
        [(_, rejected, headers)] = stored(nats_server, "COULER_WORKFLOW",
                                          "couler.workflow.rejected",
                                          events_pb2.WorkflowRejected, sub.run_id)
        assert rejected.stage == "generator" and rejected.reason in run.message
        assert headers["Nats-Msg-Id"] == f"{sub.run_id}.rejected"
        finished = wait_for("finished", lambda: stored(
            nats_server, "COULER_WORKFLOW", "couler.workflow.finished",
            events_pb2.WorkflowFinished, sub.run_id))
        assert run_from_proto(finished[0][1].run).state is RunState.FAILED

    @pytest.mark.usefixtures("optimizer")
    def test_cancel_stops_the_processes(self, client: CoulerClient, nats_server: NatsServer,
                                        state: Path, tmp_path: Path) -> None:
        wf = marker_workflow(unique("sleepy"), tmp_path / "m", sleep=300)
        sub = client.submitter.submit(wf)
        planned(nats_server, sub.run_id)
        run_dir = state / "runs" / sub.run_id
        wait_for("the sleeping step", lambda: "second-start" in lines(tmp_path / "m"))
        procs = wait_for("its process", lambda: processes_in(run_dir))
        run = client.submitter.cancel(sub.run_id, reason="enough")
        run = wait_state(client, sub.run_id, RunState.CANCELLED)
        assert run.message == "cancelled: enough"
        assert run.step("second").state is StepState.CANCELLED
        assert run.step("first").state is StepState.SUCCEEDED
        gone = psutil.wait_procs(procs, timeout=WAIT)[1] == []
        assert gone and processes_in(run_dir) == []
        assert "second-end" not in lines(tmp_path / "m")
        assert client.submitter.cancel(sub.run_id).revision == run.revision  # no-op now

    def test_cancel_before_the_plan_and_the_late_plan_is_ignored(
            self, client: CoulerClient, nats_server: NatsServer, state: Path,
            optimizer: RealOptimizer) -> None:
        wf = greeting_workflow(unique("early"))
        optimizer.stop()  # the optimizer is down: the request waits in the stream
        sub = client.submitter.submit(wf)
        assert client.submitter.cancel(sub.run_id).state is RunState.CANCELLED
        optimizer.start()  # back: it plans the run, and the plan comes late
        planned(nats_server, sub.run_id)
        wait_for("the plan consumed", lambda: _acked(nats_server, "submitter-optimized"))
        assert client.submitter.get(sub.run_id).state is RunState.CANCELLED
        assert not (state / "runs" / sub.run_id).exists()

    @pytest.mark.usefixtures("optimizer")
    def test_retry_resumes_from_the_failure_point(
            self, client: CoulerClient, nats_server: NatsServer, tmp_path: Path) -> None:
        flag = tmp_path / "flag"
        second = (f"import pathlib, sys\nif not pathlib.Path({str(flag)!r}).exists():\n"
                  "    sys.exit('no flag yet')\nprint('two')")
        wf = marker_workflow(unique("retry"), tmp_path / "m", second=second)
        sub = client.submitter.submit(wf)
        planned(nats_server, sub.run_id)
        failed = wait_state(client, sub.run_id, RunState.FAILED, RunState.SUCCEEDED)
        assert failed.state is RunState.FAILED and "second" in failed.message
        assert failed.step("second").failure_class is ir.FailureClass.TRANSIENT
        # which class and why travel with the failure (classified by the local engine)
        assert failed.step("second").failure_reason.startswith(
            "transient: exit code 1, not a known error, seen once")
        assert failed.step("first").attempts == 1
        with pytest.raises(CoulerError) as caught:
            client.submitter.retry(wf.name)  # no such run
        flag.write_text("go")
        retried = client.submitter.retry(sub.run_id)
        assert retried.retries == 1 and not retried.state.terminal
        done = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
        assert done.state is RunState.SUCCEEDED, done.message
        assert done.step("first").attempts == 1  # kept, not run again
        assert lines(tmp_path / "m") == ["first"]
        assert done.step("second").state is StepState.SUCCEEDED
        with pytest.raises(CoulerError) as caught:
            client.submitter.retry(sub.run_id)
        cause = caught.value.__cause__
        assert isinstance(cause, grpc.RpcError)
        assert cause.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "only a failed or cancelled run" in str(caught.value)
        finished = stored(nats_server, "COULER_WORKFLOW", "couler.workflow.finished",
                          events_pb2.WorkflowFinished, sub.run_id)
        assert [h["Nats-Msg-Id"] for _, _, h in finished] == [
            f"{sub.run_id}.finished.0", f"{sub.run_id}.finished.1"]

    def test_a_cached_step_is_restored_from_the_artifact_store(
            self, client: CoulerClient, nats_server: NatsServer, state: Path,
            tmp_path: Path, cached_optimizer: CachedOptimizer) -> None:
        marker = tmp_path / "ran"
        wf = make_and_use(unique("cached"), f"import pathlib\n"
                          f"pathlib.Path({str(marker)!r}).write_text('x')")
        blob = LocalBlobStore(state / "blobs").put_bytes(b"from-cache")
        key = workflow_keys(wf)["make"]
        entry = CacheEntry(key=key, workflow=wf.name, step="make", outputs={"said": "old"},
                           artifacts={"data": StoredArtifact(
                               "sha256:" + blob.removeprefix("sha256/"), 10)})
        assert cached_optimizer.client.cache.commit(entry).created
        sub = client.submitter.submit(wf)
        assert set(planned(nats_server, sub.run_id).cached) == {"make"}  # the cache's entry
        run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
        assert run.state is RunState.SUCCEEDED, run.message
        made = run.step("make")
        assert (made.state, made.cached, made.attempts) == (StepState.CACHED, True, 0)
        assert made.cache_key == key and made.outputs == {"said": "old"}
        assert run.step("use").outputs == {"seen": "from-cache old"}  # downstream sees it
        assert not marker.exists()  # the cached step never ran
        assert not (state / "runs" / ".cache" / sub.run_id).exists()  # fetched copy removed
        events = stored(nats_server, "COULER_STEP", "couler.step.cached",
                        events_pb2.StepEvent, sub.run_id)
        assert [e[1].step.cached for e in events] == [True]

    def test_a_directory_artifact_is_stored_and_restored_from_the_cache(
            self, client: CoulerClient, nats_server: NatsServer, state: Path,
            tmp_path: Path, cached_optimizer: CachedOptimizer) -> None:
        marker = tmp_path / "ran"
        make = script(
            "make", "import pathlib\n"
            f"open({str(marker)!r}, 'a').write('make\\n')\n"
            "root = pathlib.Path('/tmp/out/model')\n"
            "(root / 'tok').mkdir(parents=True, exist_ok=True)\n"
            "(root / 'weights.bin').write_bytes(b'\\x00\\x01' * 64)\n"
            "(root / 'config.json').write_text('{\"layers\": 2}')\n"
            "(root / 'tok' / 'vocab.txt').write_text('a b c')\nprint('trained')",
            outputs=(ir.OutputParameter("said", source=ir.OutputSource.STDOUT),),
            output_artifacts=(ir.OutputArtifact("model", "/tmp/out/model"),))
        use = script(
            "use", "import pathlib\nroot = pathlib.Path('/tmp/in/model')\n"
            "print(' '.join(f'{p.relative_to(root).as_posix()}={p.stat().st_size}'\n"
            "               for p in sorted(root.rglob('*')) if p.is_file()))",
            input_artifacts=(ir.InputArtifact("model", "/tmp/in/model",
                                              ir.StepArtifactRef("make", "model")),),
            outputs=(ir.OutputParameter("seen", source=ir.OutputSource.STDOUT),),
            dependencies=(ir.Dependency("make"),))
        wf = ir.Workflow(name=unique("dirart"), steps=(make, use))
        seen = "config.json=13 tok/vocab.txt=5 weights.bin=128"
        # First run: the directory is packed into the store under the engine's digest of it.
        first = client.submitter.submit(wf)
        planned(nats_server, first.run_id)
        run = wait_state(client, first.run_id, RunState.SUCCEEDED, RunState.FAILED)
        assert run.state is RunState.SUCCEEDED, [(s.name, s.message) for s in run.steps]
        made = run.step("make")
        assert made.cache_key and made.outputs == {"said": "trained"}
        art = made.artifacts["model"]
        kept = state / "runs" / first.run_id / "artifacts" / "make" / "model"
        assert kept.is_dir() and art.digest == digest_path(kept)
        blobs = LocalBlobStore(state / "blobs")
        key = "sha256/" + art.digest.removeprefix("sha256:")
        assert blobs.size(key) == art.size_bytes
        blob = tmp_path / "blob.tar"
        blobs.get_to_file(key, blob)
        assert is_packed_directory(blob)
        used = run.step("use")
        assert used.outputs == {"seen": seen} and used.cache_key
        assert lines(marker) == ["make"]
        # The cache committed both steps from their events; "use" is evicted, so that the
        # second run reuses "make" only.
        entry = cached_optimizer.entry(made.cache_key)
        assert entry.artifacts["model"].digest == art.digest
        cached_optimizer.entry(used.cache_key)
        assert cached_optimizer.client.cache.evict([used.cache_key]).evicted == (
            used.cache_key,)
        # Second run: the plan marks "make" cached; the directory comes back from the store.
        second = client.submitter.submit(wf)
        assert set(planned(nats_server, second.run_id).cached) == {"make"}
        again = wait_state(client, second.run_id, RunState.SUCCEEDED, RunState.FAILED)
        assert again.state is RunState.SUCCEEDED, [(s.name, s.message) for s in again.steps]
        cached = again.step("make")
        assert (cached.state, cached.cached, cached.attempts) == (StepState.CACHED, True, 0)
        assert lines(marker) == ["make"]  # the cached step never ran
        restored = state / "runs" / second.run_id / "artifacts" / "make" / "model"
        assert restored.is_dir() and digest_path(restored) == art.digest
        assert (restored / "tok" / "vocab.txt").read_text() == "a b c"
        # Downstream sees both files and the subdirectory, and gets the same cache key.
        assert again.step("use").outputs == {"seen": seen}
        assert again.step("use").cache_key == used.cache_key
        assert not (state / "runs" / ".cache" / second.run_id).exists()  # fetched copy removed

    def test_map_items_are_committed_and_reused_item_by_item(
            self, client: CoulerClient, nats_server: NatsServer, state: Path,
            tmp_path: Path, cached_optimizer: CachedOptimizer) -> None:
        """Each succeeded item is stored with its artifact and goes to the cache as an entry of
        its own; a plan that reuses two of three items runs only the third."""
        marker = tmp_path / "ran"
        sq = script(
            "sq", "import pathlib, sys\nn = int(sys.argv[1])\n"
            f"open({str(marker)!r}, 'a').write(f'{{n}}\\n')\n"
            "pathlib.Path('/tmp/out/sq.txt').write_text(str(n * n))\nprint(n * n)",
            inputs=(ir.InputParameter("n", ir.ItemRef()),),
            foreach=ir.ForEach(items=tuple(ir.Literal.of(i) for i in (2, 3, 4))),
            outputs=(ir.OutputParameter("out", source=ir.OutputSource.STDOUT),),
            output_artifacts=(ir.OutputArtifact("sq", "/tmp/out/sq.txt"),))
        sq = dataclasses.replace(sq, body=dataclasses.replace(sq.body, args=("{{inputs.n}}",)))
        wf = ir.Workflow(name=unique("sweep"), steps=(sq,))
        first = client.submitter.submit(wf)
        planned(nats_server, first.run_id)
        run = wait_state(client, first.run_id, RunState.SUCCEEDED, RunState.FAILED)
        assert run.state is RunState.SUCCEEDED, [(s.name, s.message) for s in run.steps]
        items = [run.step("sq", str(i)) for i in range(3)]
        assert all(len(i.cache_key) == 64 and not i.cached for i in items)
        blobs = LocalBlobStore(state / "blobs")
        for item, value in zip(items, ("4", "9", "16"), strict=True):
            digest = item.artifacts["sq"].digest  # each item's own artifact, stored
            assert blobs.get_bytes("sha256/" + digest.removeprefix("sha256:")) == value.encode()
        events = stored(nats_server, "COULER_STEP", "couler.step.succeeded",
                        events_pb2.StepEvent, first.run_id)
        committed = {(e[1].step.key, e[1].step.cache_key) for e in events if e[1].step.key}
        assert committed == {(i.key, i.cache_key) for i in items}  # what the cache consumes
        assert sorted(lines(marker)) == ["2", "3", "4"]

        # The cache committed each item from its event; item 1's entry is evicted, so the
        # plan reuses items 0 and 2 (as the optimizer names them): only item 1 runs.
        for item in items:
            assert cached_optimizer.entry(item.cache_key).artifacts["sq"] == item.artifacts["sq"]
        assert cached_optimizer.client.cache.evict([items[1].cache_key]).evicted == (
            items[1].cache_key,)
        second = client.submitter.submit(wf)
        assert set(planned(nats_server, second.run_id).cached) == {
            f"sq[{items[0].key}]", f"sq[{items[2].key}]"}
        again = wait_state(client, second.run_id, RunState.SUCCEEDED, RunState.FAILED)
        assert again.state is RunState.SUCCEEDED, [(s.name, s.message) for s in again.steps]
        assert sorted(lines(marker)) == ["2", "3", "3", "4"]  # item 1 (value 3) ran again
        assert [(again.step("sq", k).cached, again.step("sq", k).attempts)
                for k in ("0", "1", "2")] == [(True, 0), (False, 1), (True, 0)]
        assert again.step("sq").outputs == run.step("sq").outputs  # as if every item ran
        assert json.loads(again.step("sq").outputs["out"]) == ["4", "9", "16"]
        restored = state / "runs" / second.run_id / "artifacts" / "sq[2]" / "sq"
        assert restored.read_text() == "16"  # the hit's artifact, from the store
        assert not (state / "runs" / ".cache" / second.run_id).exists()  # fetched copy removed

    @pytest.mark.usefixtures("optimizer")
    def test_a_redelivered_plan_starts_nothing_twice(
            self, client: CoulerClient, nats_server: NatsServer, state: Path,
            tmp_path: Path) -> None:
        gate = tmp_path / "release"
        wf = marker_workflow(unique("twice"), tmp_path / "m", gate=gate)
        sub = client.submitter.submit(wf)
        planned(nats_server, sub.run_id)
        wait_for("the second step", lambda: "second-start" in lines(tmp_path / "m"))
        deliver_again(nats_server, sub.run_id, f"{sub.run_id}.optimized.again")
        wait_for("the redelivered plan consumed",
                 lambda: _acked(nats_server, "submitter-optimized"))
        gate.touch()  # the redelivery arrived while the run was running
        run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
        deliver_again(nats_server, sub.run_id, f"{sub.run_id}.optimized.late")
        wait_for("the plans consumed", lambda: _acked(nats_server, "submitter-optimized"))
        assert run.state is RunState.SUCCEEDED
        assert lines(tmp_path / "m") == ["first", "second-start", "second-end"]
        assert [p.name for p in (state / "runs").iterdir() if p.name == sub.run_id] == [
            sub.run_id]
        assert client.submitter.get(sub.run_id).revision == run.revision
        submitted = stored(nats_server, "COULER_WORKFLOW", "couler.workflow.submitted",
                           events_pb2.WorkflowSubmitted, sub.run_id)
        assert len(submitted) == 1

    @pytest.mark.usefixtures("optimizer")
    def test_engines_not_configured_and_dry_runs(self, client: CoulerClient,
                                                 nats_server: NatsServer, state: Path) -> None:
        wf = greeting_workflow(unique("argo"))
        sub = client.submitter.submit(wf, engine="argo")
        planned(nats_server, sub.run_id)
        run = wait_state(client, sub.run_id, RunState.FAILED)
        assert "engine 'argo' is not configured" in run.message
        assert "COULER_ENGINES" in run.message
        dry = client.submitter.submit(wf, engine="dryrun")
        planned(nats_server, dry.run_id)
        run = wait_state(client, dry.run_id, RunState.SUCCEEDED, RunState.FAILED)
        assert run.state is RunState.SUCCEEDED
        assert {s.name: s.state for s in run.steps} == {"hello": StepState.SUCCEEDED,
                                                         "shout": StepState.SUCCEEDED}
        assert not (state / "runs" / dry.run_id).exists()  # nothing ran
        plan_only = client.submitter.submit(wf, dry_run=True)
        planned(nats_server, plan_only.run_id)
        run = wait_state(client, plan_only.run_id, RunState.SUCCEEDED)
        assert run.dry_run and run.steps == () and "not run" in run.message
        with pytest.raises(ValidationError):
            client.submitter.submit(ir.Workflow(name="bad", steps=(
                script("a", "print(1)", dependencies=(ir.Dependency("missing"),)),)))
        with pytest.raises(CoulerError, match="engine 'nomad' is unknown"):
            client.submitter.submit(wf, engine="nomad")
        # parameter values are checked before anything is accepted
        with pytest.raises(ValidationError, match=r"field 'parameters\.envv': no such parameter"):
            client.submitter.submit(wf, parameters={"envv": "prod"})
        with pytest.raises(NotFoundError, match="template 'nope'"):
            client.submitter.submit(template="nope")

    def test_launch_a_template_twice_with_one_key_starts_one_run(
            self, client: CoulerClient, nats_server: NatsServer, service: ServiceThread) -> None:
        name = unique("nightly")
        wf = declaring(greeting_workflow(name), "d")
        tpl = client.submitter.register_template(name, wf, engine="dryrun")
        assert tpl.workflow_digest == ir.digest(wf)
        assert name in {t.name for t in client.submitter.list_templates()}
        launch = events_pb2.LaunchRequest(idempotency_key="2026-11-30", parameters={"d": "1"})
        subject = f"couler.launch.{name}"
        publish(nats_server, subject, launch, f"launch.{name}.2026-11-30")
        # A second delivery the stream does not drop (another msg id): still one run.
        publish(nats_server, subject, launch, f"launch.{name}.2026-11-30.again")
        wait_for("the launches consumed", lambda: _acked(nats_server, "submitter-launch"))
        runs = client.submitter.list(workflow=name).runs
        assert len(runs) == 1
        assert runs[0].template == name and runs[0].engine == "dryrun"
        assert runs[0].idempotency_key == f"launch.{name}.2026-11-30"
        assert runs[0].parameters == {"d": "1"}
        # An unknown template is terminated, and why is recorded.
        publish(nats_server, "couler.launch.no-such-template", events_pb2.LaunchRequest(),
                unique("launch"))
        store = RunStore(service.settings.database_url)
        try:
            reasons = wait_for("the rejection", lambda: [
                r for r in store.rejections() if r[1] == "couler.launch.no-such-template"])
        finally:
            store.close()
        assert "template 'no-such-template' is not registered" in reasons[0][3]

    def test_list_pages_and_filters(self, client: CoulerClient) -> None:
        wf = greeting_workflow(unique("paged"))
        ids = [client.submitter.submit(wf).run_id for _ in range(3)]
        first = client.submitter.list(workflow=wf.name, page_size=2)
        assert len(first.runs) == 2 and first.next_page_token
        rest = client.submitter.list(workflow=wf.name, page_size=2,
                                     page_token=first.next_page_token)
        assert rest.next_page_token == ""
        assert [r.run_id for r in first.runs + rest.runs] == list(reversed(ids))
        client.submitter.cancel(ids[0])
        cancelled = client.submitter.list(workflow=wf.name, states=[RunState.CANCELLED])
        assert [r.run_id for r in cancelled.runs] == [ids[0]]


    @pytest.mark.usefixtures("optimizer")
    def test_a_nats_restart_mid_run_loses_nothing(
            self, client: CoulerClient, nats_server: NatsServer, tmp_path: Path) -> None:
        gate = tmp_path / "release"
        wf = marker_workflow(unique("restart"), tmp_path / "m", gate=gate)
        sub = client.submitter.submit(wf)
        planned(nats_server, sub.run_id)
        wait_for("the second step", lambda: "second-start" in lines(tmp_path / "m"))
        nats_server.restart()  # the store directory is kept; clients reconnect
        gate.touch()  # the second step ends after the restart
        run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
        assert run.state is RunState.SUCCEEDED, run.message
        assert lines(tmp_path / "m") == ["first", "second-start", "second-end"]
        finished = wait_for("finished", lambda: stored(
            nats_server, "COULER_WORKFLOW", "couler.workflow.finished",
            events_pb2.WorkflowFinished, sub.run_id))
        assert len(finished) == 1
        ids = {h["Nats-Msg-Id"] for _, _, h in stored(
            nats_server, "COULER_STEP", "couler.step.>", events_pb2.StepEvent, sub.run_id)}
        assert {f"{sub.run_id}.first..1.succeeded",
                f"{sub.run_id}.second..1.succeeded"} <= ids


def _acked(nats_server: NatsServer, durable: str) -> bool:
    async def check() -> bool:
        nc = await nats.connect(nats_server.url)
        try:
            stream = "COULER_LAUNCH" if durable == "submitter-launch" else "COULER_WORKFLOW"
            info = await nc.jetstream().consumer_info(stream, durable)
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)
        finally:
            await nc.close()

    return asyncio.run(check())


# ----------------------------------------------------------------------------- SQLite


class TestOnSQLite:
    """The embedded default: the same flow on SQLite."""

    @pytest.mark.usefixtures("optimizer")
    def test_runs_on_sqlite(self, nats_server: NatsServer, tmp_path: Path) -> None:
        svc = ServiceThread(settings_for(nats_server, tmp_path,
                                         f"sqlite:///{tmp_path / 'submitter.db'}")).start()
        try:
            with CoulerClient({"submitter": svc.address}, timeout=WAIT) as client:
                wf = greeting_workflow(unique("lite"))
                sub = client.submitter.submit(wf)
                planned(nats_server, sub.run_id)
                run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
                assert run.state is RunState.SUCCEEDED, run.message
                assert run.step("shout").outputs == {"loud": "HELLO"}
        finally:
            svc.stop()

    def test_start_up_finishes_what_a_previous_process_left(
            self, nats_server: NatsServer, tmp_path: Path) -> None:
        """An ACCEPTED run is requested again; a PENDING run the engine never got starts."""
        url = f"sqlite:///{tmp_path / 'submitter.db'}"
        store = RunStore(url)
        wf = greeting_workflow(unique("left"))
        accepted, pending = unique("run-accepted"), unique("run-pending")
        try:
            store.create_run(accepted, RunRequest(wf, None, RunOptions()))
            store.create_run(pending, RunRequest(wf, None, RunOptions()))
            store.update_run(pending, state=RunState.PENDING, engine_run_id=pending,
                             plan=Plan(workflow=wf, engine="local"))
        finally:
            store.close()
        svc = ServiceThread(settings_for(nats_server, tmp_path, url)).start()
        try:
            with CoulerClient({"submitter": svc.address}, timeout=WAIT) as client:
                assert wait_state(client, accepted, RunState.PLANNING)
                [(_, msg, headers)] = stored(nats_server, "COULER_WORKFLOW",
                                             "couler.workflow.requested",
                                             events_pb2.WorkflowRequested, accepted)
                assert msg.workflow.name == wf.name
                assert headers["Nats-Msg-Id"] == f"{accepted}.requested"
                run = wait_state(client, pending, RunState.SUCCEEDED, RunState.FAILED)
                assert run.state is RunState.SUCCEEDED, run.message
                assert run.step("shout").outputs == {"loud": "HELLO"}
                client.submitter.cancel(accepted)
        finally:
            svc.stop()


    @pytest.mark.usefixtures("optimizer")
    def test_a_graceful_stop_interrupts_and_the_next_start_resumes(
            self, nats_server: NatsServer, tmp_path: Path) -> None:
        settings = settings_for(nats_server, tmp_path, f"sqlite:///{tmp_path / 's.db'}")
        marker = tmp_path / "m"
        wf = marker_workflow(unique("graceful"), marker, sleep=300)
        svc = ServiceThread(settings).start()
        try:
            with CoulerClient({"submitter": svc.address}, timeout=WAIT) as client:
                sub = client.submitter.submit(wf)
                planned(nats_server, sub.run_id)
                wait_for("the second step", lambda: "second-start" in lines(marker))
            run_dir = tmp_path / "runs" / sub.run_id
            procs = processes_in(run_dir)
            assert procs
        finally:
            svc.stop()
        # No step process outlives the service, and the run is not taken as cancelled.
        assert psutil.wait_procs(procs, timeout=WAIT)[1] == []
        store = RunStore(settings.database_url)
        try:
            assert store.get_run(sub.run_id).state is RunState.RUNNING
        finally:
            store.close()
        marker.write_text("first\n")  # forget the interrupted attempt's line
        svc = ServiceThread(settings).start()
        try:
            with CoulerClient({"submitter": svc.address}, timeout=WAIT) as client:
                wait_for("the step running again",
                         lambda: lines(marker).count("second-start") == 1 and
                         processes_in(run_dir))
                run = client.submitter.cancel(sub.run_id, reason="done testing")
                run = wait_state(client, sub.run_id, RunState.CANCELLED)
        finally:
            svc.stop()
        assert lines(marker).count("first") == 1  # succeeded before the stop: not run again
        assert run.step("first").attempts == 1
        assert run.step("second").state is StepState.CANCELLED


class RecordingAdapter:
    """A remote engine behind the EngineAdapter protocol (the real adapters are tested
    against their engines): records what it was given and reports each step of the
    workflow it got as a remote engine does -- running, then succeeded with every declared
    output ("hi") -- and the run with them."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, str | None]] = []
        self._workflows: dict[str, ir.Workflow] = {}

    def submit(self, wf: ir.Workflow, secrets: Sequence[SecretMaterial] = (), *,
               idempotency_key: str | None = None) -> str:
        self.submitted.append((wf.name, idempotency_key))
        run_id = f"remote-{idempotency_key}"
        self._workflows[run_id] = wf
        return run_id

    def status(self, run_id: str) -> RunStatus:
        return list(self.watch(run_id))[-1]

    def watch(self, run_id: str, timeout: float | None = None) -> Iterator[RunStatus]:
        steps = self._workflows[run_id].steps
        yield RunStatus(run_id, "remote", EngineRunState.RUNNING, tuple(
            StepStatus(s.name, StepState.RUNNING, attempts=1, started_at=1.0) for s in steps))
        yield RunStatus(run_id, "remote", EngineRunState.SUCCEEDED, tuple(
            StepStatus(s.name, StepState.SUCCEEDED, attempts=1, started_at=1.0,
                       finished_at=2.0, outputs={o.name: "hi" for o in s.outputs})
            for s in steps), 1.0, 2.0)

    def logs(self, run_id: str, step: str, key: str = "") -> str:
        return ""

    def cancel(self, run_id: str) -> None:
        return None


@contextlib.contextmanager
def argo_submitter(nats_server: NatsServer, tmp_path: Path
                   ) -> Iterator[tuple[FakeKube, CoulerClient]]:
    """A submitter configured from settings with COULER_ENGINES=local,argo and
    COULER_KUBE_HOST/TOKEN, so that it builds the real ArgoAdapter. No Kubernetes runs here:
    tests/k8s_fake.py speaks the endpoints used, and the test plays the Argo controller by
    writing the Workflow's status."""
    with FakeKube(token="secret-t") as kube:
        settings = settings_for(nats_server, tmp_path, f"sqlite:///{tmp_path / 's.db'}")
        settings = SubmitterSettings.load("submitter", **{
            **settings.model_dump(exclude={"service"}), "engines": "local,argo",
            "kube_host": kube.url, "kube_token": "secret-t", "argo_namespace": "argo"})
        svc = ServiceThread(settings).start()
        try:
            with CoulerClient({"submitter": svc.address}, timeout=WAIT) as client:
                yield kube, client
        finally:
            svc.stop()


def hooked_workflow(name: str) -> ir.Workflow:
    """work -> after; exit hooks ``always`` (on any status) and ``mourn`` (on failure)."""
    return ir.Workflow(
        name=name, steps=(script("work", "print('work')"),
                          script("after", "print('after')",
                                 dependencies=(ir.Dependency("work"),))),
        exit_hooks=(ir.ExitHook(ir.RunStatus.ANY, (script("always", "print('bye')"),)),
                    ir.ExitHook(ir.RunStatus.FAILED, (script("mourn", "print('sad')"),))))


def step_events(nats_server: NatsServer, run_id: str) -> dict[str, StepRecord]:
    """The step events published about ``run_id``, by Nats-Msg-Id, once its ``finished``
    event is out (a step event of the run is queued before it)."""
    wait_for("the finished event", lambda: stored(
        nats_server, "COULER_WORKFLOW", "couler.workflow.finished",
        events_pb2.WorkflowFinished, run_id))
    return {h["Nats-Msg-Id"]: step_record_from_proto(m.step) for _, m, h in stored(
        nats_server, "COULER_STEP", "couler.step.>", events_pb2.StepEvent, run_id)}


class TestAdapters:
    """Remote engines plug in as EngineAdapters; unknown engine settings are refused."""

    @pytest.mark.usefixtures("optimizer")
    def test_a_plugged_in_adapter_runs_the_plan(self, nats_server: NatsServer,
                                                tmp_path: Path) -> None:
        adapter = RecordingAdapter()
        settings = settings_for(nats_server, tmp_path, f"sqlite:///{tmp_path / 's.db'}")
        settings = settings.model_copy(update={"engines": "local,argo"})
        svc = ServiceThread(settings, functools.partial(build, adapters={"argo": adapter}))
        svc.start()
        try:
            with CoulerClient({"submitter": svc.address}, timeout=WAIT) as client:
                wf = greeting_workflow(unique("remote"))
                sub = client.submitter.submit(wf, engine="argo")
                planned(nats_server, sub.run_id)
                run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
                assert run.state is RunState.SUCCEEDED, run.message
                assert adapter.submitted == [(wf.name, sub.run_id)]  # the run id as key
                assert run.engine_run_id == f"remote-{sub.run_id}"
                assert {s.name: (s.state, s.outputs) for s in run.steps} == {
                    "hello": (StepState.SUCCEEDED, {"said": "hi"}),
                    "shout": (StepState.SUCCEEDED, {"loud": "hi"})}
                with pytest.raises(NotFoundError):
                    list(client.submitter.watch("run-unknown"))
        finally:
            svc.stop()

    @pytest.mark.usefixtures("optimizer")
    def test_argo_configured_from_settings_runs_through_the_kubernetes_api(
            self, nats_server: NatsServer, tmp_path: Path) -> None:
        """COULER_ENGINES=local,argo with COULER_KUBE_HOST/TOKEN: the submitter builds the
        real ArgoAdapter (see :func:`argo_submitter`)."""
        with argo_submitter(nats_server, tmp_path) as (kube, client):
            wf = ir.Workflow(name=unique("argo"), steps=(script(
                "hello", "print('hi')",
                outputs=(ir.OutputParameter("said", source=ir.OutputSource.STDOUT),)),))
            sub = client.submitter.submit(wf, engine="argo")
            planned(nats_server, sub.run_id)
            (name,) = wait_for("the Workflow object", lambda: kube.names("workflows", "argo"))
            obj = kube.get("workflows", "argo", name)
            annotations = obj["metadata"]["annotations"]
            assert annotations["couler.io/idempotency-key"] == sub.run_id
            nodes = {n["id"]: n for n in (
                argo_node(name, name, name, "DAG", "Succeeded", children=(f"{name}-1",),
                          finished=ARGO_T0),
                argo_node(name, f"{name}-1", "hello", "Pod", "Succeeded", finished=ARGO_T0,
                          outputs={"parameters": [{"name": "said", "value": "hi"}],
                                   "exitCode": "0"}))}
            kube.update("workflows", "argo", name, argo_status("Succeeded", nodes))
            run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
            assert run.state is RunState.SUCCEEDED, run.message
            assert run.engine == "argo" and run.engine_run_id == name
            assert run.step("hello").outputs == {"said": "hi"}

    @pytest.mark.parametrize("argo_reports_it", [False, True],
                             ids=["hook-not-reported", "hook-reported-skipped"])
    @pytest.mark.usefixtures("optimizer")
    def test_an_exit_hook_that_did_not_fire_on_argo_is_recorded_skipped_saying_why(
            self, nats_server: NatsServer, tmp_path: Path, argo_reports_it: bool) -> None:
        """The run succeeds, so the hook ``on failed`` does not fire. Argo reports such a
        hook as a Skipped node of the exit handler ("when 'Succeeded == Failed' evaluated
        false"): that record stands as Argo gave it. An engine that reports nothing for it
        (KFP, or an Argo that never ran the handler) leaves it to the submitter, which
        records it SKIPPED with the local engine's words when the run ends, and publishes
        the step event. The hook that did fire keeps what Argo reported."""
        with argo_submitter(nats_server, tmp_path) as (kube, client):
            wf = hooked_workflow(unique("argo-hooks"))
            sub = client.submitter.submit(wf, engine="argo")
            planned(nats_server, sub.run_id)
            (name,) = wait_for("the Workflow object", lambda: kube.names("workflows", "argo"))
            exit_id = f"{name}-exit"
            nodes = [
                argo_node(name, name, name, "DAG", "Succeeded", children=(f"{name}-1",),
                          finished=ARGO_T0),
                argo_node(name, f"{name}-1", "work", "Pod", "Succeeded", finished=ARGO_T0,
                          children=(f"{name}-2",), outputs={"exitCode": "0"}),
                argo_node(name, f"{name}-2", "after", "Pod", "Succeeded", finished=ARGO_T0,
                          outputs={"exitCode": "0"}),
                argo_node(name, exit_id, "onExit", "DAG", "Succeeded", finished=ARGO_T0,
                          children=(f"{name}-3",)),
                argo_node(name, f"{name}-3", "always", "Pod", "Succeeded", boundary=exit_id,
                          finished=ARGO_T0, outputs={"result": "bye", "exitCode": "0"})]
            if argo_reports_it:
                nodes.append(argo_node(
                    name, f"{name}-4", "mourn", "Skipped", "Skipped", boundary=exit_id,
                    started=None, finished=ARGO_T0,
                    message="when 'Succeeded == Failed' evaluated false"))
            kube.update("workflows", "argo", name,
                        argo_status("Succeeded", {n["id"]: n for n in nodes},
                                    finishedAt=ARGO_T0))
            run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
            assert run.state is RunState.SUCCEEDED, run.message
            why = ("when 'Succeeded == Failed' evaluated false" if argo_reports_it
                   else "exit hook on failed did not fire: the run succeeded")
            mourn = run.step("mourn")
            assert (mourn.state, mourn.message, mourn.attempts) == (StepState.SKIPPED, why, 0)
            assert mourn.finished_at is not None and mourn.started_at is None
            always = run.step("always")
            assert (always.state, always.attempts, always.outputs) == (
                StepState.SUCCEEDED, 1, {"result": "bye"})
            assert {s.name: s.state for s in run.steps} == {
                "work": StepState.SUCCEEDED, "after": StepState.SUCCEEDED,
                "always": StepState.SUCCEEDED, "mourn": StepState.SKIPPED}
            events = step_events(nats_server, sub.run_id)
            published = events[f"{sub.run_id}.mourn..0.skipped"]
            assert (published.state, published.message) == (StepState.SKIPPED, why)
            assert events[f"{sub.run_id}.always..1.succeeded"].outputs == {"result": "bye"}
            assert not any(".always." in k and k.endswith(".skipped") for k in events)

    @pytest.mark.usefixtures("optimizer")
    def test_a_cancelled_argo_run_records_what_never_ran(self, nats_server: NatsServer,
                                                         tmp_path: Path) -> None:
        """Cancel terminates the Argo workflow (``spec.shutdown: Terminate``): the running
        step fails, the step after it never gets a node and no exit handler runs. Those
        steps end CANCELLED and the hooks SKIPPED ("did not fire: the run was cancelled"),
        as on the local engine, and their step events are published."""
        with argo_submitter(nats_server, tmp_path) as (kube, client):
            wf = hooked_workflow(unique("argo-cancel"))
            sub = client.submitter.submit(wf, engine="argo")
            planned(nats_server, sub.run_id)
            (name,) = wait_for("the Workflow object", lambda: kube.names("workflows", "argo"))
            root = argo_node(name, name, name, "DAG", "Running", children=(f"{name}-1",))
            work = argo_node(name, f"{name}-1", "work", "Pod", "Running")
            kube.update("workflows", "argo", name,
                        argo_status("Running", {n["id"]: n for n in (root, work)}))
            wait_for("work running", lambda: client.submitter.get(sub.run_id).steps)
            with ThreadPoolExecutor(1) as pool:  # Cancel waits for the engine to stop
                cancelling = pool.submit(client.submitter.cancel, sub.run_id, reason="enough")
                wait_for("the terminate patch", lambda: kube.get(
                    "workflows", "argo", name)["spec"].get("shutdown") == "Terminate")
                root = {**root, "phase": "Failed", "finishedAt": ARGO_T0}
                work = {**work, "phase": "Failed", "finishedAt": ARGO_T0,
                        "message": "Stopped with strategy 'Terminate'"}
                kube.update("workflows", "argo", name, argo_status(
                    "Failed", {n["id"]: n for n in (root, work)}, finishedAt=ARGO_T0,
                    message="Stopped with strategy 'Terminate'"))
                cancelling.result(WAIT)
            run = wait_state(client, sub.run_id, RunState.CANCELLED)
            assert run.message == "cancelled: enough"
            got = {s.name: (s.state, s.message) for s in run.steps}
            assert got == {
                "work": (StepState.CANCELLED, "Stopped with strategy 'Terminate'"),
                "after": (StepState.CANCELLED, "not run by argo: the run was cancelled"),
                "always": (StepState.SKIPPED,
                           "exit hook on any did not fire: the run was cancelled"),
                "mourn": (StepState.SKIPPED,
                          "exit hook on failed did not fire: the run was cancelled")}
            events = step_events(nats_server, sub.run_id)
            assert events[f"{sub.run_id}.after..0.cancelled"].message == got["after"][1]
            assert events[f"{sub.run_id}.always..0.skipped"].message == got["always"][1]
            assert events[f"{sub.run_id}.mourn..0.skipped"].message == got["mourn"][1]

    def test_unknown_engines_in_the_settings_are_refused(self) -> None:
        with pytest.raises(SettingsError, match="COULER_ENGINES: unknown engine"):
            SubmitterSettings.load("submitter", engines="local,nomad")


# ----------------------------------------------------------------------------- crash


def process_env(nats_server: NatsServer, postgres_url: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a submitter process with its state under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    env.update({
        "COULER_NATS_URL": nats_server.url,
        "COULER_DATABASE_URL": fresh_database(postgres_url),
        "COULER_STATE_DIR": str(tmp_path / "state"),
        "COULER_ARTIFACTS": str(tmp_path / "state" / "blobs"),
        "COULER_GRPC_ADDRESS": "127.0.0.1:0",
        "COULER_OUTBOX_INTERVAL": "1",
        "COULER_BUS_INSECURE": "true",
    })
    return env


class ServiceProcess:
    """``python -m couler_submitter.main`` with the given environment."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""

    def start(self) -> ServiceProcess:
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "couler_submitter.main"], env=self.env,
                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # the READY line, or EOF when it dies
            if line.startswith(READY_PREFIX):
                self.address = line.split()[2]
                return self
        raise RuntimeError(f"the submitter died: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(WAIT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


class TestCrash:
    """SIGKILL the submitter while a run is RUNNING; the restarted one completes it."""

    @pytest.mark.usefixtures("optimizer")
    def test_a_killed_submitter_resumes_its_runs(self, nats_server: NatsServer,
                                                 postgres_url: str, tmp_path: Path) -> None:
        env = process_env(nats_server, postgres_url, tmp_path)
        marker, gate = tmp_path / "m", tmp_path / "release"
        wf = marker_workflow(unique("crash"), marker, gate=gate)
        first = ServiceProcess(env, tmp_path / "submitter.log").start()
        second: ServiceProcess | None = None
        try:
            with CoulerClient({"submitter": first.address}, timeout=WAIT) as client:
                sub = client.submitter.submit(wf)
                planned(nats_server, sub.run_id)
                wait_for("the second step", lambda: "second-start" in lines(marker))
                running = client.submitter.get(sub.run_id)
                assert running.state is RunState.RUNNING
            first.kill()
            run_dir = tmp_path / "state" / "runs" / sub.run_id
            # step processes die with the engine's process (PR_SET_PDEATHSIG), so none
            # can finish unobserved while the submitter is down
            wait_for("the step to die with the submitter", lambda: not processes_in(run_dir))
            gate.touch()  # the resumed attempt runs to its end
            second = ServiceProcess(env, tmp_path / "submitter.log").start()
            with CoulerClient({"submitter": second.address}, timeout=WAIT) as client:
                run = client.submitter.wait(sub.run_id, timeout=WAIT)
            assert run.state is RunState.SUCCEEDED, run.message
            # "first" succeeded before the crash and did not run again; the interrupted
            # attempt of "second" was killed, so it finished exactly once, as attempt 2.
            assert lines(marker).count("first") == 1
            assert lines(marker).count("second-start") == 2
            assert lines(marker).count("second-end") == 1
            assert run.step("first").attempts == 1
            assert run.step("second").attempts == 2
            submitted = stored(nats_server, "COULER_WORKFLOW", "couler.workflow.submitted",
                               events_pb2.WorkflowSubmitted, sub.run_id)
            assert len(submitted) == 1  # one engine submission
            # the event is published from the outbox after the run's row is committed
            wait_for("the finished event", lambda: stored(
                nats_server, "COULER_WORKFLOW", "couler.workflow.finished",
                events_pb2.WorkflowFinished, sub.run_id) != [])
            finished = stored(nats_server, "COULER_WORKFLOW", "couler.workflow.finished",
                              events_pb2.WorkflowFinished, sub.run_id)
            assert len(finished) == 1
        finally:
            if first.proc is not None and first.proc.poll() is None:
                first.kill()
            if second is not None:
                second.stop()
