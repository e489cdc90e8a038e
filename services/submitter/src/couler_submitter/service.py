"""The submitter's use cases: accept runs, hand plans to engines, keep and report records.

The life of a run (states of :class:`~couler_runtime.rpc.records.RunState`)::

    Submit ─► ACCEPTED ─(requested published)─► PLANNING ─(optimized)─► PENDING ─► RUNNING
                 │                                  │                                │
                 └────────── Cancel / rejected ─────┴──► CANCELLED / FAILED    SUCCEEDED / FAILED
                                                                               / CANCELLED

Nothing accepted is lost, and no event is lost or sent twice into the streams' duplicate
window, on a crash or while NATS is away -- a transactional outbox:

* Every event (requested, submitted, step, utilization samples, finished) is inserted in the
  ``submitter_outbox`` table in the same transaction as the change it reports
  (:class:`~couler_submitter.store.RunStore`). One sender task publishes the rows in id
  order -- many in flight at once, each with its deterministic msg id -- and deletes them
  once JetStream stored them. Rows committed on the event loop reach the sender as they
  were committed (in commit order) instead of being read back; whenever the table may hold
  others (written from a thread, left by a previous process or a failed attempt, and
  every ``outbox_interval`` anyway) the sender reads the table. While NATS is away rows
  accumulate and runs go on; the sender retries with back-off, and at start-up it drains
  what a previous process left, alongside recovery. A row that can never be published (a
  UserError, or a payload that no longer decodes) is moved to ``submitter_outbox_dead``
  with the reason and logged; the rest go on.
* A run leaves ACCEPTED (for PLANNING) once its ``requested`` event is stored.
* An ``optimized`` plan is stored with the state PENDING and ``engine_run_id`` *before* the
  engine starts; the consumer acks after that. A redelivered plan for a run that is
  PENDING or later is ignored, so no run reaches an engine twice.
* At start-up, PENDING / RUNNING runs are resumed from their engine's record (the local
  engine's run directory: steps that succeeded are not run again), or started from the
  stored plan when the engine never got them. ``submitted`` is queued again then, under
  the same msg id (stored once within the streams' duplicate window, 2 minutes).
* A plan the optimizer split to fit its engine runs as a
  :class:`~couler_submitter.chunks.ChunkedRun`: each chunk is its own engine run
  (``<run_id>-<chunk>``), resumed or retried chunk by chunk the same way.
* :meth:`Submitter.close` (a graceful stop) stops the runs without recording anything about
  them: the next start resumes them.

Store calls run in worker threads, except short ones on a quick store (SQLite: a few rows
and no network, :attr:`RunStore.quick`), which run on the event loop: handing a
transaction of a fraction of a millisecond to a thread and back costs more than it does.

Engine callbacks arrive on worker threads; they are handed to the event loop and handled
in order per run, in batches: the steps' rows (the run's ``revision`` + 1 per change) and
their events commit in one transaction; a step's output artifacts are uploaded to the
artifact store first when it has a cache key. The run's end commits with the last of them,
together with a record (and a step event) for every step the engine never reported, so
that none looks pending forever: an exit hook that did not fire is SKIPPED, saying why, on
every engine (:mod:`couler_submitter.unreported`).

Utilization: the engines pass what running steps use (:class:`~couler.engines.base.StepSample`,
from their threads) to a buffer per run; every ``metrics_interval`` seconds the buffered
samples are queued in the outbox (one ``couler.metrics.batch`` event per run, in one
transaction) and published like every event. A batch of step changes takes the run's
buffered samples into its own transaction (so a step's last samples go out with its end).

Large workflows and records: a workflow too large for one message is uploaded in chunks to
the shared blob store (:meth:`Submitter.upload_workflow`) and submitted by reference; a
record is read a page of steps at a time (:meth:`Submitter.get`), and a watcher is sent
only what changed (:meth:`Submitter.watch`). Sizes are checked at Submit and
RegisterTemplate against :class:`couler.ir.limits.SizeLimits`.

Errors: the :mod:`couler.errors` hierarchy; :class:`NotRetryableError` when Retry is asked
of a run that is not failed or cancelled (FAILED_PRECONDITION at the gRPC edge).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp
from opentelemetry import context as otel_context

from couler import failures, ir
from couler.engines.base import RunStatus, StepSample, StepState, StepStatus
from couler.errors import (
    ConflictError,
    CoulerError,
    DocumentTooLargeError,
    NotFoundError,
    RetryableError,
    UserError,
)
from couler.ir.limits import DEFAULT_LIMITS, SizeLimits, check_sizes
from couler.optimize.cache_key import unneeded_steps
from couler.v1 import common_pb2, events_pb2, workflow_pb2
from couler_runtime import codec, offload, telemetry
from couler_runtime.blobs import BlobIntegrityError
from couler_runtime.local import Reuse
from couler_runtime.local.artifacts import digest_path
from couler_runtime.metrics import meter
from couler_runtime.rpc.records import (
    BlobRef,
    Plan,
    Run,
    RunState,
    StepRecord,
    StoredArtifact,
    Template,
    UtilizationSample,
    run_from_proto,
    step_record_from_proto,
    utilization_batch_from_proto,
    utilization_sample_from_proto,
)
from couler_submitter.chunks import ChunkedRun, chunk_run_id
from couler_submitter.engines import KNOWN_ENGINES, RunHandle, Runner, not_configured
from couler_submitter.model import DEFAULT_ENGINE, RunOptions, RunRequest
from couler_submitter.reused import AllReused, keyed_by_plan, taken_out
from couler_submitter.schedules import Scheduler, check_schedule, next_tick, tick_key
from couler_submitter.store import (
    EventKind,
    Finish,
    OutboxEntry,
    RunStore,
    ScheduleState,
    parse_page_token,
)
from couler_submitter.triggers import (
    allowed_launchers,
    check_triggers,
    filter_matches,
    subject_matches,
)
from couler_submitter.unreported import unreported_steps

__all__ = [
    "BLOB_CHUNK",
    "DEFAULT_STEP_PAGE",
    "MAX_STEP_PAGE",
    "Blobs",
    "CacheEntries",
    "Events",
    "NotRetryableError",
    "RunPage",
    "ScheduleView",
    "Submitter",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_KEY = 255  # characters of an idempotency key (the column's width)
_NOT_STARTED = (RunState.ACCEPTED, RunState.PLANNING)
_ENGINE_SIDE = (RunState.PENDING, RunState.RUNNING)
_RETRYABLE = (RunState.FAILED, RunState.CANCELLED)
#: How many times a run refused by its engine for its size is planned again (each time
#: the optimizer's learned budget for the engine is lower) before it fails.
MAX_SIZE_REPLANS = 3
DEFAULT_PAGE = 50
DEFAULT_LOG_BYTES = 1 << 20  # what Logs returns at most by default (the end of the text)
MAX_PAGE = 1000
DEFAULT_STEP_PAGE = 1000  # steps per Get page / Watch message by default
MAX_STEP_PAGE = 10_000
BLOB_CHUNK = 1 << 20  # bytes per DownloadBlob message
MAX_UPLOAD_CHUNK = 4 << 20  # the largest UploadWorkflow chunk taken
_WATCH_POLL = 2.0  # seconds: a watcher also re-reads the record this often (other replicas)
# A watcher's next round of changes starts no sooner than this many times the CPU time
# the previous round spent reading the store (changes meanwhile are sent together), and
# waits at most
# _WATCH_MAX_PAUSE: a quiet run's change goes out at once (a round woken by a change made
# here reads nothing), and a run of 100k steps, whose rounds read long, spends a bounded
# share of its time on them instead of a round per change.
_WATCH_SPACING = 4.0
_WATCH_MAX_PAUSE = 1.0  # seconds
_HEADERS_KEPT = 4096  # records of runs a watcher may be woken for, kept in memory
_STEP_BATCH = 500  # step changes of one run recorded in one transaction at most
_OUTBOX_BATCH = 1000  # outbox rows read at once
_QUICK_ROWS = 64  # rows a store call may read or write on the event loop (a quick store)
_QUICK_BYTES = 1 << 20  # bytes a store call may write on the event loop
_OUTBOX_WINDOW = 256  # events in flight at once
_OUTBOX_MAX_ATTEMPTS = 5  # failures (other than NATS being away) before a row is set aside
_OUTBOX_MAX_DELAY = 5.0  # seconds between attempts while NATS is away, at most
_INLINE_SAFE = 16 * 1024  # a row's payload under this goes inline (the bus's limit: 64 KiB)
_MAX_PENDING_SAMPLES = 20_000  # samples buffered per run at most (the oldest are dropped)


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
        """``couler.metrics.utilization`` (one sample: an outbox row left by a submitter
        from before the time series)."""

    async def utilization_batch(self, run: Run, samples: Sequence[UtilizationSample]) -> None:
        """``couler.metrics.batch``: samples of one run's steps."""

    async def finished(self, run: Run) -> None:
        """``couler.workflow.finished``."""

    async def refused(self, run: Run, refusal: events_pb2.DocumentRefused,
                      request: RunRequest | None) -> None:
        """``couler.workflow.refused``; with the run's ``request`` when it is planned again."""


class Blobs(Protocol):
    """The part of the artifact store the submitter uses (blocking calls)."""

    def upload(self, path: Path) -> StoredArtifact:
        """Store the file or directory at ``path``; where it went."""

    def download(self, digest: str, dest: Path) -> None:
        """Write the blob ``digest`` to ``dest``."""

    def put_file(self, path: Path) -> str:
        """Store the file's bytes as they are; their ``sha256:<hex>`` digest."""

    def size(self, digest: str) -> int:
        """The size of blob ``digest`` in bytes; NotFoundError when it is not stored."""

    def get_file(self, digest: str, dest: Path) -> None:
        """Write the bytes of blob ``digest`` to the file ``dest``, checked against it."""


