"""A stand-in Kubernetes API server for the Argo and Tekton adapter tests.

No Kubernetes can run here; this server speaks the few endpoints the adapter uses,
with the status codes and ``Status`` bodies the real API server returns for them:

* ``/apis/argoproj.io/v1alpha1/namespaces/{ns}/{workflows|cronworkflows}[/{name}]``:
  POST (``generateName`` honoured; 409 on a duplicate name, 422 without an entrypoint,
  400 on a namespace mismatch), GET, LIST (``labelSelector`` of ``k=v`` terms,
  ``fieldSelector`` ``metadata.name=...``), PATCH (``application/merge-patch+json``
  only, RFC 7386), and ``?watch=true``: newline-delimited JSON events streamed with
  chunked encoding, replaying events after ``resourceVersion``, kept open until
  ``timeoutSeconds`` (capped at :attr:`FakeKube.max_watch_seconds`) or shutdown.
* ``/apis/tekton.dev/v1/namespaces/{ns}/{pipelines|pipelineruns|taskruns}[/{name}]``: the
  same verbs (a PipelineRun needs ``spec.pipelineRef`` or ``spec.pipelineSpec``, 422
  otherwise).
* PUT on any of these objects replaces it (409 when ``metadata.resourceVersion`` is given
  and stale, as the API server's optimistic concurrency does); DELETE removes it.
* ``/api/v1/namespaces/{ns}/secrets[/{name}]``: POST (409 on a duplicate) and PUT.
* ``/api/v1/namespaces/{ns}/pods/{pod}/log``: GET, the text set by :meth:`FakeKube.set_log`.
* ``/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods/{pod}``: GET, the ``PodMetrics`` set by
  :meth:`FakeKube.set_pod_metrics` (404 ``podmetrics ... not found``, as metrics-server
  answers, for a pod without); :attr:`FakeKube.metrics_api` set to 404 plays a cluster
  without the metrics API (the API server's 404 for an unknown group), 403 a token that
  may not read it.

Every request needs ``Authorization: Bearer <token>`` (401 otherwise). With
``max_request_bytes`` a larger body is answered 413 (the API server's request limit), with
``max_object_bytes`` a POST/PUT whose object, as the server stores it (compact JSON), is larger
is answered 500 "etcdserver: request is too large". The tests play
the Argo or Tekton controller by mutating stored objects with :meth:`FakeKube.update`
(and creating TaskRuns with :meth:`FakeKube.put`), which bumps ``resourceVersion`` and
notifies watchers, as the API server would. Plurals are unique across the two groups, so
objects are stored by ``(plural, namespace, name)``.
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

_CUSTOM = re.compile(r"^/apis?/(argoproj\.io/v1alpha1|tekton\.dev/v1|batch/v1|v1|"
                     r"triggers\.tekton\.dev/v1beta1)/namespaces/([^/]+)/"
                     r"(workflows|cronworkflows|pipelines|pipelineruns|taskruns|configmaps|"
                     r"cronjobs|eventlisteners|triggerbindings|triggertemplates)"
                     r"(?:/([^/]+))?$")
_SECRETS = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?$")
_LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")
_POD_METRICS = re.compile(r"^/apis/metrics\.k8s\.io/v1beta1/namespaces/([^/]+)/pods/([^/]+)$")
_KINDS = {"workflows": "Workflow", "cronworkflows": "CronWorkflow", "pipelines": "Pipeline",
          "pipelineruns": "PipelineRun", "taskruns": "TaskRun", "configmaps": "ConfigMap",
          "cronjobs": "CronJob", "eventlisteners": "EventListener",
          "triggerbindings": "TriggerBinding", "triggertemplates": "TriggerTemplate"}
_GROUPS = {"workflows": "argoproj.io/v1alpha1", "cronworkflows": "argoproj.io/v1alpha1",
           "pipelines": "tekton.dev/v1", "pipelineruns": "tekton.dev/v1",
           "taskruns": "tekton.dev/v1", "configmaps": "v1", "cronjobs": "batch/v1",
           **{p: "triggers.tekton.dev/v1beta1"
              for p in ("eventlisteners", "triggerbindings", "triggertemplates")}}


@dataclass
class Request:
    """One request as the server saw it (secret bodies included: tests check them)."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


