"""Nothing lost: SIGKILL each process of the stack while workflows are in flight.

For each service (and for NATS) a test submits a mix of workflows -- program workflows
(IR) whose steps hold at a gate (a release file the test creates, never a sleep length),
so that they are running at the kill, and text requests submitted right before the kill
so that they are being generated / optimized -- waits until a step has written its
``start`` mark, kills the process with SIGKILL and lets the stack's supervisor start it
again (same ports, same store; no test code restarts anything), checks that ``couler
status`` reports the restart, releases the gates, and asserts:

1. every run ends SUCCEEDED, every step SUCCEEDED (or CACHED);
2. **no step run twice for the same attempt**, counted in three independent places:

   * the program workflows' steps write ``start PID`` / ``end PID`` lines to a marker
     file outside the engine (real executions, whatever the engine records);
   * ``run.journal`` (every change of the run record, appended): attempts started and
     transitions into SUCCEEDED per (step, key);
   * the execution directories ``steps/<step>/<label>/`` with stdout.

   Every step succeeds exactly once (one ``end`` line, one journaled success), and every
   execution on disk is a journaled attempt of its own: the step's ``attempts`` equals
   the attempts journaled and the ``start`` lines written (or one more, when the crash
   killed an attempt before its interpreter reached its first line). When the killed
   process is not the submitter that is exactly one. When the submitter is killed, a
   step running at that moment dies with it (step processes get SIGKILL when the
   engine's process dies) and the resumed run starts it again as attempt 2: one extra
   ``start`` without an ``end``, never a second success; steps that had succeeded are
   not run again;
3. **no duplicate engine submission**: exactly one engine run directory per run (and no
   other), and exactly one ``couler.workflow.submitted`` and one
   ``couler.workflow.finished`` per run in JetStream, and one ``couler.step.succeeded`` per
   executed step.

The module shares one fresh stack (started once: the tests are slow).
"""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from couler import ir
from couler.engines.base import StepState
from couler.v1 import events_pb2
from couler_runtime.rpc.records import Run, RunState

from .conftest import (
    Stack,
    couler_status,
    crash,
    execution_dirs,
    gates_of,
    get,
    gone,
    journal,
    marked_source,
    marked_workflow,
    marks,
    outbox_rows,
    outbox_set_aside,
    release,
    restarted,
    script,
    started,
    stored_events,
    unique,
    wait_finished,
    wait_until,
    write_table,
)

pytestmark = [pytest.mark.slow]

TEXT = "train an XGBoost and a LightGBM model on {table}, evaluate both, keep the better one"


def _submit_batch(live: Stack, marks_root: Path, *, programs: int = 2, texts: int = 2,
                  ) -> tuple[dict[str, Path | None], str]:
    """Submit program workflows (their steps hold at their gates), wait until the first
    one's ``prepare`` has written its ``start`` mark, then submit the text requests (so
    they are being planned at the kill). Run id -> marker dir; the first run's id."""
    runs: dict[str, Path | None] = {}
    # new tables (nothing cached), written first: the requests must follow the running step
    tables = [write_table(marks_root / f"table-{uuid.uuid4().hex[:6]}.csv")
              for _ in range(texts)]
    for _ in range(programs):
        name = unique("nothing-lost")
        directory = marks_root / name
        sub = live.client.submitter.submit(marked_workflow(name, directory))
        assert sub.created
        runs[sub.run_id] = directory
    first = next(iter(runs))
    held = runs[first]
    assert held is not None
    wait_until(lambda: started(held, "prepare"), f"run {first}: prepare started")
    for table in tables:
        sub = live.client.submitter.submit(TEXT.format(table=table))
        runs[sub.run_id] = None
    return runs, first


def _release_all(runs: dict[str, Path | None]) -> None:
    for directory in runs.values():
        if directory is not None:
            release(directory)


def _check(live: Stack, runs: dict[str, Path | None], killed: str) -> None:
    finished = wait_finished(live.client, runs)
    # the records are final; their events leave the outbox after (NATS may be back just now)
    wait_until(lambda: outbox_rows(live.home) == 0, "the submitter's outbox drained")
    problems: list[str] = []
    for run_id, run in finished.items():
        problems += _check_run(live, run, runs[run_id], crash=killed == "submitter")
    # -- no duplicate engine submission
    dirs = {p.name for p in live.runs_dir.iterdir() if p.is_dir() and p.name.startswith("run-")}
    every = {r.run_id for r in live.client.submitter.list(page_size=1000).runs}
    assert dirs == every, f"engine run directories {sorted(dirs ^ every)} differ from runs"
    submitted = stored_events(live.home, "couler.workflow.submitted",
                              events_pb2.WorkflowSubmitted)
    done = stored_events(live.home, "couler.workflow.finished", events_pb2.WorkflowFinished)
    succeeded = stored_events(live.home, "couler.step.succeeded", events_pb2.StepEvent)
    for run_id, run in finished.items():
        n = sum(1 for _, e in submitted if e.run_id == run_id)
        if n != 1:
            problems.append(f"{run_id}: {n} couler.workflow.submitted events")
        n = sum(1 for _, e in done if e.run.run_id == run_id)
        if n != 1:
            problems.append(f"{run_id}: {n} couler.workflow.finished events")
        for step in run.steps:
            if step.state is not StepState.SUCCEEDED:
                continue
            n = sum(1 for _, e in succeeded
                    if e.run_id == run_id and (e.step.name, e.step.key) == (step.name, step.key))
            if n != 1:
                problems.append(f"{run_id}: step {step.name}[{step.key}]: {n} "
                                "couler.step.succeeded events")
    problems += [f"set aside: {x}" for x in outbox_set_aside(live.home)]
    assert problems == [], f"after killing {killed}:\n" + "\n".join(problems)


