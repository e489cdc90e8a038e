"""``couler credentials init`` and ``couler bus setup``: a deployment's bus, from the CLI.

``credentials init DIR`` writes the credential directory (and with ``--env`` prints the
``.env`` lines docker-compose.yml reads, with ``--kubernetes`` the objects deploy/k8s
references); ``bus setup`` -- the one-shot job before the services -- creates the streams
as the admin on a real nats-server that has none yet, with the seed given as a file or
(docker-compose, Kubernetes) as ``COULER_NATS_SEED``, with and without TLS.
"""

from __future__ import annotations

import asyncio
import io
import stat
from pathlib import Path

import nats.js.errors
import pytest
import yaml

from couler.cli import main
from couler_runtime.bus_access import STREAMS
from couler_runtime.bus_keys import BusFiles
from tests.servers import NatsServer, SecureNatsServer


class _Bare(SecureNatsServer):
    """The deployment's nats-server before its bus-setup job: no streams."""

    def start(self) -> None:
        NatsServer.start(self)


def _couler(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_credentials_init_prints_the_env_lines_and_writes_the_kubernetes_objects(
        tmp_path: Path) -> None:
    where = tmp_path / "bus"
    code, out, err = _couler("credentials", "init", str(where), "--env", "--kubernetes",
                             "--tls", "--host", "nats")
    assert code == 0, err
    files = BusFiles(where)
    assert out.splitlines() == files.env_lines()  # nothing else: `... --env >> .env`
    assert f"kubectl apply -f {where / 'kubernetes.yaml'}" in err
    docs = list(yaml.safe_load_all((where / "kubernetes.yaml").read_text()))
    assert docs == files.kubernetes_objects()
    for path in [where, *where.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    again = _couler("credentials", "init", str(where), "--env")
    assert again[1].splitlines() == files.env_lines()  # existing keys are kept


@pytest.mark.parametrize("tls", [False, True])
def test_bus_setup_creates_the_streams_as_the_admin(
        tmp_path: Path, tls: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _Bare(tmp_path, tls=tls)
    server.start()
    try:
        for name in ("COULER_NATS_SEED", "COULER_NATS_SEED_FILE", "COULER_NATS_TLS_CA"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("COULER_NATS_URL", server.url)
        if tls:
            assert server.files.tls is not None
            monkeypatch.setenv("COULER_NATS_TLS_CA", str(server.files.tls.ca))
            monkeypatch.setenv("COULER_NATS_SEED_FILE", str(server.files.seed_file("admin")))
        else:  # the seed itself, as docker-compose and the Kubernetes job give it
            monkeypatch.setenv("COULER_NATS_SEED", server.files.identity("admin").seed.decode())

        async def streams() -> set[str]:
            bus = await server.bus("admin")
            try:
                found = set()
                for spec in STREAMS:
                    try:
                        await bus._js.stream_info(spec.name)
                        found.add(spec.name)
                    except nats.js.errors.NotFoundError:
                        continue
                return found
            finally:
                await bus.close()

        assert asyncio.run(streams()) == set()
        code, out, err = _couler("bus", "setup", "--timeout", "10")
        assert code == 0, err
        assert out.strip() == "streams ready: " + ", ".join(s.name for s in STREAMS)
        assert asyncio.run(streams()) == {s.name for s in STREAMS}
    finally:
        server.stop()


def test_bus_setup_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("COULER_NATS_URL", "COULER_NATS_SEED", "COULER_NATS_SEED_FILE"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = _couler("bus", "setup")
    assert code == 2 and "COULER_NATS_URL (or --url) is required" in err
    monkeypatch.setenv("COULER_NATS_URL", "nats://127.0.0.1:4222")
    code, _, err = _couler("bus", "setup")
    assert code == 2 and "COULER_NATS_SEED_FILE (or --seed-file), or COULER_NATS_SEED" in err
    monkeypatch.setenv("COULER_NATS_SEED", "not-a-seed")
    code, _, err = _couler("bus", "setup")
    assert code == 2 and "COULER_NATS_SEED: not an nkey seed" in err
