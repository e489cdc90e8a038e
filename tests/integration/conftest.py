"""Integration tests run one service's logic against real servers, on an open bus.

A service refuses to start without its bus identity unless ``COULER_BUS_INSECURE`` says
otherwise (the default everywhere Couler is deployed). These tests exercise what a service
does with the messages it gets; what the identities, permissions and signatures allow is
tested on a secured server in ``test_bus_security.py``, and on the real stack in
``tests/e2e`` and ``tests/security``. Fixtures that start a service for a whole module pass
``bus_insecure=True`` themselves (a function-scoped setting would not reach them).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.rpc_fixtures import loop, serve  # noqa: F401  (fixtures)


@pytest.fixture(autouse=True)
def open_bus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COULER_BUS_INSECURE", "true")




@pytest.fixture(scope="session")
def ml_python() -> Path:
    """.venv-ml's interpreter (the catalog's tabular libraries), made by the setup script
    when absent (idempotent)."""
    root = Path(__file__).resolve().parents[2]
    subprocess.run([str(root / "scripts" / "setup-ml-venv.sh")], check=True, timeout=900)
    return root / ".venv-ml" / "bin" / "python"
