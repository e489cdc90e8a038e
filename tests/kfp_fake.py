"""A stand-in Kubeflow Pipelines API server (REST v2beta1) for the KFP adapter tests.

No KFP server can run here (it needs Kubernetes, Argo Workflows, MySQL and ML Metadata);
this server speaks the few endpoints ``kfp.Client`` (kfp 2.17, ``kfp_server_api``) calls
for the adapter, with the JSON shapes and status codes of the real API server (its errors
are grpc-gateway bodies ``{"error", "code", "message", "details"}``):

* ``GET /apis/v2beta1/healthz``: ``{"multi_user": false}`` (``kfp.Client()`` asks it).
* ``POST /apis/v2beta1/runs``: creates a run (400 without ``display_name`` or without
  ``pipeline_spec`` / ``pipeline_version_reference``, or when the spec is not a valid
  PipelineSpec -- :func:`pipeline_spec_errors`, with the kfp SDK; ``pipeline_spec`` is a
  PipelineSpec or, as ``kfp.Client`` sends a pipeline with platform settings,
  ``{"pipeline_spec": ..., "platform_spec": ...}``, the PlatformSpec checked too);
  the server fills ``run_id``, ``experiment_id`` (the default experiment unless given),
  ``created_at``, ``state: PENDING`` and ``storage_state: AVAILABLE``.
* ``GET /apis/v2beta1/runs/{run_id}`` (404 when unknown).
* ``GET /apis/v2beta1/runs``: ``filter`` (the JSON ``Filter`` message, ``EQUALS`` /
  ``NOT_EQUALS`` on ``display_name``, ``description``, ``run_id``, ``experiment_id``,
  ``state``; other keys are a 400 as on the server), ``experiment_id``, ``sort_by``
  (``created_at`` [``desc``]), ``page_size`` / ``page_token``.
* ``POST /apis/v2beta1/runs/{run_id}:terminate``: the run goes ``CANCELING`` (404 when
  unknown). As the API server's run store, only a run ``PENDING``, ``RUNNING``, ``PAUSED``
  or without a state can be terminated: any other (finished, or already ``CANCELING``) is
  a 400 "Failed to terminate a run ... Row not found".
* ``POST /apis/v2beta1/recurringruns``: creates a recurring run, checked as the API
  server does (a pipeline spec as for a run; a trigger with a cron schedule of six fields,
  robfig/cron with seconds, or an ``@`` descriptor; ``max_concurrency`` 1..10; ``mode``
  ``ENABLE`` / ``DISABLE``); the server fills ``recurring_run_id``, ``created_at``,
  ``status`` (``ENABLED`` / ``DISABLED``). ``GET /apis/v2beta1/recurringruns`` lists them
  with the same ``filter`` / ``experiment_id`` handling as runs.

Every request needs ``Authorization: Bearer <token>`` (401 otherwise). The tests play
the KFP backend (persistence agent) with :meth:`FakeKfp.update`, which changes a stored
run as the server would report it and refuses a state change the backend never makes (a
finished run changing state, a run going back to ``PENDING``, ``CANCELING`` other than to
a finished state): a test scenario cannot drive the adapter through an impossible run.
:meth:`FakeKfp.before` runs a backend action just before the server handles a chosen
request (a race, made deterministic); :meth:`FakeKfp.wait_for` is a barrier on what the
server saw.

The spec checks need the kfp SDK (``kfp.pipeline_spec``, ``kfp.kubernetes``), so the fake
runs where kfp is installed (``.venv-kfp``).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from google.protobuf import json_format
from kfp import components
from kfp.kubernetes import kubernetes_executor_config_pb2
from kfp.pipeline_spec import pipeline_spec_pb2

Obj = dict[str, Any]

TERMINAL = {"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"}
TERMINABLE = {"PENDING", "RUNNING", "PAUSED", "RUNTIME_STATE_UNSPECIFIED", ""}
# The state changes the KFP backend reports; anything else is refused by FakeKfp.update.
_NEXT = {"": {"PENDING", "RUNNING", *TERMINAL, "CANCELING"},
         "RUNTIME_STATE_UNSPECIFIED": {"PENDING", "RUNNING", *TERMINAL, "CANCELING"},
         "PENDING": {"RUNNING", "PAUSED", "CANCELING", *TERMINAL},
         "RUNNING": {"PAUSED", "CANCELING", *TERMINAL},
         "PAUSED": {"RUNNING", "CANCELING", *TERMINAL},
         "CANCELING": {"CANCELED", "FAILED", "SUCCEEDED"}}

DEFAULT_EXPERIMENT = "0b8e7d3a-0000-4000-8000-000000000001"
_RUN = re.compile(r"^/apis/v2beta1/runs/([^/:]+)(:terminate)?$")
_FILTER_KEYS = {"display_name", "description", "run_id", "experiment_id", "state", "name",
                "created_at", "finished_at", "storage_state", "namespace", "id"}


@dataclass
class Request:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    body: Any


class HttpError(Exception):
    # grpc codes of the gateway body, by HTTP status
    _GRPC = {400: 3, 401: 16, 404: 5, 405: 12, 409: 6}

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    def body(self) -> Obj:
        return {"error": self.message, "code": self._GRPC.get(self.code, 2),
                "message": self.message, "details": []}


def pipeline_spec_errors(spec: Any) -> list[str]:
    """What is wrong with a pipeline spec, checked with the kfp SDK as the API server and
    its driver would: it must parse as the ``PipelineSpec`` proto (no unknown field, every
    value of its field's type: ``json_format`` as the server's ``protojson``), load as a
    component (``kfp.components``), name the pipeline, have a root DAG, and every task's
    ``componentRef``, every component's ``executorLabel`` and every ``dependentTasks``
    entry must name something that exists."""
    if not isinstance(spec, dict):
        return ["the pipeline spec is not an object"]
    try:
        proto = json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    except json_format.ParseError as e:
        return [f"the pipeline spec does not parse: {e}"]
    errors: list[str] = []
    if not proto.pipeline_info.name:
        errors.append("pipelineInfo.name: required")
    if not proto.root.HasField("dag"):
        errors.append("root.dag: the pipeline has no root DAG")
    executors = set(proto.deployment_spec.fields["executors"].struct_value.fields) \
        if "executors" in proto.deployment_spec.fields else set()
    for name, component in proto.components.items():
        if component.executor_label and component.executor_label not in executors:
            errors.append(f"components.{name}.executorLabel: no executor "
                          f"{component.executor_label!r} in deploymentSpec.executors")

    def dag(where: str, tasks: Any) -> None:
        for task_name, task in tasks.items():
            ref = task.component_ref.name
            if ref not in proto.components:
                errors.append(f"{where}.tasks.{task_name}.componentRef: no component {ref!r}")
            errors.extend(f"{where}.tasks.{task_name}.dependentTasks: no task {d!r} in its DAG"
                          for d in task.dependent_tasks if d not in tasks)

    dag("root.dag", proto.root.dag.tasks)
    for name, component in proto.components.items():
        if component.HasField("dag"):
            dag(f"components.{name}.dag", component.dag.tasks)
    if not errors:
        try:
            components.load_component_from_text(yaml.safe_dump(spec))
        except Exception as e:  # the SDK's own refusal, whatever its type
            errors.append(f"kfp cannot load the pipeline spec: {type(e).__name__}: {e}")
    return errors


def platform_spec_errors(platform: Any) -> list[str]:
    """What is wrong with a ``PlatformSpec`` (kfp-kubernetes executor configs inside)."""
    try:
        proto = json_format.ParseDict(platform, pipeline_spec_pb2.PlatformSpec())
    except json_format.ParseError as e:
        return [f"the platform spec does not parse: {e}"]
    errors = []
    for name, single in proto.platforms.items():
        executors = single.deployment_spec.executors if name == "kubernetes" else {}
        for label, config in executors.items():
            try:
                json_format.ParseDict(json_format.MessageToDict(config),
                                      kubernetes_executor_config_pb2.KubernetesExecutorConfig())
            except json_format.ParseError as e:
                errors.append(f"platforms.kubernetes.deploymentSpec.executors.{label}: {e}")
    return errors


class FakeKfp:
    """The store and the HTTP server; use as a context manager."""

    def __init__(self, token: str = "T") -> None:
        self.token = token
        self.lock = threading.Condition()
        self._before: list[list[Any]] = []  # [method, path suffix, action, skip]
        self.runs: dict[str, Obj] = {}
        self.recurring_runs: dict[str, Obj] = {}
        self.requests: list[Request] = []
        self._ids = itertools.count(1)
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeKfp:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ backend side

    def get(self, run_id: str) -> Obj:
        with self.lock:
            return copy.deepcopy(self.runs[run_id])

    def update(self, run_id: str, mutate: Callable[[Obj], None]) -> Obj:
        """Change a stored run as the KFP backend would report it.

        Raises:
            ValueError: a state change the backend never makes (see the module docstring).
        """
        with self.lock:
            before = copy.deepcopy(self.runs[run_id])
            run = copy.deepcopy(before)
            mutate(run)
            old, new = str(before.get("state") or ""), str(run.get("state") or "")
            if new != old and new not in _NEXT.get(old, set()):
                raise ValueError(f"run {run_id}: the KFP backend never changes a run from "
                                 f"{old or 'no state'} to {new or 'no state'}")
            if new != old:
                run.setdefault("state_history", []).append(
                    {"update_time": run.get("finished_at") or run["created_at"], "state": new})
            self.runs[run_id] = run
            self.lock.notify_all()
            return copy.deepcopy(run)

    def before(self, method: str, path_suffix: str, action: Callable[[], None], *,
               skip: int = 0) -> None:
        """Run ``action`` (as the backend) once, just before the server handles a ``method``
        request whose path ends with ``path_suffix``: the next one after ``skip`` such."""
        with self.lock:
            self._before.append([method, path_suffix, action, skip])

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
        """Block until ``predicate()`` holds (read under the lock; notified on every request
        and change): a barrier on what the server saw, not a delay."""
        with self.lock:
            return self.lock.wait_for(predicate, timeout)

    def requests_of(self, method: str, path_suffix: str = "") -> list[Request]:
        with self.lock:
            return [r for r in self.requests
                    if r.method == method and r.path.endswith(path_suffix)]

    # ------------------------------------------------------------------ internals

    def _create(self, body: Any, query: dict[str, str]) -> Obj:
        if not isinstance(body, dict):
            raise HttpError(400, "Invalid input error: the request body is not a run")
        if not body.get("display_name"):
            raise HttpError(400, "Invalid input error: The run name is empty. Please specify "
                            "a valid name")
        spec = body.get("pipeline_spec")
        if spec is None and not body.get("pipeline_version_reference"):
            raise HttpError(400, "Invalid input error: Failed to create a run due to missing "
                            "pipeline spec or pipeline version reference")
        if isinstance(spec, dict) and "pipeline_spec" in spec:
            # kfp.Client's form for a pipeline with a PlatformSpec (kfp-kubernetes settings)
            if set(spec) - {"pipeline_spec", "platform_spec"} or not isinstance(
                    spec.get("platform_spec", {}), dict):
                raise HttpError(400, "Invalid input error: Failed to create a run: invalid "
                                "pipeline spec and platform spec")
            spec = spec["pipeline_spec"]
        self._check_spec(body.get("pipeline_spec"), "run")
        with self.lock:
            n = next(self._ids)
            run = copy.deepcopy(body)
            run["run_id"] = f"7c3f0000-0000-4000-8000-{n:012d}"
            run["experiment_id"] = (body.get("experiment_id") or query.get("experiment_id")
                                    or DEFAULT_EXPERIMENT)
            run["created_at"] = f"2024-05-01T10:{n // 60:02d}:{n % 60:02d}Z"
            run["state"] = "PENDING"
            run["storage_state"] = "AVAILABLE"
            run["state_history"] = [{"update_time": run["created_at"], "state": "PENDING"}]
            self.runs[run["run_id"]] = run
            return copy.deepcopy(run)

    @staticmethod
    def _check_spec(sent: Any, what: str) -> None:
        if sent is None:
            return
        platform: Any = None
        if isinstance(sent, dict) and "pipeline_spec" in sent:
            sent, platform = sent["pipeline_spec"], sent.get("platform_spec")
        errors = pipeline_spec_errors(sent)
        if platform is not None:
            errors += platform_spec_errors(platform)
        if errors:
            raise HttpError(400, f"Invalid input error: Failed to create a {what}: invalid "
                            "pipeline spec: " + "; ".join(errors))

    def _create_recurring(self, body: Any) -> Obj:
        if not isinstance(body, dict) or not body.get("display_name"):
            raise HttpError(400, "Invalid input error: The recurring run name is empty")
        if body.get("pipeline_spec") is None:
            raise HttpError(400, "Invalid input error: Failed to create a recurring run due "
                            "to missing pipeline spec")
        self._check_spec(body.get("pipeline_spec"), "recurring run")
        cron = ((body.get("trigger") or {}).get("cron_schedule") or {}).get("cron", "")
        if not (cron.startswith("@") or len(cron.split()) == 6):
            raise HttpError(400, f"Invalid input error: invalid cron schedule {cron!r} (six "
                            "fields, seconds first)")
        concurrency = int(body.get("max_concurrency") or 1)
        if not 1 <= concurrency <= 10:
            raise HttpError(400, "Invalid input error: max concurrency of a recurring run "
                            "must be at least 1 and at most 10")
        mode = body.get("mode", "ENABLE")
        if mode not in ("ENABLE", "DISABLE"):
            raise HttpError(400, f"Invalid input error: invalid mode {mode!r}")
        with self.lock:
            n = next(self._ids)
            rec = copy.deepcopy(body)
            rec["recurring_run_id"] = f"5e1f0000-0000-4000-8000-{n:012d}"
            rec["experiment_id"] = body.get("experiment_id") or DEFAULT_EXPERIMENT
            rec["created_at"] = f"2024-05-01T10:{n // 60:02d}:{n % 60:02d}Z"
            rec["status"] = "ENABLED" if mode == "ENABLE" else "DISABLED"
            self.recurring_runs[rec["recurring_run_id"]] = rec
            return copy.deepcopy(rec)

    def _list_recurring(self, query: dict[str, str]) -> Obj:
        predicates = list(json.loads(query["filter"]).get("predicates") or ()) \
            if query.get("filter") else []
        with self.lock:
            found = [copy.deepcopy(r) for r in self.recurring_runs.values()
                     if all(_matches(r, p) for p in predicates)
                     and (not query.get("experiment_id")
                          or r.get("experiment_id") == query["experiment_id"])]
        return {"recurringRuns": found, "total_size": len(found)}

    def _list(self, query: dict[str, str]) -> Obj:
        predicates: list[Obj] = []
        if query.get("filter"):
            try:
                predicates = list(json.loads(query["filter"]).get("predicates") or ())
            except (ValueError, AttributeError) as e:
                raise HttpError(400, f"Invalid input error: invalid filter: {e}") from None
        for p in predicates:
            if p.get("key") not in _FILTER_KEYS:
                raise HttpError(400, f"Invalid input error: {p.get('key')!r} is not a valid "
                                "filter key")
            if p.get("operation") not in ("EQUALS", "NOT_EQUALS"):
                raise HttpError(400, f"the fake supports EQUALS/NOT_EQUALS, not "
                                f"{p.get('operation')!r}")
        with self.lock:
            runs = [copy.deepcopy(r) for r in self.runs.values()
                    if all(_matches(r, p) for p in predicates)
                    and (not query.get("experiment_id")
                         or r.get("experiment_id") == query["experiment_id"])]
        field, _, order = (query.get("sort_by") or "created_at").partition(" ")
        if field not in ("created_at", "display_name"):
            raise HttpError(400, f"Invalid input error: cannot sort by {field!r}")
        runs.sort(key=lambda r: (str(r.get(field, "")), r["run_id"]), reverse=order == "desc")
        size = int(query.get("page_size") or 20)
        start = int(query.get("page_token") or 0)
        page = runs[start:start + size]
        out: Obj = {"runs": page, "total_size": len(runs)}
        if start + size < len(runs):
            out["next_page_token"] = str(start + size)
        return out


def _matches(run: Obj, predicate: Obj) -> bool:
    key = str(predicate["key"])
    key = {"name": "display_name", "id": "run_id"}.get(key, key)
    want = predicate.get("string_value", predicate.get("stringValue"))
    equal = str(run.get(key, "")) == str(want)
    return equal if predicate["operation"] == "EQUALS" else not equal


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeKfp

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def _send(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, method: str) -> None:
        fake = self.server_fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with fake.lock:
            fake.requests.append(Request(method, url.path, query, body))
            fake.lock.notify_all()
            due: list[Callable[[], None]] = []
            for hook in [h for h in fake._before if h[0] == method
                         and url.path.endswith(h[1])]:
                if hook[3] > 0:
                    hook[3] -= 1
                else:
                    fake._before.remove(hook)
                    due.append(hook[2])
        for action in due:
            action()
        try:
            if self.headers.get("Authorization") != f"Bearer {fake.token}":
                raise HttpError(401, "Unauthorized: the bearer token is missing or invalid")
            self._route(method, url.path, query, body)
        except HttpError as e:
            self._send(e.code, e.body())

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> None:
        fake = self.server_fake
        if path == "/apis/v2beta1/healthz" and method == "GET":
            return self._send(200, {"commit_sha": "fake", "tag_name": "2.5.0",
                                    "multi_user": False})
        if path == "/apis/v2beta1/runs":
            if method == "POST":
                return self._send(200, fake._create(body, query))
            if method == "GET":
                return self._send(200, fake._list(query))
        if path == "/apis/v2beta1/recurringruns":
            if method == "POST":
                return self._send(200, fake._create_recurring(body))
            if method == "GET":
                return self._send(200, fake._list_recurring(query))
        if m := _RUN.match(path):
            run_id, terminate = m.groups()
            with fake.lock:
                run = fake.runs.get(run_id)
                if run is None:
                    raise HttpError(404, f"Failed to get run: ResourceNotFoundError: Run "
                                    f"{run_id} not found")
                if terminate and method == "POST":
                    if str(run.get("state") or "") not in TERMINABLE:
                        raise HttpError(400, f"Terminate run failed: Invalid input error: "
                                        f"Failed to terminate a run {run_id}. Row not found")
                    run["state"] = "CANCELING"
                    fake.lock.notify_all()
                    return self._send(200, {})
                if not terminate and method == "GET":
                    return self._send(200, copy.deepcopy(run))
        raise HttpError(404, f"Not Found: {method} {path}")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")
