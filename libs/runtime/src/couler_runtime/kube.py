"""Helpers the Kubernetes-based adapters share (Argo, Tekton): errors, config, labels, times,
and what running pods use (:class:`PodMetrics`, the ``metrics.k8s.io`` API)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as _k8s_config

from couler.engines.base import StepSample
from couler.errors import ConflictError, NotFoundError, RetryableError, UserError
from couler.ir import parse_quantity
from couler_runtime.polling import parse_time

# Parts of the client without annotations: kept as ``Any`` here, at the boundary.
k8s_config: Any = _k8s_config

__all__ = ["CONNECTION_ERRORS", "DEFAULT_RETRY", "LABEL_VALUE", "METRICS_GROUP",
           "METRICS_VERSION", "PodMetrics", "PodUsage", "RetryPolicy", "Retrying",
           "api_client_for", "as_mapping", "items_of", "label_value", "load_config",
           "parse_time", "raise_api_error", "retry_delay", "size_refusal", "watch_gone"]

log = logging.getLogger(__name__)

METRICS_GROUP = "metrics.k8s.io"
METRICS_VERSION = "v1beta1"
METRICS_RETRY_SECONDS = 300.0  # a cluster without the metrics API is asked again after this

LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


CONNECTION_ERRORS = (urllib3.exceptions.HTTPError, OSError)


# How the API server says a request was too large: 413 from its own request-size limit, and
# etcd's "request is too large" (a 500 on create) from the object-size limit.
_TOO_LARGE = ("request is too large", "request entity too large", "too large")


def size_refusal(e: BaseException | None) -> str | None:
    """The API server's answer when ``e`` refused a request for its size, else None."""
    if not isinstance(e, k8s_client.ApiException):
        return None
    status = e.status if isinstance(e.status, int) else 0
    detail = ""
    if e.body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            detail = str(json.loads(e.body).get("message", ""))[:300]
    text = f"{detail} {e.reason or ''}".lower()
    if status == 413 or (status in (400, 422, 500) and any(t in text for t in _TOO_LARGE)):
        return f"{status} {e.reason or ''}".rstrip() + (f": {detail}" if detail else "")
    return None


def raise_api_error(e: Exception, action: str, *, echo: bool = True,
                    namespace: str = "") -> NoReturn:
    """Raise the Couler error for a Kubernetes client error ``e`` during ``action``."""
    if not isinstance(e, k8s_client.ApiException):
        raise RetryableError(f"{action}: cannot reach the Kubernetes API "
                             f"({type(e).__name__}: {e})") from e
    status = e.status if isinstance(e.status, int) else 0
    detail = ""
    if echo and e.body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            detail = str(json.loads(e.body).get("message", ""))[:300]
    message = f"{action}: the Kubernetes API answered {status} {e.reason or ''}".rstrip()
    if status == 404:
        where = f" in namespace {namespace!r}" if namespace else ""
        raise NotFoundError(f"{action}: not found{where}") from e
    if detail:
        message += f": {detail}"
    if status == 409:
        raise ConflictError(message) from e
    if status in (401, 403):
        raise UserError(message + " (check the bearer token and its RBAC permissions)") from e
    if status >= 500 or status in {0, 429}:
        raise RetryableError(message) from e
    raise UserError(message) from e


# --------------------------------------------------------------------------- retries


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How an adapter sends a request again after a transient refusal.

    Attributes:
        attempts: Tries in all, the first included (1: never again).
        base_seconds: The first back-off; doubled after each further failure.
        max_seconds: The longest wait, also the cap on a server's ``Retry-After``.
        sleep: How to wait (tests pass a recorder).
    """

    attempts: int = 4
    base_seconds: float = 0.5
    max_seconds: float = 30.0
    sleep: Callable[[float], None] = time.sleep

    def backoff(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (1-based)."""
        return min(self.base_seconds * 2.0 ** max(failures - 1, 0), self.max_seconds)


DEFAULT_RETRY = RetryPolicy()


def _retry_after(e: Any) -> float | None:
    """The ``Retry-After`` seconds of an answer (header, else the Status body's
    ``details.retryAfterSeconds``), or None."""
    headers = getattr(e, "headers", None) or {}
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        value = headers.get("Retry-After")
        if value is not None:
            return max(float(value), 0.0)
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        seconds = (json.loads(e.body).get("details") or {}).get("retryAfterSeconds")
        if seconds is not None:
            return max(float(seconds), 0.0)
    return None


