"""The five services as docker-compose configures them, against the real PostgreSQL.

The environment each service gets is read from ``docker-compose.yml`` itself, as
``docker-compose config`` resolves it (the ``x-couler-env`` block merged into each
service's ``environment``, the variables of an operator's ``.env`` filled in:
``POSTGRES_PASSWORD``, the bus seeds, ...), and each compose
host (``nats:4222``, ``postgres:5432``, ``minio:9000``, ``otel-collector:4317``,
``generator:50051``, ``0.0.0.0:8080``, ...) replaced by a loopback address of a server this
test runs: a nats-server of its own (with the deployment's nkey identities), the suite's
PostgreSQL 15 and S3 server (local processes or containers: ``COULER_TEST_SERVERS``), and an
OTLP receiver in this process. The mounted paths (the trust file, the
state directory) become local files. Nothing else is changed: the URL scheme stays
``postgresql+psycopg://`` (the runtime's dependency on psycopg is what makes it load) and
the user is compose's ``couler``, on a database of its own.

Each service is started as the image starts it (``python -m couler_<name>.main``); the test
asserts that each one serves (its READY line, gRPC health SERVING), that the four with a
store migrated it in PostgreSQL to their head revision, and that real calls round-trip
through the stores: a run submitted and finished (the submitter's, the optimizer's, the
cache's and the monitor's tables all hold it), a workflow generated.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
import yaml
from alembic.script import ScriptDirectory
from grpc_health.v1 import health_pb2, health_pb2_grpc

from couler import ir
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState
from couler_runtime.service import parse_ready
from couler_runtime.store import current_revisions
from tests.containers import kinds
from tests.otlp import Receiver, otlp_receiver
from tests.servers import (
    PostgresServer,
    SeaweedS3,
    SecureNatsServer,
    free_port,
    make_root,
    stop_process,
    wait_until,
    with_death_signal,
)
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("generator", "optimizer", "cache", "submitter", "monitor")
STORES = ("optimizer", "cache", "submitter", "monitor")  # the generator keeps no database
DEADLINE = 120.0  # seconds a run may take here (a hang, not a timing)
_HOST = re.compile(r"\b([a-z][a-z0-9-]*|0\.0\.0\.0):(\d+)\b")


def compose_environment(variables: dict[str, str]) -> dict[str, dict[str, str]]:
    """Per service, the ``environment`` docker-compose gives it with ``variables`` (as in
    ``.env``): ``docker-compose config`` resolves the file (the ``<<: *couler-env`` merge,
    ``${VAR:?...}`` and ``${VAR:-default}``) without a Docker engine."""
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose is missing: scripts/test.sh installs it "
                    "(apt-get install docker-compose)", pytrace=False)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("COULER_", "POSTGRES_", "MINIO_"))}
    done = subprocess.run([binary, "-f", str(REPO / "docker-compose.yml"), "config"],
                          env={**clean, **variables}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    return {name: {k: str(v) for k, v in services[name]["environment"].items()}
            for name in SERVICES}


@dataclass
class Deployment:
    nats: SecureNatsServer
    postgres: PostgresServer
    s3: SeaweedS3
    database: str  # the database compose's `couler` user gets here
    otlp: str  # the receiver's endpoint
    receiver: Receiver
    root: Path
    ports: dict[str, int]  # compose host -> the loopback port standing for it
    token: str = field(default_factory=lambda: secrets.token_urlsafe(16))

    def loopback(self, value: str, service: str = "") -> str:
        """``value`` with every compose host:port replaced by its loopback stand-in (the
        metrics port, the same in every service's container, by ``service``'s own)."""
        def one(m: re.Match[str]) -> str:
            host, port = m.group(1), int(m.group(2))
            if host == "0.0.0.0":  # a service's own listening address: find whose port it is
                host = {50051: "generator", 50052: "optimizer", 50053: "cache",
                        50054: "submitter", 50055: "monitor", 8080: "dashboard",
                        9464: f"{service}-metrics"}[port]
            assert host in self.ports, f"a compose host the test does not stand in for: {host}"
            return f"127.0.0.1:{self.ports[host]}"

        return _HOST.sub(one, value)

    def variables(self) -> dict[str, str]:
        """What an operator's ``.env`` holds (``couler credentials init ./bus --env``)."""
        return {
            "POSTGRES_PASSWORD": "compose-password",
            "MINIO_ROOT_USER": self.s3.access_key, "MINIO_ROOT_PASSWORD": self.s3.secret_key,
            "COULER_AUTH_TOKEN": self.token,
            **{f"COULER_NATS_SEED_{n.upper()}": self.nats.files.identity(n).seed.decode()
               for n in (*SERVICES, "admin")},
        }

    def environment(self, service: str, compose: dict[str, str]) -> dict[str, str]:
        env: dict[str, str] = {}
        for key, raw in compose.items():
            value = self.loopback(raw, service)
            if key == "COULER_DATABASE_URL":
                url = sa.engine.make_url(value)
                assert url.drivername == "postgresql+psycopg", value  # compose's scheme
                value = url.set(database=self.database).render_as_string(hide_password=False)
            env[key] = value
        env["COULER_NATS_TRUST_FILE"] = str(self.nats.files.trust_file)  # the mounted file
        env["COULER_STATE_DIR"] = str(self.root / service)  # the image's volume
        return env


