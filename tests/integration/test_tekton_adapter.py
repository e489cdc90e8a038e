"""The Tekton adapter against a stand-in Kubernetes API server (tests/k8s_fake.py).

No Kubernetes (and so no Tekton controller) can run here: the fake speaks the endpoints
the adapter uses, and the tests play the Tekton controller by setting the PipelineRun's
status and creating and updating its TaskRuns, shaped as Tekton v1 writes them.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from kubernetes import client as k8s_client

from couler import ir
from couler.api.handles import SecretMaterial
from couler.compilers.tekton import compile_workflow
from couler.engines.base import RunState, StepState, StepStatus
from couler.errors import (
    ConflictError,
    NotFoundError,
    OperationTimeoutError,
    RetryableError,
    UserError,
)
from couler_runtime.tekton import IDEMPOTENCY_KEY, TektonAdapter, run_status
from couler_runtime.tekton.adapter import DIGEST_ANNOTATION
from tests.k8s_fake import FakeKube

NS = "ci"
SECRET_VALUE = "s3cr3t-value-never-in-the-pipeline"
T0 = "2024-05-01T10:00:00Z"


def workflow(name: str = "etl", echo: str = "load") -> ir.Workflow:
    extract = ir.Step(
        name="extract",
        body=ir.ScriptSpec(image="python:3.12", source="print(42)"),
        env=(ir.EnvVar("TOKEN", secret=ir.SecretRef("etl-creds", "token")),),
        outputs=(ir.OutputParameter("n", ir.OutputSource.PATH, "/tmp/n"),),
    )
    load = ir.Step(
        name="load",
        body=ir.ContainerSpec(image="alpine", command=("sh", "-c"), args=(f"echo {echo}",)),
        dependencies=(ir.Dependency("extract"),),
        retry=ir.RetryPolicy(limit=3),
    )
    fan = ir.Step(
        name="fan",
        body=ir.ContainerSpec(image="alpine", command=("echo",), args=("{{item}}",)),
        foreach=ir.ForEach(items=(ir.Literal.of("a"), ir.Literal.of("b"))),
    )
    flip = ir.Step(
        name="flip",
        body=ir.ScriptSpec(image="python:3.12", source="print('heads')"),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
        loop=ir.Loop(ir.Condition(ir.StepOutputRef("flip", "result"), ir.CompareOp.EQ,
                                  ir.Literal.of("heads")), max_iterations=3),
    )
    report = ir.Step(
        name="report",
        body=ir.ContainerSpec(image="alpine", command=("true",)),
        dependencies=(ir.Dependency("extract"),),
        when=ir.When(ir.Condition(ir.StepOutputRef("extract", "n"), ir.CompareOp.EQ,
                                  ir.Literal.of("0"))),
    )
    return ir.Workflow(name=name, steps=(extract, load, fan, flip, report))


def secret() -> SecretMaterial:
    return SecretMaterial("etl-creds", NS, {"token": SECRET_VALUE}, dry_run=False,
                          use_existing=False)


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube(token="T") as fake:
        yield fake


def adapter_for(kube: FakeKube, token: str | None = "T") -> TektonAdapter:
    cfg = k8s_client.Configuration(host=kube.url)
    if token is not None:
        cfg.api_key = {"authorization": f"Bearer {token}"}
    cfg.retries = 0
    return TektonAdapter(NS, api_client=k8s_client.ApiClient(cfg))


@pytest.fixture
def tekton(kube: FakeKube) -> TektonAdapter:
    return adapter_for(kube)


def strip_server_fields(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp"):
        obj["metadata"].pop(key, None)
    return obj


def by_step(steps: tuple[StepStatus, ...], step: str, key: str = "") -> StepStatus:
    return next(s for s in steps if s.step == step and s.key == key)


# --------------------------------------------------------------------------- controller


def condition(status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": "Succeeded", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": T0}


def task_run(run: str, task: str, name: str | None = None, *, status: str = "Unknown",
             reason: str = "Running", started: str | None = T0, finished: str | None = None,
             results: dict[str, Any] | None = None, exit_code: int | None = None,
             retries: int = 0, message: str = "") -> dict[str, Any]:
    """A TaskRun as the Tekton controller creates and updates it for pipeline task ``task``."""
    name = name or f"{run}-{task}"
    st: dict[str, Any] = {"conditions": [condition(status, reason, message)],
                          "podName": f"{name}-pod"}
    if started:
        st["startTime"] = started
    if finished:
        st["completionTime"] = finished
    step: dict[str, Any] = {"name": "main", "container": "step-main"}
    if exit_code is not None:
        step["terminated"] = {"exitCode": exit_code, "reason": "Completed"}
    else:
        step["running"] = {"startedAt": T0}
    st["steps"] = [step]
    if results:
        st["results"] = [{"name": k, "type": "array" if isinstance(v, list) else "string",
                          "value": v} for k, v in results.items()]
    if retries:
        st["retriesStatus"] = [{"conditions": [condition("False", "Failed")],
                                "podName": f"{name}-pod-retry{i}"} for i in range(retries)]
    return {"apiVersion": "tekton.dev/v1", "kind": "TaskRun",
            "metadata": {"name": name, "labels": {"tekton.dev/pipelineRun": run,
                                                  "tekton.dev/pipelineTask": task}},
            "spec": {}, "status": st}


def child(run: str, task: str, name: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1", "kind": "TaskRun",
            "name": name or f"{run}-{task}", "pipelineTaskName": task}


def set_run(status: str | None, reason: str = "", *, children: Sequence[dict[str, Any]] = (),
            skipped: Sequence[dict[str, Any]] = (), pipeline: dict[str, Any] | None = None,
            finished: str | None = None, message: str = "") -> Any:
    def mutate(obj: dict[str, Any]) -> None:
        st = obj.setdefault("status", {})
        st["startTime"] = T0
        if status is not None:
            st["conditions"] = [condition(status, reason, message)]
        if children:
            st["childReferences"] = list(children)
        if skipped:
            st["skippedTasks"] = list(skipped)
        if pipeline is not None:
            st["pipelineSpec"] = pipeline["spec"]
        if finished:
            st["completionTime"] = finished
    return mutate


def realistic_run(kube: FakeKube, run: str) -> None:
    """A finished, failed run: extract ok with a result, load failed after two retries, a
    matrix over two items, a loop stopped after two iterations (the third skipped), the
    report skipped by its when, and one TaskRun created but not yet in the run's status."""
    pipeline = kube.get("pipelines", NS, "etl")
    trs = [
        task_run(run, "extract", status="True", reason="Succeeded",
                 finished="2024-05-01T10:01:00Z", results={"n": "42"}, exit_code=0),
        task_run(run, "load", status="False", reason="Failed", started="2024-05-01T10:01:01Z",
                 finished="2024-05-01T10:04:00Z", exit_code=2, retries=2,
                 message='"step-main" exited with code 2'),
        task_run(run, "fan", f"{run}-fan-0", status="True", reason="Succeeded",
                 started="2024-05-01T10:00:02Z", exit_code=0),
        task_run(run, "fan", f"{run}-fan-1", status="False", reason="TaskRunTimeout",
                 started="2024-05-01T10:00:03Z", message="TaskRun timed out"),
        task_run(run, "flip", status="True", reason="Succeeded", results={"result": "heads"},
                 started="2024-05-01T10:00:04Z", exit_code=0),
        task_run(run, "flip-iter2", status="True", reason="Succeeded",
                 results={"result": "tails"}, started="2024-05-01T10:00:05Z", exit_code=0),
    ]
    for tr in trs:
        kube.put("taskruns", NS, tr)
    kube.put("taskruns", NS, task_run(run, "late", status="Unknown", reason="Pending",
                                      started=None))
    kube.put("taskruns", NS, task_run("another-run", "extract"))  # not this run's
    kube.update("pipelineruns", NS, run, set_run(
        "False", "Failed", message="Tasks Completed: 6 (Failed: 2, Cancelled 0), Skipped: 2",
        finished="2024-05-01T10:05:00Z", pipeline=pipeline,
        children=[child(run, "extract"), child(run, "load"), child(run, "fan", f"{run}-fan-0"),
                  child(run, "fan", f"{run}-fan-1"), child(run, "flip"),
                  child(run, "flip-iter2")],
        skipped=[{"name": "flip-iter3", "reason": "When Expressions evaluated to false"},
                 {"name": "report", "reason": "When Expressions evaluated to false"}]))