class CacheEntries(Protocol):
    """The part of the cache service the submitter uses (a blocking call)."""

    def evict(self, keys: Iterable[str]) -> object:
        """Drop the entries of ``keys`` from the cache."""


@dataclass(frozen=True, slots=True)
class RunPage:
    """Runs, newest first, and the token of the next page ("" on the last)."""

    runs: tuple[Run, ...]
    next_page_token: str = ""


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A schedule as ``couler schedule ls`` shows it: its stored state, its template's
    cron spec and engine, and its next tick (None while paused or suspended)."""

    state: ScheduleState
    schedule: ir.CronSchedule
    engine: str
    next_tick: float | None


def _one_run(wf: ir.Workflow) -> ir.Workflow:
    """``wf`` as one run of it: without its schedule and triggers (the submitter's own
    business, not the engine's)."""
    if wf.schedule is None and not wf.triggers:
        return wf
    return dataclasses.replace(wf, schedule=None, triggers=())


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
    final: RunStatus | None = None  # set by the waiting thread before it posts the end
    reported: set[str] = field(default_factory=set)  # steps the engine reported (any key)
    # The plan's cache keys (known before the run): a remote engine's results are
    # committed under them.
    keys: Mapping[str, str] = field(default_factory=dict)
    _steps: dict[str, ir.Step] | None = None

    def step(self, name: str) -> ir.Step | None:
        """The top-level step ``name`` (indexed on first use: a run may have 100k)."""
        if self._steps is None:
            self._steps = {s.name: s for s in self.workflow.steps}
        return self._steps.get(name)


def _split(plan: Plan) -> bool:
    """Whether the plan runs as chunks (the optimizer split it to fit the engine)."""
    return len(plan.chunks) > 1


def _failure(status: StepStatus) -> tuple[ir.FailureClass | None, str]:
    """How a failed (or retrying) step failed and why: the engine's own class when it
    classified the attempt (the local and Ray engines), else :func:`couler.failures.classify`
    over what a remote engine reports (its message holds the reason: ``OOMKilled``,
    ``Evicted``, ``pod deleted``, ``Error (exit code 1)``)."""
    if status.state not in (StepState.FAILED, StepState.RETRYING):
        return None, ""
    if status.failure:
        return ir.FailureClass(status.failure), status.failure_reason
    if status.exit_code == 0:
        return None, ""  # it ran and then failed the engine's checks (outputs): no class
    found = failures.classify(status.exit_code, engine_reason=status.message,
                              log=status.message, timed_out="timed out" in status.message)
    if found.pattern == "unknown":  # no exit code and nothing recognised: no class
        return None, ""
    return found.failure_class, str(found)


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set, at most ``timeout`` seconds; whether it was set.

    Unlike ``asyncio.wait_for`` on Python 3.11, a cancellation that arrives as the event is
    set is never swallowed (a loop around it would otherwise never stop).
    """
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter,), timeout=timeout)
    finally:
        waiter.cancel()
    return event.is_set()


def _cpu_timed(fn: Callable[..., T]) -> Callable[..., tuple[T, float]]:
    """``fn`` returning also the CPU time its thread spent in it (not the time it waited
    for a worker or the GIL)."""
    def timed(*args: object, **kwargs: object) -> tuple[T, float]:
        begun = time.thread_time()
        result = fn(*args, **kwargs)
        return result, time.thread_time() - begun

    return timed


def _alone(row: OutboxEntry) -> bool:
    """Whether an outbox row is published on its own: its body may be large enough to go
    by reference (a requested event carries the workflow)."""
    return row.kind == EventKind.REQUESTED.value or len(row.payload) > _INLINE_SAFE


def _step_page(size: int, field: str = "step_page_size") -> int:
    if size < 0:
        raise UserError(f"field {field!r} must not be negative (got {size})")
    return min(size or DEFAULT_STEP_PAGE, MAX_STEP_PAGE)


def _check_ref(ref: BlobRef, what: str) -> None:
    if not _DIGEST.fullmatch(ref.digest):
        raise UserError(f"{what}: field 'digest' must be 'sha256:<64 lowercase hex digits>' "
                        f"(got {ref.digest[:80]!r})")
    if ref.size_bytes < 0:
        raise UserError(f"{what}: field 'size_bytes' must not be negative "
                        f"(got {ref.size_bytes})")


def decode_workflow(data: bytes, what: str) -> ir.Workflow:
    """The IR of an encoded ``couler.v1.Workflow``; UserError naming ``what`` when the
    bytes are not one, or not a valid one."""
    try:
        message = workflow_pb2.Workflow.FromString(data)
    except DecodeError as exc:
        raise UserError(f"{what}: the {len(data)} bytes are not a couler.v1.Workflow "
                        f"message: {exc}") from None
    return workflow_from_message(message, what)


def workflow_from_message(message: workflow_pb2.Workflow, what: str) -> ir.Workflow:
    """The IR of ``message``; any failure to convert it is the caller's (a UserError)."""
    try:
        return codec.workflow_from_proto(message)
    except CoulerError:
        raise
    except (ValueError, TypeError, KeyError, RecursionError, UnicodeError) as exc:
        name = message.name or "(unnamed)"
        raise UserError(f"{what}: workflow {name!r} cannot be read: "
                        f"{type(exc).__name__}: {exc}") from None


class _Headers:
    """The latest records (without steps) of the runs this process changed or read, the
    most recent :data:`_HEADERS_KEPT`: a watcher woken by a change made here reads the
    record from here instead of the store (a poll every :data:`_WATCH_POLL` s reads the
    store, for changes made by other replicas).

    With each record goes ``steps_upto``: no step of the run changed after that revision
    (None when unknown), so that a round whose change is to the run only (its state, say)
    need not ask the store for steps.
    """

    def __init__(self, limit: int = _HEADERS_KEPT) -> None:
        self._limit = limit
        self._runs: dict[str, tuple[Run, int | None]] = {}

    def get(self, run_id: str) -> tuple[Run, int | None] | None:
        return self._runs.get(run_id)

    def changed(self, run: Run, *, steps: bool, new: bool = False) -> None:
        """``run`` is the record a change made here committed (its revision one more than
        the one before, or more for step changes); ``steps``: steps changed in it; ``new``:
        it was just created (it has no steps)."""
        old = self._runs.get(run.run_id)
        if old is not None and old[0].revision >= run.revision:
            return  # an older answer arriving late
        if new:
            upto: int | None = 0
        elif steps:
            upto = run.revision
        elif old is not None and old[0].revision == run.revision - 1:
            upto = old[1]  # nothing happened between the two: what was known still holds
        else:
            upto = None  # another replica may have changed steps in between
        self._put(run, upto)

    def read(self, run: Run) -> int | None:
        """``run`` as read from the store; what is known of its steps' last change."""
        old = self._runs.get(run.run_id)
        if old is not None and old[0].revision >= run.revision:
            return old[1] if old[0].revision == run.revision else None
        self._put(run, None)
        return None

    def _put(self, run: Run, upto: int | None) -> None:
        self._runs.pop(run.run_id, None)  # to the end: the most recent
        self._runs[run.run_id] = (run, upto)
        if len(self._runs) > self._limit:
            del self._runs[next(iter(self._runs))]


class Submitter:
    """The use cases (see the module docstring).

    Args:
        store: The run records.
        events: Where events go (the outbox sender hands every event to it).
        runners: The engines this submitter runs, by name.
        blobs: The artifact store (None: cached results with artifacts are not reused,
            outputs are not uploaded, and workflows cannot be uploaded).
        runs_dir: Where cached artifacts are fetched to (``<runs_dir>/.cache/<run_id>``)
            and uploads are received (``<runs_dir>/.uploads``).
        outbox_interval: Seconds between looks at the outbox when nothing wakes the sender.
        limits: The size limits Submit and RegisterTemplate check.
        cache: The cache service, told to drop an entry whose artifacts are corrupt or
            gone (None: such an entry is only not reused).
        metrics_interval: Seconds between two batches of utilization samples of a run.
    """

    def __init__(self, store: RunStore, events: Events, runners: Mapping[str, Runner], *,
                 blobs: Blobs | None, runs_dir: Path, outbox_interval: float = 5.0,
                 limits: SizeLimits = DEFAULT_LIMITS, cache: CacheEntries | None = None,
                 metrics_interval: float = 5.0, schedule_poll: float = 1.0) -> None:
        self._store = store
        self._quick = store.quick
        self._events = events
        self._runners = dict(runners)
        self._blobs = blobs
        self._runs_dir = runs_dir
        self._outbox_interval = outbox_interval
        self._limits = limits
        self._cache = cache
        self._active: dict[str, _Active] = {}
        # per run: a change wakes only that run's watchers (each re-reads the store)
        self._changed: dict[str, asyncio.Event] = {}
        self._watching: dict[str, int] = {}  # watchers per run
        self._headers = _Headers()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sender: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        # Requests accepted here and not yet published: the sender need not decode them.
        self._requests: dict[str, RunRequest] = {}
        # Events committed here on the loop, in commit order, not yet handed to the sender;
        # while _unread, the outbox table may hold others (written in a thread, left by
        # a previous process or a failed attempt): the sender reads the table then.
        self._fresh: list[OutboxEntry] = []
        self._unread = True
        self._threads_writing = 0
        self._closing = False
        self._refusals: dict[str, int] = {}  # run -> size refusals seen (re-plans asked)
        # Utilization samples from the engines, per run, not queued yet (event loop only).
        self._samples: dict[str, list[UtilizationSample]] = {}
        self._samples_dropped: set[str] = set()  # runs whose buffer overflowed (said once)
        self._metrics_interval = metrics_interval
        self._metrics: asyncio.Task[None] | None = None
        self._scheduler = Scheduler(store, self, poll=schedule_poll)
        self._submissions = meter("couler.submitter").create_counter(
            "couler.submitter.submissions", unit="{run}",
            description="Runs submitted: engine, result=accepted or duplicate (an "
                        "idempotency key already seen)")

    @property
    def limits(self) -> SizeLimits:
        """The size limits checked at Submit and RegisterTemplate."""
        return self._limits

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the outbox sender (it drains what a previous process left), then resume or
        start the runs left with an engine."""
        self._loop = asyncio.get_running_loop()
        queued = await self._call(self._store.requeue_unrequested)
        if queued:
            log.info("outbox: %d accepted run(s) had no requested event queued; queued", queued)
        self._sender = asyncio.create_task(self._send_loop(), name="submitter-outbox")
        self._metrics = asyncio.create_task(self._metrics_loop(), name="submitter-metrics")
        self._scheduler.start()
        for run in await self._call(self._store.runs_in, _ENGINE_SIDE):
            try:
                await self._recover(run)
            except Exception as exc:  # one bad run must not keep the others down
                if self._closing:
                    return
                log.error("run %s: recovery failed: %s", run.run_id, exc, exc_info=True)
                await self._fail(run.run_id, f"could not be resumed after a restart: {exc}",
                                 expect=_ENGINE_SIDE)

    async def close(self) -> None:
        """Stop the runs and the sender; nothing is recorded about the runs (not failed,
        not cancelled): the next start resumes them. Queued events stay queued."""
        self._closing = True
        await self._scheduler.close()
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
        if self._metrics is not None:
            self._metrics.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._metrics
            self._metrics = None
        with contextlib.suppress(Exception):  # best effort: samples are no record
            await self._flush_samples()
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None

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
        handle = await self._call(runner.resume, run.run_id, self._callback(queue),
                                  on_sample=self._sampling(run.run_id, plan.workflow.name))
        if handle is None:
            log.info("run %s: the engine never got it; starting it", run.run_id)
            await self._launch(run, plan, queue=queue)
            return
        log.info("run %s: resumed on %s", run.run_id, run.engine)
        self._track(run.run_id, handle, plan.workflow, run.engine, queue, keys=plan.step_keys)
        # The crash may have come between the engine start and this event: queue it again
        # under the same msg id (JetStream drops it when the first one was stored).
        await self._db(True, self._store.emit, run.run_id, EventKind.SUBMITTED)
        self._wake.set()

    # ------------------------------------------------------------------ the outbox

    async def _send_loop(self) -> None:
        """Publish the outbox in order, forever (see the module docstring)."""
        delay = 0.0
        while not self._closing:
            self._wake.clear()  # a row committed from now on wakes the wait below
            try:
                sent_all = await self._send_pending()
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except Exception as exc:  # the store is away, say: try again later
                log.warning("outbox: %s: %s", type(exc).__name__, exc)
                sent_all = False
            if sent_all:
                delay = 0.0
                self._drained.set()
                if not await _wait(self._wake, self._outbox_interval):
                    self._unread = True  # a look at the table now and then: rows of others
            else:  # NATS (or the store) is away: back off, however many rows arrive
                self._unread = True
                delay = min(max(delay * 2, 0.2), _OUTBOX_MAX_DELAY)
                await asyncio.sleep(delay)

    async def _send_pending(self) -> bool:
        """Publish queued events until none are left (True) or NATS is away (False).

        The events JetStream stored are deleted (and the runs whose requested event went
        out move to PLANNING) in the transaction that reads the next ones. Events committed
        here on the loop are taken as committed (:attr:`_fresh`) instead of read back,
        unless the table may hold others (:attr:`_unread`).
        """
        done: list[int] = []
        requested: list[str] = []
        backlog = False  # the last read was full: read more at once, in a thread
        while True:
            if self._unread or backlog:
                limit = _OUTBOX_BATCH if backlog else _QUICK_ROWS
                inline = not backlog and len(done) <= _QUICK_ROWS and self._quick
                if inline:  # nothing commits during the read: what is committed is read
                    self._fresh.clear()
                    self._unread = self._threads_writing > 0
                moved, rows = await self._db(inline, self._store.next_events, limit,
                                             published=done, requested=requested)
                backlog = len(rows) >= limit
            else:
                moved = (await self._db(len(done) <= _QUICK_ROWS, self._store.published, done,
                                        requested=requested) if done else [])
                rows, self._fresh = self._fresh, []
            for run in moved:
                self._changed_here(run)
            if not rows:
                return True
            done, requested, sent_all = await self._send_rows(rows)
            if not sent_all:
                if done:
                    for run in await self._db(len(done) <= _QUICK_ROWS, self._store.published,
                                              done, requested=requested):
                        self._changed_here(run)
                return False

    async def _send_rows(self, rows: Sequence[OutboxEntry]
                         ) -> tuple[list[int], list[str], bool]:
        """Publish ``rows`` in order, a window at a time: ``(ids JetStream stored, runs
        whose requested event it stored, whether NATS took them all)``."""
        stored: list[int] = []
        requested: list[str] = []
        i = 0
        while i < len(rows):
            # An event whose body may go by reference (stored first, in a thread) could be
            # overtaken by events started after it: it goes alone.
            if _alone(rows[i]):
                window = rows[i:i + 1]
            else:
                j = i
                while j < len(rows) and j - i < _OUTBOX_WINDOW and not _alone(rows[j]):
                    j += 1
                window = rows[i:j]
            # Tasks start in order and each reaches the connection's buffer before it first
            # waits, so JetStream receives (and stores) the window in order. (Only a
            # connection lost in the middle of a window, with a later event acknowledged and
            # an earlier one not, could store that earlier one later, when it is retried.)
            results = await asyncio.gather(*(self._send_one(r) for r in window),
                                           return_exceptions=True)
            done: list[int] = []
            away = False
            for row, result in zip(window, results, strict=True):
                if result is None:
                    done.append(row.id)
                elif isinstance(result, RetryableError):
                    away = True
                elif isinstance(result, BaseException):
                    if isinstance(result, asyncio.CancelledError):
                        raise result
                    await self._unpublishable(row, result)
            stored += done
            done_ids = set(done)
            for row in window:
                if row.kind == EventKind.REQUESTED.value and row.id in done_ids:
                    requested.append(row.run_id)
                    self._requests.pop(row.run_id, None)
            if away:
                first = next(r for r, x in zip(window, results, strict=True)
                             if isinstance(x, RetryableError))
                log.warning("outbox: NATS unavailable (%s); %s event(s) of run %s and "
                            "later wait", results[window.index(first)], first.kind,
                            first.run_id)
                return stored, requested, False
            i += len(window)
        return stored, requested, True

    async def _send_one(self, row: OutboxEntry) -> None:
        """Hand one queued event to the publisher, in the trace of the change it reports."""
        token = otel_context.attach(telemetry.extract(row.trace)) if row.trace else None
        try:
            await self._publish_entry(row)
        finally:
            if token is not None:
                otel_context.detach(token)

    async def _publish_entry(self, row: OutboxEntry) -> None:
        header = Run(run_id=row.run_id, state=RunState.RUNNING, workflow=row.workflow,
                     engine=row.engine, retries=row.retries)
        kind = row.kind
        try:
            if kind == EventKind.STEP.value:
                rec = step_record_from_proto(common_pb2.StepRecord.FromString(row.payload))
                await self._events.step(header, rec)
            elif kind == EventKind.UTILIZATION_BATCH.value:
                batch = events_pb2.UtilizationBatch.FromString(row.payload)
                await self._events.utilization_batch(header, utilization_batch_from_proto(batch))
            elif kind == EventKind.UTILIZATION.value:
                sample = utilization_sample_from_proto(
                    common_pb2.UtilizationSample.FromString(row.payload))
                await self._events.utilization(sample)
            elif kind == EventKind.SUBMITTED.value:
                await self._events.submitted(run_from_proto(common_pb2.Run.FromString(row.payload)))
            elif kind == EventKind.FINISHED.value:
                await self._events.finished(run_from_proto(common_pb2.Run.FromString(row.payload)))
            elif kind == EventKind.REFUSED.value:
                refusal = events_pb2.DocumentRefused.FromString(row.payload)
                again = await self._call(self._store.header, row.run_id)
                request = None
                if again.state is RunState.PLANNING and refusal.attempt <= MAX_SIZE_REPLANS:
                    request = self._requests.get(row.run_id)
                    if request is None:
                        request = await self._call(self._store.request, row.run_id)
                    if request.workflow is None and request.encoded is None:
                        request = None  # generated from a text: not planned again
                await self._events.refused(header, refusal, request)
                if again.state is RunState.PLANNING and request is None:
                    await self._fail(row.run_id, f"engine {row.engine!r} refused the run's "
                                     f"{refusal.size_bytes}-byte document as too large "
                                     f"({refusal.reason})", expect=(RunState.PLANNING,))
            elif kind == EventKind.REQUESTED.value:
                request = self._requests.get(row.run_id)
                if request is None:
                    request = await self._call(self._store.request, row.run_id)
                await self._events.requested(dataclasses.replace(
                    header, state=RunState.ACCEPTED), request)
            else:
                raise UserError(f"unknown event kind {kind!r}")
        except DecodeError as exc:
            raise UserError(f"the queued {kind} event does not decode: {exc}") from None

    async def _unpublishable(self, row: OutboxEntry, exc: BaseException) -> None:
        """A row failed for a reason other than NATS being away: set it aside when it can
        never be published (a UserError, or after a few attempts)."""
        reason = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, NotFoundError) and row.kind == EventKind.REQUESTED.value:
            self._requests.pop(row.run_id, None)
        attempts = _OUTBOX_MAX_ATTEMPTS
        if not isinstance(exc, UserError):
            attempts = await self._db(False, self._store.failed_attempt, row.id, reason)
            log.warning("outbox: %s event %d of run %s failed (attempt %d): %s", row.kind,
                        row.id, row.run_id, attempts, reason, exc_info=exc)
        if attempts >= _OUTBOX_MAX_ATTEMPTS:
            await self._db(False, self._store.move_aside, row.id, reason)
            log.error("outbox: %s event %d of run %s can never be published, set aside: %s",
                      row.kind, row.id, row.run_id, reason)

    async def drained(self, timeout: float) -> bool:
        """Wait until the outbox was found empty once after this call (tests, tools)."""
        self._drained.clear()
        self._wake.set()
        return await _wait(self._drained, timeout)

    # ------------------------------------------------------------------ submit

    async def upload_workflow(self, chunks: AsyncIterator[tuple[bytes, int, str]]) -> BlobRef:
        """Store an encoded workflow sent in ``(data, size, digest)`` chunks (size and digest
        announced by the first, optional) in the blob store; its reference.

        Raises:
            UserError: Over the workflow size limit, a chunk over 4 MiB, bytes that do not
                match the announced size or digest, or not a ``couler.v1.Workflow``.
        """
        if self._blobs is None:
            raise UserError("upload: no blob store is configured (COULER_ARTIFACTS)")
        limit = self._limits.max_workflow_bytes
        upload_dir = self._runs_dir / ".uploads"
        upload_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=upload_dir, suffix=".workflow")
        path = Path(name)
        try:
            h = hashlib.sha256()
            size = 0
            want_size, want_digest = -1, ""
            first = True
            with os.fdopen(fd, "wb") as out:
                async for data, announced_size, announced_digest in chunks:
                    if first:
                        first = False
                        want_size = announced_size or -1
                        want_digest = announced_digest
                        if want_digest and not _DIGEST.fullmatch(want_digest):
                            raise UserError("upload: field 'digest' must be 'sha256:<64 "
                                            f"lowercase hex digits>' (got {want_digest[:80]!r})")
                        if want_size > limit:
                            raise UserError(f"upload: the workflow is {want_size} bytes, over "
                                            f"the limit of {limit} bytes per workflow")
                    if len(data) > MAX_UPLOAD_CHUNK:
                        raise UserError(f"upload: field 'data': a chunk of {len(data)} bytes "
                                        f"is over the limit of {MAX_UPLOAD_CHUNK} bytes")
                    size += len(data)
                    if size > limit:
                        raise UserError(f"upload: the workflow is over the limit of {limit} "
                                        "bytes per workflow")
                    h.update(data)
                    await asyncio.to_thread(out.write, data)
            digest = "sha256:" + h.hexdigest()
            if want_size >= 0 and want_size != size:
                raise UserError(f"upload: field 'size_bytes': announced {want_size} bytes, "
                                f"received {size}")
            if want_digest and want_digest != digest:
                raise UserError(f"upload: field 'digest': announced {want_digest}, the bytes "
                                f"received hash to {digest}")
            if size == 0:
                raise UserError("upload: no bytes received (an empty workflow)")
            data = await asyncio.to_thread(path.read_bytes)
            try:
                workflow_pb2.Workflow.FromString(data)
            except DecodeError as exc:
                raise UserError(f"upload: the {size} bytes are not a couler.v1.Workflow "
                                f"message: {exc}") from None
            del data
            stored = await self._call(self._blobs.put_file, path)
            if stored != digest:  # the file changed under us: never hand out a wrong ref
                raise RetryableError(f"upload: stored {stored}, expected {digest}; try again")
            log.info("upload: workflow %s (%d bytes) stored", digest, size)
            return BlobRef(digest, size)
        finally:
            path.unlink(missing_ok=True)

    async def read_blob(self, ref: BlobRef, what: str = "blob") -> bytes:
        """The bytes of ``ref`` from the blob store, checked against its digest and size.

        Raises:
            UserError: A malformed reference, or bytes of another size.
            NotFoundError: Nothing stored under it.
        """
        _check_ref(ref, what)
        if self._blobs is None:
            raise UserError(f"{what}: no blob store is configured (COULER_ARTIFACTS)")
        if ref.size_bytes > self._limits.max_workflow_bytes:
            raise UserError(f"{what}: {ref.size_bytes} bytes is over the limit of "
                            f"{self._limits.max_workflow_bytes} bytes per workflow")
        await self._check_size(ref, what)  # before reading a byte of it
        with self._scratch() as tmp:
            dest = tmp / "blob"
            await self._call(self._blobs.get_file, ref.digest, dest)
            return await asyncio.to_thread(dest.read_bytes)

    async def _check_size(self, ref: BlobRef, what: str) -> None:
        assert self._blobs is not None  # the callers checked
        size = await self._call(self._blobs.size, ref.digest)
        if size != ref.size_bytes:
            raise UserError(f"{what}: field 'size_bytes': blob {ref.digest} is {size} "
                            f"bytes, not {ref.size_bytes}")

    async def blob_chunks(self, ref: BlobRef) -> AsyncIterator[bytes]:
        """The bytes of ``ref`` in chunks of at most :data:`BLOB_CHUNK`, checked first."""
        _check_ref(ref, "download")
        if self._blobs is None:
            raise UserError("download: no blob store is configured (COULER_ARTIFACTS)")
        await self._check_size(ref, "download")
        with self._scratch() as tmp:
            dest = tmp / "blob"
            await self._call(self._blobs.get_file, ref.digest, dest)  # checked on the way
            with dest.open("rb") as f:
                while chunk := await asyncio.to_thread(f.read, BLOB_CHUNK):
                    yield chunk

    async def store_blob(self, data: bytes) -> BlobRef:
        """Put ``data`` in the blob store (for an answer too large to send inline)."""
        if self._blobs is None:
            raise UserError("no blob store is configured (COULER_ARTIFACTS)")
        with self._scratch() as tmp:
            path = tmp / "blob"
            await asyncio.to_thread(path.write_bytes, data)
            digest = await self._call(self._blobs.put_file, path)
        return BlobRef(digest, len(data))

    @contextlib.contextmanager
    def _scratch(self) -> Iterator[Path]:
        base = self._runs_dir / ".uploads"
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=base))
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def check_workflow(self, wf: ir.Workflow, parameters: Mapping[str, str] | None = None, *,
                       encoded_bytes: int | None = None) -> None:
        """Refuse ``wf`` over a size limit, then when invalid (ValidationError)."""
        check_sizes(wf, self._limits, parameters=parameters, encoded_bytes=encoded_bytes)
        ir.validate(wf)

    async def submit(self, *, workflow: ir.Workflow | None = None, text: str | None = None,
                     template: str = "", options: RunOptions, idempotency_key: str = "",
                     workflow_ref: BlobRef | None = None,
                     encoded: bytes | None = None) -> tuple[str, bool]:
        """Record a run (ACCEPTED) with its ``requested`` event; ``(run_id, created)``.

        A workflow with a cron schedule starts no run: it is registered as a schedule
        (``run_id`` is ""; :meth:`submit_request` also says its name).
        """
        run_id, created, _ = await self.submit_request(
            workflow=workflow, text=text, template=template, options=options,
            idempotency_key=idempotency_key, workflow_ref=workflow_ref, encoded=encoded)
        return run_id, created

    async def submit_request(self, *, workflow: ir.Workflow | None = None,
                             text: str | None = None, template: str = "",
                             options: RunOptions, idempotency_key: str = "",
                             workflow_ref: BlobRef | None = None, encoded: bytes | None = None,
                             tick: tuple[str, float] | None = None) -> tuple[str, bool, str]:
        """Record a run (ACCEPTED) with its ``requested`` event; ``(run_id, created, "")``.

        ``workflow_ref`` names an uploaded workflow instead of ``workflow``; ``encoded`` is
        ``workflow``'s protobuf encoding when the caller has it (stored as it is). A
        workflow with a cron schedule is registered as the template and schedule of its
        name instead (:mod:`couler_submitter.schedules`): ``("", True, name)``. A
        template's run is one run: its workflow without its schedule and triggers.
        ``tick``: the run is that schedule's run of that tick (the tick's claim).

        Raises:
            UserError: No or several sources, an empty text, an unknown engine.
            ValidationError: The workflow is invalid or over a size limit.
            NotFoundError: No template of that name, nothing uploaded under the reference.
        """
        given = (workflow is not None, text is not None and text != "", bool(template),
                 workflow_ref is not None)
        if sum(given) != 1:
            raise UserError("submit: give exactly one of a workflow, a workflow reference, "
                            "a text or a template")
        if len(idempotency_key) > _MAX_KEY:
            raise UserError(f"submit: field 'idempotency_key' is {len(idempotency_key)} "
                            f"characters, over the limit of {_MAX_KEY}")
        if workflow_ref is not None:
            encoded = await self.read_blob(workflow_ref, "submit: field 'workflow_ref'")
            workflow = await asyncio.to_thread(decode_workflow, encoded,
                                               "submit: field 'workflow_ref'")
        engine = options.engine
        if workflow is not None and not template and (workflow.schedule is not None
                                                      or workflow.triggers):
            name = await self._schedule_submitted(workflow, engine, encoded)
            return "", True, name
        if template:
            tpl = await self._call(self._store.get_template, template)
            workflow = _one_run(tpl.workflow)
            engine = engine or tpl.engine
            encoded = None
        engine = (engine or DEFAULT_ENGINE).strip().lower()
        if engine not in KNOWN_ENGINES:
            raise UserError(f"submit: field 'engine': engine {engine[:80]!r} is unknown "
                            f"(known: {', '.join(KNOWN_ENGINES)})")
        if workflow is not None:
            # a small workflow is checked on the loop (a thread hop costs more)
            size = len(encoded) if encoded is not None else None
            await offload.run(size if size is not None else offload.LARGE_BYTES + 1,
                              self._check_submitted, workflow, options.parameters, size,
                              bool(template))
        elif text is not None and not text.strip():
            raise UserError("submit: field 'text': the request is empty")
        elif text is not None and len(text.encode("utf-8", "surrogatepass")) > \
                self._limits.max_value_bytes:
            raise UserError(f"submit: field 'text': the request is over the limit of "
                            f"{self._limits.max_value_bytes} bytes")
        options = RunOptions(engine=engine, parameters=dict(options.parameters),
                             dry_run=options.dry_run, no_cache=options.no_cache,
                             constraints=options.constraints, objectives=options.objectives,
                             tenant=options.tenant)
        request = RunRequest(workflow, text if workflow is None else None, options, template,
                             encoded=encoded if workflow is not None else None)
        run_id = f"run-{uuid.uuid4().hex[:20]}"
        self._requests[run_id] = request
        try:
            small = workflow is None or (encoded is not None and len(encoded) <= _QUICK_BYTES)
            run, created = await self._db(small, self._store.create_run, run_id, request,
                                          idempotency_key=idempotency_key, encoded=encoded,
                                          tick=tick)
        except BaseException:
            self._requests.pop(run_id, None)
            raise
        if not created:
            self._requests.pop(run_id, None)
            log.info("submit: idempotency key %r is run %s; nothing started",
                     idempotency_key, run.run_id)
            self._submissions.add(1, {"engine": engine, "result": "duplicate"})
            return run.run_id, False, ""
        self._changed_here(run, new=True)
        self._wake.set()
        self._submissions.add(1, {"engine": engine, "result": "accepted"})
        log.info("run %s: accepted (%s, engine %s)", run_id,
                 f"workflow {workflow.name!r}" if workflow is not None else "text", engine)
        return run_id, True, ""

    async def _schedule_submitted(self, wf: ir.Workflow, engine: str,
                                  encoded: bytes | None) -> str:
        """Register a submitted workflow with a cron schedule or event triggers as the
        template (and schedule, and subscriptions) of its name; the name."""
        what = "a cron schedule" if wf.schedule is not None else "event triggers"
        if not _LABEL.fullmatch(wf.name):
            raise UserError(f"submit: workflow {wf.name[:80]!r} has {what}, so it is "
                            "registered under its name, which must be a DNS-1123 label "
                            "(lowercase letters, digits, '-', at most 63)")
        await self.register_template(wf.name, wf, engine, encoded=encoded)
        log.info("submit: workflow %r has %s: registered as template %r", wf.name, what,
                 wf.name)
        return wf.name

    def _check_submitted(self, wf: ir.Workflow, parameters: Mapping[str, str],
                         encoded_bytes: int | None, from_template: bool) -> None:
        for name, value in parameters.items():
            if len(name) > 253 or "\x00" in name:
                raise UserError(f"submit: field 'parameters': the name {name[:80]!r} is not a "
                                "parameter name")
            del value
        if from_template:  # its values were checked at registration; the parameters now
            check_sizes(dataclasses.replace(wf, steps=(), exit_hooks=()), self._limits,
                        parameters=parameters)
        else:
            check_sizes(wf, self._limits, parameters=parameters, encoded_bytes=encoded_bytes)
        ir.validate(wf)
        ir.check_parameters(wf, parameters)

    # ------------------------------------------------------------------ read

    async def header(self, run_id: str) -> Run:
        """The run's record without its steps; NotFoundError for an unknown run."""
        run = await self._db(True, self._store.header, run_id)
        self._headers.read(run)
        return run

    async def get(self, run_id: str, *, page_size: int = 0, page_token: str = "") -> Run:
        """The run's record with one page of its steps (``next_step_page_token`` names the
        next); NotFoundError for an unknown run."""
        limit = _step_page(page_size)
        after = parse_page_token(page_token)
        return await self._call(self._store.run_page, run_id, limit=limit, after=after)

    async def watch(self, run_id: str, *, page_size: int = 0
                    ) -> AsyncIterator[tuple[Run, bool]]:
        """The record now with all its steps, then on every change with the steps that
        changed, until it is terminal: ``(record, more)``, ``more`` when the next item
        carries more steps of the same revision (one page of steps per item).

        A round woken by a change made in this process takes the record it committed; one
        woken by the poll (every :data:`_WATCH_POLL` s: changes made by other replicas)
        reads the store. Rounds are spaced by :data:`_WATCH_SPACING` times the CPU time the
        previous one spent reading the store (at most :data:`_WATCH_MAX_PAUSE`): changes
        meanwhile coalesce.
        """
        limit = _step_page(page_size)
        self._watching[run_id] = self._watching.get(run_id, 0) + 1
        try:
            async with contextlib.aclosing(self._rounds(run_id, limit)) as rounds:
                async for item in rounds:
                    yield item
        finally:  # ended, or the client went away
            left = self._watching.pop(run_id) - 1
            if left:
                self._watching[run_id] = left
            else:
                self._changed.pop(run_id, None)  # nothing waits for its changes

    async def _rounds(self, run_id: str, limit: int) -> AsyncGenerator[tuple[Run, bool], None]:
        """:meth:`watch`'s rounds."""
        since = 0
        sent = False
        local = False  # woken by a change made here
        while True:
            changed = self._changed.setdefault(run_id, asyncio.Event())
            reading = 0.0  # CPU seconds this round spends reading the store
            # woken by a change made here: the record it committed; the first round and a
            # poll read the store (other replicas write too)
            known = self._headers.get(run_id) if local else None
            if known is not None:
                header, steps_upto = known
            else:
                header, cost = await self._db(True, _cpu_timed(self._store.header), run_id)
                reading += cost
                steps_upto = self._headers.read(header)
            if not sent or header.revision > since:
                upto = header.revision
                if steps_upto is not None and steps_upto <= since:
                    yield header, False  # the run changed, none of its steps
                else:
                    after = 0
                    # every change takes a revision: at most this many steps to read
                    small = min(upto - since, header.step_count) <= _QUICK_ROWS
                    while True:
                        (steps, after, more), cost = await self._db(
                            small, _cpu_timed(self._store.changed_steps), run_id, since=since,
                            upto=upto, after=after, limit=limit)
                        reading += cost
                        yield dataclasses.replace(header, steps=steps), more
                        if not more:
                            break
                since, sent = upto, True
            if header.state.terminal:
                return
            ended = time.monotonic()
            local = await _wait(changed, _WATCH_POLL)
            # Changes arriving sooner than this are sent together.
            pause = min(_WATCH_MAX_PAUSE, _WATCH_SPACING * reading) - \
                (time.monotonic() - ended)
            if pause > 0:
                await asyncio.sleep(pause)

    async def list(self, *, workflow: str = "", states: Sequence[RunState] = (),
                   page_size: int = 0, page_token: str = "") -> RunPage:
        """Runs newest first, without their steps; the token is an opaque position."""
        if page_size < 0:
            raise UserError(f"list: field 'page_size' must not be negative (got {page_size})")
        limit = min(page_size or DEFAULT_PAGE, MAX_PAGE)
        try:
            offset = int(page_token) if page_token and len(page_token) <= 20 else 0
            if page_token and len(page_token) > 20:
                raise ValueError(page_token)
        except ValueError:
            raise UserError(f"list: field 'page_token': {page_token[:40]!r} is not a token "
                            "this server gave") from None
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
        run = await self.header(run_id)
        plan = await self._call(self._store.plan, run_id)
        if plan is None or run.state in _NOT_STARTED:
            raise NotFoundError(f"run {run_id!r} is {run.state.value}: it has not reached its "
                                "engine, no step has logs yet")
        top = step.split("/", 1)[0]
        if plan.workflow.step(top) is None:
            names = [s.name for s in plan.workflow.steps]
            shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)"
                                             if len(names) > 20 else "")
            raise NotFoundError(f"run {run_id!r}: workflow {plan.workflow.name!r} has no step "
                                f"{top[:100]!r} (its steps: {shown})")
        spec = plan.workflow.step(top)
        if not key and "/" not in step and spec is not None and (
                spec.foreach is not None or spec.loop is not None):
            # each item (iteration) ran on its own and has logs of its own
            keys = await self._call(self._keys_of, run_id, top)
            what = "a map step" if spec.foreach is not None else "a loop step"
            listed = ", ".join(keys[:20]) + (f", ... ({len(keys)} in all)"
                                             if len(keys) > 20 else "")
            raise UserError(f"run {run_id!r}: step {top!r} is {what}: each "
                            f"{'item' if spec.foreach is not None else 'iteration'} has logs "
                            f"of its own; name one with its key (couler logs {run_id} {top} "
                            f"--key KEY; keys: {listed or 'none yet'})")
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

    def _keys_of(self, run_id: str, step: str) -> tuple[str, ...]:
        """The keys of ``step``'s recorded items (iterations), in order."""
        keys: tuple[str, ...] = ()
        after = 0
        while True:
            page = self._store.run_page(run_id, limit=MAX_STEP_PAGE, after=after)
            keys += tuple(s.key for s in page.steps if s.name == step and s.key)
            if not page.next_step_page_token:
                return keys
            after = parse_page_token(page.next_step_page_token)

    # ------------------------------------------------------------------ templates

    async def register_template(self, name: str, wf: ir.Workflow | None, engine: str, *,
                                workflow_ref: BlobRef | None = None,
                                encoded: bytes | None = None) -> Template:
        """Register (or replace) a template launched as ``couler.launch.<name>``.

        ``workflow_ref`` names an uploaded workflow instead of ``wf``.
        """
        if not _LABEL.fullmatch(name):
            raise UserError(f"template {name[:80]!r}: field 'name' must be a DNS-1123 label "
                            "(lowercase letters, digits, '-', at most 63)")
        engine = engine.strip().lower()
        if engine and engine not in KNOWN_ENGINES:
            raise UserError(f"template {name!r}: field 'engine': {engine[:80]!r} is unknown")
        if (wf is None) == (workflow_ref is None):
            raise UserError(f"template {name!r}: give exactly one of a workflow and a "
                            "workflow reference")
        if workflow_ref is not None:
            what = f"template {name!r}: field 'workflow_ref'"
            encoded = await self.read_blob(workflow_ref, what)
            wf = await asyncio.to_thread(decode_workflow, encoded, what)
        assert wf is not None  # one of the two was given (checked above)
        await asyncio.to_thread(self.check_workflow, wf,
                                encoded_bytes=len(encoded) if encoded is not None else None)
        check_schedule(wf)
        check_triggers(wf)
        template = await self._call(self._store.put_template, name, wf, engine,
                                    encoded=encoded)
        if wf.schedule is not None:
            await self._call(self._store.put_schedule, name)
        else:
            await self._call(self._store.drop_schedule, name)
        self._scheduler.changed()
        return template

    async def templates(self) -> Sequence[Template]:
        """The registered templates, by name."""
        return await self._call(self._store.templates)

    async def template(self, name: str) -> Template:
        """A registered template; NotFoundError when there is none."""
        return await self._call(self._store.get_template, name)

    # ------------------------------------------------------------------ schedules

    async def launch_tick(self, name: str, tick: float, options: RunOptions
                          ) -> tuple[str, bool]:
        """Start schedule ``name``'s run of ``tick`` (its template, one run per tick: the
        tick's row is the claim; ConflictError when the tick was skipped elsewhere)."""
        run_id, created, _ = await self.submit_request(
            template=name, options=options, idempotency_key=tick_key(name, tick),
            tick=(name, tick))
        return run_id, created

    async def event(self, launcher: str, subject: str, fields: Mapping[str, str], key: str,
                    tenant: str = "") -> tuple[str, ...]:
        """An event from ``launcher`` on ``subject``: launch every template one of whose
        triggers matches (subject and filter) and that ``launcher`` may launch
        (:mod:`couler_submitter.triggers`); the runs started (one per event and template)."""
        started: Sequence[str] = []
        for tpl in await self.templates():
            wf = tpl.workflow
            hits = [t for t in wf.triggers if subject_matches(t.subject, subject)]
            if not hits:
                continue
            allowed = allowed_launchers(wf)
            if allowed is not None and launcher not in allowed:
                log.warning("event on %r from launcher %r: not allowed to launch workflow %r "
                            "(its %s: %s); nothing launched", subject, launcher, tpl.name,
                            "couler.io/launchers", ", ".join(sorted(allowed)) or "none")
                continue
            if not any(filter_matches(t.filter, fields) for t in hits):
                log.info("event on %r from launcher %r: no filter of workflow %r matches; "
                         "nothing launched", subject, launcher, tpl.name)
                continue
            declared = {p.name for p in wf.parameters}
            options = RunOptions(engine=tpl.engine, tenant=tenant or wf.tenant,
                                 parameters={k: v for k, v in fields.items() if k in declared})
            run_id, created, _ = await self.submit_request(
                template=tpl.name, options=options,
                idempotency_key=f"event.{tpl.name}.{launcher}.{key}"[:_MAX_KEY])
            log.info("event on %r from launcher %r: workflow %r run %s%s", subject, launcher,
                     tpl.name, run_id, "" if created else " (launched already)")
            started = [*started, run_id]
        return tuple(started)

    async def schedules(self) -> Sequence[ScheduleView]:
        """The schedules, by name (one whose template has no schedule any more is left
        out)."""
        views: Sequence[ScheduleView | None] = []
        for state in await self._call(self._store.schedules):
            with contextlib.suppress(NotFoundError):
                views = [*views, await self._view(state)]
        return tuple(v for v in views if v is not None)

    async def _view(self, state: ScheduleState) -> ScheduleView | None:
        tpl = await self.template(state.name)
        sched = tpl.workflow.schedule
        if sched is None:
            return None
        upcoming = None if state.paused or sched.suspend else \
            next_tick(sched, max(state.last_tick, time.time()))
        return ScheduleView(state, sched, tpl.engine or DEFAULT_ENGINE, upcoming)

    async def pause_schedule(self, name: str, paused: bool = True) -> ScheduleView:
        """Pause (or resume) schedule ``name``; NotFoundError for an unknown one."""
        state = await self._call(self._store.set_paused, name, paused)
        self._scheduler.changed()
        view = await self._view(state)
        if view is None:
            raise NotFoundError(f"schedule {name!r} does not exist")
        log.info("schedule %r: %s", name, "paused" if paused else "resumed")
        return view

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

    async def optimized(self, run_id: str, plan: Plan, *, encoded: bytes | None = None
                        ) -> None:
        """Start the planned run on its engine; a plan for a started run is ignored.

        Returns once the run row records the start (PENDING, engine run id) and the engine
        has the run: the consumer acks then. ``encoded``: the plan's protobuf encoding, when
        at hand (stored as it is).

        Raises:
            RetryableError: The submitter is stopping (the plan is redelivered later).
            NotFoundError: No such run.
            UserError: A plan for another engine than the run asked for.
        """
        if self._closing:
            raise RetryableError(f"run {run_id}: the submitter is stopping; plan it later")
        run, options = await self._db(True, self._store.header_options, run_id)
        self._headers.read(run)
        if plan.engine and run.engine and plan.engine != run.engine:
            raise UserError(f"run {run_id!r}: a plan for engine {plan.engine!r}, the run "
                            f"asked for {run.engine!r}; refused")
        if run_id in self._active or run.state not in _NOT_STARTED:
            log.info("run %s: plan ignored (the run is %s)", run_id, run.state.value)
            return
        digest = plan.workflow_digest or await asyncio.to_thread(ir.digest, plan.workflow)
        if options.dry_run:
            await self._update(
                run_id, expect=_NOT_STARTED, state=RunState.SUCCEEDED, plan=plan,
                passes=plan.passes, workflow=plan.workflow.name, workflow_digest=digest,
                message="dry run: planned and compiled, not run", finished_at=time.time(),
                emit=(EventKind.FINISHED,), encoded_plan=encoded)
            return
        runner = self._runners.get(run.engine)
        if runner is None:
            problem = str(not_configured(run.engine, tuple(self._runners)))
            await self._update(run_id, expect=_NOT_STARTED, plan=plan, passes=plan.passes,
                               workflow=plan.workflow.name, workflow_digest=digest,
                               encoded_plan=encoded)
            await self._fail(run_id, problem, expect=_NOT_STARTED)
            return
        started = await self._update(
            run_id, expect=_NOT_STARTED, state=RunState.PENDING, plan=plan, passes=plan.passes,
            workflow=plan.workflow.name, workflow_digest=digest, engine_run_id=run_id,
            encoded_plan=encoded)
        if started is None:
            log.info("run %s: cancelled or failed while planning; not started", run_id)
            return
        await self._launch(started, plan, options=options)

    # ------------------------------------------------------------------ cancel / retry

    async def cancel(self, run_id: str, reason: str = "") -> Run:
        """Stop the run; a no-op on a finished one. Returns the record (without steps)."""
        run = await self.header(run_id)
        if run.state.terminal:
            return run
        message = f"cancelled: {reason}" if reason else "cancelled"
        active = self._active.get(run_id)
        if active is not None:
            active.cancel_reason = message
            await self._call(active.handle.cancel)
            # The engine stops its steps and reports; a bound on waiting, not a guarantee.
            await _wait(active.done, 30.0)
            return await self.header(run_id)
        cancelled = await self._update(run_id, expect=(*_NOT_STARTED, *_ENGINE_SIDE),
                                       state=RunState.CANCELLED, message=message,
                                       finished_at=time.time(), emit=(EventKind.FINISHED,))
        if cancelled is None:
            return await self.header(run_id)
        return cancelled

    async def retry(self, run_id: str) -> Run:
        """Re-run a FAILED or CANCELLED run from its failure point under the same id."""
        run = await self.header(run_id)
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
            return await self.header(run_id)
        try:
            handle = await self._call(runner.retry, run_id, self._callback(queue),
                                      on_sample=self._sampling(run_id, plan.workflow.name))
        except Exception as exc:
            await self._fail(run_id, f"retry failed to start: {exc}", expect=_ENGINE_SIDE)
            raise
        if handle is None:
            await self._launch(updated, plan, queue=queue)
        else:
            self._track(run_id, handle, plan.workflow, run.engine, queue, keys=plan.step_keys)
            await self._db(True, self._store.emit, run_id, EventKind.SUBMITTED)
            self._wake.set()
        log.info("run %s: retry %d started", run_id, updated.retries)
        return await self.header(run_id)

    # ------------------------------------------------------------------ engine side

    async def _launch(self, run: Run, plan: Plan,
                      queue: asyncio.Queue[StepStatus | None] | None = None, *,
                      resuming: bool = False, retry: bool = False,
                      options: RunOptions | None = None) -> None:
        """Hand the stored plan to the engine (the row says PENDING already).

        A split plan runs as a :class:`ChunkedRun` (``resuming``: after a restart, its
        chunks the engine has are picked up; ``retry``: those that did not succeed retry).
        ``options``: the run's, when the caller read them.
        """
        runner = self._runners[run.engine]
        if options is None:
            options = await self._db(True, self._store.options, run.run_id)
        cached: Mapping[str, Reuse] = {}
        if plan.cached and not options.no_cache:
            cached = await self._call(self._fetch_cached, run.run_id, plan)
        queue = queue if queue is not None else asyncio.Queue()
        parameters = {**options.parameters}
        try:
            handle: RunHandle
            if _split(plan):
                chunked = ChunkedRun(runner, run.run_id, workflow=plan.workflow,
                                     chunks=plan.chunks, parameters=parameters, cached=cached,
                                     on_event=self._callback(queue), retry=retry,
                                     on_sample=self._sampling(run.run_id, plan.workflow.name))
                await self._call(chunked.launched.wait)
                if chunked.refused is not None:  # before any chunk ran: plan it again
                    raise chunked.refused
                handle = chunked
            elif plan.nothing_to_run:  # every step reused: the engine is not asked
                handle = AllReused(run.run_id, plan.workflow.name, taken_out(plan))
            else:
                handle = await self._call(runner.start, run.run_id, plan.workflow, parameters,
                                          cached, self._callback(queue),
                                          on_sample=self._sampling(run.run_id,
                                                                   plan.workflow.name))
        except Exception as exc:  # the engine has not got the run: record why, never hang
            if self._closing:  # not the engine's doing: the next start starts it
                log.info("run %s: not started (stopping): %s", run.run_id, exc)
                return
            log.warning("run %s: engine %r did not start it: %s", run.run_id, run.engine, exc,
                        exc_info=not isinstance(exc, UserError))
            if isinstance(exc, DocumentTooLargeError):
                await self._refused(run, plan, exc)
                return
            await self._fail(run.run_id, f"engine {run.engine!r} refused the run: {exc}",
                             expect=_ENGINE_SIDE)
            return
        self._track(run.run_id, handle, plan.workflow, run.engine, queue, keys=plan.step_keys)
        self._refusals.pop(run.run_id, None)  # the engine took this plan
        for status in taken_out(plan):  # reported here: the engine never sees them
            queue.put_nowait(status)
        engine_run_id = getattr(handle, "engine_run_id", run.run_id)  # remote engines' own
        emit = (EventKind.SUBMITTED,)
        if engine_run_id != run.engine_run_id:
            updated = await self._update(run.run_id, engine_run_id=engine_run_id, emit=emit)
            now = updated or await self.header(run.run_id)
        else:  # the record as the event's transaction read it, after the engine started
            now = await self._db(True, self._store.emit, run.run_id, EventKind.SUBMITTED)
            self._wake.set()
        if now.state.terminal:  # cancelled while starting
            await self._call(handle.cancel)
        if resuming and isinstance(handle, ChunkedRun) and handle.picked_up:
            log.info("run %s: resumed on %s (split plan, %d chunks)", run.run_id, run.engine,
                     len(plan.chunks))
        else:
            log.info("run %s: started on %s (%d cached step(s)%s)", run.run_id, run.engine,
                     len(cached), f", {len(plan.chunks)} chunks" if _split(plan) else "")

    async def _refused(self, run: Run, plan: Plan, exc: DocumentTooLargeError) -> None:
        """The engine refused the run's document for its size: publish that (the optimizer
        learns the engine's budget from it) and put the run back to PLANNING for a plan
        within the smaller budget -- at most :data:`MAX_SIZE_REPLANS` times, then it
        fails (and the refusal is still published, for the next runs)."""
        attempt = self._refusals.get(run.run_id, 0) + 1
        self._refusals[run.run_id] = attempt
        at = Timestamp()
        at.FromNanoseconds(time.time_ns())
        refusal = events_pb2.DocumentRefused(
            run_id=run.run_id, workflow=exc.workflow or plan.workflow.name, engine=run.engine,
            size_bytes=exc.size_bytes, sent_bytes=exc.sent_bytes or 0, reason=exc.detail,
            at=at, attempt=attempt, revision=run.revision)
        payload = refusal.SerializeToString()
        what = f"engine {run.engine!r} refused the run's {exc.size_bytes}-byte document as too " \
               f"large ({exc.detail})"
        if attempt <= MAX_SIZE_REPLANS:
            again = await self._update(
                run.run_id, expect=_ENGINE_SIDE, state=RunState.PLANNING,
                message=f"{what}; planning it again within a smaller budget "
                        f"(attempt {attempt} of {MAX_SIZE_REPLANS})",
                emit=(EventKind.REFUSED,), refusal=payload)
            if again is not None:
                log.info("run %s: %s; asked for a new plan", run.run_id, what)
                return
        else:
            self._refusals.pop(run.run_id, None)
        await self._update(run.run_id, expect=_ENGINE_SIDE, state=RunState.FAILED,
                           message=f"{what}, {attempt} times; not planned again",
                           finished_at=time.time(),
                           emit=(EventKind.REFUSED, EventKind.FINISHED), refusal=payload)

    def _fetch_cached(self, run_id: str, plan: Plan) -> dict[str, Reuse]:
        """The plan's cache hits as the local engine takes them (artifacts fetched and
        checked against their digests -- but for hits nothing reads the artifacts of; an
        entry whose artifact is corrupt or gone is dropped from the cache and its step
        runs again)."""
        reuse: dict[str, Reuse] = {}
        corrupt: list[str] = []
        # Hits nothing reads the artifacts of are reused without them (a chunk of a split
        # plan decides on its own steps: there every hit is fetched).
        idle = set() if _split(plan) else unneeded_steps(plan.workflow, plan.cached)
        for step, entry in plan.cached.items():
            paths: dict[str, Path] = {}
            if step in idle:
                reuse[step] = Reuse(entry.key, dict(entry.outputs), paths,
                                    saved_seconds=entry.cost_seconds)
                continue
            try:
                for name, art in entry.artifacts.items():
                    if self._blobs is None:
                        raise UserError("no artifact store configured")
                    dest = self._runs_dir / ".cache" / run_id / step / name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    self._blobs.download(art.digest, dest)
                    _check_digest(dest, art.digest, f"field 'artifacts.{name}'")
                    paths[name] = dest
            except (BlobIntegrityError, NotFoundError) as exc:  # bad input: never passed on
                log.warning("run %s, step %r: cached result %s is corrupt or missing in the "
                            "artifact store; dropping it from the cache, the step runs "
                            "again: %s", run_id, step, entry.key, exc)
                shutil.rmtree(self._runs_dir / ".cache" / run_id / step, ignore_errors=True)
                corrupt.append(entry.key)
                continue
            except Exception as exc:  # a hit that cannot be used: the step runs instead
                log.warning("run %s, step %r: cached result %s not reused: %s", run_id, step,
                            entry.key[:12], exc)
                continue
            reuse[step] = Reuse(entry.key, dict(entry.outputs), paths,
                                saved_seconds=entry.cost_seconds)
        if corrupt:
            self._drop_cached(run_id, corrupt)
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

    def _sampling(self, run_id: str, workflow: str) -> Callable[[StepSample], None]:
        """What an engine hands the utilization samples of ``run_id``'s steps to (from its
        threads): buffered on the event loop until :meth:`_flush_samples`."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("Submitter.start() was not awaited")

        def on_sample(s: StepSample) -> None:
            sample = UtilizationSample(run_id=run_id, workflow=workflow, step=s.step, at=s.at,
                                       cpu=s.cpu, memory_bytes=s.memory_bytes, key=s.key,
                                       attempt=s.attempt, interval_seconds=s.interval_seconds)
            with contextlib.suppress(RuntimeError):  # loop closed: a sample is no record
                loop.call_soon_threadsafe(self._buffer_sample, sample)

        return on_sample

    def _buffer_sample(self, sample: UtilizationSample) -> None:
        buffered = self._samples.setdefault(sample.run_id, [])
        buffered.append(sample)
        if len(buffered) > _MAX_PENDING_SAMPLES:  # the store is away for long: keep the newest
            del buffered[:len(buffered) - _MAX_PENDING_SAMPLES]
            if sample.run_id not in self._samples_dropped:
                self._samples_dropped.add(sample.run_id)
                log.warning("run %s: utilization samples could not be queued for a while; "
                            "the oldest are dropped (%d kept)", sample.run_id,
                            _MAX_PENDING_SAMPLES)

    async def _metrics_loop(self) -> None:
        """Queue the buffered samples every ``metrics_interval`` seconds, forever."""
        while not self._closing:
            await asyncio.sleep(self._metrics_interval)
            try:
                await self._flush_samples()
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except Exception as exc:  # the store is away: they stay buffered, next time
                log.warning("utilization samples not queued (tried again in %g s): %s",
                            self._metrics_interval, exc)

    async def _flush_samples(self) -> None:
        """Queue every run's buffered samples as its ``couler.metrics.batch`` events (one
        transaction); on failure they stay buffered."""
        pending, self._samples = self._samples, {}
        if not pending:
            return
        count = sum(len(v) for v in pending.values())
        try:
            await self._db(count <= _QUICK_ROWS, self._store.queue_samples, pending)
        except BaseException:
            self._unbuffer(pending)
            raise
        self._wake.set()

    def _unbuffer(self, pending: Mapping[str, Sequence[UtilizationSample]]) -> None:
        """Put samples taken from the buffer back in front (a failed queueing)."""
        for run_id, some in pending.items():
            self._samples[run_id] = [*some, *self._samples.get(run_id, ())]

    def _track(self, run_id: str, handle: RunHandle, wf: ir.Workflow, engine: str,
               queue: asyncio.Queue[StepStatus | None], *,
               keys: Mapping[str, str] | None = None) -> None:
        active = _Active(handle, wf, engine, queue, keys=dict(keys or {}))
        self._active[run_id] = active
        loop = self._loop
        assert loop is not None  # _callback checked it

        def wait() -> None:  # its own thread: a run may take hours; the pool is for I/O
            with contextlib.suppress(Exception):
                active.final = handle.wait()
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=wait, name=f"submitter-wait-{run_id}", daemon=True).start()
        active.task = asyncio.create_task(self._drive(run_id, active), name=f"run:{run_id}")

    async def _drive(self, run_id: str, active: _Active) -> None:
        try:
            ended = finished = False
            while not ended:
                first = await active.queue.get()
                if first is None:
                    break
                batch = [first]
                while len(batch) < _STEP_BATCH and not active.queue.empty():
                    item = active.queue.get_nowait()
                    if item is None:
                        ended = True
                        break
                    batch.append(item)
                # The end came with the last changes: recorded in their transaction, with
                # the steps the engine never reported.
                finish: Finish | None = None
                unreported: Sequence[StepRecord] = ()
                if ended and active.final is not None and not self._closing:
                    finish = self._finish_of(active, active.final)
                    unreported = self._unreported(active, active.final, finish, batch)
                try:
                    run = await self._on_steps(run_id, active, batch, finish=finish,
                                               unreported=unreported)
                    if finish is not None:
                        finished = True
                        ended_here = (run.state is finish.state
                                      and run.finished_at == finish.finished_at)
                        self._finished(run_id, finish if ended_here else None)
                except (asyncio.CancelledError, GeneratorExit):
                    raise
                except Exception as exc:
                    if self._closing:
                        return  # resumed at the next start
                    log.error("run %s: recording %d step change(s) failed: %s", run_id,
                              len(batch), exc, exc_info=True)
            final = active.final  # the waiting thread got it before it posted the end
            if final is None:
                final = await asyncio.to_thread(active.handle.wait)  # as long as it takes
            if self._closing:
                return  # stopped by the shutdown, not finished: resumed at the next start
            if not finished:
                await self._finish(run_id, active, final)
        finally:
            active.done.set()
            if self._active.get(run_id) is active:
                del self._active[run_id]

    async def _on_steps(self, run_id: str, active: _Active, statuses: Sequence[StepStatus], *,
                        finish: Finish | None = None,
                        unreported: Sequence[StepRecord] = ()) -> Run:
        """Record a batch of step changes of one run, and queue their events; ``finish``:
        the run's end, recorded after them, with the ``unreported`` steps' records
        (:meth:`_unreported`). The record committed."""
        records: list[StepRecord] = []
        started_at: float | None = None
        moving = False
        active.reported.update(s.step for s in statuses)
        for reported in statuses:
            # a remote engine's step: the plan's key
            status = keyed_by_plan(reported, active.step(reported.step), active.keys)
            artifacts: dict[str, StoredArtifact] = {}
            cache_key = status.cache_key
            # a top-level step, or a map item or loop iteration (``status.key``) with a key
            if status.state is StepState.SUCCEEDED and cache_key:
                try:
                    artifacts = await self._call(self._upload, active, status.step,
                                                 status.key)
                except Exception as exc:  # never commit an entry without its artifacts
                    log.warning("run %s, step %r: artifacts not stored (%s); not cacheable",
                                run_id, status.step, exc)
                    cache_key = ""
            failure_class, failure_reason = _failure(status)
            records.append(dataclasses.replace(
                StepRecord.from_status(status, failure_class=failure_class,
                                       failure_reason=failure_reason),
                cache_key=cache_key, artifacts=artifacts))
            if status.state is not StepState.PENDING:
                moving = True
                if started_at is None and status.started_at is not None:
                    started_at = status.started_at
        # The run's samples buffered so far go with these changes (a step's last samples
        # arrive before its end: the engine sends them first); peaks stay on the records.
        samples = self._samples.pop(run_id, [])
        try:
            run = await self._db(len(records) + len(samples) + len(unreported) <= _QUICK_ROWS,
                                 self._store.put_steps, run_id, records,
                                 state=RunState.RUNNING if moving else None,
                                 started_at=started_at if moving else None, samples=samples,
                                 finish=finish, unreported=unreported)
        except BaseException:
            if samples:
                self._unbuffer({run_id: samples})
            raise
        self._changed_here(run, steps=True)
        self._wake.set()
        return run

    def _upload(self, active: _Active, step_name: str, key: str = ""
                ) -> dict[str, StoredArtifact]:
        """Store the output artifacts of a succeeded step (of its map item or loop iteration
        ``key``: the engine keeps them as ``step[key]``'s)."""
        step = active.step(step_name)
        if step is None or not step.output_artifacts:
            return {}
        if self._blobs is None:
            raise UserError("no artifact store configured")
        stored = {}
        for art in step.output_artifacts:
            path = active.handle.artifact_path(f"{step_name}[{key}]" if key else step_name,
                                               art.name)
            if path is None:
                raise UserError(f"step {step_name!r}, field 'output_artifacts.{art.name}': "
                                "the engine kept no such artifact")
            stored[art.name] = self._blobs.upload(path)
        return stored

    @staticmethod
    def _finish_of(active: _Active, final: RunStatus) -> Finish:
        """How the run ends, from the engine's final status."""
        state = RunState.from_engine(final.state)
        message = final.message
        if state is RunState.CANCELLED and active.cancel_reason:
            message = active.cancel_reason
        return Finish(state, message, final.finished_at or time.time(), _ENGINE_SIDE)

    @staticmethod
    def _unreported(active: _Active, final: RunStatus, end: Finish,
                    batch: Sequence[StepStatus] = ()) -> Sequence[StepRecord]:
        """The records of the steps the engine never reported -- not in its final status,
        nor in ``batch``, nor among the changes recorded before -- now that the run ends
        with ``end`` (:mod:`couler_submitter.unreported`)."""
        active.reported.update(s.step for s in final.steps)
        active.reported.update(s.step for s in batch)
        return unreported_steps(active.workflow, active.reported, engine=active.engine,
                                state=end.state, at=end.finished_at)

    async def _finish(self, run_id: str, active: _Active, final: RunStatus) -> None:
        end = self._finish_of(active, final)
        unreported = self._unreported(active, final, end)
        if unreported:  # recorded in the transaction that ends the run
            run = await self._on_steps(run_id, active, (), finish=end, unreported=unreported)
            ended = run.state is end.state and run.finished_at == end.finished_at
        else:
            ended = await self._update(run_id, expect=end.expect, state=end.state,
                                       message=end.message, finished_at=end.finished_at,
                                       emit=(EventKind.FINISHED,)) is not None
        self._finished(run_id, end if ended else None)

    def _finished(self, run_id: str, end: Finish | None) -> None:
        """The run's engine is done (``end``: how the run ended, None when it had ended
        already, e.g. cancelled)."""
        shutil.rmtree(self._runs_dir / ".cache" / run_id, ignore_errors=True)
        if end is not None:
            log.info("run %s: %s%s", run_id, end.state.value,
                     f" ({end.message})" if end.message else "")

    # ------------------------------------------------------------------ helpers

    async def _fail(self, run_id: str, message: str, *, expect: Iterable[RunState]) -> bool:
        if self._closing:  # a stop is not a failure: the next start takes the run up
            log.info("run %s: not failed while stopping: %s", run_id, message)
            return False
        run = await self._update(run_id, expect=tuple(expect), state=RunState.FAILED,
                                 message=message, finished_at=time.time(),
                                 emit=(EventKind.FINISHED,))
        if run is None:
            return False
        log.info("run %s: failed: %s", run_id, message)
        return True

    async def _update(self, run_id: str, **changes: object) -> Run | None:
        encoded = changes.get("encoded_plan")
        small = not changes.get("clear_steps") and (
            changes.get("plan") is None  # else encoded here, unless given
            or (isinstance(encoded, bytes) and len(encoded) <= _QUICK_BYTES))
        run = await self._db(small, self._store.update_run, run_id, **changes)
        if run is not None:
            self._changed_here(run, steps=bool(changes.get("clear_steps")))
            if changes.get("emit"):
                self._wake.set()
        return run

    def _changed_here(self, run: Run, *, steps: bool = False, new: bool = False) -> None:
        """``run`` is the record a change committed here: keep it for the watchers, and wake
        them (a watcher takes a fresh event before reading)."""
        self._headers.changed(run, steps=steps, new=new)
        changed = self._changed.pop(run.run_id, None)
        if changed is not None:
            changed.set()

    async def _db(self, small: bool, fn: Callable[..., T], *args: object,
                  **kwargs: object) -> T:
        """A store call: on the event loop when the store is quick and the call ``small``
        (a few rows, no large value), else in a worker thread (:meth:`_call`).

        On the loop, the events it commits are handed to the sender as they are; from a
        thread, the sender reads the table (in a thread, commits interleave with the
        loop's: only the table has their order).
        """
        if small and self._quick:
            with self._store.capturing() as queued:
                result = fn(*args, **kwargs)
            self._fresh += queued
            return result
        self._unread = True
        self._threads_writing += 1
        try:
            return await self._call(fn, *args, **kwargs)
        finally:
            self._threads_writing -= 1

    @staticmethod
    async def _call(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``fn`` in a worker thread. A cancelled caller still waits for the thread to be
        done, so that a stop (which closes the store next) never pulls the database out from
        under a call in progress. Not for calls that wait for a run to end."""
        call = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await call
            raise

    # ------------------------------------------------------------------ cache (bad input)

    def _drop_cached(self, run_id: str, keys: Sequence[str]) -> None:
        """Ask the cache to drop the entries of ``keys`` (their artifacts are corrupt or
        gone); best effort: the steps run again either way, and a later lookup that finds a
        blob gone drops the entry too."""
        if self._cache is None:
            log.warning("run %s: no cache address configured (COULER_CACHE_ADDRESS); the "
                        "corrupt cache entries %s stay in the cache", run_id, ", ".join(keys))
            return
        try:
            self._cache.evict(keys)
        except Exception as exc:  # logged; the entries are not reused by this run anyway
            log.warning("run %s: evicting the corrupt cache entries %s failed: %s", run_id,
                        ", ".join(keys), exc)
            return
        log.info("run %s: evicted the corrupt cache entries %s", run_id, ", ".join(keys))


def _check_digest(path: Path, digest: str, where: str) -> None:
    """Raise BlobIntegrityError unless the file or directory at ``path`` has ``digest``
    (as the local engine computes it: :func:`couler_runtime.local.artifacts.digest_path`)."""
    found = digest_path(path)
    if found != digest:
        raise BlobIntegrityError(f"{where}: the fetched artifact has digest {found}, the "
                                 f"cache entry says {digest}")
