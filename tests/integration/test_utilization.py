"""Utilization as a time series: engines sample steps while they run, the submitter publishes
batches on ``couler.metrics.batch``, the monitor stores them while the step goes on.

* the local engine's series of a step burning CPU and of one sleeping (several points,
  plausible average cores, memory);
* the submitter's adapter runner polling a remote engine's pod metrics (the Kubernetes
  stand-in of tests/k8s_fake.py serves PodMetrics), each reading passed on once;
* the stack's submitter, optimizer and monitor on a real nats-server: a sample of a running step is
  stored by the monitor before the step ends.

Waits are bounds, never assertions about speed: a step that waits for the test to let it
finish stays running as long as the test needs.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s_client

from couler import ir
from couler.engines.base import StepSample, StepState, StepStatus
from couler_monitor.main import MonitorSettings
from couler_monitor.main import build as build_monitor
from couler_optimizer.main import OptimizerSettings
from couler_optimizer.main import build as build_optimizer
from couler_runtime.argo import ArgoAdapter, pod_name
from couler_runtime.client import CoulerClient
from couler_runtime.local import LocalEngine
from couler_runtime.rpc.records import RunState
from couler_submitter.engines import AdapterRunner
from couler_submitter.main import SubmitterSettings
from couler_submitter.main import build as build_submitter
from tests.k8s_fake import FakeKube
from tests.servers import NatsServer, free_port
from tests.service_thread import ServiceThread

WAIT = 60.0  # a bound on waiting, never an assertion about speed
T = TypeVar("T")

# Burns CPU until this process has used SECONDS of it (on a busy machine the wall time
# stretches, the work does not), then prints how much it used.
BUSY = """
import time
seconds = float({seconds})
while time.process_time() < seconds:
    sum(range(10000))
