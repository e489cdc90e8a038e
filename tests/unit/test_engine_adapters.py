"""Every engine adapter follows the EngineAdapter protocol (no sockets: nothing connects).

The runtime check (``isinstance`` on a constructed adapter) sees the methods; the
signatures are checked by mypy, in each adapter module (``_conforms``) and below. The
KFP adapter needs the kfp SDK to be constructed, which lives in ``.venv-kfp``: its
``isinstance`` check runs there (tests/integration/test_kfp_adapter.py).
"""

from __future__ import annotations

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
