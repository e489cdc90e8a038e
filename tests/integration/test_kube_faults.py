"""The Argo and Tekton adapters under the faults a real Kubernetes API server gives.

The stand-in server (tests/k8s_fake.py) validates every object posted against the vendored
Argo and Tekton schemas and answers chosen requests with 403, 404, 409, 410, 422, 429
(``Retry-After``) or 5xx, or ends a watch with an ``ERROR`` event (410 "too old resource
version", as the API server does after etcd compacts its history). Each test checks what
the adapter does about it: send again (429 always, 5xx only when the request is
idempotent, a name-generation conflict on create) with bounded back-off -- the waits are
recorded, never slept --, list again and resume after 410, or fail with an error naming
the workflow. Synchronization is by what the server records (requests, open watches).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client

from couler import ir
from couler.compilers.argo import compile_workflow as compile_argo
from couler.compilers.tekton import compile_workflow as compile_tekton
from couler.engines.base import RunState, StepState
from couler.errors import ConflictError, NotFoundError, RetryableError, UserError
from couler_runtime.argo import ArgoAdapter
from couler_runtime.kube import RetryPolicy
from couler_runtime.tekton import TektonAdapter
from tests.integration.test_argo_adapter import set_status
from tests.integration.test_argo_adapter import workflow as argo_workflow
from tests.integration.test_tekton_adapter import by_step, child, condition, set_run, task_run
from tests.integration.test_tekton_adapter import workflow as tekton_workflow
from tests.k8s_fake import FakeKube

ARGO_NS, TEKTON_NS = "argo", "ci"


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube(token="T") as fake:
        yield fake


@pytest.fixture
def sleeps() -> list[float]:
    return []


def _client(kube: FakeKube) -> Any:
    cfg = k8s_client.Configuration(host=kube.url)
    cfg.api_key = {"authorization": "Bearer T"}
    cfg.retries = 0
    return k8s_client.ApiClient(cfg)


@pytest.fixture
def argo(kube: FakeKube, sleeps: list[float]) -> ArgoAdapter:
    return ArgoAdapter(ARGO_NS, api_client=_client(kube), retry=RetryPolicy(sleep=sleeps.append))


@pytest.fixture
def tekton(kube: FakeKube, sleeps: list[float]) -> TektonAdapter:
    return TektonAdapter(TEKTON_NS, api_client=_client(kube),
                         retry=RetryPolicy(sleep=sleeps.append))


def posts(kube: FakeKube, plural: str) -> int:
    return sum(1 for r in kube.requests_of("POST") if r.path.endswith("/" + plural))


def watches(kube: FakeKube, plural: str) -> list[dict[str, str]]:
    return [r.query for r in kube.requests_of("GET")
            if r.query.get("watch") == "true" and r.path.endswith("/" + plural)]


# --------------------------------------------------------------------------- schema


def test_a_field_the_argo_schema_does_not_know_is_refused_naming_it(
        kube: FakeKube, argo: ArgoAdapter, monkeypatch: pytest.MonkeyPatch) -> None:
    """422 with a Status naming the field: a field a real server would prune silently
    (the Workflow would run without it) fails the submit instead, as a user error."""
    import couler_runtime.argo.adapter as mod

    def misspelt(wf: ir.Workflow) -> dict[str, Any]:
        doc = compile_argo(wf)
        doc["spec"]["templates"][0]["retryStategy"] = {"limit": 3}
        doc["spec"]["parallelism"] = "many"
        return doc

    monkeypatch.setattr(mod, "compile_workflow", misspelt)
    with pytest.raises(UserError, match=r"workflow 'etl'.*422") as info:
        argo.submit(argo_workflow())
    text = str(info.value)
    assert "spec.templates.0.retryStategy" in text or "spec.templates[0].retryStategy" in text
    assert "spec.parallelism" in text
    assert not isinstance(info.value, (NotFoundError, ConflictError))
    assert kube.names("workflows", ARGO_NS) == []


def test_a_pipeline_run_against_the_tekton_schema(
        kube: FakeKube, tekton: TektonAdapter, monkeypatch: pytest.MonkeyPatch) -> None:
    import couler_runtime.tekton.adapter as mod

    def wrong(wf: ir.Workflow) -> list[dict[str, Any]]:
        pipeline, run = compile_tekton(wf)[:2]
        run["spec"]["timeouts"] = {"pipeline": 3600}  # a duration is a string
        return [pipeline, run]

    monkeypatch.setattr(mod, "compile_workflow", wrong)
    with pytest.raises(UserError, match=r"PipelineRun of workflow 'etl'.*422.*"
                                        r"spec\.timeouts\.pipeline"):
        tekton.submit(tekton_workflow())
    assert kube.names("pipelineruns", TEKTON_NS) == []


def test_what_the_compilers_emit_passes_the_schemas(kube: FakeKube, argo: ArgoAdapter,
                                                   tekton: TektonAdapter) -> None:
    """The validation is not vacuous the other way either: the real documents pass."""
    assert argo.submit(argo_workflow()) in kube.names("workflows", ARGO_NS)
    assert tekton.submit(tekton_workflow()) in kube.names("pipelineruns", TEKTON_NS)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("code", [403, 422])
def test_forbidden_or_invalid_create_fails_once_naming_the_workflow(
        kube: FakeKube, argo: ArgoAdapter, sleeps: list[float], code: int) -> None:
    kube.inject(code, method="POST", plural="workflows")
    with pytest.raises(UserError, match=rf"Workflow of workflow 'etl'.*{code}") as info:
        argo.submit(argo_workflow())
    assert not isinstance(info.value, (NotFoundError, ConflictError, RetryableError))
    if code == 403:
        assert "RBAC" in str(info.value) and "cannot create" in str(info.value)
    assert (posts(kube, "workflows"), sleeps) == (1, [])  # not sent again
    assert kube.names("workflows", ARGO_NS) == []


def test_forbidden_pipeline_run_names_the_workflow(kube: FakeKube, tekton: TektonAdapter,
                                                   sleeps: list[float]) -> None:
    kube.inject(403, method="POST", plural="pipelineruns")
    with pytest.raises(UserError, match=r"PipelineRun of workflow 'etl'.*403.*RBAC"):
        tekton.submit(tekton_workflow())
    assert (posts(kube, "pipelineruns"), sleeps) == (1, [])


def test_not_found_is_not_sent_again(kube: FakeKube, argo: ArgoAdapter,
                                     sleeps: list[float]) -> None:
    name = argo.submit(argo_workflow())
    kube.inject(404, method="GET", plural="workflows")
    with pytest.raises(NotFoundError, match=rf"workflow '{name}'.*namespace 'argo'"):
        argo.status(name)
    assert sleeps == []
    assert argo.status(name).state is RunState.PENDING  # the fault was one answer


# --------------------------------------------------------------------------- 409


def test_a_name_generation_conflict_on_create_is_sent_again(
        kube: FakeKube, argo: ArgoAdapter, sleeps: list[float]) -> None:
    """409 AlreadyExists on a create with ``generateName``: the server could not find a
    free name and created nothing; sent again after its ``retryAfterSeconds``."""
    kube.inject(409, method="POST", plural="workflows")
    name = argo.submit(argo_workflow())
    assert kube.names("workflows", ARGO_NS) == [name]
    assert (posts(kube, "workflows"), sleeps) == (2, [1.0])


def test_a_conflict_on_a_named_object_is_already_exists_not_a_retry(
        kube: FakeKube, tekton: TektonAdapter, sleeps: list[float]) -> None:
    """The Pipeline has a fixed name: 409 means it exists, so the adapter reads it and
    keeps it when unchanged -- no second create, no wait."""
    tekton.submit(tekton_workflow())
    before = kube.get("pipelines", TEKTON_NS, "etl")["metadata"]["resourceVersion"]
    run = tekton.submit(tekton_workflow())
    assert kube.get("pipelines", TEKTON_NS, "etl")["metadata"]["resourceVersion"] == before
    assert posts(kube, "pipelines") == 2 and sleeps == []
    assert run in kube.names("pipelineruns", TEKTON_NS)


def test_a_name_conflict_that_persists_is_a_conflict(kube: FakeKube, argo: ArgoAdapter,
                                                     sleeps: list[float]) -> None:
    kube.inject(409, method="POST", plural="workflows", times=10)
    with pytest.raises(ConflictError, match=r"workflow 'etl'.*409"):
        argo.submit(argo_workflow())
    assert posts(kube, "workflows") == 4 and sleeps == [1.0, 1.0, 1.0]


# --------------------------------------------------------------------------- 429, 5xx


def test_too_many_requests_waits_the_retry_after(kube: FakeKube, argo: ArgoAdapter,
                                                 sleeps: list[float]) -> None:
    kube.inject(429, method="POST", plural="workflows", times=2, retry_after=7)
    name = argo.submit(argo_workflow())
    assert kube.names("workflows", ARGO_NS) == [name]
    assert sleeps == [7.0, 7.0]
    assert posts(kube, "workflows") == 3


def test_a_retry_after_beyond_the_cap_is_capped(kube: FakeKube, tekton: TektonAdapter,
                                                sleeps: list[float]) -> None:
    kube.inject(429, method="POST", plural="pipelineruns", retry_after=3600)
    tekton.submit(tekton_workflow())
    assert sleeps == [RetryPolicy().max_seconds]


def test_too_many_requests_gives_up_after_the_bounded_attempts(
        kube: FakeKube, argo: ArgoAdapter, sleeps: list[float]) -> None:
    kube.inject(429, method="POST", plural="workflows", times=100, retry_after=2)
    with pytest.raises(RetryableError, match=r"Workflow of workflow 'etl'.*429"):
        argo.submit(argo_workflow())
    attempts = RetryPolicy().attempts
    assert posts(kube, "workflows") == attempts
    assert sleeps == [2.0] * (attempts - 1)


def test_server_errors_on_reads_back_off_and_recover(kube: FakeKube, argo: ArgoAdapter,
                                                     sleeps: list[float]) -> None:
    name = argo.submit(argo_workflow())
    kube.update("workflows", ARGO_NS, name, set_status("Running"))
    kube.inject(503, method="GET", plural="workflows", times=2)
    assert argo.status(name).state is RunState.RUNNING
    assert sleeps == [0.5, 1.0]  # exponential


def test_server_errors_that_persist_are_retryable_naming_the_workflow(
        kube: FakeKube, tekton: TektonAdapter, sleeps: list[float]) -> None:
    name = tekton.submit(tekton_workflow())
    kube.inject(500, method="GET", plural="taskruns", times=100)
    with pytest.raises(RetryableError, match=rf"TaskRuns of PipelineRun '{name}'.*500"):
        tekton.status(name)
    assert sleeps == [0.5, 1.0, 2.0]


def test_a_server_error_on_create_is_not_sent_again(kube: FakeKube, argo: ArgoAdapter,
                                                    sleeps: list[float]) -> None:
    """A 5xx on create may come after the object was made: sending it again could make a
    second run. The error is retryable for the caller, whose idempotency key finds the
    run on the next try."""
    kube.inject(504, method="POST", plural="workflows")
    with pytest.raises(RetryableError, match=r"Workflow of workflow 'etl'.*504"):
        argo.submit(argo_workflow(), idempotency_key="k1")
    assert (posts(kube, "workflows"), sleeps) == (1, [])
    name = argo.submit(argo_workflow(), idempotency_key="k1")
    assert kube.names("workflows", ARGO_NS) == [name]


def test_cancel_is_sent_again_after_a_server_error(kube: FakeKube, tekton: TektonAdapter,
                                                   sleeps: list[float]) -> None:
    name = tekton.submit(tekton_workflow())
    kube.update("pipelineruns", TEKTON_NS, name, set_run("Unknown", "Running"))
    kube.inject(503, method="PATCH", plural="pipelineruns")
    tekton.cancel(name)
    assert kube.get("pipelineruns", TEKTON_NS, name)["spec"]["status"] == "Cancelled"
    assert sleeps == [0.5]


# --------------------------------------------------------------------------- argo watch


def _in_background(kube: FakeKube, watchers: int, action: Any) -> threading.Thread:
    """Run ``action`` once ``watchers`` watches are open (a barrier on the server)."""
    def run() -> None:
        assert kube.wait_for_watchers(watchers, timeout=20)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_argo_watch_lists_again_after_410_and_resumes(kube: FakeKube, argo: ArgoAdapter,
                                                      sleeps: list[float]) -> None:
    """While the watch is open the run changes and etcd compacts past it: the server ends
    the watch with ERROR 410. The change can only be learnt by listing again."""
    name = argo.submit(argo_workflow())
    seen = argo.watch(name, timeout=30)
    assert next(seen).state is RunState.PENDING

    def change_then_compact() -> None:
        with kube.cond:
            kube.update("workflows", ARGO_NS, name, set_status("Running"))
            kube.expire_watches()

    thread = _in_background(kube, 1, change_then_compact)
    assert next(seen).state is RunState.RUNNING
    thread.join()
    assert kube.wait_for(lambda: ("workflows", "expired") in kube.watch_log)
    reads = [r for r in kube.requests_of("GET") if r.path.endswith(f"/workflows/{name}")]
    assert len(reads) == 2  # the first read, and the list after 410
    kube.update("workflows", ARGO_NS, name, set_status("Succeeded"))
    assert next(seen).state is RunState.SUCCEEDED
    resumed = watches(kube, "workflows")[-1]
    assert int(resumed["resourceVersion"]) >= kube.horizon  # from the listed version
    assert sleeps == []


def test_argo_watch_from_a_compacted_version(kube: FakeKube, argo: ArgoAdapter) -> None:
    """The version read first is already too old when the watch starts."""
    name = argo.submit(argo_workflow())
    seen = argo.watch(name, timeout=30)
    assert next(seen).state is RunState.PENDING
    with kube.cond:
        kube.update("workflows", ARGO_NS, name, set_status("Succeeded"))
        kube.expire_watches()
    assert next(seen).state is RunState.SUCCEEDED
    with pytest.raises(StopIteration):
        next(seen)
    assert kube.wait_for(lambda: len(kube.watch_log) == 1)
    assert kube.watch_log == [("workflows", "expired")]
    assert len(watches(kube, "workflows")) == 1  # the run ended: not watched again


def test_argo_watch_reconnects_after_server_errors(kube: FakeKube, argo: ArgoAdapter,
                                                   sleeps: list[float]) -> None:
    name = argo.submit(argo_workflow())
    kube.inject(503, method="GET", plural="workflows", watch=True)
    kube.inject(500, method="GET", plural="workflows", watch=True, as_event=True)
    seen = argo.watch(name, timeout=30)
    assert next(seen).state is RunState.PENDING
    kube.update("workflows", ARGO_NS, name, set_status("Succeeded"))
    assert next(seen).state is RunState.SUCCEEDED
    assert len(watches(kube, "workflows")) == 3
    assert sleeps == [0.5, 1.0]


def test_argo_watch_refused_fails_naming_the_workflow(kube: FakeKube, argo: ArgoAdapter,
                                                      sleeps: list[float]) -> None:
    name = argo.submit(argo_workflow())
    kube.inject(403, method="GET", plural="workflows", watch=True)
    seen = argo.watch(name, timeout=30)
    next(seen)
    with pytest.raises(UserError, match=rf"watching workflow '{name}'.*403"):
        next(seen)
    assert sleeps == []


def test_argo_watch_gives_up_when_410_repeats(kube: FakeKube, argo: ArgoAdapter) -> None:
    name = argo.submit(argo_workflow())
    kube.inject(410, method="GET", plural="workflows", watch=True, as_event=True, times=100)
    seen = argo.watch(name, timeout=30)
    next(seen)
    with pytest.raises(RetryableError, match=rf"workflow '{name}'.*410 Gone 4 times"):
        next(seen)
    assert len(watches(kube, "workflows")) == RetryPolicy().attempts


# --------------------------------------------------------------------------- tekton watch


def test_tekton_watch_lists_again_after_410_on_both_streams(
        kube: FakeKube, tekton: TektonAdapter, sleeps: list[float]) -> None:
    """Both watches (run, TaskRuns) are ended by ERROR 410 after changes they did not
    stream: each lists again, and the TaskRun's change and the run's are reported."""
    name = tekton.submit(tekton_workflow())
    seen = tekton.watch(name, timeout=30)
    assert next(seen).state is RunState.PENDING

    def change_then_compact() -> None:
        with kube.cond:
            kube.put("taskruns", TEKTON_NS, task_run(name, "extract", reason="Running"))
            kube.update("pipelineruns", TEKTON_NS, name, set_run(
                "Unknown", "Running", children=[child(name, "extract")]))
            kube.expire_watches()

    thread = _in_background(kube, 2, change_then_compact)
    status = next(seen)
    while by_step(status.steps, "extract").state is not StepState.RUNNING \
            or status.state is not RunState.RUNNING:
        status = next(seen)
    thread.join()
    assert kube.wait_for(lambda: sorted(p for p, how in kube.watch_log if how == "expired")
                         == ["pipelineruns", "taskruns"])
    assert kube.wait_for_watchers(2)  # both resumed
    kube.update("taskruns", TEKTON_NS, f"{name}-extract", lambda o: o["status"].update(
        conditions=[condition("True", "Succeeded")]))
    kube.update("pipelineruns", TEKTON_NS, name, set_run(
        "True", "Succeeded", children=[child(name, "extract")]))
    status = next(seen)
    while not status.state.terminal:
        status = next(seen)
    assert status.state is RunState.SUCCEEDED
    assert by_step(status.steps, "extract").state is StepState.SUCCEEDED
    assert sleeps == []


def test_tekton_watch_of_a_run_deleted_while_its_history_was_compacted(
        kube: FakeKube, tekton: TektonAdapter) -> None:
    name = tekton.submit(tekton_workflow())
    seen = tekton.watch(name, timeout=30)
    next(seen)

    def delete_then_compact() -> None:
        with kube.cond:
            kube.delete("pipelineruns", TEKTON_NS, name)
            kube.expire_watches()

    thread = _in_background(kube, 2, delete_then_compact)
    with pytest.raises(NotFoundError, match=f"{name}.*deleted"):
        next(seen)
    thread.join()


def test_tekton_watch_reconnects_after_too_many_requests(
        kube: FakeKube, tekton: TektonAdapter, sleeps: list[float]) -> None:
    name = tekton.submit(tekton_workflow())
    kube.inject(429, method="GET", plural="taskruns", watch=True, retry_after=3)
    seen = tekton.watch(name, timeout=30)
    next(seen)

    def finish_once_reconnected() -> None:
        assert kube.wait_for(lambda: len(watches(kube, "taskruns")) == 2
                             and kube.watchers == 2)
        kube.update("pipelineruns", TEKTON_NS, name, set_run("True", "Succeeded"))

    thread = threading.Thread(target=finish_once_reconnected, daemon=True)
    thread.start()
    assert next(seen).state is RunState.SUCCEEDED
    thread.join()
    assert sleeps == [3.0]


def test_tekton_watch_refused_fails_naming_the_run(kube: FakeKube, tekton: TektonAdapter,
                                                   sleeps: list[float]) -> None:
    name = tekton.submit(tekton_workflow())
    kube.inject(403, method="GET", plural="taskruns", watch=True)
    seen = tekton.watch(name, timeout=30)
    next(seen)
    with pytest.raises(UserError, match=rf"TaskRuns of PipelineRun '{name}'.*403"):
        next(seen)
    assert sleeps == []
