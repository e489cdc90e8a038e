"""The typed client's mechanics against fake servers of all five services over real gRPC.

What is checked here is the client's side of each call, whatever a service would answer:
every argument reaches the server's request (the fakes record what they got), workflows
cross the wire as protobuf in both directions (client -> server -> client, any workflow),
converted by the codec at each end, a watch's pages are put together, the server's errors
come back as couler exceptions, and the client hands back IR and dataclasses only. The
servicers are fakes, named ``Fake...``; what the real services answer to the same client
is tests/integration/test_rpc_client.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings

from couler import ir
from couler.engines.base import StepState
from couler.errors import ConflictError, NotFoundError, UserError
from couler.v1 import (
    cache_service_pb2,
    common_pb2,
    generator_service_pb2,
    monitor_service_pb2,
    optimizer_service_pb2,
    submitter_service_pb2,
)
from couler_runtime import codec
from couler_runtime.client import CoulerClient, Generated, Submission
from couler_runtime.rpc import SERVICES, RpcServer, start_server
from couler_runtime.rpc import records as r
from tests.integration.loop_thread import LoopThread
from tests.ir_strategies import workflows
from tests.mechanics.test_rpc import TOKEN


def script(name: str, *deps: str) -> ir.Step:
    return ir.Step(
        name=name, body=ir.ScriptSpec(image="python:3.12", source=f"print('{name}')"),
        dependencies=tuple(ir.Dependency(d) for d in deps),
        retry=ir.RetryPolicy(limit=2, on=(ir.FailureClass.OOM,), memory_factor=1.5),
        resources=ir.Resources(memory_request="512Mi"),
    )


WF = ir.Workflow(
    name="train-and-pick",
    steps=(script("prep"), script("xgboost", "prep"), script("lightgbm", "prep"),
           script("pick", "xgboost", "lightgbm")),
    parameters=(ir.Parameter("table", default=ir.Literal.of("s3://data/t.csv")),),
    labels=(("team", "ml"),),
)


class FakeGenerator:
    def __init__(self) -> None:
        self.requests: list[generator_service_pb2.GenerateRequest] = []

    async def Generate(self, request: generator_service_pb2.GenerateRequest,
                       context: object) -> generator_service_pb2.GenerateResponse:
        self.requests.append(request)
        if not request.text:
            raise UserError("generate: empty request")
        report = r.GenerationReport("offline", subtasks=("prep", "train", "pick"),
                                    catalog_steps=("xgboost", "lightgbm"))
        return generator_service_pb2.GenerateResponse(
            workflow=codec.workflow_to_proto(WF), report=r.generation_report_to_proto(report))


class FakeOptimizer:
    """Returns the received workflow as the plan, with "prep" cached."""

    def __init__(self) -> None:
        self.received: list[ir.Workflow] = []

    async def Optimize(self, request: optimizer_service_pb2.OptimizeRequest,
                       context: object) -> common_pb2.Plan:
        wf = codec.workflow_from_proto(request.workflow)
        self.received.append(wf)
        plan = r.Plan(
            workflow=wf, engine=request.engine, compiled="",
            cached={"prep": r.CacheEntry("k-prep", wf.name, "prep", {"rows": "10"})},
            passes=(r.PassReport("validate"), r.PassReport(
                "prune_cached", True, (f"objectives={list(request.objectives)}",), 0.5)),
            workflow_digest=f"params={dict(request.parameters)} no_cache={request.no_cache}",
        )
        return r.plan_to_proto(plan)


class FakeCache:
    def __init__(self) -> None:
        self.entries: dict[str, common_pb2.CacheEntry] = {}
        self.hits = self.misses = 0

    async def Lookup(self, request: cache_service_pb2.LookupRequest,
                     context: object) -> cache_service_pb2.LookupResponse:
        found = [self.entries[k] for k in request.keys if k in self.entries]
        missing = [k for k in request.keys if k not in self.entries]
        self.hits, self.misses = self.hits + len(found), self.misses + len(missing)
        return cache_service_pb2.LookupResponse(entries=found, missing=missing)

    async def Commit(self, request: cache_service_pb2.CommitRequest,
                     context: object) -> cache_service_pb2.CommitResponse:
        created = request.entry.key not in self.entries
        self.entries.setdefault(request.entry.key, request.entry)
        return cache_service_pb2.CommitResponse(created=created)

    async def Stats(self, request: object, context: object) -> cache_service_pb2.StatsResponse:
        return cache_service_pb2.StatsResponse(
            entries=len(self.entries), bytes=sum(e.size_bytes for e in self.entries.values()),
            hits=self.hits, misses=self.misses, budget_bytes=10_000)

    async def Evict(self, request: cache_service_pb2.EvictRequest,
                    context: object) -> cache_service_pb2.EvictResponse:
        gone = [self.entries.pop(k) for k in request.keys if k in self.entries]
        return cache_service_pb2.EvictResponse(evicted=[e.key for e in gone],
                                               freed_bytes=sum(e.size_bytes for e in gone))


class FakeSubmitter:
    """Keeps runs in memory; a run "finishes" as soon as it is watched."""

    def __init__(self) -> None:
        self.requests: list[submitter_service_pb2.SubmitRequest] = []
        self.workflows: dict[str, ir.Workflow] = {}
        self.by_key: dict[str, str] = {}
        self.templates: dict[str, common_pb2.Template] = {}
        self.runs: dict[str, common_pb2.Run] = {}

    async def Submit(self, request: submitter_service_pb2.SubmitRequest,
                     context: object) -> submitter_service_pb2.SubmitResponse:
        self.requests.append(request)
        if request.idempotency_key in self.by_key:
            return submitter_service_pb2.SubmitResponse(
                run_id=self.by_key[request.idempotency_key], created=False)
        run_id = f"r-{len(self.runs) + 1}"
        source = request.WhichOneof("source")
        if source == "workflow":
            self.workflows[run_id] = codec.workflow_from_proto(request.workflow)
        elif source == "template" and request.template not in self.templates:
            raise NotFoundError(f"template {request.template!r} not found")
        if request.idempotency_key:
            self.by_key[request.idempotency_key] = run_id
        self.runs[run_id] = common_pb2.Run(
            run_id=run_id, state=common_pb2.RUN_STATE_ACCEPTED, engine=request.engine or "local",
            idempotency_key=request.idempotency_key, parameters=request.parameters,
            dry_run=request.dry_run)
        return submitter_service_pb2.SubmitResponse(run_id=run_id, created=True)

    def _run(self, run_id: str) -> common_pb2.Run:
        if run_id not in self.runs:
            raise NotFoundError(f"run {run_id!r} not found")
        return self.runs[run_id]

    async def Get(self, request: submitter_service_pb2.GetRunRequest,
                  context: object) -> common_pb2.Run:
        return self._run(request.run_id)

    async def Watch(self, request: submitter_service_pb2.WatchRunRequest,
                    context: object) -> AsyncIterator[submitter_service_pb2.WatchRunResponse]:
        # As the contract says: all steps first, then only the changed ones; a change of
        # two steps comes as two pages (``more``).
        run = self._run(request.run_id)
        yield submitter_service_pb2.WatchRunResponse(run=run)
        run.state, run.revision = common_pb2.RUN_STATE_RUNNING, run.revision + 1
        run.steps.add(name="prep", state=common_pb2.STEP_STATE_CACHED, cached=True,
                      cache_key="k-prep", outputs={"rows": "10"})
        run.steps.add(name="xgboost", state=common_pb2.STEP_STATE_RUNNING, attempts=1)
        for i, page in enumerate((run.steps[:1], run.steps[1:])):
            message = submitter_service_pb2.WatchRunResponse(more=i == 0)
            message.run.CopyFrom(run)
            del message.run.steps[:]
            message.run.steps.extend(page)
            yield message
        run.state, run.revision = common_pb2.RUN_STATE_SUCCEEDED, run.revision + 1
        run.steps[1].state = common_pb2.STEP_STATE_SUCCEEDED
        message = submitter_service_pb2.WatchRunResponse()
        message.run.CopyFrom(run)
        del message.run.steps[:1]  # only "xgboost" changed
        yield message

    async def Cancel(self, request: submitter_service_pb2.CancelRunRequest,
                     context: object) -> common_pb2.Run:
        run = self._run(request.run_id)
        run.state, run.message = common_pb2.RUN_STATE_CANCELLED, request.reason
        return run

    async def Retry(self, request: submitter_service_pb2.RetryRunRequest,
                    context: object) -> common_pb2.Run:
        run = self._run(request.run_id)
        if run.state != common_pb2.RUN_STATE_CANCELLED:
            raise ConflictError(f"run {request.run_id!r} is not failed or cancelled")
        run.state, run.retries = common_pb2.RUN_STATE_PENDING, run.retries + 1
        return run

    async def List(self, request: submitter_service_pb2.ListRunsRequest,
                   context: object) -> submitter_service_pb2.ListRunsResponse:
        runs = [x for x in self.runs.values() if not request.states or x.state in request.states]
        return submitter_service_pb2.ListRunsResponse(runs=runs[::-1], next_page_token="")

    async def RegisterTemplate(self, request: submitter_service_pb2.RegisterTemplateRequest,
                               context: object) -> common_pb2.Template:
        tpl = common_pb2.Template(name=request.name, workflow=request.workflow,
                                  engine=request.engine, workflow_digest="sha256:x")
        tpl.registered_at.FromSeconds(1_700_000_000)
        self.templates[request.name] = tpl
        return tpl

    async def ListTemplates(self, request: object,
                            context: object) -> submitter_service_pb2.ListTemplatesResponse:
        return submitter_service_pb2.ListTemplatesResponse(
            templates=sorted(self.templates.values(), key=lambda t: t.name))


class FakeMonitor:
    async def Utilization(self, request: monitor_service_pb2.UtilizationRequest,
                          context: object) -> monitor_service_pb2.UtilizationResponse:
        sample = r.UtilizationSample(request.run_id, "train", "fit", 1_700_000_000.5, 1.5, 2**30)
        peak = r.StepPeak(request.run_id, "train", "fit", 1.5, 2**30, 1)
        return r.utilization_to_proto(r.Utilization((sample,), (peak,)))

    async def Recommendations(self, request: monitor_service_pb2.RecommendationsRequest,
                              context: object) -> monitor_service_pb2.RecommendationsResponse:
        rec = r.Recommendation(request.workflow, "fit", r.RecommendationKind.MEMORY_REQUEST,
                               "1280Mi", "peak 1Gi over 1 run, +25%", 1)
        return monitor_service_pb2.RecommendationsResponse(
            recommendations=[r.recommendation_to_proto(rec)])


class FakeStack:
    def __init__(self) -> None:
        self.generator, self.optimizer, self.cache = FakeGenerator(), FakeOptimizer(), FakeCache()
        self.submitter, self.monitor = FakeSubmitter(), FakeMonitor()

    def servicers(self) -> dict[str, object]:
        return {SERVICES[name]: getattr(self, name) for name in SERVICES}


@pytest.fixture(scope="module")
def stack(loop: LoopThread) -> Iterator[tuple[FakeStack, RpcServer]]:
    services = FakeStack()
    server = loop.run(start_server("127.0.0.1:0", services.servicers(), token=TOKEN))
    yield services, server
    loop.run(server.stop(None))


@pytest.fixture
def client(stack: tuple[FakeStack, RpcServer]) -> Iterator[CoulerClient]:
    with CoulerClient(f"127.0.0.1:{stack[1].port}", token=TOKEN) as c:
        yield c


def test_generate_returns_ir_and_report(client: CoulerClient,
                                        stack: tuple[FakeStack, RpcServer]) -> None:
    got = client.generator.generate("train an XGBoost and a LightGBM model, keep the better",
                                    constraints=["at most 8 steps"], engine="argo")
    assert isinstance(got, Generated)
    assert got.workflow == WF
    assert got.report.subtasks == ("prep", "train", "pick")
    sent = stack[0].generator.requests[-1]
    assert (list(sent.constraints), sent.engine) == (["at most 8 steps"], "argo")
    with pytest.raises(UserError, match="empty request"):
        client.generator.generate("")


def test_optimize_round_trips_the_workflow(client: CoulerClient,
                                           stack: tuple[FakeStack, RpcServer]) -> None:
    plan = client.optimizer.optimize(WF, "tekton", objectives=[r.Objective.COST],
                                     parameters={"table": "x"}, no_cache=True)
    assert isinstance(plan, r.Plan)
    assert stack[0].optimizer.received[-1] == WF  # the server decoded what we sent
    assert plan.workflow == WF  # and we decoded what it sent back
    assert plan.engine == "tekton"
    assert plan.cached["prep"].outputs == {"rows": "10"}
    assert [p.name for p in plan.passes] == ["validate", "prune_cached"]
    assert plan.passes[1].notes == (f"objectives={[common_pb2.OBJECTIVE_COST]}",)
    assert plan.workflow_digest == "params={'table': 'x'} no_cache=True"


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(wf=workflows())
def test_any_workflow_survives_submit_and_optimize(client: CoulerClient,
                                                   stack: tuple[FakeStack, RpcServer],
                                                   wf: ir.Workflow) -> None:
    run_id = client.submitter.submit(wf).run_id
    assert stack[0].submitter.workflows[run_id] == wf
    assert client.optimizer.optimize(wf).workflow == wf


def test_cache_commit_lookup_stats_evict(client: CoulerClient) -> None:
    entry = r.CacheEntry("k-fit", "train", "fit", {"acc": "0.91"},
                         {"model": r.StoredArtifact("sha256:" + "ab" * 32, 2048, "file:///m")},
                         2100, created_at=1_700_000_000.0)
    assert client.cache.commit(entry) == r.CommitResult(created=True)
    assert client.cache.commit(entry).created is False
    found = client.cache.lookup(["k-fit", "k-none"])
    assert found.entries == {"k-fit": entry}
    assert found.missing == ("k-none",)
    stats = client.cache.stats()
    assert (stats.entries, stats.bytes, stats.budget_bytes) == (1, 2100, 10_000)
    assert stats.hits >= 1 and stats.misses >= 1
    assert client.cache.evict(["k-fit"]) == r.EvictResult(("k-fit",), 2100)
    assert client.cache.lookup(["k-fit"]).missing == ("k-fit",)


def test_submit_watch_cancel_retry_list(client: CoulerClient,
                                        stack: tuple[FakeStack, RpcServer]) -> None:
    sub = client.submitter.submit(WF, engine="local", parameters={"table": "t"},
                                  idempotency_key="idem-1", no_cache=True)
    assert isinstance(sub, Submission) and sub.created
    again = client.submitter.submit(WF, idempotency_key="idem-1")
    assert again == Submission(sub.run_id, False)
    sent = stack[0].submitter.requests[-2]
    assert (sent.WhichOneof("source"), sent.no_cache, dict(sent.parameters)) == (
        "workflow", True, {"table": "t"})

    run = client.submitter.get(sub.run_id)
    assert (run.state, run.engine, dict(run.parameters)) == (
        r.RunState.ACCEPTED, "local", {"table": "t"})
    states = [x.state for x in client.submitter.watch(sub.run_id)]
    assert states == [r.RunState.ACCEPTED, r.RunState.RUNNING, r.RunState.SUCCEEDED]
    final = client.submitter.get(sub.run_id)
    assert final.step("prep").state is StepState.CACHED and final.step("prep").cached
    assert final.step("xgboost").state is StepState.SUCCEEDED

    text = client.submitter.submit("preprocess, train and evaluate", dry_run=True)
    assert stack[0].submitter.requests[-1].text == "preprocess, train and evaluate"
    cancelled = client.submitter.cancel(text.run_id, reason="changed my mind")
    assert (cancelled.state, cancelled.message) == (r.RunState.CANCELLED, "changed my mind")
    retried = client.submitter.retry(text.run_id)
    assert (retried.state, retried.retries) == (r.RunState.PENDING, 1)
    with pytest.raises(ConflictError, match="is not failed or cancelled"):
        client.submitter.retry(sub.run_id)
    with pytest.raises(NotFoundError, match="run 'r-404' not found"):
        client.submitter.get("r-404")

    page = client.submitter.list(states=[r.RunState.SUCCEEDED])
    assert [x.run_id for x in page.runs] == [sub.run_id]
    assert page.next_page_token == ""


def test_submit_needs_exactly_one_source(client: CoulerClient) -> None:
    with pytest.raises(UserError, match="exactly one"):
        client.submitter.submit()
    with pytest.raises(UserError, match="exactly one"):
        client.submitter.submit(WF, template="nightly")


def test_templates(client: CoulerClient, stack: tuple[FakeStack, RpcServer]) -> None:
    with pytest.raises(NotFoundError, match="template 'nightly' not found"):
        client.submitter.submit(template="nightly")
    tpl = client.submitter.register_template("nightly", WF, engine="argo")
    assert (tpl.name, tpl.workflow, tpl.engine, tpl.registered_at) == (
        "nightly", WF, "argo", 1_700_000_000.0)
    assert client.submitter.list_templates() == (tpl,)
    assert client.submitter.submit(template="nightly").created
    assert stack[0].submitter.requests[-1].template == "nightly"


def test_monitor(client: CoulerClient) -> None:
    util = client.monitor.utilization(run_id="r-9")
    assert util.samples[0].run_id == "r-9" and util.samples[0].memory_bytes == 2**30
    assert util.peaks[0].peak_cpu == 1.5
    (rec,) = client.monitor.recommendations("train")
    assert (rec.workflow, rec.kind, rec.value) == (
        "train", r.RecommendationKind.MEMORY_REQUEST, "1280Mi")


def test_one_address_per_service(loop: LoopThread) -> None:
    generator, submitter = FakeGenerator(), FakeSubmitter()
    a = loop.run(start_server("127.0.0.1:0", {SERVICES["generator"]: generator}))
    b = loop.run(start_server("127.0.0.1:0", {SERVICES["submitter"]: submitter}))
    try:
        with CoulerClient({"generator": f"127.0.0.1:{a.port}",
                           "submitter": f"127.0.0.1:{b.port}"}) as client:
            wf = client.generator.generate("train").workflow
            run_id = client.submitter.submit(wf).run_id
            assert submitter.workflows[run_id] == WF
            with pytest.raises(UserError, match="no address given for the monitor service"):
                client.monitor.recommendations("train")
    finally:
        loop.run(a.stop(None))
        loop.run(b.stop(None))
    with pytest.raises(UserError, match="unknown service"):
        CoulerClient({"planner": "x:1"})


def test_client_returns_no_protobuf(client: CoulerClient) -> None:
    """Every public result is IR or a dataclass: nothing of protobuf leaks out."""
    results: list[Any] = [
        client.generator.generate("x"), client.optimizer.optimize(WF),
        client.cache.stats(), client.submitter.submit(WF),
        client.monitor.utilization(workflow="train"),
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