# --------------------------------------------------------------------------- submit


def test_submit_creates_pipeline_run_and_secret(kube: FakeKube, tekton: TektonAdapter) -> None:
    wf = workflow()
    name = tekton.submit(wf, [secret()])
    assert name.startswith("etl-")
    pipeline, run = compile_workflow(wf)
    assert kube.names("pipelines", NS) == ["etl"]
    assert kube.names("pipelineruns", NS) == [name]
    stored_pipeline = strip_server_fields(kube.get("pipelines", NS, "etl"))
    digest = stored_pipeline["metadata"].pop("annotations")[DIGEST_ANNOTATION]
    assert len(digest) == 64
    assert stored_pipeline == {**pipeline, "metadata": {}}
    stored = kube.get("pipelineruns", NS, name)
    assert stored["metadata"]["namespace"] == NS
    assert stored["spec"]["pipelineRef"] == {"name": "etl"}
    assert strip_server_fields(stored) == run

    body = kube.secrets[(NS, "etl-creds")]
    assert (body["stringData"], body["type"]) == ({"token": SECRET_VALUE}, "Opaque")
    for req in kube.requests:
        if "/secrets" not in req.path:
            assert SECRET_VALUE not in json.dumps(req.body)
    assert '"secretKeyRef": {"name": "etl-creds", "key": "token"}' in json.dumps(
        kube.get("pipelines", NS, "etl"))
    # Order: the secret and the Pipeline exist before the run that needs them.
    posts = [r.path.rsplit("/", 1)[-1] for r in kube.requests_of("POST")]
    assert posts == ["secrets", "pipelines", "pipelineruns"]