def _check_run(live: Stack, run: Run, marker_dir: Path | None, *, crash: bool) -> list[str]:
    where = f"run {run.run_id} ({run.workflow})"
    if run.state is not RunState.SUCCEEDED:
        return [f"{where}: {run.state.value}: {run.message}"]
    problems = []
    run_dir = live.runs_dir / run.run_id
    lines = journal(run_dir)
    executed = set(execution_dirs(run_dir))
    extra = 1 if crash else 0  # one interrupted execution per step at most (one crash)
    for step in run.steps:
        label = f"{where}, step {step.name}" + (f"[{step.key}]" if step.key else "")
        if step.state is StepState.CACHED:
            if (step.name, step.key) in lines and lines[step.name, step.key].starts:
                problems.append(f"{label}: cached, yet the journal shows it started")
            if any(d.split("/")[0] == step.name for d in executed):
                problems.append(f"{label}: cached, yet it has an execution directory")
            continue
        if step.state is not StepState.SUCCEEDED or not 1 <= step.attempts <= 1 + extra:
            problems.append(f"{label}: {step.state.value}, attempts {step.attempts}")
            continue
        j = lines.get((step.name, step.key))
        if j is None or j.successes != 1 or j.last_state != "succeeded":
            problems.append(f"{label}: journal {j}: expected exactly one success, last")
        elif j.starts != step.attempts:
            problems.append(f"{label}: journal shows {j.starts} attempt starts, the record "
                            f"{step.attempts} attempts")
        if f"{step.name}/main" not in executed:
            problems.append(f"{label}: no execution directory")
    if marker_dir is not None:
        seen = marks(marker_dir)
        for name in ("prepare", "train-a", "train-b", "pick"):
            got = seen.get(name, [])
            starts = [x for x in got if x.startswith("start")]
            ends = [x for x in got if x.startswith("end")]
            j = lines.get((name, ""))
            if len(ends) != 1:
                problems.append(f"{where}, step {name}: executed to the end {len(ends)} "
                                f"times: {got}")
            step_rec = next((st for st in run.steps if (st.name, st.key) == (name, "")), None)
            # An attempt the crash killed while its interpreter was still starting wrote no
            # "start" line: the record may count one attempt more than the marker shows.
            lost = (step_rec.attempts - len(starts)) if step_rec else -1
            if step_rec is None or not 0 <= lost <= extra:
                problems.append(f"{where}, step {name}: started {len(starts)} times, "
                                f"attempts {step_rec.attempts if step_rec else None}: {got}")
            if j is not None and len(starts) > j.starts:
                problems.append(f"{where}, step {name}: {len(starts)} executions on disk "
                                f"but {j.starts} attempts journaled: {got}")
            # the one that ran to the end is the last one started
            if len(ends) == 1 and ends[0].split()[1] != starts[-1].split()[1]:
                problems.append(f"{where}, step {name}: an older execution finished after "
                                f"its replacement started: {got}")
    return problems


def _kill(live: Stack, name: str) -> None:
    """SIGKILL ``name``; the supervisor brings it back, and ``couler status`` says so."""
    rec = crash(live, name)
    code, shown = couler_status(live.home)
    assert code == 0, shown  # every process runs again
    line = re.search(rf"^  {name}\s+running\s+pid {rec.pid}\s.*$", shown, re.M)
    assert line, shown
    assert f"restarts {rec.restarts}, last exit: killed by SIGKILL" in line.group(0), shown


@pytest.fixture(scope="module")
def marks_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marks")


@pytest.mark.parametrize("name", ["generator", "optimizer", "cache", "monitor", "submitter"])
def test_sigkill_a_service_mid_flight_loses_nothing(
        live: Stack, marks_root: Path, name: str) -> None:
    # The steps hold until released after the restart: the kill interrupts the running
    # ones (for the submitter: they die with it and run again).
    runs, first = _submit_batch(live, marks_root)
    # in flight: the first program run has a step running, the text requests are planning
    assert not get(live.client, first).state.terminal
    _kill(live, name)
    _release_all(runs)
    _check(live, runs, name)


