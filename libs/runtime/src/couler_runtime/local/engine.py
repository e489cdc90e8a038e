"""The local engine: runs a workflow's steps as processes on this machine.

Execution rules:

* A **script** step writes its source to a file and runs it with the local
  interpreter of its language: python -> ``sys.executable``, bash -> ``bash``,
  sh -> ``sh`` (a ``command`` of ``python``/``python3`` also means
  ``sys.executable``; another command is used as given), followed by its args.
* A **container** step runs ``command + args`` on the host as a subprocess.
  The image is ignored, unless ``image_commands`` maps it to a command prefix
  (e.g. ``{"python:3.12": ["uv", "run"]}``). A container step without a
  command fails (the image's entrypoint is unknown on the host).
* Placeholders ``{{inputs.NAME}}``, ``{{item}}``, ``{{item.KEY}}`` and
  ``{{workflow.name}}`` are substituted in the command, args, env values and
  working directory (not in script source, as the IR specifies).
* Declared absolute paths are rewritten to a per-execution directory, see
  :mod:`couler_runtime.local.artifacts`; the process runs in that execution's
  directory (or the mapped ``working_dir``).
* Env vars: the engine's own environment plus the step's; secret references
  are resolved from the ``secrets`` mapping ``(name, key) -> value``; a
  missing one fails the step (not retried) naming the secret.
* Outputs: ``stdout`` -> the process's standard output, stripped; ``path`` ->
  the mapped file's contents, stripped. A missing file fails the step.
* Scheduling: every step whose dependencies are terminal is decided: edge
  conditions or the ``depends`` expression must hold, then ``when`` is
  evaluated (numbers compared numerically when both sides parse as numbers,
  else strings); otherwise it is SKIPPED. As on Argo, ``succeeded`` (the
  default edge) holds for an upstream that succeeded or was skipped by its own
  ``when``, and ``skipped`` only for the latter: a step that did not run
  because its own dependencies did not hold (Argo's "Omitted") stops its
  dependents too, so nothing runs after a failure that it did not ask for. At
  most ``max_workers`` processes run at once.
* ``map``: one execution per item (``key`` = index), at most ``parallelism``
  at once; the step's outputs are JSON lists of the items' outputs, in order.
* ``loop``: run (``key`` = iteration), evaluate the condition over the latest
  outputs, repeat while it holds, at most ``max_iterations`` runs.
* Cache hits (``start(cached=...)``): a top-level step named in ``cached`` is recorded
  CACHED and does not run; entries named ``step[N]`` are hits for items of map step
  ``step`` or iterations of loop step ``step``, matched by key (an item's key is computed
  from its value when the map runs, :func:`couler.optimize.cache_key.item_cache_key`): such
  an item or iteration is recorded CACHED with the hit's outputs and artifacts, the others
  run, and the map's outputs are aggregated as if every item had run (the map step is
  CACHED when every item was). With ``cache_keys``, items and iterations report their
  keys when they succeed, and their output artifacts are kept per item (``step[N]``).
* Retries: each failed attempt is classified by :func:`couler.failures.classify` from
  its exit code, the tail of its stderr and the attempts before it (exceeding
  ``memory_limit`` = oom; failure to start or a network error = infra; a Python
  exception such as ValueError, or the same exit code and error twice = user; a
  timeout or an exit seen once = transient); a policy retries the classes it names
  (``any``: every one) after ``base * factor**n`` seconds (capped). The record's
  ``failure_reason`` says which class and why. A timeout kills the process tree.
* **Sub-workflows**: a sub-workflow step runs its inner steps as a nested
  graph in the same run, by the rules above, under the same ``max_workers``
  bound (counted over all processes of the run). Inner steps are recorded as
  ``outer/inner`` (``outer[KEY]/inner`` inside map item or loop iteration KEY
  of ``outer``; nesting repeats) and run in ``steps/outer/<label>/inner/<label>``
  (label ``main``, ``item-N`` or ``iter-N``). Inline bodies see only each other
  (and the workflow parameters); an output of the step is the same-named
  output of the one inner step declaring it (output artifacts likewise). A
  reference names a workflow given to ``LocalEngine(workflows=...)`` (its
  digest must match when pinned; it is checked and kept in the run record,
  so a retry needs no registry); the step's inputs are its parameters, its
  exit hooks run after its steps, its ``timeout_seconds`` bounds the nested
  run. The step succeeds when no inner step (or hook) failed; otherwise it
  fails with the failure class of the first failed inner step, and a retry
  policy re-runs the whole nested graph. A step timeout stops the nested run
  (a transient failure).
* **Tuning** (a step with ``tune``): the engine drives an optuna study
  (:mod:`couler_runtime.tune`) in RDB storage (``tune_storage``), named after the
  workflow, the step and a hash of its spec and of what its trials read: it asks for
  parameter sets, runs up to ``parallel`` trials at once, each an execution of the step
  recorded ``step[N]`` (N the trial's number, the parameters its map item), and tells the
  study each trial's objective output. Parameters the study evaluated already, and cache
  hits named ``step[N]`` matched by the trial's key (its parameters standing for the
  item), are reused, not run. A trial reporting intermediate values (``STEP VALUE`` lines
  appended to ``$COULER_TUNE_REPORT``) that the pruner rejects is stopped and recorded
  PRUNED. The step's outputs are the best trial's (``best_params``, ``best_value``, each
  parameter); it fails when no trial completed. A resumed run reopens the same study:
  finished trials are not run again, those the crash interrupted are.
* **Daemon steps** (``daemon=True``, a plain container or script step: a daemon map,
  loop or sub-workflow is refused, as on Argo for the latter): the step's process is
  started on a thread of its own, outside the ``max_workers`` bound (it would hold a
  slot for the whole run); once its process was started (the IR has no readiness
  probe: a dependent retries its first connection) the step counts as succeeded for its
  dependents, which start (it stays RUNNING, "running as a daemon"), and serves them on
  this machine: they reach it on 127.0.0.1. It is stopped -- SIGTERM to its process
  group, SIGKILL after ``STOP_GRACE_SECONDS`` -- when every other step of its graph (the
  run's main steps, or the sub-workflow it is in) has finished, before the exit hooks;
  then it is SUCCEEDED, "daemon stopped at the end of the run" (CANCELLED when the run
  was cancelled, FAILED when a workflow or sub-workflow timeout stopped it, as any
  running step). A daemon that exits by itself before that is an ordinary attempt:
  exit 0 = SUCCEEDED (outputs read), otherwise failed and retried by its policy (the
  process started again; steps still waiting for it wait while it retries). A daemon
  that fails after it had started counts as a failure reaching a leaf (rule S7): every
  edge from it was decided while it was running, so nothing can handle it and the run
  (or sub-workflow) fails, naming it. Daemons are never reused by :meth:`LocalEngine.retry`
  / :meth:`LocalEngine.resume`: a daemon that was running when the engine's process died
  was killed with it (the death signal, as every step) and is started again, counting
  its attempts on, when its conditions hold again.
* Exit hooks run after the main graph with its final status (not after a
  cancellation). A failing hook fails the run.
* ``cancel()`` kills running processes and marks everything else CANCELLED.
* **Workflow timeout** (``Workflow.timeout_seconds``, counted from the start of
  each attempt of the run): when it passes, running steps are killed and end
  FAILED, steps not started yet end CANCELLED, both with a message naming the
  workflow and the timeout; the run ends FAILED and its exit hooks run as for
  any failure (the timeout does not bound them).
* **Utilization while steps run**: with ``on_sample``, every running process tree is
  reported as a time series of :class:`~couler.engines.base.StepSample` (about every
  ``series_seconds``, default 1 s, and once more when the process ends): the average
  cores it used over the interval (CPU time over wall time, children included) and its
  resident memory (:mod:`couler_runtime.local.process`), called from worker threads.
* :meth:`LocalEngine.logs` / :meth:`LocalRun.logs` return what one execution
  wrote (stdout, then stderr) in its last attempt.
* The run record survives a crash: every state change is appended, as one
  JSON line, to ``run.journal`` (constant cost per change), and ``run.json``,
  the full snapshot, is rewritten at most once a second and when the run
  ends; loading replays the journal lines newer than the snapshot.
  :meth:`LocalEngine.retry` re-runs a run reusing the outputs of the steps
  that succeeded (inner steps of sub-workflows included).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TextIO

from couler import failures, ir
from couler.engines.base import (
    RunState,
    RunStatus,
    StepSample,
    StepState,
    StepStatus,
)
from couler.errors import ConflictError, InsufficientResourcesError
from couler.optimize.cache_key import (
    item_cache_key,
    iteration_cache_key,
    producers,
    step_cache_key,
)
from couler.semantics import failed_leaves

from .. import tune as tuning
from . import gpus as gpu_devices
from . import interpreters
from .artifacts import ArtifactStore, PathMap, digest_path
from .capabilities import CAPABILITIES, ENGINE, check_workflow
from .journal import _DONE_OK, _load, _logs, _Record, _top
from .nested import attempt_nested, resolve_references
from .prepare import _StepError, prepare_step, read_outputs
from .process import (
    SAMPLE_SECONDS,
    SERIES_SECONDS,
    STOP_GRACE_SECONDS,
    ProcessResult,
    ProcessSample,
    run_process,
)
from .reuse import Reuse, part_hits, usable_hits
from .tune import TrialCtl, run_tune

__all__ = ["LocalEngine", "LocalRun"]

EventCallback = Callable[[StepStatus], None]
SampleCallback = Callable[[StepSample], None]

_BY_WHEN = "its when"  # how the reason of a step skipped by its own when begins
_SERVING = "running as a daemon: its dependents start"


def skipped_without_running(decision: str) -> bool:
    """Whether a skip ``decision`` (a reason from the scheduler) means the step's own
    dependencies did not let it run (Argo's "Omitted": its dependents do not run either)
    rather than its own ``when``."""
    return not decision.startswith(_BY_WHEN)


def hook_not_fired(hook: ir.ExitHook, why: str) -> str:
    """The message of an exit-hook step that did not run."""
    return f"exit hook on {hook.on.value} did not fire: {why}"
_SNAPSHOT_INTERVAL = 1.0  # seconds between full run.json snapshots while a run goes on
_LOG_TAIL = 8192  # bytes of a failed attempt's stderr the classifier reads


def _tail(path: Path, size: int) -> str:
    """The last ``size`` bytes of ``path`` as text ("" when it is missing)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _final_reason(rec: _Record, failure: str, policy: ir.RetryPolicy | None,
                  retries: int) -> str:
    """The failed step's ``failure_reason``: the class's reason and whether retries ran out
    or the class is not retried (``"user error: Python ValueError in the traceback; not
    retried"``)."""
    if failure == "fatal":
        return ""  # the step's own definition failed (an output missing): no class
    if not rec.failure_reason:
        return ""
    if policy is None:
        why = "no retry policy"
    elif retries >= policy.limit and (ir.FailureClass.ANY in policy.on
                                      or failure in {c.value for c in policy.on}):
        why = f"gave up after {retries} retries" if retries else "retry limit 0"
    else:
        again = " again" if retries else ""
        why = (f"not retried{again}: the policy retries "
               + ", ".join(c.value for c in policy.on))
    return f"{rec.failure_reason}; {why}"


def _quantity(text: str) -> int | None:
    """A memory quantity in bytes, or None when unset or not a quantity."""
    if not text:
        return None
    try:
        return int(ir.parse_quantity(text))
    except ValueError:
        return None


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _compare(left: str, op: ir.CompareOp, right: str) -> bool:
    ln, rn = _number(left), _number(right)
    a: float | str
    b: float | str
    a, b = (ln, rn) if ln is not None and rn is not None else (left, right)
    if op is ir.CompareOp.EQ:
        return a == b
    if op is ir.CompareOp.NE:
        return a != b
    if op is ir.CompareOp.GT:
        return a > b  # type: ignore[operator]
    if op is ir.CompareOp.LT:
        return a < b  # type: ignore[operator]
    if op is ir.CompareOp.GE:
        return a >= b  # type: ignore[operator]
    return a <= b  # type: ignore[operator]


class LocalRun:
    """A run in progress: wait for it, cancel it, or read its status.

    Created by :meth:`LocalEngine.start`; the run executes on a background
    thread.
    """

    def __init__(self, engine: LocalEngine, wf: ir.Workflow, run_dir: Path, *,
                 parameters: Mapping[str, str], on_event: EventCallback | None,
                 on_sample: SampleCallback | None = None,
                 reuse: Mapping[str, _Record] | None = None,
                 previous: Mapping[tuple[str, str], _Record] | None = None,
                 references: Mapping[str, ir.Workflow] | None = None,
                 cached: Mapping[str, Reuse] | None = None) -> None:
        self.engine = engine
        self.workflow = wf
        self.run_dir = run_dir
        self.run_id = run_dir.name
        self._parameters = dict(parameters)
        self._on_event = on_event
        self._on_sample = on_sample
        self._reuse = dict(reuse or {})
        # Every record of the previous attempt (resume): the executions and inner steps of
        # a reused step are carried over with it.
        self._previous = dict(previous or {})
        self._references = dict(references or {})  # referenced workflows, by name
        # Top-level steps whose results are reused (hits whose artifacts are at hand), and
        # the steps not needed because every step that reads them is reused.
        self._cached, self._unneeded = usable_hits(wf, cached or {})
        self._part_hits = part_hits(wf, cached or {})  # map items, loop iterations
        self._lock = threading.RLock()
        self._cancel = threading.Event()  # stop: set by cancel(), a deadline or a timeout
        self._user_cancel = False  # cancel() was called (the run ends CANCELLED)
        self._halt = ""  # why this (sub-)run was stopped when a deadline, not cancel(), did it
        self._main_done = False
        # A nested run (a sub-workflow step) is a shallow copy sharing records, lock, store
        # and process slots with its root; it has its own prefix, directory and stop event.
        self._root: LocalRun = self
        self._parent: LocalRun | None = None
        self._prefix = ""  # record names of this scope: prefix + step name
        self._steps_dir = run_dir / "steps"
        self._slots = threading.BoundedSemaphore(engine.max_workers)
        self._records: dict[tuple[str, str], _Record] = {}
        self._state = RunState.PENDING
        self._message = ""
        self._started_at: float | None = None
        self._finished_at: float | None = None
        self._store = ArtifactStore(run_dir / "artifacts")
        self._seq = 0  # number of changes journaled so far
        # attempts already made by steps a crash interrupted (resume), by (record, key)
        self._resumed_attempts: dict[tuple[str, str], int] = {}
        self._snapshot_at = 0.0  # monotonic time of the last run.json snapshot
        self._journal: TextIO | None = None
        # tuning trials running now, by record: where they report, how to stop them
        self._trials: dict[tuple[str, str], TrialCtl] = {}
        # daemon steps by record name: started (their stop events), serving now, and those
        # that were serving at some point (a later failure of one fails the run, rule S7)
        self._daemons: dict[str, _Daemon] = {}
        self._serving: set[str] = set()
        self._served: set[str] = set()
        self._thread = threading.Thread(target=self._main, name=f"couler-local-{self.run_id}",
                                        daemon=True)

    # ------------------------------------------------------------------ public API

    def wait(self, timeout: float | None = None) -> RunStatus:
        """Block until the run ends (or ``timeout`` seconds pass) and return its status."""
        self._thread.join(timeout)
        return self.status()

    def cancel(self) -> None:
        """Kill running processes and mark every step that has not finished CANCELLED."""
        with self._lock:
            self._user_cancel = True
            self._cancel.set()

    def logs(self, step: str, key: str = "") -> str:
        """The text one step execution wrote in its last attempt (see :meth:`LocalEngine.logs`).

        Raises:
            NotFoundError: The run has no execution of ``step`` with ``key``.
        """
        with self._lock:
            known = set(self._records)
        return _logs(self.run_dir, self.workflow.name, known, step, key)

    def artifact_path(self, step: str, artifact: str) -> Path | None:
        """Where the run keeps ``step``'s output artifact ``artifact``, if it exists."""
        path = self._store.location(step, artifact)
        return path if path.exists() else None

    def status(self) -> RunStatus:
        """The current status of the run and of every step execution."""
        with self._lock:
            return RunStatus(
                run_id=self.run_id, workflow=self.workflow.name, state=self._state,
                steps=tuple(r.status() for r in self._records.values()),
                started_at=self._started_at, finished_at=self._finished_at,
                message=self._message,
            )

    # ------------------------------------------------------------------ records

    def _start(self) -> None:
        self._thread.start()

    def _persist(self) -> None:
        """Write the full snapshot ``run.json`` (it covers journal lines up to ``seq``)."""
        self._snapshot_at = time.monotonic()
        data = {
            "seq": self._seq,
            "run_id": self.run_id, "workflow": ir.to_dict(self.workflow),
            "parameters": self._parameters, "state": self._state.value,
            "started_at": self._started_at, "finished_at": self._finished_at,
            "message": self._message,
            "steps": [r.to_dict() for r in self._records.values()],
            "references": {name: ir.to_dict(ref) for name, ref in self._references.items()},
        }
        path = self.run_dir / "run.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)

    def _update(self, rec: _Record, **changes: object) -> None:
        root = self._root  # nested runs journal through the root's record
        with self._lock:
            for name, value in changes.items():
                setattr(rec, name, value)
            self._records[(rec.step, rec.key)] = rec
            root._journal_record(rec)
            if time.monotonic() - root._snapshot_at >= _SNAPSHOT_INTERVAL:
                root._persist()
            status = rec.status()
        if self._on_event is not None:
            self._on_event(status)

    def _journal_record(self, rec: _Record) -> None:
        """Append one change to ``run.journal``; flushed, so a crash loses nothing written."""
        if self._journal is None:
            self._journal = (self.run_dir / "run.journal").open("a", encoding="utf-8")
        self._seq += 1
        self._journal.write(json.dumps({"seq": self._seq, "record": rec.to_dict()}) + "\n")
        self._journal.flush()

    def _close_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def _state_of(self, step: str) -> StepState:
        with self._lock:
            rec = self._records.get((self._name(step), ""))
            if rec is None:
                return StepState.PENDING
            if rec.step in self._serving and rec.state is StepState.RUNNING:
                return StepState.SUCCEEDED  # a daemon serving: done, for its dependents
            return rec.state

    def _record(self, step: str) -> _Record | None:
        with self._lock:
            return self._records.get((self._name(step), ""))

    def _name(self, step: str) -> str:
        """The record name of a step of this scope ("outer/inner" inside a sub-workflow)."""
        return self._prefix + step

    def _stop_reason(self) -> str:
        """Why a deadline stopped this (sub-)run; "" when it was cancelled or not stopped."""
        run: LocalRun | None = self
        while run is not None:
            if run._halt:
                return run._halt
            run = run._parent
        return ""

    def _stopped_state(self) -> StepState:
        """The state of an execution that was stopped while running."""
        if self._root._user_cancel or not self._stop_reason():
            return StepState.CANCELLED
        return StepState.FAILED

    def _stop_message(self) -> str:
        return "cancelled" if self._root._user_cancel else (self._stop_reason() or "cancelled")

    def _carry_over(self, name: str) -> None:
        """Copy the executions and inner-step records of reused step ``name`` into this run."""
        nested = (name + "/", name + "[")
        for (step, key), prev in self._previous.items():
            if (step == name and key) or step.startswith(nested):
                self._update(_Record.from_dict(prev.to_dict()))

    # ------------------------------------------------------------------ main

    def _main(self) -> None:
        with self._lock:
            self._state = RunState.RUNNING
            self._started_at = time.time()
            for step in self.workflow.steps:
                self._records[(step.name, "")] = _Record(step.name)
            self._persist()
        timer: threading.Timer | None = None
        if self.workflow.timeout_seconds is not None:
            timer = threading.Timer(self.workflow.timeout_seconds, self._expire)
            timer.daemon = True
            timer.start()
        try:
            self._graph(self.workflow.steps, reuse=True)
            with self._lock:
                self._main_done = True
                main_steps = [self._records[(s.name, "")] for s in self.workflow.steps]
            if timer is not None:
                timer.cancel()
            failed = [r for r in main_steps if r.state is StepState.FAILED]
            unhandled = self._unhandled(self.workflow.steps) if failed else []
            if self._user_cancel:
                final = RunState.CANCELLED
                message = "cancelled"
            else:  # rule S7: only a failure that reaches a leaf fails the run
                final = RunState.FAILED if unhandled or self._halt else RunState.SUCCEEDED
                message = "; ".join(filter(None, [
                    self._halt, failure_message(failed, unhandled)]))
                with self._lock:
                    if not self._user_cancel:  # the deadline stopped the graph, not the hooks
                        self._cancel.clear()
                hook_steps = self._hooks(final, failed)
                self._not_fired(hook_steps, f"the run {final.value}")
                if hook_steps:
                    for step in hook_steps:
                        self._update(_Record(step.name))
                    self._graph(tuple(hook_steps), reuse=False)
                    bad = [s.name for s in hook_steps
                           if self._state_of(s.name) is StepState.FAILED]
                    if bad:
                        final = RunState.FAILED
                        message = "; ".join(filter(None, [message, "exit hooks failed: "
                                                          + ", ".join(bad)]))
                if self._user_cancel:
                    final, message = RunState.CANCELLED, "cancelled"
            if self._user_cancel:
                self._not_fired((), "the run was cancelled")
        except Exception as exc:  # an engine bug must still leave a final record
            final, message = RunState.FAILED, f"local engine error: {exc!r}"
        finally:
            if timer is not None:
                timer.cancel()
        with self._lock:
            self._state, self._message = final, message
            self._finished_at = time.time()
            self._persist()
            self._close_journal()

    def _expire(self) -> None:
        """The workflow's timeout passed: stop the main graph (its exit hooks still run)."""
        with self._lock:
            if self._main_done or self._user_cancel:
                return
            self._halt = (f"workflow {self.workflow.name!r} exceeded its timeout of "
                          f"{self.workflow.timeout_seconds} s (field 'timeout_seconds')")
            self._cancel.set()

    def _not_fired(self, firing: Sequence[ir.Step], why: str) -> None:
        """Record the exit-hook steps that will not run as SKIPPED, saying why (they would
        otherwise look pending forever)."""
        names = {s.name for s in firing}
        now = time.time()
        for hook in self.workflow.exit_hooks:
            for step in hook.steps:
                rec = self._record(step.name)
                if step.name in names or (rec is not None and rec.state.terminal):
                    continue
                self._update(rec or _Record(self._name(step.name)), state=StepState.SKIPPED,
                             finished_at=now, omitted=True,
                             message=hook_not_fired(hook, why))

    def _hooks(self, final: RunState, failed: Sequence[_Record]) -> list[ir.Step]:
        errored = any(r.errored for r in failed)
        wanted = {ir.RunStatus.ANY,
                  ir.RunStatus.SUCCEEDED if final is RunState.SUCCEEDED else ir.RunStatus.FAILED}
        if errored:
            wanted.add(ir.RunStatus.ERROR)
        return [s for hook in self.workflow.exit_hooks if hook.on in wanted for s in hook.steps]

    # ------------------------------------------------------------------ scheduling

    def _graph(self, steps: Sequence[ir.Step], *, reuse: bool) -> None:
        daemons: list[_Daemon] = []  # started by this graph: stopped when it ends
        try:
            self._run_graph(steps, reuse=reuse, daemons=daemons)
        finally:
            for daemon in daemons:
                daemon.stop.set()
            for daemon in daemons:
                if daemon.thread is not None:
                    daemon.thread.join()

    def _run_graph(self, steps: Sequence[ir.Step], *, reuse: bool,
                   daemons: list[_Daemon]) -> None:
        pending = {s.name: s for s in steps}
        futures: dict[Future[None], tuple[ir.Step, int | None]] = {}
        maps: dict[str, _MapState] = {}
        with ThreadPoolExecutor(self.engine.max_workers) as pool:
            while pending or futures or maps:
                if self._cancel.is_set():
                    reason = self._stop_message()
                    for name in list(pending):
                        rec = self._record(name) or _Record(self._name(name))
                        self._update(rec, state=StepState.CANCELLED,
                                     message="run cancelled" if reason == "cancelled"
                                     else f"not started: {reason}")
                        del pending[name]
                    for ms in maps.values():
                        ms.queue.clear()
                progressed = True
                while progressed and not self._cancel.is_set():
                    progressed = False
                    for name, step in list(pending.items()):
                        decision = self._decide(step)
                        if decision is None:
                            continue
                        del pending[name]
                        progressed = True
                        rec = self._record(name) or _Record(self._name(name))
                        if decision:
                            self._update(rec, state=StepState.SKIPPED, message=decision,
                                         finished_at=time.time(),
                                         omitted=skipped_without_running(decision))
                            continue
                        # a daemon runs again: the steps that run again need its service
                        prev = (self._reuse.get(self._name(name)) if reuse and not step.daemon
                                else None)
                        if prev is not None:
                            self._update(rec, **{k: getattr(prev, k) for k in (
                                "state", "attempts", "exit_code", "started_at", "finished_at",
                                "peak_cpu", "peak_memory_bytes", "outputs")},
                                message="reused from the previous attempt of this run")
                            self._carry_over(self._name(name))
                            continue
                        if step.foreach is not None:
                            try:
                                items = self._items(step)
                            except _StepError as exc:
                                self._update(rec, state=StepState.FAILED, message=str(exc),
                                             finished_at=time.time())
                                continue
                            maps[name] = _MapState(step, items)
                            self._update(rec, state=StepState.RUNNING, started_at=time.time())
                        elif step.daemon:  # done (for the loop) once it serves
                            daemon = self._start_daemon(step)
                            daemons.append(daemon)
                            futures[pool.submit(daemon.settled)] = (step, None)
                        else:
                            futures[pool.submit(self._run_step, step)] = (step, None)
                map_finished = False
                for name, ms in list(maps.items()):
                    limit = ms.step.foreach.parallelism if ms.step.foreach else None
                    while ms.queue and (limit is None or ms.running < limit):
                        index = ms.queue.pop(0)
                        ms.running += 1
                        fut = pool.submit(self._run_item, ms.step, index, ms.items[index])
                        futures[fut] = (ms.step, index)
                    if not ms.queue and ms.running == 0:
                        self._finish_map(maps.pop(name))
                        map_finished = True
                if not futures:
                    if map_finished:
                        continue  # its dependents may be ready now: look at them again
                    restarting = [d for d in daemons if not d.up.is_set()]
                    if restarting:  # a daemon that failed is about to be retried
                        restarting[0].up.wait(SAMPLE_SECONDS)
                        continue
                    if pending and not maps:  # cannot happen for a validated graph
                        for name in list(pending):
                            rec = self._record(name) or _Record(self._name(name))
                            self._update(rec, state=StepState.FAILED,
                                         message="dependencies can never be satisfied")
                            del pending[name]
                    continue
                done, _ = wait(list(futures), timeout=0.1, return_when=FIRST_COMPLETED)
                for fut in done:
                    step, item_index = futures.pop(fut)
                    fut.result()
                    if item_index is not None:
                        maps[step.name].running -= 1

    def _decide(self, step: ir.Step) -> str | None:
        """None = not yet; "" = run; otherwise the reason to skip."""
        names = [d.step for d in step.dependencies]
        if step.depends is not None:
            names += _expr_steps(step.depends)
        states = {n: self._state_of(n) for n in names}
        if any(not s.terminal for s in states.values()):
            return None
        if step.depends is not None:
            if not self._expr(step.depends):
                return "its depends expression does not hold"
        else:
            for dep in step.dependencies:
                if not self._edge(dep.step, dep.condition):
                    return f"dependency {dep.step!r} did not reach {dep.condition.value}"
        if step.when is not None:
            try:
                holds = self._condition(step.when.condition, step, {})
            except _StepError as exc:
                return f"{_BY_WHEN} cannot be evaluated: {exc}"
            if holds != step.when.expect:
                return f"{_BY_WHEN} condition is " + ("false" if step.when.expect else "true")
        return ""

    def _edge(self, name: str, cond: ir.EdgeCondition) -> bool:
        state = self._state_of(name)
        rec = self._record(name)
        if cond is ir.EdgeCondition.SUCCEEDED:
            # Argo's default edge: succeeded, or skipped by its own when -- not a step
            # that never ran because its own upstream failed (Argo's "Omitted")
            omitted = rec is not None and rec.omitted
            return state in _DONE_OK or (state is StepState.SKIPPED and not omitted)
        if cond is ir.EdgeCondition.FAILED:
            return state is StepState.FAILED
        if cond is ir.EdgeCondition.ERRORED:
            return state is StepState.FAILED and rec is not None and rec.errored
        if cond is ir.EdgeCondition.SKIPPED:  # by its own when (Argo's Skipped, not Omitted)
            return state is StepState.SKIPPED and not (rec is not None and rec.omitted)
        if cond is ir.EdgeCondition.COMPLETED:
            return state in (*_DONE_OK, StepState.FAILED)
        if cond is ir.EdgeCondition.SUCCEEDED_ONLY:  # ran and succeeded (Argo's A.Succeeded)
            return state in _DONE_OK
        if cond is ir.EdgeCondition.OMITTED:  # not run because its dependencies did not hold
            return state is StepState.SKIPPED and rec is not None and rec.omitted
        if cond is ir.EdgeCondition.ANY_SUCCEEDED:
            return state in _DONE_OK or any(s in _DONE_OK for s in self._item_states(name))
        if cond is ir.EdgeCondition.ALL_FAILED:
            items = self._item_states(name)
            return state is StepState.FAILED and bool(items) and \
                all(s is StepState.FAILED for s in items)
        return state.terminal

    def _outcome(self, step: str) -> str:
        """A step's outcome for rule S7: succeeded / failed (it ran) or skipped (it did not)."""
        state = self._state_of(step)
        if state in _DONE_OK:
            return "succeeded"
        return "skipped" if state is StepState.SKIPPED else "failed"

    def _unhandled(self, steps: Sequence[ir.Step]) -> list[str]:
        """The failed steps of ``steps`` that fail their run or sub-workflow (rule S7): the
        failures reaching a leaf, and daemons that failed after they had started serving
        (every edge from one was decided while it ran: nothing handled its failure)."""
        leaves = failed_leaves(steps, self._outcome)
        with self._lock:
            crashed = [s.name for s in steps if s.daemon and s.name not in leaves
                       and self._name(s.name) in self._served
                       and self._state_of(s.name) is StepState.FAILED]
        return [*leaves, *crashed]

    def _item_states(self, step: str) -> list[StepState]:
        """The states of a map step's items (empty before it ran or when it was cached whole)."""
        name = self._name(step)
        with self._lock:
            return [r.state for (s, key), r in self._records.items() if s == name and key]

    def _expr(self, expr: ir.DependsExpr) -> bool:
        if isinstance(expr, ir.DependsTerm):
            return self._edge(expr.step, expr.condition)
        if isinstance(expr, ir.DependsAll):
            return all(self._expr(t) for t in expr.terms)
        if isinstance(expr, ir.DependsAny):
            return any(self._expr(t) for t in expr.terms)
        return not self._expr(expr.term)

    # ------------------------------------------------------------------ values

    def _value(self, source: ir.ValueSource, step: ir.Step, item: object,
               own: Mapping[str, str], where: str) -> str:
        wf = self.workflow.name
        if isinstance(source, ir.Literal):
            return source.text
        if isinstance(source, ir.WorkflowParamRef):
            if source.name in self._parameters:
                return self._parameters[source.name]
            param = self.workflow.parameter(source.name)
            if param is None or param.default is None:
                raise _StepError(f"workflow {wf!r}, step {step.name!r}, field {where!r}: "
                                 f"workflow parameter {source.name!r} has no value")
            return param.default.text
        if isinstance(source, ir.ItemRef):
            if source.key:
                if not isinstance(item, dict) or source.key not in item:
                    raise _StepError(f"workflow {wf!r}, step {step.name!r}, field {where!r}: "
                                     f"map item has no key {source.key!r}")
                return _text(item[source.key])
            return _text(item)
        if source.step == step.name and source.output in own:
            return own[source.output]
        rec = self._record(source.step)
        if rec is None or source.output not in rec.outputs:
            why = ""
            if rec is not None and rec.state is StepState.SKIPPED:
                # e.g. the branch of a when/else that did not run
                why = (f" (it was skipped: {rec.message})" if rec.message
                       else " (it was skipped)")
            raise _StepError(f"workflow {wf!r}, step {step.name!r}, field {where!r}: step "
                             f"{source.step!r} has no output {source.output!r}{why}")
        return rec.outputs[source.output]

    def _condition(self, cond: ir.Condition, step: ir.Step, own: Mapping[str, str]) -> bool:
        left = self._value(cond.left, step, None, own, "condition")
        right = self._value(cond.right, step, None, own, "condition")
        return _compare(left, cond.op, right)

    def _items(self, step: ir.Step) -> list[object]:
        assert step.foreach is not None
        if step.foreach.source is None:
            return [lit.value for lit in step.foreach.items]
        text = self._value(step.foreach.source, step, None, {}, "foreach.source")
        try:
            items = json.loads(text)
        except ValueError:
            items = None
        if not isinstance(items, list):
            raise _StepError(f"workflow {self.workflow.name!r}, step {step.name!r}, field "
                             f"'foreach.source': expected a JSON list, got {text[:200]!r}")
        return items

    # ------------------------------------------------------------------ execution

    def _run_step(self, step: ir.Step) -> None:
        rec = self._record(step.name) or _Record(self._name(step.name))
        hit = self._cached.get(step.name) if not self._prefix else None
        if hit is not None and step.loop is None and step.foreach is None:
            if step.name in self._unneeded:  # nothing reads its artifacts: not restored
                self._update(rec, state=StepState.CACHED, started_at=time.time(),
                             finished_at=time.time(), attempts=0, outputs=dict(hit.outputs),
                             cache_key=hit.key, cache_saved_seconds=hit.saved_seconds,
                             message=f"reused cached result {hit.key[:12]} (its artifacts "
                                     "not restored: every step that reads them is reused)")
            else:
                self._reuse_cached(step, rec, hit)
            return
        if step.name in self._unneeded and not self._prefix:
            now = time.time()
            self._update(rec, state=StepState.SKIPPED, started_at=now, finished_at=now,
                         message="not run: not needed, every step that reads its results "
                                 "was reused from the cache")
            return
        if step.tune is not None:
            run_tune(self, step, rec, step.tune)
            return
        if step.loop is None:
            self._execute(step, rec, "main", None)
            return
        self._update(rec, state=StepState.RUNNING, started_at=time.time())
        loop = step.loop
        last: _Record | None = None
        for n in range(max(loop.max_iterations, 1)):
            last = _Record(self._name(step.name), key=str(n))
            hit = self._part_hit(step, partial(self._iteration_key, step, n))
            if hit is None or not self._reuse_part(step, last, hit):
                self._execute(step, last, f"iter-{n}", None)
            if last.state not in _DONE_OK:
                break
            try:
                again = self._condition(loop.condition, step, last.outputs)
            except _StepError as exc:
                last = _Record(self._name(step.name), state=StepState.FAILED,
                               message=str(exc))
                break
            if not again:
                break
        assert last is not None
        with self._lock:
            iterations = [r for (s, k), r in self._records.items()
                          if s == self._name(step.name) and k]
        self._update(rec, state=last.state, outputs=dict(last.outputs), message=last.message,
                     attempts=sum(r.attempts for r in iterations), exit_code=last.exit_code,
                     failure=last.failure, failure_reason=last.failure_reason,
                     errored=last.errored, finished_at=time.time(),
                     peak_cpu=max((r.peak_cpu or 0.0 for r in iterations), default=None),
                     peak_memory_bytes=max((r.peak_memory_bytes or 0 for r in iterations),
                                           default=None))

    def _start_daemon(self, step: ir.Step) -> _Daemon:
        """Run daemon step ``step`` on a thread of its own (see the module docstring)."""
        daemon = _Daemon()
        with self._lock:
            self._daemons[self._name(step.name)] = daemon
        daemon.thread = threading.Thread(target=self._run_daemon, args=(step, daemon),
                                         name=f"couler-daemon-{self._name(step.name)}",
                                         daemon=True)
        daemon.thread.start()
        return daemon

    def _run_daemon(self, step: ir.Step, daemon: _Daemon) -> None:
        try:
            self._run_step(step)
        except Exception as exc:  # an engine bug must still leave a final record
            rec = self._record(step.name) or _Record(self._name(step.name))
            self._update(rec, state=StepState.FAILED, finished_at=time.time(),
                         message=f"local engine error: {exc!r}")
        finally:
            with self._lock:
                self._serving.discard(self._name(step.name))
            daemon.up.set()

    def _daemon_started(self, rec: _Record, daemon: _Daemon) -> None:
        """A daemon's process started: it serves, and counts as succeeded for its
        dependents."""
        with self._lock:
            self._serving.add(rec.step)
            self._served.add(rec.step)
        self._update(rec, message=_SERVING)
        daemon.up.set()

    def _daemon_ended(self, rec: _Record, daemon: _Daemon) -> None:
        """A daemon's process ended: it no longer serves (until a retry starts it again)."""
        daemon.up.clear()  # before it stops counting as succeeded: the graph waits for it
        with self._lock:
            self._serving.discard(rec.step)

    def _reuse_cached(self, step: ir.Step, rec: _Record, hit: Reuse) -> None:
        """Record ``step`` as CACHED with ``hit``'s outputs and artifacts; nothing runs."""
        now = time.time()
        try:
            for art in step.output_artifacts:
                src = hit.artifacts.get(art.name)
                if src is None or not Path(src).exists():
                    raise _StepError(f"workflow {self.workflow.name!r}, step {step.name!r}, "
                                     f"field 'output_artifacts.{art.name}': the cached result "
                                     "has no such artifact")
                self._store.put(self._name(step.name), art.name, Path(src))
        except _StepError as exc:  # an incomplete hit: run the step instead
            self._update(rec, message=f"cache hit not used: {exc}")
            self._cached.pop(step.name, None)
            self._run_step(step)
            return
        self._update(rec, state=StepState.CACHED, started_at=now, finished_at=now, attempts=0,
                     outputs=dict(hit.outputs), cache_key=hit.key,
                     message=f"reused cached result {hit.key[:12]}",
                     cache_saved_seconds=hit.saved_seconds)

    def _run_item(self, step: ir.Step, index: int, item: object) -> None:
        rec = _Record(self._name(step.name), key=str(index))
        hit = self._part_hit(step, lambda: self._item_key(step, item))
        if hit is not None and self._reuse_part(step, rec, hit):
            return
        self._execute(step, rec, f"item-{index}", item)

    def _part_hit(self, step: ir.Step, key_of: Callable[[], str | None]) -> Reuse | None:
        """The cache hit for an item or iteration of ``step`` whose key ``key_of`` gives
        (called only when the step has hits)."""
        hits = self._part_hits.get(step.name) if not self._prefix else None
        if not hits:
            return None
        key = key_of()
        return hits.get(key) if key else None

    def _reuse_part(self, step: ir.Step, rec: _Record, hit: Reuse) -> bool:
        """Record a map item or loop iteration CACHED with ``hit``'s outputs and artifacts
        (kept as the step's and as the item's, as when it runs); False when the hit lacks an
        artifact (it runs instead)."""
        name = self._name(step.name)
        sources = {a.name: hit.artifacts.get(a.name) for a in step.output_artifacts}
        if any(src is None or not Path(src).exists() for src in sources.values()):
            return False
        for art, src in sources.items():
            assert src is not None
            self._store.put(name, art, Path(src))
            self._store.put(f"{name}[{rec.key}]", art, Path(src))
        now = time.time()
        self._update(rec, state=StepState.CACHED, started_at=now, finished_at=now, attempts=0,
                     outputs=dict(hit.outputs), cache_key=hit.key,
                     cache_lineage=self._lineage(step),
                     message=f"reused cached result {hit.key[:12]}")
        return True

    def _finish_map(self, ms: _MapState) -> None:
        name = self._name(ms.step.name)
        with self._lock:
            items = [self._records.get((name, str(i))) for i in range(len(ms.items))]
        recs = [r for r in items if r is not None]
        failed = [r for r in recs if r.state not in _DONE_OK]
        if self._cancel.is_set() and (failed or len(recs) < len(ms.items)):
            state = self._stopped_state()
        else:
            state = StepState.FAILED if failed or len(recs) < len(ms.items) else \
                StepState.SUCCEEDED
        reused = sum(r.state is StepState.CACHED for r in recs)
        if state is StepState.SUCCEEDED and recs and reused == len(recs):
            state = StepState.CACHED  # every item came from the cache
        outputs = {o.name: json.dumps([r.outputs.get(o.name, "") for r in recs])
                   for o in ms.step.outputs}
        rec = self._record(ms.step.name) or _Record(name)
        self._update(rec, state=state, outputs=outputs, finished_at=time.time(),
                     # the most attempts an item took (the items are in the step's
                     # records of their own); not their sum, which reads as retries
                     attempts=max((r.attempts for r in recs), default=0),
                     failure=failed[0].failure if failed else "",
                     failure_reason=failed[0].failure_reason if failed else "",
                     errored=bool(failed) and failed[0].errored,
                     message=(f"items failed: {', '.join(r.key for r in failed)}"
                              if failed else f"{reused} of {len(recs)} items reused from "
                              "the cache" if reused else ""),
                     peak_cpu=max((r.peak_cpu or 0.0 for r in recs), default=None),
                     peak_memory_bytes=max((r.peak_memory_bytes or 0 for r in recs),
                                           default=None))

    def _execute(self, step: ir.Step, rec: _Record, label: str, item: object) -> None:
        wf = self.workflow
        policy = step.retry or wf.defaults.retry
        timeout = step.timeout_seconds or wf.defaults.timeout_seconds
        resources = step.resources or wf.defaults.resources
        memory_limit = _quantity(resources.memory_limit) if resources else None
        ceiling = _quantity(policy.memory_ceiling) if policy else None
        daemon = self._daemons.get(rec.step) if step.daemon else None
        done = self._root._resumed_attempts.pop((rec.step, rec.key), 0)
        self._update(rec, state=StepState.RUNNING, started_at=time.time(), attempts=done)
        retries = 0
        previous: list[failures.Attempt] = []  # this run's failed attempts: the repeat rule
        while True:
            self._update(rec, attempts=rec.attempts + 1, state=StepState.RUNNING)
            failure = self._attempt(step, rec, label, item, timeout=timeout,
                                    memory_limit=memory_limit, previous=previous,
                                    daemon=daemon)
            if failure == "stopped":  # a daemon stopped by the end of its graph
                if self._cancel.is_set():
                    self._update(rec, state=self._stopped_state(), finished_at=time.time(),
                                 message=self._stop_message())
                else:
                    self._update(rec, state=StepState.SUCCEEDED, finished_at=time.time(),
                                 failure="", failure_reason="",
                                 message="daemon stopped at the end of the run")
                return
            if failure is None:
                self._update(rec, state=StepState.SUCCEEDED, finished_at=time.time(),
                             failure="", failure_reason="")
                return
            if failure == "cancelled":
                self._update(rec, state=self._stopped_state(), finished_at=time.time())
                return
            if failure == "pruned":
                self._update(rec, state=StepState.PRUNED, finished_at=time.time(), failure="")
                return
            retryable = (failure != "fatal" and policy is not None and retries < policy.limit
                         and (ir.FailureClass.ANY in policy.on
                              or ir.FailureClass(failure) in policy.on))
            if not retryable or policy is None:
                self._update(rec, state=StepState.FAILED, finished_at=time.time(),
                             failure="" if failure == "fatal" else failure,
                             failure_reason=_final_reason(rec, failure, policy, retries))
                return
            delay = 0.0
            if policy.backoff is not None:
                b = policy.backoff
                delay = b.base_seconds * b.factor ** retries
                if b.cap_seconds is not None:
                    delay = min(delay, b.cap_seconds)
            if (failure == ir.FailureClass.OOM.value and policy.memory_factor
                    and memory_limit is not None):
                memory_limit = int(memory_limit * policy.memory_factor)
                if ceiling is not None:
                    memory_limit = min(memory_limit, ceiling)
            retries += 1
            self._update(rec, state=StepState.RETRYING, failure=failure)
            if self._stopped_during(delay, daemon):
                if daemon is not None and not self._cancel.is_set():
                    # its graph ended while the daemon waited to start again: it failed
                    self._update(rec, state=StepState.FAILED, finished_at=time.time())
                    return
                self._update(rec, state=self._stopped_state(), message=self._stop_message(),
                             finished_at=time.time())
                return

    def _stopped_during(self, delay: float, daemon: _Daemon | None) -> bool:
        """Wait ``delay`` seconds; True when the run (or, for a daemon, its graph) stopped."""
        if daemon is None:
            return self._cancel.wait(delay)
        end = time.monotonic() + delay
        while not (daemon.stop.is_set() or self._cancel.is_set()):
            left = end - time.monotonic()
            if left <= 0:
                return False
            daemon.stop.wait(min(left, SAMPLE_SECONDS))
        return True

    def _attempt(self, step: ir.Step, rec: _Record, label: str, item: object, *,
                 timeout: int | None, memory_limit: int | None,
                 previous: list[failures.Attempt] | None = None,
                 daemon: _Daemon | None = None) -> str | None:
        """Run one attempt; None on success, else the failure class, "fatal", "cancelled"
        or (a ``daemon``'s) "stopped".

        A failed attempt is classified by :func:`couler.failures.classify` (its stderr's tail
        as the log, ``previous`` for the repeat rule, to which it is appended); the class's
        reason goes on the record as ``failure_reason``.
        """
        exec_dir = self._steps_dir / step.name / label
        exec_dir.mkdir(parents=True, exist_ok=True)
        if isinstance(step.body, ir.SubWorkflowSpec):
            return attempt_nested(self, step, rec, exec_dir, item, timeout=timeout)
        try:
            prepared = prepare_step(self, step, exec_dir, item)
        except _StepError as exc:
            self._update(rec, message=str(exc))
            return "fatal"
        cancel: threading.Event = self._cancel
        devices = self._take_gpus(step, rec)
        if devices is None:
            return "cancelled"
        if self.engine.gpus:  # a step sees only the devices it holds (none if it asked none)
            prepared[1].update(gpu_devices.visible_env(devices))
        try:
            return self._attempt_process(step, rec, item, exec_dir, prepared, cancel=cancel,
                                         timeout=timeout, memory_limit=memory_limit,
                                         previous=previous, daemon=daemon)
        finally:
            if devices:
                self.engine.gpu_pool.release(devices)

    def _take_gpus(self, step: ir.Step, rec: _Record) -> tuple[str, ...] | None:
        """The GPUs a step's attempt runs with, waiting until they are free (None: the run
        was stopped while it waited)."""
        resources = step.resources or self.workflow.defaults.resources
        wanted = resources.gpu if resources else 0
        if not wanted:
            return ()
        pool = self.engine.gpu_pool
        self._update(rec, message=f"waiting for {wanted} of the machine's "
                                  f"{len(pool.devices)} GPUs")
        taken = pool.acquire(wanted, self._cancel)
        if taken is None:
            self._update(rec, message=self._stop_message())
            return None
        self._update(rec, message=f"GPUs {','.join(taken)}")
        return taken

    def _attempt_process(self, step: ir.Step, rec: _Record, item: object, exec_dir: Path,
                         prepared: tuple[list[str], dict[str, str], Path, PathMap], *,
                         cancel: threading.Event, timeout: int | None,
                         memory_limit: int | None, previous: list[failures.Attempt] | None,
                         daemon: _Daemon | None) -> str | None:
        """Run one attempt's process (see :meth:`_attempt`)."""
        wf = self.workflow
        argv, env, cwd, paths = prepared
        trial = self._trials.get((rec.step, rec.key))
        if trial is not None:  # a tuning trial: where it reports, and its own stop
            trial.report.parent.mkdir(parents=True, exist_ok=True)
            trial.report.write_text("")
            trial.offset = 0
            env[tuning.REPORT_ENV] = str(trial.report)
            env[tuning.TRIAL_ENV] = rec.key
            cancel = trial.stop
        if daemon is not None:  # outside the worker bound, stopped by its graph
            result = run_process(argv, cwd=cwd, env=env, stdout_path=exec_dir / "stdout",
                                 stderr_path=exec_dir / "stderr", timeout_seconds=timeout,
                                 memory_limit_bytes=memory_limit, stop=daemon.stop,
                                 grace_seconds=STOP_GRACE_SECONDS,
                                 on_start=partial(self._daemon_started, rec, daemon),
                                 on_sample=self._sampling(rec),
                                 series_seconds=self.engine.series_seconds)
            self._daemon_ended(rec, daemon)
        else:
            ran = self._run_in_slot(argv, cwd, env, exec_dir, rec, timeout=timeout,
                                    memory_limit=memory_limit, cancel=cancel)
            if ran is None:
                return "cancelled"
            result = ran
        where = f"workflow {wf.name!r}, step {step.name!r}"
        changes: dict[str, object] = {
            "exit_code": result.exit_code,
            "peak_cpu": max(rec.peak_cpu or 0.0, result.peak_cpu),
            "peak_memory_bytes": max(rec.peak_memory_bytes or 0, result.peak_memory_bytes),
        }
        if result.cancelled and trial is not None and trial.pruned and \
                not self._cancel.is_set():
            self._update(rec, message=trial.pruned, **changes)
            return "pruned"
        if result.cancelled:
            self._update(rec, message=self._stop_message(), **changes)
            return "cancelled"
        if result.stopped:
            self._update(rec, **changes)
            return "stopped"
        if not result.started:
            found = failures.classify(None, engine_reason="cannot start the process")
            self._update(rec, message=f"{where}: cannot start the process: {result.error}",
                         failure_reason=str(found), errored=True, **changes)
            return found.failure_class.value
        if result.timed_out or result.oom_killed or result.exit_code != 0:
            log = _tail(exec_dir / "stderr", _LOG_TAIL)
            found = failures.classify(result.exit_code, log=log, previous=previous or (),
                                      memory_evidence=result.oom_killed,
                                      timed_out=result.timed_out)
            if previous is not None:
                previous.append(failures.Attempt(result.exit_code, failures.error_line(log)))
            if result.timed_out:
                message = f"{where}: timed out after {timeout} s"
            elif found.failure_class is ir.FailureClass.OOM and result.oom_killed:
                message = (f"{where}: killed for exceeding its memory (exit "
                           f"{result.exit_code})")
            else:
                err = log.strip()[-500:]
                message = f"{where}: exit code {result.exit_code}" + (f": {err}" if err else "")
            self._update(rec, message=message, failure_reason=str(found), errored=False,
                         **changes)
            return found.failure_class.value
        try:
            changes["outputs"] = read_outputs(self, step, exec_dir, paths)
        except _StepError as exc:
            self._update(rec, message=str(exc), **changes)
            return "fatal"
        if self.engine.cache_keys and not self._prefix:
            changes["cache_key"] = (self._part_key(step, rec, item, paths) if rec.key
                                    else self._cache_key(step, paths)) or ""
            if changes["cache_key"]:
                changes["cache_lineage"] = self._lineage(step)
            if changes["cache_key"] and rec.key:  # kept per item, for the cache to store
                for art in step.output_artifacts:
                    self._store.put(f"{rec.step}[{rec.key}]", art.name, paths.host(art.path))
        self._update(rec, message="", **changes)
        return None

    def _run_in_slot(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str],
                     exec_dir: Path, rec: _Record, *, timeout: int | None,
                     memory_limit: int | None, cancel: threading.Event
                     ) -> ProcessResult | None:
        """Run a step's process in one of the max_workers slots (None: the run was stopped
        while it waited for one)."""
        # Sub-workflows nest thread pools: the slots keep max_workers processes in all.
        while not self._slots.acquire(timeout=SAMPLE_SECONDS):
            if self._cancel.is_set():
                self._update(rec, message=self._stop_message())
                return None
        try:
            return run_process(argv, cwd=cwd, env=env, stdout_path=exec_dir / "stdout",
                               stderr_path=exec_dir / "stderr", timeout_seconds=timeout,
                               memory_limit_bytes=memory_limit, cancel=cancel,
                               on_sample=self._sampling(rec),
                               series_seconds=self.engine.series_seconds)
        finally:
            self._slots.release()

    def _cache_key(self, step: ir.Step, paths: PathMap) -> str | None:
        """The lineage key of a plain top-level step as it just ran (None: not cacheable):
        its producers' keys as recorded (run or reused), its external input artifacts'
        digests from the files it was handed -- the key the optimizer computes before a
        run (:func:`couler.optimize.cache_key.workflow_keys`) for all but the latter."""
        known = self._key_inputs(step, paths)
        if known is None:
            return None
        params, digests = known
        return step_cache_key(self.workflow, step, params=params,
                              producer_keys=self._producer_keys(step),
                              external_digests=digests)

    def _key_inputs(self, step: ir.Step, paths: PathMap | None
                    ) -> tuple[dict[str, str], dict[str, str]] | None:
        """The workflow parameter values ``step`` reads and the digests of its external
        input artifacts as handed to it (none before it ran: ``paths`` None); None when a
        value is missing."""
        params: dict[str, str] = {}
        try:
            for inp in step.inputs:
                if isinstance(inp.value, ir.WorkflowParamRef):
                    params[inp.value.name] = self._value(inp.value, step, None, {},
                                                         f"inputs.{inp.name}")
        except _StepError:
            return None
        digests = {}
        for art in step.input_artifacts:
            if isinstance(art.source, ir.StepArtifactRef) or paths is None:
                continue
            host = paths.host(art.path)
            if not host.exists():
                return None
            digests[art.name] = digest_path(host)
        return params, digests

    def _item_key(self, step: ir.Step, item: object, paths: PathMap | None = None
                  ) -> str | None:
        """The key of one item of map step ``step`` (:func:`item_cache_key`); before it
        runs (``paths`` None) a step with external input artifacts has none."""
        known = self._key_inputs(step, paths)
        if known is None:
            return None
        return item_cache_key(self.workflow, step, item, params=known[0],
                              producer_keys=self._producer_keys(step),
                              external_digests=known[1])

    def _iteration_key(self, step: ir.Step, n: int, paths: PathMap | None = None
                       ) -> str | None:
        """The key of iteration ``n`` of loop step ``step`` (:func:`iteration_cache_key`:
        it follows the key iteration ``n - 1`` has in this run's record)."""
        previous = ""
        if n > 0:
            with self._lock:
                rec = self._records.get((self._name(step.name), str(n - 1)))
            previous = rec.cache_key if rec is not None else ""
            if not previous:
                return None
        known = self._key_inputs(step, paths)
        if known is None:
            return None
        return iteration_cache_key(self.workflow, step, n, previous, params=known[0],
                                   producer_keys=self._producer_keys(step),
                                   external_digests=known[1])

    def _part_key(self, step: ir.Step, rec: _Record, item: object, paths: PathMap
                  ) -> str | None:
        """The key of the map item, loop iteration or tuning trial ``rec`` as it just ran."""
        if step.foreach is not None or step.tune is not None:
            return self._item_key(step, item, paths)
        if step.loop is not None and rec.key.isdigit():
            return self._iteration_key(step, int(rec.key), paths)
        return None

    def _producer_keys(self, step: ir.Step) -> dict[str, str]:
        """The cache keys of the top-level steps ``step`` reads from, as far as they have
        one (a producer run or reused with a key)."""
        with self._lock:
            return {p: rec.cache_key for p in producers(step)
                    if (rec := self._records.get((p, ""))) is not None and rec.cache_key}

    def _lineage(self, step: ir.Step) -> tuple[str, ...]:
        """The cache keys of the top-level steps ``step`` reads outputs or artifacts from
        (its producers' keys), sorted."""
        return tuple(sorted(set(self._producer_keys(step).values())))

    # ------------------------------------------------------------------ utilization

    def _sampling(self, rec: _Record) -> Callable[[ProcessSample], None] | None:
        """What passes the samples of ``rec``'s current attempt on (None: nobody wants them)."""
        on_sample = self._on_sample
        if on_sample is None:
            return None
        step, key, attempt = rec.step, rec.key, max(rec.attempts, 1)

        def emit(s: ProcessSample) -> None:
            on_sample(StepSample(step=step, at=s.at, cpu=s.cpu, memory_bytes=s.memory_bytes,
                                 key=key, attempt=attempt, interval_seconds=s.interval_seconds))

        return emit