def test_scheduled_and_triggered_workflows_create_every_document(
        kube: FakeKube, tekton: TektonAdapter) -> None:
    """The CronJob, its ConfigMap and the Tekton Triggers objects are created (and
    replaced on a second submit); a scheduled workflow gets no PipelineRun now."""
    wf = ir.Workflow(name="nightly", steps=(ir.Step(
        name="a", body=ir.ContainerSpec(image="alpine", command=("true",))),),
        schedule=ir.CronSchedule("0 3 * * *"),
        triggers=(ir.EventTrigger("datasets.ready", "body.size > 0"),))
    assert tekton.submit(wf) == "nightly"
    docs = {d["kind"]: d for d in compile_workflow(wf)}
    assert kube.names("pipelineruns", NS) == []
    for plural, kind in (("configmaps", "ConfigMap"), ("cronjobs", "CronJob"),
                         ("triggerbindings", "TriggerBinding"),
                         ("triggertemplates", "TriggerTemplate"),
                         ("eventlisteners", "EventListener")):
        name = "nightly-pipelinerun" if kind == "ConfigMap" else "nightly"
        assert kube.names(plural, NS) == [name]
        assert strip_server_fields(kube.get(plural, NS, name)) == {**docs[kind],
                                                                   "metadata": {}}
    posts = [r.path.rsplit("/", 1)[-1] for r in kube.requests_of("POST")]
    assert posts == ["pipelines", "configmaps", "cronjobs", "triggerbindings",
                     "triggertemplates", "eventlisteners"]
    changed = ir.Workflow(name="nightly", steps=wf.steps,
                          schedule=ir.CronSchedule("0 4 * * *"), triggers=wf.triggers)
    assert tekton.submit(changed) == "nightly"
    assert kube.get("cronjobs", NS, "nightly")["spec"]["schedule"] == "0 4 * * *"
    assert [r.path.rsplit("/", 1)[-1] for r in kube.requests_of("PUT")] == [
        "nightly-pipelinerun", "nightly", "nightly", "nightly", "nightly"]


def test_a_triggered_workflow_also_runs_now(kube: FakeKube, tekton: TektonAdapter) -> None:
    wf = ir.Workflow(name="react", steps=(ir.Step(
        name="a", body=ir.ContainerSpec(image="alpine", command=("true",))),),
        triggers=(ir.EventTrigger("datasets.ready"),))
    name = tekton.submit(wf)
    assert kube.names("pipelineruns", NS) == [name]
    assert kube.names("eventlisteners", NS) == ["react"]


def test_pipeline_is_reused_when_unchanged_and_replaced_when_changed(
        kube: FakeKube, tekton: TektonAdapter) -> None:
    first = tekton.submit(workflow())
    second = tekton.submit(workflow())
    assert first != second
    assert len(kube.names("pipelineruns", NS)) == 2
    assert kube.requests_of("PUT") == []  # identical Pipeline: reused
    digest_before = kube.get("pipelines", NS, "etl")["metadata"]["annotations"][
        DIGEST_ANNOTATION]

    # The server's defaults do not make a Pipeline look changed: the digest decides.
    kube.update("pipelines", NS, "etl", lambda o: o["spec"]["tasks"][0].setdefault(
        "taskSpec", {}).setdefault("metadata", {}))
    tekton.submit(workflow())
    assert kube.requests_of("PUT") == []
    version = kube.get("pipelines", NS, "etl")["metadata"]["resourceVersion"]

    changed = workflow(echo="loaded!")
    tekton.submit(changed)
    (put,) = kube.requests_of("PUT")
    assert put.path.endswith("/pipelines/etl")
    assert put.body["metadata"]["resourceVersion"] == version  # optimistic concurrency
    stored = strip_server_fields(kube.get("pipelines", NS, "etl"))
    assert stored["metadata"]["annotations"][DIGEST_ANNOTATION] != digest_before
    stored["metadata"].pop("annotations")
    assert stored == {**compile_workflow(changed)[0], "metadata": {}}


