"""The monitor service in-process against a real nats-server, on SQLite and PostgreSQL.

The service runs as in production -- ``serve(settings, build)`` with its gRPC server on
127.0.0.1:0, its durable consumers on JetStream and its dashboard under uvicorn on the same
loop -- in a thread. The tests publish step events, samples and run events with a bus of
their own, read ``couler.feedback.<workflow>`` with a plain NATS subscription (which sees
every publish, also those JetStream would drop as duplicates), call the gRPC API with the
blocking ``CoulerClient`` and the dashboard over real HTTP with httpx. Only one monitor runs
at a time (instances share the durable consumers); every test uses its own workflow names.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import grpc
import httpx
import pytest
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from couler import ir
from couler.errors import UserError
from couler.v1 import common_pb2, events_pb2, workflow_pb2
from couler_generator.main import GeneratorSettings
from couler_generator.main import build as build_generator
from couler_monitor.events import (
    METRICS_BATCH_DURABLE,
    METRICS_DURABLE,
    STEPS_DURABLE,
    feedback_subject,
)
from couler_monitor.main import MonitorSettings, build
from couler_monitor.recommendations import cpu_quantity, memory_quantity
from couler_monitor.recommender import RecommenderConfig, StepHistory, estimate
from couler_runtime import codec
from couler_runtime.bus import Bus
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import Recommendation, RecommendationKind
from couler_runtime.settings import SettingsError
from tests.integration.test_submitter_service import (
    RealOptimizer,
    optimizer_settings,
    planned,
)
from tests.servers import NatsServer, free_port, scratch_database
from tests.service_thread import Builder
from tests.service_thread import ServiceThread as RunningService

MI = 1024 * 1024
WAIT = 60.0  # a bound on waiting, never an assertion about speed
TOKEN = "monitor-dashboard-token-5f3a9e"
T = TypeVar("T")


# ----------------------------------------------------------------------------- harness


class ServiceThread(RunningService[MonitorSettings]):
    """The monitor service running in a thread (tests/service_thread.py), and its dashboard."""

    def __init__(self, settings: MonitorSettings, builder: Builder = build) -> None:
        super().__init__(settings, builder)

    @property
    def dashboard(self) -> str:
        return f"http://{self.settings.dashboard_address}"


class Records(logging.Handler):
    """Keeps the log lines of the monitor's loggers."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class Monitor:
    """A running monitor (restartable on the same database) and a client for it."""

    nats: NatsServer
    settings: MonitorSettings
    service: ServiceThread
    client: CoulerClient
    logs: Records

    def restart(self) -> None:
        self.client.close()
        self.service.stop()
        self.service = ServiceThread(self.settings).start()
        self.client = CoulerClient({"monitor": self.service.address}, timeout=WAIT,
                                   token=_token(self.settings))

    def close(self) -> None:
        self.client.close()
        self.service.stop()
        logging.getLogger("couler_monitor").removeHandler(self.logs)


def _token(settings: MonitorSettings) -> str | None:
    return settings.auth_token.get_secret_value() if settings.auth_token else None


def start_monitor(nats: NatsServer, state: Path, database_url: str, *,
                  token: str | None = None) -> Monitor:
    settings = MonitorSettings.load(
        "monitor", nats_url=nats.url, grpc_address="127.0.0.1:0", state_dir=state,
        database_url=database_url, auth_token=token, otel_endpoint=None,
        dashboard_address=f"127.0.0.1:{free_port()}", min_runs=2, history_runs=10,
        bus_insecure=True)  # the logic on an open bus: test_bus_security
    logs = Records()
    logging.getLogger("couler_monitor").addHandler(logs)
    logging.getLogger("couler_monitor").setLevel(logging.INFO)
    service = ServiceThread(settings).start()
    client = CoulerClient({"monitor": service.address}, timeout=WAIT, token=token)
    return Monitor(nats, settings, service, client, logs)