@pytest.fixture(scope="module")
def deployment(postgres_server: PostgresServer, s3_server: SeaweedS3) -> Iterator[Deployment]:
    """A fresh authenticated nats-server, a database owned by ``couler``, an OTLP receiver."""
    root = make_root("couler-compose-")
    nats: SecureNatsServer = kinds()["secure_nats"](root / "nats")
    admin = sa.create_engine(postgres_server.url, isolation_level="AUTOCOMMIT")
    database = f"couler_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        if not conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = 'couler'")).first():
            conn.execute(sa.text("CREATE ROLE couler LOGIN PASSWORD 'compose-password'"))
        conn.execute(sa.text(f'CREATE DATABASE "{database}" OWNER couler'))
    try:
        nats.start()
        with otlp_receiver() as (receiver, endpoint):
            port = int(endpoint.rsplit(":", 1)[1])
            ports = {"nats": nats.port, "postgres": postgres_server.port,
                     "minio": s3_server.port, "otel-collector": port,
                     **{n: free_port() for n in (*SERVICES, "dashboard")},
                     **{f"{n}-metrics": free_port() for n in SERVICES}}
            yield Deployment(nats, postgres_server, s3_server, database, endpoint, receiver,
                             root, ports)
    finally:
        nats.stop()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Running:
    deployment: Deployment
    env: dict[str, dict[str, str]]
    procs: dict[str, subprocess.Popen[bytes]]
    ready: dict[str, str]  # service -> its READY line

    def address(self, name: str) -> str:
        return self.env[name]["COULER_GRPC_ADDRESS"]

    def client(self) -> CoulerClient:
        token = self.env["submitter"]["COULER_AUTH_TOKEN"]
        return CoulerClient({n: self.address(n) for n in SERVICES}, token=token)


def _started(log: Path) -> bool:
    return bool(_ready_line(log))


def _ready_line(log: Path) -> str:
    return next((line for line in log.read_text(errors="replace").splitlines()
                 if parse_ready(line) is not None), "")


@pytest.fixture(scope="module")
def running(deployment: Deployment) -> Iterator[Running]:
    """The five services, each with the environment compose gives it."""
    compose = compose_environment(deployment.variables())
    envs = {n: deployment.environment(n, compose[n]) for n in SERVICES}
    base = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    base["OTEL_BSP_SCHEDULE_DELAY"] = "200"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ready: dict[str, str] = {}
    try:
        for name in SERVICES:
            log = deployment.root / f"{name}.log"
            with log.open("wb") as out:
                procs[name] = subprocess.Popen(
                    with_death_signal([sys.executable, "-m", f"couler_{name}.main"]),
                    env={**base, **envs[name]}, stdout=out, stderr=subprocess.STDOUT,
                    cwd=deployment.root, start_new_session=True)
        for name in SERVICES:
            log = deployment.root / f"{name}.log"
            wait_until(name, functools.partial(_started, log), procs[name], log, timeout=60)
            ready[name] = _ready_line(log)
        yield Running(deployment, envs, procs, ready)
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                stop_process(proc)


