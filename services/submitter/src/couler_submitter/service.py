"""The submitter's use cases: accept runs, hand plans to engines, keep and report records.

The life of a run (states of :class:`~couler_runtime.rpc.records.RunState`)::

    Submit ─► ACCEPTED ─(requested published)─► PLANNING ─(optimized)─► PENDING ─► RUNNING
                 │                                  │                                │
                 └────────── Cancel / rejected ─────┴──► CANCELLED / FAILED    SUCCEEDED / FAILED
                                                                               / CANCELLED

Nothing accepted is lost on a crash (an outbox discipline around the store):

* Submit commits the run row, then publishes ``requested`` (msg id ``<run_id>.requested``);
  runs still ACCEPTED are republished at start-up and every ``outbox_interval`` seconds
  (JetStream drops the duplicates).
* An ``optimized`` plan is stored with the state PENDING and ``engine_run_id`` *before* the
  engine starts; the consumer acks after that. A redelivered plan for a run that is
  PENDING or later is ignored, so no run reaches an engine twice.
* At start-up, PENDING / RUNNING runs are resumed from their engine's record (the local
  engine's run directory: steps that succeeded are not run again), or started from the
  stored plan when the engine never got them.
* ``submitted`` is published after the engine start, and again when a run is resumed (a
  crash may fall between the two), under the same msg id: stored once when the restart
  comes within the streams' duplicate window (2 minutes), at least once after that.
* A plan the optimizer split to fit its engine runs as a
  :class:`~couler_submitter.chunks.ChunkedRun`: each chunk is its own engine run
  (``<run_id>-<chunk>``), resumed or retried chunk by chunk the same way.

Engine callbacks arrive on worker threads; they are handed to the event loop and handled
in order per run: the step's row is updated (the run's ``revision`` + 1), its output
artifacts are uploaded to the artifact store when it has a cache key, and a StepEvent (and
a UtilizationSample when its peaks are known) is published. When the engine finishes, the
final state is stored and ``finished`` published.

Errors: the :mod:`couler.errors` hierarchy; :class:`NotRetryableError` when Retry is asked
of a run that is not failed or cancelled (FAILED_PRECONDITION at the gRPC edge).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from couler import ir
from couler.engines.base import RunStatus, StepState, StepStatus
from couler.errors import ConflictError, NotFoundError, RetryableError, UserError
from couler_runtime.local import Reuse
from couler_runtime.rpc.records import (
    Plan,
    Run,
    RunState,
    StepRecord,
    StoredArtifact,
    Template,
    UtilizationSample,
)
from couler_submitter.chunks import ChunkedRun, chunk_run_id
from couler_submitter.engines import KNOWN_ENGINES, RunHandle, Runner, not_configured
from couler_submitter.model import DEFAULT_ENGINE, RunOptions, RunRequest
from couler_submitter.store import RunStore

__all__ = [
    "Blobs",
    "Events",
    "NotRetryableError",
    "RunPage",
    "Submitter",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NOT_STARTED = (RunState.ACCEPTED, RunState.PLANNING)
_ENGINE_SIDE = (RunState.PENDING, RunState.RUNNING)
_RETRYABLE = (RunState.FAILED, RunState.CANCELLED)
DEFAULT_PAGE = 50
DEFAULT_LOG_BYTES = 1 << 20  # what Logs returns at most by default (the end of the text)
MAX_PAGE = 1000
_WATCH_POLL = 2.0  # seconds: a watcher also re-reads the record this often (other replicas)
_PUBLISH_PATIENCE = 300.0  # seconds a run's event keeps being retried while NATS is away


class NotRetryableError(ConflictError):
    """Retry was asked of a run that is not FAILED or CANCELLED (or cannot be re-run)."""


class Events(Protocol):
    """Where the submitter's events go (``couler_submitter.events`` publishes them)."""

    async def requested(self, run: Run, request: RunRequest) -> None:
        """``couler.workflow.requested``."""

    async def submitted(self, run: Run) -> None:
        """``couler.workflow.submitted``."""

    async def step(self, run: Run, rec: StepRecord) -> None:
        """``couler.step.<state>``."""

    async def utilization(self, sample: UtilizationSample) -> None:
        """``couler.metrics.utilization``."""

    async def finished(self, run: Run) -> None:
        """``couler.workflow.finished``."""


