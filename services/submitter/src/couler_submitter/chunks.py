"""Run a split plan: its chunks, each as its own engine run, in the order of the chunk graph.

The optimizer splits a workflow too large for its engine into chunks (see
:mod:`couler.optimize.split`): an acyclic graph in which a step that reads an output of a
step in another chunk reads the chunk parameter ``x--STEP--OUTPUT`` instead.
:class:`ChunkedRun` is the :class:`~couler_submitter.engines.RunHandle` of such a plan:

* Each chunk runs on the run's engine as run ``<run_id>-<chunk>`` (:func:`chunk_run_id`),
  once every chunk it depends on has succeeded; independent chunks run side by side.
* Before a chunk starts, its hand-off parameters are filled from the outputs its upstream
  chunks' steps reported. An output the engine did not report fails the run with a message
  naming the workflow, chunk, step and output (no chunk starts on a guess).
* Every chunk is first offered to the runner's ``resume``: after a submitter crash a chunk
  the engine already has is picked up (or its finished record read), never started twice;
  the run as a whole is resumed by building a new :class:`ChunkedRun`. On ``retry`` the
  chunks that did not succeed are retried from their failure point, the others reused.
* When a chunk fails or is cancelled, chunks not started yet are not started: their steps
  are reported SKIPPED (``not run: chunk ... failed``) and the run ends with the state of the
  first chunk that did not succeed, its message prefixed with the chunk's name.

Step events keep the workflow's step names (chunks do not rename steps), so the run record
reads as if the workflow had run in one piece.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from couler import ir
from couler.engines.base import RunState, RunStatus, StepState, StepStatus
from couler.errors import DocumentTooLargeError
from couler.optimize.split import handoff_parameter
from couler_runtime.local import Reuse
from couler_runtime.rpc.records import Chunk
from couler_submitter.engines import OnSample, OnStep, RunHandle, Runner

__all__ = ["ChunkedRun", "chunk_run_id"]

log = logging.getLogger(__name__)


def chunk_run_id(run_id: str, chunk: str) -> str:
    """The engine run id of ``chunk`` of run ``run_id``."""
    return f"{run_id}-{chunk}"


class ChunkedRun:
    """The handle of a split plan's run (see the module docstring).

    Args:
        runner: The run's engine.
        run_id: The submitter's run id (also this handle's ``engine_run_id``).
        workflow: The whole workflow (its name goes on the final status).
        chunks: The plan's chunks, each with its workflow.
        parameters: The run's parameters (every chunk gets them).
        cached: Cache hits by step name (each chunk gets its own steps').
        on_event: Step changes, from the chunks' engines and for skipped steps.
        retry: Retry chunks that did not succeed from their failure point.
        on_sample: What the chunks' running steps use.
    """

    def __init__(self, runner: Runner, run_id: str, *, workflow: ir.Workflow,
                 chunks: Sequence[Chunk], parameters: Mapping[str, str],
                 cached: Mapping[str, Reuse], on_event: OnStep, retry: bool = False,
                 on_sample: OnSample | None = None) -> None:
        missing = [c.name for c in chunks if c.workflow is None]
        if missing:
            raise ValueError(f"workflow {workflow.name!r}: chunk(s) {', '.join(missing)} "
                             "came without a workflow")
        self.engine_run_id = run_id
        self._runner = runner
        self._run_id = run_id
        self._workflow = workflow
        self._chunks = {c.name: c for c in chunks}
        self._parameters = dict(parameters)
        self._cached = dict(cached)
        self._on_event = on_event
        self._on_sample = on_sample
        self._retry = retry
        self._lock = threading.Lock()
        self._handles: dict[str, RunHandle] = {}
        self._ended: set[str] = set()  # chunks whose engine run is over
        self._cancelled = threading.Event()
        self._interrupted = False
        self._status: RunStatus | None = None
        #: set once the first chunks are started or picked up; ``picked_up`` then says whether
        #: the engine already had any (a resumed run, rather than one starting now)
        self.launched = threading.Event()
        # The engine refused a chunk's document for its size before any chunk started.
        self.refused: DocumentTooLargeError | None = None
        self.picked_up = False
        self._thread = threading.Thread(target=self._main, name=f"couler-chunks-{run_id}",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ RunHandle

    def wait(self) -> RunStatus:
        self._thread.join()
        assert self._status is not None  # set by the thread before it ends
        return self._status

    def cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            handles = list(self._handles.values())
        for handle in handles:
            handle.cancel()

    def interrupt(self) -> None:
        """Stop because the submitter stops: each running chunk is interrupted on its engine
        (the next start resumes it), and nothing is reported for chunks not started."""
        self._interrupted = True
        self._cancelled.set()
        with self._lock:
            handles = {n: h for n, h in self._handles.items() if n not in self._ended}
        for name, handle in handles.items():
            self._runner.interrupt(chunk_run_id(self._run_id, name), handle)

    def artifact_path(self, step: str, artifact: str) -> Path | None:
        top = step.partition("[")[0]  # a map item's or loop iteration's: "step[N]"
        for name, chunk in self._chunks.items():
            if top in chunk.steps:
                with self._lock:
                    handle = self._handles.get(name)
                return None if handle is None else handle.artifact_path(step, artifact)
        return None

    # ------------------------------------------------------------------ the run

    def _main(self) -> None:
        started = time.time()
        try:
            self._status = self._run(started)
        except DocumentTooLargeError as exc:
            with self._lock:
                if not self._handles:  # nothing runs yet: the run can be planned again
                    self.refused = exc
            log.warning("run %s: chunks: %s", self._run_id, exc)
            self._status = RunStatus(self._run_id, self._workflow.name, RunState.FAILED,
                                     started_at=started, finished_at=time.time(),
                                     message=f"running the chunks failed: {exc}")
        except Exception as exc:  # never leave wait() without a status
            log.error("run %s: chunks: %s", self._run_id, exc, exc_info=True)
            self._status = RunStatus(self._run_id, self._workflow.name, RunState.FAILED,
                                     started_at=started, finished_at=time.time(),
                                     message=f"running the chunks failed: {exc}")
        finally:
            self.launched.set()

    def _run(self, started: float) -> RunStatus:
        done: dict[str, RunStatus] = {}
        running: set[str] = set()
        finished: queue.Queue[tuple[str, RunStatus]] = queue.Queue()
        stopped: tuple[str, RunStatus] | None = None  # the first chunk that did not succeed
        while True:
            if stopped is None and not self._cancelled.is_set():
                for name in self._ready(done, running):
                    status = self._launch(name, done, finished)
                    if status is not None:  # refused before it started
                        stopped = stopped or (name, status)
                        done[name] = status
                        break
                    running.add(name)
            self.launched.set()
            if not running:
                break
            name, status = finished.get()
            running.discard(name)
            done[name] = status
            if status.state is not RunState.SUCCEEDED and stopped is None:
                stopped = (name, status)
                log.info("run %s: chunk %s %s; no further chunk starts", self._run_id, name,
                         status.state.value)
        return self._final(started, done, stopped)

    def _ready(self, done: Mapping[str, RunStatus], running: set[str]) -> list[str]:
        return [name for name, c in self._chunks.items()
                if name not in done and name not in running
                and all(d in done and done[d].state is RunState.SUCCEEDED
                        for d in c.depends_on)]

    def _launch(self, name: str, done: Mapping[str, RunStatus],
                finished: queue.Queue[tuple[str, RunStatus]]) -> RunStatus | None:
        """Start (or pick up) one chunk; a status instead when it cannot start."""
        chunk = self._chunks[name]
        wf = chunk.workflow
        assert wf is not None  # checked in __init__
        sub_id = chunk_run_id(self._run_id, name)
        handle = self._runner.resume(sub_id, self._on_event, on_sample=self._on_sample)
        if handle is not None:
            self.picked_up = True
        if handle is not None and self._retry:
            previous = handle.wait()
            if previous.state is not RunState.SUCCEEDED:
                handle = self._runner.retry(sub_id, self._on_event, on_sample=self._on_sample)
                if handle is None:
                    log.info("run %s: chunk %s has no record to retry; starting it",
                             self._run_id, name)
        if handle is None:
            try:
                parameters = {**self._parameters, **self._handoffs(chunk, done)}
            except _MissingOutputError as exc:
                return RunStatus(sub_id, wf.name, RunState.FAILED, finished_at=time.time(),
                                 message=str(exc))
            mine = set(chunk.steps)  # a set: a chunk may hold thousands of steps
            cached = {s: r for s, r in self._cached.items() if s in mine}
            handle = self._runner.start(sub_id, wf, parameters, cached, self._on_event,
                                        on_sample=self._on_sample)
            log.info("run %s: chunk %s started (%d step(s))", self._run_id, name,
                     len(chunk.steps))
        with self._lock:
            self._handles[name] = handle
        if self._cancelled.is_set():  # cancelled while it was starting
            handle.cancel()

        def wait() -> None:
            try:
                status = handle.wait()
            except Exception as exc:
                status = RunStatus(sub_id, wf.name, RunState.FAILED, finished_at=time.time(),
                                   message=f"lost track of the chunk: {exc}")
            with self._lock:
                self._ended.add(name)
            finished.put((name, status))

        threading.Thread(target=wait, name=f"couler-chunk-{sub_id}", daemon=True).start()
        return None

    def _handoffs(self, chunk: Chunk, done: Mapping[str, RunStatus]) -> dict[str, str]:
        """The chunk's hand-off parameters, from the outputs its upstream chunks reported."""
        assert chunk.workflow is not None
        wanted = {p.name for p in chunk.workflow.parameters}
        values: dict[str, str] = {}
        for up in chunk.depends_on:
            for step in done[up].steps:
                if step.key:  # one map item or loop iteration; the step's own record has ""
                    continue
                for output, value in step.outputs.items():
                    name = handoff_parameter(step.step, output)
                    if name in wanted:
                        values[name] = value
        top = {p.name for p in self._workflow.parameters}
        for p in chunk.workflow.parameters:
            if p.name in top or p.name in values:
                continue
            raise _MissingOutputError(self._workflow.name, chunk, p.name)
        return values

    def _final(self, started: float, done: Mapping[str, RunStatus],
               stopped: tuple[str, RunStatus] | None) -> RunStatus:
        steps: list[StepStatus] = []
        for name in self._chunks:
            if name in done:
                steps += done[name].steps
        reported = {s.step for s in steps}
        why = "the run was cancelled" if stopped is None else f"chunk {stopped[0]} " + (
            "failed" if stopped[1].state is RunState.FAILED else stopped[1].state.value)
        now = time.time()
        for chunk in self._chunks.values():  # not started, or refused before it started
            for step in chunk.steps:
                if step not in reported and not self._interrupted:
                    skipped = StepStatus(step=step, state=StepState.SKIPPED, finished_at=now,
                                         message=f"not run: {why}")
                    steps.append(skipped)
                    self._on_event(skipped)
        if stopped is not None:
            name, status = stopped
            state = status.state
            message = f"chunk {name}: {status.message or state.value}"
        elif self._cancelled.is_set() and len(done) < len(self._chunks):
            state, message = RunState.CANCELLED, "cancelled"
        else:
            state, message = RunState.SUCCEEDED, ""
        return RunStatus(self._run_id, self._workflow.name, state, tuple(steps), started, now,
                         message)


class _MissingOutputError(Exception):
    def __init__(self, workflow: str, chunk: Chunk, parameter: str) -> None:
        step, _, output = parameter.removeprefix("x--").rpartition("--")
        upstream = ", ".join(chunk.depends_on) or "none"
        super().__init__(
            f"workflow {workflow!r}, chunk {chunk.name!r}: hand-off parameter {parameter!r} "
            f"has no value: step {step!r} (in chunk {upstream}) reported no output "
            f"{output!r}; the engine must report step outputs for a split plan to run")
