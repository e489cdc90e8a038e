"""The optimizer service in-process against a real nats-server, SQLite and PostgreSQL.

The service runs as in production -- ``serve(settings, build)`` with its gRPC server on
127.0.0.1:0, its three durable consumers on JetStream and its store migrated at start -- on
an asyncio loop in a thread; the tests call it with the blocking ``CoulerClient`` and
publish / receive events with a bus of their own. The whole module runs once on SQLite and
once on a fresh PostgreSQL database.

The cache it asks is the real cache service (``couler_cache``, in a thread on the same
NATS, its index in SQLite and its artifacts in a local directory, requiring the bearer
token): entries are committed to it as the submitter does, and what the optimizer used is
read back from the cache itself -- an entry's ``hits`` and the service's hit and miss
counters (a planner's peeks count nothing there; which keys the optimizer peeks at is
checked against a fake of its cache port in ``tests/unit/test_optimizer_cache_port.py``).

One optimizer instance serves at a time (instances share the durable consumers), except in
the cache-down test, which starts a second one briefly and publishes no events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from couler import ir
from couler.errors import UnsupportedFeatureError, ValidationError
from couler.optimize import DEFAULT_RETRY
from couler.optimize.cache_key import workflow_keys
from couler.v1 import common_pb2, events_pb2, optimizer_service_pb2
from couler_cache.main import CacheSettings, DigestBlobs
from couler_cache.main import build as build_cache
from couler_generator.main import GeneratorSettings
from couler_generator.main import build as build_generator
from couler_optimizer.events import (
    FEEDBACK_DURABLE,
    GENERATED,
    GENERATED_DURABLE,
    OPTIMIZED,
    REFUSED,
    REFUSED_DURABLE,
    REJECTED,
    REQUESTED,
    REQUESTED_DURABLE,
)
from couler_optimizer.main import OptimizerSettings, build
from couler_optimizer.rpc import INLINE_PLAN_BYTES
from couler_optimizer.store import OptimizerStore
from couler_runtime import codec
from couler_runtime.blobs import (
    BlobStore,
    digest_of,
    key_for_digest,
    open_blob_store,
    open_payload_store,
)
from couler_runtime.bus import HEADER_TENANT, HEADER_TRACEPARENT, Bus
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.client import connect
from couler_runtime.rpc.records import (
    CacheEntry,
    Plan,
    Recommendation,
    RecommendationKind,
    StoredArtifact,
    recommendation_to_proto,
)
from couler_runtime.service import READY_PREFIX
from couler_runtime.settings import SettingsError
from tests.servers import NatsServer, free_port, scratch_database
from tests.service_thread import Builder
from tests.service_thread import ServiceThread as RunningService

TOKEN = "optimizer-test-token-5b0c"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
WAIT = 60.0  # a bound on waiting, never an assertion about speed
MAX_STEPS = 4  # the service's max_steps_per_chunk: workflows here have at most 3 steps
JOB = '{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "apply"}}'
PASSES = ["validate", "prune_cached", "substitute_cached", "right_size", "default_retry",
    "split", "compile"]


# ----------------------------------------------------------------------------- workflows


def ServiceThread(settings: OptimizerSettings,
                  builder: Builder = build
                  ) -> RunningService[OptimizerSettings]:
    """The optimizer service running in a thread (tests/service_thread.py)."""
    return RunningService(settings, builder)


def container(name: str, *cmd: str, inputs: Sequence[ir.InputParameter] = (),
              deps: Sequence[str] = (), outputs: Sequence[str] = ("out",), **kw: Any
              ) -> ir.Step:
    return ir.Step(
        name=name, body=ir.ContainerSpec(image="python:3.11", command=cmd or ("echo", name)),
        inputs=tuple(inputs),
        outputs=tuple(ir.OutputParameter(o, source=ir.OutputSource.STDOUT) for o in outputs),
        dependencies=tuple(ir.Dependency(d) for d in deps), **kw)


def chain(n: int, name: str = "") -> ir.Workflow:
    """``n`` steps s0 → s1 → ...; unique commands (and so unique cache keys) per call."""
    name = name or f"chain-{uuid.uuid4().hex[:8]}"
    salt = uuid.uuid4().hex
    steps = [container("s0", "echo", salt)]
    for i in range(1, n):
        steps.append(container(
            f"s{i}", "echo", salt, "{{inputs.x}}",
            inputs=[ir.InputParameter("x", ir.StepOutputRef(f"s{i - 1}", "out"))],
            deps=[f"s{i - 1}"]))
    return ir.Workflow(name=name, steps=tuple(steps))


def invalid(name: str = "broken") -> ir.Workflow:
    """Step 'late' depends on a step that does not exist."""
    return ir.Workflow(name=name, steps=(container("first"), container("late", deps=["nope"])))


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


def steps_of(wf: ir.Workflow) -> dict[str, ir.Step]:
    return {s.name: s for s in wf.steps}


def report(plan: Plan, name: str) -> tuple[bool, tuple[str, ...]]:
    [found] = [p for p in plan.passes if p.name == name]
    return found.changed, found.notes


# ----------------------------------------------------------------------- the real cache


@dataclass
class RealCache:
    """The running cache service: a client for it, and its artifact store."""

    service: RunningService[CacheSettings]
    client: CoulerClient
    blobs: DigestBlobs
    root: str  # the artifact store's URI (COULER_ARTIFACTS)

    @property
    def address(self) -> str:
        return self.service.address

    def put(self, entry: CacheEntry, **artifacts: bytes) -> CacheEntry:
        """Store the ``artifacts``' bytes as the submitter does, then commit ``entry``
        with them; the entry as the cache keeps it."""
        stored = {}
        for name, data in artifacts.items():
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            stored[name] = StoredArtifact(digest, len(data),
                                          f"{self.root}/{self.blobs.store.put_bytes(data)}")
        entry = dataclasses.replace(entry, artifacts=stored)
        assert self.client.cache.commit(entry).created
        return self.client.cache.show(entry.key).entry

    def hits(self, key: str) -> int:
        """How often a (counted) Lookup found ``key``'s entry."""
        return self.client.cache.show(key).entry.hits

    def counters(self) -> tuple[int, int]:
        """The service's (hits, misses) so far."""
        stats = self.client.cache.stats()
        return stats.hits, stats.misses


