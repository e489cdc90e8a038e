"""An engine refuses a run's document for its size, end to end: the real submitter and
optimizer services on a real nats-server, and Argo behind the Kubernetes stand-in
(``tests/k8s_fake.py``) with an etcd object-size limit.

The submitter is configured for Argo from its settings (the real ``ArgoAdapter``, speaking
HTTP to the stand-in); the optimizer plans with Argo's static budget (1 MiB, far above the
stand-in's limit), so the first plan is one document, which the stand-in refuses as etcd
does (500 "etcdserver: request is too large"). The submitter publishes the refusal
(``couler.workflow.refused``) and waits for a new plan; the optimizer learns Argo's budget
from it (0.8 x the refused document) and plans the run again in chunks, which the stand-in
accepts. The next run of the same workflow is split from the start.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from couler import ir
from couler.compilers import argo
from couler.compilers.wire import json_size
from couler.optimize import optimize as plan_locally
from couler.v1 import events_pb2
from couler_optimizer.main import OptimizerSettings
from couler_optimizer.main import build as build_optimizer
from couler_optimizer.store import OptimizerStore
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState
from couler_submitter.main import SubmitterSettings
from couler_submitter.main import build as build_submitter
from tests.integration.test_argo_adapter import T0 as ARGO_T0
from tests.integration.test_argo_adapter import set_status as argo_status
from tests.integration.test_submitter_service import (
    settings_for,
    stored,
    unique,
    wait_for,
    wait_state,
)
from tests.k8s_fake import FakeKube
from tests.servers import NatsServer
from tests.service_thread import ServiceThread

WAIT = 90.0  # a bound on waiting, never an assertion about speed
STEPS = 12
WIDTH = 2000  # characters of each step's argument: about 2 KiB of document per step


def wide_steps(name: str) -> ir.Workflow:
    """``STEPS`` independent steps, each with a ``WIDTH``-character argument."""
    return ir.Workflow(name=name, steps=tuple(
        ir.Step(name=f"s{i}", body=ir.ContainerSpec(
            image="alpine", command=("echo", f"{i}-" + "x" * WIDTH)))
        for i in range(STEPS)))


def object_bytes(wf: ir.Workflow) -> int:
    """The size of ``wf``'s Workflow object as the API server stores it, compact JSON (the
    optimizer's plan of it: default retries added)."""
    plan = plan_locally(wf, "argo")
    return json_size(argo.compile_workflow(plan.workflow))


@pytest.fixture
def stack(nats_server: NatsServer, tmp_path: Path
          ) -> Iterator[tuple[FakeKube, CoulerClient, str]]:
    """Argo's stand-in (no size limit yet: the test sets it), the submitter configured for
    it, and the optimizer; yields the stand-in, a client and the optimizer's database."""
    optimizer_db = f"sqlite:///{tmp_path / 'optimizer.db'}"
    with FakeKube(token="secret-t") as kube:
        common: dict[str, Any] = {"nats_url": nats_server.url, "grpc_address": "127.0.0.1:0",
                                  "otel_endpoint": None, "bus_insecure": True}
        optimizer = ServiceThread(OptimizerSettings.load(
            "optimizer", state_dir=tmp_path / "opt", database_url=optimizer_db,
            cache_address="", auth_token=None, default_retry=True, **common),
            build_optimizer).start()
        base = settings_for(nats_server, tmp_path, f"sqlite:///{tmp_path / 's.db'}")
        submitter = ServiceThread(SubmitterSettings.load("submitter", **{
            **base.model_dump(exclude={"service"}), "engines": "local,argo",
            "kube_host": kube.url, "kube_token": "secret-t", "argo_namespace": "argo"}),
            build_submitter).start()
        try:
            with CoulerClient({"submitter": submitter.address}, timeout=WAIT) as client:
                yield kube, client, optimizer_db
        finally:
            submitter.stop()
            optimizer.stop()


