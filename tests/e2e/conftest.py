"""Fixtures and helpers for the end-to-end tests: the real stack, as processes.

Each module starts its own stack (``couler_runtime.stack.up``: a supervisor that runs
nats-server with JetStream and the five services) in a temporary home with a token, and
stops it at teardown, asserting that no process is left (see :func:`leftovers`). The
helpers read what the local engine left on disk (``<home>/state/runs/<run_id>/``) and what
JetStream stored (connecting as the stack's ``admin`` bus identity: NATS refuses anonymous
clients), and wait for the supervisor to bring a killed process back.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil  # type: ignore[import-untyped]
import pytest
from google.protobuf.message import Message

from couler import ir
from couler.cli import main as couler_main
from couler.errors import RetryableError
from couler_runtime import stack
from couler_runtime.bus_keys import BusFiles
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import Run
from couler_runtime.supervisor import ProcessRecord
from tests.waiting import eventually as wait_until

M = TypeVar("M", bound=Message)
PY = "python:3.12-alpine"
DEADLINE = 300.0  # seconds a run may take to finish in these tests (a hang, not a timing;
# generated runs train real models, several seconds per step on a loaded 2-core machine)
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    """A running stack: its home, what ``up`` recorded, and a client for all five services."""

    home: Path
    info: stack.StackInfo
    client: CoulerClient

    @property
    def runs_dir(self) -> Path:
        return self.home / "state" / "runs"

    def refresh(self) -> None:
        """Re-read the state file (the supervisor records new pids)."""
        self.info, _ = stack.status(self.home)

    def record(self, name: str) -> ProcessRecord:
        """The supervisor's current record of process ``name``."""
        return stack.status(self.home)[0].processes[name]


def leftovers(home: Path, pids: Iterable[int] = ()) -> list[str]:
    """Processes still alive that belong to the stack in ``home``: a recorded pid, or any
    process with ``home`` in its command line, working directory or environment."""
    root = str(home.resolve())
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for pid in pids:
        if psutil.pid_exists(pid):
            with contextlib.suppress(psutil.Error):  # gone, or not ours to read
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(f"recorded pid {pid} ({proc.name()})")
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        if proc.pid in mine:
            continue
        with contextlib.suppress(psutil.Error):  # gone, or not ours to read
            cmdline = " ".join(proc.info.get("cmdline") or ())
            cwd = proc.info.get("cwd") or ""
            env = proc.environ()
            if ((root in cmdline or cwd == root or cwd.startswith(root + os.sep)
                    or any(root in v for v in env.values()))
                    and proc.status() != psutil.STATUS_ZOMBIE):
                found.append(f"pid {proc.pid}: {cmdline[:200]} (cwd {cwd})")
    return found


def recorded_pids(home: Path) -> list[int]:
    """Every pid the state file names: the supervisor's and its processes'."""
    info = stack._read(home / "stack.json")
    return [info.supervisor, *info.pids.values()] if info else []


def ml_env() -> dict[str, str]:
    """The setting that runs the catalog's tabular steps in .venv-ml (made when absent)."""
    subprocess.run([str(REPO / "scripts" / "setup-ml-venv.sh")], check=True, timeout=900)
    return {"COULER_LOCAL_PYTHON":
            f"ghcr.io/couler-io/ml-tabular:*={REPO / '.venv-ml' / 'bin' / 'python'}"}