class Blobs(Protocol):
    """The part of the artifact store the submitter uses (blocking calls)."""

    def upload(self, path: Path) -> StoredArtifact:
        """Store the file or directory at ``path``; where it went."""

    def download(self, digest: str, dest: Path) -> None:
        """Write the blob ``digest`` to ``dest``."""


@dataclass(frozen=True, slots=True)
class RunPage:
    """Runs, newest first, and the token of the next page ("" on the last)."""

    runs: tuple[Run, ...]
    next_page_token: str = ""


@dataclass(eq=False)
class _Active:
    """A run whose engine is running in this process."""

    handle: RunHandle
    workflow: ir.Workflow
    engine: str
    queue: asyncio.Queue[StepStatus | None]
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: str = ""
    task: asyncio.Task[None] | None = None


def _split(plan: Plan) -> bool:
    """Whether the plan runs as chunks (the optimizer split it to fit the engine)."""
    return len(plan.chunks) > 1


def _failure_class(status: StepStatus) -> ir.FailureClass | None:
    """How a failed step failed, from what the engine reports."""
    if status.state is not StepState.FAILED:
        return None
    if status.exit_code in (137, -9) or "exceeding its memory" in status.message:
        return ir.FailureClass.OOM
    if "cannot start the process" in status.message:
        return ir.FailureClass.INFRA
    if status.exit_code not in (None, 0) or "timed out" in status.message:
        return ir.FailureClass.TRANSIENT
    return None


