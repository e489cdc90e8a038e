"""Run Couler workflows on Kubeflow Pipelines through the KFP API server (REST v2beta1).

:class:`KfpAdapter` compiles the IR with :func:`couler.compilers.kfp.compile_workflow` (a
``PipelineSpec``), creates a run of that spec with the kfp SDK's ``kfp.Client`` and
reports runs in the engine-neutral vocabulary of :mod:`couler.engines.base`. The SDK is
imported when an adapter is built, not with this module: kfp pins ``protobuf < 7``, so it
lives in ``.venv-kfp`` (``scripts/setup-engine-venv.sh kfp``); :func:`run_status` works
on plain data and needs no SDK.

Run ids are KFP's ``run_id``. The run's display name is the workflow name.

Idempotency: a KFP run has no labels, and nothing on the server keeps two runs from
sharing a display name, so the key goes into the run's ``description`` as
``couler.io/idempotency-key=KEY`` (a field the API server filters on with ``EQUALS``):
a submit with a key first lists the runs whose description is exactly that (in the
adapter's experiment, or namespace, or everywhere) and returns the oldest one's id
without creating anything. As with the Argo and Tekton adapters the lookup and the
creation are two requests, so two submits racing with the same key can both create; a
sequential retry cannot.

State mapping (KFP ``RuntimeState`` -> Couler state):

============================================  ==============================================
KFP                                           Couler
============================================  ==============================================
run RUNTIME_STATE_UNSPECIFIED / none,         ``RunState.PENDING``
PENDING
run RUNNING, PAUSED, CANCELING                ``RunState.RUNNING`` (CANCELING: stopping,
                                              not yet terminal)
run SUCCEEDED, SKIPPED                        ``RunState.SUCCEEDED``
run FAILED                                    ``RunState.FAILED``
run CANCELED                                  ``RunState.CANCELLED``
task PENDING / unspecified                    ``StepState.PENDING``
task RUNNING, PAUSED, CANCELING               ``StepState.RUNNING``
task SUCCEEDED                                ``StepState.SUCCEEDED``
task SKIPPED                                  ``StepState.SKIPPED`` (a false ``dsl.If``, or a
                                              task KFP did not need to run)
task FAILED                                   ``StepState.FAILED`` (``CANCELLED`` when the run
                                              was cancelled)
task CANCELED                                 ``StepState.CANCELLED``
============================================  ==============================================

Which task details are steps: KFP also reports its driver executions and the DAG
executions of ``root``, ``dsl.If``, ``dsl.ParallelFor`` and ``dsl.ExitHandler``. A task
detail is a step when its ``display_name`` names a container task of the run's pipeline
spec (a task whose component has an ``executorLabel``; the compiler names it after the IR
step). Without the spec in the answer, names ending in ``-driver`` and ``root``,
``condition-N``, ``for-loop-N``, ``exit-handler-N`` are left out. The API exposes no
ParallelFor iteration index, so when one step has several task details (map items) they
are keyed ``"0"``, ``"1"``, ... in creation order. Attempts are the number of times the
task's ``state_history`` entered RUNNING (1 once it started). Outputs are not reported:
the v2beta1 API gives only output *artifact* ids, and the parameter values live in ML
Metadata, which the API does not serve.

Logs: the KFP API serves no logs. :meth:`KfpAdapter.logs` reads the log of the task's pod
(``pod_name`` of the task detail) from the Kubernetes API with the ``kubernetes`` client
(a kfp dependency, so present in ``.venv-kfp``), container ``main`` (the Argo Workflows
executor container that runs the component), in namespace ``pod_namespace`` (KFP's
namespace: ``kubeflow`` in a single-user install, the profile namespace otherwise).
The Kubernetes credentials come from ``kube_api_client``, else the kube config / in-cluster
configuration; without access to the cluster, ``logs`` raises ``UserError``.

Watching: the KFP API has no watch, so :meth:`KfpAdapter.watch` polls ``get_run`` every
``poll_interval`` seconds.

Utilization: the KFP API reports no resource use of a task while it runs (nor after), so a
run on KFP has no utilization samples (:class:`KfpAdapter` is no
:class:`~couler.engines.base.SamplingAdapter`).

Every KFP API error is translated once, at this boundary, into :mod:`couler.errors`: 404
-> ``NotFoundError``, 409 -> ``ConflictError``, other 4xx (401/403 included) ->
``UserError``, 5xx and connection failures -> ``RetryableError``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import urllib3

from couler import ir
from couler.api.handles import SecretMaterial
from couler.compilers.kfp import compile_workflow, recurring_schedule, split_platform_spec
from couler.compilers.wire import json_size
from couler.engines.base import EngineAdapter, RunState, RunStatus, StepState, StepStatus
from couler.errors import (
    ConflictError,
    CoulerError,
    DocumentTooLargeError,
    NotFoundError,
    RetryableError,
    UserError,
)
from couler_runtime.polling import poll_status

__all__ = ["IDEMPOTENCY_PREFIX", "MAIN_CONTAINER", "KfpAdapter", "run_status"]

IDEMPOTENCY_PREFIX = "couler.io/idempotency-key="
MAIN_CONTAINER = "main"
_LOOKUP_PAGE = 100

_RUN_STATE = {
    "": RunState.PENDING,
    "RUNTIME_STATE_UNSPECIFIED": RunState.PENDING,
    "PENDING": RunState.PENDING,
    "RUNNING": RunState.RUNNING,
    "PAUSED": RunState.RUNNING,
    "CANCELING": RunState.RUNNING,
    "SUCCEEDED": RunState.SUCCEEDED,
    "SKIPPED": RunState.SUCCEEDED,
    "FAILED": RunState.FAILED,
    "CANCELED": RunState.CANCELLED,
}
_TASK_STATE = {
    "": StepState.PENDING,
    "RUNTIME_STATE_UNSPECIFIED": StepState.PENDING,
    "PENDING": StepState.PENDING,
    "RUNNING": StepState.RUNNING,
    "PAUSED": StepState.RUNNING,
    "CANCELING": StepState.RUNNING,
    "SUCCEEDED": StepState.SUCCEEDED,
    "SKIPPED": StepState.SKIPPED,
    "FAILED": StepState.FAILED,
    "CANCELED": StepState.CANCELLED,
}
_STRUCTURAL = re.compile(r"^(root|(condition|for-loop|exit-handler)-[0-9]+)$|-driver$")


def _import(module: str) -> Any:
    """Import a kfp module lazily, typed ``Any`` (kfp is not in the main environment)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(
            "running on Kubeflow Pipelines needs the kfp SDK, which is not installed in this "
            f"environment ({exc}); use .venv-kfp (create it with "
            "scripts/setup-engine-venv.sh kfp) or install requirements-kfp.txt") from exc


