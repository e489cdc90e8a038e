"""Daemon steps on the local engine: real servers, real clients, nothing left running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from couler import ir
from couler.engines.base import Feature, RunState, StepState, StepStatus, Support
from couler.errors import UnsupportedFeatureError
from couler_runtime.local import CAPABILITIES, LocalEngine
from couler_runtime.local import engine as local_engine
from couler_runtime.local.journal import _load

PY = sys.executable

# argv: PORT DIR TOKEN. Serves "pong" on 127.0.0.1:PORT; on SIGTERM notes it and exits 0.
SERVER = r'''
import http.server, os, signal, sys
port, where = int(sys.argv[1]), sys.argv[2]
def stop(signum, frame):
    open(os.path.join(where, "terminated"), "w").close()
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(where, "server.pid"), "w").write(str(os.getpid()))
class Pong(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"pong")
http.server.HTTPServer(("127.0.0.1", port), Pong).serve_forever()
'''

# argv: PORT. Reads the daemon, retrying its first connection (it may not listen yet).
CLIENT = r'''
import sys, time, urllib.request
for _ in range(400):
    try:
        print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=5).read().decode())
        break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("the daemon never answered")
'''

# argv: PATH TOKEN. Waits (at most a minute) until PATH exists.
WAIT_FOR = r'''
import os, sys, time
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]):
    if time.monotonic() > deadline:
        sys.exit("timed out waiting for " + sys.argv[1])
    time.sleep(0.02)
'''

# argv: DIR TOKEN. Runs until stopped, its pid in DIR/server.pid.
FOREVER = r'''
import os, sys, time
open(os.path.join(sys.argv[1], "server.pid"), "w").write(str(os.getpid()))
time.sleep(600)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def py(name: str, source: str, *args: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="python:3.12", command=(PY, "-c", source), args=args)
    return ir.Step(name=name, body=body, **kw)  # type: ignore[arg-type]


def after(*names: str) -> tuple[ir.Dependency, ...]:
    return tuple(ir.Dependency(n) for n in names)


def by_name(status: object, step: str) -> StepStatus:
    return next(s for s in status.steps if s.step == step and s.key == "")  # type: ignore[attr-defined]


def leftovers(token: str) -> list[int]:
    """Processes whose command line carries ``token`` (zombies excluded)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if token in " ".join(p.info["cmdline"] or []) and p.info["status"] != "zombie":
            found.append(p.pid)
    return found


def test_daemon_capability_is_declared() -> None:
    cap = CAPABILITIES[Feature.DAEMON]
    assert cap.support is Support.REWRITTEN
    assert "127.0.0.1" in cap.note and "refused" in cap.note


def test_a_daemon_serves_its_dependent_and_is_stopped_with_sigterm_at_the_end(
        tmp_path: Path) -> None:
    token, port = uuid.uuid4().hex, free_port()
    server = py("server", SERVER, str(port), str(tmp_path), token, daemon=True)
    client = py("client", CLIENT, str(port), dependencies=after("server"),
                outputs=(ir.OutputParameter("got", ir.OutputSource.STDOUT),))
    events: list[StepStatus] = []
    # one worker: the daemon is outside the bound, or its client could never start
    engine = LocalEngine(tmp_path / "runs", max_workers=1)
    status = engine.run(ir.Workflow(name="served", steps=(server, client)),
                        on_event=events.append)

    assert status.state is RunState.SUCCEEDED, status.message
    assert by_name(status, "client").outputs == {"got": "pong"}
    srv = by_name(status, "server")
    assert (srv.state, srv.message, srv.exit_code) == (
        StepState.SUCCEEDED, "daemon stopped at the end of the run", 0)
    assert (tmp_path / "terminated").exists()  # stopped by SIGTERM, which it handled
    # it was serving (running, a daemon) when its dependent started
    serving = next(i for i, e in enumerate(events) if e.step == "server"
                   and e.state is StepState.RUNNING and "running as a daemon" in e.message)
    client_ran = next(i for i, e in enumerate(events)
                      if e.step == "client" and e.state is StepState.RUNNING)
    assert serving < client_ran
    assert not psutil.pid_exists(int((tmp_path / "server.pid").read_text()))
    assert leftovers(token) == []