def write_table(path: Path) -> Path:
    """A real labelled table (scikit-learn's breast-cancer data) as CSV at ``path``."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    lines = [",".join([*(f"f{i}" for i in range(data.data.shape[1])), "label"])]
    lines += [",".join([*(f"{v:.6g}" for v in row), str(int(y))])
              for row, y in zip(data.data, data.target, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_stack(home: Path, **kw: Any) -> Stack:
    """``up`` with a token (and the tabular steps' environment); when it fails, whatever it
    started is stopped."""
    kw["extra_env"] = {**ml_env(), **kw.get("extra_env", {})}
    try:
        info = stack.up(home, token=secrets.token_urlsafe(16), **kw)
    except BaseException:
        if (home / "stack.json").exists():
            pids = recorded_pids(home)
            stack.down(home)
            assert leftovers(home, pids) == []
        raise
    return Stack(home, info, CoulerClient(info.addresses, token=info.token))


def stop_stack(s: Stack) -> None:
    """``down``, then assert that nothing of the stack is left running."""
    s.client.close()
    pids = recorded_pids(s.home) or list(s.info.pids.values())  # the latest (restarts)
    if (s.home / "stack.json").exists():
        stack.down(s.home)
    assert not (s.home / "stack.json").exists()
    left = leftovers(s.home, pids)
    assert left == [], f"left running after down: {left}"


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie has)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def crash(s: Stack, name: str) -> ProcessRecord:
    """SIGKILL process ``name`` (a crash) and wait until the supervisor has it running again
    (a new pid, one more restart); its new record. The address is the same."""
    before = s.record(name)
    os.kill(before.pid, signal.SIGKILL)
    return restarted(s, name, before)


def restarted(s: Stack, name: str, before: ProcessRecord) -> ProcessRecord:
    """Wait until the supervisor has ``name`` running again after a SIGKILL to the process
    of ``before`` (its record then): a new pid, one more restart, the same address."""
    address = s.info.nats_url if name == "nats" else s.info.addresses[name]

    def back() -> bool:
        rec = s.record(name)
        return rec.state == "running" and rec.pid not in (0, before.pid)

    wait_until(back, f"the supervisor restarted {name}", deadline=DEADLINE)
    s.refresh()
    after = s.record(name)
    assert after.restarts == before.restarts + 1, (before, after)
    assert after.last_exit == "killed by SIGKILL", after
    assert (s.info.nats_url if name == "nats" else s.info.addresses[name]) == address
    return after


def couler_status(home: Path) -> tuple[int, str]:
    """``couler status --home HOME`` (in this process): exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    code = couler_main(["status", "--home", str(home)], out=out, err=err)
    return code, out.getvalue() + err.getvalue()


def couler_cli(home: Path, *args: str, env: dict[str, str] | None = None,
               timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m couler ARGS`` in a process of its own, for the stack in ``home``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    base.update(env or {})
    base["COULER_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "couler", *args], env=base, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def loose_modes(home: Path) -> list[str]:
    """Everything under ``home`` (itself included) that others could use: directories
    must be 0700, files and sockets 0600."""
    found = []
    # os.walk, unlike rglob, skips directories that vanish while it walks
    paths = [home, *(Path(d) / n for d, dirs, files in os.walk(home) for n in dirs + files)]
    for path in paths:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:  # a live stack removes files as we walk (JetStream consumers)
            continue
        if stat.S_ISLNK(mode):
            continue
        want = 0o700 if stat.S_ISDIR(mode) else 0o600
        if stat.S_IMODE(mode) != want:
            found.append(f"{path.relative_to(home)}: {stat.S_IMODE(mode):o}")
    return found


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A fresh stack for the module; stopped (and checked empty) at teardown."""
    s = start_stack(tmp_path_factory.mktemp("couler-home"))
    try:
        yield s
    finally:
        stop_stack(s)


# ----------------------------------------------------------------------------- runs


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def get(client: CoulerClient, run_id: str) -> Run:
    """``Get``, retried while the submitter is restarting."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return client.submitter.get(run_id)
        except RetryableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wait_finished(client: CoulerClient, run_ids: Iterable[str],
                  deadline: float = DEADLINE) -> dict[str, Run]:
    """Poll until every run is terminal (or the deadline passes); the last records."""
    pending = list(run_ids)
    done: dict[str, Run] = {}
    end = time.monotonic() + deadline
    while pending and time.monotonic() < end:
        for run_id in list(pending):
            run = get(client, run_id)
            if run.state.terminal:
                done[run_id] = run
                pending.remove(run_id)
        if pending:
            time.sleep(0.2)
    for run_id in pending:
        done[run_id] = get(client, run_id)
    return done


# ----------------------------------------------------------------------------- workflows


def script(name: str, source: str, **kw: Any) -> ir.Step:
    return ir.Step(name=name, body=ir.ScriptSpec(image=PY, source=source), **kw)


GATE_DEADLINE = 600  # seconds a gated step waits for its release before failing (a hang)


def marked_source(step: str, marks: Path, work: str = "pass", gate: Path | None = None) -> str:
    """Source of a step that logs ``start``/``end`` lines (with its pid) to ``marks/step``:
    an execution on disk that no engine bookkeeping can hide or invent.

    With ``gate``, the step holds between its ``start`` and ``end`` lines until the file
    ``gate`` exists (:func:`release`): a barrier the test opens, so the step is running
    at a kill however slow the machine is -- never a sleep length. A gate never opened
    fails the step after :data:`GATE_DEADLINE` s.
    """
    path = str(marks / step)
    hold = "" if gate is None else (
        f"deadline = time.monotonic() + {GATE_DEADLINE}\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        f"    if time.monotonic() > deadline:\n"
        f"        raise SystemExit('gate {step} never released')\n"
        f"    time.sleep(0.02)\n")
    return (f"import os, time\n"
            f"open({path!r}, 'a').write(f'start {{os.getpid()}} {{time.time()}}\\n')\n"
            f"{hold}"
            f"{work}\n"
            f"open({path!r}, 'a').write(f'end {{os.getpid()}} {{time.time()}}\\n')\n"
            f"print('{step} ok')")


def gates_of(marks: Path) -> Path:
    """The directory of the release files of the steps marking into ``marks``."""
    return marks.parent / f"{marks.name}.gates"


def release(marks: Path, *steps: str) -> None:
    """Open the gates of ``steps`` (all of the workflow's when none is named): a held step
    goes on to its end, and a later execution of it passes at once."""
    gates = gates_of(marks)
    gates.mkdir(parents=True, exist_ok=True)
    for step in steps or MARKED_STEPS:
        (gates / step).touch()


def started(marks: Path, step: str) -> bool:
    """Whether an execution of ``step`` wrote its ``start`` line."""
    path = marks / step
    return path.exists() and any(line.startswith("start")
                                 for line in path.read_text().splitlines())


MARKED_STEPS = ("prepare", "train-a", "train-b", "pick")


def marked_workflow(name: str, marks: Path) -> ir.Workflow:
    """``prepare`` → ``train-a`` and ``train-b`` → ``pick``; every step marks its
    executions in ``marks`` (one directory per workflow) and holds at its gate until the
    test releases it (:func:`release`)."""
    marks.mkdir(parents=True, exist_ok=True)
    gates = gates_of(marks)
    out = (ir.OutputParameter("said", source=ir.OutputSource.STDOUT),)

    def step(name: str, *after: str) -> ir.Step:
        return script(name, marked_source(name, marks, gate=gates / name), outputs=out,
                      dependencies=tuple(ir.Dependency(a) for a in after))

    return ir.Workflow(name=name, steps=(
        step("prepare"), step("train-a", "prepare"), step("train-b", "prepare"),
        step("pick", "train-a", "train-b")))


def marks(directory: Path) -> dict[str, list[str]]:
    """Per step: the ``start PID`` / ``end PID`` lines its executions wrote."""
    if not directory.is_dir():
        return {}
    return {p.name: p.read_text().splitlines() for p in sorted(directory.iterdir())}


# ----------------------------------------------------------------------------- on disk


@dataclass
class Journal:
    """What ``run.journal`` says about one step execution (step, key)."""

    starts: int = 0  # attempts started: the attempt counter moved to a new non-zero value
    successes: int = 0  # transitions into SUCCEEDED
    last_state: str = ""


def journal(run_dir: Path) -> dict[tuple[str, str], Journal]:
    """Replay ``run.journal``: per (step, key), attempts started and successes recorded.

    A resumed run (after a submitter crash) restarts an interrupted step's attempt counter
    at 1; that shows here as one more start, which is how it is counted.
    """
    out: dict[tuple[str, str], Journal] = defaultdict(Journal)
    attempts: dict[tuple[str, str], int] = {}
    path = run_dir / "run.journal"
    if not path.is_file():
        return {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)["record"]
        key = (rec["step"], rec.get("key", ""))
        j = out[key]
        n = int(rec.get("attempts") or 0)
        if n and n != attempts.get(key, 0):
            j.starts += 1
        attempts[key] = n
        if rec["state"] == "succeeded" and j.last_state != "succeeded":
            j.successes += 1
        j.last_state = rec["state"]
    return dict(out)


def execution_dirs(run_dir: Path) -> list[str]:
    """``steps/<step>/<label>`` directories where an execution wrote stdout or stderr."""
    steps = run_dir / "steps"
    if not steps.is_dir():
        return []
    return sorted(str(p.parent.relative_to(steps)) for p in steps.rglob("stdout"))


# ----------------------------------------------------------------------------- JetStream


async def connect_as(home: Path, identity: str = "admin", **kw: Any) -> Any:
    """A nats-py connection to the stack's NATS as ``identity`` (its seed, inbox prefix and
    the stack's CA); ``kw`` go to ``nats.connect``."""
    import nats

    files = BusFiles(home / "bus")
    me = files.identity(identity)
    tls = files.client_tls()
    info = stack.status(home)[0]
    return await nats.connect(info.nats_url, nkeys_seed_str=me.seed.decode(),
                              inbox_prefix=me.inbox_prefix,
                              **({"tls": tls} if tls is not None else {}), **kw)


def _submitter_db(home: Path, sql: str) -> list[tuple[Any, ...]]:
    import sqlite3

    db = home / "state" / "submitter.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def outbox_rows(home: Path) -> int:
    """Events the stack's submitter committed and has not yet had JetStream store (its
    transactional outbox): a run's record can be final before its events are out."""
    return int(_submitter_db(home, "SELECT count(*) FROM submitter_outbox")[0][0])


def outbox_set_aside(home: Path) -> list[str]:
    """The events the submitter's outbox gave up on: ``run kind: reason``."""
    return [f"{run} {kind}: {reason}" for run, kind, reason in _submitter_db(
        home, "SELECT run_id, kind, reason FROM submitter_outbox_dead")]


def stored_events(home: Path, subject: str, message: type[M]) -> list[tuple[str, M]]:
    """Every message JetStream keeps on ``subject``: (Nats-Msg-Id, decoded body), read as
    the stack's admin.

    Reads exactly what the stream held when the consumer was made (its ``num_pending``),
    never "until a quiet second", which a loaded machine could cut short.
    """
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def read() -> list[tuple[str, M]]:
        nc = await connect_as(home)
        try:
            js = nc.jetstream()
            sub = await js.pull_subscribe(subject, config=ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE))
            expected = (await sub.consumer_info()).num_pending or 0
            found: list[tuple[str, M]] = []
            while len(found) < expected:
                msgs = await sub.fetch(min(512, expected - len(found)), timeout=DEADLINE)
                found += [((m.headers or {}).get("Nats-Msg-Id", ""), message.FromString(m.data))
                          for m in msgs]
            await sub.unsubscribe()
            return found
        finally:
            await nc.close()

    return asyncio.run(read())
