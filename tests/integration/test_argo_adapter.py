"""The Argo adapter against a stand-in Kubernetes API server (tests/k8s_fake.py).

No Kubernetes runs here: the fake speaks the endpoints the adapter uses, and the tests
play the Argo controller by mutating the stored objects.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client

from couler import ir
from couler.api.handles import SecretMaterial
from couler.compilers.argo import compile_workflow
from couler.compilers.wire import json_size
from couler.engines.base import RunState, StepState, StepStatus
from couler.errors import (
    ConflictError,
    DocumentTooLargeError,
    NotFoundError,
    OperationTimeoutError,
    RetryableError,
    UserError,
)
from couler_runtime.argo import IDEMPOTENCY_KEY, ArgoAdapter, pod_name, run_status
from couler_submitter.engines import AdapterRunner
from tests.k8s_fake import FakeKube

NS = "argo"
SECRET_VALUE = "s3cr3t-value-never-in-the-workflow"


def workflow(name: str = "etl", **kw: Any) -> ir.Workflow:
    extract = ir.Step(
        name="extract",
        body=ir.ScriptSpec(image="python:3.12", source="print(42)"),
        env=(ir.EnvVar("TOKEN", secret=ir.SecretRef("etl-creds", "token")),),
        outputs=(ir.OutputParameter("n", ir.OutputSource.PATH, "/tmp/n"),),
    )
    load = ir.Step(
        name="load",
        body=ir.ContainerSpec(image="alpine", command=("sh", "-c"), args=("echo load",)),
        dependencies=(ir.Dependency("extract"),),
        retry=ir.RetryPolicy(limit=3),
    )
    return ir.Workflow(name=name, steps=(extract, load), **kw)


def secret() -> SecretMaterial:
    return SecretMaterial("etl-creds", NS, {"token": SECRET_VALUE}, dry_run=False,
                          use_existing=False)


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube(token="T") as fake:
        yield fake


def adapter_for(kube: FakeKube, token: str | None = "T") -> ArgoAdapter:
    cfg = k8s_client.Configuration(host=kube.url)
    if token is not None:
        cfg.api_key = {"authorization": f"Bearer {token}"}
    cfg.retries = 0
    return ArgoAdapter(NS, api_client=k8s_client.ApiClient(cfg))


@pytest.fixture
def argo(kube: FakeKube) -> ArgoAdapter:
    return adapter_for(kube)


def strip_server_fields(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp"):
        meta.pop(key, None)
    return obj


# --------------------------------------------------------------------------- submit


def test_submit_creates_workflow_and_secret(kube: FakeKube, argo: ArgoAdapter) -> None:
    wf = workflow()
    name = argo.submit(wf, [secret()])
    assert name.startswith("etl-")
    assert kube.names("workflows", NS) == [name]
    stored = kube.get("workflows", NS, name)
    assert stored["metadata"]["namespace"] == NS
    assert strip_server_fields(stored) == compile_workflow(wf)

    body = kube.secrets[(NS, "etl-creds")]
    assert body["stringData"] == {"token": SECRET_VALUE}
    assert body["type"] == "Opaque"
    # The value travels only in the Secret: never in any workflow request or object.
    for req in kube.requests:
        if "/secrets" not in req.path:
            assert SECRET_VALUE not in json.dumps(req.body)
    assert SECRET_VALUE not in json.dumps(stored)
    # ...while the workflow references the secret by name and key.
    assert '"secretKeyRef": {"name": "etl-creds", "key": "token"}' in json.dumps(stored)


def test_submit_replaces_existing_secret(kube: FakeKube, argo: ArgoAdapter) -> None:
    argo.submit(workflow(), [secret()])
    changed = SecretMaterial("etl-creds", NS, {"token": "rotated"}, dry_run=False,
                             use_existing=False)
    argo.submit(workflow(), [changed])
    assert kube.secrets[(NS, "etl-creds")]["stringData"] == {"token": "rotated"}
    assert len(kube.requests_of("PUT")) == 1
    assert len(kube.names("workflows", NS)) == 2


def test_existing_and_dry_run_secrets_not_created(kube: FakeKube, argo: ArgoAdapter) -> None:
    existing = SecretMaterial("etl-creds", NS, {"token": "x"}, dry_run=False, use_existing=True)
    argo.submit(workflow(), [existing])
    assert kube.secrets == {}


def test_idempotent_resubmit_returns_same_run(kube: FakeKube, argo: ArgoAdapter) -> None:
    wf = workflow()
    first = argo.submit(wf, [secret()], idempotency_key="order-1234")
    stored = kube.get("workflows", NS, first)
    expected = compile_workflow(wf)
    expected["metadata"]["labels"] = {IDEMPOTENCY_KEY: "order-1234"}
    expected["metadata"]["annotations"] = {IDEMPOTENCY_KEY: "order-1234"}
    assert strip_server_fields(stored) == expected

    posts_before = len(kube.requests_of("POST"))
    again = argo.submit(wf, [secret()], idempotency_key="order-1234")
    assert again == first
    assert len(kube.requests_of("POST")) == posts_before  # no secret, no workflow
    assert kube.names("workflows", NS) == [first]
    lookup = kube.requests_of("GET")[-1]
    assert lookup.query["labelSelector"] == f"{IDEMPOTENCY_KEY}=order-1234"

    other = argo.submit(wf, idempotency_key="order-5678")
    assert other != first
    assert len(kube.names("workflows", NS)) == 2


def test_idempotency_key_that_is_not_a_label_value_is_hashed(
        kube: FakeKube, argo: ArgoAdapter) -> None:
    key = "tenant/acme: nightly run 2024-05-01 " + "x" * 80
    first = argo.submit(workflow(), idempotency_key=key)
    meta = kube.get("workflows", NS, first)["metadata"]
    assert meta["annotations"][IDEMPOTENCY_KEY] == key
    assert meta["labels"][IDEMPOTENCY_KEY].startswith("sha256-")
    assert len(meta["labels"][IDEMPOTENCY_KEY]) <= 63
    assert argo.submit(workflow(), idempotency_key=key) == first


def test_cron_workflow_goes_to_cronworkflows(kube: FakeKube, argo: ArgoAdapter) -> None:
    wf = workflow("nightly", schedule=ir.CronSchedule("0 3 * * *"))
    name = argo.submit(wf)
    assert name == "nightly"
    assert kube.names("cronworkflows", NS) == ["nightly"]
    assert kube.names("workflows", NS) == []
    stored = kube.get("cronworkflows", NS, "nightly")
    assert stored["kind"] == "CronWorkflow"
    assert strip_server_fields(stored) == {**compile_workflow(wf),
                                           "metadata": {}}  # name comes back as the result
    with pytest.raises(ConflictError, match="nightly"):
        argo.submit(wf)


def test_invalid_object_is_a_user_error(kube: FakeKube, argo: ArgoAdapter,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import couler_runtime.argo.adapter as mod

    def broken(wf: ir.Workflow) -> dict[str, Any]:
        doc = compile_workflow(wf)
        del doc["spec"]["entrypoint"]
        return doc

    monkeypatch.setattr(mod, "compile_workflow", broken)
    with pytest.raises(UserError, match=r"workflow 'etl'.*422.*entrypoint") as info:
        argo.submit(workflow())
    assert not isinstance(info.value, (NotFoundError, ConflictError))


@pytest.mark.parametrize("limit", ["max_request_bytes", "max_object_bytes"])
def test_a_workflow_too_large_for_the_api_server_or_etcd_says_its_size(
        kube: FakeKube, argo: ArgoAdapter, limit: str) -> None:
    """413 (the API server's request limit, on the body) and etcd's "request is too large"
    (a 500 that must not be retried as it is; on the object as stored, compact JSON):
    DocumentTooLargeError with the body's size and the stored object's -- the unit of the
    split budget, so a learned budget and the chunks it limits are measured alike."""
    wf = workflow()
    doc = compile_workflow(wf)
    doc["metadata"].update(labels={IDEMPOTENCY_KEY: "k1"},
                           annotations={IDEMPOTENCY_KEY: "k1"})
    sent = len(json.dumps(doc).encode())
    stored = json_size(doc)
    assert stored == len(json.dumps(doc, separators=(",", ":")).encode()) < sent
    limited = sent if limit == "max_request_bytes" else stored
    setattr(kube, limit, limited - 1)
    with pytest.raises(DocumentTooLargeError) as info:
        argo.submit(wf, idempotency_key="k1")
    err = info.value
    assert (err.engine, err.workflow, err.sent_bytes) == ("argo", "etl", sent)
    assert err.size_bytes == stored
    assert err.detail == ("413 Request Entity Too Large: Request entity too large: limit is "
                          f"{sent - 1}" if limit == "max_request_bytes" else
                          "500 Internal Server Error: etcdserver: request is too large")
    assert kube.names("workflows", NS) == []
    setattr(kube, limit, limited)  # at the limit: accepted
    assert argo.submit(wf, idempotency_key="k1") in kube.names("workflows", NS)


def test_tenant_outside_the_namespace_is_refused(argo: ArgoAdapter) -> None:
    with pytest.raises(UserError, match="'other'"):
        argo.submit(workflow(tenant="other"))


# --------------------------------------------------------------------------- errors


def test_token_required(kube: FakeKube) -> None:
    for token in (None, "wrong"):
        with pytest.raises(UserError, match=r"401.*bearer token"):
            adapter_for(kube, token).submit(workflow())
    assert kube.names("workflows", NS) == []


def test_not_found_names_the_workflow(argo: ArgoAdapter) -> None:
    with pytest.raises(NotFoundError, match=r"workflow 'ghost'.*namespace 'argo'"):
        argo.status("ghost")
    with pytest.raises(NotFoundError, match="ghost"):
        argo.cancel("ghost")
    with pytest.raises(NotFoundError, match="ghost"):
        argo.logs("ghost", "extract")


def test_unreachable_server_is_retryable(kube: FakeKube) -> None:
    cfg = k8s_client.Configuration(host="http://127.0.0.1:1")
    cfg.retries = 0
    argo = ArgoAdapter(NS, api_client=k8s_client.ApiClient(cfg))
    with pytest.raises(RetryableError, match="workflow 'x'"):
        argo.status("x")


def test_host_and_token_options(kube: FakeKube) -> None:
    argo = ArgoAdapter(NS, host=kube.url, token="T")
    name = argo.submit(workflow())
    assert argo.status(name).state is RunState.PENDING


# --------------------------------------------------------------------------- status

T0 = "2024-05-01T10:00:00Z"


def node(wf: str, nid: str, display: str, ntype: str, phase: str, *,
         template: str = "", children: tuple[str, ...] = (), started: str | None = T0,
         finished: str | None = None, outputs: dict[str, Any] | None = None,
         boundary: str | None = None, **extra: Any) -> dict[str, Any]:
    n: dict[str, Any] = {"id": nid, "name": f"{wf}.{display}" if nid != wf else wf,
                         "displayName": display, "type": ntype, "phase": phase,
                         "templateName": template, "boundaryID": boundary or wf, **extra}
    if nid == wf:
        n.pop("boundaryID")
    if children:
        n["children"] = list(children)
    if started:
        n["startedAt"] = started
    if finished:
        n["finishedAt"] = finished
    if outputs is not None:
        n["outputs"] = outputs
    return n


def realistic_nodes(wf: str) -> dict[str, Any]:
    """A finished run: extract ok with outputs, load failed after retries, a skipped
    branch, a map over two items, and a nested DAG whose inner nodes are not steps."""
    nodes = [
        node(wf, wf, wf, "DAG", "Failed", template="etl", finished="2024-05-01T10:05:00Z",
             children=(f"{wf}-1",)),
        node(wf, f"{wf}-1", "extract", "Pod", "Succeeded", template="extract",
             finished="2024-05-01T10:01:00Z",
             outputs={"parameters": [{"name": "n", "value": "42"}], "result": "42",
                      "exitCode": "0"}),
        node(wf, f"{wf}-2", "load", "Retry", "Failed", template="load",
             started="2024-05-01T10:01:01Z", finished="2024-05-01T10:04:00Z",
             children=(f"{wf}-3", f"{wf}-4", f"{wf}-5"), message="No more retries left"),
        node(wf, f"{wf}-3", "load(0)", "Pod", "Failed", template="load",
             started="2024-05-01T10:01:01Z", outputs={"exitCode": "1"}),
        node(wf, f"{wf}-4", "load(1)", "Pod", "Error", template="load",
             started="2024-05-01T10:02:00Z", outputs={"exitCode": "1"}),
        node(wf, f"{wf}-5", "load(2)", "Pod", "Failed", template="load",
             started="2024-05-01T10:03:00Z", outputs={"exitCode": "2"},
             message="Error (exit code 2)"),
        node(wf, f"{wf}-6", "report", "Skipped", "Skipped", template="report", started=None,
             message="when 'false' evaluated false"),
        node(wf, f"{wf}-7", "fan", "TaskGroup", "Succeeded", children=(f"{wf}-8", f"{wf}-9"),
             started="2024-05-01T10:01:02Z"),
        node(wf, f"{wf}-8", "fan(0:a)", "Pod", "Succeeded", template="fan",
             started="2024-05-01T10:01:02Z"),
        node(wf, f"{wf}-9", "fan(1:b)", "Pod", "Omitted", template="fan", started=None),
        node(wf, f"{wf}-10", "sub", "DAG", "Succeeded", template="sub",
             started="2024-05-01T10:01:03Z", children=(f"{wf}-11",)),
        node(wf, f"{wf}-11", "inner", "Pod", "Succeeded", template="inner",
             boundary=f"{wf}-10", started="2024-05-01T10:01:04Z"),
        node(wf, f"{wf}-12", "cached", "Pod", "Succeeded", template="cached",
             memoizationStatus={"hit": True, "key": "k", "cacheName": "c"},
             started="2024-05-01T10:01:05Z"),
    ]
    return {n["id"]: n for n in nodes}


def set_status(phase: str, nodes: dict[str, Any] | None = None, **extra: Any) -> Any:
    def mutate(obj: dict[str, Any]) -> None:
        status = obj.setdefault("status", {})
        status["phase"] = phase
        status.setdefault("startedAt", T0)
        if nodes is not None:
            status["nodes"] = nodes
        status.update(extra)
    return mutate


def by_step(steps: tuple[StepStatus, ...], step: str, key: str = "") -> StepStatus:
    return next(s for s in steps if s.step == step and s.key == key)


def test_status_maps_a_realistic_run(kube: FakeKube, argo: ArgoAdapter) -> None:
    name = argo.submit(workflow())
    assert argo.status(name).state is RunState.PENDING
    kube.update("workflows", NS, name,
                set_status("Failed", realistic_nodes(name), finishedAt="2024-05-01T10:05:00Z",
                           message="child 'load' failed"))
    st = argo.status(name)
    assert (st.run_id, st.workflow, st.state) == (name, "etl", RunState.FAILED)
    assert st.message == "child 'load' failed"
    assert st.finished_at is not None and st.started_at is not None
    assert st.finished_at - st.started_at == 300

    assert sorted((s.step, s.key) for s in st.steps) == [
        ("cached", ""), ("extract", ""), ("fan", "0"), ("fan", "1"), ("load", ""),
        ("report", ""), ("sub", "")]
    extract = by_step(st.steps, "extract")
    assert extract.state is StepState.SUCCEEDED
    assert extract.outputs == {"n": "42", "result": "42"}
    assert (extract.exit_code, extract.attempts) == (0, 1)
    assert extract.finished_at is not None and extract.started_at is not None
    assert extract.finished_at - extract.started_at == 60

    load = by_step(st.steps, "load")
    assert load.state is StepState.FAILED
    assert load.attempts == 3
    assert load.exit_code == 2  # the last attempt's
    assert load.message == "No more retries left"

    report = by_step(st.steps, "report")
    assert (report.state, report.attempts, report.started_at) == (StepState.SKIPPED, 0, None)
    assert by_step(st.steps, "fan", "0").state is StepState.SUCCEEDED
    assert by_step(st.steps, "fan", "1").state is StepState.SKIPPED  # Omitted
    assert by_step(st.steps, "sub").state is StepState.SUCCEEDED
    assert by_step(st.steps, "cached").state is StepState.CACHED


@pytest.mark.parametrize(("phase", "state"), [
    ("", RunState.PENDING), ("Pending", RunState.PENDING), ("Running", RunState.RUNNING),
    ("Succeeded", RunState.SUCCEEDED), ("Failed", RunState.FAILED), ("Error", RunState.FAILED),
])
def test_run_phases(phase: str, state: RunState) -> None:
    obj = {"metadata": {"name": "w-1", "generateName": "w-"}, "status": {"phase": phase}}
    assert run_status(obj).state is state


def test_retrying_and_running_steps() -> None:
    wf = "w-1"
    nodes = {
        wf: node(wf, wf, wf, "DAG", "Running"),
        "r": node(wf, "r", "load", "Retry", "Running", children=("a0", "a1")),
        "a0": node(wf, "a0", "load(0)", "Pod", "Failed"),
        "a1": node(wf, "a1", "load(1)", "Pod", "Pending", started=None),
        "p": node(wf, "p", "train", "Pod", "Running"),
        "q": node(wf, "q", "later", "Pod", "Pending", started=None),
    }
    st = run_status({"metadata": {"name": wf}, "status": {"phase": "Running", "nodes": nodes}})
    assert st.state is RunState.RUNNING
    load = by_step(st.steps, "load")
    assert load.attempts == 2
    assert load.state is StepState.RUNNING  # the latest attempt has not failed (yet)
    nodes["a1"]["phase"] = "Failed"
    st = run_status({"metadata": {"name": wf}, "status": {"phase": "Running", "nodes": nodes}})
    assert by_step(st.steps, "load").state is StepState.RETRYING
    assert by_step(st.steps, "train").state is StepState.RUNNING
    assert by_step(st.steps, "later").state is StepState.PENDING


# --------------------------------------------------------------------------- watch


def test_watch_follows_the_controller(kube: FakeKube, argo: ArgoAdapter) -> None:
    name = argo.submit(workflow())
    nodes = realistic_nodes(name)
    seen = argo.watch(name, timeout=8)

    first = next(seen)
    assert first.state is RunState.PENDING
    # Changed before the watch connects: replayed from the resourceVersion of the read.
    kube.update("workflows", NS, name, set_status("Running", {name: nodes[name]}))
    running = next(seen)
    assert running.state is RunState.RUNNING
    assert kube.watchers == 1
    # Changed while the watch is open: streamed.
    kube.update("workflows", NS, name, lambda o: o["metadata"].setdefault("labels", {})
                .update({"unrelated": "x"}))  # no visible change: not yielded
    kube.update("workflows", NS, name,
                set_status("Succeeded", {name: nodes[name], f"{name}-1": nodes[f"{name}-1"]},
                           finishedAt="2024-05-01T10:05:00Z"))
    done = next(seen)
    assert done.state is RunState.SUCCEEDED
    assert by_step(done.steps, "extract").outputs["n"] == "42"
    with pytest.raises(StopIteration):
        next(seen)
    watches = [r for r in kube.requests_of("GET") if r.query.get("watch") == "true"]
    assert len(watches) == 1
    assert watches[0].query["fieldSelector"] == f"metadata.name={name}"
    assert "resourceVersion" in watches[0].query


def test_watch_of_a_finished_run_yields_once(kube: FakeKube, argo: ArgoAdapter) -> None:
    name = argo.submit(workflow())
    kube.update("workflows", NS, name, set_status("Succeeded"))
    assert [s.state for s in argo.watch(name)] == [RunState.SUCCEEDED]


def test_watch_times_out(kube: FakeKube, argo: ArgoAdapter) -> None:
    name = argo.submit(workflow())
    kube.update("workflows", NS, name, set_status("Running"))
    seen = argo.watch(name, timeout=0.5)
    assert next(seen).state is RunState.RUNNING
    with pytest.raises(OperationTimeoutError, match=name):
        next(seen)


# --------------------------------------------------------------------------- cancel, logs


def test_cancel_sends_terminate_merge_patch(kube: FakeKube, argo: ArgoAdapter) -> None:
    name = argo.submit(workflow())
    kube.update("workflows", NS, name, set_status("Running"))
    argo.cancel(name)
    patch = kube.requests_of("PATCH")[-1]
    assert patch.path.endswith(f"/workflows/{name}")
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body == {"spec": {"shutdown": "Terminate"}}
    stored = kube.get("workflows", NS, name)
    assert stored["spec"]["shutdown"] == "Terminate"
    assert stored["spec"]["entrypoint"]  # merged, not replaced
    # The controller then fails the run: reported as cancelled.
    kube.update("workflows", NS, name, set_status(
        "Failed", {name: node(name, name, name, "DAG", "Failed"),
                   "p": node(name, "p", "extract", "Pod", "Failed",
                             message="workflow shutdown with strategy:  Terminate")}))
    st = argo.status(name)
    assert st.state is RunState.CANCELLED
    assert by_step(st.steps, "extract").state is StepState.CANCELLED


def test_logs_reads_the_pod_of_the_step(kube: FakeKube, argo: ArgoAdapter) -> None:
    name = argo.submit(workflow())
    nodes = realistic_nodes(name)
    kube.update("workflows", NS, name, set_status("Failed", nodes))
    obj = kube.get("workflows", NS, name)
    extract_pod = pod_name(obj, nodes[f"{name}-1"])
    last_load_pod = pod_name(obj, nodes[f"{name}-5"])
    kube.set_log(NS, extract_pod, "extracting\n42\n")
    kube.set_log(NS, last_load_pod, "load failed: exit 2\n")

    assert argo.logs(name, "extract") == "extracting\n42\n"
    assert kube.requests_of("GET")[-1].query["container"] == "main"
    assert argo.logs(name, "load") == "load failed: exit 2\n"  # the last attempt
    # the submitter's runner for a remote engine asks the adapter
    assert AdapterRunner("argo", argo).logs(name, "extract", "") == "extracting\n42\n"
    with pytest.raises(NotFoundError, match=r"workflow .*: no step 'nope'"):
        argo.logs(name, "nope")
    with pytest.raises(NotFoundError, match="has no pod"):
        argo.logs(name, "report")
    with pytest.raises(NotFoundError, match="pod"):
        argo.logs(name, "fan", "0")  # the pod exists in the run, its log is not there


def test_pod_name_rule() -> None:
    # v2 (Argo >= 3.4 default): {workflow}-{template}-{fnv32a(node name)}.
    obj: dict[str, Any] = {"metadata": {"name": "hello-world-abcde"}}
    n = {"id": "hello-world-abcde-123", "name": "hello-world-abcde.step-a",
         "templateName": "whalesay"}
    # fnv32a("hello-world-abcde.step-a"), computed independently of the adapter:
    h = 0x811C9DC5
    for b in b"hello-world-abcde.step-a":
        h = ((h ^ b) * 16777619) % 2**32
    assert pod_name(obj, n) == f"hello-world-abcde-whalesay-{h}"
    assert pod_name(obj, {**n, "name": "hello-world-abcde", "templateName": "x"}) \
        == "hello-world-abcde"
    assert pod_name(obj, {**n, "templateName": ""}) == f"hello-world-abcde-{h}"
    long = {**n, "templateName": "t" * 300}
    assert len(pod_name(obj, long)) <= 253
    # v1: the node id.
    obj["metadata"]["annotations"] = {"workflows.argoproj.io/pod-name-format": "v1"}
    assert pod_name(obj, n) == "hello-world-abcde-123"


# --------------------------------------------------------------------------- utilization


def metrics_requests(kube: FakeKube) -> list[str]:
    return [r.path for r in kube.requests_of("GET") if "/metrics.k8s.io/" in r.path]


def test_utilization_reads_the_pod_metrics_of_running_steps(kube: FakeKube,
                                                            argo: ArgoAdapter) -> None:
    name = argo.submit(workflow())
    nodes = {
        name: node(name, name, name, "DAG", "Running", children=(f"{name}-1", f"{name}-2")),
        f"{name}-1": node(name, f"{name}-1", "extract", "Pod", "Succeeded",
                          template="extract"),
        f"{name}-2": node(name, f"{name}-2", "load", "Retry", "Running", template="load",
                          children=(f"{name}-3", f"{name}-4")),
        f"{name}-3": node(name, f"{name}-3", "load(0)", "Pod", "Failed", template="load"),
        f"{name}-4": node(name, f"{name}-4", "load(1)", "Pod", "Running", template="load"),
    }
    kube.update("workflows", NS, name, set_status("Running", nodes))
    obj = kube.get("workflows", NS, name)
    running = pod_name(obj, nodes[f"{name}-4"])
    kube.set_pod_metrics(NS, running, {"main": ("1500m", "1Gi"), "wait": ("2m", "20Mi")},
                         timestamp="2024-05-01T10:02:30Z", window="15.5s")
    kube.set_pod_metrics(NS, pod_name(obj, nodes[f"{name}-1"]), {"main": ("9", "9Gi")})
    [sample] = argo.utilization(name)  # the running attempt's pod only, not the finished
    assert (sample.step, sample.key, sample.attempt) == ("load", "", 2)
    assert sample.cpu == pytest.approx(1.5) and sample.memory_bytes == 1 << 30  # main only
    assert sample.interval_seconds == 15.5
    assert sample.at == 1714557750.0  # the reading's time, not the poll's
    assert metrics_requests(kube) == [
        f"/apis/metrics.k8s.io/v1beta1/namespaces/{NS}/pods/{running}"]
    # A pod the metrics server has not measured yet: no sample, no complaint.
    kube.pod_metrics.clear()
    assert argo.utilization(name) == []


@pytest.mark.parametrize(("status", "said"), [(404, "install metrics-server"),
                                              (403, "grant get on pods.metrics.k8s.io")])
def test_without_the_metrics_api_no_samples_and_one_log_line(
        kube: FakeKube, status: int, said: str, caplog: pytest.LogCaptureFixture) -> None:
    argo = adapter_for(kube)
    name = argo.submit(workflow())
    nodes = {name: node(name, name, name, "DAG", "Running", children=(f"{name}-1",)),
             f"{name}-1": node(name, f"{name}-1", "extract", "Pod", "Running",
                               template="extract")}
    kube.update("workflows", NS, name, set_status("Running", nodes))
    kube.metrics_api = status
    with caplog.at_level("WARNING", logger="couler_runtime.kube"):
        assert argo.utilization(name) == []  # not an error
        asked = len(metrics_requests(kube))
        assert argo.utilization(name) == []
    assert asked == 1 and len(metrics_requests(kube)) == 1  # not asked again for a while
    lines = [r.getMessage() for r in caplog.records if r.name == "couler_runtime.kube"]
    assert len(lines) == 1 and said in lines[0] and repr(NS) in lines[0], lines