print(time.process_time())
"""


def wait_for(what: str, check: Callable[[], T | None], timeout: float = WAIT) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def script(name: str, source: str, **kw: Any) -> ir.Step:
    return ir.Step(name=name, body=ir.ScriptSpec(image="python:3.12", source=source), **kw)


# ----------------------------------------------------------------------------- local engine


def run_sampled(tmp_path: Path, step: ir.Step) -> tuple[list[StepSample], list[object]]:
    """Run a one-step workflow on the local engine; its samples, and every sample and step
    change in the order they were reported."""
    samples: list[StepSample] = []
    order: list[object] = []
    lock = threading.Lock()

    def on_sample(s: StepSample) -> None:
        with lock:
            samples.append(s)
            order.append(s)

    def on_event(s: StepStatus) -> None:
        with lock:
            order.append(s)

    engine = LocalEngine(tmp_path / "runs", series_seconds=0.25)
    status = engine.run(ir.Workflow(name=f"util-{uuid.uuid4().hex[:6]}", steps=(step,)),
                        on_event=on_event, on_sample=on_sample)
    assert status.state.value == "succeeded", status
    return samples, order


def test_the_local_engine_samples_a_busy_step_while_it_runs(tmp_path: Path) -> None:
    step = script("busy", BUSY.format(seconds=1.5),
                  outputs=(ir.OutputParameter("used", source=ir.OutputSource.STDOUT),))
    samples, order = run_sampled(tmp_path, step)
    assert len(samples) > 1, samples  # a series, not one peak
    assert all((s.step, s.key, s.attempt) == ("busy", "", 1) for s in samples)
    assert all(s.interval_seconds > 0 and s.memory_bytes > 0 for s in samples), samples
    assert [s.at for s in samples] == sorted(s.at for s in samples)
    wall = sum(s.interval_seconds for s in samples)
    cpu_seconds = sum(s.cpu * s.interval_seconds for s in samples)
    average = cpu_seconds / wall
    # The series accounts for the CPU time the step says it used (its own process_time,
    # the interpreter's start included): averages over intervals, not instantaneous spikes.
    used = float(next(s for s in order if isinstance(s, StepStatus)
                      and s.state is StepState.SUCCEEDED).outputs["used"])
    assert used * 0.8 <= cpu_seconds <= used * 1.5 + 0.3, (used, cpu_seconds, samples)
    # A busy loop uses about one core -- of what the machine gives it: where other
    # processes keep the cores busy, its share (its CPU time over the series' wall time) is
    # less, and so is the average.
    assert all(s.cpu <= 1.5 for s in samples), samples  # one thread: never two cores
    share = used / wall
    assert average > 0.5 or share < 0.6, (average, share, samples)
    # every sample arrived before the step's end
    end = next(i for i, s in enumerate(order) if isinstance(s, StepStatus)
               and s.state is StepState.SUCCEEDED)
    assert all(not isinstance(s, StepSample) for s in order[end:])


def test_a_sleeping_step_uses_almost_no_cpu(tmp_path: Path) -> None:
    step = ir.Step(name="nap", body=ir.ContainerSpec(image="alpine", command=("sleep",),
                                                      args=("1.5",)))
    samples, _ = run_sampled(tmp_path, step)
    assert len(samples) > 1, samples
    assert all(s.cpu < 0.2 for s in samples), samples
    assert all(s.memory_bytes > 0 for s in samples), samples


# ----------------------------------------------------------------------------- remote engine

NS = "argo"


def set_running(kube: FakeKube, name: str) -> str:
    """Play the Argo controller: step ``train`` of workflow ``name`` runs; its pod's name."""
    node = {"id": f"{name}-1", "name": f"{name}.train", "displayName": "train",
            "type": "Pod", "phase": "Running", "templateName": "train", "boundaryID": name,
            "startedAt": "2024-05-01T10:00:00Z"}
    root = {"id": name, "name": name, "displayName": name, "type": "DAG",
            "phase": "Running", "children": [node["id"]], "startedAt": "2024-05-01T10:00:00Z"}

    def mutate(obj: dict[str, Any]) -> None:
        obj["status"] = {"phase": "Running", "startedAt": "2024-05-01T10:00:00Z",
                         "nodes": {name: root, node["id"]: node}}

    kube.update("workflows", NS, name, mutate)
    return pod_name(kube.get("workflows", NS, name), node)


def test_the_adapter_runner_polls_a_remote_engines_pod_metrics() -> None:
    with FakeKube(token="T") as kube:
        cfg = k8s_client.Configuration(host=kube.url)
        cfg.api_key = {"authorization": "Bearer T"}
        cfg.retries = 0
        argo = ArgoAdapter(NS, api_client=k8s_client.ApiClient(cfg))
        wf = ir.Workflow(name="fit", steps=(ir.Step(
            name="train", body=ir.ContainerSpec(image="alpine", command=("sleep", "60"))),))
        got: list[StepSample] = []
        runner = AdapterRunner("argo", argo, metrics_interval=0.05)
        handle = runner.start("run-1", wf, {}, {}, lambda s: None, on_sample=got.append)
        name = getattr(handle, "engine_run_id", "")
        pod = set_running(kube, name)
        kube.set_pod_metrics(NS, pod, {"main": ("500m", "64Mi"), "wait": ("5m", "8Mi")},
                             timestamp="2024-05-01T10:00:30Z")
        wait_for("the first reading", lambda: got)
        polls = len(kube.requests_of("GET"))
        wait_for("more polls", lambda: len(kube.requests_of("GET")) > polls + 6)
        assert len(got) == 1, got  # the same reading, not refreshed: passed on once
        assert (got[0].step, got[0].key, got[0].attempt) == ("train", "", 1)
        assert got[0].cpu == pytest.approx(0.5)  # the step's container, not Argo's sidecar
        assert got[0].memory_bytes == 64 * 1024 * 1024
        assert got[0].interval_seconds == 30.0
        kube.set_pod_metrics(NS, pod, {"main": ("1", "96Mi")}, timestamp="2024-05-01T10:01:00Z")
        wait_for("the next reading", lambda: len(got) >= 2)
        assert got[1].cpu == pytest.approx(1.0) and got[1].at - got[0].at == 30
        kube.update("workflows", NS, name, lambda o: o["status"].update(phase="Succeeded"))
        handle.wait()