class KfpAdapter:
    """Submits, observes and cancels Kubeflow Pipelines runs through the KFP API server.

    Args:
        host: The KFP API endpoint (e.g. ``http://ml-pipeline-ui.kubeflow`` or a
            port-forward); ``None`` lets ``kfp.Client`` find it (in-cluster, kube config).
        client: A ready ``kfp.Client``; wins over ``host`` and the credentials.
        existing_token: A bearer token for the API server.
        namespace: The KFP user namespace (multi-user installs); runs are looked up there.
        experiment_id: The experiment runs are created in (KFP's default one when None).
        verify_ssl, ssl_ca_cert: TLS settings for the API server.
        pod_namespace: Where the run's pods live, for :meth:`logs` (``namespace`` when
            given, else ``kubeflow``).
        kube_api_client: A ``kubernetes.client.ApiClient`` for reading pod logs.
        poll_interval: Seconds between two reads in :meth:`watch`.

    Raises:
        UserError: kfp is not installed in this environment.
    """

    def __init__(self, host: str | None = None, *, client: object = None,
                 existing_token: str | None = None, namespace: str | None = None,
                 experiment_id: str | None = None, verify_ssl: bool | None = None,
                 ssl_ca_cert: str | None = None, pod_namespace: str | None = None,
                 kube_api_client: object = None, poll_interval: float = 2.0) -> None:
        kfp = _import("kfp")
        self._server_api: Any = _import("kfp_server_api")
        self.host = host
        self.namespace = namespace
        self.experiment_id = experiment_id
        self.pod_namespace = pod_namespace or namespace or "kubeflow"
        self.poll_interval = poll_interval
        self._kube_api: Any = kube_api_client
        self._errors: tuple[type[BaseException], ...] = (
            self._server_api.ApiException, urllib3.exceptions.HTTPError, OSError)
        if client is None:
            with warnings.catch_warnings():
                # "This client only works with Kubeflow Pipeline v2.0.0-beta.2 and later".
                warnings.simplefilter("ignore", FutureWarning)
                with self._boundary("connecting to the KFP API server"):
                    client = kfp.Client(host=host, existing_token=existing_token,
                                        namespace=namespace or "kubeflow",
                                        verify_ssl=verify_ssl, ssl_ca_cert=ssl_ca_cert)
        self._client: Any = client

    def __repr__(self) -> str:
        return f"KfpAdapter(host={self.host!r}, namespace={self.namespace!r})"

    # ------------------------------------------------------------------ submit

    def submit(self, wf: ir.Workflow, secrets: Sequence[SecretMaterial] = (), *,
               idempotency_key: str | None = None) -> str:
        """Compile ``wf`` and create a KFP run of its pipeline spec; return the run id.

        A workflow with a cron schedule becomes a KFP recurring run instead (see
        :func:`couler.compilers.kfp.recurring_schedule`); its id is returned.

        With ``idempotency_key``, the run's description is ``couler.io/idempotency-key=KEY``
        and a submit whose key matches an existing run returns that run's id and creates
        nothing (see the module docstring).

        Raises:
            ValidationError, UnsupportedFeatureError: the workflow cannot be compiled
                (unsupported features are named in couler.compilers.kfp.CAPABILITIES).
            UserError: secrets to create were given (this adapter creates no Kubernetes
                objects), or the API server rejected the run.
            RetryableError: server-side or connection trouble.
        """
        spec = _run_spec(compile_workflow(wf))
        to_create = [s.name for s in secrets if s.should_create]
        if to_create:
            raise UserError(f"workflow {wf.name!r}: the KFP adapter creates no secrets "
                            f"({', '.join(to_create)}); create them in the run's namespace "
                            "first (the pipeline references existing Kubernetes secrets)")
        description = ""
        schedule = recurring_schedule(wf)
        if schedule is not None:
            return self._create_recurring(wf, spec, schedule, idempotency_key)
        if idempotency_key is not None:
            description = IDEMPOTENCY_PREFIX + idempotency_key
            found = self._find_run(description, wf.name)
            if found is not None:
                return found
        api = self._server_api
        body = api.V2beta1Run(
            display_name=wf.name, description=description or None, pipeline_spec=spec,
            experiment_id=self.experiment_id,
            runtime_config=api.V2beta1RuntimeConfig(parameters={}),
            service_account=wf.service_account or None)
        try:
            with self._boundary(f"creating a run of workflow {wf.name!r}"):
                # The generated RunServiceApi of kfp.Client (``client.runs``); its
                # ``run_pipeline`` wants a package file and prints a link on stdout.
                run = self._client.runs.run_service_create_run(
                    run=body, experiment_id=self.experiment_id)
        except CoulerError as exc:
            refusal = _size_refusal(exc.__cause__)
            if refusal is None:
                raise
            raise DocumentTooLargeError(  # compact JSON: the split budget's unit
                "kfp", wf.name, json_size(spec), refusal,
                sent_bytes=len(json.dumps(spec).encode())) from exc
        return str(run.run_id)

    def _create_recurring(self, wf: ir.Workflow, spec: dict[str, Any],
                          schedule: dict[str, Any], idempotency_key: str | None) -> str:
        """A cron workflow: a KFP recurring run of the spec; return its id.

        With ``idempotency_key`` it is found again by its description, as a run is.
        """
        api = self._server_api
        description = ""
        if idempotency_key is not None:
            description = IDEMPOTENCY_PREFIX + idempotency_key
            query = json.dumps({"predicates": [
                {"operation": "EQUALS", "key": "description", "stringValue": description}]})
            with self._boundary(f"looking up the recurring run of workflow {wf.name!r} by "
                                "idempotency key"):
                page = self._client.recurring_runs.recurring_run_service_list_recurring_runs(
                    filter=query, experiment_id=self.experiment_id, namespace=self.namespace,
                    page_size=_LOOKUP_PAGE)
            for found in page.recurring_runs or ():
                if found.description == description:
                    return str(found.recurring_run_id)
        body = api.V2beta1RecurringRun(
            display_name=wf.name, description=description or None, pipeline_spec=spec,
            runtime_config=api.V2beta1RuntimeConfig(parameters={}),
            service_account=wf.service_account or None, experiment_id=self.experiment_id,
            max_concurrency=str(schedule["max_concurrency"]),
            trigger=api.V2beta1Trigger(cron_schedule=api.V2beta1CronSchedule(
                cron=schedule["cron"])),
            mode=api.RecurringRunMode.ENABLE if schedule["enabled"]
            else api.RecurringRunMode.DISABLE)
        with self._boundary(f"creating the recurring run of workflow {wf.name!r}"):
            created = self._client.recurring_runs.recurring_run_service_create_recurring_run(
                recurring_run=body)
        return str(created.recurring_run_id)

    def _find_run(self, description: str, workflow: str) -> str | None:
        query = json.dumps({"predicates": [
            {"operation": "EQUALS", "key": "description", "stringValue": description}]})
        token = ""
        matches: list[tuple[str, str]] = []
        while True:
            with self._boundary(f"looking up the run of workflow {workflow!r} by "
                                "idempotency key"):
                page = self._client.list_runs(
                    page_token=token, page_size=_LOOKUP_PAGE, sort_by="created_at",
                    experiment_id=self.experiment_id, namespace=self.namespace,
                    filter=query)
            for run in page.runs or ():
                if run.description == description:  # the filter is the server's business
                    matches.append((str(run.created_at or ""), str(run.run_id)))
            token = page.next_page_token or ""
            if not token:
                break
        return min(matches)[1] if matches else None

    # ------------------------------------------------------------------ observe

    def get(self, run_id: str) -> dict[str, Any]:
        """The run ``run_id`` as plain data (``V2beta1Run.to_dict()``)."""
        with self._boundary(f"reading run {run_id!r}"):
            run = self._client.get_run(run_id)
        data = run.to_dict() if hasattr(run, "to_dict") else run
        if not isinstance(data, Mapping):
            raise RetryableError(f"reading run {run_id!r}: the KFP API returned "
                                 f"{type(data).__name__}, not a run")
        return dict(data)

    def status(self, run_id: str) -> RunStatus:
        """The state of the run and of its steps (see the module's mapping)."""
        return run_status(self.get(run_id))

    def watch(self, run_id: str, timeout: float | None = None) -> Iterator[RunStatus]:
        """Yield the run's status now and on every change (polled), until it is terminal.

        Raises:
            OperationTimeoutError: ``timeout`` seconds passed before the run ended.
            NotFoundError: the run does not exist or was deleted.
        """
        return poll_status(self.status, run_id, interval=self.poll_interval, timeout=timeout)

    def logs(self, run_id: str, step: str, key: str = "") -> str:
        """The ``main`` container log of the pod of step ``step`` (map item ``key``).

        Raises:
            NotFoundError: no such step in the run, it has no pod (yet), or the pod is gone.
            UserError: the ``kubernetes`` client is missing or has no configuration.
        """
        label = step + (f"[{key}]" if key else "")
        found = _find_step(self.get(run_id), step, key)
        if found is None:
            raise NotFoundError(f"run {run_id!r}: no step {label!r} in the run")
        pod = str(found.get("pod_name") or "")
        if not pod:
            pod = next((str(c.get("pod_name")) for c in reversed(found.get("child_tasks") or ())
                        if isinstance(c, Mapping) and c.get("pod_name")), "")
        if not pod:
            raise NotFoundError(f"run {run_id!r}: step {label!r} has no pod "
                                f"(state {found.get('state') or 'PENDING'})")
        k8s = _import_kubernetes()
        core = k8s.client.CoreV1Api(self._kube_client(k8s))
        action = (f"reading the log of step {label!r} (pod {pod!r} in namespace "
                  f"{self.pod_namespace!r}) of run {run_id!r}")
        try:
            # Raw bytes: older clients (kfp pins kubernetes < 31) parse a log that looks
            # like JSON ("42\n" -> 42).
            response = core.read_namespaced_pod_log(pod, self.pod_namespace,
                                                    container=MAIN_CONTAINER,
                                                    _preload_content=False)
            data = response.data
        except k8s.client.ApiException as e:
            _raise(e, action, kubernetes=True)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            _raise(e, action, kubernetes=True)
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    def _kube_client(self, k8s: Any) -> Any:
        if self._kube_api is None:
            cfg = k8s.client.Configuration()
            try:
                k8s.config.load_kube_config(client_configuration=cfg)
            except (k8s.config.ConfigException, OSError, TypeError):
                try:
                    k8s.config.load_incluster_config(client_configuration=cfg)
                except k8s.config.ConfigException as e:
                    raise UserError(
                        "the KFP API serves no logs; they are read from the pods through "
                        "the Kubernetes API, and no Kubernetes configuration was found: set "
                        "KUBECONFIG, pass kube_api_client=, or run inside the cluster") from e
            self._kube_api = k8s.client.ApiClient(cfg)
        return self._kube_api

    # ------------------------------------------------------------------ control

    def cancel(self, run_id: str) -> None:
        """Terminate the run (``POST /apis/v2beta1/runs/{id}:terminate``).

        KFP stops the run's pods; the run goes CANCELING, then CANCELED, reported as
        ``RunState.RUNNING`` then ``RunState.CANCELLED``. A finished run is left as it is,
        and cancelling is idempotent: the API server refuses (400) to terminate a run that
        is not pending or running -- one already CANCELING, or one that finished between
        the read and the request -- and such a refusal is no error when the run, read
        again, is CANCELING or finished.
        """
        run = self.get(run_id)
        if run_status(run).state.terminal or _state(run.get("state")) == "CANCELING":
            return
        try:
            with self._boundary(f"terminating run {run_id!r}"):
                self._client.terminate_run(run_id)
        except UserError as exc:
            if isinstance(exc, NotFoundError):
                raise
            now = self.get(run_id)
            if run_status(now).state.terminal or _state(now.get("state")) == "CANCELING":
                return
            raise

    # ------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _boundary(self, action: str) -> Iterator[None]:
        try:
            yield
        except CoulerError:
            raise
        except self._errors as e:
            _raise(e, action)