def test_replacing_a_pipeline_changed_meanwhile_is_a_conflict(
        kube: FakeKube, tekton: TektonAdapter, monkeypatch: pytest.MonkeyPatch) -> None:
    tekton.submit(workflow())
    real_get = tekton._custom.get_namespaced_custom_object

    def get_then_someone_else_writes(*args: Any, **kw: Any) -> Any:
        obj = real_get(*args, **kw)
        kube.update("pipelines", NS, "etl", lambda o: o["metadata"].update(labels={"x": "y"}))
        return obj

    monkeypatch.setattr(tekton._custom, "get_namespaced_custom_object",
                        get_then_someone_else_writes)
    with pytest.raises(ConflictError, match=r"Pipeline 'etl' of workflow 'etl'.*409"):
        tekton.submit(workflow(echo="changed"))
    assert len(kube.names("pipelineruns", NS)) == 1  # no run of a pipeline not written


def test_idempotent_resubmit_returns_same_run(kube: FakeKube, tekton: TektonAdapter) -> None:
    wf = workflow()
    first = tekton.submit(wf, [secret()], idempotency_key="order-1234")
    meta = kube.get("pipelineruns", NS, first)["metadata"]
    assert meta["labels"] == {IDEMPOTENCY_KEY: "order-1234"}
    assert meta["annotations"] == {IDEMPOTENCY_KEY: "order-1234"}

    requests_before = len(kube.requests)
    assert tekton.submit(wf, [secret()], idempotency_key="order-1234") == first
    new = kube.requests[requests_before:]
    assert [r.method for r in new] == ["GET"]  # one lookup, nothing created or replaced
    assert new[0].path.endswith("/pipelineruns")
    assert new[0].query["labelSelector"] == f"{IDEMPOTENCY_KEY}=order-1234"
    assert kube.names("pipelineruns", NS) == [first]

    other = tekton.submit(wf, idempotency_key="order-5678")
    assert other != first
    assert len(kube.names("pipelineruns", NS)) == 2


def test_idempotency_key_that_is_not_a_label_value_is_hashed(
        kube: FakeKube, tekton: TektonAdapter) -> None:
    key = "tenant/acme: nightly run " + "x" * 80
    first = tekton.submit(workflow(), idempotency_key=key)
    meta = kube.get("pipelineruns", NS, first)["metadata"]
    assert meta["annotations"][IDEMPOTENCY_KEY] == key
    assert meta["labels"][IDEMPOTENCY_KEY].startswith("sha256-")
    assert len(meta["labels"][IDEMPOTENCY_KEY]) <= 63
    assert tekton.submit(workflow(), idempotency_key=key) == first
    # Same hash, different key (a collision): the annotation tells them apart.
    kube.update("pipelineruns", NS, first,
                lambda o: o["metadata"]["annotations"].update({IDEMPOTENCY_KEY: "other"}))
    assert tekton.submit(workflow(), idempotency_key=key) != first


