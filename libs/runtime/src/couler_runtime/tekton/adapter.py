"""Run Couler workflows on Tekton Pipelines through the Kubernetes API.

:class:`TektonAdapter` compiles the IR with :func:`couler.compilers.tekton.compile_workflow`
(a ``Pipeline`` and a ``PipelineRun`` that references it, ``tekton.dev/v1``), creates
the secrets, creates the Pipeline (or reuses it when unchanged, replaces it when the
workflow changed) and the PipelineRun, and reports runs in the engine-neutral vocabulary
of :mod:`couler.engines.base`.

State mapping (the ``Succeeded`` condition -> Couler state):

===================================  =====================================================
Tekton                               Couler
===================================  =====================================================
run: no condition                    ``RunState.PENDING``
run Unknown, PipelineRunPending      ``RunState.PENDING``
run Unknown, other reasons           ``RunState.RUNNING`` (Started, Running, and a
                                     cancelled run still running its finally tasks)
run True (Succeeded, Completed)      ``RunState.SUCCEEDED``
run False, Cancelled (or the         ``RunState.CANCELLED``
deprecated PipelineRunCancelled,
CancelledRunFinally,
StoppedRunFinally)
run False, other reasons             ``RunState.FAILED`` (Failed, PipelineRunTimeout,
                                     CouldntGetPipeline, ...)
TaskRun: none yet / no condition,    ``StepState.PENDING``
Unknown Pending / Started
TaskRun Unknown Running              ``StepState.RUNNING``
TaskRun Unknown ToBeRetried          ``StepState.RETRYING``
TaskRun True                         ``StepState.SUCCEEDED``
TaskRun False TaskRunCancelled       ``StepState.CANCELLED`` (also any failed TaskRun of a
                                     cancelled run)
TaskRun False, other reasons         ``StepState.FAILED`` (Failed, TaskRunTimeout, ...)
``status.skippedTasks`` entry        ``StepState.SKIPPED`` (message: Tekton's reason)
===================================  =====================================================

Which objects are steps: every entry of the run's ``status.childReferences`` of kind
``TaskRun`` (plus TaskRuns carrying the run's ``tekton.dev/pipelineRun`` label that the
run's status does not list yet) and every ``status.skippedTasks`` entry. The step name is
the pipeline task name, which the compiler sets to the IR step name (``GROUP-STEP`` for
the steps of a flattened inline sub-workflow). A task with several
TaskRuns (a ``matrix``, the compiler's map) reports one step per TaskRun, keyed by the
combination index: Tekton names them ``{run}-{task}-{index}``, and when the name was
shortened the position in ``childReferences`` (creation order) is used. The compiler
unrolls a loop into tasks ``STEP``, ``STEP-iter2``, ... ``STEP-iterN``; they are
reported as step ``STEP`` with keys ``"0"`` ... ``"N-1"`` (the local engine's iteration
numbers); a bounded map's batches ``STEP``, ``STEP-batch2``, ... are step ``STEP``, keyed
by the item's position in the whole map; a memory-escalating step's attempt tasks
``STEP``, ``STEP-mem2``, ... are step ``STEP``, reported by the latest one started (its
``couler-attempts`` counts the attempts of all). Attempts are ``len(status.retriesStatus)`` plus
the current one once it started; outputs are the TaskRun's ``status.results`` (array and
object results as JSON text); the exit code is the ``main`` step's ``terminated.exitCode``.

The compiler's own results decide over the TaskRun's condition where present: the
step-status rewrite's ``couler-status`` (a TaskRun that succeeded with ``Failed`` is a
failed step, ``Skipped`` / ``Omitted`` a skipped one: the step's script exits with
``onError: continue``), the retry wrapper's ``couler-attempts`` and ``couler-failure``
(attempts and failure class), the cache's ``couler-cached`` (``true``: the step is
``CACHED``). They are not reported as outputs, and the run-status task
``couler-run-status`` is not a step.

Logs (:meth:`TektonAdapter.logs`) are read from the TaskRun's pod (``status.podName``,
the latest attempt), container ``step-main`` (the container Tekton names
``step-<step name>`` for the compiler's single step ``main``; taken from
``status.steps[].container`` when reported).

Utilization (:meth:`TektonAdapter.utilization`): for each running step, its main
container's usage from the metrics API (``metrics.k8s.io/v1beta1`` PodMetrics of the
TaskRun's pod), polled by the caller while the run goes on; none where the cluster has no
metrics API or the token may not read it (logged once; :class:`couler_runtime.kube.PodMetrics`).

Every Kubernetes error is translated once, at this boundary, into :mod:`couler.errors`
exactly as in :mod:`couler_runtime.argo.adapter`: 404 -> ``NotFoundError``, 409 ->
``ConflictError``, other 4xx -> ``UserError``, 5xx and connection failures ->
``RetryableError``, after the same bounded sending-again of transient refusals (429, 5xx on
all but creates, a name-generation 409). Each of the two watches opens its stream again
after 429/5xx and, after 410 Gone, lists its objects again and resumes from the listed
version.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from kubernetes import client as k8s_client

from couler import ir
from couler.api.handles import SecretMaterial
from couler.compilers.tekton import (
    ATTEMPTS_RESULT,
    BRANCH_RESULT,
    CACHED_RESULT,
    FAILURE_RESULT,
    RUN_STATUS_TASK,
    STATUS_RESULT,
    compile_workflow,
)
from couler.engines.base import (
    EngineAdapter,
    RunState,
    RunStatus,
    SamplingAdapter,
    StepSample,
    StepState,
    StepStatus,
)
from couler.errors import (
    CoulerError,
    NotFoundError,
    OperationTimeoutError,
    RetryableError,
    UserError,
)
from couler_runtime.argo.adapter import (
    k8s_watch,
)
from couler_runtime.kube import (
    CONNECTION_ERRORS,
    DEFAULT_RETRY,
    PodMetrics,
    Retrying,
    RetryPolicy,
    api_client_for,
    as_mapping,
    items_of,
    label_value,
    parse_time,
    raise_api_error,
    retry_delay,
    watch_gone,
)

__all__ = [
    "GROUP",
    "IDEMPOTENCY_KEY",
    "PIPELINE_RUN_LABEL",
    "VERSION",
    "TektonAdapter",
    "run_status",
]

GROUP = "tekton.dev"
VERSION = "v1"
IDEMPOTENCY_KEY = "couler.io/idempotency-key"
DIGEST_ANNOTATION = "couler.io/pipeline-sha256"  # of the compiled Pipeline, on the Pipeline
PIPELINE_RUN_LABEL = "tekton.dev/pipelineRun"  # set by Tekton on every TaskRun of a run
PIPELINE_TASK_LABEL = "tekton.dev/pipelineTask"
MAIN_STEP = "main"  # the one step of every task the compiler emits
WATCH_RECONNECT_SECONDS = 30  # also bounds how long a watcher thread outlives its watch

_ITER = re.compile(r"^(?P<step>.+)-iter(?P<n>[0-9]+)$")
_BATCH = re.compile(r"^(?P<step>.+)-batch(?P<n>[0-9]+)$")
_RUNG = re.compile(r"^(?P<step>.+)-mem(?P<n>[0-9]+)$")
_INTERNAL_RESULTS = frozenset({STATUS_RESULT, BRANCH_RESULT, ATTEMPTS_RESULT, FAILURE_RESULT,
                               CACHED_RESULT})
_RECORDED = {"Succeeded": (StepState.SUCCEEDED, ""), "Failed": (StepState.FAILED, ""),
             "Skipped": (StepState.SKIPPED, "skipped: its when is false"),
             "Omitted": (StepState.SKIPPED, "not run: its dependencies did not hold")}
_CANCELLED_RUN = {"Cancelled", "PipelineRunCancelled", "CancelledRunFinally",
                  "StoppedRunFinally"}
_CANCELLED_TASK = {"TaskRunCancelled", "Cancelled"}


class TektonAdapter:
    """Submits, observes and cancels Tekton PipelineRuns in one namespace.

    Args:
        namespace: Where pipelines, runs, their secrets and pods live.
        api_client: A ready ``kubernetes.client.ApiClient``; wins over everything else.
        configuration: A ``kubernetes.client.Configuration`` to build the client from.
        host: API server URL, with ``token`` (a bearer token) and ``verify_ssl``/
            ``ca_cert``; used when no client or configuration is given.
        config_file, context: Kube config lookup when none of the above is given (then
            the in-cluster configuration).
        retry: When a request is sent again (:class:`couler_runtime.kube.RetryPolicy`).
    """

    def __init__(self, namespace: str = "default", *, api_client: object = None,
                 configuration: object = None, host: str | None = None,
                 token: str | None = None, verify_ssl: bool = True,
                 ca_cert: str | None = None, config_file: str | None = None,
                 context: str | None = None, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.namespace = namespace
        api = api_client_for(api_client, configuration, host=host, token=token,
                             verify_ssl=verify_ssl, ca_cert=ca_cert, config_file=config_file,
                             context=context)
        self._api: Any = api
        self._retry = retry
        self._custom: Any = Retrying(k8s_client.CustomObjectsApi(api), retry)
        self._core: Any = Retrying(k8s_client.CoreV1Api(api), retry)
        self._batch: Any = Retrying(k8s_client.BatchV1Api(api), retry)
        self._metrics = PodMetrics(self._custom, namespace)

    def __repr__(self) -> str:
        return f"TektonAdapter(namespace={self.namespace!r})"

    # ------------------------------------------------------------------ submit

    def submit(self, wf: ir.Workflow, secrets: Sequence[SecretMaterial] = (), *,
               idempotency_key: str | None = None) -> str:
        """Compile ``wf``, create its secrets, its Pipeline and a PipelineRun; return the run.

        The Pipeline is named after the workflow and shared by its runs: an identical
        one is reused, a different one (the workflow changed) is replaced; runs already
        started keep the definition Tekton copied into their status. "Identical" compares
        the ``couler.io/pipeline-sha256`` annotation (a digest of the compiled Pipeline),
        since the API server stores the object with defaults filled in.

        With ``idempotency_key``, the PipelineRun carries it as the
        ``couler.io/idempotency-key`` label (hashed when it is not a valid label value)
        and annotation (verbatim); a submit whose key matches an existing run returns
        that run's name and creates nothing, secrets and Pipeline included.

        A scheduled workflow's ConfigMap and CronJob, and a triggered one's TriggerBinding,
        TriggerTemplate and EventListener, are created too (an existing object of the same
        name is replaced); a scheduled workflow gets no PipelineRun now -- its CronJob creates
        them -- and the CronJob's name is returned (as the Argo adapter returns a
        CronWorkflow's).

        Secrets are created in this adapter's namespace; an existing secret of the same
        name is replaced. Their values go to the Secret objects only.

        Raises:
            ValidationError, UnsupportedFeatureError: the workflow cannot be compiled.
            UserError: the namespace of the workflow (``tenant``) is not this adapter's,
                or the API server rejected a request; ConflictError on a name clash.
            RetryableError: server-side or connection trouble.
        """
        pipeline, run, *extra = compile_workflow(wf)
        for doc in (pipeline, run, *extra):
            ns = doc.setdefault("metadata", {}).get("namespace", self.namespace)
            if ns != self.namespace:
                raise UserError(f"workflow {wf.name!r}: its namespace {ns!r} is not the "
                                f"adapter's namespace {self.namespace!r}")
        run_meta: dict[str, Any] = run["metadata"]
        if idempotency_key is not None:
            label = label_value(idempotency_key)
            run_meta.setdefault("labels", {})[IDEMPOTENCY_KEY] = label
            run_meta.setdefault("annotations", {})[IDEMPOTENCY_KEY] = idempotency_key
            with self._boundary(f"looking up the PipelineRun of workflow {wf.name!r} by "
                                "idempotency key"):
                found = self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "pipelineruns",
                    label_selector=f"{IDEMPOTENCY_KEY}={label}")
            for item in items_of(found):
                meta = item.get("metadata") or {}
                if (meta.get("annotations") or {}).get(IDEMPOTENCY_KEY) == idempotency_key:
                    return str(meta["name"])
        for secret in secrets:
            if secret.should_create:
                self._put_secret(secret, wf.name)
        self._put_pipeline(pipeline, wf.name)
        for doc in extra:
            self._put_object(doc, wf.name)
        if wf.schedule is not None:  # the CronJob creates the runs
            return str(next(d for d in extra if d["kind"] == "CronJob")["metadata"]["name"])
        with self._boundary(f"creating the PipelineRun of workflow {wf.name!r}"):
            created = self._custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "pipelineruns", run)
        return str(as_mapping(created)["metadata"]["name"])

    def _put_pipeline(self, pipeline: dict[str, Any], workflow: str) -> None:
        name = pipeline["metadata"]["name"]
        # The API server adds defaults to what it stores, so "unchanged" is judged by a
        # digest of what was sent.
        digest = hashlib.sha256(json.dumps(pipeline, sort_keys=True).encode()).hexdigest()
        pipeline["metadata"].setdefault("annotations", {})[DIGEST_ANNOTATION] = digest
        what = f"Pipeline {name!r} of workflow {workflow!r}"
        try:
            self._custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "pipelines", pipeline)
            return
        except k8s_client.ApiException as e:
            if e.status != 409:
                raise_api_error(e, f"creating {what}", namespace=self.namespace)
        except CONNECTION_ERRORS as e:
            raise_api_error(e, f"creating {what}")
        with self._boundary(f"reading {what}"):
            existing = as_mapping(self._custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "pipelines", name))
        meta = existing.get("metadata") or {}
        if (meta.get("annotations") or {}).get(DIGEST_ANNOTATION) == \
                pipeline["metadata"]["annotations"][DIGEST_ANNOTATION]:
            return
        body = {**pipeline, "metadata": {**pipeline["metadata"],
                                         "resourceVersion": meta.get("resourceVersion")}}
        with self._boundary(f"replacing {what}"):
            self._custom.replace_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "pipelines", name, body)

    def _put_object(self, doc: dict[str, Any], workflow: str) -> None:
        """Create a schedule's or trigger's object (ConfigMap, CronJob, Tekton Triggers
        objects), replacing one of the same name."""
        kind, name, ns = doc["kind"], doc["metadata"]["name"], self.namespace
        api: tuple[Callable[[], Any], Callable[[], Any], Callable[[Any], Any]]
        if kind == "ConfigMap":
            api = (lambda: self._core.create_namespaced_config_map(ns, doc),
                   lambda: self._core.read_namespaced_config_map(name, ns),
                   lambda b: self._core.replace_namespaced_config_map(name, ns, b))
        elif kind == "CronJob":
            api = (lambda: self._batch.create_namespaced_cron_job(ns, doc),
                   lambda: self._batch.read_namespaced_cron_job(name, ns),
                   lambda b: self._batch.replace_namespaced_cron_job(name, ns, b))
        else:
            group, version = doc["apiVersion"].split("/")
            plural = kind.lower() + "s"
            api = (lambda: self._custom.create_namespaced_custom_object(
                       group, version, ns, plural, doc),
                   lambda: self._custom.get_namespaced_custom_object(
                       group, version, ns, plural, name),
                   lambda b: self._custom.replace_namespaced_custom_object(
                       group, version, ns, plural, name, b))
        create, read, replace = api
        what = f"{kind} {name!r} of workflow {workflow!r}"
        try:
            create()
            return
        except k8s_client.ApiException as e:
            if e.status != 409:
                raise_api_error(e, f"creating {what}", namespace=ns)
        except CONNECTION_ERRORS as e:
            raise_api_error(e, f"creating {what}")
        with self._boundary(f"reading {what}"):
            existing = read()
        meta = existing.get("metadata") or {} if isinstance(existing, Mapping) else {
            "resourceVersion": existing.metadata.resource_version}
        body = {**doc, "metadata": {**doc["metadata"],
                                    "resourceVersion": meta.get("resourceVersion")}}
        with self._boundary(f"replacing {what}"):
            replace(body)

    def _put_secret(self, secret: SecretMaterial, workflow: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret.name, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/managed-by": "couler"}},
            "type": "Opaque",
            "stringData": secret.reveal(),
        }
        what = f"creating secret {secret.name!r} of workflow {workflow!r}"
        try:
            self._core.create_namespaced_secret(self.namespace, body)
            return
        except k8s_client.ApiException as e:
            if e.status != 409:
                raise_api_error(e, what, echo=False)
        except CONNECTION_ERRORS as e:
            raise_api_error(e, what)
        with self._boundary(f"replacing secret {secret.name!r} of workflow {workflow!r}",
                            echo=False):
            self._core.replace_namespaced_secret(secret.name, self.namespace, body)

    # ------------------------------------------------------------------ observe

    def get(self, name: str) -> dict[str, Any]:
        """The PipelineRun object ``name`` as plain data."""
        with self._boundary(f"reading PipelineRun {name!r}"):
            obj = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "pipelineruns", name)
        return as_mapping(obj)

    def task_runs(self, name: str) -> list[dict[str, Any]]:
        """The TaskRuns of the PipelineRun ``name`` (by Tekton's ``tekton.dev/pipelineRun``)."""
        return items_of(self._list_task_runs(name))

    def _list_task_runs(self, name: str) -> Any:
        with self._boundary(f"listing the TaskRuns of PipelineRun {name!r}"):
            return self._custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "taskruns",
                label_selector=f"{PIPELINE_RUN_LABEL}={name}")

    def status(self, name: str) -> RunStatus:
        """The state of the run ``name`` and of its steps (see the module's mapping)."""
        return run_status(self.get(name), self.task_runs(name))

    def watch(self, name: str, timeout: float | None = None) -> Iterator[RunStatus]:
        """Yield the run's status now and on every change, until it is terminal.

        A task's progress shows on its TaskRun, not on the PipelineRun (whose status
        only lists children), so two Kubernetes watches run at once, each in a thread:
        ``pipelineruns`` with the field selector ``metadata.name=NAME`` and ``taskruns``
        with the label selector ``tekton.dev/pipelineRun=NAME``, each resuming from the
        last seen ``resourceVersion`` when the server closes its stream.

        Raises:
            OperationTimeoutError: ``timeout`` seconds passed before the run ended.
            NotFoundError: the run does not exist or was deleted.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        run = self.get(name)
        listed = as_mapping(self._list_task_runs(name))
        children = {str(tr["metadata"]["name"]): tr for tr in items_of(listed)}
        last = run_status(run, children.values())
        yield last
        if last.state.terminal:
            return
        events: queue.Queue[tuple[str, str, dict[str, Any], CoulerError | None]] = \
            queue.Queue()
        stop = threading.Event()
        follows = [
            ("pipelineruns", {"field_selector": f"metadata.name={name}"},
             (run.get("metadata") or {}).get("resourceVersion")),
            ("taskruns", {"label_selector": f"{PIPELINE_RUN_LABEL}={name}"},
             (listed.get("metadata") or {}).get("resourceVersion")),
        ]
        for plural, selector, version in follows:
            threading.Thread(target=self._follow, name=f"couler-tekton-watch-{plural}",
                             args=(plural, selector, version),
                             kwargs={"deadline": deadline, "events": events, "stop": stop,
                                     "run": name},
                             daemon=True).start()

        def timed_out() -> OperationTimeoutError:
            return OperationTimeoutError(f"PipelineRun {name!r}: not finished after "
                                         f"{timeout} s (last state {last.state.value})")

        try:
            while True:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise timed_out()
                try:
                    plural, etype, item, error = events.get(timeout=wait)
                except queue.Empty:
                    raise timed_out() from None
                if error is not None:
                    raise error
                item_name = str((item.get("metadata") or {}).get("name", ""))
                deleted = NotFoundError(f"PipelineRun {name!r} was deleted in namespace "
                                        f"{self.namespace!r} while being watched")
                if etype == "LISTED":  # listed again after 410 Gone: the state as it is now
                    listed_now = {str((i.get("metadata") or {}).get("name", "")): i
                                  for i in item.get("items") or ()}
                    if plural == "taskruns":
                        children = listed_now
                    elif name in listed_now:
                        run = listed_now[name]
                    else:
                        raise deleted
                elif plural == "pipelineruns":
                    if item_name != name:
                        continue
                    if etype == "DELETED":
                        raise deleted
                    run = item
                elif etype == "DELETED":
                    children.pop(item_name, None)
                else:
                    children[item_name] = item
                current = run_status(run, children.values())
                if current.state.terminal:
                    # The two streams are not ordered with each other: read the TaskRuns
                    # once more so the last status has every task's final state.
                    children = {str(tr["metadata"]["name"]): tr for tr in self.task_runs(name)}
                    current = run_status(run, children.values())
                if current != last:
                    last = current
                    yield current
                if current.state.terminal:
                    return
        finally:
            stop.set()

    def _follow(self, plural: str, selector: Mapping[str, str], version: str | None, *,
                deadline: float | None, events: queue.Queue[Any],
                stop: threading.Event, run: str = "") -> None:
        """Feed ``events`` with the watch events of ``plural`` until ``stop`` is set.

        The stream is opened again when the server ends it; after 410 Gone (the version is
        too old: as an answer or a watch ``ERROR`` event) ``plural`` is listed again --
        put as one ``LISTED`` event, ``{"items": [...]}`` -- and followed from the listed
        version; after 429, 5xx or connection trouble it is opened again after a back-off.
        ``RetryPolicy.attempts`` failures in a row (no event in between) end the watch with
        the error, put for the consumer."""
        what = "run" if plural == "pipelineruns" else "TaskRuns"
        action = f"watching the {what} of PipelineRun {run!r} in namespace {self.namespace!r}"
        failures = 0
        while not stop.is_set():
            kwargs: dict[str, Any] = dict(selector)
            seconds = float(WATCH_RECONNECT_SECONDS)
            if deadline is not None:
                seconds = min(seconds, deadline - time.monotonic())
                if seconds <= 0:
                    return  # the consumer raises the timeout
            kwargs["timeout_seconds"] = max(1, int(seconds + 0.999))
            kwargs["_request_timeout"] = seconds + 5
            if version:
                kwargs["resource_version"] = version
            w = k8s_watch.Watch()
            failure: Exception | None = None
            try:
                stream = w.stream(self._custom.list_namespaced_custom_object, GROUP, VERSION,
                                  self.namespace, plural, **kwargs)
                try:
                    for event in stream:
                        if stop.is_set():
                            return
                        failures = 0
                        etype = str(event.get("type"))
                        item = as_mapping(event.get("object"))
                        version = (item.get("metadata") or {}).get("resourceVersion", version)
                        events.put((plural, etype, item, None))
                finally:
                    w.stop()
                    stream.close()
            except CoulerError as e:
                events.put((plural, "", {}, e))
                return
            except (k8s_client.ApiException, *CONNECTION_ERRORS) as e:
                failure = e
            except Exception as e:  # the consumer waits on the queue: never die silently
                events.put((plural, "", {}, RetryableError(f"{action}: {type(e).__name__}: {e}")))
                return
            if failure is None or stop.is_set():
                continue
            failures += 1
            try:
                if watch_gone(failure):
                    if failures >= self._retry.attempts:
                        raise RetryableError(f"{action}: the Kubernetes API answered 410 Gone "
                                             f"{failures} times in a row") from failure
                    listed = as_mapping(self._custom.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, plural, **selector))
                    version = (listed.get("metadata") or {}).get("resourceVersion")
                    events.put((plural, "LISTED", {"items": items_of(listed)}, None))
                    continue
                delay = retry_delay(failure, failures, self._retry)
                if delay is None:
                    raise_api_error(failure, action, namespace=self.namespace)
            except CoulerError as err:
                events.put((plural, "", {}, err))
                return
            except (k8s_client.ApiException, *CONNECTION_ERRORS) as e:
                try:
                    raise_api_error(e, action, namespace=self.namespace)
                except CoulerError as err:
                    events.put((plural, "", {}, err))
                return
            if deadline is not None:
                delay = min(delay, max(deadline - time.monotonic(), 0.0))
            self._retry.sleep(delay)

    def logs(self, name: str, step: str, key: str = "") -> str:
        """The ``step-main`` container log of step ``step`` (map item / iteration ``key``).

        Raises:
            NotFoundError: no such step in the run, or it has no pod (skipped, or not
                started yet).
        """
        run = self.get(name)
        found = _find_step(run, self.task_runs(name), step, key)
        label = step + (f"[{key}]" if key else "")
        if found is None:
            raise NotFoundError(f"PipelineRun {name!r}: no step {label!r} in the run")
        task_run, skipped = found
        pod = str(((task_run or {}).get("status") or {}).get("podName") or "")
        if skipped or not pod:
            why = "it was skipped" if skipped else "its TaskRun has no pod yet"
            raise NotFoundError(f"PipelineRun {name!r}: step {label!r} has no pod ({why})")
        container = _main_container(task_run or {})
        with self._boundary(f"reading the log of step {label!r} (pod {pod!r}) "
                            f"of PipelineRun {name!r}"):
            text = self._core.read_namespaced_pod_log(pod, self.namespace, container=container)
        return str(text)

    def utilization(self, name: str) -> list[StepSample]:
        """What the running steps of PipelineRun ``name`` use now (see the module
        docstring); empty when the cluster exposes no pod metrics."""
        if not self._metrics.available:
            return []
        run = self.get(name)
        cancelled = _run_state(run) is RunState.CANCELLED
        samples = []
        for step, key, task_run, skip in _children(run, self.task_runs(name)):
            if task_run is None or skip:
                continue
            status = _step_status(step, key, task_run, skip, cancelled)
            pod = str((task_run.get("status") or {}).get("podName") or "")
            if status.state is not StepState.RUNNING or not pod:
                continue
            usage = self._metrics.usage(pod, _main_container(task_run))
            if usage is not None:
                samples.append(usage.sample(step, key, status.attempts))
        return samples

    # ------------------------------------------------------------------ control

    def cancel(self, name: str) -> None:
        """Cancel the run: merge-patch ``spec.status: Cancelled`` (as ``tkn pr cancel``).

        Tekton cancels the running TaskRuns (their pods are deleted) and runs no
        finally task; the run ends with reason ``Cancelled``, reported as
        ``RunState.CANCELLED``. A finished run is left as it is.
        """
        if run_status(self.get(name), ()).state.terminal:
            return
        with self._boundary(f"cancelling PipelineRun {name!r}"):
            self._custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "pipelineruns", name,
                {"spec": {"status": "Cancelled"}})

    # ------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _boundary(self, action: str, *, echo: bool = True) -> Iterator[None]:
        try:
            yield
        except k8s_client.ApiException as e:
            raise_api_error(e, action, echo=echo, namespace=self.namespace)
        except CONNECTION_ERRORS as e:
            raise_api_error(e, action)


# --------------------------------------------------------------------------- status mapping


def _condition(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "Succeeded":
            return dict(c)
    return None


def _run_state(run: Mapping[str, Any]) -> RunState:
    cond = _condition(run)
    if cond is None:
        return RunState.PENDING
    status, reason = cond.get("status"), str(cond.get("reason") or "")
    if status == "True":
        return RunState.SUCCEEDED
    if status == "False":
        return RunState.CANCELLED if reason in _CANCELLED_RUN else RunState.FAILED
    return RunState.PENDING if reason in ("", "PipelineRunPending", "Pending") \
        else RunState.RUNNING


def _task_state(task_run: Mapping[str, Any] | None, run_cancelled: bool) -> StepState:
    cond = _condition(task_run or {})
    if cond is None:
        return StepState.PENDING
    status, reason = cond.get("status"), str(cond.get("reason") or "")
    if status == "True":
        return StepState.SUCCEEDED
    if status == "False":
        return StepState.CANCELLED if reason in _CANCELLED_TASK or run_cancelled \
            else StepState.FAILED
    if reason == "ToBeRetried":
        return StepState.RETRYING
    return StepState.PENDING if reason in ("", "Pending", "Started") else StepState.RUNNING


def _batch_offsets(run: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """Batch task ``S-batchK`` of a bounded map -> (``S``, items in the batches before)."""
    spec = (run.get("status") or {}).get("pipelineSpec") or {}
    sizes = {str(t.get("name")): len((t.get("matrix") or {}).get("include") or ())
             for t in spec.get("tasks") or () if isinstance(t, Mapping)}
    out: dict[str, tuple[str, int]] = {}
    for task in sizes:
        m = _BATCH.match(task)
        if m and m["step"] in sizes:
            n = int(m["n"])
            before = [m["step"], *(f"{m['step']}-batch{k}" for k in range(2, n))]
            out[task] = (m["step"], sum(sizes.get(b, 0) for b in before))
    return out


def _task_names(run: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """The run's pipeline task names and, among them, the matrixed ones."""
    status = run.get("status") or {}
    spec = status.get("pipelineSpec") or {}
    names: set[str] = set()
    matrixed: set[str] = set()
    for task in [*(spec.get("tasks") or ()), *(spec.get("finally") or ())]:
        if isinstance(task, Mapping) and task.get("name"):
            names.add(str(task["name"]))
            if task.get("matrix"):
                matrixed.add(str(task["name"]))
    for ref in status.get("childReferences") or ():
        if isinstance(ref, Mapping) and ref.get("pipelineTaskName"):
            names.add(str(ref["pipelineTaskName"]))
    for skipped in status.get("skippedTasks") or ():
        if isinstance(skipped, Mapping) and skipped.get("name"):
            names.add(str(skipped["name"]))
    return names, matrixed


