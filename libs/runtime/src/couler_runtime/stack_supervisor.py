"""The supervisor process of the embedded stack: ``python -m couler_runtime.stack_supervisor``.

:func:`couler_runtime.stack.up` starts it, detached, with the home's lock (which it holds for
its life) and the stack's record in ``<home>/stack.json``. It runs the stack's programs
under a :class:`~couler_runtime.supervisor.Supervisor`:

* ``nats``: ``nats-server -c <home>/bus/nats.conf`` with JetStream in ``<home>/jetstream``,
  on 127.0.0.1 and the port it chose the first time; ready once it has written its ports
  file and the ``admin`` identity has created the streams (:func:`create_streams`);
* each service: ``python -m couler_<name>.main`` with its own bus identity and the address
  it had before (port 0 the first time); ready on its READY line. A service starts once NATS
  runs (the optimizer also once the cache's address is known).

It adopts the processes recorded that still run, saves the records at every change, and
answers ``restart`` and ``stop`` on ``<home>/supervisor.sock``; ``stop`` (or SIGTERM)
stops the services, then NATS, and ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from couler.errors import UserError
from couler_runtime.bus_keys import BusFiles
from couler_runtime.service import parse_ready

# The stack's internals, shared with the process that runs it.
from couler_runtime.stack import (
    _CALLS,
    _READY_TIMEOUT,
    _SOCKET,
    _STATE,
    _STOP_GROUPS,
    PROCESSES,
    SERVICES,
    StackInfo,
    _marker,
    _nats_binary,
    _private_dir,
    _read,
    _save,
    create_streams,
)
from couler_runtime.supervisor import (
    RESTARTING,
    RUNNING,
    STOPPED,
    Child,
    ControlServer,
    Launch,
    Program,
    StartFailed,
    Supervisor,
    start_time,
)

__all__ = ["supervise"]

log = logging.getLogger(__name__)


class _StackPrograms:
    """The programs of the stack in one home, as the supervisor runs them."""

    def __init__(self, home: Path, info: StackInfo, environ: Mapping[str, str]) -> None:
        self.home = home
        self.info = info
        self.files = BusFiles(home / "bus")
        self.base = dict(environ)  # what `up` gave the supervisor: every service's part
        self.ports_dir = home / "nats"
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nats-admin")
        self._setup: tuple[int, Future[str]] | None = None  # (nats pid, admin's work)

    def programs(self) -> list[Program]:
        logs = self.home / "logs"
        nats_program = Program("nats", logs / "nats.log", self._nats_launch, self._nats_ready,
                               marker=_marker("nats"))
        services = [Program(name, logs / f"{name}.log", self._launcher(name),
                            self._ready_line(name), self._blocker(name), marker=_marker(name))
                    for name in SERVICES]
        return [nats_program, *services]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- nats

    def _nats_launch(self) -> Launch:
        _private_dir(self.ports_dir)
        for stale in self.ports_dir.glob("*.ports"):  # a killed server leaves its file
            stale.unlink(missing_ok=True)
        port = self.info.nats_url.rsplit(":", 1)[1] if self.info.nats_url else "-1"
        argv = [_nats_binary(), "-c", str(self.files.config), "-js",
                "-sd", str(self.home / "jetstream"), "-a", "127.0.0.1", "-p", port,
                "--ports_file_dir", str(self.ports_dir)]
        env = {k: v for k, v in self.base.items() if not k.startswith("COULER_")}
        return Launch(argv, env)

    def _nats_ready(self, child: Child) -> bool:
        if self._setup is None or self._setup[0] != child.pid:
            url = self._reported_url(child.pid)
            if url is None:
                return False
            self._setup = (child.pid, self._pool.submit(self._create_streams, url))
        work = self._setup[1]
        if not work.done():
            return False
        self._setup = None
        exc = work.exception()
        if exc is not None:
            raise StartFailed(f"the admin could not create the streams: {exc}")
        self.info.nats_url = work.result()
        return True

    def _reported_url(self, pid: int) -> str | None:
        for path in self.ports_dir.glob(f"*_{pid}.ports"):  # <binary name>_<pid>.ports
            try:
                data = json.loads(path.read_text())
            except (FileNotFoundError, ValueError):  # not yet, or half written
                return None
            urls = data.get("nats") or []
            return str(urls[0]) if urls else None
        return None

    def _create_streams(self, url: str) -> str:
        admin = self.files.identity("admin")
        asyncio.run(create_streams(url, admin, tls=self.files.client_tls()))
        return url

    # -- services

    def _launcher(self, name: str) -> Callable[[], Launch]:
        def launch() -> Launch:
            info = self.info
            env = dict(self.base)
            env.update({k: v for k, v in info.env.items() if k.endswith("_ADDRESS")})
            env.update({
                "COULER_NATS_URL": info.nats_url,
                "COULER_NATS_IDENTITY": name,
                "COULER_NATS_SEED_FILE": str(self.files.seed_file(name)),
                "COULER_GRPC_ADDRESS": info.addresses.get(name, "127.0.0.1:0"),
                "COULER_DASHBOARD_ADDRESS": info.env.get("COULER_DASHBOARD_ADDRESS",
                                                         "127.0.0.1:0"),
                # /metrics on loopback, on the port it had (port 0 the first time);
                # scraped with the stack's token, or without one when it has none
                "COULER_METRICS_ADDRESS": _host_port(info.metrics.get(name, "")),
                "COULER_METRICS_ANONYMOUS": "false" if info.token else "true",
            })
            return Launch([sys.executable, "-m", f"couler_{name}.main"], env)

        return launch

    def _ready_line(self, name: str) -> Callable[[Child], bool]:
        log_file = self.home / "logs" / f"{name}.log"

        def ready(child: Child) -> bool:
            try:
                with log_file.open("rb") as fh:
                    fh.seek(child.log_offset)
                    text = fh.read().decode(errors="replace")
            except FileNotFoundError:
                return False
            for line in text.splitlines():
                parsed = parse_ready(line)
                if parsed is not None and parsed.service == name:
                    self.info.addresses[name] = parsed.address
                    self.info.env[f"COULER_{name.upper()}_ADDRESS"] = parsed.address
                    if "metrics" in parsed.endpoints:
                        self.info.metrics[name] = parsed.endpoints["metrics"]
                    if "dashboard" in parsed.endpoints:
                        self.info.dashboard = parsed.endpoints["dashboard"]
                        self.info.env["COULER_DASHBOARD_ADDRESS"] = (
                            self.info.dashboard.split("//", 1)[1].rstrip("/"))
                    return True
            return False

        return ready

    def _blocker(self, name: str) -> Callable[[], str]:
        def blocked() -> str:
            nats_rec = self.info.processes.get("nats")
            if nats_rec is None or nats_rec.state != RUNNING:
                return "nats"
            missing = [d for d in _CALLS.get(name, ()) if d not in self.info.addresses]
            return ", ".join(missing)

        return blocked


def _host_port(url: str) -> str:
    """``host:port`` of ``http://host:port/metrics``; ``127.0.0.1:0`` for none."""
    return url.split("//", 1)[1].split("/", 1)[0] if "//" in url else "127.0.0.1:0"


