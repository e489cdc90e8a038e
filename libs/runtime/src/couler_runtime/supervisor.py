"""Supervision of local processes: start them, restart what exits, stop them in order.

A :class:`Supervisor` keeps a set of :class:`Program` s running. Each process runs in a
session of its own (so ``killpg`` reaches whatever it started), writes to its own log, and
is *ready* when its program says so (a READY line, a ports file and a working admin
connection, ...). A process that exits -- SIGKILL included -- or is not ready within
``ready_timeout`` is started again after a back-off (:func:`backoff_delay`: 0.5 s doubling
to 30 s, reset once it has run for a minute). What ``couler status`` shows is each
process's :class:`ProcessRecord`: its state, pid, restarts and last exit status.

Processes a previous supervisor started can be *adopted* (:meth:`Supervisor.adopt`): the
pid must still be that process -- its start time and command line are compared
(:func:`process_matches`), since pids get reused -- and it is watched by polling, as only a
parent can wait for its child (its exit status is then unknown).

The control channel is a unix socket of mode 0600 (:class:`ControlServer`,
:func:`request`): one JSON request and one JSON reply per connection, from the same user
only.

Errors: :class:`StartFailed` (a program's readiness check gave up; the supervisor restarts
it), :class:`ControlError` (a ``RetryableError``: the supervisor did not answer).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from couler.errors import RetryableError, UserError

__all__ = [
    "BACKOFF_CAP",
    "BACKOFF_FIRST",
    "HEALTHY_AFTER",
    "RESTARTING",
    "RUNNING",
    "STARTING",
    "STOPPED",
    "STOPPING",
    "WAITING",
    "Child",
    "ControlError",
    "ControlServer",
    "Launch",
    "ProcessRecord",
    "Program",
    "StartFailed",
    "Supervisor",
    "backoff_delay",
    "describe_exit",
    "process_matches",
    "request",
    "start_time",
    "terminate_session",
]

log = logging.getLogger(__name__)

BACKOFF_FIRST = 0.5
BACKOFF_CAP = 30.0
HEALTHY_AFTER = 60.0  # a process that ran this long starts its back-off afresh

# Process states (ProcessRecord.state).
STARTING = "starting"  # first start, not ready yet
RUNNING = "running"
RESTARTING = "restarting"  # exited: waiting out its back-off, or started again, not ready yet
WAITING = "waiting"  # not started: what it needs is not ready (ProcessRecord.note says what)
STOPPING = "stopping"
STOPPED = "stopped"


class StartFailed(Exception):  # noqa: N818 -- reads as what happened: raise StartFailed(...)
    """A program's readiness check gave up on the process (it is killed and restarted)."""


class ControlError(RetryableError):
    """The supervisor did not answer on its control socket."""


def backoff_delay(failures: int, *, first: float = BACKOFF_FIRST,
                  cap: float = BACKOFF_CAP) -> float:
    """Seconds to wait before starting a process again after ``failures`` consecutive
    failures (1 for the first): ``first`` doubling per failure, at most ``cap``."""
    return float(min(cap, first * 2.0 ** max(0, failures - 1)))


def describe_exit(returncode: int | None) -> str:
    """How a process ended, for people: ``exit status 2``, ``killed by SIGKILL``."""
    if returncode is None:
        return "exited (status unknown: started by an earlier supervisor)"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def start_time(pid: int) -> float:
    """The start time of process ``pid`` (seconds since the epoch), 0.0 when it is gone."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0


def process_matches(pid: int, started: float, marker: str = "") -> bool:
    """Whether ``pid`` is alive and is the process recorded: started at ``started`` (when
    not 0) with ``marker`` in its command line (when given). Zombies count as gone."""
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if started and abs(float(proc.create_time()) - started) > 0.05:
            return False
        return not marker or marker in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _kill_session(pid: int, sig: int) -> None:
    """Send ``sig`` to the session (process group) ``pid`` leads, if any of it is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def terminate_session(pid: int, started: float, *, sig: int = signal.SIGTERM,
                      grace: float = 10.0) -> bool:
    """Stop a process that this process did not start (no waiting for it): ``sig`` to its
    session, up to ``grace`` seconds, then SIGKILL; True when SIGKILL was needed."""
    _kill_session(pid, sig)
    deadline = time.monotonic() + grace
    while process_matches(pid, started) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = process_matches(pid, started)
    _kill_session(pid, signal.SIGKILL)  # also what it left running in its session
    while process_matches(pid, started):
        time.sleep(0.05)
    return killed


