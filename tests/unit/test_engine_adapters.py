"""Every engine adapter follows the EngineAdapter protocol (no sockets: nothing connects).

The runtime check (``isinstance`` on a constructed adapter) sees the methods; the
signatures are checked by mypy, in each adapter module (``_conforms``) and below. The
KFP adapter needs the kfp SDK to be constructed, which lives in ``.venv-kfp``: its
``isinstance`` check runs there (tests/integration/test_kfp_adapter.py).
"""

from __future__ import annotations

import json
import sys

import pytest

from couler.engines.base import EngineAdapter
from couler.errors import UserError
from couler_runtime.argo import ArgoAdapter
from couler_runtime.kfp import KfpAdapter
from couler_runtime.tekton import TektonAdapter


def as_engine_adapter(argo: ArgoAdapter, tekton: TektonAdapter,
                      kfp: KfpAdapter) -> list[EngineAdapter]:
    """Type-checked by mypy: each adapter is assignable to the protocol."""
    return [argo, tekton, kfp]


def test_kubernetes_adapters_are_engine_adapters() -> None:
    adapters = [ArgoAdapter("argo", host="http://127.0.0.1:9", token="t"),
                TektonAdapter("ci", host="http://127.0.0.1:9", token="t")]
    for adapter in adapters:
        assert isinstance(adapter, EngineAdapter), type(adapter).__name__
    assert not isinstance(object(), EngineAdapter)


def test_kfp_adapter_without_kfp_names_the_setup_script(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kfp", None)  # as in an environment without kfp
    with pytest.raises(UserError, match=r"scripts/setup-engine-venv\.sh kfp"):
        KfpAdapter("http://127.0.0.1:9")


class _ServerError(Exception):
    """What the generated API clients raise: an HTTP status, reason and JSON body."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(reason)
        self.status, self.reason, self.body = status, reason, body


@pytest.mark.parametrize(("status", "reason", "message", "refused"), [
    (413, "Request Entity Too Large", "", True),
    (500, "Internal Server Error", "etcdserver: request is too large", True),
    (400, "Bad Request", "grpc: received message larger than max (9000000 vs. 4194304)", True),
    (500, "Internal Server Error", "database is locked", False),
    (400, "Bad Request", "pipeline spec is invalid", False),
    (404, "Not Found", "too large", False),
])
def test_size_refusals_are_told_from_other_errors(status: int, reason: str, message: str,
                                                  refused: bool) -> None:
    """What Argo's (Kubernetes) and KFP's servers answer when a document is too large."""
    from kubernetes.client import ApiException

    from couler_runtime.kfp.adapter import _size_refusal
    from couler_runtime.kube import size_refusal

    body = json.dumps({"message": message}) if message else ""
    kfp = _size_refusal(_ServerError(status, reason, body))
    kube_error = ApiException(status=status, reason=reason)
    kube_error.body = body
    kube = size_refusal(kube_error)
    if not refused:
        assert kfp is None and kube is None
        return
    expected = f"{status} {reason}" + (f": {message}" if message else "")
    assert kfp == expected
    # the Kubernetes API has no gRPC gateway: its size answers are 413 and etcd's
    assert kube == (expected if "larger than max" not in message else None)
