"""Helpers the Kubernetes-based adapters share (Argo, Tekton): errors, config, labels, times."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, NoReturn

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as _k8s_config

from couler.errors import ConflictError, NotFoundError, RetryableError, UserError
from couler_runtime.polling import parse_time

# Parts of the client without annotations: kept as ``Any`` here, at the boundary.
k8s_config: Any = _k8s_config

__all__ = ["CONNECTION_ERRORS", "LABEL_VALUE", "api_client_for", "as_mapping", "items_of",
           "label_value", "load_config", "parse_time", "raise_api_error", "size_refusal"]

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
