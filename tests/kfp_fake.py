"""A stand-in Kubeflow Pipelines API server (REST v2beta1) for the KFP adapter tests.

No KFP server can run here (it needs Kubernetes, Argo Workflows, MySQL and ML Metadata);
this server speaks the few endpoints ``kfp.Client`` (kfp 2.17, ``kfp_server_api``) calls
for the adapter, with the JSON shapes and status codes of the real API server (its errors
are grpc-gateway bodies ``{"error", "code", "message", "details"}``):

* ``GET /apis/v2beta1/healthz``: ``{"multi_user": false}`` (``kfp.Client()`` asks it).
* ``POST /apis/v2beta1/runs``: creates a run (400 without ``display_name`` or without
  ``pipeline_spec`` / ``pipeline_version_reference``, or when the spec has no ``root``;
  ``pipeline_spec`` is a PipelineSpec or, as ``kfp.Client`` sends a pipeline with platform
  settings, ``{"pipeline_spec": ..., "platform_spec": ...}``);
  the server fills ``run_id``, ``experiment_id`` (the default experiment unless given),
  ``created_at``, ``state: PENDING`` and ``storage_state: AVAILABLE``.
* ``GET /apis/v2beta1/runs/{run_id}`` (404 when unknown).
* ``GET /apis/v2beta1/runs``: ``filter`` (the JSON ``Filter`` message, ``EQUALS`` /
  ``NOT_EQUALS`` on ``display_name``, ``description``, ``run_id``, ``experiment_id``,
  ``state``; other keys are a 400 as on the server), ``experiment_id``, ``sort_by``
  (``created_at`` [``desc``]), ``page_size`` / ``page_token``.
* ``POST /apis/v2beta1/runs/{run_id}:terminate``: the run goes ``CANCELING`` (404 when
  unknown).
* ``POST /apis/v2beta1/recurringruns``: creates a recurring run, checked as the API
  server does (a pipeline spec as for a run; a trigger with a cron schedule of six fields,
  robfig/cron with seconds, or an ``@`` descriptor; ``max_concurrency`` 1..10; ``mode``
  ``ENABLE`` / ``DISABLE``); the server fills ``recurring_run_id``, ``created_at``,
  ``status`` (``ENABLED`` / ``DISABLED``). ``GET /apis/v2beta1/recurringruns`` lists them
  with the same ``filter`` / ``experiment_id`` handling as runs.

Every request needs ``Authorization: Bearer <token>`` (401 otherwise). The tests play
the KFP backend (persistence agent) with :meth:`FakeKfp.update`, which changes a stored
run as the server would report it.
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

Obj = dict[str, Any]

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


class FakeKfp:
    """The store and the HTTP server; use as a context manager."""

    def __init__(self, token: str = "T") -> None:
        self.token = token
        self.lock = threading.Lock()
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
        """Change a stored run as the KFP backend would report it."""
        with self.lock:
            run = copy.deepcopy(self.runs[run_id])
            mutate(run)
            self.runs[run_id] = run
            return copy.deepcopy(run)

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
        if spec is not None and (not isinstance(spec, dict) or "root" not in spec):
            raise HttpError(400, "Invalid input error: Failed to create a run: the pipeline "
                            "spec has no root")
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

    def _create_recurring(self, body: Any) -> Obj:
        if not isinstance(body, dict) or not body.get("display_name"):
            raise HttpError(400, "Invalid input error: The recurring run name is empty")
        spec = body.get("pipeline_spec")
        if isinstance(spec, dict) and "pipeline_spec" in spec:
            spec = spec["pipeline_spec"]
        if not isinstance(spec, dict) or "root" not in spec:
            raise HttpError(400, "Invalid input error: Failed to create a recurring run: the "
                            "pipeline spec has no root")
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
                    run["state"] = "CANCELING"
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
