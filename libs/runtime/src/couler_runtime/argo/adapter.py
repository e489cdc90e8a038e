"""Run Couler workflows on Argo Workflows through the Kubernetes API.

:class:`ArgoAdapter` compiles the IR with :func:`couler.compilers.argo.compile_workflow`,
creates the secrets and the ``Workflow`` (or ``CronWorkflow``) object, and reports
runs in the engine-neutral vocabulary of :mod:`couler.engines.base`.

State mapping (Argo ``phase`` -> Couler state):

========================  ===============================================
Argo                      Couler
========================  ===============================================
run ``""`` / Pending      ``RunState.PENDING``
run Running               ``RunState.RUNNING``
run Succeeded             ``RunState.SUCCEEDED``
run Failed / Error        ``RunState.FAILED`` (``CANCELLED`` when ``spec.shutdown`` is set)
node Pending              ``StepState.PENDING``
node Running              ``StepState.RUNNING`` (``RETRYING`` for a Retry node whose
                          last attempt failed)
node Succeeded            ``StepState.SUCCEEDED`` (``CACHED`` on a memoization hit)
node Failed / Error       ``StepState.FAILED`` (``CANCELLED`` when the run was shut down)
node Skipped / Omitted,   ``StepState.SKIPPED``
type Skipped
========================  ===============================================

Which nodes are steps: nodes directly inside the workflow's top-level DAG (their
``boundaryID`` is the root node or the exit handler) except the structural
``TaskGroup``/``StepGroup`` nodes and the attempts under a ``Retry`` node. A node's
``displayName`` is the task name, which the compiler sets to the IR step name; a map
item ``fan(2:value)`` is reported as step ``fan`` with key ``"2"``. Attempts are the
number of children of a ``Retry`` node (1 for a plain pod that started). Outputs are
the node's ``outputs.parameters`` plus ``outputs.result`` (a step's standard output)
under the name ``"result"``.

Pod names (for :meth:`ArgoAdapter.logs`), as Argo v3.4+ computes them
(``util.GeneratePodName``): with the ``workflows.argoproj.io/pod-name-format: v1``
annotation the pod is named by the node ``id``; otherwise (v2, the default) the pod of
the root node is named after the workflow, and any other pod is
``{workflow}-{templateName}-{fnv32a(node.name)}`` (``{workflow}-{hash}`` when the node
has no ``templateName``), the prefix cut to 242 characters. Logs are read from the
``main`` container; for a retried step, from its last attempt.

Utilization (:meth:`ArgoAdapter.utilization`): for each running step, the ``main``
container's usage from the metrics API (``metrics.k8s.io/v1beta1`` PodMetrics of its pod,
the latest attempt's; metrics-server averages CPU over its window), polled by the caller
while the run goes on. A cluster without the metrics API, or a token that may not read it,
gives no samples (logged once; :class:`couler_runtime.kube.PodMetrics`).

Every Kubernetes error is translated once, at this boundary, into :mod:`couler.errors`,
and the message names the workflow: 404 -> ``NotFoundError``, 409 -> ``ConflictError``,
other 4xx (401/403 included) -> ``UserError``, 5xx and connection failures ->
``RetryableError``; a Workflow refused for its size (413, or etcd's "request is too
large", a 500) -> ``DocumentTooLargeError`` with the size sent, never retried as is.

Before that translation a transient refusal is sent again, with bounded back-off
(:class:`couler_runtime.kube.RetryPolicy`, :func:`couler_runtime.kube.retry_delay`): 429
after its ``Retry-After``; 5xx and connection trouble on every request but a create (which
may have been done: the caller's idempotency key finds it on its next try); 409 on a create
with ``generateName`` (the server found no free name; nothing was created). A 409 on a
named object is "already exists". :meth:`ArgoAdapter.watch` opens its stream again after
429/5xx (or such a watch ``ERROR`` event), and after 410 Gone ("too old resource version",
as an answer or an ``ERROR`` event, after etcd compacted its history) reads the workflow
again -- the changes it missed -- and resumes from the version read.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import watch as _k8s_watch

from couler import ir
from couler.api.handles import SecretMaterial
from couler.compilers.argo import compile_workflow
from couler.compilers.wire import json_size
from couler.engines.base import RunState, RunStatus, StepSample, StepState, StepStatus
from couler.errors import (
    CoulerError,
    DocumentTooLargeError,
    NotFoundError,
    OperationTimeoutError,
    RetryableError,
    UserError,
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
    size_refusal,
    watch_gone,
)

__all__ = [
    "GROUP",
    "IDEMPOTENCY_KEY",
    "VERSION",
    "ArgoAdapter",
    "pod_name",
    "run_status",
]

# Parts of the client without annotations: kept as ``Any`` here, at the boundary.
k8s_watch: Any = _k8s_watch

GROUP = "argoproj.io"
VERSION = "v1alpha1"
IDEMPOTENCY_KEY = "couler.io/idempotency-key"
POD_NAME_FORMAT = "workflows.argoproj.io/pod-name-format"
MAIN_CONTAINER = "main"

_ITEM = re.compile(r"^(?P<step>.+?)\((?P<key>\d+)(:.*)?\)$", re.DOTALL)
_MAX_POD_PREFIX = 253 - 10 - 1  # Argo: maxK8sResourceNameLength - k8sNamingHashLength - 1
_STRUCTURAL = {"TaskGroup", "StepGroup"}
_RUN_PHASE = {
    "": RunState.PENDING,
    "Pending": RunState.PENDING,
    "Running": RunState.RUNNING,
    "Succeeded": RunState.SUCCEEDED,
    "Failed": RunState.FAILED,
    "Error": RunState.FAILED,
}
_NODE_PHASE = {
    "": StepState.PENDING,
    "Pending": StepState.PENDING,
    "Running": StepState.RUNNING,
    "Succeeded": StepState.SUCCEEDED,
    "Failed": StepState.FAILED,
    "Error": StepState.FAILED,
    "Skipped": StepState.SKIPPED,
    "Omitted": StepState.SKIPPED,
}


class ArgoAdapter:
    """Submits, observes and cancels Argo workflows in one namespace.

    Args:
        namespace: Where workflows, their secrets and pods live.
        api_client: A ready ``kubernetes.client.ApiClient``; wins over everything else.
        configuration: A ``kubernetes.client.Configuration`` to build the client from.
        host: API server URL, with ``token`` (a bearer token) and ``verify_ssl``/
            ``ca_cert``; used when no client or configuration is given.
        config_file, context: Kube config lookup when none of the above is given (then
            the in-cluster configuration).
        retry: When a request is sent again (:class:`couler_runtime.kube.RetryPolicy`).
    """

    def __init__(self, namespace: str = "argo", *, api_client: object = None,
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
        self._metrics = PodMetrics(self._custom, namespace)

    def __repr__(self) -> str:
        return f"ArgoAdapter(namespace={self.namespace!r})"

    # ------------------------------------------------------------------ submit

    def submit(self, wf: ir.Workflow, secrets: Sequence[SecretMaterial] = (), *,
               idempotency_key: str | None = None) -> str:
        """Compile ``wf``, create its secrets and its Workflow/CronWorkflow; return the name.

        With ``idempotency_key``, the object carries it as the ``couler.io/idempotency-key``
        label (hashed when it is not a valid label value) and annotation (verbatim); a
        submit whose key matches an existing object returns that object's name and
        creates nothing, secrets included.

        Secrets are created in this adapter's namespace; an existing secret of the same
        name is replaced. Their values go to the Secret objects only.

        Raises:
            ValidationError, UnsupportedFeatureError: the workflow cannot be compiled.
            UserError: the namespace of the workflow (``tenant``) is not this adapter's,
                or the API server rejected a request; ConflictError on a name clash.
            RetryableError: server-side or connection trouble.
        """
        doc = compile_workflow(wf)
        kind = str(doc.get("kind", "Workflow"))
        plural = "cronworkflows" if kind == "CronWorkflow" else "workflows"
        metadata: dict[str, Any] = doc.setdefault("metadata", {})
        ns = metadata.get("namespace", self.namespace)
        if ns != self.namespace:
            raise UserError(f"workflow {wf.name!r}: its namespace {ns!r} is not the adapter's "
                            f"namespace {self.namespace!r}")
        what = f"{kind} of workflow {wf.name!r}"
        if idempotency_key is not None:
            label = label_value(idempotency_key)
            metadata.setdefault("labels", {})[IDEMPOTENCY_KEY] = label
            metadata.setdefault("annotations", {})[IDEMPOTENCY_KEY] = idempotency_key
            with self._boundary(f"looking up {what} by idempotency key"):
                found = self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, plural,
                    label_selector=f"{IDEMPOTENCY_KEY}={label}")
            for item in items_of(found):
                meta = item.get("metadata") or {}
                if (meta.get("annotations") or {}).get(IDEMPOTENCY_KEY) == idempotency_key:
                    return str(meta["name"])
        for secret in secrets:
            if secret.should_create:
                self._put_secret(secret, wf.name)
        try:
            with self._boundary(f"creating {what}"):
                created = self._custom.create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, plural, doc)
        except CoulerError as exc:
            refusal = size_refusal(exc.__cause__)
            if refusal is None:
                raise
            # The size in the split budget's unit (the object as the server stores it,
            # compact JSON), and the client's body (``json.dumps`` with spaces).
            raise DocumentTooLargeError(
                "argo", wf.name, json_size(doc), refusal,
                sent_bytes=len(json.dumps(doc).encode())) from exc
        return str(as_mapping(created)["metadata"]["name"])

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
        """The Workflow object ``name`` as plain data."""
        with self._boundary(f"reading workflow {name!r}"):
            obj = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "workflows", name)
        return as_mapping(obj)

    def status(self, name: str) -> RunStatus:
        """The state of the run ``name`` and of its steps (see the module's mapping)."""
        return run_status(self.get(name))

    def watch(self, name: str, timeout: float | None = None) -> Iterator[RunStatus]:
        """Yield the run's status now and on every change, until it is terminal.

        Uses the Kubernetes watch API on ``workflows`` with the field selector
        ``metadata.name=NAME``, resuming from the last seen ``resourceVersion`` when the
        server closes the stream.

        Raises:
            OperationTimeoutError: ``timeout`` seconds passed before the run ended.
            NotFoundError: the workflow does not exist or was deleted.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        obj = self.get(name)
        last = run_status(obj)
        yield last
        if last.state.terminal:
            return
        version = (obj.get("metadata") or {}).get("resourceVersion")
        action = f"watching workflow {name!r}"
        failures = 0  # in a row, without an event in between
        while True:
            kwargs: dict[str, Any] = {"field_selector": f"metadata.name={name}"}
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationTimeoutError(
                        f"workflow {name!r}: not finished after {timeout} s "
                        f"(last state {last.state.value})")
                kwargs["timeout_seconds"] = max(1, int(remaining + 0.999))
                kwargs["_request_timeout"] = remaining + 5
            else:
                kwargs["timeout_seconds"] = 300  # reconnect every 5 minutes
            if version:
                kwargs["resource_version"] = version
            w = k8s_watch.Watch()
            failure: Exception | None = None
            try:
                stream = w.stream(self._custom.list_namespaced_custom_object, GROUP, VERSION,
                                  self.namespace, "workflows", **kwargs)
                try:
                    for event in stream:
                        failures = 0
                        etype = event.get("type")
                        item = as_mapping(event.get("object"))
                        meta = item.get("metadata") or {}
                        version = meta.get("resourceVersion", version)
                        if etype == "DELETED":
                            raise NotFoundError(f"workflow {name!r} was deleted in namespace "
                                                f"{self.namespace!r} while being watched")
                        if etype not in ("ADDED", "MODIFIED") or meta.get("name") != name:
                            continue
                        current = run_status(item)
                        if current != last:
                            last = current
                            yield current
                        if current.state.terminal:
                            return
                finally:
                    w.stop()
                    stream.close()
            except (k8s_client.ApiException, *CONNECTION_ERRORS) as e:
                failure = e
            if failure is not None:
                failures += 1
                if watch_gone(failure):
                    # 410: the server no longer has the changes since ``version``; list
                    # again (the run as it is now) and resume from the listed version.
                    if failures >= self._retry.attempts:
                        raise RetryableError(f"{action}: the Kubernetes API answered 410 Gone "
                                             f"{failures} times in a row") from failure
                    obj = self.get(name)
                    version = (obj.get("metadata") or {}).get("resourceVersion")
                    current = run_status(obj)
                    if current != last:
                        last = current
                        yield current
                    if current.state.terminal:
                        return
                    continue
                delay = retry_delay(failure, failures, self._retry)
                if delay is None:
                    raise_api_error(failure, action, namespace=self.namespace)
                if deadline is not None:
                    delay = min(delay, max(deadline - time.monotonic(), 0.0))
                self._retry.sleep(delay)
                continue
            if deadline is not None and time.monotonic() >= deadline:
                raise OperationTimeoutError(
                    f"workflow {name!r}: not finished after {timeout} s "
                    f"(last state {last.state.value})")

    def logs(self, name: str, step: str, key: str = "") -> str:
        """The ``main`` container log of step ``step`` (map item ``key``) of run ``name``.

        Raises:
            NotFoundError: no such step in the run, or it has no pod (yet).
        """
        obj = self.get(name)
        nodes = _nodes(obj)
        node = _find_step_node(obj, step, key)
        if node is None:
            label = step + (f"[{key}]" if key else "")
            raise NotFoundError(f"workflow {name!r}: no step {label!r} in the run")
        while node.get("type") == "Retry" and node.get("children"):
            node = nodes.get(node["children"][-1], node)
            if node.get("type") == "Retry":
                break
        if node.get("type") != "Pod":
            raise NotFoundError(f"workflow {name!r}: step {step!r} has no pod "
                                f"(node type {node.get('type')!r})")
        pod = pod_name(obj, node)
        with self._boundary(f"reading the log of step {step!r} (pod {pod!r}) "
                            f"of workflow {name!r}"):
            text = self._core.read_namespaced_pod_log(pod, self.namespace,
                                                      container=MAIN_CONTAINER)
        return str(text)

    def utilization(self, name: str) -> list[StepSample]:
        """What the running steps of run ``name`` use now (see the module docstring); empty
        when the cluster exposes no pod metrics."""
        if not self._metrics.available:
            return []
        obj = self.get(name)
        nodes = _nodes(obj)
        shutdown = bool((obj.get("spec") or {}).get("shutdown"))
        samples = []
        for node in _step_nodes(obj):
            status = _step_status(node, nodes, shutdown)
            if status.state not in (StepState.RUNNING, StepState.RETRYING):
                continue
            pod_node = node
            if node.get("type") == "Retry" and node.get("children"):
                pod_node = nodes.get(node["children"][-1], node)
            if pod_node.get("type") != "Pod" or pod_node.get("phase") != "Running":
                continue
            usage = self._metrics.usage(pod_name(obj, pod_node), MAIN_CONTAINER)
            if usage is not None:
                samples.append(usage.sample(status.step, status.key, status.attempts))
        return samples

    # ------------------------------------------------------------------ control

    def cancel(self, name: str) -> None:
        """Terminate the run: merge-patch ``spec.shutdown: Terminate`` (as ``argo terminate``).

        Running pods are killed and no exit handler runs; the run ends Failed, reported
        as ``RunState.CANCELLED``.
        """
        with self._boundary(f"cancelling workflow {name!r}"):
            self._custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "workflows", name,
                {"spec": {"shutdown": "Terminate"}})

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


def _nodes(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    nodes = (obj.get("status") or {}).get("nodes") or {}
    return {str(k): dict(v) for k, v in nodes.items() if isinstance(v, Mapping)}


def _split(display: str) -> tuple[str, str]:
    m = _ITEM.match(display)
    return (m["step"], m["key"]) if m else (display, "")


def _step_nodes(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The nodes that stand for steps (see the module docstring), in start order."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    nodes = _nodes(obj)
    attempts = {c for n in nodes.values() if n.get("type") == "Retry"
                for c in n.get("children") or ()}
    boundaries = {nid for nid, n in nodes.items()
                  if nid == name or n.get("name") == name
                  or str(n.get("name", "")).endswith(".onExit")}
    out = []
    for nid, n in nodes.items():
        if nid in boundaries or nid in attempts or n.get("type") in _STRUCTURAL:
            continue
        boundary = n.get("boundaryID")
        if boundary and boundary not in boundaries:
            continue  # inside a nested DAG (wrapper or sub-workflow)
        out.append(n)
    out.sort(key=lambda n: (str(n.get("startedAt") or "~"), str(n.get("displayName", ""))))
    return out


def _find_step_node(obj: Mapping[str, Any], step: str, key: str) -> dict[str, Any] | None:
    for n in _step_nodes(obj):
        if _split(str(n.get("displayName") or n.get("name", ""))) == (step, key):
            return n
    return None


def _step_status(node: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]],
                 cancelled: bool) -> StepStatus:
    step, key = _split(str(node.get("displayName") or node.get("name", "")))
    phase = str(node.get("phase") or "")
    ntype = node.get("type")
    state = StepState.SKIPPED if ntype == "Skipped" else _NODE_PHASE.get(phase, StepState.PENDING)
    children = [nodes[c] for c in node.get("children") or () if c in nodes]
    if ntype == "Retry":
        attempts = len(children)
        if state is StepState.RUNNING and children and \
                children[-1].get("phase") in ("Failed", "Error"):
            state = StepState.RETRYING
    else:
        attempts = 1 if ntype == "Pod" and node.get("startedAt") else 0
    if state is StepState.SUCCEEDED and (node.get("memoizationStatus") or {}).get("hit"):
        state = StepState.CACHED
    if state is StepState.FAILED and cancelled:
        state = StepState.CANCELLED
    outputs_doc = node.get("outputs") or {}
    if not outputs_doc and ntype == "Retry" and children:
        outputs_doc = children[-1].get("outputs") or {}
    outputs = {str(p["name"]): str(p["value"]) for p in outputs_doc.get("parameters") or ()
               if isinstance(p, Mapping) and "name" in p and "value" in p}
    if "result" in outputs_doc and "result" not in outputs:
        outputs["result"] = str(outputs_doc["result"])
    exit_code: int | None = None
    with contextlib.suppress(TypeError, ValueError):
        exit_code = int(outputs_doc["exitCode"]) if "exitCode" in outputs_doc else None
    return StepStatus(step=step, state=state, key=key, attempts=attempts, exit_code=exit_code,
                      started_at=parse_time(node.get("startedAt")),
                      finished_at=parse_time(node.get("finishedAt")), outputs=outputs,
                      message=str(node.get("message") or ""))


def run_status(obj: Mapping[str, Any]) -> RunStatus:
    """Map an Argo ``Workflow`` object (plain data) to a :class:`RunStatus`."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    name = str(meta.get("name", ""))
    workflow = str(meta.get("generateName") or "").removesuffix("-") or name
    phase = str(status.get("phase") or "")
    state = _RUN_PHASE.get(phase, RunState.RUNNING)
    shutdown = bool((obj.get("spec") or {}).get("shutdown"))
    if shutdown and state is RunState.FAILED:
        state = RunState.CANCELLED
    nodes = _nodes(obj)
    steps = tuple(_step_status(n, nodes, shutdown) for n in _step_nodes(obj))
    return RunStatus(run_id=name, workflow=workflow, state=state, steps=steps,
                     started_at=parse_time(status.get("startedAt")),
                     finished_at=parse_time(status.get("finishedAt")),
                     message=str(status.get("message") or ""))


def _fnv32a(text: str) -> int:
    h = 0x811C9DC5
    for byte in text.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def pod_name(obj: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """The pod that ran ``node`` of the Workflow ``obj``, named as Argo v3.4+ names it."""
    meta = obj.get("metadata") or {}
    workflow = str(meta.get("name", ""))
    if (meta.get("annotations") or {}).get(POD_NAME_FORMAT) == "v1":
        return str(node["id"])
    node_name = str(node.get("name", ""))
    if node_name == workflow:
        return workflow
    prefix = workflow
    template = str(node.get("templateName") or "")
    if template:
        prefix = f"{workflow}-{template}"
    return f"{prefix[:_MAX_POD_PREFIX]}-{_fnv32a(node_name)}"
