"""The Ray executor: each step execution of a workflow is one Ray task.

Mapping of the IR onto Ray:

* **Execution**: a task runs its step exactly as the local engine does -- it
  builds a :class:`~couler_runtime.local.engine.LocalRun` for the run
  directory and calls its single-attempt method (placeholders, path rewriting,
  secrets, the sampled process, output files and the artifact store are the
  local engine's). The run directory must therefore be on a file system every
  Ray node sees (one machine, or a shared mount).
* **Dependencies**: a task receives the object refs of its upstream steps'
  results as arguments, so Ray starts it only after they finished; a result
  is a dict ``{"record": <step record>, "executions": [<item / iteration
  records>]}`` whose record carries the state, outputs and failure class.
  Steps whose outputs a step reads (inputs, ``when``, map source) count as
  upstream too.
* **Edge conditions, depends, when / else**: evaluated inside the task on the
  upstream results (the local engine's rules); a step that must not run
  returns a SKIPPED record without starting a process.
* **map**: static items -> one task per item plus a zero-CPU task that
  aggregates the items' outputs into JSON lists (as the local engine does).
  Items from an upstream output are resolved by the driver once the upstream
  tasks finished (``ray.wait``), then the same tasks are submitted. A
  parallelism bound N is expressed as N lanes: item i also waits for item i-N.
* **Resources** (``@ray.remote`` options, from the step's resources or the
  workflow defaults): ``num_cpus`` = cpu_request (or cpu_limit; fractions
  allowed; default 1), ``memory`` = memory_request (or memory_limit) in bytes,
  ``num_gpus`` = gpu. memory_limit is also enforced by sampling the process
  tree's RSS, as on the local engine. A step requesting more CPUs, memory or
  GPUs than the whole cluster has is failed before submission with a message
  naming both numbers (Ray would keep an infeasible task pending forever).
* **Retries**: ``max_retries`` = the policy's limit and ``retry_exceptions`` =
  [:class:`RetryAttempt`]. The task classifies a failed attempt like the local
  engine (:func:`couler.failures.classify` over its exit code and stderr; the
  earlier attempts, for the repeat rule, are kept in the attempt file). When the
  policy retries that class and
  retries remain, the task sleeps the back-off, escalates the sampled memory
  limit on OOM, and raises :class:`RetryAttempt` so Ray re-executes it;
  otherwise it returns a FAILED record (so downstream edge conditions such as
  ``failed`` / ``any`` still see the result). Attempts are counted in a file in
  the execution directory, since a Ray task does not know its attempt number.
* **Loops**: all iterations run inside one task through the local engine's
  loop (its per-iteration retry policy applies; ``max_retries=0``).
* **Tuning**: a tune step runs in one Ray task that drives its optuna study with the
  local engine's driver (ask, up to ``parallel`` trial processes at once, tell, pruning
  from reported values, best outputs; ``max_retries=0``, each trial follows the step's
  retry policy); its trials are reported as ``step[N]``. The study's storage
  (``tune_storage``) must be reachable from every node: SQLite on the shared run
  directory's file system, or PostgreSQL.
* **Exit hooks**: run by the driver after the main graph, chosen by its final
  state as on the local engine.
* **A task's workflow**: each task is shipped the workflow with only its own
  step (parameters, defaults and volumes kept), so what a task costs does not
  grow with the workflow.

Utilization while steps run: with ``on_sample``, a task samples the process tree its step
runs (psutil in the task, on the worker's node, as the local engine does: the average cores
over each interval and the resident memory, about every ``series_seconds``) and appends
each :class:`~couler.engines.base.StepSample` to ``samples.jsonl`` in the run directory;
the driver reads it with the events and calls ``on_sample`` on its thread.

Running and cancelling: :meth:`RayExecutor.start` returns a :class:`RayRun` at
once; a driver thread submits the tasks and collects their results
(``run()`` = ``start()`` + ``wait()``). The tasks append each change of their
step (running, every attempt, retrying, the end) to ``events.jsonl`` in the run
directory; the driver reads it between short ``ray.wait`` slices, so
:meth:`RayRun.status` and the ``on_event`` callback (called on the driver thread,
as the local engine's) show steps while they run. :meth:`RayRun.cancel`
interrupts every unfinished task (``ray.cancel(force=False, recursive=True)``: a
KeyboardInterrupt in the task, which cancels the task's local run, so the step's
process tree is killed by the local engine's process loop), kills the
worker of any task still running after :data:`CANCEL_GRACE_SECONDS`
(``force=True``; killing the worker first would leave the step's process tree,
which runs in its own session, to Ray's clean-up of a dead worker's children,
and lose the step's last record), and ends the run CANCELLED with every unfinished step
CANCELLED; exit hooks do not run after a cancellation, as on the local engine.

Ray is imported when a run starts; without it :class:`RayExecutor` raises
:class:`~couler.errors.UserError`. The executor connects with ``ray.init`` when
Ray is not initialized yet, and shuts Ray down only when asked
(:meth:`RayExecutor.shutdown`, which does so only if it connected).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from couler import failures, ir
from couler.engines.base import (
    RunState,
    RunStatus,
    StepSample,
    StepState,
    StepStatus,
    check_capabilities,
)
from couler.errors import InvalidWorkflowError, RetryableError, UserError
from couler.semantics import failed_leaves
from couler_runtime.local.engine import (
    LocalEngine,
    LocalRun,
    _expr_steps,
    _final_reason,
    _MapState,
    _quantity,
    failure_message,
    hook_not_fired,
    skipped_without_running,
)
from couler_runtime.local.journal import _Record
from couler_runtime.local.prepare import _StepError
from couler_runtime.local.process import SERIES_SECONDS

from .capabilities import CAPABILITIES, ENGINE

__all__ = ["CANCEL_GRACE_SECONDS", "EVENTS_FILE", "SAMPLES_FILE", "RayExecutor", "RayRun",
           "RetryAttempt"]

log = logging.getLogger(__name__)

EventCallback = Callable[[StepStatus], None]
SampleCallback = Callable[[StepSample], None]
EVENTS_FILE = "events.jsonl"  # step changes appended by the tasks, read by the driver
SAMPLES_FILE = "samples.jsonl"  # utilization samples appended by the tasks (on_sample)
CANCEL_GRACE_SECONDS = 5.0  # an interrupted task has this long to kill its processes
_POLL_SECONDS = 0.1
_CONNECT_SECONDS = 5.0
_ATTEMPT_FILE = ".ray-attempt.json"
Result = dict[str, Any]  # {"record": _Record.to_dict(), "executions": [...]}


class RetryAttempt(Exception):  # noqa: N818 - a signal to Ray, not an error of the caller
    """Raised by a task whose attempt failed in a retryable way: Ray re-executes the task."""


@dataclass(frozen=True)
class _Context:
    """What every task of one run needs (shipped in the task arguments)."""

    run_dir: str
    workflow: ir.Workflow
    parameters: Mapping[str, str]
    secrets: Mapping[tuple[str, str], str]
    image_commands: Mapping[str, tuple[str, ...]]
    samples: bool = False  # tasks append their steps' utilization samples to SAMPLES_FILE
    series_seconds: float = SERIES_SECONDS
    tune_storage: str | None = None


# --------------------------------------------------------------------------- task side


class _TaskRun(LocalRun):
    """A local run used to execute single steps inside a Ray task.

    It keeps no ``run.json`` and no journal: concurrent tasks would race on them;
    the driver keeps the run record instead (it learns of changes through the
    events file and the tasks' results).
    """

    def _persist(self) -> None:
        return

    def _journal_record(self, rec: _Record) -> None:
        return


def _local_run(ctx: _Context, upstream: Sequence[Result] = (), *,
               events: bool = False) -> _TaskRun:
    """A local run for ``ctx``; with ``events``, its step changes go to the events file."""
    run_dir = Path(ctx.run_dir)
    # one process per task, but a tune step's task runs its trials, ``parallel`` at once
    workers = max([1, *(s.tune.parallel for s in ctx.workflow.steps if s.tune is not None)])
    engine = LocalEngine(run_dir.parent, max_workers=workers, secrets=ctx.secrets,
                         image_commands=ctx.image_commands, tune_storage=ctx.tune_storage,
                         series_seconds=ctx.series_seconds)
    on_event = functools.partial(_append_event, run_dir / EVENTS_FILE) if events else None
    on_sample = (functools.partial(_append_sample, run_dir / SAMPLES_FILE)
                 if events and ctx.samples else None)
    run = _TaskRun(engine, ctx.workflow, run_dir, parameters=ctx.parameters, on_event=on_event,
                   on_sample=on_sample)
    for result in upstream:
        rec = _Record.from_dict(result["record"])
        run._records[(rec.step, "")] = rec
        for execution in result["executions"]:  # a map's items: "any succeeded" counts them
            item = _Record.from_dict(execution)
            if item.key:
                run._records[(item.step, item.key)] = item
    return run


def _status_dict(status: StepStatus) -> dict[str, Any]:
    return {"step": status.step, "state": status.state.value, "key": status.key,
            "attempts": status.attempts, "exit_code": status.exit_code,
            "started_at": status.started_at, "finished_at": status.finished_at,
            "peak_cpu": status.peak_cpu, "peak_memory_bytes": status.peak_memory_bytes,
            "outputs": dict(status.outputs), "message": status.message}


def _status_from(data: Mapping[str, Any]) -> StepStatus:
    return StepStatus(**{**data, "state": StepState(data["state"])})


def _append_event(path: Path, status: StepStatus) -> None:
    """Append one step change to the run's events file, read by the driver."""
    _append_line(path, _status_dict(status))


def _append_sample(path: Path, sample: StepSample) -> None:
    """Append one utilization sample to the run's samples file, read by the driver."""
    _append_line(path, dataclasses.asdict(sample))


def _append_line(path: Path, data: Mapping[str, Any]) -> None:
    """Append one JSON line to ``path``.

    One ``write`` on an ``O_APPEND`` descriptor, so lines of concurrent tasks never
    interleave.
    """
    line = (json.dumps(data) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _interruptible(run: _TaskRun, body: Callable[[], Result]) -> Result:
    """Run ``body`` on a thread; a Ray cancellation kills the step's processes first.

    ``ray.cancel`` (not forced) raises KeyboardInterrupt in the task's main thread.
    Raised inside the local engine's process loop, it would leave the step's
    process tree running (it has its own session); here it cancels the local run
    instead, which makes that loop kill the tree and the step end CANCELLED.
    """
    box: list[Result | BaseException] = []

    def target() -> None:
        try:
            box.append(body())
        except BaseException as exc:  # re-raised on the task's main thread
            box.append(exc)

    thread = threading.Thread(target=target, name="couler-ray-step", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(_POLL_SECONDS)
    except KeyboardInterrupt:
        run.cancel()
        thread.join()
        raise
    outcome = box[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _find_step(wf: ir.Workflow, name: str) -> ir.Step:
    for step in (*wf.steps, *(s for hook in wf.exit_hooks for s in hook.steps)):
        if step.name == name:
            return step
    raise InvalidWorkflowError(f"workflow {wf.name!r}: no step named {name!r}")


def _outcome(state: StepState) -> str:
    """A step's outcome for rule S7 (as the local engine decides it)."""
    if state in (StepState.SUCCEEDED, StepState.CACHED):
        return "succeeded"
    return "skipped" if state is StepState.SKIPPED else "failed"


def _result(rec: _Record, executions: Sequence[_Record] = ()) -> Result:
    return {"record": rec.to_dict(), "executions": [r.to_dict() for r in executions]}


def _ended(name: str, state: StepState, message: str, key: str = "") -> Result:
    return _result(_Record(name, key=key, state=state, message=message, finished_at=time.time()))


def _skipped(name: str, decision: str, key: str = "") -> Result:
    """A step the scheduler decided not to run: skipped by its own when, or never run
    because its dependencies did not hold (its dependents then do not run either)."""
    return _result(_Record(name, key=key, state=StepState.SKIPPED, message=decision,
                           finished_at=time.time(),
                           omitted=skipped_without_running(decision)))


def _decision(run: _TaskRun, step: ir.Step) -> str | None:
    """None = run the step; otherwise why it does not run (a SKIPPED record)."""
    decision = run._decide(step)
    if decision is None:  # cannot happen: every upstream result is terminal
        return "upstream results are missing"
    return decision or None


def _save(path: Path, state: Mapping[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _attempt_once(run: _TaskRun, step: ir.Step, key: str, label: str, item: object) -> _Record:
    """One attempt of one execution; raises :class:`RetryAttempt` when Ray should retry."""
    wf = run.workflow
    policy = step.retry or wf.defaults.retry
    timeout = step.timeout_seconds or wf.defaults.timeout_seconds
    resources = step.resources or wf.defaults.resources
    exec_dir = run.run_dir / "steps" / step.name / label
    exec_dir.mkdir(parents=True, exist_ok=True)
    state_path = exec_dir / _ATTEMPT_FILE
    state: dict[str, Any] = (
        json.loads(state_path.read_text()) if state_path.is_file() else
        {"attempts": 0, "started_at": time.time(),
         "memory_limit": _quantity(resources.memory_limit) if resources else None})
    state["attempts"] += 1
    _save(state_path, state)
    attempts = int(state["attempts"])
    rec = _Record(step.name, key=key)
    run._update(rec, state=StepState.RUNNING, attempts=attempts,
                started_at=float(state["started_at"]))
    # the earlier attempts' (exit code, error line), kept across Ray's task retries
    previous = [failures.Attempt(a[0], a[1]) for a in state.get("previous", [])]
    failure = run._attempt(step, rec, label, item, timeout=timeout,
                           memory_limit=state["memory_limit"], previous=previous)
    state["previous"] = [[a.exit_code, a.error] for a in previous]
    _save(state_path, state)
    if failure is None:
        run._update(rec, state=StepState.SUCCEEDED, finished_at=time.time(), failure="",
                    failure_reason="")
        return rec
    if failure == "cancelled":
        run._update(rec, state=StepState.CANCELLED, finished_at=time.time())
        return rec
    retries = attempts - 1
    retryable = (failure != "fatal" and policy is not None and retries < policy.limit
                 and (ir.FailureClass.ANY in policy.on or ir.FailureClass(failure) in policy.on))
    if not retryable or policy is None:
        run._update(rec, state=StepState.FAILED, finished_at=time.time(),
                    failure="" if failure == "fatal" else failure,
                    failure_reason=_final_reason(rec, failure, policy, retries))
        return rec
    delay = 0.0
    if policy.backoff is not None:
        b = policy.backoff
        delay = b.base_seconds * b.factor ** retries
        if b.cap_seconds is not None:
            delay = min(delay, b.cap_seconds)
    limit = state["memory_limit"]
    if failure == ir.FailureClass.OOM.value and policy.memory_factor and limit is not None:
        limit = int(limit * policy.memory_factor)
        ceiling = _quantity(policy.memory_ceiling)
        state["memory_limit"] = min(limit, ceiling) if ceiling is not None else limit
        _save(state_path, state)
    run._update(rec, state=StepState.RETRYING, failure=failure)
    if run._cancel.wait(delay):
        run._update(rec, state=StepState.CANCELLED, finished_at=time.time())
        return rec
    raise RetryAttempt(f"{rec.message} (attempt {attempts} of {policy.limit + 1}, {failure})")


def _step_task(ctx: _Context, name: str, index: int | None, item: object, n_upstream: int,
               *upstream: Result) -> Result:
    """The body of a step's (or a map item's) Ray task.

    ``upstream[:n_upstream]`` are the upstream results; the rest only order the
    task (a map lane's previous item).
    """
    step = _find_step(ctx.workflow, name)
    run = _local_run(ctx, upstream[:n_upstream], events=True)
    key = "" if index is None else str(index)
    skip = _decision(run, step)
    if skip is not None:
        return _skipped(name, skip, key)
    if step.loop is not None or step.tune is not None:
        def loop() -> Result:
            rec = _Record(name)
            run._records[(name, "")] = rec
            run._run_step(step)
            iterations = [r for (s, k), r in run._records.items() if s == name and k]
            return _result(run._records[(name, "")], iterations)

        return _interruptible(run, loop)
    label = "main" if index is None else f"item-{index}"
    return _interruptible(run, lambda: _result(_attempt_once(run, step, key, label, item)))


def _map_task(ctx: _Context, name: str, n_upstream: int, *results: Result) -> Result:
    """Aggregate a map's item results into the step's result (local engine rules)."""
    step = _find_step(ctx.workflow, name)
    run = _local_run(ctx, results[:n_upstream])
    skip = _decision(run, step)
    if skip is not None:
        return _skipped(name, skip)
    items = [_Record.from_dict(r["record"]) for r in results[n_upstream:]]
    for rec in items:
        run._records[(name, rec.key)] = rec
    starts = [r.started_at for r in items if r.started_at is not None]
    run._records[(name, "")] = _Record(name, state=StepState.RUNNING,
                                       started_at=min(starts) if starts else time.time())
    run._finish_map(_MapState(step, [None] * len(items)))
    return _result(run._records[(name, "")], items)


# --------------------------------------------------------------------------- driver side


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise UserError(
            "the Ray executor needs the 'ray' package, which is not installed in this "
            "environment: create the Ray environment with `scripts/setup-engine-venv.sh ray` "
            "(requirements-ray.txt) and run from .venv-ray") from exc


def _needs(step: ir.Step, available: set[str]) -> list[str]:
    """Upstream steps of ``step``: its dependencies and the steps whose outputs it reads."""
    names = [d.step for d in step.dependencies]
    if step.depends is not None:
        names += _expr_steps(step.depends)
    sources: list[ir.ValueSource] = [i.value for i in step.inputs]
    if step.when is not None:
        sources += [step.when.condition.left, step.when.condition.right]
    if step.foreach is not None and step.foreach.source is not None:
        sources.append(step.foreach.source)
    names += [s.step for s in sources if isinstance(s, ir.StepOutputRef)]
    return [n for n in dict.fromkeys(names) if n != step.name and n in available]


def task_options(step: ir.Step, wf: ir.Workflow) -> dict[str, Any]:
    """The ``ray.remote`` options of a step's tasks (see the module docs for the mapping)."""
    resources = step.resources or wf.defaults.resources
    policy = step.retry or wf.defaults.retry
    opts: dict[str, Any] = {"name": f"{wf.name}.{step.name}", "num_cpus": 1.0,
                            "max_retries": 0, "retry_exceptions": False}
    if resources is not None:
        cpu = resources.cpu_request or resources.cpu_limit
        if cpu:
            opts["num_cpus"] = float(ir.parse_quantity(cpu))
        memory = _quantity(resources.memory_request or resources.memory_limit)
        if memory:
            opts["memory"] = memory
        if resources.gpu:
            opts["num_gpus"] = resources.gpu
    if policy is not None and step.loop is None and step.tune is None and policy.limit > 0:
        opts["max_retries"] = policy.limit
        opts["retry_exceptions"] = [RetryAttempt]
    return opts


def _check_reachable(address: str) -> None:
    """Fail fast on a ``host:port`` nobody listens on (``ray.init`` would retry for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", "ray://...": left to Ray
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_SECONDS).close()
    except OSError as exc:
        raise RetryableError(f"cannot reach the Ray cluster at {address!r}: {exc}") from exc


def _new_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The whole lines appended to ``path`` after ``offset``, and the offset after them."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return [], offset
    end = chunk.rfind(b"\n") + 1
    return chunk[:end].splitlines(), offset + end


class _Cancelled(Exception):  # noqa: N818 - control flow inside the driver thread
    """The run was cancelled while the driver waited."""


class RayRun:
    """A run on Ray in progress: wait for it, cancel it, or read its status.

    Created by :meth:`RayExecutor.start`. A driver thread submits the tasks and
    collects their results; the tasks report their step changes (running, each
    attempt, retrying...) through an events file in the run directory, so
    :meth:`status` and ``on_event`` show steps while they run.
    """

    def __init__(self, executor: RayExecutor, ray: Any, ctx: _Context, run_id: str,
                 on_event: EventCallback | None, *,
                 on_sample: SampleCallback | None = None) -> None:
        self.executor = executor
        self.workflow = ctx.workflow
        self.run_dir = Path(ctx.run_dir)
        self.run_id = run_id
        self._ray = ray
        self._ctx = ctx
        self._on_event = on_event
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._records: dict[tuple[str, str], StepStatus] = {
            (s.name, ""): StepStatus(s.name, StepState.PENDING) for s in ctx.workflow.steps}
        self._state = RunState.PENDING
        self._message = ""
        self._started_at: float | None = None
        self._finished_at: float | None = None
        self._tasks: list[Any] = []  # every task submitted, for cancel()
        self._events = self.run_dir / EVENTS_FILE
        self._events_offset = 0
        self._on_sample = on_sample
        self._samples = self.run_dir / SAMPLES_FILE
        self._samples_offset = 0
        self._thread = threading.Thread(target=self._main, name=f"couler-ray-{run_id}",
                                        daemon=True)

    # ------------------------------------------------------------------ public API

    def wait(self, timeout: float | None = None) -> RunStatus:
        """Block until the run ends (or ``timeout`` seconds pass) and return its status."""
        self._thread.join(timeout)
        return self.status()

    def cancel(self) -> None:
        """Stop the run: its Ray tasks are cancelled and unfinished steps end CANCELLED.

        Running tasks are interrupted first (``ray.cancel(force=False)``), which makes
        them kill their step's process tree; a task still alive after
        :data:`CANCEL_GRACE_SECONDS` is killed (``force=True``). Returns at once;
        :meth:`wait` returns when the run has ended.
        """
        self._cancel.set()

    def status(self) -> RunStatus:
        """The current status of the run and of every step execution seen so far."""
        with self._lock:
            return RunStatus(run_id=self.run_id, workflow=self.workflow.name, state=self._state,
                             steps=tuple(self._records.values()), started_at=self._started_at,
                             finished_at=self._finished_at, message=self._message)

    # ------------------------------------------------------------------ records

    def _set(self, status: StepStatus, *, final: bool) -> None:
        """Record a step change; a task's event never overrides a terminal state."""
        key = (status.step, status.key)
        with self._lock:
            current = self._records.get(key)
            if current == status or (not final and current is not None
                                     and current.state.terminal):
                return
            self._records[key] = status
        if self._on_event is not None:
            self._on_event(status)

    def _apply(self, result: Result) -> None:
        for data in (result["record"], *result.get("executions", ())):
            self._set(_Record.from_dict(data).status(), final=True)

    def _poll_samples(self) -> None:
        """Pass on the samples the tasks appended since the last poll (whole lines only)."""
        if self._on_sample is None:
            return
        lines, self._samples_offset = _new_lines(self._samples, self._samples_offset)
        for line in lines:
            try:
                self._on_sample(StepSample(**json.loads(line)))
            except Exception:  # a consumer's failure never stops the run
                log.warning("run %s: a utilization sample could not be passed on", self.run_id,
                            exc_info=True)

    def _poll_events(self) -> None:
        """Read the events (and samples) the tasks appended since the last poll."""
        self._poll_samples()
        lines, self._events_offset = _new_lines(self._events, self._events_offset)
        for line in lines:
            status = _status_from(json.loads(line))
            parent = (status.step, "")
            if status.key and parent in self._records \
                    and self._records[parent].state is StepState.PENDING:
                # The first item of a map runs: so does the map (as on the local engine).
                self._set(StepStatus(status.step, StepState.RUNNING,
                                     started_at=status.started_at), final=False)
            self._set(status, final=False)

    # ------------------------------------------------------------------ main

    def _main(self) -> None:
        with self._lock:
            self._state, self._started_at = RunState.RUNNING, time.time()
        try:
            final, message = self._execute()
        except _Cancelled:
            final, message = RunState.CANCELLED, "cancelled"
            self._stop()
        except Exception as exc:  # an executor bug must still leave a final record
            final, message = RunState.FAILED, f"Ray executor error: {exc!r}"
            self._stop()
        with self._lock:
            self._state, self._message, self._finished_at = final, message, time.time()
        _write_record(self.run_dir, self.workflow, self._ctx.parameters, self.status())

    def _execute(self) -> tuple[RunState, str]:
        wf = self.workflow
        refs = self._graph(wf.steps, {})
        results = self._collect({s.name: refs[s.name] for s in wf.steps})
        main = [_Record.from_dict(results[s.name]["record"]) for s in wf.steps]
        failed = [r for r in main if r.state is StepState.FAILED]
        states = {r.step: r.state for r in main}
        unhandled = failed_leaves(wf.steps, lambda name: _outcome(states[name])) \
            if failed else []
        final = RunState.FAILED if unhandled else RunState.SUCCEEDED  # rule S7
        message = failure_message(failed, unhandled)
        hooks = _local_run(self._ctx)._hooks(final, failed)
        firing = {s.name for s in hooks}
        for hook in wf.exit_hooks:  # recorded as not fired, not left pending
            for step in hook.steps:
                if step.name not in firing:
                    self._set(StepStatus(step.name, StepState.SKIPPED, finished_at=time.time(),
                                         message=hook_not_fired(hook, f"the run {final.value}")),
                              final=True)
        if hooks:
            for step in hooks:
                self._set(StepStatus(step.name, StepState.PENDING), final=True)
            hook_refs = self._graph(tuple(hooks), refs)
            hook_results = self._collect({s.name: hook_refs[s.name] for s in hooks})
            bad = [s.name for s in hooks
                   if hook_results[s.name]["record"]["state"] == StepState.FAILED.value]
            if bad:
                final = RunState.FAILED
                message = "; ".join(filter(None, [message, "exit hooks failed: " + ", ".join(bad)]))
        self._poll_events()
        return final, message

    def _stop(self) -> None:
        """Cancel every unfinished task, then mark every unfinished step CANCELLED."""
        ray = self._ray
        tasks = self._tasks
        live = ray.wait(tasks, num_returns=len(tasks), timeout=0)[1] if tasks else []
        live.reverse()  # the latest first: queued tasks go before a CPU frees up for them
        for ref in live:
            ray.cancel(ref, force=False, recursive=True)
        wf = self.workflow
        maps = {s.name for s in (*wf.steps, *(h for hook in wf.exit_hooks for h in hook.steps))
                if s.foreach is not None}  # a map's own record ends with its aggregate task
        deadline = time.monotonic() + CANCEL_GRACE_SECONDS
        while time.monotonic() < deadline:
            if live:
                live = ray.wait(live, num_returns=len(live), timeout=_POLL_SECONDS)[1]
            else:  # every task ended: wait only for their last events
                time.sleep(_POLL_SECONDS / 4)
            self._poll_events()
            with self._lock:  # a step reports its end once its processes are killed
                busy = any(s.state in (StepState.RUNNING, StepState.RETRYING)
                           for s in self._records.values() if s.key or s.step not in maps)
            if not busy:
                break
        for ref in live:  # did not stop when interrupted (or Ray is going down): kill it
            ray.cancel(ref, force=True, recursive=True)
        self._poll_events()
        now = time.time()
        with self._lock:
            unfinished = [s for s in self._records.values() if not s.state.terminal]
        for s in unfinished:
            self._set(dataclasses.replace(
                s, state=StepState.CANCELLED, finished_at=now if s.started_at else None,
                message="run cancelled"), final=True)

    # ------------------------------------------------------------------ waiting

    def _wait(self, refs: Sequence[Any], num_returns: int) -> list[Any]:
        """``ray.wait`` in short slices: read events and notice cancel() in between."""
        while True:
            if self._cancel.is_set():
                raise _Cancelled
            ready, _ = self._ray.wait(list(refs), num_returns=num_returns,
                                      timeout=_POLL_SECONDS)
            self._poll_events()
            if ready:
                return list(ready)

    def _collect(self, refs: Mapping[str, Any]) -> dict[str, Result]:
        """Wait for the result of every step in ``refs``, recording each as it arrives."""
        waiting = {ref: name for name, ref in refs.items()}
        results: dict[str, Result] = {}
        while waiting:
            for ref in self._wait(list(waiting), len(waiting)):
                name = waiting.pop(ref)
                results[name] = self._get(ref, name)
                self._apply(results[name])
        return results

    def _get(self, ref: Any, name: str) -> Result:
        try:
            result: Result = self._ray.get(ref)
        except Exception as exc:  # the task raised: retries exhausted by crashes, upstream lost
            if self._cancel.is_set():
                raise _Cancelled from exc
            text = str(exc).strip().splitlines()
            return _ended(name, StepState.FAILED,
                          f"step {name!r}: the Ray task failed: {text[-1] if text else exc!r}")
        return result

    # ------------------------------------------------------------------ graph

    def _graph(self, steps: Sequence[ir.Step], known: Mapping[str, Any]) -> dict[str, Any]:
        """Submit ``steps``; return the result ref of each step (and of ``known`` ones)."""
        refs: dict[str, Any] = dict(known)
        available = {s.name for s in steps} | set(known)
        pending = {s.name: s for s in steps}
        while pending:
            progressed = False
            blocking: list[Any] = []
            for name, step in list(pending.items()):
                needs = _needs(step, available)
                if any(n not in refs for n in needs):
                    continue
                upstream = [refs[n] for n in needs]
                dynamic = step.foreach is not None and step.foreach.source is not None
                if dynamic and upstream:
                    _, not_ready = self._ray.wait(upstream, num_returns=len(upstream),
                                                  timeout=0)
                    if not_ready:
                        blocking += not_ready
                        continue
                refs[name] = self._submit(step, needs, upstream)
                del pending[name]
                progressed = True
            if pending and not progressed:
                if not blocking:  # a cycle: cannot happen for a validated workflow
                    for name in pending:
                        refs[name] = self._ray.put(_ended(name, StepState.FAILED,
                                                          "dependencies can never be satisfied"))
                    break
                self._wait(list(dict.fromkeys(blocking)), 1)
        return refs

    def _infeasible(self, opts: Mapping[str, Any]) -> str:
        total = self._ray.cluster_resources()
        wanted = (("num_cpus", "CPU", "CPUs"), ("memory", "memory", "bytes of memory"),
                  ("num_gpus", "GPU", "GPUs"))
        for option, resource, unit in wanted:
            need = float(opts.get(option) or 0)
            have = float(total.get(resource, 0))
            if need > have:
                return (f"requests {need:g} {unit} but the Ray cluster has {have:g} in total; "
                        "Ray would never schedule it")
        return ""

    def _submit(self, step: ir.Step, needs: Sequence[str], upstream: Sequence[Any]) -> Any:
        ray = self._ray
        wf = self._ctx.workflow
        # A task gets the workflow with only its own step: shipping every step to every
        # task made a run quadratic in its steps (4 ms per task to pickle 1,000 steps).
        ctx = dataclasses.replace(self._ctx, workflow=dataclasses.replace(
            wf, steps=(step,), exit_hooks=()))
        where = f"workflow {wf.name!r}, step {step.name!r}"
        opts = task_options(step, wf)
        problem = self._infeasible(opts)
        if problem:
            return ray.put(_ended(step.name, StepState.FAILED, f"{where}: {problem}"))
        task = self.executor._remote(ray, _step_task)
        if step.foreach is None:
            ref = task.options(**opts).remote(ctx, step.name, None, None, len(upstream),
                                              *upstream)
            self._tasks.append(ref)
            return ref
        if step.foreach.source is not None:  # resolved here, now that upstream finished
            run = _local_run(self._ctx, [self._get(ref, n) for n, ref in zip(
                needs, upstream, strict=True)])
            skip = _decision(run, step)
            if skip is not None:
                return ray.put(_skipped(step.name, skip))
            try:
                items = run._items(step)
            except _StepError as exc:
                return ray.put(_ended(step.name, StepState.FAILED, str(exc)))
        else:
            items = [lit.value for lit in step.foreach.items]
        lanes = step.foreach.parallelism
        item_refs: list[Any] = []
        for i, item in enumerate(items):
            after = [item_refs[i - lanes]] if lanes and i >= lanes else []
            item_refs.append(task.options(**{**opts, "name": f"{opts['name']}[{i}]"}).remote(
                ctx, step.name, i, item, len(upstream), *upstream, *after))
        aggregate = self.executor._remote(ray, _map_task).options(
            name=opts["name"], num_cpus=0, max_retries=0)
        ref = aggregate.remote(ctx, step.name, len(upstream), *upstream, *item_refs)
        self._tasks += [*item_refs, ref]
        return ref


class RayExecutor:
    """Runs workflows on a Ray cluster, one Ray task per step execution.

    Args:
        work_dir: Directory holding one sub-directory per run (on a file system
            every Ray node sees).
        address: The Ray cluster to connect to when Ray is not initialized yet
            (None = ``ray.init()``'s default: a local cluster or ``RAY_ADDRESS``).
        secrets: Secret values by ``(secret name, key)``.
        image_commands: Optional command prefix per container image (as on the
            local engine).
        init_options: Extra keyword arguments for ``ray.init``.
        series_seconds: The interval of the utilization samples passed to ``on_sample``.
        tune_storage: Where tune steps keep their optuna studies (an SQLAlchemy URL);
            default: ``COULER_TUNE_STORAGE``, else ``sqlite:///<work_dir>/tune.db``.
    """

    name = ENGINE
    capabilities = CAPABILITIES

    def __init__(self, work_dir: str | Path, address: str | None = None, *,
                 secrets: Mapping[tuple[str, str], str] | None = None,
                 image_commands: Mapping[str, Sequence[str]] | None = None,
                 init_options: Mapping[str, Any] | None = None,
                 series_seconds: float = SERIES_SECONDS,
                 tune_storage: str | None = None) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.series_seconds = series_seconds
        self.tune_storage = tune_storage
        self.address = address
        self.secrets: dict[tuple[str, str], str] = dict(secrets or {})
        self.image_commands: dict[str, tuple[str, ...]] = {
            k: tuple(v) for k, v in (image_commands or {}).items()}
        self.init_options: dict[str, Any] = dict(init_options or {})
        self._remotes: dict[str, Any] = {}
        self._initialized = False  # whether this executor started (or connected) Ray

    # ------------------------------------------------------------------ public API

    def run(self, wf: ir.Workflow, *, parameters: Mapping[str, str] | None = None,
            on_event: EventCallback | None = None,
            on_sample: SampleCallback | None = None) -> RunStatus:
        """Run ``wf`` on Ray to completion and return its final status.

        Args:
            wf: The workflow.
            parameters: Values of workflow parameters (defaults otherwise).
            on_event: Called with a step's status on every change (from the driver
                thread).
            on_sample: Called with the utilization samples of running steps (from the
                driver thread; see the module docstring).

        Raises:
            UnsupportedFeatureError: ``wf`` uses a feature the Ray executor lacks.
            InvalidWorkflowError: A dependency names a step that does not exist.
            UserError: Ray is not installed.
        """
        return self.start(wf, parameters=parameters, on_event=on_event,
                          on_sample=on_sample).wait()

    def start(self, wf: ir.Workflow, *, parameters: Mapping[str, str] | None = None,
              on_event: EventCallback | None = None,
              on_sample: SampleCallback | None = None) -> RayRun:
        """Start ``wf`` on Ray and return its handle at once (see :meth:`run`)."""
        check_capabilities(ENGINE, CAPABILITIES, wf)
        ir.validate(wf)
        ir.check_parameters(wf, parameters or {})
        ray = self.connect()
        run_id = f"{wf.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        run_dir = self.work_dir / run_id
        run_dir.mkdir(parents=True)
        ctx = _Context(str(run_dir), wf, dict(parameters or {}), self.secrets,
                       self.image_commands, tune_storage=self.tune_storage,
                       samples=on_sample is not None, series_seconds=self.series_seconds)
        handle = RayRun(self, ray, ctx, run_id, on_event, on_sample=on_sample)
        handle._thread.start()
        return handle

    def connect(self) -> Any:
        """Import Ray and connect (``ray.init``) unless it is initialized; returns ``ray``.

        Raises:
            UserError: Ray is not installed.
            RetryableError: Nothing listens at the ``host:port`` address.
        """
        ray = _import_ray()
        if not ray.is_initialized():
            if self.address is not None:
                _check_reachable(self.address)
            ray.init(address=self.address, **self.init_options)
            self._initialized = True
        return ray

    def shutdown(self) -> None:
        """Disconnect from Ray (stopping a local cluster) if this executor connected."""
        if self._initialized:
            _import_ray().shutdown()
            self._initialized = False

    def _remote(self, ray: Any, fn: Any) -> Any:
        remote = self._remotes.get(fn.__name__)
        if remote is None:
            remote = self._remotes[fn.__name__] = ray.remote(fn)
        return remote


def _write_record(run_dir: Path, wf: ir.Workflow, parameters: Mapping[str, str],
                  status: RunStatus) -> None:
    data = {
        "run_id": status.run_id, "engine": ENGINE, "workflow": ir.to_dict(wf),
        "parameters": dict(parameters), "state": status.state.value,
        "started_at": status.started_at, "finished_at": status.finished_at,
        "message": status.message, "steps": [_status_dict(s) for s in status.steps],
    }
    path = run_dir / "run.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
