"""Which servers the suite runs (``COULER_TEST_SERVERS``) and what a container would get.

The Docker branch (``tests/containers.py``) is not run where the suite was developed (no
Docker daemon there); what it would start is checked here without one: the image is the one
``docker-compose.yml`` deploys, the command is the local server's, and every port is
published on 127.0.0.1 only.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.containers import (
    DockerMinio,
    DockerNats,
    DockerPostgres,
    DockerSecureNats,
    choose,
    docker_reachable,
    kinds,
)
from tests.servers import NatsServer, PostgresServer, SeaweedS3, SecureNatsServer

REPO = Path(__file__).resolve().parents[2]


def _never() -> bool:
    raise AssertionError("local needs no daemon: nothing is asked")


def test_local_is_local_without_asking_docker() -> None:
    assert choose("local", _never) == "local"
    assert choose(" LOCAL ", _never) == "local"


@pytest.mark.parametrize(("choice", "reachable", "chosen"), [
    ("auto", True, "docker"), ("auto", False, "local"), (None, True, "docker"),
    (None, False, "local"), ("", False, "local"), ("docker", True, "docker"),
])
def test_auto_takes_docker_when_a_daemon_answers(choice: str | None, reachable: bool,
                                                 chosen: str) -> None:
    assert choose(choice, lambda: reachable) == chosen


def test_docker_without_a_daemon_and_unknown_values_are_refused() -> None:
    with pytest.raises(RuntimeError, match="COULER_TEST_SERVERS=docker, but no Docker daemon"):
        choose("docker", lambda: False)
    with pytest.raises(ValueError, match="expected one of auto, docker, local"):
        choose("podman", lambda: True)


@pytest.fixture
def fake_daemon() -> Iterator[str]:
    """An HTTP server answering what a Docker daemon answers to a ping: its address."""
    class Daemon(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith("/_ping"):
                body = b"OK"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Daemon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_daemon_probe_pings_docker_host(fake_daemon: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", fake_daemon)
    assert docker_reachable()
    assert choose("auto", docker_reachable) == "docker"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-daemon.sock'}")
    assert not docker_reachable()
    assert choose("auto", docker_reachable) == "local"
    with socket.socket() as taken:  # something listens that is not a daemon
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{taken.getsockname()[1]}")
        assert not docker_reachable(timeout=0.5)


def test_each_fixture_has_a_local_and_a_container_kind_of_one_interface() -> None:
    assert kinds("local") == {"nats": NatsServer, "secure_nats": SecureNatsServer,
                              "postgres": PostgresServer, "s3": SeaweedS3}
    docker = kinds("docker")
    assert docker == {"nats": DockerNats, "secure_nats": DockerSecureNats,
                      "postgres": DockerPostgres, "s3": DockerMinio}
    for name, local in kinds("local").items():
        assert issubclass(docker[name], local), name


def _compose_images() -> dict[str, str]:
    doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return {name: svc["image"] for name, svc in doc["services"].items() if "image" in svc}


def test_containers_run_compose_s_images_on_loopback(tmp_path: Path) -> None:
    images = _compose_images()
    (tmp_path / "n").mkdir()
    nats = DockerSecureNats(tmp_path / "n", tls=True)
    spec = nats.spec()
    assert spec.image == images["nats"]
    local = SecureNatsServer.argv(nats)[1:]
    assert spec.command[spec.command.index("-a") + 1] == "0.0.0.0"  # inside the container
    assert [a for a in spec.command if a != "0.0.0.0"] == [a for a in local if a != "127.0.0.1"]
    assert spec.command[:2] == ["-c", str(nats.files.config)]
    assert spec.ports == {nats.port: ("127.0.0.1", nats.port),
                          nats.monitor_port: ("127.0.0.1", nats.monitor_port)}
    assert spec.volumes == {str(tmp_path / "n"): str(tmp_path / "n")}  # config, TLS, store
    assert nats.url.startswith("tls://127.0.0.1:")

    pg = DockerPostgres(tmp_path)
    assert pg.spec().image == images["postgres"]
    assert pg.spec().ports == {5432: ("127.0.0.1", pg.port)}
    assert pg.url == f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/postgres"

    s3 = DockerMinio(tmp_path)
    assert s3.spec().image == images["minio"]
    assert s3.spec().ports == {9000: ("127.0.0.1", s3.port)}
    assert s3.spec().env == {"MINIO_ROOT_USER": s3.access_key,
                             "MINIO_ROOT_PASSWORD": s3.secret_key}
    assert not (nats.running or pg.running or s3.running)