# ----------------------------------------------------------------------------- the stack


@pytest.fixture
def stack(nats_server: NatsServer, tmp_path: Path) -> Iterator[CoulerClient]:
    """The submitter (batches every 0.5 s, the local engine sampling every 0.25 s), the
    optimizer that plans its runs and the monitor, in threads, on the session's
    nats-server."""
    optimizer = ServiceThread(OptimizerSettings.load(
        "optimizer", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
        state_dir=tmp_path / "optimizer", database_url=f"sqlite:///{tmp_path / 'opt.db'}",
        auth_token=None, otel_endpoint=None, bus_insecure=True), build_optimizer).start()
    sub = ServiceThread(SubmitterSettings.load(
        "submitter", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
        state_dir=tmp_path / "submitter", database_url=f"sqlite:///{tmp_path / 'sub.db'}",
        artifacts=str(tmp_path / "blobs"), auth_token=None, otel_endpoint=None,
        engines="local", outbox_interval=1.0, metrics_interval=0.5, sample_interval=0.25,
        bus_insecure=True), build_submitter).start()
    mon = ServiceThread(MonitorSettings.load(
        "monitor", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
        state_dir=tmp_path / "monitor", database_url=f"sqlite:///{tmp_path / 'mon.db'}",
        auth_token=None, otel_endpoint=None, dashboard_address=f"127.0.0.1:{free_port()}",
        bus_insecure=True), build_monitor).start()
    client = CoulerClient({"submitter": sub.address, "monitor": mon.address}, timeout=WAIT)
    try:
        yield client
    finally:
        client.close()
        sub.stop()
        mon.stop()
        optimizer.stop()


def test_the_monitor_stores_a_running_steps_series_before_it_ends(
        stack: CoulerClient, nats_server: NatsServer, tmp_path: Path) -> None:
    release = tmp_path / "release"
    # Works (and burns CPU) until the test lets it finish.
    work = script("work", f"import os\nwhile not os.path.exists({str(release)!r}):\n"
                          "    sum(range(20000))\n")
    wf = ir.Workflow(name=f"series-{uuid.uuid4().hex[:6]}", steps=(work,))
    run_id = stack.submitter.submit(wf).run_id  # planned by the optimizer
    # Samples of the running step reach the monitor through couler.metrics.batch ...
    usage = wait_for("samples stored while the step runs", lambda: (
        u if len((u := stack.monitor.utilization(run_id=run_id)).samples) >= 2 else None))
    # ... before the step ended: it cannot end before the test releases it.
    assert not release.exists()
    assert stack.submitter.get(run_id).step("work").state is StepState.RUNNING
    assert {(s.step, s.attempt) for s in usage.samples} == {("work", 1)}
    assert all(s.interval_seconds > 0 and s.memory_bytes > 0 for s in usage.samples)
    assert max(s.cpu for s in usage.samples) > 0.2  # it was burning CPU
    release.touch()
    run = wait_for("the run's end", lambda: (
        r if (r := stack.submitter.get(run_id)).state.terminal else None))
    assert run.state is RunState.SUCCEEDED, run.message
    # the rest of the series follows (the last samples with the step's end)
    final = wait_for("the series after the end", lambda: (
        u if len((u := stack.monitor.utilization(run_id=run_id)).samples)
        > len(usage.samples) else None))
    ats = [s.at for s in final.samples]
    assert ats == sorted(ats) and len(set(ats)) == len(ats)
    assert final.peaks and final.peaks[0].samples == len(final.samples)