def _loop_step(task: str, names: set[str]) -> tuple[str, str]:
    """Task ``S-iterK`` of an unrolled loop is step ``S`` iteration ``K-1``; ``S`` is 0."""
    m = _ITER.match(task)
    if m and m["step"] in names and int(m["n"]) >= 2:
        return m["step"], str(int(m["n"]) - 1)
    if f"{task}-iter2" in names:
        return task, "0"
    return task, ""


def _children(run: Mapping[str, Any], task_runs: Iterable[Mapping[str, Any]]
              ) -> list[tuple[str, str, dict[str, Any] | None, str]]:
    """``(step, key, TaskRun or None, skip reason)`` for every step of the run."""
    name = str((run.get("metadata") or {}).get("name", ""))
    status = run.get("status") or {}
    by_name = {str((tr.get("metadata") or {}).get("name", "")): dict(tr) for tr in task_runs}
    names, matrixed = _task_names(run)
    refs: list[tuple[str, str]] = []  # (pipeline task, TaskRun name)
    for ref in status.get("childReferences") or ():
        if isinstance(ref, Mapping) and ref.get("kind", "TaskRun") == "TaskRun":
            refs.append((str(ref.get("pipelineTaskName", "")), str(ref.get("name", ""))))
    listed = {tr for _, tr in refs}
    for tr_name, tr in by_name.items():  # created, not yet in the run's status
        task = ((tr.get("metadata") or {}).get("labels") or {}).get(PIPELINE_TASK_LABEL)
        if tr_name not in listed and task:
            refs.append((str(task), tr_name))
    per_task: dict[str, list[str]] = {}
    for task, tr_name in refs:
        if task != RUN_STATUS_TASK:  # the step-status rewrite's verdict, not a step
            per_task.setdefault(task, []).append(tr_name)
    batches = _batch_offsets(run)
    # a memory-escalating step's attempt tasks S, S-mem2, ...: the latest started is S
    latest: dict[str, tuple[int, str]] = {}
    for task in per_task:
        m = _RUNG.match(task)
        step_name, n = (m["step"], int(m["n"])) if m and m["step"] in names else (task, 1)
        if step_name not in latest or n > latest[step_name][0]:
            latest[step_name] = (n, task)
    rungs = {task: step_name for step_name, (_, task) in latest.items()}
    out: list[tuple[str, str, dict[str, Any] | None, str]] = []
    for task, tr_names in per_task.items():
        if task not in rungs:
            continue  # an earlier attempt task of a memory-escalating step
        if rungs[task] != task:
            out += [(rungs[task], "", by_name.get(tr_name), "") for tr_name in tr_names]
            continue
        step, key = _loop_step(task, names)
        step, offset = batches.get(task, (step, 0))
        for position, tr_name in enumerate(tr_names):
            item_key = key
            if len(tr_names) > 1 or task in matrixed:
                m = re.fullmatch(re.escape(f"{name}-{task}-") + r"([0-9]+)", tr_name)
                item_key = str(offset + (int(m[1]) if m else position))
            out.append((step, item_key, by_name.get(tr_name), ""))
    for skipped in status.get("skippedTasks") or ():
        if isinstance(skipped, Mapping) and skipped.get("name"):
            step, key = _loop_step(str(skipped["name"]), names)
            out.append((step, key, None, str(skipped.get("reason") or "skipped")))
    return out


