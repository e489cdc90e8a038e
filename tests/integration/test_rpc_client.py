"""The typed client against the five real services, over real gRPC, behind the token.

The generator, optimizer, cache, submitter and monitor run as in production (each its own
``serve(settings, build)`` in a thread, tests/service_thread.py) on a nats-server of this
module's own, with SQLite stores and one local artifact directory; steps run for real on
the local engine. The client hands back IR and dataclasses only, and what it gets is what
the services did: the plan the optimizer made, the run the submitter ran, the entries the
cache holds, the recommendations the monitor learned. How calls travel (tokens, errors,
the codec on both ends, one address per service) against fake servers is
tests/mechanics/test_rpc_client_mechanics.py.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message

from couler import ir
from couler.engines.base import StepState
from couler.errors import NotFoundError, UserError
from couler_cache.main import CacheSettings
from couler_cache.main import build as build_cache
from couler_generator.main import GeneratorSettings
from couler_generator.main import build as build_generator
from couler_monitor.main import MonitorSettings
from couler_monitor.main import build as build_monitor
from couler_optimizer.main import OptimizerSettings
from couler_optimizer.main import build as build_optimizer
from couler_runtime.blobs import LocalBlobStore
from couler_runtime.client import CoulerClient, Generated, Submission
from couler_runtime.rpc import records as r
from couler_submitter.main import SubmitterSettings
from couler_submitter.main import build as build_submitter
from tests.containers import kinds
from tests.servers import NatsServer, free_port, make_root
from tests.service_thread import ServiceThread
from tests.waiting import eventually

TOKEN = "rpc-client-test-token-41c2"
WAIT = 120.0  # a bound on waiting, never an assertion about speed
PY = "python:3.12"


def script(name: str, *deps: str, source: str = "") -> ir.Step:
    return ir.Step(
        name=name, body=ir.ScriptSpec(image=PY, source=source or f"print('{name}')"),
        dependencies=tuple(ir.Dependency(d) for d in deps),
        outputs=(ir.OutputParameter("said", source=ir.OutputSource.STDOUT),),
        retry=ir.RetryPolicy(limit=2, on=(ir.FailureClass.OOM,), memory_factor=1.5),
        resources=ir.Resources(memory_request="512Mi"),
    )


def train_and_pick(name: str = "") -> ir.Workflow:
    """prep -> (xgboost, lightgbm) -> pick; a new name (and so new cache keys) per call."""
    salt = uuid.uuid4().hex[:8]
    return ir.Workflow(
        name=name or f"train-and-pick-{salt}",
        steps=(script("prep", source=f"print('prep {salt}')"), script("xgboost", "prep"),
               script("lightgbm", "prep"), script("pick", "xgboost", "lightgbm")),
        parameters=(ir.Parameter("table", default=ir.Literal.of("s3://data/t.csv")),),
        labels=(("team", "ml"),),
    )


def sleeper(name: str) -> ir.Workflow:
    """One step that runs until it is cancelled (bounded by WAIT)."""
    return ir.Workflow(name=name, steps=(ir.Step(name="wait", body=ir.ScriptSpec(
        image=PY, source=f"import time\ntime.sleep({WAIT})")),))


# ----------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    """The five services and their addresses."""

    services: dict[str, ServiceThread[Any]]

    def addresses(self) -> dict[str, str]:
        return {name: svc.address for name, svc in self.services.items()}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = make_root("couler-rpc-nats-")
    nats: NatsServer = kinds()["nats"](root)
    nats.start()
    state = tmp_path_factory.mktemp("stack")
    artifacts = str(state / "artifacts")
    common: dict[str, Any] = {"nats_url": nats.url, "grpc_address": "127.0.0.1:0",
                              "auth_token": TOKEN, "otel_endpoint": None,
                              "bus_insecure": True}  # the bus's security: test_bus_security

    def db(name: str) -> str:
        return f"sqlite:///{state / name}.db"

    running: dict[str, ServiceThread[Any]] = {}
    try:
        running["cache"] = ServiceThread(CacheSettings.load(
            "cache", state_dir=state / "cache", database_url=db("cache"), artifacts=artifacts,
            cache_budget_bytes=10_000_000, **common), build_cache).start()
        cache = running["cache"].address
        running["optimizer"] = ServiceThread(OptimizerSettings.load(
            "optimizer", state_dir=state / "optimizer", database_url=db("optimizer"),
            cache_address=cache, **common), build_optimizer).start()
        running["generator"] = ServiceThread(GeneratorSettings.load(
            "generator", state_dir=state / "generator", llm_base_url="", llm_model="",
            **common), build_generator).start()
        running["monitor"] = ServiceThread(MonitorSettings.load(
            "monitor", state_dir=state / "monitor", database_url=db("monitor"),
            dashboard_address=f"127.0.0.1:{free_port()}", min_runs=2, **common),
            build_monitor).start()
        running["submitter"] = ServiceThread(SubmitterSettings.load(
            "submitter", state_dir=state / "submitter", database_url=db("submitter"),
            artifacts=artifacts, runs_dir=str(state / "runs"), engines="local,dryrun",
            outbox_interval=1.0, sample_interval=0.1, cache_address=cache, **common),
            build_submitter).start()
        yield Stack(running)
    finally:
        for svc in reversed(list(running.values())):
            svc.stop()
        nats.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(stack: Stack) -> Iterator[CoulerClient]:
    with CoulerClient(stack.addresses(), token=TOKEN, timeout=WAIT) as c:
        yield c


def finished(client: CoulerClient, run_id: str) -> r.Run:
    """The run once it reached a terminal state (watched: the submitter's own stream)."""
    for run in client.submitter.watch(run_id, timeout=WAIT):
        if run.state.terminal:
            return client.submitter.get(run_id)
    raise AssertionError(f"run {run_id}: the watch ended before a terminal state")


# ----------------------------------------------------------------------------- generator


def test_generate_returns_valid_ir_and_its_report(client: CoulerClient) -> None:
    got = client.generator.generate("train an XGBoost and a LightGBM model, keep the better",
                                    constraints=["at most 8 steps"], engine="argo")
    assert isinstance(got, Generated)
    ir.validate(got.workflow)  # the generator's IR crossed the wire whole
    assert got.workflow.steps
    # the constraint reached the generator, which says what it did with it
    assert got.report.planner == "offline"
    assert any("not applied: at most 8 steps" in n for n in got.report.notes), got.report.notes
    assert {"train-xgboost", "train-lightgbm"} <= set(got.report.catalog_steps)
    with pytest.raises(UserError, match="empty"):
        client.generator.generate("")


# ----------------------------------------------------------------------------- optimizer


def test_optimize_plans_what_was_sent(client: CoulerClient) -> None:
    wf = train_and_pick()
    plan = client.optimizer.optimize(wf, "tekton", objectives=[r.Objective.COST],
                                     parameters={"table": "x"}, no_cache=True)
    assert isinstance(plan, r.Plan)
    assert plan.engine == "tekton" and "kind: Pipeline" in plan.compiled
    # the optimizer decoded what we sent: the same steps, parameters and labels come back
    assert [s.name for s in plan.workflow.steps] == [s.name for s in wf.steps]
    assert (plan.workflow.parameters, plan.workflow.labels) == (wf.parameters, wf.labels)
    assert plan.workflow_digest == ir.digest(plan.workflow)
    assert plan.cached == {}
    notes = {p.name: p.notes for p in plan.passes}
    assert "objectives: cost" in notes["validate"]
    assert notes["prune_cached"] == ("no_cache: the cache was not consulted",)


# ----------------------------------------------------------------------------- cache


def test_cache_commit_lookup_stats_evict(client: CoulerClient, stack: Stack) -> None:
    data = b"model bytes " + uuid.uuid4().hex.encode()
    artifacts = stack.services["cache"].settings.artifacts
    stored = LocalBlobStore(Path(artifacts)).put_bytes(data)  # as the submitter stores it
    digest = hashlib.sha256(data).hexdigest()
    key = "k-fit-" + uuid.uuid4().hex
    entry = r.CacheEntry(key, "train", "fit", {"acc": "0.91"},
                         {"model": r.StoredArtifact("sha256:" + digest, len(data),
                                                    f"{artifacts}/{stored}")},
                         created_at=1_700_000_000.0)
    before = client.cache.stats()
    assert client.cache.commit(entry) == r.CommitResult(created=True)
    assert client.cache.commit(entry).created is False  # the first one is kept
    found = client.cache.lookup([key, "k-none"])
    assert set(found.entries) == {key} and found.missing == ("k-none",)
    kept = found.entries[key]
    assert (kept.outputs, kept.artifacts["model"].digest) == ({"acc": "0.91"}, "sha256:" + digest)
    assert kept.size_bytes >= len(data)  # the cache measured it (outputs and artifacts)
    stats = client.cache.stats()
    assert stats.budget_bytes == 10_000_000
    assert (stats.entries, stats.bytes) == (before.entries + 1, before.bytes + kept.size_bytes)
    assert (stats.hits, stats.misses) == (before.hits + 1, before.misses + 1)
    assert client.cache.evict([key]) == r.EvictResult((key,), kept.size_bytes)
    assert client.cache.lookup([key]).missing == (key,)


# ----------------------------------------------------------------------------- submitter


def test_submit_watch_list_and_reuse(client: CoulerClient) -> None:
    wf = train_and_pick()
    sub = client.submitter.submit(wf, engine="local", parameters={"table": "t"},
                                  idempotency_key=f"idem-{wf.name}")
    assert isinstance(sub, Submission) and sub.created
    assert client.submitter.submit(wf, idempotency_key=f"idem-{wf.name}") == \
        Submission(sub.run_id, False)
    run = client.submitter.get(sub.run_id)
    assert (run.workflow, run.engine, dict(run.parameters)) == (wf.name, "local", {"table": "t"})

    states = [x.state for x in client.submitter.watch(sub.run_id, timeout=WAIT)]
    assert states[-1] is r.RunState.SUCCEEDED, states
    assert r.RunState.RUNNING in states
    final = client.submitter.get(sub.run_id)
    assert {s.name: s.state for s in final.steps} == dict.fromkeys(
        ("prep", "xgboost", "lightgbm", "pick"), StepState.SUCCEEDED)
    assert final.step("prep").outputs["said"].startswith("prep ")

    # The cache committed the run's steps; the same workflow again reuses them all.
    eventually(lambda: len(list(client.cache.list(workflow=wf.name))) == 4,
               "the cache to commit the first run's four steps", WAIT)
    again = finished(client, client.submitter.submit(wf, engine="local").run_id)
    assert again.state is r.RunState.SUCCEEDED
    assert all(s.state is StepState.CACHED and s.cached for s in again.steps), again.steps
    assert again.step("prep").outputs == final.step("prep").outputs

    page = client.submitter.list(workflow=wf.name, states=[r.RunState.SUCCEEDED])
    assert {x.run_id for x in page.runs} == {sub.run_id, again.run_id}


def test_cancel_retry_and_errors(client: CoulerClient) -> None:
    wf = sleeper(f"sleeper-{uuid.uuid4().hex[:8]}")
    sub = client.submitter.submit(wf, engine="local")
    for run in client.submitter.watch(sub.run_id, timeout=WAIT):
        if run.state is r.RunState.RUNNING:
            break
    cancelled = client.submitter.cancel(sub.run_id, reason="changed my mind")
    assert cancelled.state is r.RunState.CANCELLED, cancelled
    assert "changed my mind" in cancelled.message
    retried = client.submitter.retry(sub.run_id)
    assert retried.retries == 1 and not retried.state.terminal
    assert client.submitter.cancel(sub.run_id).state is r.RunState.CANCELLED

    done = finished(client, client.submitter.submit(train_and_pick(), engine="dryrun").run_id)
    assert done.state is r.RunState.SUCCEEDED
    with pytest.raises(UserError, match="is succeeded: only a failed or cancelled run can be "
                                        "retried"):
        client.submitter.retry(done.run_id)
    with pytest.raises(NotFoundError, match="run 'r-404'"):
        client.submitter.get("r-404")


def test_submit_needs_exactly_one_source(client: CoulerClient) -> None:
    with pytest.raises(UserError, match="exactly one"):
        client.submitter.submit()
    with pytest.raises(UserError, match="exactly one"):
        client.submitter.submit(train_and_pick(), template="nightly")


def test_templates(client: CoulerClient) -> None:
    name = f"nightly-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotFoundError, match=f"template '{name}'"):
        client.submitter.submit(template=name)
    wf = train_and_pick()
    tpl = client.submitter.register_template(name, wf, engine="dryrun")
    assert (tpl.name, tpl.workflow, tpl.engine) == (name, wf, "dryrun")
    assert tpl.registered_at > 0
    assert tpl in client.submitter.list_templates()
    sub = client.submitter.submit(template=name)
    assert sub.created
    run = finished(client, sub.run_id)
    assert (run.workflow, run.engine, run.state) == (wf.name, "dryrun", r.RunState.SUCCEEDED)


# ----------------------------------------------------------------------------- monitor


def test_monitor_learns_from_real_runs(client: CoulerClient) -> None:
    name = f"measured-{uuid.uuid4().hex[:8]}"
    wf = ir.Workflow(name=name, steps=(ir.Step(name="fit", body=ir.ScriptSpec(
        image=PY, source="import time\nblock = bytearray(64 * 2**20)\ntime.sleep(1.5)\n"
                         "print(len(block))")),))
    runs = [finished(client, client.submitter.submit(wf, engine="local", no_cache=True).run_id)
            for _ in range(2)]
    assert all(run.state is r.RunState.SUCCEEDED for run in runs)
    first = runs[0].run_id
    eventually(lambda: bool(client.monitor.utilization(run_id=first).samples),
               "the monitor to store the first run's samples", WAIT)
    util = client.monitor.utilization(run_id=first)
    assert {(s.run_id, s.workflow, s.step) for s in util.samples} == {(first, name, "fit")}
    assert max(s.memory_bytes for s in util.samples) >= 64 * 2**20
    eventually(lambda: any(rec.kind is r.RecommendationKind.MEMORY_REQUEST
                           for rec in client.monitor.recommendations(name)),
               "a memory recommendation after two runs", WAIT)
    rec = next(x for x in client.monitor.recommendations(name)
               if x.kind is r.RecommendationKind.MEMORY_REQUEST)
    assert (rec.workflow, rec.step, rec.based_on_samples >= 2) == (name, "fit", True)


# ----------------------------------------------------------------------------- routing


def test_one_address_per_service(stack: Stack) -> None:
    """Each service at its own address: the client routes each call to the right one."""
    addresses = stack.addresses()
    with CoulerClient({"generator": addresses["generator"],
                       "submitter": addresses["submitter"]}, token=TOKEN,
                      timeout=WAIT) as client:
        wf = client.generator.generate("train a model").workflow
        needed = {p.name: "s3://data/t.csv" for p in wf.parameters if p.default is None}
        run_id = client.submitter.submit(wf, engine="dryrun", parameters=needed).run_id
        assert client.submitter.get(run_id).workflow == wf.name
        with pytest.raises(UserError, match="no address given for the monitor service"):
            client.monitor.recommendations(wf.name)


def test_client_returns_no_protobuf(client: CoulerClient) -> None:
    """Every public result is IR or a dataclass: nothing of protobuf leaks out."""
    wf = train_and_pick()
    results: list[Any] = [
        client.generator.generate("train a model"), client.optimizer.optimize(wf),
        client.cache.stats(), client.submitter.submit(wf, engine="dryrun"),
        client.monitor.utilization(workflow=wf.name),
    ]

    def walk(value: Any) -> Iterator[Any]:
        yield value
        if hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                yield from walk(getattr(value, name))
        elif isinstance(value, (tuple, list)):
            for v in value:
                yield from walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                yield from walk(v)

    assert not [v for res in results for v in walk(res) if isinstance(v, Message)]