class Submitter:
    """The use cases (see the module docstring).

    Args:
        store: The run records.
        events: Where events go.
        runners: The engines this submitter runs, by name.
        blobs: The artifact store (None: cached results with artifacts are not reused and
            outputs are not uploaded).
        runs_dir: Where cached artifacts are fetched to (``<runs_dir>/.cache/<run_id>``).
        outbox_interval: Seconds between republishing runs still ACCEPTED.
    """

    def __init__(self, store: RunStore, events: Events, runners: Mapping[str, Runner], *,
                 blobs: Blobs | None, runs_dir: Path, outbox_interval: float = 5.0) -> None:
        self._store = store
        self._events = events
        self._runners = dict(runners)
        self._blobs = blobs
        self._runs_dir = runs_dir
        self._outbox_interval = outbox_interval
        self._active: dict[str, _Active] = {}
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: asyncio.Task[None] | None = None
        self._closing = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Recover: republish ACCEPTED runs, resume or start runs left with an engine."""
        self._loop = asyncio.get_running_loop()
        await self._republish()
        for run in await self._call(self._store.runs_in, _ENGINE_SIDE):
            try:
                await self._recover(run)
            except Exception as exc:  # one bad run must not keep the others down
                log.error("run %s: recovery failed: %s", run.run_id, exc, exc_info=True)
                await self._fail(run.run_id, f"could not be resumed after a restart: {exc}",
                                 expect=_ENGINE_SIDE)
        self._outbox = asyncio.create_task(self._outbox_loop(), name="submitter-outbox")

    async def close(self) -> None:
        """Stop the background work and interrupt the runs; the next start resumes them."""
        self._closing = True
        if self._outbox is not None:
            self._outbox.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._outbox
        for run_id, active in list(self._active.items()):
            if active.task is not None:
                active.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await active.task
            # Stopped for the restart, not by a user: nothing is recorded, the next start
            # resumes the run (and no step process outlives this one).
            try:
                if isinstance(active.handle, ChunkedRun):
                    await self._call(active.handle.interrupt)
                else:
                    await self._call(self._runners[active.engine].interrupt, run_id,
                                     active.handle)
            except Exception as exc:
                log.warning("run %s: not stopped cleanly (%s); resumed at the next start",
                            run_id, exc)
        self._active.clear()

    async def _recover(self, run: Run) -> None:
        runner = self._runners.get(run.engine)
        if runner is None:
            await self._fail(run.run_id, str(not_configured(run.engine, tuple(self._runners))),
                             expect=_ENGINE_SIDE)
            return
        plan = await self._call(self._store.plan, run.run_id)
        if plan is None:
            await self._fail(run.run_id, "no plan was stored for it", expect=_ENGINE_SIDE)
            return
        queue: asyncio.Queue[StepStatus | None] = asyncio.Queue()
        if _split(plan):
            await self._launch(run, plan, queue=queue, resuming=True)
            return
        handle = await self._call(runner.resume, run.run_id, self._callback(queue))
        if handle is None:
            log.info("run %s: the engine never got it; starting it", run.run_id)
            await self._launch(run, plan, queue=queue)
            return
        log.info("run %s: resumed on %s", run.run_id, run.engine)
        self._track(run.run_id, handle, plan.workflow, run.engine, queue)
        # The crash may have come between the engine start and this event: publish it again
        # under the same msg id (JetStream drops it when the first one was stored).
        await self._publish(self._events.submitted, run)

    async def _outbox_loop(self) -> None:
        while True:
            await asyncio.sleep(self._outbox_interval)
            try:
                await self._republish(older_than=self._outbox_interval)
            except Exception as exc:
                log.warning("outbox: %s", exc)

    async def _republish(self, older_than: float = 0.0) -> None:
        now = time.time()
        for run in await self._call(self._store.runs_in, (RunState.ACCEPTED,)):
            if run.created_at is not None and now - run.created_at < older_than:
                continue
            await self._request_planning(run)

    async def _request_planning(self, run: Run) -> None:
        request = await self._call(self._store.request, run.run_id)
        try:
            await self._events.requested(run, request)
        except RetryableError as exc:
            log.warning("run %s: requested not published yet (%s); the outbox retries",
                        run.run_id, exc)
            return
        if await self._update(run.run_id, expect=(RunState.ACCEPTED,),
                              state=RunState.PLANNING) is None:
            log.debug("run %s: left ACCEPTED before planning was recorded", run.run_id)

    # ------------------------------------------------------------------ submit

    async def submit(self, *, workflow: ir.Workflow | None = None, text: str | None = None,
                     template: str = "", options: RunOptions,
                     idempotency_key: str = "") -> tuple[str, bool]:
        """Record a run (ACCEPTED) and request its planning; ``(run_id, created)``.

        Raises:
            UserError: No or several sources, an empty text, an unknown engine.
            ValidationError: The workflow is invalid.
            NotFoundError: No template of that name.
        """
        if sum(x is not None and x != "" for x in (workflow, text, template)) != 1:
            raise UserError("submit: give exactly one of a workflow, a text or a template")
        engine = options.engine
        if template:
            tpl = await self._call(self._store.get_template, template)
            workflow = tpl.workflow
            engine = engine or tpl.engine
        engine = (engine or DEFAULT_ENGINE).strip().lower()
        if engine not in KNOWN_ENGINES:
            raise UserError(f"submit: engine {engine!r} is unknown (known: "
                            f"{', '.join(KNOWN_ENGINES)})")
        if workflow is not None:
            ir.validate(workflow)
            ir.check_parameters(workflow, options.parameters)
        elif text is not None and not text.strip():
            raise UserError("submit: field 'text': the request is empty")
        options = RunOptions(engine=engine, parameters=dict(options.parameters),
                             dry_run=options.dry_run, no_cache=options.no_cache,
                             constraints=options.constraints, objectives=options.objectives,
                             tenant=options.tenant)
        request = RunRequest(workflow, text if workflow is None else None, options, template)
        run_id = f"run-{uuid.uuid4().hex[:20]}"
        run, created = await self._call(self._store.create_run, run_id, request,
                                        idempotency_key=idempotency_key)
        if not created:
            log.info("submit: idempotency key %r is run %s; nothing started",
                     idempotency_key, run.run_id)
            return run.run_id, False
        self._notify()
        log.info("run %s: accepted (%s, engine %s)", run_id,
                 f"workflow {workflow.name!r}" if workflow is not None else "text", engine)
        await self._request_planning(run)
        return run_id, True

    # ------------------------------------------------------------------ read

    async def get(self, run_id: str) -> Run:
        """The run's record; NotFoundError for an unknown run."""
        return await self._call(self._store.get_run, run_id)

    async def watch(self, run_id: str) -> AsyncIterator[Run]:
        """The record now, then on every change (by revision), until it is terminal."""
        last = -1
        while True:
            changed = self._changed
            run = await self.get(run_id)
            if run.revision != last:
                last = run.revision
                yield run
            if run.state.terminal:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), _WATCH_POLL)

    async def list(self, *, workflow: str = "", states: Sequence[RunState] = (),
                   page_size: int = 0, page_token: str = "") -> RunPage:
        """Runs newest first; the token is an opaque position."""
        if page_size < 0:
            raise UserError(f"list: field 'page_size' must not be negative (got {page_size})")
        limit = min(page_size or DEFAULT_PAGE, MAX_PAGE)
        try:
            offset = int(page_token) if page_token else 0
        except ValueError:
            raise UserError(f"list: field 'page_token': {page_token!r} is not a token this "
                            "server gave") from None
        runs, more = await self._call(self._store.list_runs, workflow=workflow, states=states,
                                      limit=limit, offset=max(offset, 0))
        return RunPage(tuple(runs), str(offset + limit) if more else "")

    async def logs(self, run_id: str, step: str, key: str = "",
                   max_bytes: int = DEFAULT_LOG_BYTES) -> tuple[str, bool]:
        """What one step execution wrote, from the run's engine: ``(text, truncated)``,
        the last ``max_bytes`` of it.

        Raises:
            NotFoundError: An unknown run or step, a run that has not reached its engine,
                or a step the engine has no execution of.
            UserError: The run's engine is not configured here, or ``max_bytes`` < 0.
        """
        if max_bytes < 0:
            raise UserError(f"logs: field 'max_bytes' must not be negative (got {max_bytes})")
        run = await self.get(run_id)
        plan = await self._call(self._store.plan, run_id)
        if plan is None or run.state in _NOT_STARTED:
            raise NotFoundError(f"run {run_id!r} is {run.state.value}: it has not reached its "
                                "engine, no step has logs yet")
        top = step.split("/", 1)[0]
        if all(s.name != top for s in plan.workflow.steps):
            names = ", ".join(s.name for s in plan.workflow.steps)
            raise NotFoundError(f"run {run_id!r}: workflow {plan.workflow.name!r} has no step "
                                f"{top!r} (its steps: {names})")
        runner = self._runners.get(run.engine)
        if runner is None:
            raise not_configured(run.engine, tuple(self._runners))
        engine_run_id = run.engine_run_id or run_id
        if _split(plan):  # each chunk is its own engine run
            chunk = next(c for c in plan.chunks if top in c.steps)
            engine_run_id = chunk_run_id(run_id, chunk.name)
        text = await self._call(runner.logs, engine_run_id, step, key)
        limit = max_bytes or DEFAULT_LOG_BYTES
        data = text.encode()
        if len(data) <= limit:
            return text, False
        return data[-limit:].decode(errors="ignore"), True

    # ------------------------------------------------------------------ templates

    async def register_template(self, name: str, wf: ir.Workflow, engine: str) -> Template:
        """Register (or replace) a template launched as ``couler.launch.<name>``."""
        if not _LABEL.fullmatch(name):
            raise UserError(f"template {name!r}: field 'name' must be a DNS-1123 label "
                            "(lowercase letters, digits, '-', at most 63)")
        engine = engine.strip().lower()
        if engine and engine not in KNOWN_ENGINES:
            raise UserError(f"template {name!r}: field 'engine': {engine!r} is unknown")
        ir.validate(wf)
        return await self._call(self._store.put_template, name, wf, engine)

    async def templates(self) -> Sequence[Template]:
        """The registered templates, by name."""
        return await self._call(self._store.templates)

    async def launch(self, template: str, *, parameters: Mapping[str, str], key: str,
                     engine: str = "", tenant: str = "") -> tuple[str, bool]:
        """Start a registered template (``couler.launch.<template>``); one run per key."""
        options = RunOptions(engine=engine, parameters=dict(parameters), tenant=tenant)
        return await self.submit(template=template, options=options,
                                 idempotency_key=f"launch.{template}.{key}")

    # ------------------------------------------------------------------ planning answers

    async def rejected(self, run_id: str, stage: str, reason: str,
                       issues: Sequence[str] = ()) -> None:
        """The generator or optimizer refused the run: it FAILS with the reason."""
        message = f"rejected by the {stage or 'planner'}: {reason}"
        if issues:
            message += "\n  " + "\n  ".join(issues)
        if not await self._fail(run_id, message, expect=_NOT_STARTED):
            log.info("run %s: rejection ignored (the run is past planning)", run_id)

    async def optimized(self, run_id: str, plan: Plan) -> None:
        """Start the planned run on its engine; a plan for a started run is ignored.

        Returns once the run row records the start (PENDING, engine run id) and the engine
        has the run: the consumer acks then.
        """
        run = await self.get(run_id)
        if run_id in self._active or run.state not in _NOT_STARTED:
            log.info("run %s: plan ignored (the run is %s)", run_id, run.state.value)
            return
        request = await self._call(self._store.request, run_id)
        digest = plan.workflow_digest or ir.digest(plan.workflow)
        if request.options.dry_run:
            done = await self._update(
                run_id, expect=_NOT_STARTED, state=RunState.SUCCEEDED, plan=plan,
                passes=plan.passes, workflow=plan.workflow.name, workflow_digest=digest,
                message="dry run: planned and compiled, not run", finished_at=time.time())
            if done is not None:
                await self._publish(self._events.finished, done)
            return
        runner = self._runners.get(run.engine)
        if runner is None:
            problem = str(not_configured(run.engine, tuple(self._runners)))
            await self._call(self._store.update_run, run_id, expect=_NOT_STARTED, plan=plan,
                             passes=plan.passes, workflow=plan.workflow.name,
                             workflow_digest=digest)
            await self._fail(run_id, problem, expect=_NOT_STARTED)
            return
        started = await self._update(
            run_id, expect=_NOT_STARTED, state=RunState.PENDING, plan=plan, passes=plan.passes,
            workflow=plan.workflow.name, workflow_digest=digest, engine_run_id=run_id)
        if started is None:
            log.info("run %s: cancelled or failed while planning; not started", run_id)
            return
        await self._launch(started, plan)

    # ------------------------------------------------------------------ cancel / retry

    async def cancel(self, run_id: str, reason: str = "") -> Run:
        """Stop the run; a no-op on a finished one. Returns the record."""
        run = await self.get(run_id)
        if run.state.terminal:
            return run
        message = f"cancelled: {reason}" if reason else "cancelled"
        active = self._active.get(run_id)
        if active is not None:
            active.cancel_reason = message
            await self._call(active.handle.cancel)
            # The engine stops its steps and reports; a bound on waiting, not a guarantee.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(active.done.wait(), 30.0)
            return await self.get(run_id)
        cancelled = await self._update(run_id, expect=(*_NOT_STARTED, *_ENGINE_SIDE),
                                       state=RunState.CANCELLED, message=message,
                                       finished_at=time.time())
        if cancelled is None:
            return await self.get(run_id)
        await self._publish(self._events.finished, cancelled)
        return cancelled

    async def retry(self, run_id: str) -> Run:
        """Re-run a FAILED or CANCELLED run from its failure point under the same id."""
        run = await self.get(run_id)
        if run.state not in _RETRYABLE or run_id in self._active:
            raise NotRetryableError(f"run {run_id!r} is {run.state.value}: only a failed or "
                                    "cancelled run can be retried")
        runner = self._runners.get(run.engine)
        if runner is None:
            raise NotRetryableError(f"run {run_id!r}: "
                                    f"{not_configured(run.engine, tuple(self._runners))}")
        plan = await self._call(self._store.plan, run_id)
        if plan is None:
            raise NotRetryableError(f"run {run_id!r} ended before it was planned "
                                    f"({run.message or run.state.value}); submit it again")
        updated = await self._update(run_id, expect=_RETRYABLE, state=RunState.PENDING,
                                     retries=run.retries + 1, message="", finished_at=None)
        if updated is None:
            raise NotRetryableError(f"run {run_id!r} changed state meanwhile; not retried")
        queue: asyncio.Queue[StepStatus | None] = asyncio.Queue()
        if _split(plan):  # chunks that did not succeed retry from their failure point
            await self._launch(updated, plan, queue=queue, retry=True)
            log.info("run %s: retry %d started", run_id, updated.retries)
            return await self.get(run_id)
        try:
            handle = await self._call(runner.retry, run_id, self._callback(queue))
        except Exception as exc:
            await self._fail(run_id, f"retry failed to start: {exc}", expect=_ENGINE_SIDE)
            raise
        if handle is None:
            await self._launch(updated, plan, queue=queue)
        else:
            self._track(run_id, handle, plan.workflow, run.engine, queue)
            await self._publish(self._events.submitted, updated)
        log.info("run %s: retry %d started", run_id, updated.retries)
        return await self.get(run_id)

    # ------------------------------------------------------------------ engine side

    async def _launch(self, run: Run, plan: Plan,
                      queue: asyncio.Queue[StepStatus | None] | None = None, *,
                      resuming: bool = False, retry: bool = False) -> None:
        """Hand the stored plan to the engine (the row says PENDING already).

        A split plan runs as a :class:`ChunkedRun` (``resuming``: after a restart, its
        chunks the engine has are picked up; ``retry``: those that did not succeed retry).
        """
        runner = self._runners[run.engine]
        request = await self._call(self._store.request, run.run_id)
        cached: Mapping[str, Reuse] = {}
        if plan.cached and not request.options.no_cache:
            cached = await self._call(self._fetch_cached, run.run_id, plan)
        queue = queue if queue is not None else asyncio.Queue()
        parameters = {**request.options.parameters}
        try:
            handle: RunHandle
            if _split(plan):
                chunked = ChunkedRun(runner, run.run_id, workflow=plan.workflow,
                                     chunks=plan.chunks, parameters=parameters, cached=cached,
                                     on_event=self._callback(queue), retry=retry)
                await self._call(chunked.launched.wait)
                handle = chunked
            else:
                handle = await self._call(runner.start, run.run_id, plan.workflow, parameters,
                                          cached, self._callback(queue))
        except Exception as exc:  # the engine has not got the run: record why, never hang
            log.warning("run %s: engine %r did not start it: %s", run.run_id, run.engine, exc,
                        exc_info=not isinstance(exc, UserError))
            await self._fail(run.run_id, f"engine {run.engine!r} refused the run: {exc}",
                             expect=_ENGINE_SIDE)
            return
        self._track(run.run_id, handle, plan.workflow, run.engine, queue)
        engine_run_id = getattr(handle, "engine_run_id", run.run_id)  # remote engines' own
        if engine_run_id != run.engine_run_id:
            run = await self._update(run.run_id, engine_run_id=engine_run_id) or run
        if (await self.get(run.run_id)).state.terminal:  # cancelled while it was starting
            await self._call(handle.cancel)
        if resuming and isinstance(handle, ChunkedRun) and handle.picked_up:
            # published again under the same msg id, as for a resumed run (see _recover)
            log.info("run %s: resumed on %s (split plan, %d chunks)", run.run_id, run.engine,
                     len(plan.chunks))
        else:
            log.info("run %s: started on %s (%d cached step(s)%s)", run.run_id, run.engine,
                     len(cached), f", {len(plan.chunks)} chunks" if _split(plan) else "")
        await self._publish(self._events.submitted, run)

    def _fetch_cached(self, run_id: str, plan: Plan) -> dict[str, Reuse]:
        """The plan's cache hits as the local engine takes them (artifacts fetched)."""
        reuse: dict[str, Reuse] = {}
        for step, entry in plan.cached.items():
            paths: dict[str, Path] = {}
            try:
                for name, art in entry.artifacts.items():
                    if self._blobs is None:
                        raise UserError("no artifact store configured")
                    dest = self._runs_dir / ".cache" / run_id / step / name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    self._blobs.download(art.digest, dest)
                    paths[name] = dest
            except Exception as exc:  # a hit that cannot be used: the step runs instead
                log.warning("run %s, step %r: cached result %s not reused: %s", run_id, step,
                            entry.key[:12], exc)
                continue
            reuse[step] = Reuse(entry.key, dict(entry.outputs), paths)
        return reuse

    def _callback(self, queue: asyncio.Queue[StepStatus | None]
                  ) -> Callable[[StepStatus], None]:
        loop = self._loop
        if loop is None:
            raise RuntimeError("Submitter.start() was not awaited")

        def on_event(status: StepStatus) -> None:
            # From the engine's worker threads: hand the change to the event loop.
            with contextlib.suppress(RuntimeError):  # loop closed: resumed at the next start
                loop.call_soon_threadsafe(queue.put_nowait, status)

        return on_event

    def _track(self, run_id: str, handle: RunHandle, wf: ir.Workflow, engine: str,
               queue: asyncio.Queue[StepStatus | None]) -> None:
        active = _Active(handle, wf, engine, queue)
        self._active[run_id] = active
        loop = self._loop
        assert loop is not None  # _callback checked it

        def wait() -> None:  # its own thread: a run may take hours; the pool is for I/O
            with contextlib.suppress(Exception):
                handle.wait()
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=wait, name=f"submitter-wait-{run_id}", daemon=True).start()
        active.task = asyncio.create_task(self._drive(run_id, active), name=f"run:{run_id}")

    async def _drive(self, run_id: str, active: _Active) -> None:
        try:
            while (status := await active.queue.get()) is not None:
                try:
                    await self._on_step(run_id, active, status)
                except (asyncio.CancelledError, GeneratorExit):
                    raise
                except Exception as exc:
                    log.error("run %s: recording step %r failed: %s", run_id, status.step, exc,
                              exc_info=True)
            final = await self._call(active.handle.wait)
            await self._finish(run_id, active, final)
        finally:
            active.done.set()
            if self._active.get(run_id) is active:
                del self._active[run_id]

    async def _on_step(self, run_id: str, active: _Active, status: StepStatus) -> None:
        artifacts: dict[str, StoredArtifact] = {}
        cache_key = status.cache_key
        if status.state is StepState.SUCCEEDED and cache_key and not status.key:
            try:
                artifacts = await self._call(self._upload, active, status.step)
            except Exception as exc:  # never commit an entry without its artifacts
                log.warning("run %s, step %r: artifacts not stored (%s); not cacheable",
                            run_id, status.step, exc)
                cache_key = ""
        rec = dataclasses.replace(
            StepRecord.from_status(status, failure_class=_failure_class(status)),
            cache_key=cache_key, artifacts=artifacts)
        moving = status.state not in (StepState.PENDING,)
        run = await self._call(self._store.put_step, run_id, rec,
                               state=RunState.RUNNING if moving else None,
                               started_at=status.started_at if moving else None)
        self._notify()
        await self._publish(self._events.step, run, rec)
        # Peaks are known once an attempt ended; a process too short to sample has none.
        if status.state in (StepState.SUCCEEDED, StepState.FAILED) and status.peak_memory_bytes:
            sample = UtilizationSample(
                run_id=run_id, workflow=run.workflow, step=status.step,
                at=status.finished_at or time.time(), cpu=status.peak_cpu or 0.0,
                memory_bytes=status.peak_memory_bytes or 0, key=status.key,
                attempt=max(status.attempts, 1))
            await self._publish(self._events.utilization, sample)

    def _upload(self, active: _Active, step_name: str) -> dict[str, StoredArtifact]:
        step = next((s for s in active.workflow.steps if s.name == step_name), None)
        if step is None or not step.output_artifacts:
            return {}
        if self._blobs is None:
            raise UserError("no artifact store configured")
        stored = {}
        for art in step.output_artifacts:
            path = active.handle.artifact_path(step_name, art.name)
            if path is None:
                raise UserError(f"step {step_name!r}, field 'output_artifacts.{art.name}': "
                                "the engine kept no such artifact")
            stored[art.name] = self._blobs.upload(path)
        return stored

    async def _finish(self, run_id: str, active: _Active, final: RunStatus) -> None:
        state = RunState.from_engine(final.state)
        message = final.message
        if state is RunState.CANCELLED and active.cancel_reason:
            message = active.cancel_reason
        run = await self._update(run_id, expect=_ENGINE_SIDE, state=state, message=message,
                                 finished_at=final.finished_at or time.time())
        shutil.rmtree(self._runs_dir / ".cache" / run_id, ignore_errors=True)
        if run is None:
            return
        log.info("run %s: %s%s", run_id, state.value, f" ({message})" if message else "")
        await self._publish(self._events.finished, run)

    # ------------------------------------------------------------------ helpers

    async def _fail(self, run_id: str, message: str, *, expect: Iterable[RunState]) -> bool:
        run = await self._update(run_id, expect=tuple(expect), state=RunState.FAILED,
                                 message=message, finished_at=time.time())
        if run is None:
            return False
        log.info("run %s: failed: %s", run_id, message)
        await self._publish(self._events.finished, run)
        return True

    async def _update(self, run_id: str, **changes: object) -> Run | None:
        run = await self._call(self._store.update_run, run_id, **changes)
        if run is not None:
            self._notify()
        return run

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _publish(self, publish: Callable[..., Awaitable[None]], *args: object) -> None:
        """Publish, retrying while the bus is away (bounded); the record is already stored."""
        delay, waited = 0.2, 0.0
        while True:
            try:
                await publish(*args)
                return
            except RetryableError as exc:
                if self._closing or waited >= _PUBLISH_PATIENCE:
                    log.error("event %s not published: %s", publish.__name__, exc)
                    return
                await asyncio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 5.0)

    @staticmethod
    async def _call(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)