def test_a_refused_document_is_planned_again_within_the_learned_budget(
        stack: tuple[FakeKube, CoulerClient, str], nats_server: NatsServer) -> None:
    kube, client, optimizer_db = stack
    wf = wide_steps(unique("wide"))
    whole = object_bytes(wf)
    kube.max_object_bytes = int(whole * 0.9)  # the whole workflow is over it

    sub = client.submitter.submit(wf, engine="argo")
    plans = wait_for("the second plan", lambda: [m.plan for _, m, _ in stored(
        nats_server, "COULER_WORKFLOW", "couler.workflow.optimized",
        events_pb2.WorkflowOptimized, sub.run_id)][1:] or None)
    names = wait_for("the chunks' Workflow objects", lambda: (
        found if len(found := kube.names("workflows", "argo")) == len(plans[0].chunks)
        else None))
    run = wait_state(client, sub.run_id, RunState.PENDING, RunState.RUNNING, RunState.FAILED)
    assert run.state is not RunState.FAILED, run.message

    # The first document was refused, as etcd refuses it, and nothing of it was stored.
    posts = [r for r in kube.requests_of("POST") if r.path.endswith("/workflows")]
    assert len(posts) == len(names) + 1
    refused_post = posts[0].body
    assert refused_post["metadata"]["annotations"]["couler.io/idempotency-key"] == sub.run_id
    assert json_size(refused_post) > kube.max_object_bytes
    # Every chunk the engine holds is within its limit, and together they hold every step.
    held = [kube.get("workflows", "argo", n) for n in names]
    assert all(json_size(obj) <= kube.max_object_bytes for obj in held)
    tasks = [t["name"] for obj in held for tmpl in obj["spec"]["templates"]
             for t in (tmpl.get("dag") or {}).get("tasks", ())]
    assert sorted(tasks) == sorted(s.name for s in wf.steps)

    # What the submitter published: the refusal, naming the engine, size and run.
    [(_, refusal, headers)] = stored(nats_server, "COULER_WORKFLOW", "couler.workflow.refused",
                                     events_pb2.DocumentRefused, sub.run_id)
    assert isinstance(refusal, events_pb2.DocumentRefused)
    assert refusal.engine == "argo" and refusal.workflow == wf.name and refusal.attempt == 1
    assert refusal.sent_bytes == len(json.dumps(refused_post).encode())
    # in the split budget's unit, the object as stored (compact JSON): the plan's document
    # and the idempotency label and annotation
    assert refusal.size_bytes == json_size(refused_post)
    document = json_size(argo.compile_workflow(plan_locally(wf, "argo").workflow))
    assert document < refusal.size_bytes < document + 500
    assert "etcdserver: request is too large" in refusal.reason
    assert refusal.request.workflow.name == wf.name  # the run, to plan again
    assert headers["Nats-Msg-Id"] == f"{sub.run_id}.refused.{refusal.revision}"

    # The optimizer keeps Argo's learned budget; the run's plan is split within it and its
    # split pass says why.
    store = OptimizerStore.open(optimizer_db)
    try:
        learned = store.learned_budget("argo")
    finally:
        store.close()
    assert learned is not None and learned.refused_bytes == refusal.size_bytes
    assert learned.max_bytes == int(refusal.size_bytes * 0.8) and learned.run_id == sub.run_id
    plans = [m.plan for _, m, _ in stored(nats_server, "COULER_WORKFLOW",
                                          "couler.workflow.optimized",
                                          events_pb2.WorkflowOptimized, sub.run_id)]
    assert [len(p.chunks) for p in plans] == [0, len(names)]
    assert all(c.size_bytes <= learned.max_bytes for c in plans[1].chunks)
    assert len(names) >= 2
    split = next(p for p in run.passes if p.name == "split")
    assert split.notes[0].startswith(
        f"budget {learned.max_bytes / 1024:.0f} KiB: argo refused a "
        f"{learned.refused_bytes / 1024:.0f} KiB document at ")

    # The next run of the workflow is split from the start: nothing is refused.
    before = len(kube.requests_of("POST"))
    again = client.submitter.submit(wide_steps(unique("wide")), engine="argo")
    run2 = wait_state(client, again.run_id, RunState.PENDING, RunState.RUNNING,
                      RunState.FAILED)
    assert run2.state is not RunState.FAILED, run2.message
    [(_, second, _)] = stored(nats_server, "COULER_WORKFLOW", "couler.workflow.optimized",
                              events_pb2.WorkflowOptimized, again.run_id)
    assert len(second.plan.chunks) >= 2
    wait_for("the second run's chunks", lambda: len(kube.requests_of("POST")) >= before
             + len(second.plan.chunks) or None)
    assert not stored(nats_server, "COULER_WORKFLOW", "couler.workflow.refused",
                      events_pb2.DocumentRefused, again.run_id)
    # Play the controller: the chunks end, and so do both runs (no watch outlives the test).
    for name in kube.names("workflows", "argo"):
        kube.update("workflows", "argo", name, argo_status(
            "Failed", {}, finishedAt=ARGO_T0, message="stopped by the test"))
    for rid in (sub.run_id, again.run_id):
        assert wait_state(client, rid, RunState.FAILED).state is RunState.FAILED
