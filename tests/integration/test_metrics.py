"""Prometheus metrics of the five services, scraped over HTTP after real work (issue 14, item 2).

The five services run in threads as in production (``serve``: gRPC, bus consumers, stores)
on a NATS server of this module's own -- so that the counts are only this module's work --
each with ``COULER_METRICS_ADDRESS`` on a free loopback port and a token. The tests scrape
``/metrics`` with an HTTP client, parse the exposition with prometheus_client's parser and
check that what was done moved what should have moved: a generation refused and one made,
a workflow run to success (runs, steps, submissions, plans, the latency of the calls), the
same workflow again with its steps reused from the cache (hits, bytes and compute saved),
and the JetStream consumers' pending counts while a consumer is held up.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from couler.engines.base import StepState
from couler.errors import UserError
from couler.v1 import events_pb2
from couler_cache.main import CacheSettings
from couler_cache.main import build as build_cache
from couler_generator.main import GeneratorSettings
from couler_generator.main import build as build_generator
from couler_monitor.main import MonitorSettings
from couler_monitor.main import build as build_monitor
from couler_optimizer.main import OptimizerSettings
from couler_optimizer.main import build as build_optimizer
from couler_runtime.bus import Bus, Event
from couler_runtime.client import CoulerClient
from couler_runtime.metrics import METRIC_NAMES, Metrics, MetricsServer
from couler_runtime.rpc.records import RunState
from couler_runtime.service import observe_consumers
from couler_runtime.settings import CommonSettings, SettingsError
from couler_submitter.main import SubmitterSettings
from couler_submitter.main import build as build_submitter
from tests.integration.test_submitter_service import unique, wait_state
from tests.servers import NatsServer, make_root
from tests.service_thread import ServiceThread
from tests.waiting import aeventually, eventually
from tests.workflows import make_and_use

TOKEN = "metrics-test-token"
WAIT = 120.0
NAMES = ("generator", "optimizer", "cache", "submitter", "monitor")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def nats() -> Iterator[NatsServer]:
    root = make_root("nats-metrics")
    server = NatsServer(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Stack:
    services: dict[str, ServiceThread[Any]]
    client: CoulerClient

    def url(self, name: str) -> str:
        return self.services[name].endpoints["metrics"]


@pytest.fixture(scope="module")
def stack(nats: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state = tmp_path_factory.mktemp("metrics-stack")
    common: dict[str, Any] = {
        "nats_url": nats.url, "grpc_address": "127.0.0.1:0", "auth_token": TOKEN,
        "otel_endpoint": None, "bus_insecure": True, "metrics_address": "127.0.0.1:0",
        "artifacts": str(state / "blobs")}

    def db(name: str) -> dict[str, Any]:
        return {"state_dir": state / name, "database_url": f"sqlite:///{state / name}.db"}

    services: dict[str, ServiceThread[Any]] = {}
    try:
        services["cache"] = ServiceThread(
            CacheSettings.load("cache", **common, **db("cache")), build_cache).start()
        cache = services["cache"].address
        services["optimizer"] = ServiceThread(OptimizerSettings.load(
            "optimizer", **common, **db("optimizer"), cache_address=cache),
            build_optimizer).start()
        services["submitter"] = ServiceThread(SubmitterSettings.load(
            "submitter", **common, **db("submitter"), cache_address=cache,
            runs_dir=str(state / "runs"), engines="local", outbox_interval=1.0),
            build_submitter).start()
        services["monitor"] = ServiceThread(MonitorSettings.load(
            "monitor", **common, **db("monitor"), dashboard_address="127.0.0.1:0"),
            build_monitor).start()
        services["generator"] = ServiceThread(
            GeneratorSettings.load("generator", **common, **db("generator")),
            build_generator).start()
        with CoulerClient({n: s.address for n, s in services.items()}, token=TOKEN,
                          timeout=WAIT) as client:
            yield Stack(services, client)
    finally:
        for service in reversed(services.values()):
            service.stop()


def scrape(url: str, token: str | None = TOKEN) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    got = httpx.get(url, headers=headers, timeout=30.0)
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(got.text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if not k.startswith("otel_scope")}
            samples[(s.name, tuple(sorted(labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


def families(samples: Samples) -> set[str]:
    return {n for n, _ in samples}


# ---------------------------------------------------------------------------- the endpoint


def test_every_service_serves_metrics_and_refuses_a_scrape_without_the_token(
        stack: Stack) -> None:
    for name in NAMES:
        url = stack.url(name)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            refused = httpx.get(url, headers=headers, timeout=30.0)
            assert refused.status_code == 401, (name, headers)
            assert refused.headers["www-authenticate"] == "Bearer"
            assert "couler_" not in refused.text
        other = httpx.get(url.replace("/metrics", "/"), timeout=30.0,
                          headers={"Authorization": f"Bearer {TOKEN}"})
        assert other.status_code == 404
        posted = httpx.post(url, timeout=30.0, headers={"Authorization": f"Bearer {TOKEN}"})
        assert posted.status_code == 405
        samples = scrape(url)
        assert value(samples, "target_info", service_name=f"couler-{name}") == 1.0


def test_a_generation_counts_its_outcome_and_its_call_latency(stack: Stack) -> None:
    url = stack.url("generator")
    before = scrape(url)
    with pytest.raises(UserError):
        stack.client.generator.generate("book me a flight to Paris next Tuesday")
    made = stack.client.generator.generate(
        "Load s3://data/sales.csv, train a random forest and evaluate its accuracy")
    assert made.workflow.steps
    after = scrape(url)
    for result in ("refused", "generated"):
        assert value(after, "couler_generator_requests_total", result=result) == \
            value(before, "couler_generator_requests_total", result=result) + 1, result
    method = "/couler.v1.GeneratorService/Generate"
    calls = "couler_rpc_server_duration_seconds_count"
    assert value(after, calls, rpc_method=method, rpc_grpc_status_code="OK") == \
        value(before, calls, rpc_method=method, rpc_grpc_status_code="OK") + 1
    assert value(after, calls, rpc_method=method, rpc_grpc_status_code="INVALID_ARGUMENT") \
        == value(before, calls, rpc_method=method, rpc_grpc_status_code="INVALID_ARGUMENT") + 1


def test_refused_and_unknown_calls_are_counted_without_a_series_per_name(stack: Stack) -> None:
    """A call without the token is counted UNAUTHENTICATED under its method; a method the
    server does not serve (which a caller may name at will) under ``other``."""
    url = stack.url("cache")
    before = scrape(url)
    calls = "couler_rpc_server_duration_seconds_count"
    with grpc.insecure_channel(stack.services["cache"].address) as channel:
        for path in ("/couler.v1.CacheService/Stats", "/couler.v1.CacheService/NoSuch",
                     "/made.up.Service/Thing"):
            call: Any = channel.unary_unary(path)
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", timeout=30.0)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED, path
    after = scrape(url)
    stats = {"rpc_method": "/couler.v1.CacheService/Stats",
             "rpc_grpc_status_code": "UNAUTHENTICATED"}
    assert value(after, calls, **stats) == value(before, calls, **stats) + 1
    other = {"rpc_method": "other", "rpc_grpc_status_code": "UNAUTHENTICATED"}
    assert value(after, calls, **other) == value(before, calls, **other) + 2
    methods = {dict(ls).get("rpc_method", "") for n, ls in after if n == calls}
    assert not any("NoSuch" in m or "made.up" in m for m in methods), methods


def test_a_run_and_its_rerun_from_the_cache_move_the_counters(stack: Stack) -> None:
    client = stack.client
    before = {name: scrape(stack.url(name)) for name in NAMES}
    wf = make_and_use(unique("metrics"))

    first = client.submitter.submit(wf)
    run = wait_state(client, first.run_id, RunState.SUCCEEDED, RunState.FAILED)
    assert run.state is RunState.SUCCEEDED, [(s.name, s.message) for s in run.steps]

    # The monitor counts the run's states and the steps' durations as it consumes them.
    def monitor_saw(samples: Samples, runs: float) -> bool:
        return value(samples, "couler_runs_total", state="succeeded") == runs

    old = before["monitor"]
    eventually(lambda: monitor_saw(scrape(stack.url("monitor")),
                                   value(old, "couler_runs_total", state="succeeded") + 1),
               "the monitor counts the succeeded run", WAIT)
    monitor = scrape(stack.url("monitor"))

    def moved(state: str) -> float:
        return value(monitor, "couler_runs_total", state=state) - \
            value(old, "couler_runs_total", state=state)

    assert moved("failed") == moved("cancelled") == 0
    # States only move forward: one the events reached late (a step's "running" before
    # the submitter's "submitted") is passed over, not counted.
    assert all(moved(s) in (0, 1) for s in ("planning", "pending", "running"))
    assert moved("planning") + moved("pending") + moved("running") >= 1
    assert value(monitor, "couler_step_duration_seconds_count", state="succeeded") == \
        value(old, "couler_step_duration_seconds_count", state="succeeded") + 2
    assert value(monitor, "couler_step_duration_seconds_sum", state="succeeded") > \
        value(old, "couler_step_duration_seconds_sum", state="succeeded")

    # The cache commits both steps from their succeeded events.
    eventually(lambda: value(scrape(stack.url("cache")), "couler_cache_commits_total",
                             result="created")
               == value(before["cache"], "couler_cache_commits_total", result="created") + 2,
               "the cache commits the two steps", WAIT)

    second = client.submitter.submit(wf)
    rerun = wait_state(client, second.run_id, RunState.SUCCEEDED, RunState.FAILED)
    assert rerun.state is RunState.SUCCEEDED
    assert {s.name: s.state for s in rerun.steps} == {"make": StepState.CACHED,
                                                      "use": StepState.CACHED}

    cache, old = scrape(stack.url("cache")), before["cache"]
    # (the optimizer looks up again only the entries the plan uses: "make" is not
    # needed once "use" is reused)
    assert value(cache, "couler_cache_lookups_total", result="hit") >= \
        value(old, "couler_cache_lookups_total", result="hit") + 1
    assert value(cache, "couler_cache_saved_bytes_total") > \
        value(old, "couler_cache_saved_bytes_total")
    assert value(cache, "couler_cache_compute_saved_seconds_total") > \
        value(old, "couler_cache_compute_saved_seconds_total")
    lookups = "/couler.v1.CacheService/Lookup"
    assert value(cache, "couler_rpc_server_duration_seconds_count", rpc_method=lookups,
                 rpc_grpc_status_code="OK") > \
        value(old, "couler_rpc_server_duration_seconds_count", rpc_method=lookups,
              rpc_grpc_status_code="OK")

    submitter, old = scrape(stack.url("submitter")), before["submitter"]
    assert value(submitter, "couler_submitter_submissions_total", engine="local",
                 result="accepted") == \
        value(old, "couler_submitter_submissions_total", engine="local", result="accepted") + 2
    submit = "/couler.v1.SubmitterService/Submit"
    assert value(submitter, "couler_rpc_server_duration_seconds_count", rpc_method=submit,
                 rpc_grpc_status_code="OK") == \
        value(old, "couler_rpc_server_duration_seconds_count", rpc_method=submit,
              rpc_grpc_status_code="OK") + 2

    optimizer, old = scrape(stack.url("optimizer")), before["optimizer"]
    assert value(optimizer, "couler_optimizer_plans_total", engine="local",
                 result="planned") == \
        value(old, "couler_optimizer_plans_total", engine="local", result="planned") + 2
    assert value(optimizer, "couler_optimizer_cached_steps_total") == \
        value(old, "couler_optimizer_cached_steps_total") + 2

    # Every service reports its consumers; with the work done, none has a backlog.
    for name in ("optimizer", "cache", "submitter", "monitor"):
        samples = scrape(stack.url(name))
        consumers = {dict(ls)["consumer"] for n, ls in samples
                     if n == "couler_bus_consumer_pending"}
        assert consumers, name
        assert value(samples, "couler_bus_consumer_pending") == 0, name


def test_the_names_the_services_export_are_the_documented_ones(stack: Stack) -> None:
    seen: set[str] = set()
    for name in NAMES:
        for family in families(scrape(stack.url(name))):
            base = family.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
            seen.add(base if base in METRIC_NAMES else family)
    seen.discard("target_info")
    assert seen <= METRIC_NAMES, seen - METRIC_NAMES
    # What the earlier tests did reached every family but the monitor's recommendations
    # (none is due after one run) and the optimizer's (none was published to it).
    assert METRIC_NAMES - seen <= {"couler_recommendations_total",
                                   "couler_optimizer_recommendations_applied_total"}, \
        METRIC_NAMES - seen
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert all(f"`{n}`" in docs for n in METRIC_NAMES), \
        [n for n in METRIC_NAMES if f"`{n}`" not in docs]


# ---------------------------------------------------------------------------- queue depth


@pytest.mark.anyio
async def test_a_held_up_consumer_shows_its_backlog(nats_server: NatsServer) -> None:
    """Three step events for a consumer whose handler waits: JetStream's pending and
    ack-pending counts, as the gauges report them at a scrape, add up to the three;
    once the handler is let go they drain to zero."""
    bus = await Bus.connect(nats_server.url, name="metrics-backlog")
    meters = Metrics("couler-backlog-test")
    server: MetricsServer | None = None
    started, release = asyncio.Event(), asyncio.Event()
    handled: list[str] = []

    async def handler(event: Event[events_pb2.StepEvent]) -> None:
        started.set()
        await release.wait()
        handled.append(event.message.run_id)

    try:
        await bus.ensure_streams()
        durable = unique("backlog")
        subject = f"couler.step.{durable}"
        for i in range(3):
            await bus.publish(subject, events_pb2.StepEvent(run_id=f"run-{i}"),
                              msg_id=f"{durable}-{i}")
        await bus.subscribe(subject, durable, events_pb2.StepEvent, handler, batch=1)
        observe_consumers(meters, bus)
        server = MetricsServer(meters, "127.0.0.1:0", token=TOKEN)
        url = await server.start()
        await asyncio.wait_for(started.wait(), WAIT)

        def backlog(field: str) -> float:
            return value(scrape(url), f"couler_bus_consumer_{field}", consumer=durable,
                         subject=subject, stream="COULER_STEP")

        held = await asyncio.to_thread(lambda: (backlog("pending"), backlog("ack_pending")))
        assert sum(held) == 3 and held[1] >= 1, held  # one at least is being handled
        release.set()
        await aeventually(lambda: len(handled) == 3, "the three are handled", WAIT)
        # The acks reach JetStream just after the handlers returned.
        await asyncio.to_thread(
            eventually, lambda: backlog("pending") + backlog("ack_pending") == 0,
            "the backlog drains", WAIT)
    finally:
        if server is not None:
            await server.stop()
        await bus.close()
        meters.shutdown()


# ---------------------------------------------------------------------------- settings


def test_the_endpoint_needs_a_token_or_a_loopback_anonymous_setting(tmp_path: Path) -> None:
    def load(**kw: Any) -> CommonSettings:
        return CommonSettings.load("x", state_dir=tmp_path, bus_insecure=True, **kw)

    assert load().metrics_address == ""  # off by default
    with pytest.raises(SettingsError, match="COULER_METRICS_ADDRESS: the metrics endpoint "
                                            "needs COULER_AUTH_TOKEN"):
        load(metrics_address="127.0.0.1:9464")
    with pytest.raises(SettingsError, match="loopback address only"):
        load(metrics_address="0.0.0.0:9464", metrics_anonymous=True)
    with pytest.raises(SettingsError, match="COULER_METRICS_ADDRESS: must be host:port"):
        load(metrics_address="9464", auth_token="t")
    assert load(metrics_address="0.0.0.0:9464", auth_token="t").metrics_address == \
        "0.0.0.0:9464"
    for host in ("127.0.0.1", "[::1]", "localhost"):
        assert load(metrics_address=f"{host}:9464", metrics_anonymous=True).metrics_anonymous


@pytest.mark.anyio
async def test_an_anonymous_endpoint_answers_without_a_token() -> None:
    meters = Metrics("couler-anonymous-test")
    meters.meter("t").create_counter("couler.test.things").add(2, {"kind": "a"})
    server = MetricsServer(meters, "127.0.0.1:0", token=None)
    try:
        url = await server.start()
        samples = await asyncio.to_thread(scrape, url, None)
        assert value(samples, "couler_test_things_total", kind="a") == 2.0
    finally:
        await server.stop()
        meters.shutdown()


# ---------------------------------------------------------------------------- the monitor


def test_the_monitor_counts_what_it_commits_and_publishes(tmp_path: Path) -> None:
    """The monitor's use cases made while a service's metrics are current: five runs of
    a step that succeeds make a retry recommendation, counted once it is published; a
    run's end delivered twice is counted once; a step's duration goes to the histogram."""
    from couler_monitor.service import Monitor as UseCases
    from couler_monitor.store import MonitorStore
    from couler_runtime.metrics import using
    from couler_runtime.rpc.records import Recommendation, Run, StepRecord

    meters = Metrics("couler-monitor-test")
    sent: list[Recommendation] = []

    async def publish(rec: Recommendation) -> None:
        sent.append(rec)

    store = MonitorStore.open(f"sqlite:///{tmp_path / 'monitor.db'}")
    with using(meters):
        monitor = UseCases(store, publish)

    async def scenario() -> Samples:
        for i in range(5):
            t = 1000.0 * (i + 1)
            await monitor.record_step(
                f"run-{i}", "wf", "local",
                StepRecord(name="steady", state=StepState.SUCCEEDED, attempts=1,
                           started_at=t - 2.5, finished_at=t), t)
        done = Run(run_id="run-0", state=RunState.SUCCEEDED, workflow="wf", engine="local",
                   finished_at=6000.0)
        await monitor.record_finished(done)
        await monitor.record_finished(done)  # redelivered
        body, _ = await meters.exposition()
        samples: Samples = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                labels = {k: v for k, v in s.labels.items() if not k.startswith("otel_scope")}
                samples[(s.name, tuple(sorted(labels.items())))] = s.value
        return samples

    try:
        samples = asyncio.run(scenario())
    finally:
        store.close()
        meters.shutdown()
    kinds = [r.kind.value for r in sent]
    assert "retry" in kinds
    for kind in set(kinds):
        assert value(samples, "couler_recommendations_total", kind=kind) == kinds.count(kind)
    assert value(samples, "couler_recommendations_total") == len(sent)
    assert value(samples, "couler_runs_total", state="succeeded", engine="local") == 1
    assert value(samples, "couler_runs_total", state="running") == 5
    assert value(samples, "couler_step_duration_seconds_count", state="succeeded") == 5
    assert value(samples, "couler_step_duration_seconds_sum", state="succeeded") == 12.5
    assert value(samples, "couler_step_duration_seconds_bucket", state="succeeded",
                 le="2.5") == 5