@pytest.fixture(scope="class", params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[str]:
    """A fresh database: a SQLite file, or a new database in the session's PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('monitor-db') / 'monitor.db'}"
        return
    with scratch_database(request.getfixturevalue("postgres_url"), "monitor") as url:
        yield url


@pytest.fixture(scope="class")
def monitor(nats_server: NatsServer, database: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitor]:
    running = start_monitor(nats_server, tmp_path_factory.mktemp("monitor"), database)
    yield running
    running.close()


# ----------------------------------------------------------------------------- events


def ts(seconds: float) -> Timestamp:
    out = Timestamp()
    out.FromNanoseconds(round(seconds * 1e9))
    return out


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def step_event(run_id: str, workflow: str, name: str, state: str, *, at: float,
               key: str = "", attempts: int = 1, peak_memory: int | None = None,
               peak_cpu: float | None = None, failure: str = "", message: str = "",
               started: float | None = None, failure_reason: str = "") -> events_pb2.StepEvent:
    record = common_pb2.StepRecord(
        name=name, key=key, state=f"STEP_STATE_{state}", attempts=attempts,
        cached=state == "CACHED", message=message, failure_reason=failure_reason,
        peak_memory_bytes=peak_memory, peak_cpu=peak_cpu,
        failure_class=f"FAILURE_CLASS_{failure}" if failure else "FAILURE_CLASS_UNSPECIFIED")
    if started is not None:
        record.started_at.CopyFrom(ts(started))
    if state in ("SUCCEEDED", "FAILED", "CACHED", "SKIPPED", "CANCELLED"):
        record.finished_at.CopyFrom(ts(at))
    return events_pb2.StepEvent(run_id=run_id, workflow=workflow, engine="local", step=record,
                                at=ts(at))


def step_msg_id(event: events_pb2.StepEvent) -> str:
    s = event.step
    state = common_pb2.StepState.Name(s.state).removeprefix("STEP_STATE_").lower()
    return f"{event.run_id}.{s.name}.{s.key}.{s.attempts}.{state}"


def sample(run_id: str, workflow: str, step: str, at: float, cpu: float,
           memory: int) -> common_pb2.UtilizationSample:
    return common_pb2.UtilizationSample(run_id=run_id, workflow=workflow, step=step, attempt=1,
                                        at=ts(at), cpu=cpu, memory_bytes=memory)


@dataclass
class Outcome:
    """What a test's publishes led to."""

    feedback: list[tuple[Recommendation, dict[str, str]]] = field(default_factory=list)
    # (stream, sequence) of the messages the consumers terminated / of those published here
    terminated: set[tuple[str, int]] = field(default_factory=set)
    sequences: list[tuple[str, int]] = field(default_factory=list)


Publish = tuple[str, Message, str]  # subject, body, msg id


def subject_of(message: Message) -> str:
    if isinstance(message, events_pb2.StepEvent):
        state = common_pb2.StepState.Name(message.step.state).removeprefix("STEP_STATE_")
        return f"couler.step.{state.lower()}"
    if isinstance(message, common_pb2.UtilizationSample):
        return "couler.metrics.utilization"
    if isinstance(message, events_pb2.UtilizationBatch):
        return "couler.metrics.batch"
    names = {events_pb2.WorkflowRequested: "requested", events_pb2.WorkflowSubmitted: "submitted",
             events_pb2.WorkflowFinished: "finished", events_pb2.WorkflowRejected: "rejected",
             events_pb2.WorkflowOptimized: "optimized"}
    return f"couler.workflow.{names[type(message)]}"


def exchange(nats: NatsServer, publishes: Sequence[Publish], *,
             workflows: Sequence[str] = ()) -> Outcome:
    """Publish in order; return once the monitor's consumers answered every message, with
    everything seen on the feedback subjects of ``workflows`` meanwhile."""
    return asyncio.run(_exchange(nats, publishes, workflows))


async def _exchange(nats: NatsServer, publishes: Sequence[Publish],
                    workflows: Sequence[str]) -> Outcome:
    bus = await Bus.connect(nats.url, name="monitor-test")
    out = Outcome()

    async def collect(msg: Any) -> None:
        rec = common_pb2.Recommendation.FromString(msg.data)
        from couler_runtime.rpc.records import recommendation_from_proto
        out.feedback.append((recommendation_from_proto(rec), dict(msg.headers or {})))

    async def terminated(msg: Any) -> None:
        advisory = json.loads(msg.data)
        out.terminated.add((advisory["stream"], advisory["stream_seq"]))

    subs = [await bus.client.subscribe(feedback_subject(wf), cb=collect) for wf in workflows]
    subs.append(await bus.client.subscribe(
        "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>", cb=terminated))
    try:
        await bus.ensure_streams()
        last: dict[tuple[str, str], int] = {}
        for subject, body, msg_id in publishes:
            got = await bus.publish(subject, body, msg_id=msg_id)
            out.sequences.append((got.stream, got.sequence))
            if not got.duplicate:
                last[(got.stream, _durable(subject))] = got.sequence
        # Every message answered (acked or terminated) by its consumer: a bound, not a timing.
        deadline = asyncio.get_running_loop().time() + WAIT
        for (stream, durable), seq in last.items():
            while True:
                info = await bus.jetstream.consumer_info(stream, durable)
                if info.ack_floor is not None and info.ack_floor.stream_seq >= seq:
                    break
                assert asyncio.get_running_loop().time() < deadline, f"{durable} stuck"
                await asyncio.sleep(0.02)
        await bus.client.flush()
        await asyncio.sleep(0)  # let the callbacks of messages already read run
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await bus.close()
    return out


def _durable(subject: str) -> str:
    if subject.startswith("couler.step."):
        return STEPS_DURABLE
    if subject == "couler.metrics.batch":
        return METRICS_BATCH_DURABLE
    if subject.startswith("couler.metrics."):
        return METRICS_DURABLE
    return f"monitor-workflows-{subject.rsplit('.', 1)[1]}"


def steps(*events: events_pb2.StepEvent) -> list[Publish]:
    return [(subject_of(e), e, step_msg_id(e)) for e in events]


def wait_for(what: str, check: Callable[[], T | None]) -> T:
    deadline = time.monotonic() + WAIT
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def by_kind(recs: Sequence[Recommendation]) -> dict[str, Recommendation]:
    return {f"{r.step}:{r.kind.value}": r for r in recs}


def _mi(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity.removesuffix("Mi"))


def _cores(quantity: str) -> float:
    assert quantity.endswith("m"), quantity
    return int(quantity.removesuffix("m")) / 1000


# ----------------------------------------------------------------------------- pure


def test_quantities_round_up_exactly() -> None:
    h = Fraction("1.2")
    assert memory_quantity(300 * MI, h) == "360Mi"
    assert memory_quantity(512 * MI, h) == "615Mi"  # 614.4 rounds up
    assert memory_quantity(1, h) == "1Mi"
    assert cpu_quantity(0.5, h) == "600m"
    assert cpu_quantity(1.8, h) == "2160m"
    assert cpu_quantity(0.0001, h) == "1m"


def test_settings_are_validated(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="COULER_DASHBOARD_ADDRESS"):
        MonitorSettings.load("monitor", state_dir=tmp_path, dashboard_address="nowhere")
    with pytest.raises(SettingsError, match="COULER_SAFETY_MARGIN"):
        MonitorSettings.load("monitor", state_dir=tmp_path, safety_margin=-0.5)
    with pytest.raises(SettingsError, match="COULER_MIN_RUNS"):
        MonitorSettings.load("monitor", state_dir=tmp_path, min_runs=0)
    with pytest.raises(SettingsError, match="COULER_HALF_LIFE_HOURS"):
        MonitorSettings.load("monitor", state_dir=tmp_path, half_life_hours=0)
    defaults = MonitorSettings.load("monitor", state_dir=tmp_path)
    assert (defaults.dashboard_address, defaults.safety_margin, defaults.min_runs,
            defaults.half_life_hours) == ("127.0.0.1:8080", 0.15, 2, 24.0)


# What the service should recommend, from the recommender library itself (the service's
# arithmetic is the library's; these tests check that it is fed what it should be).

def expected_memory(peaks: Sequence[tuple[float, int]], *,
                    config: RecommenderConfig | None = None) -> str:
    """The memory request after runs with these (time, peak) pairs."""
    history = StepHistory.new()
    for at, peak in peaks:
        history.set_memory_peak(at, peak)
        history.count_run()
    got = estimate(history, config or RecommenderConfig()).memory
    assert got is not None
    return memory_quantity(math.ceil(got.target), Fraction(1))


def expected_cpu(samples: Sequence[tuple[float, float]], runs: int) -> str:
    history = StepHistory.new()
    for at, cpu in samples:
        history.add_cpu(at, cpu)
    for _ in range(runs):
        history.count_run()
    got = estimate(history).cpu
    assert got is not None
    return cpu_quantity(got.target, Fraction(1))


def plan_by_the_optimizer(nats: NatsServer, run_id: str, wf: ir.Workflow, state: Path) -> None:
    """Run ``wf`` past the real optimizer: the run's request goes on the bus as the submitter
    sends it, and the optimizer's plan (``couler.workflow.optimized``) is waited for."""
    optimizer = RealOptimizer(optimizer_settings(nats, state / "optimizer")).start()
    try:
        request = events_pb2.WorkflowRequested(
            run_id=run_id, workflow=codec.workflow_to_proto(wf),
            options=events_pb2.RunOptions(engine="local"))

        async def send() -> None:
            bus = await Bus.connect(nats.url, name="monitor-test")
            try:
                await bus.ensure_streams()
                await bus.publish("couler.workflow.requested", request,
                                  msg_id=f"{run_id}.requested")
            finally:
                await bus.close()

        asyncio.run(send())
        planned(nats, run_id)
    finally:
        optimizer.stop()


def run_of(wf: str, step: str, at: float, *, memory: int, cpu: float = 0.5,
           samples: Sequence[tuple[float, float, int]] = ()) -> tuple[str, list[Publish]]:
    """One run of ``step``: its samples (default: one at its end, as the submitter sends
    today) and its SUCCEEDED event at ``at``."""
    run = uid("run")
    series = list(samples) or [(at, cpu, memory)]
    pubs: list[Publish] = [("couler.metrics.utilization", sample(run, wf, step, t, c, m),
                            f"{run}.{step}..1.{i}") for i, (t, c, m) in enumerate(series)]
    pubs += steps(step_event(run, wf, step, "SUCCEEDED", at=at, peak_memory=memory,
                             peak_cpu=max(c for _, c, _ in series), started=series[0][0]))
    return run, pubs


# ----------------------------------------------------------------------------- service


class TestMonitor:
    """Steps, samples and run events in; utilization, recommendations and pages out."""

    def test_steps_and_samples_show_in_utilization(self, monitor: Monitor) -> None:
        wf, run = uid("util"), uid("run")
        t0 = time.time()
        samples = [sample(run, wf, "train", t0 + i, cpu, mem) for i, (cpu, mem) in
                   enumerate([(0.5, 100 * MI), (1.5, 250 * MI), (1.0, 200 * MI)])]
        pubs: list[Publish] = [("couler.metrics.utilization", s, f"{run}.train..1.{i}")
                               for i, s in enumerate(samples)]
        # A redelivered sample (the publisher retried with a fresh id): stored once.
        pubs.append(("couler.metrics.utilization", samples[1], f"{run}.train..1.again"))
        pubs += steps(
            step_event(run, wf, "prep", "SUCCEEDED", at=t0 + 1, peak_memory=64 * MI,
                       peak_cpu=0.2),
            step_event(run, wf, "train", "SUCCEEDED", at=t0 + 5, peak_memory=300 * MI,
                       peak_cpu=1.8, started=t0))
        got = exchange(monitor.nats, pubs)
        assert not got.terminated & set(got.sequences)

        usage = monitor.client.monitor.utilization(run_id=run)
        assert [(s.step, s.cpu, s.memory_bytes) for s in usage.samples] == [
            ("train", 0.5, 100 * MI), ("train", 1.5, 250 * MI), ("train", 1.0, 200 * MI)]
        assert usage.samples[0].at == pytest.approx(t0, abs=1e-6)
        peaks = {p.step: p for p in usage.peaks}
        assert set(peaks) == {"prep", "train"}
        # The step's own measured peak is higher than any sample; the CPU peak too.
        assert (peaks["train"].peak_memory_bytes, peaks["train"].peak_cpu,
                peaks["train"].samples) == (300 * MI, 1.8, 3)
        assert (peaks["prep"].peak_memory_bytes, peaks["prep"].samples) == (64 * MI, 0)
        assert all(p.workflow == wf and p.run_id == run for p in usage.peaks)

        only_train = monitor.client.monitor.utilization(workflow=wf, step="train", limit=2)
        assert [s.memory_bytes for s in only_train.samples] == [250 * MI, 200 * MI]  # newest 2
        assert [p.step for p in only_train.peaks] == ["train"]

        with pytest.raises(UserError, match="run_id") as caught:
            monitor.client.monitor.utilization()
        cause = caught.value.__cause__
        assert isinstance(cause, grpc.RpcError)
        assert cause.code() is grpc.StatusCode.INVALID_ARGUMENT

    def test_requests_come_after_two_runs_once_with_their_evidence(
            self, monitor: Monitor) -> None:
        wf = uid("wf")
        t0 = time.time()
        run1, first = run_of(wf, "train", t0, memory=300 * MI)
        # redelivered (a new id) and duplicated (the same id): still one run, one sample
        again = [(subj, body, f"{mid}.redelivered") for subj, body, mid in first]
        got = exchange(monitor.nats, first + again + first, workflows=[wf])
        assert got.feedback == []  # one run recommends nothing
        assert monitor.client.monitor.recommendations(wf) == ()

        _, second = run_of(wf, "train", t0 + 10, memory=300 * MI)
        got = exchange(monitor.nats, second + second, workflows=[wf])
        want_mem = expected_memory([(t0, 300 * MI), (t0 + 10, 300 * MI)])
        want_cpu = expected_cpu([(t0, 0.5), (t0 + 10, 0.5)], runs=2)
        assert sorted((r.kind.value, r.value) for r, _ in got.feedback) == [
            ("cpu_request", want_cpu), ("memory_request", want_mem)]  # once each
        # p95 of two 300Mi peaks, +15% margin, x1.25 for two runs only
        assert 300 * 1.4375 <= int(want_mem.removesuffix("Mi")) <= 300 * 1.4375 * 1.07
        mem, headers = next((r, h) for r, h in got.feedback
                            if r.kind is RecommendationKind.MEMORY_REQUEST)
        assert (mem.workflow, mem.step) == (wf, "train")
        assert mem.id == f"{wf}/train/memory_request/{want_mem}" == headers["Nats-Msg-Id"]
        assert (mem.target, mem.percentile, mem.runs, mem.samples) == (want_mem, 0.95, 2, 2)
        assert mem.span_seconds == pytest.approx(10, abs=1e-3)
        assert _mi(mem.lower_bound) <= _mi(mem.target) <= _mi(mem.upper_bound)
        assert "p95 of 2 runs' peaks" in mem.reason and "+15% margin" in mem.reason
        assert mem.based_on_samples == 2

        current = by_kind(monitor.client.monitor.recommendations(wf))
        cpu = current["train:cpu_request"]
        assert current["train:memory_request"].value == want_mem
        assert (cpu.value, cpu.percentile, cpu.runs, cpu.samples) == (want_cpu, 0.9, 2, 2)

        # A lower peak in a later run: the target moves less than 10% and the request
        # stays in the new range: nothing published, the evidence updated in place.
        _, lower = run_of(wf, "train", t0 + 20, memory=280 * MI)
        assert exchange(monitor.nats, lower, workflows=[wf]).feedback == []
        kept = by_kind(monitor.client.monitor.recommendations(wf))["train:memory_request"]
        assert kept.value == want_mem and kept.runs == 3 and kept.target != want_mem

        _, higher = run_of(wf, "train", t0 + 30, memory=600 * MI)
        got = exchange(monitor.nats, higher, workflows=[wf])
        raised = expected_memory([(t0, 300 * MI), (t0 + 10, 300 * MI), (t0 + 20, 280 * MI),
                                  (t0 + 30, 600 * MI)])
        assert [(r.kind, r.value) for r, _ in got.feedback
                if r.kind is RecommendationKind.MEMORY_REQUEST] == [
            (RecommendationKind.MEMORY_REQUEST, raised)]
        current = by_kind(monitor.client.monitor.recommendations(wf, step="train"))
        assert current["train:memory_request"].value == raised
        assert current["train:memory_request"].based_on_samples == 4
        assert monitor.client.monitor.recommendations(wf, step="other") == ()
        assert run1

    def test_cpu_follows_use_over_time_not_the_start_up_peak(self, monitor: Monitor) -> None:
        """A step that starts an interpreter at 1.4 cores for a second and then idles: the
        series of samples (mean cores per interval) makes the CPU request, not the peak."""
        wf = uid("cpu")
        t0 = time.time()
        pubs: list[Publish] = []
        samples: list[tuple[float, float]] = []
        for r in range(2):
            start = t0 + r * 100
            series = [(start + i, 1.4 if i == 0 else 0.05, 40 * MI) for i in range(20)]
            samples += [(t, c) for t, c, _ in series]
            pubs += run_of(wf, "hello", start + 20, memory=40 * MI, samples=series)[1]
        got = exchange(monitor.nats, pubs + pubs, workflows=[wf])  # and all redelivered
        assert not got.terminated & set(got.sequences)
        cpu = by_kind(monitor.client.monitor.recommendations(wf))["hello:cpu_request"]
        assert cpu.value == expected_cpu(samples, runs=2)
        assert _cores(cpu.value) < 0.1  # not 1.4 cores x 1.2
        assert (cpu.samples, cpu.runs, cpu.percentile) == (40, 2, 0.9)  # each sample once
        assert cpu.span_seconds == pytest.approx(119, abs=1e-3)  # first to last sample
        assert "p90 of 40 samples over 2 runs" in cpu.reason

    def test_recommendations_with_current_requests_over_grpc_dashboard_and_cli(
            self, monitor: Monitor, tmp_path: Path) -> None:
        """The latest plan's requests (couler.workflow.optimized) are the current ones; the
        gRPC answer, the dashboard's page and JSON and ``couler recommend`` show them beside
        the recommendations and their evidence."""
        wf = uid("rec")
        hostile = '<img src=x onerror="alert(1)">'
        t0 = time.time()
        body = ir.ContainerSpec(image="alpine", command=("true",))
        requested = ir.Workflow(
            name=wf, defaults=ir.StepDefaults(resources=ir.Resources(cpu_request="250m")),
            steps=(ir.Step(name="train", body=body, resources=ir.Resources(
                cpu_request="2", memory_request="4Gi")), ir.Step(name="prep", body=body)))
        # the real optimizer plans it; the monitor reads the plan off the bus
        run_id = uid("run")
        plan_by_the_optimizer(monitor.nats, run_id, requested, tmp_path)
        wait_for("the plan's requests at the monitor", lambda: monitor.client.monitor
                 .recommendation_report(wf).requested)
        pubs: list[Publish] = []
        for i in range(2):
            pubs += run_of(wf, "train", t0 + i, memory=300 * MI)[1]
            pubs += run_of(wf, hostile, t0 + i, memory=20 * MI)[1]
        got = exchange(monitor.nats, pubs)
        assert not got.terminated & set(got.sequences)

        report = monitor.client.monitor.recommendation_report(wf)
        planned = {q.step: q.resources for q in report.requested}
        assert planned[""].cpu_request == "250m"
        assert (planned["train"].cpu_request, planned["train"].memory_request) == ("2", "4Gi")
        assert "prep" not in planned  # it takes the defaults
        assert {q.run_id for q in report.requested} == {run_id}
        recs = by_kind(report.recommendations)
        mem = recs["train:memory_request"]
        assert mem.value == expected_memory([(t0, 300 * MI), (t0 + 1, 300 * MI)])
        assert (mem.percentile, mem.runs, mem.target) == (0.95, 2, mem.value)
        assert mem.lower_bound and mem.upper_bound
        only = monitor.client.monitor.recommendation_report(wf, step="train")
        assert {r.step for r in only.recommendations} == {"train"}

        with httpx.Client(base_url=monitor.service.dashboard, timeout=WAIT) as http:
            page = http.get(f"/recommendations/{quote(wf, safe='')}")
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            assert "default-src 'none'" in page.headers["content-security-policy"]
            text = page.text
            assert "<img" not in text and "&lt;img src=x" in text
            train = [r for r in text.split("<tr>") if "<td>train</td>" in r]
            row = next(r for r in train if "memory_request" in r)
            assert "<td>4Gi</td>" in row and f"<b>{mem.value}</b>" in row
            assert "<td>p95</td><td>2</td>" in row
            assert f"{mem.lower_bound}..{mem.upper_bound}" in row
            cpu_row = next(r for r in train if "cpu_request" in r)
            assert "<td>2</td>" in cpu_row  # the current request: 2 cores
            api = http.get(f"/api/recommendations/{quote(wf, safe='')}").json()
            assert api["workflow"] == wf and api["planned"] is True
            by_step = {s["step"]: s for s in api["steps"]}
            assert set(by_step) == {"train", hostile}
            assert by_step[hostile]["current"]["cpu_request"] == "250m"  # the defaults
            got_mem = next(r for r in by_step["train"]["recommendations"]
                           if r["kind"] == "memory_request")
            assert (got_mem["value"], got_mem["runs"], got_mem["percentile"]) == (
                mem.value, 2, 0.95)
            index = http.get("/").text
            assert f'href="/recommendations/{wf}"' in index
            none = http.get("/recommendations/no-such-workflow")
            assert none.status_code == 200 and "Nothing recommended yet" in none.text
            assert http.get("/api/recommendations/").status_code in (400, 404)

        def cli(*argv: str, address: str = monitor.service.address) -> tuple[int, str, str]:
            from couler.cli import main

            out, err = io.StringIO(), io.StringIO()
            code = main(["recommend", *argv, "--address", address], out=out, err=err)
            return code, out.getvalue(), err.getvalue()

        code, text, err = cli(wf)
        assert code == 0, err
        assert "current requests from its latest plan the monitor saw" in text
        line = next(x for x in text.splitlines() if x.startswith("train ")
                    and "memory_request" in x)
        assert "4Gi" in line and mem.value in line
        assert "p95 of 2 runs" in line
        assert "why:" in text and "p95 of 2 runs' peaks" in text
        code, text, err = cli(wf, "--json")
        assert code == 0, err
        doc = json.loads(text)
        assert doc["current_from"] == "plan"
        steps_ = {x["step"]: x for x in doc["steps"]}
        assert steps_["train"]["current"]["memory_request"] == "4Gi"
        assert {r["kind"]: r["value"] for r in steps_["train"]["recommendations"]}[
            "memory_request"] == mem.value

        program = tmp_path / "pipeline.py"
        program.write_text(
            "import couler.argo as couler\n"
            f"couler.config_workflow(name={wf!r})\n"
            "couler.run_container(image='python:3.12-slim', command=['python', '-m', 't'],\n"
            "                     step_name='train', resources={'cpu': '1', 'memory': '1Gi'})\n"
            "couler.run_container(image='python:3.12-slim', command=['true'],\n"
            "                     step_name='prep')\n")
        code, text, err = cli(str(program))
        assert code == 0, err
        assert "current requests from the program's IR" in text
        line = next(x for x in text.splitlines() if x.startswith("train ")
                    and "memory_request" in x)
        assert "1Gi" in line and mem.value in line
        prep = next(x for x in text.splitlines() if x.startswith("prep "))
        assert "no recommendation yet" in prep
        code, text, err = cli(str(program), "--json", "--step", "train")
        assert [x["step"] for x in json.loads(text)["steps"]] == ["train"]

        code, text, err = cli(uid("never-seen"))
        assert code == 0 and "unknown (the monitor saw no plan of it)" in text
        code, text, err = cli(wf, "--timeout", "2", address=f"127.0.0.1:{free_port()}")
        assert code == 2 and "is not reachable" in err and len(err.splitlines()) == 1

    def test_out_of_memory_recommends_a_limit_and_retries(self, monitor: Monitor) -> None:
        wf, run = uid("oom"), uid("run")
        t0 = time.time()
        got = exchange(monitor.nats, steps(
            step_event(run, wf, "fit", "RUNNING", at=t0, started=t0),
            step_event(run, wf, "fit", "RETRYING", at=t0 + 1, peak_memory=512 * MI,
                       failure="OOM", message="OOMKilled"),
            step_event(run, wf, "fit", "FAILED", at=t0 + 2, attempts=2, peak_memory=500 * MI,
                       failure="OOM", message="OOMKilled"),
        ), workflows=[wf])
        current = by_kind(monitor.client.monitor.recommendations(wf))
        assert current["fit:memory_limit"].value == "1024Mi"  # 2 x the 512Mi it was killed at
        assert current["fit:memory_limit"].failure_class is not None
        assert current["fit:memory_limit"].failure_class.value == "oom"
        assert current["fit:retry"].value == "2"
        assert current["fit:retry"].failure_class is not None
        assert current["fit:retry"].failure_class.value == "oom"
        assert "fit:memory_request" not in current  # one run sets no request
        published = {(r.kind.value, r.value) for r, _ in got.feedback}
        assert published == {("memory_limit", "1024Mi"), ("retry", "2")}
        # Each value went out once, although the OOM record was seen twice.
        assert len(got.feedback) == len(published)
        # A second run that was killed too: its memory request counts the kills bumped up
        # (VPA's OOM bump: max(peak * 1.2, peak + 100Mi)), not the peak it was stopped at.
        exchange(monitor.nats, steps(step_event(
            uid("run"), wf, "fit", "FAILED", at=t0 + 5, peak_memory=512 * MI, failure="OOM",
            message="OOMKilled")), workflows=[wf])
        current = by_kind(monitor.client.monitor.recommendations(wf))
        bumped = 512 * MI * 1.2
        assert current["fit:memory_request"].value == expected_memory(
            [(t0 + 1, round(bumped)), (t0 + 5, round(bumped))])

    def test_dashboard_lists_runs_steps_and_cache_hits_escaped(self, monitor: Monitor,
                                                               tmp_path: Path) -> None:
        wf = uid("dash")
        run = uid('run-<script>alert("x")</script>&')
        hostile = '<img src=x onerror="alert(1)"> & done'
        t0 = time.time()
        workflow = workflow_pb2.Workflow(name=wf)
        finished = common_pb2.Run(
            run_id=run, workflow=wf, state="RUN_STATE_SUCCEEDED", engine="local",
            started_at=ts(t0), finished_at=ts(t0 + 9), message=hostile)
        pubs: list[Publish] = [
            ("couler.workflow.requested",
             events_pb2.WorkflowRequested(run_id=run, workflow=workflow,
                                          options=events_pb2.RunOptions(engine="local")),
             f"{uuid.uuid4().hex}.requested"),
            ("couler.workflow.submitted",
             events_pb2.WorkflowSubmitted(run_id=run, workflow=wf, engine="local",
                                          at=ts(t0)), f"{uuid.uuid4().hex}.submitted"),
        ]
        pubs += steps(
            step_event(run, wf, "prep", "CACHED", at=t0 + 1, attempts=0),
            step_event(run, wf, "train", "RUNNING", at=t0 + 2, started=t0 + 2),
            step_event(run, wf, "train", "SUCCEEDED", at=t0 + 8, started=t0 + 2,
                       peak_memory=128 * MI, peak_cpu=0.75, message=hostile),
        )
        pubs.append(("couler.workflow.finished", events_pb2.WorkflowFinished(run=finished),
                     f"{uuid.uuid4().hex}.finished.0"))
        # A text the real generator cannot plan: it answers couler.workflow.rejected.
        rejected = uid("rejected")
        pubs.append(("couler.workflow.requested",
                     events_pb2.WorkflowRequested(run_id=rejected,
                                                  text="book me a flight to <Paris>"),
                     f"{rejected}.requested"))
        generator = RunningService(GeneratorSettings.load(
            "generator", nats_url=monitor.nats.url, grpc_address="127.0.0.1:0",
            state_dir=tmp_path / "generator", llm_base_url="", llm_model="", auth_token=None,
            otel_endpoint=None, bus_insecure=True), build_generator).start()
        try:
            got = exchange(monitor.nats, pubs)
            assert not got.terminated & set(got.sequences)
            wait_for("the generator's rejection at the monitor", lambda: any(
                rejected in r and ">failed<" in r for r in httpx.get(
                    f"{monitor.service.dashboard}/", timeout=WAIT).text.split("<tr>")))
        finally:
            generator.stop()

        with httpx.Client(base_url=monitor.service.dashboard, timeout=WAIT) as http:
            assert http.get("/healthz").json() == {"status": "ok"}
            index = http.get("/")
            assert index.status_code == 200
            assert index.headers["content-type"].startswith("text/html")
            page = index.text
            assert "<script>" not in page and "onerror=\"alert" not in page
            assert 'run-&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;' in page
            table = page.split('<table class="runs">', 1)[1]
            row = next(r for r in table.split("<tr>") if wf in r)
            assert ">succeeded<" in row and ">local<" in row
            assert "<td>2/2</td><td>1</td>" in row  # steps done/total, cached steps
            assert "9.0 s" in row
            failed = next(r for r in table.split("<tr>") if rejected in r)
            assert ">failed<" in failed

            detail = http.get(f"/runs/{quote(run, safe='')}")
            assert detail.status_code == 200
            text = detail.text
            assert "<img" not in text and "<script>" not in text
            assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt; &amp; done" in text
            prep = next(r for r in text.split("<tr>") if "<td>prep</td>" in r)
            assert '<span class="cached">cached</span>' in prep and ">cached<" in prep
            train = next(r for r in text.split("<tr>") if "<td>train</td>" in r)
            assert "128.0 Mi" in train and "0.75 cores" in train and "6.0 s" in train
            assert 'class="cached"' not in train

            api = http.get(f"/api/runs/{quote(run, safe='')}").json()
            assert (api["run_id"], api["workflow"], api["state"]) == (run, wf, "succeeded")
            assert (api["steps_done"], api["steps_total"], api["cached_steps"]) == (2, 2, 1)
            assert {s["name"]: s["cached"] for s in api["steps"]} == {"prep": True,
                                                                      "train": False}
            assert api["message"] == hostile  # JSON carries the text as it is
            listed = {r["run_id"]: r for r in http.get("/api/runs").json()}
            assert listed[rejected]["state"] == "failed"
            # the generator's own reason, as it is (markup and all: JSON, not HTML)
            assert listed[rejected]["message"].startswith("rejected by the generator: ")
            assert "cannot plan 'book me a flight to <Paris>'" in listed[rejected]["message"]
            usage = http.get("/api/utilization", params={"workflow": wf}).json()
            assert {p["step"]: p["peak_memory_bytes"] for p in usage["peaks"]} == {
                "train": 128 * MI}
            assert http.get("/api/runs/no-such-run").status_code == 404
            assert http.get("/runs/no-such-run").status_code == 404
            assert http.get("/api/utilization").status_code == 400

    def test_dashboard_shows_a_hook_that_did_not_fire_as_skipped_with_why(
            self, monitor: Monitor) -> None:
        """The submitter records an exit hook that did not fire SKIPPED, with why, and
        publishes its step event; the run's page and its JSON show both, and count it done."""
        wf, run = uid("hooks"), uid("run")
        why = "exit hook on failed did not fire: the run succeeded"
        t0 = time.time()
        finished = common_pb2.Run(run_id=run, workflow=wf, state="RUN_STATE_SUCCEEDED",
                                  engine="argo", started_at=ts(t0), finished_at=ts(t0 + 5))
        pubs = steps(
            step_event(run, wf, "work", "SUCCEEDED", at=t0 + 3, started=t0 + 1),
            step_event(run, wf, "always", "SUCCEEDED", at=t0 + 4, started=t0 + 4),
            step_event(run, wf, "mourn", "SKIPPED", at=t0 + 5, attempts=0, message=why))
        pubs.append(("couler.workflow.finished", events_pb2.WorkflowFinished(run=finished),
                     f"{run}.finished.0"))
        got = exchange(monitor.nats, pubs)
        assert not got.terminated & set(got.sequences)

        with httpx.Client(base_url=monitor.service.dashboard, timeout=WAIT) as http:
            text = http.get(f"/runs/{quote(run, safe='')}").text
            # styled apart from pending and running
            assert ".state-skipped" in http.get("/static/console.css").text
            assert "3/3 steps done" in text
            mourn = next(r for r in text.split("<tr>") if "<td>mourn</td>" in r)
            assert '<td class="state-skipped">skipped</td><td>0</td>' in mourn
            assert f'<td class="msg">{why}</td>' in mourn
            always = next(r for r in text.split("<tr>") if "<td>always</td>" in r)
            assert '<td class="state-succeeded">succeeded</td>' in always
            api = http.get(f"/api/runs/{quote(run, safe='')}").json()
            assert api["state"] == "succeeded"
            assert (api["steps_done"], api["steps_total"]) == (3, 3)
            (hook,) = [s for s in api["steps"] if s["name"] == "mourn"]
            assert (hook["state"], hook["message"], hook["attempts"]) == ("skipped", why, 0)

    def test_a_failed_step_says_which_class_and_why(self, monitor: Monitor) -> None:
        wf, run = uid("why"), uid("run")
        dns = "infrastructure: a DNS error (name resolution) in the log"
        bug = ("user error: Python ValueError in the traceback; not retried: the policy "
               "retries transient, infra, oom")
        t0 = time.time()
        got = exchange(monitor.nats, steps(
            step_event(run, wf, "fetch", "RETRYING", at=t0 + 1, failure="INFRA",
                       failure_reason=dns, message="exit code 1"),
            step_event(run, wf, "fetch", "SUCCEEDED", at=t0 + 3, attempts=2),
            step_event(run, wf, "train", "FAILED", at=t0 + 5, failure="USER",
                       failure_reason=bug, message="exit code 1: ValueError: bad")))
        assert not got.terminated & set(got.sequences)
        with httpx.Client(base_url=monitor.service.dashboard, timeout=WAIT) as http:
            text = http.get(f"/runs/{quote(run, safe='')}").text
            train = next(r for r in text.split("<tr>") if "<td>train</td>" in r)
            assert ('<td class="state-failed">failed <span class="why">(user error: Python '
                    "ValueError in the traceback; not retried") in train
            fetch = next(r for r in text.split("<tr>") if "<td>fetch</td>" in r)
            assert 'class="why"' not in fetch  # it succeeded in the end
            api = http.get(f"/api/runs/{quote(run, safe='')}").json()
            by = {s["name"]: s for s in api["steps"]}
            assert (by["train"]["failure_class"], by["train"]["failure_reason"]) == ("user", bug)
            assert by["fetch"]["failure_reason"] == ""

    def test_batches_of_samples_are_stored_and_a_bad_sample_only_is_left_out(
            self, monitor: Monitor) -> None:
        wf, run = uid("batch"), uid("run")
        t0 = time.time()
        series = [sample(run, wf, "train", t0 + i, 0.5 + i, (100 + i) * MI) for i in range(3)]
        for s in series:
            s.interval_seconds = 1.0
            s.run_id = ""  # the batch's run
        bad = sample(run, wf, "train", t0 + 9, -1.0, MI)
        batch = events_pb2.UtilizationBatch(run_id=run, samples=[*series[:2], bad, series[2]])
        again = events_pb2.UtilizationBatch(run_id=run, samples=series[1:])  # redelivered
        no_run = events_pb2.UtilizationBatch(samples=series)
        got = exchange(monitor.nats, [
            ("couler.metrics.batch", batch, f"{run}.metrics.1"),
            ("couler.metrics.batch", again, f"{run}.metrics.2"),
            ("couler.metrics.batch", no_run, f"{run}.metrics.3")])
        assert got.sequences[:2] and not set(got.sequences[:2]) & got.terminated
        assert got.sequences[2] in got.terminated  # no run: which run's would they be?
        usage = monitor.client.monitor.utilization(run_id=run)
        assert [(s.step, s.cpu, s.memory_bytes >> 20, s.interval_seconds)
                for s in usage.samples] == [("train", 0.5, 100, 1.0), ("train", 1.5, 101, 1.0),
                                            ("train", 2.5, 102, 1.0)]
        assert usage.peaks[0].samples == 3

    def test_bad_input_is_terminated_and_the_service_stays_up(self, monitor: Monitor) -> None:
        wf, run = uid("bad"), uid("run")
        t0 = time.time()
        no_run = step_event("", wf, "train", "SUCCEEDED", at=t0, peak_memory=MI)
        no_name = step_event(run, wf, "", "SUCCEEDED", at=t0)
        bad_sample = sample(run, wf, "train", t0, -1.0, MI)
        good = step_event(run, wf, "train", "SUCCEEDED", at=t0, peak_memory=10 * MI)
        good2 = step_event(uid("run"), wf, "train", "SUCCEEDED", at=t0, peak_memory=10 * MI)
        pubs = [(subject_of(no_run), no_run, f"{run}.no-run-id"), *steps(no_name),
                ("couler.metrics.utilization", bad_sample, f"{run}.bad-sample"),
                *steps(good, good2)]
        got = exchange(monitor.nats, pubs)
        assert set(got.sequences[:3]) <= got.terminated
        assert not set(got.sequences[3:]) & got.terminated
        floored = by_kind(monitor.client.monitor.recommendations(wf))["train:memory_request"]
        assert floored.value == "16Mi"  # raised to the floor
        assert "raised to the minimum 16Mi" in floored.reason
        with pytest.raises(UserError, match="workflow"):
            monitor.client.monitor.recommendations("")

    def test_restart_keeps_history(self, monitor: Monitor) -> None:
        wf, run = uid("keep"), uid("run")
        t0 = time.time()
        exchange(monitor.nats, [
            ("couler.metrics.utilization", sample(run, wf, "train", t0, 0.25, 90 * MI),
             f"{run}.s1"),
            *steps(step_event(run, wf, "train", "SUCCEEDED", at=t0 + 1,
                              peak_memory=100 * MI, peak_cpu=0.25)),
            *run_of(wf, "train", t0 + 1, memory=100 * MI)[1],
        ], workflows=[wf])
        before = monitor.client.monitor.recommendations(wf)
        assert by_kind(before)["train:memory_request"].value == expected_memory(
            [(t0, 100 * MI), (t0 + 1, 100 * MI)])
        monitor.restart()
        assert monitor.client.monitor.recommendations(wf) == before
        usage = monitor.client.monitor.utilization(run_id=run)
        assert [s.memory_bytes for s in usage.samples] == [90 * MI]
        with httpx.Client(base_url=monitor.service.dashboard, timeout=WAIT) as http:
            api = http.get(f"/api/runs/{run}").json()
        assert api["steps"][0]["peak_memory_bytes"] == 100 * MI
        # The same run again after the restart: nothing new to recommend, nothing published.
        again = exchange(monitor.nats, steps(step_event(
            run, wf, "train", "SUCCEEDED", at=t0 + 1, peak_memory=100 * MI,
            peak_cpu=0.25)), workflows=[wf])
        assert again.feedback == []
        assert any(line.startswith("dashboard at http://127.0.0.1:") for line in
                   monitor.logs.lines)
        # The histograms were kept too: a third run is weighed with the first two.
        exchange(monitor.nats, run_of(wf, "train", t0 + 2, memory=200 * MI)[1],
                 workflows=[wf])
        assert by_kind(monitor.client.monitor.recommendations(wf))[
            "train:memory_request"].value == expected_memory(
            [(t0, 100 * MI), (t0 + 1, 100 * MI), (t0 + 2, 200 * MI)])

    def test_run_states_only_move_forward(self, monitor: Monitor) -> None:
        wf, run = uid("states"), uid("run")
        t0 = time.time()

        def state() -> str:
            with httpx.Client(base_url=monitor.service.dashboard, timeout=WAIT) as http:
                return str(http.get(f"/api/runs/{run}").json()["state"])

        def finished(retries: int, run_state: str, at: float) -> Publish:
            record = common_pb2.Run(run_id=run, workflow=wf, state=f"RUN_STATE_{run_state}",
                                    engine="local", started_at=ts(t0), finished_at=ts(at),
                                    retries=retries)
            return ("couler.workflow.finished", events_pb2.WorkflowFinished(run=record),
                    f"{run}.finished.{retries}.{uuid.uuid4().hex}")

        submitted: Publish = ("couler.workflow.submitted", events_pb2.WorkflowSubmitted(
            run_id=run, workflow=wf, engine="local", at=ts(t0)), f"{uuid.uuid4().hex}")
        exchange(monitor.nats, [submitted])
        assert state() == "pending"
        exchange(monitor.nats, steps(step_event(run, wf, "a", "RUNNING", at=t0 + 1)))
        assert state() == "running"
        first_end = finished(0, "FAILED", t0 + 5)
        exchange(monitor.nats, [first_end])
        assert state() == "failed"
        # Redelivered older events do not move it back.
        old_step = step_event(run, wf, "a", "RUNNING", at=t0 + 1)
        exchange(monitor.nats, [(submitted[0], submitted[1], uuid.uuid4().hex),
                                (subject_of(old_step), old_step, uuid.uuid4().hex)])
        assert state() == "failed"
        # A step event published late (after the end) does not reopen the run ...
        exchange(monitor.nats, steps(step_event(run, wf, "a", "RUNNING", at=t0 + 8)))
        assert state() == "failed"
        # ... a Retry does: the engine accepts the run again, then its steps run ...
        exchange(monitor.nats, [("couler.workflow.submitted", events_pb2.WorkflowSubmitted(
            run_id=run, workflow=wf, engine="local", at=ts(t0 + 9)), f"{run}.submitted.1")])
        assert state() == "pending"
        exchange(monitor.nats, steps(step_event(run, wf, "a", "RUNNING", at=t0 + 10,
                                                attempts=2)))
        assert state() == "running"
        # ... and a redelivery of the first end does not end it again; the retry's end does.
        exchange(monitor.nats, [(first_end[0], first_end[1], uuid.uuid4().hex)])
        assert state() == "running"
        exchange(monitor.nats, [finished(1, "SUCCEEDED", t0 + 20)])
        assert state() == "succeeded"


# ----------------------------------------------------------------------------- auth


@pytest.fixture(scope="class")
def guarded(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Monitor]:
    state = tmp_path_factory.mktemp("monitor-auth")
    running = start_monitor(nats_server, state, f"sqlite:///{state / 'monitor.db'}",
                            token=TOKEN)
    yield running
    running.close()


class TestDashboardToken:
    """With COULER_AUTH_TOKEN set, every page but /healthz needs it."""

    def test_pages_need_the_token(self, guarded: Monitor) -> None:
        with httpx.Client(base_url=guarded.service.dashboard, timeout=WAIT,
                          follow_redirects=False) as http:
            assert http.get("/healthz").status_code == 200
            for path in ("/", "/runs/x", "/api/runs", "/api/utilization?workflow=x",
                         "/recommendations/x", "/api/recommendations/x"):
                denied = http.get(path)
                assert denied.status_code == 401, path
                assert denied.headers["www-authenticate"] == "Bearer"
            assert http.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert http.get("/?token=wrong").status_code == 401
            assert http.get("/api/runs",
                            headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200

            # A browser: ?token= once sets an HttpOnly cookie and drops the token from the URL.
            first = http.get(f"/?token={TOKEN}")
            assert first.status_code == 303
            assert first.headers["location"] == "/"
            cookie = first.headers["set-cookie"]
            assert "HttpOnly" in cookie and TOKEN not in cookie
            assert http.get("/").status_code == 200  # the client kept the cookie
            kept = http.get(f"/api/utilization?workflow=x&token={TOKEN}")
            assert kept.headers["location"] == "/api/utilization?workflow=x"
        with httpx.Client(base_url=guarded.service.dashboard, timeout=WAIT) as fresh:
            assert fresh.get("/").status_code == 401  # no cookie, no token

    def test_grpc_needs_the_token_too(self, guarded: Monitor) -> None:
        wf = uid("auth")
        assert guarded.client.monitor.recommendations(wf) == ()
        with CoulerClient({"monitor": guarded.service.address}, timeout=WAIT) as anonymous, \
                pytest.raises(UserError) as caught:
            anonymous.monitor.recommendations(wf)
        cause = caught.value.__cause__
        assert isinstance(cause, grpc.RpcError)
        assert cause.code() is grpc.StatusCode.UNAUTHENTICATED
        assert any("token required" in line for line in guarded.logs.lines)


# ----------------------------------------------------------------------------- process


def test_process_logs_the_dashboard_and_stops_on_sigterm(nats_server: NatsServer,
                                                          tmp_path: Path) -> None:
    """``python -m couler_monitor.main`` as ``couler up`` starts it: ready line, dashboard
    URL in the log, SIGTERM (not taken over by uvicorn) stops it with status 0."""
    port = free_port()
    env = {**os.environ, "COULER_NATS_URL": nats_server.url,
           "COULER_GRPC_ADDRESS": "127.0.0.1:0", "COULER_STATE_DIR": str(tmp_path),
           "COULER_DASHBOARD_ADDRESS": f"127.0.0.1:{port}", "COULER_BUS_INSECURE": "true"}
    for name in ("COULER_AUTH_TOKEN", "COULER_DATABASE_URL", "COULER_OTEL_ENDPOINT"):
        env.pop(name, None)
    log = tmp_path / "stderr.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "couler_monitor.main"], env=env,
                                stdout=subprocess.PIPE, stderr=err)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()  # blocks until ready (or exit)
            assert line.startswith("COULER-READY monitor 127.0.0.1:"), log.read_text()
            assert f"dashboard at http://127.0.0.1:{port}/" in log.read_text()
            assert httpx.get(f"http://127.0.0.1:{port}/healthz",
                             timeout=WAIT).json() == {"status": "ok"}
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(WAIT) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(WAIT)
            if proc.stdout is not None:
                proc.stdout.close()
    assert (tmp_path / "monitor.db").exists()


# ----------------------------------------------------------------------------- use cases


def test_the_minimum_requests_are_settings(tmp_path: Path) -> None:
    settings = MonitorSettings.load("monitor", state_dir=tmp_path, min_memory_request="64Mi",
                                    min_cpu_request="0.1")
    assert (settings.min_memory_request, settings.min_cpu_request) == ("64Mi", "0.1")
    with pytest.raises(SettingsError, match=r"COULER_MIN_MEMORY_REQUEST: 'lots' is not a"):
        MonitorSettings.load("monitor", state_dir=tmp_path, min_memory_request="lots")