def _import_kubernetes() -> Any:
    try:
        return importlib.import_module("kubernetes")
    except ImportError as exc:
        raise UserError(
            "the KFP API serves no logs; they are read from the pods with the kubernetes "
            f"client, which is not installed here ({exc})") from exc


# How the KFP API server (and the gRPC gateway before it) refuses a spec for its size.
_TOO_LARGE = ("too large", "exceeds the maximum", "larger than max", "message size")


def _size_refusal(e: BaseException | None) -> str | None:
    """The server's answer when ``e`` refused a run for its spec's size, else None."""
    status = getattr(e, "status", None)
    if e is None or not isinstance(status, int):
        return None
    detail = ""
    body = getattr(e, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            doc = json.loads(body)
            detail = str(doc.get("message") or doc.get("error") or "")[:300]
    text = f"{detail} {getattr(e, 'reason', '') or ''}".lower()
    if status == 413 or (status in (400, 500) and any(t in text for t in _TOO_LARGE)):
        return f"{status} {getattr(e, 'reason', '') or ''}".rstrip() + (
            f": {detail}" if detail else "")
    return None


def _raise(e: BaseException, action: str, *, kubernetes: bool = False) -> NoReturn:
    """Raise the Couler error for a KFP (or Kubernetes) client error ``e`` during ``action``."""
    api = "the Kubernetes API" if kubernetes else "the KFP API server"
    status = getattr(e, "status", None)
    if not isinstance(status, int) or status == 0:
        reason = getattr(e, "reason", None) or e
        raise RetryableError(f"{action}: cannot reach {api} ({type(e).__name__}: "
                             f"{str(reason).strip()})") from e
    detail = ""
    body = getattr(e, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            doc = json.loads(body)
            detail = str(doc.get("message") or doc.get("error") or "")[:300]
    message = f"{action}: {api} answered {status} {getattr(e, 'reason', '') or ''}".rstrip()
    if status == 404:
        raise NotFoundError(f"{action}: not found") from e
    if detail:
        message += f": {detail}"
    if status == 409:
        raise ConflictError(message) from e
    if status in (401, 403):
        raise UserError(message + " (check the token and its permissions)") from e
    if status >= 500 or status == 429:
        raise RetryableError(message) from e
    raise UserError(message) from e


# --------------------------------------------------------------------------- status mapping


def _time(value: object) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _container_tasks(spec: object) -> set[str] | None:
    """Names of the container tasks of a pipeline spec (None when there is no spec)."""
    if not isinstance(spec, Mapping):
        return None
    if "pipeline_spec" in spec and isinstance(spec["pipeline_spec"], Mapping):
        spec = spec["pipeline_spec"]  # with a platform spec: {pipeline_spec, platform_spec}
    if not isinstance(spec, Mapping) or "root" not in spec:
        return None
    components = spec.get("components") or {}
    executors = {name for name, c in components.items()
                 if isinstance(c, Mapping) and c.get("executorLabel")}
    names: set[str] = set()
    dags = [spec.get("root") or {}, *components.values()]
    for holder in dags:
        tasks = ((holder or {}).get("dag") or {}).get("tasks") or {}
        for task_name, task in tasks.items():
            ref = ((task or {}).get("componentRef") or {}).get("name")
            if ref in executors:
                names.add(str(((task or {}).get("taskInfo") or {}).get("name") or task_name))
    return names


def _step_tasks(run: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(step, key, task detail)`` for the task details that are steps."""
    steps = _container_tasks(run.get("pipeline_spec"))
    details = [dict(t) for t in (run.get("run_details") or {}).get("task_details") or ()
               if isinstance(t, Mapping)]
    grouped: dict[str, list[dict[str, Any]]] = {}
    for t in details:
        name = str(t.get("display_name") or "")
        if not name or (name not in steps if steps is not None else _STRUCTURAL.search(name)):
            continue
        grouped.setdefault(name, []).append(t)
    out = []
    for name, tasks in grouped.items():
        if len(tasks) == 1:
            out.append((name, "", tasks[0]))
            continue
        tasks.sort(key=lambda t: (_time(t.get("create_time")) or 0.0,
                                  _time(t.get("start_time")) or 0.0, str(t.get("task_id"))))
        out.extend((name, str(i), t) for i, t in enumerate(tasks))
    return out


def _find_step(run: Mapping[str, Any], step: str, key: str) -> dict[str, Any] | None:
    for s, k, task in _step_tasks(run):
        if (s, k) == (step, key):
            return task
    return None


def _state(value: object) -> str:
    return str(value or "")


def _message(error: object) -> str:
    return str(error.get("message") or "") if isinstance(error, Mapping) else ""


def _step_status(step: str, key: str, task: Mapping[str, Any], cancelled: bool) -> StepStatus:
    state = _TASK_STATE.get(_state(task.get("state")), StepState.RUNNING)
    if state is StepState.FAILED and cancelled:
        state = StepState.CANCELLED
    history = [h for h in task.get("state_history") or () if isinstance(h, Mapping)]
    attempts = sum(1 for h in history if _state(h.get("state")) == "RUNNING")
    if not attempts and (task.get("start_time") and state is not StepState.SKIPPED):
        attempts = 1
    return StepStatus(step=step, state=state, key=key, attempts=attempts,
                      started_at=_time(task.get("start_time")),
                      finished_at=_time(task.get("end_time")),
                      message=_message(task.get("error")))


def run_status(run: Mapping[str, Any]) -> RunStatus:
    """Map a KFP ``V2beta1Run`` (as plain data, snake_case keys) to a :class:`RunStatus`."""
    state = _RUN_STATE.get(_state(run.get("state")), RunState.RUNNING)
    cancelled = state is RunState.CANCELLED
    steps = [_step_status(s, k, t, cancelled) for s, k, t in _step_tasks(run)]
    steps.sort(key=lambda s: (s.started_at is None, s.started_at or 0.0, s.step,
                              int(s.key) if s.key.isdigit() else -1))
    return RunStatus(run_id=str(run.get("run_id") or ""),
                     workflow=str(run.get("display_name") or ""), state=state,
                     steps=tuple(steps), started_at=_time(run.get("created_at")),
                     finished_at=_time(run.get("finished_at")),
                     message=_message(run.get("error")))


def _conforms(adapter: KfpAdapter) -> EngineAdapter:
    """Never called: mypy checks here that the adapter follows the EngineAdapter protocol."""
    return adapter


def _run_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The run's ``pipeline_spec`` field: the PipelineSpec alone, or, when the pipeline sets
    Kubernetes settings (kfp-kubernetes), ``{"pipeline_spec", "platform_spec"}`` as
    ``kfp.Client`` sends a two-document package."""
    spec, platform = split_platform_spec(doc)
    return {"pipeline_spec": spec, "platform_spec": platform} if platform else spec