def _find_step(run: Mapping[str, Any], task_runs: Iterable[Mapping[str, Any]], step: str,
               key: str) -> tuple[dict[str, Any] | None, bool] | None:
    for s, k, task_run, skip in _children(run, task_runs):
        if (s, k) == (step, key):
            return task_run, bool(skip)
    return None


def _main_step(task_run: Mapping[str, Any]) -> dict[str, Any]:
    steps = [dict(s) for s in (task_run.get("status") or {}).get("steps") or ()
             if isinstance(s, Mapping)]
    for s in steps:
        if s.get("name") == MAIN_STEP:
            return s
    return steps[-1] if steps else {}


def _main_container(task_run: Mapping[str, Any]) -> str:
    return str(_main_step(task_run).get("container") or f"step-{MAIN_STEP}")


def _result_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _step_status(step: str, key: str, task_run: Mapping[str, Any] | None, skip: str,
                 run_cancelled: bool) -> StepStatus:
    if skip:
        return StepStatus(step=step, state=StepState.SKIPPED, key=key, message=skip)
    status = (task_run or {}).get("status") or {}
    state = _task_state(task_run, run_cancelled)
    started = bool(status.get("podName") or status.get("startTime"))
    attempts = len(status.get("retriesStatus") or ()) + (1 if started else 0)
    results = {str(r["name"]): _result_text(r["value"]) for r in status.get("results") or ()
               if isinstance(r, Mapping) and "name" in r and "value" in r}
    outputs = {k: v for k, v in results.items() if k not in _INTERNAL_RESULTS}
    message = ""
    recorded = _RECORDED.get(results.get(STATUS_RESULT, ""))
    if recorded is not None and state is StepState.SUCCEEDED:
        state, message = recorded
    if results.get(CACHED_RESULT) == "true" and state is StepState.SUCCEEDED:
        state, message = StepState.CACHED, "results reused from the cache"
    if results.get(ATTEMPTS_RESULT, "").isdigit():
        attempts = int(results[ATTEMPTS_RESULT])
    failure = results.get(FAILURE_RESULT, "") if state is StepState.FAILED else ""
    exit_code: int | None = None
    terminated = _main_step(task_run or {}).get("terminated") or {}
    with contextlib.suppress(TypeError, ValueError):
        exit_code = int(terminated["exitCode"]) if "exitCode" in terminated else None
    cond = _condition(task_run or {}) or {}
    return StepStatus(step=step, state=state, key=key, attempts=attempts, exit_code=exit_code,
                      started_at=parse_time(status.get("startTime")),
                      finished_at=parse_time(status.get("completionTime")), outputs=outputs,
                      message=message or str(cond.get("message") or ""), failure=failure)


