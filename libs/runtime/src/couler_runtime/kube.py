"""Helpers the Kubernetes-based adapters share (Argo, Tekton): errors, config, labels, times."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NoReturn

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as _k8s_config

from couler.errors import ConflictError, NotFoundError, RetryableError, UserError

# Parts of the client without annotations: kept as ``Any`` here, at the boundary.
k8s_config: Any = _k8s_config

__all__ = ["CONNECTION_ERRORS", "LABEL_VALUE", "as_mapping", "items_of", "label_value",
           "load_config", "parse_time", "raise_api_error"]

LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


CONNECTION_ERRORS = (urllib3.exceptions.HTTPError, OSError)


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


def parse_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