def test_sigkill_nats_mid_run_loses_nothing(live: Stack, marks_root: Path) -> None:
    runs, first = _submit_batch(live, marks_root)
    assert not get(live.client, first).state.terminal
    _kill(live, "nats")
    _release_all(runs)
    _check(live, runs, "nats")


def test_a_step_running_at_a_submitter_crash_dies_with_it_and_runs_again_as_attempt_2(
        live: Stack, marks_root: Path) -> None:
    """A step's process runs in its own session but gets SIGKILL when the engine's process
    dies, so it cannot end unobserved while the submitter is down (a result nobody
    recorded). The resumed run runs it again as attempt 2; it ends exactly once."""
    name = unique("killed-with-submitter")
    directory = marks_root / name
    sub = live.client.submitter.submit(marked_workflow(name, directory))
    wait_until(lambda: started(directory, "prepare"), f"run {sub.run_id}: prepare started")
    step_pid = int(marks(directory)["prepare"][0].split()[1])
    assert not gone(step_pid)
    before = live.record("submitter")
    os.kill(before.pid, signal.SIGKILL)  # the crash; the supervisor starts it again
    wait_until(lambda: gone(step_pid), "the step process gone with the submitter")
    assert not any(x.startswith("end") for x in marks(directory)["prepare"])
    restarted(live, "submitter", before)
    release(directory)
    run = wait_finished(live.client, [sub.run_id])[sub.run_id]
    assert run.state is RunState.SUCCEEDED, run.message
    seen = marks(directory)
    assert [len([x for x in seen.get(s, []) if x.startswith("end")])
            for s in ("prepare", "train-a", "train-b", "pick")] == [1, 1, 1, 1], seen
    assert len([x for x in seen["prepare"] if x.startswith("start")]) == 2, seen
    assert run.step("prepare").attempts == 2


def test_a_second_submitter_crash_does_not_rerun_a_step_the_first_resume_finished(
        live: Stack, marks_root: Path) -> None:
    """Two crashes of the submitter in one run: what the first resumed run finished stays
    finished. ``x`` is interrupted by the first crash (after twelve quick steps, so the
    first run's journal is long), runs again to its end in the resumed run, then ``y1``
    ends and ``y2`` is running at the second crash: after it, ``x`` must not run again.
    ``x``, ``y1`` and ``y2`` hold at their gates until the test releases each."""
    name = unique("two-crashes")
    directory = marks_root / name
    directory.mkdir(parents=True)
    gates = gates_of(directory)
    out = (ir.OutputParameter("said", source=ir.OutputSource.STDOUT),)
    quick = tuple(script(f"p{i:02d}", marked_source(f"p{i:02d}", directory),
                         outputs=out) for i in range(12))
    x = script("x", marked_source("x", directory, gate=gates / "x"), outputs=out,
               dependencies=tuple(ir.Dependency(s.name) for s in quick))
    y1 = script("y1", marked_source("y1", directory, gate=gates / "y1"), outputs=out,
                dependencies=(ir.Dependency("x"),))
    y2 = script("y2", marked_source("y2", directory, gate=gates / "y2"), outputs=out,
                dependencies=(ir.Dependency("x"),))
    sub = live.client.submitter.submit(ir.Workflow(name=name, steps=(*quick, x, y1, y2)))

    def wrote(step: str, what: str) -> Callable[[], bool]:
        return lambda: any(line.startswith(what) for line in marks(directory).get(step, []))

    wait_until(wrote("x", "start"), "x started")
    _kill(live, "submitter")  # x interrupted (held at its gate)
    release(directory, "x", "y1")  # x runs again to its end, then y1 ends; y2 holds
    wait_until(wrote("y1", "end"), "y1 ended in the resumed run")
    wait_until(lambda: get(live.client, sub.run_id).step("y1").state is StepState.SUCCEEDED,
               "y1 recorded")
    wait_until(wrote("y2", "start"), "y2 started")
    assert not wrote("y2", "end")()
    _kill(live, "submitter")  # y2 interrupted (held at its gate)
    release(directory, "y2")
    run = wait_finished(live.client, [sub.run_id])[sub.run_id]
    assert run.state is RunState.SUCCEEDED, run.message
    seen = marks(directory)
    ended = {step: sum(1 for line in lines if line.startswith("end"))
             for step, lines in seen.items()}
    assert ended == dict.fromkeys(ended, 1) and len(ended) == 15, seen


def test_all_runs_of_the_module_left_one_engine_directory_each(live: Stack) -> None:
    """After every kill: the run directories are exactly the runs, and all succeeded."""
    runs = live.client.submitter.list(page_size=1000).runs
    assert runs and all(r.state is RunState.SUCCEEDED for r in runs), [
        (r.run_id, r.state.value, r.message) for r in runs if r.state is not RunState.SUCCEEDED]
    dirs = {p.name for p in live.runs_dir.iterdir() if p.name.startswith("run-")}
    assert dirs == {r.run_id for r in runs}