def run_status(run: Mapping[str, Any], task_runs: Iterable[Mapping[str, Any]]) -> RunStatus:
    """Map a Tekton ``PipelineRun`` and its ``TaskRun`` objects (plain data) to a RunStatus."""
    meta = run.get("metadata") or {}
    status = run.get("status") or {}
    name = str(meta.get("name", ""))
    workflow = str(((run.get("spec") or {}).get("pipelineRef") or {}).get("name") or "") \
        or str(meta.get("generateName") or "").removesuffix("-") or name
    state = _run_state(run)
    cancelled = state is RunState.CANCELLED
    steps = [_step_status(s, k, tr, skip, cancelled)
             for s, k, tr, skip in _children(run, task_runs)]
    steps.sort(key=lambda s: (s.started_at is None, s.started_at or 0.0, s.step,
                              int(s.key) if s.key.isdigit() else -1, s.key))
    cond = _condition(run) or {}
    return RunStatus(run_id=name, workflow=workflow, state=state, steps=tuple(steps),
                     started_at=parse_time(status.get("startTime")),
                     finished_at=parse_time(status.get("completionTime")),
                     message=str(cond.get("message") or ""))


def _conforms(adapter: TektonAdapter) -> EngineAdapter:
    """Never called: mypy checks here that the adapter follows the EngineAdapter protocol."""
    return adapter


def _samples(adapter: TektonAdapter) -> SamplingAdapter:
    """Never called: mypy checks here that the adapter follows SamplingAdapter."""
    return adapter