def test_a_daemon_ignoring_sigterm_is_killed_with_its_children(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_engine, "STOP_GRACE_SECONDS", 0.2)
    token = uuid.uuid4().hex
    stubborn = r'''
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[2]])
open(os.path.join(sys.argv[1], "child.pid"), "w").write(str(child.pid))
open(os.path.join(sys.argv[1], "ready"), "w").close()
time.sleep(600)
'''
    server = py("server", stubborn, str(tmp_path), token, daemon=True)
    client = py("client", WAIT_FOR, str(tmp_path / "ready"), token,
                dependencies=after("server"))
    status = LocalEngine(tmp_path / "runs").run(
        ir.Workflow(name="stubborn", steps=(server, client)))

    assert status.state is RunState.SUCCEEDED, status.message
    srv = by_name(status, "server")
    assert srv.state is StepState.SUCCEEDED and srv.exit_code == -signal.SIGKILL
    assert leftovers(token) == []
    assert not psutil.pid_exists(int((tmp_path / "child.pid").read_text())) or \
        psutil.Process(int((tmp_path / "child.pid").read_text())).status() == "zombie"


def test_a_daemon_that_crashes_fails_the_run_naming_it(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    # the daemon exits 3 once its client is running; the client ends only after the
    # engine journaled the daemon's failure, so `late`, waiting on both, sees it
    crash = r'''
import os, sys, time
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(sys.argv[1], "client-started")):
    if time.monotonic() > deadline:
        sys.exit("no client")
    time.sleep(0.02)
sys.exit(3)
'''
    watch = r'''
import json, os, sys, time
open(os.path.join(sys.argv[1], "client-started"), "w").close()
journal = os.path.join(sys.argv[2], "run.journal")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    for line in open(journal):
        rec = json.loads(line)["record"]
        if rec["step"] == "server" and rec["state"] == "failed":
            sys.exit(0)
    time.sleep(0.02)
sys.exit("the daemon's failure was never journaled")
'''
    run_dir = tmp_path / "runs" / "crash"
    server = py("server", crash, str(tmp_path), token, daemon=True)
    client = py("client", watch, str(tmp_path), str(run_dir), dependencies=after("server"))
    late = py("late", "print('late')", dependencies=after("server", "client"))
    status = LocalEngine(tmp_path / "runs").start(
        ir.Workflow(name="crashing", steps=(server, client, late)), run_id="crash").wait(120)

    assert status.state is RunState.FAILED
    assert status.message == "steps failed: server"
    srv = by_name(status, "server")
    assert srv.state is StepState.FAILED and srv.exit_code == 3
    assert "exit code 3" in srv.message
    assert by_name(status, "client").state is StepState.SUCCEEDED
    assert by_name(status, "late").state is StepState.SKIPPED  # not run: its daemon failed
    assert leftovers(token) == []


def test_a_crashed_daemon_is_restarted_by_its_retry_policy_for_the_steps_waiting_on_it(
        tmp_path: Path) -> None:
    token, port = uuid.uuid4().hex, free_port()
    # first attempt: leaves a mark and exits 1; the retry serves
    flaky = r'''
import os, sys
mark = os.path.join(sys.argv[2], "crashed-once")
if not os.path.exists(mark):
    open(mark, "w").close()
    sys.exit(1)
exec(sys.argv[4])
'''
    # `gate` ends once the engine journaled the daemon waiting for its retry, so `client`
    # (after both) is decided while the daemon restarts
    watch = r'''
import json, os, sys, time
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    for line in open(os.path.join(sys.argv[1], "run.journal")):
        rec = json.loads(line)["record"]
        if rec["step"] == "server" and rec["state"] == "retrying":
            sys.exit(0)
    time.sleep(0.02)
sys.exit("the daemon never waited for a retry")
'''
    run_dir = tmp_path / "runs" / "flaky"
    server = py("server", flaky, str(port), str(tmp_path), token, SERVER, daemon=True,
                retry=ir.RetryPolicy(limit=1, backoff=ir.Backoff(base_seconds=1.0)))
    gate = py("gate", watch, str(run_dir))
    client = py("client", CLIENT, str(port), dependencies=after("server", "gate"),
                outputs=(ir.OutputParameter("got", ir.OutputSource.STDOUT),))
    status = LocalEngine(tmp_path / "runs").start(
        ir.Workflow(name="flaky", steps=(server, gate, client)), run_id="flaky").wait(120)

    assert status.state is RunState.SUCCEEDED, status.message
    srv = by_name(status, "server")
    assert (srv.state, srv.attempts) == (StepState.SUCCEEDED, 2)
    assert by_name(status, "client").outputs == {"got": "pong"}
    assert leftovers(token) == []


def test_cancelling_the_run_stops_the_daemon(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    server = py("server", FOREVER, str(tmp_path), token, daemon=True)
    client = py("client", WAIT_FOR, str(tmp_path / "never"), token,
                dependencies=after("server"))
    handle = LocalEngine(tmp_path / "runs").start(
        ir.Workflow(name="cancelled", steps=(server, client)))
    deadline = time.monotonic() + 60
    while by_name(handle.status(), "client").state is not StepState.RUNNING:
        assert time.monotonic() < deadline, "the client never started"
        time.sleep(0.02)
    handle.cancel()
    status = handle.wait(60)

    assert status.state is RunState.CANCELLED
    assert by_name(status, "server").state is StepState.CANCELLED
    assert by_name(status, "client").state is StepState.CANCELLED
    assert leftovers(token) == []


def test_a_daemon_in_a_sub_workflow_is_stopped_when_its_inner_steps_end(
        tmp_path: Path) -> None:
    token, port = uuid.uuid4().hex, free_port()
    closed = r'''
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
    print("open")
except ConnectionRefusedError:
    print("closed")
'''
    inner = (py("server", SERVER, str(port), str(tmp_path), token, daemon=True),
             py("client", CLIENT, str(port), dependencies=after("server")))
    group = ir.Step(name="group", body=ir.SubWorkflowSpec(name="group", steps=inner))
    probe = py("probe", closed, str(port), dependencies=after("group"),
               outputs=(ir.OutputParameter("port", ir.OutputSource.STDOUT),))
    status = LocalEngine(tmp_path / "runs").run(
        ir.Workflow(name="scoped", steps=(group, probe)))

    assert status.state is RunState.SUCCEEDED, status.message
    assert by_name(status, "group/server").state is StepState.SUCCEEDED
    assert by_name(status, "group/client").state is StepState.SUCCEEDED
    assert by_name(status, "probe").outputs == {"port": "closed"}  # stopped with its scope
    assert leftovers(token) == []


def test_a_daemon_map_is_refused(tmp_path: Path) -> None:
    step = py("server", FOREVER, "x", daemon=True,
              foreach=ir.ForEach(items=(ir.Literal.of(1), ir.Literal.of(2))))
    with pytest.raises(UnsupportedFeatureError, match=r"'server'.*daemon step.*a map"):
        LocalEngine(tmp_path / "runs").run(ir.Workflow(name="maps", steps=(step,)))


CRASHING_ENGINE = r'''
import sys, time
from pathlib import Path
from couler import ir
from couler_runtime.local import LocalEngine
work, token, forever = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
server = ir.Step(name="server", body=ir.ContainerSpec(
    image="x", command=(sys.executable, "-c", forever, str(work), token)), daemon=True)
client = ir.Step(name="client", body=ir.ContainerSpec(image="x", command=(
    "sh", "-c", f"while [ ! -s {work}/server.pid ]; do sleep 0.02; done; "
                f"echo $$ > {work}/client.pid; sleep 30 # {token}")),
    dependencies=(ir.Dependency("server"),))
LocalEngine(work).start(ir.Workflow(name="crashy", steps=(server, client)), run_id="r")
time.sleep(120)
'''


def test_a_crashed_engine_leaves_no_daemon_and_resume_starts_it_again(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    proc = subprocess.Popen([PY, "-c", CRASHING_ENGINE, str(tmp_path), token, FOREVER])
    pid_file = tmp_path / "client.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the client never started"
        time.sleep(0.05)
    server_pid = int((tmp_path / "server.pid").read_text())
    os.kill(proc.pid, signal.SIGKILL)  # the engine process crashes while the daemon serves
    proc.wait(10)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(server_pid) and psutil.Process(server_pid).status() != "zombie":
        assert time.monotonic() < deadline, "the daemon outlived its engine"
        time.sleep(0.05)
    assert leftovers(token) == []
    _, before = _load(tmp_path / "r")
    assert before[("server", "")].state is StepState.RUNNING

    (tmp_path / "server.pid").write_text("")
    handle = LocalEngine(tmp_path).resume(tmp_path / "r")
    deadline = time.monotonic() + 60
    while not (tmp_path / "server.pid").read_text().strip():
        assert time.monotonic() < deadline, "the daemon was not started again"
        time.sleep(0.05)
    srv = by_name(handle.status(), "server")
    assert srv.state is StepState.RUNNING and srv.attempts == 2  # a new attempt
    handle.cancel()
    assert handle.wait(60).state is RunState.CANCELLED
    assert leftovers(token) == []