@pytest.fixture(scope="module")
def cache(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[RealCache]:
    """The cache service, requiring the bearer token, for the module's optimizers."""
    state = tmp_path_factory.mktemp("cache")
    settings = CacheSettings.load(
        "cache", nats_url=nats_server.url, grpc_address="127.0.0.1:0", state_dir=state,
        database_url=f"sqlite:///{state / 'cache.db'}", artifacts=str(state / "artifacts"),
        auth_token=TOKEN, otel_endpoint=None, bus_insecure=True)
    service = RunningService(settings, build_cache).start()
    client = CoulerClient({"cache": service.address}, token=TOKEN, timeout=WAIT)
    try:
        yield RealCache(service, client, DigestBlobs(open_blob_store(settings)),
                        settings.artifacts)
    finally:
        client.close()
        service.stop()


# ----------------------------------------------------------------------------- the service


class Optimizer:
    """The running optimizer, its client, and a restart."""

    def __init__(self, settings: OptimizerSettings) -> None:
        self.settings = settings
        self.service = ServiceThread(settings).start()
        self.client = CoulerClient({"optimizer": self.service.address}, token=TOKEN,
                                   timeout=WAIT)

    def optimize(self, wf: ir.Workflow, engine: str = "local", **kw: Any) -> Plan:
        plan: Plan = self.client.optimizer.optimize(wf, engine, **kw)
        return plan

    def restart(self) -> None:
        self.close()
        self.service = ServiceThread(self.settings).start()
        self.client = CoulerClient({"optimizer": self.service.address}, token=TOKEN,
                                   timeout=WAIT)

    def history(self, **kw: Any) -> Any:
        store = OptimizerStore.open(self.settings.database_url)
        try:
            return store.history(**kw)
        finally:
            store.close()

    def close(self) -> None:
        self.client.close()
        self.service.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[str]:
    """A fresh database: a SQLite file, or a new database in the session's PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('optimizer') / 'optimizer.db'}"
        return
    with scratch_database(request.getfixturevalue("postgres_url"), "opt") as url:
        yield url


def settings_for(nats: NatsServer, state: Path, database_url: str, cache_address: str,
                 **more: Any) -> OptimizerSettings:
    return OptimizerSettings.load(
        "optimizer", nats_url=nats.url, grpc_address="127.0.0.1:0", state_dir=state,
        database_url=database_url, cache_address=cache_address, auth_token=TOKEN,
        otel_endpoint=None, max_steps_per_chunk=MAX_STEPS, default_retry=True,
        bus_insecure=True, **more)  # the logic on an open bus: see test_bus_security.py


@pytest.fixture(scope="module")
def optimizer(nats_server: NatsServer, database_url: str, cache: RealCache,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Optimizer]:
    running = Optimizer(settings_for(nats_server, tmp_path_factory.mktemp("state"),
                                     database_url, cache.address))
    try:
        yield running
    finally:
        running.close()


# ---------------------------------------------------------------------------- event helpers


Answer = tuple[str, Message, dict[str, str]]


async def exchange(nats: NatsServer, messages: Sequence[tuple[str, Message, str]],
                   wait_for: set[str], *, headers: Mapping[str, str] | None = None,
                   payloads: BlobStore | None = None) -> dict[str, list[Answer]]:
    """Publish ``(subject, message, msg_id)`` in order; return the answers (optimized /
    rejected) by run id once every run in ``wait_for`` was answered and the optimizer's
    consumers have acked every message published. ``payloads``: the store of the bodies
    sent by reference (a plan over the bus's inline limit)."""
    bus = await Bus.connect(nats.url, name="optimizer-test", tenant="acme", payloads=payloads)
    answers: dict[str, list[Answer]] = {}
    done = asyncio.Event()
    ours = {getattr(m, "run_id", "") for _, m, _ in messages}
    types: dict[str, type[Message]] = {OPTIMIZED: events_pb2.WorkflowOptimized,
                                       REJECTED: events_pb2.WorkflowRejected}

    async def collect(msg: Any) -> None:
        data = await bus.load_body(msg.subject, msg.data, dict(msg.headers or {}))
        body = types[msg.subject].FromString(data)
        rid = getattr(body, "run_id", "")
        if rid in ours:
            answers.setdefault(rid, []).append((msg.subject, body, dict(msg.headers or {})))
        if wait_for <= set(answers):
            done.set()

    subs = [await bus.client.subscribe(subject, cb=collect) for subject in types]
    last: dict[tuple[str, str], int] = {}
    durables = {REQUESTED: ("COULER_WORKFLOW", REQUESTED_DURABLE),
                GENERATED: ("COULER_WORKFLOW", GENERATED_DURABLE),
                REFUSED: ("COULER_WORKFLOW", REFUSED_DURABLE)}
    try:
        await bus.ensure_streams()
        for subject, message, msg_id in messages:
            published = await bus.publish(subject, message, msg_id=msg_id,
                                          headers=dict(headers or {}))
            where = durables.get(subject, ("COULER_FEEDBACK", FEEDBACK_DURABLE))
            last[where] = published.sequence
        if wait_for:
            await asyncio.wait_for(done.wait(), WAIT)
        await wait_acked(bus, last)
        await bus.client.flush()
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await bus.close()
    return answers


async def wait_acked(bus: Bus, last: Mapping[tuple[str, str], int]) -> None:
    """Wait (with a deadline) until each (stream, durable) acked up to its sequence."""
    deadline = asyncio.get_running_loop().time() + WAIT
    for (stream, durable), seq in last.items():
        while True:
            info = await bus.jetstream.consumer_info(stream, durable)
            if info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= seq:
                break
            assert asyncio.get_running_loop().time() < deadline, f"{durable} never acked {seq}"
            await asyncio.sleep(0.02)


def requested(rid: str, wf: ir.Workflow, **options: Any) -> tuple[str, Message, str]:
    return (REQUESTED, events_pb2.WorkflowRequested(
        run_id=rid, workflow=codec.workflow_to_proto(wf),
        options=events_pb2.RunOptions(**options)), f"{rid}.requested")


def feedback(rec: Recommendation) -> tuple[str, Message, str]:
    return (f"couler.feedback.{rec.workflow}", recommendation_to_proto(rec), rec.id)


def only_answer(answers: dict[str, list[Answer]], rid: str) -> Answer:
    [answer] = answers[rid]
    return answer


# ----------------------------------------------------------------------------------- gRPC


class TestOptimize:
    def test_seven_passes_and_an_argo_document(self, optimizer: Optimizer) -> None:
        wf = chain(3)
        plan = optimizer.optimize(wf, "argo")
        assert [p.name for p in plan.passes] == PASSES
        assert plan.engine == "argo"
        assert "kind: Workflow" in plan.compiled and "s2" in plan.compiled
        assert plan.workflow_digest == ir.digest(plan.workflow)
        assert plan.chunks == ()
        # The default retry policy reached every step, and the report says so.
        assert all(s.retry is not None and s.retry.limit == 2 for s in plan.workflow.steps)
        changed, notes = report(plan, "default_retry")
        assert changed and "s0, s1, s2" in notes[0]

    def test_tekton_keeps_the_default_retries_by_failure_class(self, optimizer: Optimizer,
                                                               ) -> None:
        # Tekton's steps retry by class through the retry wrapper (couler.compilers.tekton)
        plan = optimizer.optimize(chain(2), "tekton")
        assert plan.compiled and all(s.retry is not None and s.retry.on != (
            ir.FailureClass.ANY,) for s in plan.workflow.steps)
        assert "couler_class" in plan.compiled

    def test_airflow_keeps_the_default_retries_by_failure_class(self, optimizer: Optimizer
                                                                ) -> None:
        # Airflow's step runner classifies each failed try (couler.compilers.airflow.failures)
        # and fails without another try for a class the policy does not retry
        plan = optimizer.optimize(chain(2), "airflow")
        assert all(s.retry is not None and set(s.retry.on) == {
            ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA, ir.FailureClass.OOM}
            for s in plan.workflow.steps)
        assert "def _couler_classify" in plan.compiled
        assert "'retry_on': ['transient', 'infra', 'oom']" in plan.compiled
        changed, notes = report(plan, "default_retry")
        assert changed and not any("retries every failure alike" in n for n in notes)

    def test_local_runs_the_ir_itself(self, optimizer: Optimizer) -> None:
        plan = optimizer.optimize(chain(2), "")
        assert [p.name for p in plan.passes] == PASSES
        assert (plan.engine, plan.compiled) == ("local", "")
        assert "local runs the IR itself" in report(plan, "compile")[1][0]

    def test_objectives_are_recorded(self, optimizer: Optimizer) -> None:
        from couler_runtime.rpc.records import Objective

        plan = optimizer.optimize(chain(1), objectives=[Objective.COST])
        assert "objectives: cost" in report(plan, "validate")[1]

    def test_invalid_workflow_is_invalid_argument_naming_the_step(
            self, optimizer: Optimizer) -> None:
        with pytest.raises(ValidationError) as caught:
            optimizer.optimize(invalid("broken-rpc"))
        [issue] = caught.value.issues
        assert (issue.workflow, issue.step, issue.field) == ("broken-rpc", "late",
                                                             "dependencies")

    def test_unsupported_feature_is_refused_naming_the_step(self, optimizer: Optimizer) -> None:
        wf = ir.Workflow(name="with-job", steps=(
            ir.Step(name="apply", body=ir.JobSpec(manifest=JOB)),))
        with pytest.raises(UnsupportedFeatureError, match="apply"):
            optimizer.optimize(wf, "local")

    def test_split_to_a_small_step_budget_is_acyclic(self, optimizer: Optimizer) -> None:
        wf = chain(10)
        plan = optimizer.optimize(wf, "local")
        assert len(plan.chunks) >= 3
        assert all(len(c.steps) <= MAX_STEPS for c in plan.chunks)
        assert sorted(s for c in plan.chunks for s in c.steps) == sorted(steps_of(wf))
        # Acyclic: every chunk depends only on chunks listed before it.
        seen: set[str] = set()
        for chunk in plan.chunks:
            assert set(chunk.depends_on) <= seen, chunk
            assert chunk.workflow is not None
            assert {s.name for s in chunk.workflow.steps} == set(chunk.steps)
            seen.add(chunk.name)
        changed, _ = report(plan, "split")
        assert changed
        assert optimizer.history(run_id="")[-1].chunk_count == len(plan.chunks)


class TestCache:
    def test_cached_steps_come_back_in_the_plan(self, optimizer: Optimizer,
                                                cache: RealCache) -> None:
        wf = chain(3)
        keys = workflow_keys(wf)
        k0, k1 = keys["s0"], keys["s1"]
        cache.put(CacheEntry(key=k0, workflow=wf.name, step="s0", outputs={"out": "hello"}))
        model = cache.put(CacheEntry(key=k1, workflow=wf.name, step="s1",
                                     outputs={"out": "world"}), model=b"model " + k1.encode())
        hits, misses = cache.counters()
        plan = optimizer.optimize(wf, "local", run_id=(rid := run_id()))
        assert set(plan.cached) == {"s0", "s1"}
        assert plan.cached["s0"].key == k0 and plan.cached["s0"].outputs == {"out": "hello"}
        assert plan.cached["s1"].artifacts == model.artifacts  # the cache's entry
        assert plan.cached["s1"].artifacts["model"].uri.startswith(cache.root)
        changed, notes = report(plan, "prune_cached")
        assert changed
        assert any("step 's0': cached" in n for n in notes)
        assert any("step 's1': cached" in n for n in notes)
        # The keys the plan uses were counted by the cache: the hit it reuses (s1), the miss
        # it runs (s2); not s0, which only s1 reads (reused without its artifacts).
        assert [cache.hits(k) for k in (k0, k1)] == [0, 1]
        assert cache.counters() == (hits + 1, misses + 1)
        assert any("step 's0': reused without restoring its artifacts" in n for n in notes)
        [summary] = optimizer.history(run_id=rid)
        assert summary.cached_steps == ("s0", "s1") and not summary.from_event
        assert [p.name for p in summary.passes] == PASSES

    def test_no_cache_asks_nothing(self, optimizer: Optimizer, cache: RealCache) -> None:
        wf = chain(1)
        key = workflow_keys(wf)[wf.steps[0].name]
        cache.put(CacheEntry(key=key, outputs={"out": "x"}))
        before = cache.counters()
        plan = optimizer.optimize(wf, no_cache=True)
        assert plan.cached == {}
        assert cache.hits(key) == 0 and cache.counters() == before  # nothing counted
        assert "no_cache" in report(plan, "prune_cached")[1][0]
        # the same workflow with the cache: the entry is found (it was there to find)
        assert set(optimizer.optimize(wf).cached) == {"s0"} and cache.hits(key) == 1

    def test_a_remote_engine_gets_the_workflow_without_its_cached_steps(
            self, optimizer: Optimizer, cache: RealCache) -> None:
        wf = chain(3)
        keys = workflow_keys(wf)
        cache.put(CacheEntry(key=keys["s0"], workflow=wf.name, step="s0",
                             outputs={"out": "hello"}))
        plan = optimizer.optimize(wf, "argo")
        assert [s.name for s in plan.workflow.steps] == ["s1", "s2"]
        assert set(plan.cached) == {"s0"} and plan.step_keys == keys
        assert "s0" not in plan.compiled and "hello" in plan.compiled
        changed, notes = report(plan, "substitute_cached")
        assert changed and "step 's0': taken out" in notes[0]

    def test_cache_down_plans_without_it(self, nats_server: NatsServer, database_url: str,
                                         tmp_path: Path) -> None:
        dead = f"127.0.0.1:{free_port()}"  # nothing listens there
        other = Optimizer(settings_for(nats_server, tmp_path,
                                       f"sqlite:///{tmp_path / 'down.db'}", dead,
                                       cache_timeout=2.0))
        try:
            plan = other.optimize(chain(2), "local")
        finally:
            other.close()
        assert plan.cached == {}
        assert [p.name for p in plan.passes] == PASSES  # the plan was made all the same
        changed, notes = report(plan, "prune_cached")
        assert not changed
        assert f"cache unavailable at {dead}" in notes[0] and "without the cache" in notes[0]


# ------------------------------------------------------------------------------- feedback


class TestFeedback:
    def test_recommendations_apply_to_later_plans_and_survive_a_restart(
            self, optimizer: Optimizer, nats_server: NatsServer) -> None:
        wf = chain(3)
        memory = Recommendation(
            workflow=wf.name, step="s1", kind=RecommendationKind.MEMORY_REQUEST, value="768Mi",
            reason="peak 612Mi over 5 runs, +25% headroom", based_on_samples=5,
            created_at=2000.0, id=f"{wf.name}.s1.memory_request.768Mi")
        older = dataclasses.replace(memory, value="64Mi", created_at=1000.0,
                                    id=f"{wf.name}.s1.memory_request.64Mi")
        timeout = Recommendation(workflow=wf.name, step="", kind=RecommendationKind.TIMEOUT,
                                 value="600", created_at=2000.0, id=f"{wf.name}..timeout.600")
        before = optimizer.optimize(wf)
        assert not report(before, "right_size")[0]
        # The older one arrives last (out of order): the newer value is kept.
        asyncio.run(exchange(nats_server, [feedback(memory), feedback(timeout),
                                           feedback(older)], set()))

        for attempt in ("before restart", "after restart"):
            plan = optimizer.optimize(wf)
            steps = steps_of(plan.workflow)
            assert steps["s1"].resources is not None, attempt
            assert steps["s1"].resources.memory_request == "768Mi", attempt
            assert steps["s0"].resources is None, attempt
            assert all(s.timeout_seconds == 600 for s in plan.workflow.steps), attempt
            changed, notes = report(plan, "right_size")
            assert changed, attempt
            assert ("step 's1': memory_request = 768Mi (peak 612Mi over 5 runs, +25% headroom)"
                    in notes), attempt
            assert "step 's2': timeout = 600s" in notes, attempt
            if attempt == "before restart":
                optimizer.restart()

        # Another workflow's plans are untouched.
        assert not report(optimizer.optimize(chain(3)), "right_size")[0]

    def test_learned_retry_limits_and_back_off_change_the_next_plan(
            self, optimizer: Optimizer, nats_server: NatsServer) -> None:
        wf = chain(3)

        def rec(step: str, kind: RecommendationKind, value: str, reason: str) -> Recommendation:
            return Recommendation(workflow=wf.name, step=step, kind=kind, value=value,
                                  reason=reason, based_on_samples=5, created_at=2000.0,
                                  id=f"{wf.name}/{step}/{kind.value}/{value}")

        never = dataclasses.replace(
            rec("s0", RecommendationKind.RETRY, "0",
                "no transient or infrastructure failure in 5 runs"),
            failure_class=ir.FailureClass.TRANSIENT)
        flaky = rec("s1", RecommendationKind.RETRY, "4", "transient failures in 3 of 5 runs")
        backoff = rec("s1", RecommendationKind.RETRY_BACKOFF, "12", "recovered in 12 s")
        asyncio.run(exchange(nats_server, [feedback(never), feedback(flaky), feedback(backoff)],
                             set()))
        plan = optimizer.optimize(wf)
        steps = steps_of(plan.workflow)
        s0, s1 = steps["s0"].retry, steps["s1"].retry
        # no blanket retries of s0's own failures; the platform's are still retried
        assert s0 is not None and s0.limit == DEFAULT_RETRY.limit
        assert s0.on == (ir.FailureClass.INFRA, ir.FailureClass.OOM)
        assert s1 is not None and s1.limit == 4 and s1.backoff is not None
        assert s1.backoff.base_seconds == 12.0
        assert steps["s2"].retry == DEFAULT_RETRY
        _, notes = report(plan, "right_size")
        assert ("step 's0': transient failures not retried (no transient or infrastructure "
                "failure in 5 runs)") in notes
        assert "step 's1': retry back-off = 12s (recovered in 12 s)" in notes


# --------------------------------------------------------------------------------- events


class TestEvents:
    def test_requested_workflow_is_optimized_with_run_and_options(
            self, optimizer: Optimizer, nats_server: NatsServer) -> None:
        rid, wf = run_id(), chain(3)
        options: dict[str, Any] = {"engine": "argo", "parameters": {"p": "1"},
                                   "dry_run": True, "tenant": "acme"}
        message = requested(rid, wf, **options)
        answers = asyncio.run(exchange(nats_server, [message], {rid},
                                       headers={HEADER_TRACEPARENT: TRACEPARENT}))
        subject, body, headers = only_answer(answers, rid)
        assert subject == OPTIMIZED
        assert isinstance(body, events_pb2.WorkflowOptimized)
        assert body.run_id == rid
        assert body.options == events_pb2.RunOptions(**options)
        assert body.plan.engine == "argo" and "kind: Workflow" in body.plan.compiled
        assert [p.name for p in body.plan.passes] == PASSES
        assert codec.workflow_from_proto(body.plan.workflow).name == wf.name
        assert headers["Nats-Msg-Id"] == f"{rid}.optimized"
        assert headers[HEADER_TENANT] == "acme"
        assert headers[HEADER_TRACEPARENT].split("-")[1] == TRACEPARENT.split("-")[1]
        [summary] = optimizer.history(run_id=rid)
        assert summary.from_event and summary.engine == "argo" and summary.workflow == wf.name

    def test_generated_workflow_is_optimized(self, optimizer: Optimizer,
                                             nats_server: NatsServer, tmp_path: Path) -> None:
        """A text request: the real generator (its offline planner) answers it with
        ``couler.workflow.generated``, and the optimizer plans what it generated."""
        rid = run_id()
        options = events_pb2.RunOptions(engine="local", constraints=["fast"])
        text = (REQUESTED, events_pb2.WorkflowRequested(
            run_id=rid, text="train an XGBoost and a LightGBM model, keep the better",
            options=options), f"{rid}.requested")
        generator = RunningService(GeneratorSettings.load(
            "generator", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
            state_dir=tmp_path / "generator", llm_base_url="", llm_model="", auth_token=None,
            otel_endpoint=None, bus_insecure=True,
            # the services share one store for bodies sent by reference, as deployed
            artifacts=optimizer.settings.artifacts), build_generator).start()
        try:
            answers = asyncio.run(exchange(nats_server, [text], {rid},
                                           payloads=open_payload_store(optimizer.settings)))
        finally:
            generator.stop()
        subject, body, _ = only_answer(answers, rid)
        assert subject == OPTIMIZED
        assert isinstance(body, events_pb2.WorkflowOptimized)
        assert body.options == options and body.plan.engine == "local"
        assert body.plan.compiled == ""
        planned = codec.workflow_from_proto(body.plan.workflow)
        ir.validate(planned)
        assert any("xgboost" in s.name for s in planned.steps), [s.name for s in planned.steps]
        [summary] = optimizer.history(run_id=rid)
        assert summary.from_event and summary.workflow == planned.name

    def test_cache_and_no_cache_on_the_event_path(self, optimizer: Optimizer,
                                                  nats_server: NatsServer,
                                                  cache: RealCache) -> None:
        wf = chain(1)
        key = workflow_keys(wf)[wf.steps[0].name]
        cache.put(CacheEntry(key=key, outputs={"out": "x"}))
        reuse, fresh = run_id(), run_id()
        answers = asyncio.run(exchange(nats_server, [requested(reuse, wf),
                                                     requested(fresh, wf, no_cache=True)],
                                       {reuse, fresh}))
        body = only_answer(answers, reuse)[1]
        assert isinstance(body, events_pb2.WorkflowOptimized)
        assert set(body.plan.cached) == {"s0"}
        body = only_answer(answers, fresh)[1]
        assert isinstance(body, events_pb2.WorkflowOptimized)
        assert dict(body.plan.cached) == {}
        assert cache.hits(key) == 1  # counted by the run that reuses it only

    def test_parameters_reach_the_cache_keys(self, optimizer: Optimizer,
                                             nats_server: NatsServer,
                                             cache: RealCache) -> None:
        salt = uuid.uuid4().hex
        wf = ir.Workflow(
            name="with-param", parameters=(ir.Parameter("lr", default=ir.Literal.of("0.1")),),
            steps=(container("train", "train", salt, "{{inputs.x}}", inputs=[
                ir.InputParameter("x", ir.WorkflowParamRef("lr"))]),))
        given = workflow_keys(wf, {"lr": "0.5"})["train"]
        default = workflow_keys(wf)["train"]
        assert given != default
        cache.put(CacheEntry(key=given, outputs={"out": "model"}))
        hits, misses = cache.counters()
        with_value, without = run_id(), run_id()
        answers = asyncio.run(exchange(
            nats_server, [requested(with_value, wf, parameters={"lr": "0.5"}),
                          requested(without, wf)], {with_value, without}))
        body = only_answer(answers, with_value)[1]
        assert isinstance(body, events_pb2.WorkflowOptimized)
        assert body.plan.cached["train"].key == given
        body = only_answer(answers, without)[1]
        assert isinstance(body, events_pb2.WorkflowOptimized)
        assert dict(body.plan.cached) == {}
        # one hit (the given value's key), one miss (the default value's key, asked instead)
        assert cache.hits(given) == 1 and cache.counters() == (hits + 1, misses + 1)
        assert cache.client.cache.lookup([default], peek=True).missing == (default,)

    def test_redelivery_plans_once(self, optimizer: Optimizer, nats_server: NatsServer,
                                   cache: RealCache) -> None:
        rid, wf = run_id(), chain(1)
        key = workflow_keys(wf)[wf.steps[0].name]
        cache.put(CacheEntry(key=key, outputs={"out": "x"}))
        subject, message, msg_id = requested(rid, wf)
        # The same request stored twice (as after a republish outside the duplicate window):
        # the consumer sees run `rid` twice.
        answers = asyncio.run(exchange(nats_server, [(subject, message, msg_id),
                                                     (subject, message, msg_id + ".again")],
                                       {rid}))
        # Both deliveries were answered (JetStream keeps only the first: same Nats-Msg-Id),
        # the second with the recorded plan, not a new one (its pass timings would differ).
        [(first, body, headers), (second, again, again_headers)] = answers[rid]
        assert first == second == OPTIMIZED
        assert headers["Nats-Msg-Id"] == again_headers["Nats-Msg-Id"] == f"{rid}.optimized"
        assert isinstance(body, events_pb2.WorkflowOptimized)
        assert again == body
        assert set(body.plan.cached) == {"s0"}
        assert cache.hits(key) == 1  # the cache was not counted twice
        assert len(optimizer.history(run_id=rid)) == 1

    def test_invalid_workflow_is_rejected_naming_the_step(
            self, optimizer: Optimizer, nats_server: NatsServer) -> None:
        rid = run_id()
        answers = asyncio.run(exchange(nats_server, [requested(rid, invalid())], {rid}))
        subject, body, headers = only_answer(answers, rid)
        assert subject == REJECTED
        assert isinstance(body, events_pb2.WorkflowRejected)
        assert (body.run_id, body.stage) == (rid, "optimizer")
        assert "'late'" in body.reason and "dependencies" in body.reason
        [issue] = body.issues
        assert (issue.workflow, issue.step, issue.field) == ("broken", "late", "dependencies")
        assert headers["Nats-Msg-Id"] == f"{rid}.rejected"
        assert optimizer.history(run_id=rid) == ()

    def test_unsupported_feature_and_unknown_engine_are_rejected(
            self, optimizer: Optimizer, nats_server: NatsServer) -> None:
        job, unknown = run_id(), run_id()
        wf = ir.Workflow(name="with-job", steps=(
            ir.Step(name="apply", body=ir.JobSpec(manifest=JOB)),))
        answers = asyncio.run(exchange(nats_server, [requested(job, wf, engine="local"),
                                                     requested(unknown, chain(1), engine="x")],
                                       {job, unknown}))
        subject, body, _ = only_answer(answers, job)
        assert subject == REJECTED and isinstance(body, events_pb2.WorkflowRejected)
        assert "'apply'" in body.reason and "local" in body.reason
        subject, body, _ = only_answer(answers, unknown)
        assert subject == REJECTED and isinstance(body, events_pb2.WorkflowRejected)
        assert "unknown engine 'x'" in body.reason

    def test_text_request_is_acked_and_ignored(self, optimizer: Optimizer,
                                               nats_server: NatsServer) -> None:
        text, with_workflow = run_id(), run_id()
        messages = [
            (REQUESTED, events_pb2.WorkflowRequested(run_id=text, text="train a model"),
             f"{text}.requested"),
            requested(with_workflow, chain(1)),
        ]
        # The consumer handles messages in order: once the second is answered and both are
        # acked, the first was handled -- and answered with nothing.
        answers = asyncio.run(exchange(nats_server, messages, {with_workflow}))
        assert text not in answers
        assert only_answer(answers, with_workflow)[0] == OPTIMIZED
        assert optimizer.history(run_id=text) == ()

    def test_split_plan_on_the_event_path(self, optimizer: Optimizer,
                                          nats_server: NatsServer) -> None:
        rid, wf = run_id(), chain(9)
        answers = asyncio.run(exchange(nats_server, [requested(rid, wf)], {rid}))
        body = only_answer(answers, rid)[1]
        assert isinstance(body, events_pb2.WorkflowOptimized)
        chunks = list(body.plan.chunks)
        assert len(chunks) >= 3
        seen: set[str] = set()
        for chunk in chunks:
            assert set(chunk.depends_on) <= seen
            seen.add(chunk.name)
        assert optimizer.history(run_id=rid)[0].chunk_count == len(chunks)


# ------------------------------------------------------------------------- size refusals


def wide_chain(n: int, width: int = 3000) -> ir.Workflow:
    """``n`` steps in a chain, each with an argument of ``width`` characters: a document of
    about n x width bytes in few steps (the service's step budget is MAX_STEPS)."""
    wf = chain(n)
    return dataclasses.replace(wf, steps=tuple(
        dataclasses.replace(s, body=ir.ContainerSpec(
            image="python:3.11", command=(*s.body.command, "x" * width)))  # type: ignore[union-attr]
        for s in wf.steps))


def refused(rid: str, wf: ir.Workflow, size: int, *, revision: int, engine: str = "argo",
            replan: bool = True) -> tuple[str, Message, str]:
    message = events_pb2.DocumentRefused(
        run_id=rid, workflow=wf.name, engine=engine, size_bytes=size,
        reason="500 InternalError: etcdserver: request is too large", attempt=1,
        revision=revision)
    message.at.FromSeconds(1_790_000_000)
    if replan:
        message.request.CopyFrom(requested(rid, wf, engine=engine)[1])
    return (REFUSED, message, f"{rid}.refused.{revision}")


class TestSizeRefusals:
    """``couler.workflow.refused``: the engine's learned budget, and the run planned again."""

    def test_a_refusal_lowers_the_engines_budget_and_the_run_is_planned_again(
            self, optimizer: Optimizer, nats_server: NatsServer) -> None:
        rid, wf = run_id(), wide_chain(MAX_STEPS)
        first = only_answer(asyncio.run(exchange(
            nats_server, [requested(rid, wf, engine="argo")], {rid})), rid)[1]
        assert isinstance(first, events_pb2.WorkflowOptimized)
        assert not first.plan.chunks  # within Argo's static budget: one document
        size = len(first.plan.compiled)

        answers = asyncio.run(exchange(nats_server, [refused(rid, wf, size, revision=7)],
                                       {rid}))
        subject, again, headers = only_answer(answers, rid)
        assert subject == OPTIMIZED and headers["Nats-Msg-Id"] == f"{rid}.optimized.r7"
        assert isinstance(again, events_pb2.WorkflowOptimized)
        budget = int(size * 0.8)
        assert len(again.plan.chunks) >= 2
        assert all(c.size_bytes <= budget for c in again.plan.chunks)
        assert sorted(s for c in again.plan.chunks for s in c.steps) == sorted(
            s.name for s in wf.steps)
        split = next(p for p in again.plan.passes if p.name == "split")
        assert split.notes[0] == (
            f"budget {budget / 1024:.0f} KiB: argo refused a {size / 1024:.0f} KiB document "
            f"at 2026-09-21T14:13:20Z (workflow {wf.name!r}, run {rid}: 500 InternalError: "
            "etcdserver: request is too large)")
        # the run's recorded plan is the new one
        [summary] = optimizer.history(run_id=rid)
        assert summary.chunk_count == len(again.plan.chunks)

        # The next plans for Argo use the learned budget, after a restart too; a small
        # workflow still fits in one document.
        for attempt in ("before restart", "after restart"):
            plan = optimizer.optimize(wide_chain(MAX_STEPS), "argo")
            assert len(plan.chunks) >= 2, attempt
            assert all(c.size_bytes <= budget for c in plan.chunks), attempt
            assert optimizer.optimize(chain(2), "argo").compiled, attempt
            if attempt == "before restart":
                optimizer.restart()

    def test_a_larger_refusal_keeps_the_smaller_budget_and_a_bad_one_is_terminated(
            self, optimizer: Optimizer, nats_server: NatsServer) -> None:
        wf = wide_chain(2)
        store = OptimizerStore.open(optimizer.settings.database_url)
        try:
            before = store.learned_budget("kfp")
            asyncio.run(exchange(nats_server, [
                refused(run_id(), wf, 900_000, revision=1, engine="kfp", replan=False),
                refused(run_id(), wf, 2_000_000, revision=2, engine="kfp", replan=False),
                refused(run_id(), wf, 0, revision=3, engine="kfp", replan=False)], set()))
            learned = store.learned_budget("kfp")
        finally:
            store.close()
        assert before is None and learned is not None
        assert learned.max_bytes == 720_000 and learned.refused_bytes == 900_000
        assert learned.refusals == 2  # the one without a size was terminated, not counted


# ------------------------------------------------------------------------------- settings


def test_settings_name_the_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COULER_CACHE_ADDRESS", "no-port")
    with pytest.raises(SettingsError, match="COULER_CACHE_ADDRESS"):
        OptimizerSettings.load("optimizer")
    monkeypatch.setenv("COULER_CACHE_ADDRESS", "")
    monkeypatch.setenv("COULER_MAX_STEPS_PER_CHUNK", "0")
    with pytest.raises(SettingsError, match="COULER_MAX_STEPS_PER_CHUNK"):
        OptimizerSettings.load("optimizer")
    monkeypatch.setenv("COULER_MAX_STEPS_PER_CHUNK", "")
    settings = OptimizerSettings.load("optimizer")
    assert (settings.cache_address, settings.max_steps_per_chunk, settings.default_retry) == (
        "", None, True)


class TestConsoleScript:
    """``python -m couler_optimizer.main`` (as ``couler up`` starts it): READY, serves, stops."""

    @staticmethod
    def env(nats: NatsServer, state: Path, **more: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
        env.update({"COULER_NATS_URL": nats.url, "COULER_GRPC_ADDRESS": "127.0.0.1:0",
                    "COULER_STATE_DIR": str(state), "COULER_MAX_STEPS_PER_CHUNK": "2",
                    "COULER_CACHE_ADDRESS": "", "COULER_BUS_INSECURE": "true", **more})
        return env

    def test_serves_until_sigterm(self, nats_server: NatsServer, tmp_path: Path) -> None:
        proc = subprocess.Popen([sys.executable, "-m", "couler_optimizer.main"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env=self.env(nats_server, tmp_path))
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        reader = threading.Thread(target=lambda: [lines.put(line) for line in stdout],
                                  daemon=True)
        reader.start()
        with proc:
            try:
                prefix, service, address = lines.get(timeout=WAIT).split()
                assert (prefix, service) == (READY_PREFIX, "optimizer")
                with CoulerClient({"optimizer": address}, timeout=WAIT) as client:
                    plan = client.optimizer.optimize(chain(3))
                assert len(plan.chunks) == 2  # COULER_MAX_STEPS_PER_CHUNK=2
                assert "no cache configured" in report(plan, "prune_cached")[1][0]
            finally:
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(WAIT)
                reader.join(WAIT)  # EOF once the process has exited
        assert code == 0
        # Its default store: SQLite in the state directory, migrated, the plan recorded.
        store = OptimizerStore.open(f"sqlite:///{tmp_path / 'optimizer.db'}")
        try:
            assert [s.chunk_count for s in store.history()] == [2]
        finally:
            store.close()

    def test_bad_settings_exit_2_naming_the_variable(self, nats_server: NatsServer,
                                                     tmp_path: Path) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "couler_optimizer.main"],
            env=self.env(nats_server, tmp_path, COULER_CACHE_ADDRESS="cache-without-port"),
            capture_output=True, text=True, timeout=WAIT, check=False)
        assert done.returncode == 2
        assert "COULER_CACHE_ADDRESS: must be host:port" in done.stderr


class TestLarge:
    """A workflow too large for one message comes by reference, and a plan too large to
    answer inline goes back by reference (``Plan.stored``), both through the shared blob
    store, checked against digest and size."""

    def test_a_large_workflow_and_plan_travel_by_reference(
            self, nats_server: NatsServer, cache: RealCache,
            tmp_path: Path) -> None:
        settings = OptimizerSettings.load(
            "optimizer", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
            state_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'o.db'}",
            cache_address=cache.address, auth_token=TOKEN, otel_endpoint=None)
        wf = chain(30_000)
        data = codec.workflow_to_proto(wf).SerializeToString()
        assert len(data) > INLINE_PLAN_BYTES
        blobs = open_blob_store(settings)  # the store the service shares
        key = blobs.put_bytes(data)
        svc = ServiceThread(settings).start()
        try:
            with connect(svc.address, token=TOKEN) as channel:
                optimize = channel.unary_unary(
                    "/couler.v1.OptimizerService/Optimize",
                    request_serializer=optimizer_service_pb2.OptimizeRequest.SerializeToString,
                    response_deserializer=common_pb2.Plan.FromString)
                request = optimizer_service_pb2.OptimizeRequest(engine="local")
                request.workflow_ref.digest = "sha256:" + digest_of(key)
                request.workflow_ref.size_bytes = len(data)
                answer = optimize(request, timeout=WAIT)
                assert answer.HasField("stored") and not answer.HasField("workflow")
                assert answer.engine == "local" and answer.passes[0].name == "validate"
                stored = common_pb2.Plan.FromString(blobs.get_bytes(
                    key_for_digest(answer.stored.digest.removeprefix("sha256:"))))
                assert len(stored.SerializeToString()) == answer.stored.size_bytes
                planned = codec.workflow_from_proto(stored.workflow)
                assert [s.name for s in planned.steps] == [s.name for s in wf.steps]
                assert answer.workflow_digest == stored.workflow_digest == ir.digest(planned)
                # A reference that does not match what is stored is the caller's mistake.
                request.workflow_ref.size_bytes = len(data) - 1
                with pytest.raises(grpc.RpcError) as info:
                    optimize(request, timeout=WAIT)
                assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "size_bytes" in (info.value.details() or "")
                request.workflow_ref.digest = "sha256:" + "0" * 64
                with pytest.raises(grpc.RpcError) as info:
                    optimize(request, timeout=WAIT)
                assert info.value.code() is grpc.StatusCode.NOT_FOUND
        finally:
            svc.stop()