class HttpError(Exception):
    def __init__(self, code: int, reason: str, message: str, *,
                 details: Obj | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details, self.headers = details, headers or {}


@dataclass
class Fault:
    """An answer :meth:`FakeKube.inject` makes the server give instead of the real one, to
    the next ``times`` requests that match (``None``: any method / plural / kind of
    request). ``as_event``: a watch request is answered 200 with one ``ERROR`` event
    carrying the Status (how the API server ends a watch), not with the status code."""

    code: int
    method: str | None = None
    plural: str | None = None
    watch: bool | None = None
    times: int = 1
    retry_after: int | None = None
    as_event: bool = False
    hits: int = 0

    def matches(self, method: str, plural: str | None, watch: bool) -> bool:
        return (self.hits < self.times and self.method in (None, method)
                and self.plural in (None, plural) and self.watch in (None, watch))


def schema_errors(doc: Obj) -> list[str]:
    """What the vendored schemas say is wrong with an object posted or put: Argo
    (``argo-workflows.schema.json``), Tekton (the v1 CRDs), core kinds (the ``kubernetes``
    client's models), Tekton Triggers (structurally); unknown fields included -- the fake
    validates as the API server does with ``fieldValidation=Strict``, so a field a real
    server would silently prune is refused."""
    # imported here: the checks need jsonschema, which the kfp environment (where this
    # server only serves pod logs) does not have
    from tests.argo_schema import validate_argo
    from tests.unit.k8s_schema import kube_errors, tekton_errors, triggers_errors

    kind = doc.get("kind")
    if kind in ("Workflow", "CronWorkflow"):
        return validate_argo(doc)
    if kind in ("Pipeline", "PipelineRun"):
        return tekton_errors(doc)
    if kind in ("ConfigMap", "CronJob"):
        return kube_errors(doc)
    if str(doc.get("apiVersion", "")).startswith("triggers.tekton.dev/"):
        return triggers_errors(doc, tekton_errors)
    return []


def _field(problem: str) -> str:
    return problem.split(": ", 1)[0]


def _invalid(kind: str, plural: str, name: str, problems: list[str]) -> HttpError:
    """The API server's 422 for an object its schema refuses: the message names every
    field, ``details.causes`` lists them one by one."""
    group = _group(plural)
    causes = [{"reason": "FieldValueInvalid", "message": p.split(": ", 1)[-1],
               "field": _field(p)} for p in problems]
    return HttpError(422, "Invalid", f'{kind}.{group} "{name}" is invalid: '
                     + ", ".join(f"{_field(p)}: Invalid value: {p.split(': ', 1)[-1]}"
                                 for p in problems),
                     details={"name": name, "group": group, "kind": kind, "causes": causes})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _labels_match(obj: Obj, selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip().lstrip("="):
            return False
    return True


def _fields_match(obj: Obj, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if key != "metadata.name":
            raise HttpError(400, "BadRequest", f"field label not supported: {key}")
        if (obj.get("metadata") or {}).get("name") != value:
            return False
    return True


class FakeKube:
    """The store and the HTTP server; use as a context manager."""

    max_watch_seconds = 5.0

    def __init__(self, token: str = "T", *, max_request_bytes: int | None = None,
                 max_object_bytes: int | None = None) -> None:
        self.token = token
        # Like the API server's request-size limit (413 above it) and etcd's object-size
        # limit (a create above it: 500 "etcdserver: request is too large"); None: none.
        self.max_request_bytes = max_request_bytes
        self.max_object_bytes = max_object_bytes
        self.cond = threading.Condition()
        self.objects: dict[tuple[str, str, str], Obj] = {}  # (plural, namespace, name)
        self.secrets: dict[tuple[str, str], Obj] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.pod_metrics: dict[tuple[str, str], Obj] = {}
        self.metrics_api = 200  # 404: no metrics API in the cluster; 403: not allowed
        self.requests: list[Request] = []
        self.events: list[tuple[int, str, str, str, Obj]] = []  # (rv, plural, ns, type, obj)
        self.watchers = 0
        self.faults: list[Fault] = []
        self.fault_log: list[tuple[int, str, str]] = []  # (code, method, path) answered
        self.watch_log: list[tuple[str, str]] = []  # (plural, how it ended) per watch
        self.horizon = 0  # watches from an older resourceVersion get 410 (compaction)
        self._expiry = 0  # bumped by expire_watches: open watches end with ERROR 410
        self.validate = True  # check posted/put objects against the vendored schemas
        self._rv = itertools.count(1)
        self._suffix = itertools.count(1)
        self._closed = False
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

    def __enter__(self) -> FakeKube:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.cond:
            self._closed = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ controller side

    def get(self, plural: str, namespace: str, name: str) -> Obj:
        with self.cond:
            return copy.deepcopy(self.objects[(plural, namespace, name)])

    def names(self, plural: str, namespace: str) -> list[str]:
        with self.cond:
            return sorted(n for p, ns, n in self.objects if p == plural and ns == namespace)

    def update(self, plural: str, namespace: str, name: str,
               mutate: Callable[[Obj], None]) -> Obj:
        """Change a stored object as the Argo controller would, then notify watchers."""
        with self.cond:
            obj = copy.deepcopy(self.objects[(plural, namespace, name)])
            mutate(obj)
            return self._store(plural, namespace, obj, "MODIFIED")

    def put(self, plural: str, namespace: str, obj: Obj) -> Obj:
        """Create or overwrite a stored object as a controller would (e.g. a TaskRun)."""
        with self.cond:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            meta["namespace"] = namespace
            event = "MODIFIED" if (plural, namespace, meta["name"]) in self.objects else "ADDED"
            return self._store(plural, namespace, obj, event)

    def delete(self, plural: str, namespace: str, name: str) -> None:
        """Remove a stored object and notify watchers (event DELETED)."""
        with self.cond:
            obj = self.objects.pop((plural, namespace, name))
            self._store_event(plural, namespace, obj, "DELETED")

    def set_log(self, namespace: str, pod: str, text: str) -> None:
        with self.cond:
            self.logs[(namespace, pod)] = text

    def set_pod_metrics(self, namespace: str, pod: str, containers: dict[str, tuple[str, str]],
                        *, timestamp: str = "2024-05-01T10:00:30Z", window: str = "30s"
                        ) -> None:
        """What the metrics server reports for ``pod``: ``{container: (cpu, memory)}``
        quantities, e.g. ``{"main": ("250m", "100Mi")}``."""
        with self.cond:
            self.pod_metrics[(namespace, pod)] = {
                "kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": pod, "namespace": namespace},
                "timestamp": timestamp, "window": window,
                "containers": [{"name": name, "usage": {"cpu": cpu, "memory": memory}}
                               for name, (cpu, memory) in containers.items()]}

    def inject(self, code: int, *, method: str | None = None, plural: str | None = None,
               watch: bool | None = None, times: int = 1, retry_after: int | None = None,
               as_event: bool = False) -> Fault:
        """Answer the next ``times`` matching requests with ``code`` and the Status body the
        API server sends for it (403 Forbidden naming the verb and resource, 404, 409
        AlreadyExists -- with ``generateName``, the name-generation conflict --, 410 Expired,
        422 Invalid, 429 TooManyRequests with ``Retry-After``, 5xx). Checked after the
        token, before anything is done: the request changes nothing."""
        fault = Fault(code, method, plural, watch, times, retry_after, as_event)
        with self.cond:
            self.faults.append(fault)
        return fault

    def expire_watches(self) -> None:
        """Compact the history as etcd does: a watch from a version older than now gets a
        410 ``ERROR`` event (``too old resource version``), and every open watch ends with
        one. Call it inside ``with fake.cond`` after a change to make that change one the
        watcher can only learn by listing again."""
        with self.cond:
            self.horizon = self.events[-1][0] if self.events else 0
            self._expiry += 1
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Block until ``predicate()`` (read under the lock) holds: a barrier on what the
        server saw (requests, watches), not a sleep."""
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def requests_of(self, method: str) -> list[Request]:
        with self.cond:
            return [r for r in self.requests if r.method == method]

    def wait_for_watchers(self, n: int = 1, timeout: float = 5.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.watchers >= n, timeout)

    # ------------------------------------------------------------------ internals

    def _store(self, plural: str, namespace: str, obj: Obj, event: str) -> Obj:
        self.objects[(plural, namespace, obj["metadata"]["name"])] = obj
        return self._store_event(plural, namespace, obj, event)

    def _store_event(self, plural: str, namespace: str, obj: Obj, event: str) -> Obj:
        rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(rv)
        self.events.append((rv, plural, namespace, event, copy.deepcopy(obj)))
        self.cond.notify_all()
        return copy.deepcopy(obj)

    def _create(self, plural: str, namespace: str, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise HttpError(400, "BadRequest", "the body is not an object")
        kind = _KINDS[plural]
        if body.get("kind") != kind:
            raise HttpError(400, "BadRequest", f"kind {body.get('kind')!r} sent to {plural}")
        meta = body.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            raise HttpError(400, "BadRequest", "the namespace of the provided object does not "
                            "match the namespace sent on the request")
        if body.get("apiVersion", _GROUPS[plural]) != _GROUPS[plural]:
            raise HttpError(400, "BadRequest", f"apiVersion {body.get('apiVersion')!r} sent "
                            f"to {_GROUPS[plural]}")
        spec = body.get("spec") or {}
        if plural in ("workflows", "cronworkflows"):
            wf_spec = spec.get("workflowSpec") if plural == "cronworkflows" else spec
            if not (wf_spec or {}).get("entrypoint") and not (wf_spec or {}).get(
                    "workflowTemplateRef"):
                raise HttpError(422, "Invalid", f'{kind}.argoproj.io "{meta.get("name", "")}" '
                                "is invalid: spec.entrypoint: Required value")
        if plural == "pipelineruns" and not (spec.get("pipelineRef") or spec.get("pipelineSpec")):
            raise HttpError(422, "Invalid", f'PipelineRun.tekton.dev "{meta.get("name", "")}" '
                            "is invalid: spec: expected exactly one, got neither: "
                            "spec.pipelineRef, spec.pipelineSpec")
        self._check_schema(plural, body)
        with self.cond:
            if "name" not in meta:
                if not meta.get("generateName"):
                    raise HttpError(422, "Invalid", f"{kind}: metadata.name: Required value")
                meta["name"] = f"{meta['generateName']}{next(self._suffix):05d}"[:63]
            if (plural, namespace, meta["name"]) in self.objects:
                raise HttpError(409, "AlreadyExists",
                                f'{plural}.{_group(plural)} "{meta["name"]}" already exists')
            meta["namespace"] = namespace
            meta["uid"] = f"uid-{next(self._suffix)}"
            meta["creationTimestamp"] = "2024-05-01T10:00:00Z"
            return self._store(plural, namespace, body, "ADDED")

    def _check_schema(self, plural: str, body: Obj) -> None:
        if not self.validate:
            return
        problems = schema_errors(body)
        if problems:
            meta = body.get("metadata") or {}
            raise _invalid(_KINDS[plural], plural,
                           str(meta.get("name") or meta.get("generateName") or ""), problems)

    def _replace(self, plural: str, namespace: str, name: str, body: Any) -> Obj:
        if not isinstance(body, dict) or (body.get("metadata") or {}).get("name") != name:
            raise HttpError(400, "BadRequest", "the name of the object does not match the "
                            "name on the URL")
        self._check_schema(plural, body)
        with self.cond:
            obj = self.objects.get((plural, namespace, name))
            if obj is None:
                raise _not_found(plural, name)
            version = body["metadata"].get("resourceVersion")
            if version and version != obj["metadata"]["resourceVersion"]:
                raise HttpError(409, "Conflict", f'Operation cannot be fulfilled on '
                                f'{plural}.{_group(plural)} "{name}": the object has been '
                                "modified; please apply your changes to the latest version "
                                "and try again")
            body = copy.deepcopy(body)
            for key in ("namespace", "uid", "creationTimestamp"):
                body["metadata"][key] = obj["metadata"].get(key)
            return self._store(plural, namespace, body, "MODIFIED")

    def _patch(self, plural: str, namespace: str, name: str, content_type: str,
               body: Any) -> Obj:
        if content_type != "application/merge-patch+json":
            raise HttpError(415, "UnsupportedMediaType",
                            f"the fake accepts merge patches only, not {content_type}")
        with self.cond:
            obj = self.objects.get((plural, namespace, name))
            if obj is None:
                raise _not_found(plural, name)
            patched = merge_patch(obj, body)
            patched["metadata"]["name"] = name
            return self._store(plural, namespace, patched, "MODIFIED")


def _group(plural: str) -> str:
    return _GROUPS[plural].split("/")[0]


def _not_found(plural: str, name: str) -> HttpError:
    group = "" if plural in ("secrets", "pods") else "." + _group(plural)
    return HttpError(404, "NotFound", f'{plural}{group} "{name}" not found')


def _status_body(err: HttpError) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": err.message, "reason": err.reason, "code": err.code}
    if err.details is not None:
        body["details"] = err.details
    return body


_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
          "DELETE": "delete"}


def _fault_error(fault: Fault, method: str, plural: str, ns: str, name: str | None,
                 body: Any) -> HttpError:
    """The Status the API server sends for ``fault.code`` on this request."""
    code = fault.code
    group = _group(plural) if plural in _GROUPS else ""
    resource = f"{plural}.{group}" if group else plural
    meta = (body.get("metadata") or {}) if isinstance(body, dict) else {}
    shown = name or meta.get("name") or ""
    if code == 403:
        verb = "watch" if fault.watch else _VERBS.get(method, method.lower())
        if method == "GET" and name is None and not fault.watch:
            verb = "list"
        return HttpError(403, "Forbidden", f'{resource} "{shown}" is forbidden: User '
                         f'"system:serviceaccount:{ns}:couler" cannot {verb} resource '
                         f'"{plural}" in API group "{group}" in the namespace "{ns}"',
                         details={"name": shown, "group": group, "kind": plural})
    if code == 404:
        return _not_found(plural, shown) if plural in _GROUPS else HttpError(
            404, "NotFound", "the server could not find the requested resource")
    if code == 409:
        if method == "POST" and meta.get("generateName") and not meta.get("name"):
            generated = f"{meta['generateName']}abcde"
            return HttpError(409, "AlreadyExists", f'{resource} "{generated}" already exists, '
                             "the server was not able to generate a unique name for the "
                             "object", details={"name": generated, "group": group,
                                                "kind": plural, "retryAfterSeconds": 1})
        return HttpError(409, "AlreadyExists", f'{resource} "{shown}" already exists',
                         details={"name": shown, "group": group, "kind": plural})
    if code == 410:
        return HttpError(410, "Expired", "too old resource version: 1 (2)")
    if code == 422:
        return _invalid(_KINDS.get(plural, plural), plural, shown,
                        ["spec: Invalid value: refused by an admission webhook"])
    if code == 429:
        seconds = fault.retry_after if fault.retry_after is not None else 1
        return HttpError(429, "TooManyRequests", "Too many requests, please try again later.",
                         details={"retryAfterSeconds": seconds},
                         headers={"Retry-After": str(seconds)})
    if code == 503:
        return HttpError(503, "ServiceUnavailable", "the server is currently unable to handle "
                         "the request")
    if code == 504:
        return HttpError(504, "Timeout", "the server was unable to return a response in the "
                         "time allotted, but may still be processing the request")
    return HttpError(code, "InternalError", "Internal error occurred: injected")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeKube

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    # -------------------------------------------------------------- plumbing

    def _send(self, code: int, payload: Any, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, err: HttpError) -> None:
        self._send(err.code, _status_body(err), headers=err.headers)

    def _injected(self, method: str, path: str, query: dict[str, str], body: Any) -> bool:
        """Answer with the first matching injected fault, if any (see FakeKube.inject)."""
        fake = self.server_fake
        m = _CUSTOM.match(path) or _SECRETS.match(path)
        plural = (m.group(3) if m and m.re is _CUSTOM else "secrets") if m else None
        ns = m.group(2) if m and m.re is _CUSTOM else (m.group(1) if m else "")
        name = (m.group(4) if m.re is _CUSTOM else m.group(2)) if m else None
        watching = query.get("watch") in ("true", "1")
        with fake.cond:
            fault = next((f for f in fake.faults if f.matches(method, plural, watching)), None)
            if fault is None:
                return False
            fault.hits += 1
            fake.fault_log.append((fault.code, method, path))
            fake.cond.notify_all()
        err = _fault_error(fault, method, plural or "", ns or "", name, body)
        if fault.as_event and watching:
            self._error_event(_status_body(err))
        else:
            self._status(err)
        return True

    def _error_event(self, status: Obj) -> None:
        """A watch answered 200, then one ERROR event carrying ``status``, then its end."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        data = json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
        self.wfile.flush()

    def _dispatch(self, method: str) -> None:
        fake = self.server_fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with fake.cond:
            fake.requests.append(Request(method, url.path, query, content_type, body))
            fake.cond.notify_all()
        try:
            if self.headers.get("Authorization") != f"Bearer {fake.token}":
                raise HttpError(401, "Unauthorized", "Unauthorized")
            if self._injected(method, url.path, query, body):
                return
            if fake.max_request_bytes is not None and len(raw) > fake.max_request_bytes:
                raise HttpError(413, "RequestEntityTooLarge",
                                f"Request entity too large: limit is {fake.max_request_bytes}")
            if (fake.max_object_bytes is not None and method in ("POST", "PUT")
                    and len(json.dumps(body, separators=(",", ":"))) > fake.max_object_bytes):
                raise HttpError(500, "InternalError", "etcdserver: request is too large")
            self._route(method, url.path, query, content_type, body)
        except HttpError as e:
            self._status(e)

    def _route(self, method: str, path: str, query: dict[str, str], content_type: str,
               body: Any) -> None:
        fake = self.server_fake
        if m := _CUSTOM.match(path):
            group, ns, plural, name = m.groups()
            if _GROUPS[plural] != group:
                raise HttpError(404, "NotFound", f"the server could not find the requested "
                                f"resource ({method} {path})")
            if name is None and method == "POST":
                return self._send(201, fake._create(plural, ns, body))
            if name is None and method == "GET":
                if query.get("watch") in ("true", "1"):
                    return self._watch(plural, ns, query)
                with fake.cond:
                    items = [copy.deepcopy(o) for (p, n, _), o in sorted(fake.objects.items())
                             if p == plural and n == ns
                             and _labels_match(o, query.get("labelSelector", ""))
                             and _fields_match(o, query.get("fieldSelector", ""))]
                    rv = str(fake.events[-1][0]) if fake.events else "0"
                return self._send(200, {"apiVersion": _GROUPS[plural],
                                        "kind": _KINDS[plural] + "List",
                                        "metadata": {"resourceVersion": rv}, "items": items})
            if name is not None and method == "GET":
                with fake.cond:
                    obj = fake.objects.get((plural, ns, name))
                    if obj is None:
                        raise _not_found(plural, name)
                    return self._send(200, obj)
            if name is not None and method == "PATCH":
                return self._send(200, fake._patch(plural, ns, name, content_type, body))
            if name is not None and method == "PUT":
                return self._send(200, fake._replace(plural, ns, name, body))
            if name is not None and method == "DELETE":
                with fake.cond:
                    if (plural, ns, name) not in fake.objects:
                        raise _not_found(plural, name)
                fake.delete(plural, ns, name)
                return self._send(200, {"kind": "Status", "apiVersion": "v1",
                                        "status": "Success"})
            raise HttpError(405, "MethodNotAllowed", f"{method} {path}")
        if m := _SECRETS.match(path):
            ns, name = m.groups()
            secret_name = ((body or {}).get("metadata") or {}).get("name", "")
            with fake.cond:
                if method == "POST" and name is None:
                    if (ns, secret_name) in fake.secrets:
                        raise HttpError(409, "AlreadyExists",
                                        f'secrets "{secret_name}" already exists')
                    fake.secrets[(ns, secret_name)] = body
                    return self._send(201, body)
                if method == "PUT" and name is not None:
                    if (ns, name) not in fake.secrets:
                        raise _not_found("secrets", name)
                    fake.secrets[(ns, name)] = body
                    return self._send(200, body)
            raise HttpError(405, "MethodNotAllowed", f"{method} {path}")
        if (m := _POD_METRICS.match(path)) and method == "GET":
            ns, pod = m.groups()
            if fake.metrics_api == 404:
                raise HttpError(404, "NotFound", "the server could not find the requested "
                                "resource")
            if fake.metrics_api == 403:
                raise HttpError(403, "Forbidden", f'pods.metrics.k8s.io "{pod}" is forbidden: '
                                "User cannot get resource \"pods\" in API group "
                                "\"metrics.k8s.io\"")
            with fake.cond:
                metrics = copy.deepcopy(fake.pod_metrics.get((ns, pod)))
            if metrics is None:
                raise HttpError(404, "NotFound", f'podmetrics.metrics.k8s.io "{ns}/{pod}" '
                                "not found")
            return self._send(200, metrics)
        if (m := _LOG.match(path)) and method == "GET":
            ns, pod = m.groups()
            with fake.cond:
                text = fake.logs.get((ns, pod))
            if text is None:
                raise _not_found("pods", pod)
            return self._send(200, text, "text/plain")
        raise HttpError(404, "NotFound", f"the server could not find the requested resource "
                        f"({method} {path})")

    def _watch(self, plural: str, ns: str, query: dict[str, str]) -> None:
        fake = self.server_fake
        timeout = min(float(query.get("timeoutSeconds") or fake.max_watch_seconds),
                      fake.max_watch_seconds)
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        _fields_match({}, fields)  # reject unsupported selectors before streaming
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True

        def chunk(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        gone = _status_body(HttpError(410, "Expired", ""))
        with fake.cond:
            fake.watchers += 1
            fake.cond.notify_all()
            expiry = fake._expiry
            if "resourceVersion" in query:
                seen = int(query["resourceVersion"] or 0)
                pending: list[tuple[str, Obj]] = []
                if query["resourceVersion"] and seen < fake.horizon:
                    gone["message"] = f"too old resource version: {seen} ({fake.horizon})"
                    pending = [("ERROR", gone)]
            else:  # no version: the current objects, as ADDED
                seen = fake.events[-1][0] if fake.events else 0
                pending = [("ADDED", copy.deepcopy(o)) for (p, n, _), o in
                           sorted(fake.objects.items()) if p == plural and n == ns]
        try:
            deadline = threading.Event()

            def expire() -> None:
                deadline.set()
                _notify(fake)

            timer = threading.Timer(timeout, expire)
            timer.start()
            try:
                while True:
                    for etype, obj in pending:
                        if etype == "ERROR" or (_labels_match(obj, labels)
                                                and _fields_match(obj, fields)):
                            chunk(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                    if pending and pending[-1][0] == "ERROR":
                        ended = "expired"
                        break

                    def ready(last: int = seen) -> bool:
                        return deadline.is_set() or fake._closed or fake._expiry != expiry \
                            or (bool(fake.events) and fake.events[-1][0] > last)

                    with fake.cond:
                        fake.cond.wait_for(ready)
                        if fake._expiry != expiry:  # compacted under an open watch
                            gone["message"] = (f"too old resource version: {seen} "
                                               f"({fake.horizon})")
                            pending = [("ERROR", gone)]
                            continue
                        if deadline.is_set() or fake._closed:
                            break
                        new = [e for e in fake.events if e[0] > seen]
                        seen = new[-1][0]
                        pending = [(t, copy.deepcopy(o)) for _, p, n, t, o in new
                                   if p == plural and n == ns]
            finally:
                timer.cancel()
            chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            ended = "disconnected"
        finally:
            with fake.cond:
                fake.watchers -= 1
                fake.watch_log.append((plural, ended))
                fake.cond.notify_all()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


def _notify(fake: FakeKube) -> None:
    with fake.cond:
        fake.cond.notify_all()