def test_the_compose_settings_are_taken_as_they_are(running: Running) -> None:
    env = running.env["submitter"]
    assert env["COULER_AUTH_TOKEN"] == running.deployment.token
    assert env["COULER_DATABASE_URL"].startswith(
        f"postgresql+psycopg://couler:compose-password@127.0.0.1:"
        f"{running.deployment.postgres.port}/couler_")
    assert env["COULER_ARTIFACTS"] == "s3://couler-artifacts"
    assert env["COULER_S3_ENDPOINT"] == running.deployment.s3.endpoint
    assert env["COULER_OTEL_ENDPOINT"] == running.deployment.otlp
    assert env["COULER_NATS_SEED"] == running.deployment.nats.files.identity(
        "submitter").seed.decode()
    assert "COULER_BUS_INSECURE" not in env  # the bus is authenticated, as deployed


def test_every_service_serves_and_answers_health(running: Running) -> None:
    for name in SERVICES:
        assert running.procs[name].poll() is None, name
        ready = parse_ready(running.ready[name])
        assert ready is not None and (ready.service, ready.address) == (
            name, running.address(name))
        with grpc.insecure_channel(running.address(name)) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, name


def _heads(service: str) -> tuple[str, ...]:
    module = __import__(f"couler_{service}.migrations", fromlist=["_"])
    return tuple(ScriptDirectory(str(Path(module.__file__).parent)).get_heads())


def test_each_store_is_migrated_in_postgres(running: Running) -> None:
    url = running.env["submitter"]["COULER_DATABASE_URL"]
    for service in STORES:
        heads = _heads(service)
        assert heads, service
        assert set(current_revisions(url, service)) == set(heads), service


def _rows(url: str, sql: str, **params: Any) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(sql), params))
    finally:
        engine.dispose()


def test_a_run_round_trips_through_every_store(running: Running) -> None:
    name = f"compose-{uuid.uuid4().hex[:8]}"
    out = (ir.OutputParameter("said", source=ir.OutputSource.STDOUT),)
    wf = ir.Workflow(name=name, steps=(ir.Step(name="hello", outputs=out, body=ir.ScriptSpec(
        image="python:3.12-alpine", source="print('hello from compose')")),))
    client = running.client()
    try:
        sub = client.submitter.submit(wf)
        run = client.submitter.wait(sub.run_id, timeout=DEADLINE)
        assert run.state is RunState.SUCCEEDED, run.message
        assert run.steps[0].outputs["said"].strip() == "hello from compose"
        generated = client.generator.generate(
            "train an XGBoost model on data.csv and evaluate it")
        assert generated.workflow.steps
    finally:
        client.close()
    url = running.env["submitter"]["COULER_DATABASE_URL"]
    assert _rows(url, "SELECT state FROM submitter_runs WHERE run_id = :r", r=sub.run_id) == [
        ("succeeded",)]
    assert _rows(url, "SELECT count(*) FROM optimizer_plans WHERE run_id = :r",
                 r=sub.run_id)[0][0] >= 1
    eventually(lambda: bool(_rows(url, "SELECT 1 FROM cache_entries WHERE workflow = :w",
                                  w=name)), "the cache's entry for the step, in PostgreSQL")
    eventually(lambda: _rows(url, "SELECT state FROM monitor_runs WHERE run_id = :r",
                             r=sub.run_id) == [("succeeded",)],
               "the monitor's record of the finished run, in PostgreSQL")


def test_the_services_export_traces_to_compose_s_collector_address(
        running: Running) -> None:
    """``COULER_OTEL_ENDPOINT`` (compose: ``http://otel-collector:4317``) reaches them."""
    receiver = running.deployment.receiver
    eventually(lambda: {"submitter", "optimizer", "monitor"} <= {
        s.service for s in receiver.spans()}, "spans from the services")
