"""RayExecutor.start: a handle whose status shows running steps, and whose cancel() stops them.

Run only by tests/ray_engine/run_in_netns.sh (Ray venv, private network namespace).
Steps coordinate through files (a flag the test creates, a pid file the step writes),
never through sleeps of the test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from couler import ir
from couler.engines.base import RunState, RunStatus, StepState, StepStatus
from couler_runtime.ray import RayExecutor
from couler_runtime.ray.executor import EVENTS_FILE, RayRun

STDOUT = (ir.OutputParameter("result", ir.OutputSource.STDOUT),)


def shell(name: str, command: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="alpine", command=("sh", "-c", command))
    return ir.Step(name=name, body=body, **kw)  # type: ignore[arg-type]


def by_key(status: RunStatus, step: str, key: str = "") -> StepStatus:
    return next(s for s in status.steps if s.step == step and s.key == key)


def until(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def sleeper(name: str, pid_file: Path, **kw: object) -> ir.Step:
    """A step that records its pid, then sleeps far longer than any check runs."""
    return shell(name, f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; "
                       "exec sleep 300", **kw)


def test_status_shows_running_steps_then_the_result(tmp_path: Path) -> None:
    flag = tmp_path / "go"
    first = shell("first", f"while [ ! -e {flag} ]; do sleep 0.05; done; echo released",
                  outputs=STDOUT)
    second = shell("second", "echo after-{{inputs.x}}", outputs=STDOUT,
                   inputs=(ir.InputParameter("x", ir.StepOutputRef("first", "result")),),
                   dependencies=(ir.Dependency("first"),))
    seen: list[tuple[str, str]] = []
    handle = RayExecutor(tmp_path / "runs").start(
        ir.Workflow("gated", (first, second)),
        on_event=lambda s: seen.append((s.step, s.state.value)))
    assert isinstance(handle, RayRun)
    until("'first' to run", lambda: by_key(handle.status(), "first").state is StepState.RUNNING)
    status = handle.status()
    assert status.state is RunState.RUNNING and status.finished_at is None
    running = by_key(status, "first")
    assert running.attempts == 1 and running.started_at is not None
    assert by_key(status, "second").state is StepState.PENDING
    assert handle.wait(timeout=0.2).state is RunState.RUNNING  # wait() honours its timeout
    flag.touch()
    final = handle.wait(timeout=120)
    assert final.state is RunState.SUCCEEDED, final
    assert by_key(final, "second").outputs == {"result": "after-released"}
    assert seen.index(("first", "running")) < seen.index(("first", "succeeded")) \
        < seen.index(("second", "running")) < seen.index(("second", "succeeded"))
    assert (handle.run_dir / EVENTS_FILE).is_file()
    record = json.loads((handle.run_dir / "run.json").read_text())
    assert record["state"] == "succeeded"
    assert {s["step"]: s["state"] for s in record["steps"]} == {"first": "succeeded",
                                                                "second": "succeeded"}
    handle.cancel()  # a finished run: nothing changes
    assert handle.wait(timeout=5).state is RunState.SUCCEEDED


def test_cancel_stops_a_long_sleep_and_kills_its_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    slow = sleeper("slow", pid_file, outputs=STDOUT)
    downstream = shell("downstream", "echo never", dependencies=(ir.Dependency("slow"),))
    hook = shell("on-exit", f"touch {tmp_path / 'hook-ran'}")
    wf = ir.Workflow("cancel-me", (slow, downstream),
                     exit_hooks=(ir.ExitHook(ir.RunStatus.ANY, (hook,)),))
    handle = RayExecutor(tmp_path / "runs").start(wf)
    until("the sleep to start", pid_file.is_file)
    pid = int(pid_file.read_text())
    assert not gone(pid)
    until("'slow' to show as running",
          lambda: by_key(handle.status(), "slow").state is StepState.RUNNING)
    handle.cancel()
    final = handle.wait(timeout=60)
    assert final.state is RunState.CANCELLED, final
    assert final.message == "cancelled" and final.finished_at is not None
    stopped = by_key(final, "slow")
    assert stopped.state is StepState.CANCELLED and stopped.started_at is not None
    # The task itself killed the process (the interrupt, not the forced kill of its worker).
    assert stopped.exit_code == -9 and stopped.message == "cancelled"
    assert by_key(final, "downstream").state is StepState.CANCELLED
    assert gone(pid), f"the step's process {pid} survived the cancellation"
    assert not (tmp_path / "hook-ran").exists()  # exit hooks do not run after a cancel
    assert {s.step for s in final.steps} == {"slow", "downstream"}
    record = json.loads((handle.run_dir / "run.json").read_text())
    assert record["state"] == "cancelled"


def test_cancel_stops_every_map_item(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    each = shell("each", f"echo $$ > {pids}/{{{{item}}}}; exec sleep 300",
                 foreach=ir.ForEach(items=tuple(ir.Literal.of(i) for i in range(4))))
    handle = RayExecutor(tmp_path / "runs").start(ir.Workflow("cancel-map", (each,)))
    # The session cluster has 2 CPUs: two items run, two wait for a CPU.
    until("two items to start", lambda: len([p for p in pids.iterdir()
                                             if p.read_text().strip()]) == 2)
    started = [int(p.read_text()) for p in pids.iterdir()]
    handle.cancel()
    final = handle.wait(timeout=60)
    assert final.state is RunState.CANCELLED, final
    assert by_key(final, "each").state is StepState.CANCELLED
    items = {s.key: s.state for s in final.steps if s.step == "each" and s.key}
    assert len(items) == 2 and set(items.values()) == {StepState.CANCELLED}
    assert all(gone(pid) for pid in started)
    assert len(list(pids.iterdir())) == 2  # the queued items never started


def test_run_is_start_then_wait(tmp_path: Path) -> None:
    step = shell("hello", "echo hi", outputs=STDOUT)
    events: list[StepStatus] = []
    status = RayExecutor(tmp_path / "runs").run(ir.Workflow("hello", (step,)),
                                                on_event=events.append)
    assert status.state is RunState.SUCCEEDED
    assert by_key(status, "hello").outputs == {"result": "hi"}
    assert [e.state for e in events if e.step == "hello"][-1] is StepState.SUCCEEDED
    assert by_key(status, "hello").peak_memory_bytes is not None
