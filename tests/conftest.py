"""Shared pytest configuration."""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from tests.containers import CHOICE, kinds
from tests.servers import NatsServer, PostgresServer, SeaweedS3, SecureNatsServer, make_root


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite tests/golden/expected from the current compiler output (never in CI)",
    )


def pytest_report_header(config: pytest.Config) -> str:
    choice = os.environ.get(CHOICE) or "auto"
    return (f"test servers: {CHOICE}={choice}; chosen when a fixture first needs one "
            "(auto: containers when a Docker daemon answers, else local processes)")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    update = bool(request.config.getoption("--update-goldens"))
    if update and os.environ.get("CI"):
        pytest.fail("--update-goldens is refused under CI: goldens change only on request")
    return update


# --- real servers for tests/integration, each started only when a test asks: local processes
# (tests/servers.py) or containers (tests/containers.py), as COULER_TEST_SERVERS chooses
# (auto: containers when a Docker daemon answers); the same interface either way


class _Server(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=_Server)


def _running(kind: Callable[[Path], S], prefix: str) -> Iterator[S]:
    """Start a server in a fresh directory, yield it, stop it and remove the directory."""
    root = make_root(prefix)
    server = kind(root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    """nats-server with JetStream (file store); ``.url``, ``.restart()`` keeps the store."""
    yield from _running(kinds()["nats"], "couler-nats-")


@pytest.fixture(scope="session")
def secure_nats() -> Iterator[SecureNatsServer]:
    """nats-server with the deployment's nkey identities and permissions; streams made."""
    yield from _running(kinds()["secure_nats"], "couler-snats-")


@pytest.fixture(scope="session")
def secure_nats_tls() -> Iterator[SecureNatsServer]:
    """The same, with TLS (the deployment's own CA)."""
    yield from _running(functools.partial(kinds()["secure_nats"], tls=True), "couler-tnats-")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL 15 cluster on 127.0.0.1."""
    yield from _running(kinds()["postgres"], "couler-pg-")


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """``postgresql+psycopg://`` URL of the session's throwaway cluster."""
    return postgres_server.url


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedS3]:
    """SeaweedFS S3 on 127.0.0.1: ``.endpoint``, ``.access_key``, ``.secret_key``."""
    yield from _running(kinds()["s3"], "couler-s3-")
