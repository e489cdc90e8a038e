"""Start a real Apache Airflow 3 deployment for tests: API server, scheduler, DAG processor.

Airflow lives in ``.venv-airflow`` (``scripts/setup-engine-venv.sh airflow``). The three
processes run from it with ``AIRFLOW_HOME`` in a temporary directory, a SQLite metadata DB
and the LocalExecutor (Airflow 3.3 starts and runs tasks with that pair; 2.x refused it),
the SimpleAuthManager with one admin user whose password is written beforehand, API
tokens that expire after a few seconds, and short DAG-folder refresh intervals so a new
DAG file is parsed within a second or two. Everything binds to 127.0.0.1 on a free port.
Each process leads its own process group (session); :meth:`AirflowServer.stop` terminates
the groups (task subprocesses included) and kills what is left after a grace period.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-airflow"
AIRFLOW = VENV / "bin" / "airflow"
COMPONENTS = ("api-server", "scheduler", "dag-processor")
TOKEN_SECONDS = 10  # lifetime of an API token (JWT); 4 s expired between a renewal and
# its retried request on a loaded 2-core machine


@dataclass
class AirflowServer:
    """A running deployment: where to reach it and how to log in."""

    url: str
    home: Path
    dags: Path
    username: str
    password: str
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    start_seconds: float = 0.0
    descendants: set[tuple[int, int]] = field(default_factory=set)  # (pid, start time)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every component's log, for failure messages."""
        parts = []
        for name in COMPONENTS:
            path = self.home / f"{name}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {name}\n{text[-chars:]}")
        return "\n".join(parts)

    def stop(self, grace: float = 5.0) -> None:
        """Terminate every process group, then kill what survived ``grace`` seconds.

        Descendants that left their group (a new session) are found beforehand through
        their parents and killed too.
        """
        self.descendants = _descendants({p.pid for p in self.processes.values()})
        for proc in self.processes.values():
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.processes.values():
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.processes.values():
            # The group may outlive its leader (LocalExecutor workers, task processes).
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        live = {(pid, start) for pid, _, _, start in _processes()}
        for pid, _ in self.descendants & live:  # same start time: not a reused pid
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)  # SIGKILL is delivered asynchronously

    def alive(self) -> list[int]:
        """Processes of the deployment's groups still running (zombies do not count)."""
        groups = {proc.pid for proc in self.processes.values()}
        return [pid for pid, _, pgid, start in _processes()
                if pgid in groups or (pid, start) in self.descendants]


def _descendants(roots: set[int]) -> set[tuple[int, int]]:
    """(pid, start time) of every descendant of the ``roots`` processes."""
    children: dict[int, list[tuple[int, int]]] = {}
    for pid, ppid, _, start in _processes():
        children.setdefault(ppid, []).append((pid, start))
    found: set[tuple[int, int]] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return found


def _processes() -> Iterator[tuple[int, int, int, int]]:
    """(pid, parent, group, start time) of every live, non-zombie process (``/proc``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it just exited
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        if fields[0] not in ("Z", "X"):
            yield int(entry.name), int(fields[1]), int(fields[2]), int(fields[19])


def _environment(home: Path, dags: Path, port: int, users_file: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("AIRFLOW")}
    url = f"http://127.0.0.1:{port}"
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple."
                                       "simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "couler:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(users_file),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        # Shared by all components: the scheduler signs task tokens the API server checks.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
        # API tokens expire after a few seconds, so clients must log in again (the
        # execution API's task tokens have their own, longer lifetime).
        "AIRFLOW__API_AUTH__JWT_EXPIRATION_TIME": str(TOKEN_SECONDS),
        "AIRFLOW__API_AUTH__JWT_LEEWAY": "0",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "1",
        "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "300",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    })
    return env


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=2) as r:
            doc = json.loads(r.read())
    except (OSError, ValueError):
        return False
    return all((doc.get(c) or {}).get("status") == "healthy"
               for c in ("metadatabase", "scheduler", "dag_processor"))


@contextmanager
def airflow_server(home: Path, *, timeout: float = 120.0,
                   local_settings: str | None = None) -> Iterator[AirflowServer]:
    """Run a deployment in ``home`` until the ``with`` block ends (see the module doc).

    ``local_settings``: the deployment's ``airflow_local_settings.py`` (cluster policies,
    e.g. ``get_dagbag_import_timeout``), written to ``home/config``, which Airflow puts on
    its path.

    Raises:
        RuntimeError: ``.venv-airflow`` is missing, the DB migration failed, or the
            deployment did not become healthy within ``timeout`` seconds.
    """
    if not AIRFLOW.exists():
        raise RuntimeError(f"{VENV.name} is missing: run scripts/setup-engine-venv.sh airflow")
    started = time.monotonic()
    if local_settings is not None:
        (home / "config").mkdir(parents=True, exist_ok=True)
        (home / "config" / "airflow_local_settings.py").write_text(local_settings,
                                                                   encoding="utf-8")
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(16)
    users_file = home / "passwords.json"
    users_file.write_text(json.dumps({"couler": password}), encoding="utf-8")
    port = free_port()
    env = _environment(home, dags, port, users_file)
    server = AirflowServer(f"http://127.0.0.1:{port}", home, dags, "couler", password, env)
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, cwd=home, timeout=300,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             check=False)
    if migrate.returncode != 0:
        raise RuntimeError("airflow db migrate failed:\n" + migrate.stdout[-4000:])
    try:
        for name in COMPONENTS:
            with (home / f"{name}.log").open("wb") as log:
                server.processes[name] = subprocess.Popen(
                    [str(AIRFLOW), name], env=env, cwd=home, stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not _healthy(server.url):
            dead = [n for n, p in server.processes.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"not healthy after {timeout} s"
                raise RuntimeError(f"Airflow did not start ({why}):\n{server.log_tail()}")
            time.sleep(0.3)
        server.start_seconds = time.monotonic() - started
        yield server
    finally:
        server.stop()