def _generated_name(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether a create's body asks the server to generate the name (``generateName``,
    no ``name``)."""
    body = kwargs.get("body", args[-1] if args else None)
    meta = body.get("metadata") if isinstance(body, Mapping) else None
    return isinstance(meta, Mapping) and bool(meta.get("generateName")) and \
        not meta.get("name")


def retry_delay(e: BaseException, failures: int, policy: RetryPolicy, *,
                idempotent: bool = True, generated_name: bool = False) -> float | None:
    """How long to wait before sending again the request ``e`` refused (the
    ``failures``-th failure in a row), or None when it must not be sent again as it is.

    Sent again: 429 (API Priority and Fairness refused it before any work; its
    ``Retry-After`` is honoured, capped at ``policy.max_seconds``); 5xx and connection
    trouble when the request is ``idempotent`` (a create is not: it may have been done)
    and not refused for its size; 409 on a create with ``generateName`` (the server could
    not generate a free name; nothing was created). Never beyond ``policy.attempts``.
    """
    if failures >= policy.attempts:
        return None
    if not isinstance(e, k8s_client.ApiException):
        return policy.backoff(failures) if idempotent and isinstance(
            e, CONNECTION_ERRORS) else None
    status = e.status if isinstance(e.status, int) else 0
    if status == 429 or (status == 409 and generated_name):
        after = _retry_after(e)
        return policy.backoff(failures) if after is None else min(after, policy.max_seconds)
    if (status >= 500 or status == 0) and idempotent and size_refusal(e) is None:
        return policy.backoff(failures)
    return None


class Retrying:
    """A ``kubernetes`` API object whose calls are sent again after a transient refusal
    (:func:`retry_delay`): ``create_*`` calls count as not idempotent, every other call
    (read, list, replace with a ``resourceVersion``, merge patch) as idempotent. The last
    error is raised as the client raised it, for the adapter's boundary to translate.
    A watch's own stream is not retried here (the adapters' watch loops reconnect)."""

    def __init__(self, api: Any, policy: RetryPolicy = DEFAULT_RETRY) -> None:
        self._api = api
        self.policy = policy

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._api, name)
        if not callable(target) or name.startswith("_"):
            return target
        idempotent = not name.startswith("create_")
        policy = self.policy

        @functools.wraps(target)
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("watch") or kwargs.get("_preload_content") is False:
                return target(*args, **kwargs)  # a stream: its loop reconnects
            generated = not idempotent and _generated_name(args, kwargs)
            failures = 0
            while True:
                try:
                    return target(*args, **kwargs)
                except (k8s_client.ApiException, *CONNECTION_ERRORS) as e:
                    failures += 1
                    delay = retry_delay(e, failures, policy, idempotent=idempotent,
                                        generated_name=generated)
                    if delay is None:
                        raise
                    log.info("%s: the Kubernetes API answered %s; sending it again in "
                             "%.1f s (attempt %d of %d)", name, getattr(e, "status", e),
                             delay, failures + 1, policy.attempts)
                    policy.sleep(delay)

        return call


def watch_gone(e: BaseException) -> bool:
    """Whether a watch failed because its ``resourceVersion`` is too old (410 Gone, as an
    answer or a watch ``ERROR`` event): the watcher must list again and resume from the
    listed version."""
    return isinstance(e, k8s_client.ApiException) and e.status == 410


def load_config(config_file: str | None, context: str | None) -> Any:
    cfg: Any = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config(config_file=config_file, context=context,
                                    client_configuration=cfg)
    except (k8s_config.ConfigException, OSError, TypeError):
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
        except k8s_config.ConfigException as e:
            raise UserError("no Kubernetes configuration found: set KUBECONFIG, pass "
                            "config_file=, host=/token=, or run inside a cluster") from e
    return cfg


def label_value(key: str) -> str:
    if key and len(key) <= 63 and LABEL_VALUE.fullmatch(key):
        return key
    return "sha256-" + hashlib.sha256(key.encode()).hexdigest()[:56]


def as_mapping(obj: object) -> dict[str, Any]:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise RetryableError(f"the Kubernetes API returned {type(obj).__name__}, not an object")


def items_of(obj: object) -> list[dict[str, Any]]:
    items = as_mapping(obj).get("items") or []
    return [dict(i) for i in items if isinstance(i, Mapping)]


def api_client_for(api_client: object = None, configuration: object = None, *,
                   host: str | None = None, token: str | None = None,
                   verify_ssl: bool = True, ca_cert: str | None = None,
                   config_file: str | None = None, context: str | None = None) -> Any:
    """The ``kubernetes`` ApiClient an adapter uses, from the first of: a ready client; a
    ``Configuration``; ``host`` (+ bearer ``token``, ``verify_ssl``, ``ca_cert``); the kube
    config (``config_file``, ``context``); the in-cluster configuration."""
    if api_client is not None:
        return api_client
    cfg: Any = configuration
    if cfg is None and host is not None:
        cfg = k8s_client.Configuration(host=host)
        if token is not None:
            cfg.api_key = {"authorization": f"Bearer {token}"}
        cfg.verify_ssl = verify_ssl
        if ca_cert is not None:
            cfg.ssl_ca_cert = ca_cert
    if cfg is None:
        cfg = load_config(config_file, context)
    return k8s_client.ApiClient(cfg)


# --------------------------------------------------------------------------- pod metrics


@dataclass(frozen=True, slots=True)
class PodUsage:
    """What a pod's containers use, as the metrics API reports it.

    Attributes:
        at: When it was measured (the end of the window), seconds since the epoch.
        window_seconds: The window the CPU use is averaged over (metrics-server: 10-60 s).
        cpu: Average cores over the window, summed over the containers.
        memory_bytes: The containers' working set, summed.
    """

    at: float
    window_seconds: float
    cpu: float
    memory_bytes: int

    def sample(self, step: str, key: str = "", attempt: int = 1) -> StepSample:
        """As the sample of one step execution."""
        return StepSample(step=step, at=self.at, cpu=self.cpu, memory_bytes=self.memory_bytes,
                          key=key, attempt=max(attempt, 1),
                          interval_seconds=self.window_seconds)


def _window(text: object) -> float:
    """A metrics window ("30s", "1m0.5s", "15.2s") in seconds; 0 when unreadable."""
    total, found = 0.0, False
    for number, unit in re.findall(r"([0-9]+(?:\.[0-9]*)?)(ms|us|µs|ns|h|m|s)", str(text or "")):
        total += float(number) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6,
                                  "µs": 1e-6, "ns": 1e-9}[unit]
        found = True
    return total if found else 0.0


def pod_usage(obj: Mapping[str, Any], container: str = "") -> PodUsage | None:
    """The usage in a ``PodMetrics`` object: of ``container`` when it is listed (the step's
    own, not the engine's sidecars), else of all containers summed; None when there is no
    readable usage."""
    at = parse_time(obj.get("timestamp"))
    containers = [c for c in obj.get("containers") or () if isinstance(c, Mapping)]
    if container and any(c.get("name") == container for c in containers):
        containers = [c for c in containers if c.get("name") == container]
    cpu, memory, seen = 0.0, 0, False
    for c in containers:
        usage = c.get("usage") or {}
        if not isinstance(usage, Mapping):
            continue
        try:
            if "cpu" in usage:
                cpu += float(parse_quantity(str(usage["cpu"])))
                seen = True
            if "memory" in usage:
                memory += int(parse_quantity(str(usage["memory"])))
                seen = True
        except (ValueError, ArithmeticError):
            continue
    if not seen or at is None:
        return None
    return PodUsage(at=at, window_seconds=_window(obj.get("window")), cpu=max(cpu, 0.0),
                    memory_bytes=max(memory, 0))


class PodMetrics:
    """Reads ``/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods/{pod}`` for an adapter.

    Where the cluster has no metrics API (404 on the API itself) or the adapter may not
    read it (403), :meth:`usage` returns None, says so once in the log (naming the namespace
    and what to install or grant), and does not ask again for
    :data:`METRICS_RETRY_SECONDS`; a pod the metrics server has not measured yet (404 on
    the pod) is None too. Neither is an error: utilization is best effort.

    Args:
        custom: A ``kubernetes.client.CustomObjectsApi``.
        namespace: The pods' namespace.
        clock: Monotonic seconds (tests pin it).
    """

    def __init__(self, custom: Any, namespace: str, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._custom = custom
        self.namespace = namespace
        self._clock = clock
        self._lock = threading.Lock()
        self._off_until = 0.0
        self._said: set[str] = set()

    @property
    def available(self) -> bool:
        """Whether the API is worth asking now (not refused lately)."""
        return self._clock() >= self._off_until

    def usage(self, pod: str, container: str = "") -> PodUsage | None:
        """What ``pod`` (its ``container``, when listed) uses now, or None (see the class
        docstring).

        Raises:
            RetryableError: The API server is away (5xx, connection trouble).
        """
        if not pod or not self.available:
            return None
        try:
            obj = self._custom.get_namespaced_custom_object(
                METRICS_GROUP, METRICS_VERSION, self.namespace, "pods", pod)
        except k8s_client.ApiException as e:
            status = e.status if isinstance(e.status, int) else 0
            if status in (401, 403) or (status == 404 and not _pod_missing(e)):
                self._refused(status)
                return None
            if status == 404:
                return None  # not measured yet (a new pod) or already gone
            raise_api_error(e, f"reading the metrics of pod {pod!r}", namespace=self.namespace)
        except CONNECTION_ERRORS as e:
            raise_api_error(e, f"reading the metrics of pod {pod!r}")
        return pod_usage(as_mapping(obj), container)

    def _refused(self, status: int) -> None:
        with self._lock:
            self._off_until = self._clock() + METRICS_RETRY_SECONDS
            if str(status) in self._said:
                return
            self._said.add(str(status))
        if status == 404:
            log.warning("namespace %r: the cluster serves no pod metrics (%s/%s answered 404): "
                        "no utilization is recorded for its steps; install metrics-server to "
                        "get it", self.namespace, METRICS_GROUP, METRICS_VERSION)
        else:
            log.warning("namespace %r: reading pod metrics (%s/%s) was refused (%d): no "
                        "utilization is recorded for its steps; grant get on pods.%s to get "
                        "it", self.namespace, METRICS_GROUP, METRICS_VERSION, status,
                        METRICS_GROUP)


def _pod_missing(e: Any) -> bool:
    """Whether a 404 is about the pod (its metrics not there yet), not the API: the metrics
    server answers ``podmetrics.metrics.k8s.io "ns/pod" not found``."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        body = json.loads(e.body)
        details = body.get("details") or {}
        if details.get("kind") == "pods" or "podmetrics" in str(body.get("message", "")):
            return True
    return False