def supervise(home: Path, lock_fd: int, *, grace: float = 10.0) -> int:
    """The supervisor process of the stack in ``home``; its exit status.

    :func:`couler_runtime.stack.up` starts it after writing the stack's record in
    ``stack.json``, handing it ``lock_fd``: the home's lock, already locked.

    Runs until a ``stop`` request (``couler down``) or SIGTERM / SIGINT, then stops
    every process (services first, NATS last).
    """
    os.umask(0o077)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s supervisor %(levelname)s: %(message)s")
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # inherited: already ours
        os.set_inheritable(lock_fd, False)  # and not the processes' it starts
    except OSError as exc:
        log.error("the lock of %s is not held (%s): `couler up` starts the supervisor", home,
                  exc)
        return 2
    state = home / _STATE
    info = _read(state)
    if info is None:
        log.error("no %s: `couler up` starts the supervisor", state)
        return 2
    info.supervisor = os.getpid()
    info.supervisor_started = start_time(os.getpid())
    stack = _StackPrograms(home, info, os.environ)
    stopping: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        server = ControlServer(home / _SOCKET)
    except OSError as exc:
        log.error("cannot listen on %s: %s", home / _SOCKET, exc)
        return 2
    sup = Supervisor(stack.programs(), info.processes, stop_groups=_STOP_GROUPS,
                     on_change=lambda: _save(state, info), ready_timeout=_READY_TIMEOUT)
    for name in PROCESSES:
        rec = info.processes[name]
        if rec.pid and sup.adopt(name, rec.pid, rec.started):
            continue
        if rec.ready_at and rec.state != STOPPED:  # it ran, and ended while none watched
            rec.last_exit = "exited while no supervisor ran (status unknown)"
        rec.state = RESTARTING if rec.ready_at else STOPPED
        rec.pid, rec.started = 0, 0.0
    _save(state, info)
    log.info("supervising the stack in %s (pid %d)", home, os.getpid())
    reply_to = None
    try:
        while not stopping:
            for conn, message in server.requests(0.1):
                op = message.get("op")
                if op == "stop":
                    grace = float(message.get("grace", grace))
                    stopping.append("stop request")
                    reply_to = conn
                    break
                ControlServer.reply(conn, _answer(sup, info, message))
            sup.tick()
        log.info("stopping (%s)", stopping[0])
        killed = sup.stop(grace)
        _save(state, info)
        if reply_to is not None:
            ControlServer.reply(reply_to, {"ok": True, "killed": killed})
    finally:
        server.close()
        stack.close()
    log.info("stopped")
    return 0


def _answer(sup: Supervisor, info: StackInfo, message: Mapping[str, Any]) -> dict[str, Any]:
    """The reply to one control request other than ``stop``."""
    op = message.get("op")
    if op == "status":
        return {"ok": True, "processes": {n: r.to_dict() for n, r in info.processes.items()}}
    if op == "restart":
        name = str(message.get("name", ""))
        try:
            sig = signal.Signals(int(message.get("signal", signal.SIGTERM)))
            old = sup.restart(name, sig=sig, grace=float(message.get("grace", 10.0)))
        except (UserError, ValueError) as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "pid": old}
    return {"ok": False, "error": f"unknown request {op!r} (status, restart, stop)"}




def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m couler_runtime.stack_supervisor",
                                     description="the embedded stack's supervisor process")
    parser.add_argument("--supervise", required=True, metavar="HOME")
    parser.add_argument("--lock-fd", required=True, type=int)
    args = parser.parse_args(argv)
    return supervise(Path(args.supervise), args.lock_fd)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