@dataclass
class _Daemon:
    """A daemon step's thread: ``up`` is set while it serves and once it ended (cleared
    while a failed one waits for its retry); ``stop`` ends it."""

    up: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def settled(self) -> None:
        """Wait until the daemon serves or ended."""
        self.up.wait()


@dataclass
class _MapState:
    step: ir.Step
    items: list[object]
    queue: list[int] = field(default_factory=list)
    running: int = 0

    def __post_init__(self) -> None:
        self.queue = list(range(len(self.items)))


def failure_message(failed: Sequence[_Record], unhandled: Sequence[str]) -> str:
    """What the run record says of its failed steps: failed, or failed and handled."""
    if not failed:
        return ""
    names = ", ".join(r.step for r in failed)
    if unhandled:
        return "steps failed: " + names
    return f"steps failed, each handled by a step that ran after it: {names}"


def _expr_steps(expr: ir.DependsExpr) -> list[str]:
    if isinstance(expr, ir.DependsTerm):
        return [expr.step]
    if isinstance(expr, ir.DependsNot):
        return _expr_steps(expr.term)
    return [n for t in expr.terms for n in _expr_steps(t)]


class LocalEngine:
    """Runs workflows as processes on this machine.

    Args:
        work_dir: Directory holding one sub-directory per run.
        max_workers: At most this many step processes run at once.
        secrets: Secret values by ``(secret name, key)``.
        image_commands: Optional command prefix per container image.
        workflows: Workflows that sub-workflow steps may refer to by name.
        cache_keys: Compute each plain top-level step's content key
            (:func:`couler.optimize.step_cache_key`, by lineage) when
            it succeeds, reported as ``StepStatus.cache_key`` (for a cache to commit).
        series_seconds: The interval of the utilization samples passed to ``on_sample``.
        tune_storage: Where tune steps keep their optuna studies, an SQLAlchemy URL
            (:mod:`couler_runtime.tune`); default: the ``COULER_TUNE_STORAGE`` setting,
            else ``sqlite:///<work_dir>/tune.db``.
        image_python: The Python interpreter of a script step by its image (patterns
            allowed, :mod:`couler_runtime.local.interpreters`); default: the
            ``COULER_LOCAL_PYTHON`` setting; an unmapped image runs with ``sys.executable``.
        gpus: The GPU devices (indices or UUIDs) steps that request GPUs are given, each
            held by one step at a time (:mod:`couler_runtime.local.gpus`); default: the
            ``COULER_LOCAL_GPUS`` setting, else ``CUDA_VISIBLE_DEVICES``, else what
            ``nvidia-smi`` lists, else none.
    """

    name = ENGINE
    capabilities = CAPABILITIES

    def __init__(self, work_dir: str | Path, max_workers: int = 4,
                 secrets: Mapping[tuple[str, str], str] | None = None,
                 image_commands: Mapping[str, Sequence[str]] | None = None, *,
                 workflows: Iterable[ir.Workflow] = (), cache_keys: bool = False,
                 series_seconds: float = SERIES_SECONDS,
                 tune_storage: str | None = None,
                 image_python: Mapping[str, str] | None = None,
                 gpus: Sequence[str] | None = None) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        if not series_seconds > 0:
            raise ValueError(f"series_seconds must be more than 0, got {series_seconds}")
        self.series_seconds = series_seconds
        self.work_dir = Path(work_dir).resolve()  # steps run in their own directories
        self.max_workers = max_workers
        self.secrets: Mapping[tuple[str, str], str] = dict(secrets or {})
        self.image_commands: Mapping[str, Sequence[str]] = {
            k: tuple(v) for k, v in (image_commands or {}).items()}
        self.workflows: Mapping[str, ir.Workflow] = {w.name: w for w in workflows}
        self.cache_keys = cache_keys
        # where tune steps keep their optuna studies (an SQLAlchemy URL); None: the
        # COULER_TUNE_STORAGE setting, else sqlite:///<work_dir>/tune.db
        self.tune_storage = tune_storage
        self.image_python: Mapping[str, str] = (
            interpreters.from_env() if image_python is None else dict(image_python))
        self.gpus: tuple[str, ...] = (gpu_devices.discover() if gpus is None
                                      else gpu_devices.parse(",".join(gpus), setting="gpus"))
        self.gpu_pool = gpu_devices.GpuPool(self.gpus)  # shared by this engine's runs

    def run(self, wf: ir.Workflow, *, parameters: Mapping[str, str] | None = None,
            on_event: EventCallback | None = None,
            on_sample: SampleCallback | None = None) -> RunStatus:
        """Run ``wf`` to completion.

        Args:
            wf: The workflow.
            parameters: Values of workflow parameters (defaults otherwise).
            on_event: Called with a step's status on every change (from worker threads).
            on_sample: Called with the utilization samples of running steps (from worker
                threads; see the module docstring).

        Returns:
            The final status of the run.

        Raises:
            UnsupportedFeatureError: ``wf`` uses a feature the local engine lacks, or a
                sub-workflow step refers to a workflow not given in ``workflows`` (or
                not with the pinned digest).
            InvalidWorkflowError: A dependency names a step that does not exist, or a
                workflow reference is circular or lacks a parameter the workflow needs.
        """
        return self.start(wf, parameters=parameters, on_event=on_event,
                          on_sample=on_sample).wait()

    def start(self, wf: ir.Workflow, *, parameters: Mapping[str, str] | None = None,
              on_event: EventCallback | None = None, run_id: str | None = None,
              cached: Mapping[str, Reuse] | None = None,
              on_sample: SampleCallback | None = None) -> LocalRun:
        """Start ``wf`` on a background thread and return its handle (see :meth:`run`).

        ``run_id`` names the run directory (default: workflow name, time and a random
        suffix); an existing one raises ConflictError. ``cached`` maps top-level step
        names to results to reuse: such a step, when it is reached and its conditions
        hold, is recorded CACHED with those outputs and artifacts and does not run.
        """
        check_workflow(wf)
        ir.check_parameters(wf, parameters or {})
        references = resolve_references(wf, self.workflows)
        for each in (wf, *references.values()):
            self._check_gpus(wf.name, each)
        run_id = run_id or f"{wf.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        run_dir = self.work_dir / run_id
        try:
            run_dir.mkdir(parents=True)
        except FileExistsError:
            raise ConflictError(f"workflow {wf.name!r}: run {run_id!r} exists already "
                                f"({run_dir})") from None
        handle = LocalRun(self, wf, run_dir, parameters=parameters or {},
                          on_event=on_event, on_sample=on_sample, references=references,
                          cached=cached)
        handle._start()
        return handle

    def _check_gpus(self, name: str, wf: ir.Workflow) -> None:
        """Refuse a workflow with a step that asks for more GPUs than this machine has."""
        def walk(steps: Iterable[ir.Step], prefix: str) -> Iterable[tuple[str, ir.Step]]:
            for step in steps:
                yield prefix + step.name, step
                if isinstance(step.body, ir.SubWorkflowSpec):
                    yield from walk(step.body.steps, f"{prefix}{step.name}/")

        hooks = [s for hook in wf.exit_hooks for s in hook.steps]
        top = "" if wf.name == name else f"{wf.name}/"
        for where, step in walk([*wf.steps, *hooks], top):
            resources = step.resources or wf.defaults.resources
            wanted = resources.gpu if resources else 0
            if wanted > len(self.gpus):
                raise InsufficientResourcesError(
                    ENGINE, name, where, resource="GPU" if wanted == 1 else "GPUs",
                    requested=wanted, available=len(self.gpus),
                    hint=f"the devices come from LocalEngine(gpus=...), "
                         f"{gpu_devices.GPUS_ENV}, CUDA_VISIBLE_DEVICES or nvidia-smi")

    def retry(self, run_dir: str | Path, *, on_event: EventCallback | None = None) -> RunStatus:
        """Re-run a finished run in its directory, reusing the steps that succeeded.

        Args:
            run_dir: The run's directory (holding ``run.json``).
            on_event: As for :meth:`run`.

        Returns:
            The final status of the new attempt.

        Raises:
            NotFoundError: ``run_dir`` holds no run record.
        """
        return self.resume(run_dir, on_event=on_event).wait()

    def resume(self, run_dir: str | Path, *, on_event: EventCallback | None = None,
               interrupted: bool = False,
               on_sample: SampleCallback | None = None) -> LocalRun:
        """Start re-running a run from its failure point and return its handle.

        Steps (also inner steps of sub-workflows) that succeeded are reused with
        their map items, loop iterations and inner steps; the others run again. A step
        that was running when the engine's process died goes on counting its attempts;
        with ``interrupted`` (the run was stopped for a shutdown, not by a user), so does
        a step that shutdown cancelled.
        """
        data, latest = _load(Path(run_dir))
        wf = ir.from_dict(ir.Workflow, data["workflow"])
        saved = {name: ir.from_dict(ir.Workflow, ref)
                 for name, ref in (data.get("references") or {}).items()}
        references = resolve_references(wf, {**self.workflows, **saved})
        for each in (wf, *references.values()):
            self._check_gpus(wf.name, each)
        main = {s.name for s in wf.steps}
        reuse = {r.step: r for r in latest.values()
                 if not r.key and _top(r.step) in main and r.state in _DONE_OK}
        handle = LocalRun(self, wf, Path(run_dir), parameters=data.get("parameters") or {},
                          on_event=on_event, on_sample=on_sample, reuse=reuse,
                          previous=latest,
                          references=references)
        # The journal keeps growing: continue its numbering, or loading would replay the
        # older lines of the crashed attempt over this one's.
        handle._seq = max(int(data.get("seq", 0)), int(data.get("last_seq", 0)))
        # A step the crash interrupted (running, or waiting to retry) counts its attempts
        # on: running it again is a new attempt, never the same one twice.
        going_on = {StepState.RUNNING, StepState.RETRYING}
        if interrupted:
            going_on.add(StepState.CANCELLED)
        handle._resumed_attempts = {
            (r.step, r.key): r.attempts for r in latest.values() if r.state in going_on}
        handle._start()
        return handle

    def logs(self, run_dir: str | Path, step: str, key: str = "") -> str:
        """The text one step execution wrote: standard output, then standard error.

        Only the last attempt's text is kept (a retry overwrites the previous
        attempt's). A sub-workflow step runs no process of its own (its text is
        ""): ask for its inner steps, named ``outer/inner`` (``outer[KEY]/inner``
        inside a map item or loop iteration of ``outer``).

        Args:
            run_dir: The run's directory (holding ``run.json``).
            step: The step's name as in the run record (``StepStatus.step``).
            key: The map item index or loop iteration (``StepStatus.key``); "" for
                the step itself.

        Raises:
            NotFoundError: No run record at ``run_dir``, or the run has no
                execution of ``step`` with ``key``.
        """
        data, latest = _load(Path(run_dir))
        return _logs(Path(run_dir), str(data["workflow"]["name"]), set(latest), step, key)