@dataclass
class ProcessRecord:
    """What is known of one supervised process (kept in the stack's state file).

    Attributes:
        state: :data:`STARTING`, :data:`RUNNING`, :data:`RESTARTING`, :data:`WAITING`,
            :data:`STOPPING` or :data:`STOPPED`.
        pid: Its process id (0 when none runs).
        started: Its start time; with ``pid``, its identity (pids get reused).
        restarts: How many times it was started again.
        failures: Consecutive exits without a minute of running (sets the back-off).
        backoff: The delay before its current (or last) restart, in seconds.
        last_exit: How it last ended (``killed by SIGKILL``, ``exit status 2``, ...).
        exited_at: When it last ended (seconds since the epoch; 0 when never).
        ready_at: When it last became ready (0 when never).
        next_start: When it will be started again while restarting (0 otherwise).
        note: What it waits for (state :data:`WAITING`).
    """

    state: str = STOPPED
    pid: int = 0
    started: float = 0.0
    restarts: int = 0
    failures: int = 0
    backoff: float = 0.0
    last_exit: str = ""
    exited_at: float = 0.0
    ready_at: float = 0.0
    next_start: float = 0.0
    note: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessRecord:
        """The record from its JSON form (unknown keys are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class Launch:
    """How to start a program now: its command line and its whole environment."""

    argv: list[str]
    env: Mapping[str, str]


@dataclass
class Child:
    """A running process of a program.

    Attributes:
        pid: Its process id.
        started: Its start time (identity).
        popen: The handle when this supervisor started it (None when adopted).
        log_offset: The size of its log when it started (readiness reads from there).
        spawned: When it was started (monotonic clock).
        ready: When it became ready (monotonic clock), None before.
    """

    pid: int
    started: float
    popen: subprocess.Popen[bytes] | None = None
    log_offset: int = 0
    spawned: float = field(default_factory=time.monotonic)
    ready: float | None = None

    def poll(self) -> tuple[bool, int | None]:
        """(exited, return code); the code is None for an adopted process."""
        if self.popen is not None:
            code = self.popen.poll()
            return code is not None, code
        return not process_matches(self.pid, self.started), None


@dataclass
class Program:
    """One process to keep running.

    Attributes:
        name: Its name (``nats``, ``cache``, ...).
        log: Where its standard output and error go (appended, mode 0600).
        launch: Its command line and environment, asked at every start.
        ready: Polled while it starts: True once it serves; raises :class:`StartFailed`
            when it never will.
        blocked: "" when it may start now, else what it waits for.
        marker: A string in its command line (checked before adopting a pid).
    """

    name: str
    log: Path
    launch: Callable[[], Launch]
    ready: Callable[[Child], bool]
    blocked: Callable[[], str] = lambda: ""
    marker: str = ""


class Supervisor:
    """Keeps :class:`Program` s running; driven by :meth:`tick` (no threads of its own).

    Args:
        programs: What to run, in start order.
        records: The records to keep up to date (one per program is added when missing).
        stop_groups: The order of :meth:`stop`: the processes of a group are stopped
            together, groups one after the other (default: all at once).
        on_change: Called after a tick that changed a record (to save them).
        ready_timeout: Seconds a process may take to become ready.
        backoff_first: The first restart delay.
        backoff_cap: The longest restart delay.
        healthy_after: Seconds of running after which the back-off starts afresh.
    """

    def __init__(self, programs: Sequence[Program], records: dict[str, ProcessRecord], *,
                 stop_groups: Sequence[Sequence[str]] | None = None,
                 on_change: Callable[[], None] = lambda: None, ready_timeout: float = 60.0,
                 backoff_first: float = BACKOFF_FIRST, backoff_cap: float = BACKOFF_CAP,
                 healthy_after: float = HEALTHY_AFTER) -> None:
        self._programs = {p.name: p for p in programs}
        self.records = records
        for name in self._programs:
            records.setdefault(name, ProcessRecord())
        self._stop_groups = [list(g) for g in (stop_groups or [list(self._programs)])]
        self._on_change = on_change
        self._ready_timeout = ready_timeout
        self._backoff_first = backoff_first
        self._backoff_cap = backoff_cap
        self._healthy_after = healthy_after
        self._children: dict[str, Child] = {}
        self._due: dict[str, float] = dict.fromkeys(self._programs, 0.0)
        self._requested: dict[str, float] = {}  # name -> SIGKILL deadline of a restart asked for
        self._stopping = False

    @property
    def names(self) -> list[str]:
        """The programs, in start order."""
        return list(self._programs)

    def child(self, name: str) -> Child | None:
        """The running process of ``name``, if any."""
        return self._children.get(name)

    def adopt(self, name: str, pid: int, started: float) -> bool:
        """Watch ``pid`` as the running process of ``name`` when it is that process
        (alive, started at ``started``, the program's marker in its command line)."""
        program = self._programs[name]
        if not process_matches(pid, started, program.marker):
            return False
        now = time.monotonic()
        self._children[name] = Child(pid, started, spawned=now, ready=now)
        rec = self.records[name]
        rec.state, rec.pid, rec.started, rec.note, rec.next_start = RUNNING, pid, started, "", 0.0
        self._due.pop(name, None)
        log.info("%s: adopted pid %d", name, pid)
        return True

    def tick(self) -> None:
        """Notice exits, readiness and time-outs, and start what is due."""
        changed = False
        now = time.monotonic()
        for name, child in list(self._children.items()):
            exited, code = child.poll()
            if exited:
                self._exited(name, child, describe_exit(code))
                changed = True
            elif child.ready is None:
                changed |= self._check_ready(name, child, now)
            deadline = self._requested.get(name)
            if deadline is not None and name in self._children and now > deadline:
                _kill_session(child.pid, signal.SIGKILL)
        if not self._stopping:
            for name in self._programs:
                due = self._due.get(name)
                if due is None or due > now or name in self._children:
                    continue
                changed |= self._start(name)
        if changed:
            self._on_change()

    def _check_ready(self, name: str, child: Child, now: float) -> bool:
        rec = self.records[name]
        try:
            ready = self._programs[name].ready(child)
        except StartFailed as exc:
            self._fail_start(name, child, f"failed to start: {exc}")
            return True
        if ready:
            child.ready = now
            rec.state, rec.ready_at, rec.next_start = RUNNING, time.time(), 0.0
            log.info("%s: running (pid %d)", name, child.pid)
            return True
        if now - child.spawned > self._ready_timeout:
            self._fail_start(name, child, f"not ready after {self._ready_timeout:g} s")
            return True
        return False

    def _fail_start(self, name: str, child: Child, why: str) -> None:
        _kill_session(child.pid, signal.SIGKILL)
        if child.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(timeout=10)
        self._exited(name, child, why)

    def _exited(self, name: str, child: Child, how: str) -> None:
        _kill_session(child.pid, signal.SIGKILL)  # whatever it left in its session
        del self._children[name]
        rec = self.records[name]
        rec.pid, rec.started, rec.last_exit, rec.exited_at = 0, 0.0, how, time.time()
        if self._stopping:
            rec.state = STOPPED
            return
        now = time.monotonic()
        requested = self._requested.pop(name, None) is not None
        if requested:
            rec.failures, delay = 0, 0.0
        else:
            ran = now - child.ready if child.ready is not None else 0.0
            rec.failures = 1 if ran >= self._healthy_after else rec.failures + 1
            delay = backoff_delay(rec.failures, first=self._backoff_first,
                                  cap=self._backoff_cap)
        rec.state, rec.backoff, rec.next_start = RESTARTING, delay, time.time() + delay
        self._due[name] = now + delay
        log.log(logging.INFO if requested else logging.WARNING,
                "%s: %s; starting it again in %.1f s", name, how, delay)

    def _start(self, name: str) -> bool:
        program = self._programs[name]
        rec = self.records[name]
        waits = program.blocked()
        if waits:
            if rec.note != waits or rec.state not in (WAITING, RESTARTING):
                rec.note = waits
                if rec.state != RESTARTING:
                    rec.state = WAITING
                return True
            return False
        first = not rec.ready_at and not rec.exited_at
        try:
            launch = program.launch()
            child = self._spawn(program, launch)
        except (OSError, StartFailed, UserError) as exc:
            now = time.monotonic()
            rec.failures += 1
            delay = backoff_delay(rec.failures, first=self._backoff_first,
                                  cap=self._backoff_cap)
            rec.state, rec.last_exit, rec.exited_at = RESTARTING, f"cannot start: {exc}", \
                time.time()
            rec.backoff, rec.next_start = delay, time.time() + delay
            self._due[name] = now + delay
            log.error("%s: cannot start: %s; trying again in %.1f s", name, exc, delay)
            return True
        self._children[name] = child
        self._due.pop(name, None)
        if not first:
            rec.restarts += 1
        rec.state = STARTING if first else RESTARTING
        rec.pid, rec.started, rec.note, rec.next_start = child.pid, child.started, "", 0.0
        log.info("%s: started pid %d: %s", name, child.pid, " ".join(launch.argv))
        return True

    @staticmethod
    def _spawn(program: Program, launch: Launch) -> Child:
        program.log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(program.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as out:
            offset = out.tell()
            popen = subprocess.Popen(launch.argv, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=dict(launch.env),
                                     start_new_session=True)
        return Child(popen.pid, start_time(popen.pid), popen, log_offset=offset)

    def restart(self, name: str, *, sig: int = signal.SIGTERM, grace: float = 10.0) -> int:
        """Restart ``name`` now: ``sig`` to its session (SIGKILL after ``grace`` seconds),
        then start it again without back-off; a process waiting out its back-off starts
        at once. Returns the pid that is stopped (0 when none ran).

        Raises:
            UserError: ``name`` is not one of the programs.
        """
        if name not in self._programs:
            raise UserError(f"no process {name!r} here (processes: "
                            f"{', '.join(self._programs)})")
        child = self._children.get(name)
        if child is None:
            self._due[name] = time.monotonic()
            self.records[name].failures = 0
            return 0
        self._requested[name] = time.monotonic() + grace
        _kill_session(child.pid, sig)
        log.info("%s: restart asked for: %s to pid %d", name, signal.Signals(sig).name,
                 child.pid)
        return child.pid

    def stop(self, grace: float = 10.0) -> list[str]:
        """Stop everything, group by group (SIGTERM, then SIGKILL after ``grace`` seconds);
        the names that needed SIGKILL."""
        self._stopping = True
        killed: list[str] = []
        for group in self._stop_groups:
            live = {n: self._children[n] for n in group if n in self._children}
            for name, child in live.items():
                self.records[name].state = STOPPING
                _kill_session(child.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while True:
                for name, child in list(live.items()):
                    exited, code = child.poll()
                    if exited:
                        self._exited(name, child, describe_exit(code))
                        del live[name]
                if not live:
                    break
                if time.monotonic() > deadline:
                    for name, child in live.items():
                        killed.append(name)
                        _kill_session(child.pid, signal.SIGKILL)
                    deadline = float("inf")
                time.sleep(0.05)
        for rec in self.records.values():
            rec.state, rec.pid, rec.started, rec.note, rec.next_start = \
                STOPPED, 0, 0.0, "", 0.0
        self._on_change()
        return killed


# ----------------------------------------------------------------------------- control


@contextlib.contextmanager
def _unix_address(path: Path) -> Iterator[str]:
    """An address for the socket ``path``: itself, or (over the 107-byte limit of a unix
    socket address) the same file reached through a descriptor of its directory."""
    text = str(path)
    if len(text.encode()) < 100:
        yield text
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return int(uid)


def _read_line(conn: socket.socket, limit: int = 1 << 20) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class ControlServer:
    """The supervisor's end of the control socket (mode 0600, this user's peers only).

    Args:
        path: The socket file (replaced when it exists: the caller holds the stack's lock).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            with _unix_address(path) as address:
                self._sock.bind(address)
        finally:
            os.umask(old)
        path.chmod(0o600)
        self._sock.listen(8)
        self._sock.setblocking(False)

    def requests(self, timeout: float) -> Iterator[tuple[socket.socket, dict[str, Any]]]:
        """The requests that arrive within ``timeout`` seconds, each with its connection
        (answer with :meth:`reply`). Malformed ones and other users' are answered here."""
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.settimeout(5.0)
            try:
                if _peer_uid(conn) != os.getuid():
                    self.reply(conn, {"ok": False, "error": "not this user's supervisor"})
                    continue
                message = json.loads(_read_line(conn) or b"null")
            except (OSError, ValueError) as exc:
                self.reply(conn, {"ok": False, "error": f"bad request: {exc}"})
                continue
            if not isinstance(message, dict):
                self.reply(conn, {"ok": False, "error": "a request is a JSON object"})
                continue
            yield conn, message

    @staticmethod
    def reply(conn: socket.socket, message: Mapping[str, Any]) -> None:
        """Answer one request and close its connection."""
        with contextlib.suppress(OSError), conn:
            conn.sendall(json.dumps(message).encode() + b"\n")

    def close(self) -> None:
        """Stop listening and remove the socket file."""
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def request(path: Path, message: Mapping[str, Any], *, timeout: float = 10.0,
            connect_within: float = 5.0) -> dict[str, Any]:
    """Send one request to the supervisor listening on ``path`` and return its reply.

    Connecting is retried for ``connect_within`` seconds (a supervisor just started may
    not listen yet); the reply may take ``timeout`` seconds.

    Raises:
        ControlError: Nobody answered.
        UserError: The supervisor refused the request (its reason).
    """
    deadline = time.monotonic() + connect_within
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            with _unix_address(path) as address:
                sock.connect(address)
            sock.sendall(json.dumps(message).encode() + b"\n")
            raw = _read_line(sock)
            break
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if time.monotonic() > deadline:
                raise ControlError(f"no supervisor answers on {path}: {exc.strerror}") from exc
            time.sleep(0.1)
        except OSError as exc:
            raise ControlError(f"the supervisor on {path} did not answer "
                               f"{message.get('op')!r}: {exc}") from exc
        finally:
            sock.close()
    try:
        reply = json.loads(raw)
    except ValueError as exc:
        raise ControlError(f"the supervisor on {path} answered {raw[:80]!r}") from exc
    if not isinstance(reply, dict):
        raise ControlError(f"the supervisor on {path} answered {raw[:80]!r}")
    if not reply.get("ok"):
        raise UserError(str(reply.get("error") or "the supervisor refused the request"))
    return reply