def test_invalid_run_is_a_user_error(kube: FakeKube, tekton: TektonAdapter,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import couler_runtime.tekton.adapter as mod

    def broken(wf: ir.Workflow) -> list[dict[str, Any]]:
        pipeline, run = compile_workflow(wf)
        del run["spec"]["pipelineRef"]
        return [pipeline, run]

    monkeypatch.setattr(mod, "compile_workflow", broken)
    with pytest.raises(UserError, match=r"workflow 'etl'.*422.*pipelineRef") as info:
        tekton.submit(workflow())
    assert not isinstance(info.value, (NotFoundError, ConflictError))


def test_tenant_outside_the_namespace_is_refused(kube: FakeKube, tekton: TektonAdapter) -> None:
    with pytest.raises(UserError, match="'other'"):
        tekton.submit(ir.Workflow(name="etl", steps=workflow().steps, tenant="other"))
    assert kube.requests == []


# --------------------------------------------------------------------------- errors


def test_token_required(kube: FakeKube) -> None:
    for token in (None, "wrong"):
        with pytest.raises(UserError, match=r"401.*bearer token"):
            adapter_for(kube, token).submit(workflow())
    assert kube.names("pipelineruns", NS) == []


def test_not_found_names_the_run(tekton: TektonAdapter) -> None:
    with pytest.raises(NotFoundError, match=r"PipelineRun 'ghost'.*namespace 'ci'"):
        tekton.status("ghost")
    with pytest.raises(NotFoundError, match="ghost"):
        tekton.cancel("ghost")
    with pytest.raises(NotFoundError, match="ghost"):
        tekton.logs("ghost", "extract")
    with pytest.raises(NotFoundError, match="ghost"):
        next(tekton.watch("ghost"))


def test_unreachable_server_is_retryable() -> None:
    cfg = k8s_client.Configuration(host="http://127.0.0.1:1")
    cfg.retries = 0
    tekton = TektonAdapter(NS, api_client=k8s_client.ApiClient(cfg))
    with pytest.raises(RetryableError, match="PipelineRun 'x'"):
        tekton.status("x")


def test_host_and_token_options(kube: FakeKube) -> None:
    tekton = TektonAdapter(NS, host=kube.url, token="T")
    name = tekton.submit(workflow())
    st = tekton.status(name)
    assert (st.state, st.workflow, st.steps) == (RunState.PENDING, "etl", ())


# --------------------------------------------------------------------------- status


def test_status_maps_a_realistic_run(kube: FakeKube, tekton: TektonAdapter) -> None:
    name = tekton.submit(workflow())
    realistic_run(kube, name)
    st = tekton.status(name)
    assert (st.run_id, st.workflow, st.state) == (name, "etl", RunState.FAILED)
    assert st.message.startswith("Tasks Completed: 6")
    assert st.finished_at is not None and st.started_at is not None
    assert st.finished_at - st.started_at == 300
    assert sorted((s.step, s.key) for s in st.steps) == [
        ("extract", ""), ("fan", "0"), ("fan", "1"), ("flip", "0"), ("flip", "1"),
        ("flip", "2"), ("late", ""), ("load", ""), ("report", "")]

    extract = by_step(st.steps, "extract")
    assert extract.state is StepState.SUCCEEDED
    assert (extract.outputs, extract.exit_code, extract.attempts) == ({"n": "42"}, 0, 1)
    assert extract.finished_at is not None and extract.started_at is not None
    assert extract.finished_at - extract.started_at == 60

    load = by_step(st.steps, "load")
    assert (load.state, load.attempts, load.exit_code) == (StepState.FAILED, 3, 2)
    assert load.message == '"step-main" exited with code 2'

    assert by_step(st.steps, "fan", "0").state is StepState.SUCCEEDED
    timed_out = by_step(st.steps, "fan", "1")
    assert (timed_out.state, timed_out.message) == (StepState.FAILED, "TaskRun timed out")
    assert by_step(st.steps, "flip", "0").outputs == {"result": "heads"}
    assert by_step(st.steps, "flip", "1").outputs == {"result": "tails"}
    third = by_step(st.steps, "flip", "2")
    assert (third.state, third.attempts) == (StepState.SKIPPED, 0)
    report = by_step(st.steps, "report")
    assert (report.state, report.message, report.started_at) == (
        StepState.SKIPPED, "When Expressions evaluated to false", None)
    late = by_step(st.steps, "late")  # labelled with the run, not yet in its status
    assert (late.state, late.attempts) == (StepState.PENDING, 1)
    # Steps come in start order, the never-started last.
    assert [s.step for s in st.steps[:3]] == ["extract", "fan", "fan"]


def test_matrix_item_keys_come_from_the_taskrun_names() -> None:
    def matrix_run(names: list[str]) -> dict[str, Any]:
        return {"metadata": {"name": "r"}, "status": {
            "conditions": [condition("Unknown", "Running")],
            "pipelineSpec": {"tasks": [{"name": "fan", "matrix": {"include": []}}]},
            "childReferences": [child("r", "fan", n) for n in names]}}

    # Listed out of order: the index in the name wins.
    names = ["r-fan-2", "r-fan-0", "r-fan-1"]
    st = run_status(matrix_run(names), [task_run("r", "fan", n) for n in names])
    assert {s.key: s.message for s in st.steps} == {"0": "", "1": "", "2": ""}
    got = {s.key for s in st.steps if s.step == "fan"}
    assert got == {"0", "1", "2"}
    # Names Tekton shortened (run name too long): the creation order.
    names = ["r-fan-0a1b2c3d", "r-fan-9f8e7d6c"]
    trs = [task_run("r", "fan", n, status="True", reason="Succeeded", results={"i": n})
           for n in names]
    st = run_status(matrix_run(names), trs)
    assert {s.key: s.outputs["i"] for s in st.steps} == {"0": names[0], "1": names[1]}
    # A single matrixed TaskRun is still item 0.
    st = run_status(matrix_run(["r-fan-0"]), [task_run("r", "fan", "r-fan-0")])
    assert [(s.step, s.key) for s in st.steps] == [("fan", "0")]


@pytest.mark.parametrize(("status", "reason", "state"), [
    (None, "", RunState.PENDING),
    ("Unknown", "PipelineRunPending", RunState.PENDING),
    ("Unknown", "Started", RunState.RUNNING),
    ("Unknown", "Running", RunState.RUNNING),
    ("Unknown", "CancelledRunFinally", RunState.RUNNING),  # finally tasks still running
    ("True", "Succeeded", RunState.SUCCEEDED),
    ("True", "Completed", RunState.SUCCEEDED),  # succeeded with skipped tasks
    ("False", "Failed", RunState.FAILED),
    ("False", "PipelineRunTimeout", RunState.FAILED),
    ("False", "CouldntGetPipeline", RunState.FAILED),
    ("False", "Cancelled", RunState.CANCELLED),
    ("False", "PipelineRunCancelled", RunState.CANCELLED),
    ("False", "StoppedRunFinally", RunState.CANCELLED),
])
def test_run_conditions(status: str | None, reason: str, state: RunState) -> None:
    run: dict[str, Any] = {"metadata": {"name": "etl-1", "generateName": "etl-"}}
    set_run(status, reason)(run)
    st = run_status(run, ())
    assert (st.state, st.workflow) == (state, "etl")


@pytest.mark.parametrize(("status", "reason", "state"), [
    ("Unknown", "Started", StepState.PENDING),
    ("Unknown", "Pending", StepState.PENDING),
    ("Unknown", "Running", StepState.RUNNING),
    ("Unknown", "ToBeRetried", StepState.RETRYING),
    ("True", "Succeeded", StepState.SUCCEEDED),
    ("False", "Failed", StepState.FAILED),
    ("False", "TaskRunTimeout", StepState.FAILED),
    ("False", "TaskRunImagePullFailed", StepState.FAILED),
    ("False", "TaskRunCancelled", StepState.CANCELLED),
])
def test_taskrun_conditions(status: str, reason: str, state: StepState) -> None:
    run: dict[str, Any] = {"metadata": {"name": "r"}}
    set_run("Unknown", "Running", children=[child("r", "t")])(run)
    (step,) = run_status(run, [task_run("r", "t", status=status, reason=reason)]).steps
    assert (step.step, step.state) == ("t", state)
    # A TaskRun listed in the run's status but not readable yet is pending.
    (step,) = run_status(run, []).steps
    assert (step.state, step.attempts) == (StepState.PENDING, 0)


# --------------------------------------------------------------------------- watch


def test_watch_follows_the_run_and_its_taskruns(kube: FakeKube, tekton: TektonAdapter) -> None:
    name = tekton.submit(workflow())
    seen = tekton.watch(name, timeout=8)
    assert next(seen).state is RunState.PENDING
    # Changed before the watches connect: replayed from the versions of the first read.
    kube.update("pipelineruns", NS, name, set_run("Unknown", "Running",
                                                  children=[child(name, "extract")]))
    running = next(seen)
    assert running.state is RunState.RUNNING
    assert kube.wait_for_watchers(2)
    # Only the TaskRun changes (the run's status does not): still streamed.
    kube.put("taskruns", NS, task_run(name, "extract", reason="Running"))
    step = next(seen)
    assert by_step(step.steps, "extract").state is StepState.RUNNING
    kube.put("taskruns", NS, task_run("another-run", "extract"))  # not ours: not yielded
    kube.update("taskruns", NS, f"{name}-extract", lambda o: o["status"].update(
        conditions=[condition("True", "Succeeded")], results=[
            {"name": "n", "type": "string", "value": "42"}]))
    step = next(seen)
    assert by_step(step.steps, "extract").outputs == {"n": "42"}
    kube.update("pipelineruns", NS, name, set_run("True", "Succeeded",
                                                  children=[child(name, "extract")]))
    done = next(seen)
    assert done.state is RunState.SUCCEEDED
    with pytest.raises(StopIteration):
        next(seen)
    watches = {r.path.rsplit("/", 1)[-1]: r.query for r in kube.requests_of("GET")
               if r.query.get("watch") == "true"}
    assert watches["pipelineruns"]["fieldSelector"] == f"metadata.name={name}"
    assert watches["taskruns"]["labelSelector"] == f"tekton.dev/pipelineRun={name}"
    assert all("resourceVersion" in q for q in watches.values())


def test_watch_reads_the_taskruns_again_when_the_run_ends(
        kube: FakeKube, tekton: TektonAdapter) -> None:
    name = tekton.submit(workflow())
    kube.put("taskruns", NS, task_run(name, "extract"))
    kube.update("pipelineruns", NS, name, set_run("Unknown", "Running",
                                                  children=[child(name, "extract")]))
    seen = tekton.watch(name, timeout=8)
    assert by_step(next(seen).steps, "extract").state is StepState.RUNNING
    # The TaskRun's last change has not reached the adapter when the run's does (the two
    # streams are not ordered): stored without an event here.
    with kube.cond:
        kube.objects[("taskruns", NS, f"{name}-extract")]["status"]["conditions"] = [
            condition("True", "Succeeded")]
    kube.update("pipelineruns", NS, name, set_run("True", "Succeeded",
                                                  children=[child(name, "extract")]))
    done = next(seen)
    assert done.state is RunState.SUCCEEDED
    assert by_step(done.steps, "extract").state is StepState.SUCCEEDED


def test_watch_of_a_finished_run_yields_once(kube: FakeKube, tekton: TektonAdapter) -> None:
    name = tekton.submit(workflow())
    kube.update("pipelineruns", NS, name, set_run("True", "Succeeded"))
    assert [s.state for s in tekton.watch(name)] == [RunState.SUCCEEDED]
    assert not any(r.query.get("watch") for r in kube.requests)


def test_watch_times_out(kube: FakeKube, tekton: TektonAdapter) -> None:
    name = tekton.submit(workflow())
    kube.update("pipelineruns", NS, name, set_run("Unknown", "Running"))
    seen = tekton.watch(name, timeout=0.5)
    assert next(seen).state is RunState.RUNNING
    with pytest.raises(OperationTimeoutError, match=name):
        next(seen)


def test_watch_of_a_deleted_run(kube: FakeKube, tekton: TektonAdapter) -> None:
    name = tekton.submit(workflow())
    seen = tekton.watch(name, timeout=8)
    next(seen)

    def delete_once_watched() -> None:  # a barrier on the server, not a delay
        assert kube.wait_for_watchers(2, timeout=20)
        kube.delete("pipelineruns", NS, name)

    thread = threading.Thread(target=delete_once_watched, daemon=True)
    thread.start()
    with pytest.raises(NotFoundError, match=f"{name}.*deleted"):
        next(seen)
    thread.join()
    assert kube.events[-1][3] == "DELETED"


# --------------------------------------------------------------------------- cancel, logs


def test_cancel_sends_the_cancelled_merge_patch(kube: FakeKube, tekton: TektonAdapter) -> None:
    name = tekton.submit(workflow())
    kube.update("pipelineruns", NS, name, set_run("Unknown", "Running",
                                                  children=[child(name, "extract")]))
    tekton.cancel(name)
    patch = kube.requests_of("PATCH")[-1]
    assert patch.path.endswith(f"/tekton.dev/v1/namespaces/{NS}/pipelineruns/{name}")
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body == {"spec": {"status": "Cancelled"}}
    stored = kube.get("pipelineruns", NS, name)
    assert stored["spec"] == {"pipelineRef": {"name": "etl"}, "status": "Cancelled"}
    # The controller cancels the TaskRuns and ends the run with reason Cancelled.
    kube.put("taskruns", NS, task_run(name, "extract", status="False",
                                      reason="TaskRunCancelled"))
    kube.update("pipelineruns", NS, name, set_run(
        "False", "Cancelled", children=[child(name, "extract")],
        message="PipelineRun \"etl\" was cancelled"))
    st = tekton.status(name)
    assert st.state is RunState.CANCELLED
    assert by_step(st.steps, "extract").state is StepState.CANCELLED
    # Cancelling a finished run changes nothing.
    patches = len(kube.requests_of("PATCH"))
    tekton.cancel(name)
    assert len(kube.requests_of("PATCH")) == patches


def test_logs_reads_the_pod_of_the_step(kube: FakeKube, tekton: TektonAdapter) -> None:
    name = tekton.submit(workflow())
    realistic_run(kube, name)
    kube.set_log(NS, f"{name}-extract-pod", "extracting\n42\n")
    kube.set_log(NS, f"{name}-fan-1-pod", "b\n")
    kube.set_log(NS, f"{name}-flip-iter2-pod", "tails\n")

    assert tekton.logs(name, "extract") == "extracting\n42\n"
    log_request = kube.requests_of("GET")[-1]
    assert log_request.path == f"/api/v1/namespaces/{NS}/pods/{name}-extract-pod/log"
    assert log_request.query["container"] == "step-main"
    assert tekton.logs(name, "fan", "1") == "b\n"
    assert tekton.logs(name, "flip", "1") == "tails\n"
    with pytest.raises(NotFoundError, match=r"PipelineRun .*: no step 'nope'"):
        tekton.logs(name, "nope")
    with pytest.raises(NotFoundError, match=r"step 'report' has no pod \(it was skipped\)"):
        tekton.logs(name, "report")
    with pytest.raises(NotFoundError, match="pod"):
        tekton.logs(name, "load")  # the pod is gone: its log is not there


# --------------------------------------------------------------------------- utilization


def test_utilization_reads_the_pod_metrics_of_running_taskruns(kube: FakeKube,
                                                               tekton: TektonAdapter) -> None:
    name = tekton.submit(workflow())
    kube.put("taskruns", NS, task_run(name, "extract", status="True", reason="Succeeded",
                                      exit_code=0))
    kube.put("taskruns", NS, task_run(name, "fan", f"{name}-fan-0"))  # running
    kube.put("taskruns", NS, task_run(name, "fan", f"{name}-fan-1", retries=1))  # running
    kube.update("pipelineruns", NS, name, set_run("Unknown", "Running", children=[
        child(name, "extract"), child(name, "fan", f"{name}-fan-0"),
        child(name, "fan", f"{name}-fan-1")]))
    kube.set_pod_metrics(NS, f"{name}-extract-pod", {"step-main": ("9", "9Gi")})  # finished
    kube.set_pod_metrics(NS, f"{name}-fan-0-pod", {"step-main": ("250m", "128Mi"),
                                                   "prepare": ("1m", "1Mi")},
                         timestamp="2024-05-01T10:00:30Z", window="30s")
    kube.set_pod_metrics(NS, f"{name}-fan-1-pod", {"step-main": ("125000000n", "256Mi")},
                         timestamp="2024-05-01T10:00:31Z", window="30s")
    samples = sorted(tekton.utilization(name), key=lambda s: s.key)
    assert [(s.step, s.key, s.attempt) for s in samples] == [("fan", "0", 1), ("fan", "1", 2)]
    assert [s.cpu for s in samples] == [pytest.approx(0.25), pytest.approx(0.125)]
    assert [s.memory_bytes >> 20 for s in samples] == [128, 256]
    assert {s.interval_seconds for s in samples} == {30.0}
    # No metrics API in the cluster: no samples, not an error.
    kube.metrics_api = 404
    assert adapter_for(kube).utilization(name) == []


def test_the_step_status_rewrite_decides_the_step_state() -> None:
    # A compiled workflow with edge conditions: each step's TaskRun succeeds (onError:
    # continue); its couler-status result says what happened, couler-run-status is no step.
    run: dict[str, Any] = {"metadata": {"name": "r"}}
    names = ["broken", "handler", "after", "couler-run-status"]
    set_run("False", "Failed", children=[child("r", n) for n in names])(run)
    done = {"status": "True", "reason": "Succeeded", "exit_code": 0}
    trs = [task_run("r", "broken", **{**done, "exit_code": 3}, results={
               "couler-status": "Failed", "couler-branch": "failed",
               "couler-attempts": "2", "couler-failure": "user", "out": ""}),
           task_run("r", "handler", **done, results={"couler-status": "Succeeded",
                                                     "couler-branch": "ok", "out": "fixed"}),
           task_run("r", "after", **done, results={"couler-status": "Omitted",
                                                   "couler-branch": "failed"}),
           task_run("r", "couler-run-status", status="False", reason="Failed")]
    st = run_status(run, trs)
    steps = {s.step: s for s in st.steps}
    assert set(steps) == {"broken", "handler", "after"}
    broken = steps["broken"]
    assert (broken.state, broken.attempts, broken.failure, broken.exit_code) == (
        StepState.FAILED, 2, "user", 3)
    assert broken.outputs == {"out": ""}  # the compiler's own results are not outputs
    assert (steps["handler"].state, steps["handler"].outputs) == (StepState.SUCCEEDED,
                                                                  {"out": "fixed"})
    assert (steps["after"].state, steps["after"].message) == (
        StepState.SKIPPED, "not run: its dependencies did not hold")
    assert st.state is RunState.FAILED


def test_a_bounded_maps_batches_are_one_step_keyed_by_item() -> None:
    include = [{"name": f"item-{i}"} for i in range(3)]
    run = {"metadata": {"name": "r"}, "status": {
        "conditions": [condition("Unknown", "Running")],
        "pipelineSpec": {"tasks": [{"name": "sq", "matrix": {"include": include[:2]}},
                                   {"name": "sq-batch2", "matrix": {"include": include[2:]}}]},
        "childReferences": [child("r", "sq", "r-sq-0"), child("r", "sq", "r-sq-1"),
                            child("r", "sq-batch2", "r-sq-batch2-0")]}}
    trs = [task_run("r", "sq", "r-sq-0"), task_run("r", "sq", "r-sq-1"),
           task_run("r", "sq-batch2", "r-sq-batch2-0")]
    st = run_status(run, trs)
    assert sorted((s.step, s.key) for s in st.steps) == [("sq", "0"), ("sq", "1"), ("sq", "2")]


def test_memory_escalation_attempt_tasks_are_one_step() -> None:
    run = {"metadata": {"name": "r"}, "status": {
        "conditions": [condition("Unknown", "Running")],
        "pipelineSpec": {"tasks": [{"name": "train"}, {"name": "train-mem2"},
                                   {"name": "train-mem3"}]},
        "childReferences": [child("r", "train"), child("r", "train-mem2")]}}
    trs = [task_run("r", "train", status="True", reason="Succeeded", exit_code=137,
                    results={"couler-attempts": "1", "couler-failure": "oom",
                             "couler-exit": "137"}),
           task_run("r", "train-mem2", status="Unknown", reason="Running")]
    (step,) = run_status(run, trs).steps
    assert (step.step, step.key, step.state) == ("train", "", StepState.RUNNING)


def test_a_step_whose_results_came_from_the_cache_is_cached() -> None:
    run: dict[str, Any] = {"metadata": {"name": "r"}}
    set_run("True", "Succeeded", children=[child("r", "t")])(run)
    tr = task_run("r", "t", status="True", reason="Succeeded", exit_code=0,
                  results={"n": "42", "couler-cached": "true"})
    (step,) = run_status(run, [tr]).steps
    assert (step.state, step.outputs) == (StepState.CACHED, {"n": "42"})
