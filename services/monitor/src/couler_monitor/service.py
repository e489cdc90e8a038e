"""The monitor's use cases: record what runs and steps did, and recommend what they need.

:class:`Monitor` works on record types (:mod:`couler_runtime.rpc.records`) and knows nothing
of gRPC or NATS: events reach it decoded, and recommendations leave through the
``publish`` callable given at construction.

Recording is idempotent, because delivery is at-least-once:

* a run's state only moves forward (accepted → planning → pending → running → terminal),
  except that a step event newer than the run's end re-opens it (a Retry), and a
  ``WorkflowFinished`` with more retries supersedes the previous end;
* a step keeps the latest of its records, ordered by (event time, attempts, state rank), so a
  redelivered old record never overwrites a newer one;
* a sample is stored once per (run, step, key, attempt, time).

Utilization samples are a time series per step execution (:meth:`Monitor.sample_change`):
the raw samples are kept ``sample_retention`` seconds (default 24 h), then
:meth:`Monitor.maintain` (run periodically by the service) folds them into one rollup per
step execution and minute -- count, mean and highest CPU, highest memory -- kept
``rollup_retention`` seconds (default 30 days), then deleted. Each batch of the compaction is
one transaction (rollups merged and raw samples deleted together): a crash in the middle
loses nothing and counts nothing twice, and running it again is harmless. Queries read
both tiers: raw samples where they are kept, rollups for older time.

Recommendations, recomputed for one (workflow, step) when one of its steps ends with a
measurement (or fails out of memory), and when a sample of a run that ended arrives (the
samples of a running step wait for its end):

* ``memory_request`` and ``cpu_request`` come from the step's decaying histograms
  (:mod:`couler_monitor.recommender`, modelled on the Kubernetes VPA recommender): the CPU
  histogram takes every newly stored sample, the memory histogram one peak per run of the
  step (replaced when the run's peak grows; a run killed for memory counts bumped up). The
  target is CPU p90 / memory p95 plus a 15% safety margin, widened when few runs were seen,
  with lower and upper bounds, at least ``min_memory_bytes`` / ``min_cpu``; nothing before
  ``min_runs`` runs, and a new value only past the hysteresis (the target moved more than
  10%, or the current request left the bounds). Memory in whole Mi and CPU in whole
  millicores, rounded up. The histograms are stored as JSON (``monitor_recommender_state``)
  in the same transaction as the sample or step end they learned from; one that cannot be
  read is rebuilt from the stored samples and steps (logged);
* after an out-of-memory failure, over the step's last ``history_runs`` runs:
  ``memory_limit`` = 2 * the peak at which it was killed (which is the limit it hit), and a
  ``retry`` limit for OOM failures.

A recommendation is stored and published only when its value changed; its evidence
(target, bounds, percentile, runs, samples, time span) is updated in place. The store row doubles
as the outbox: it is committed unpublished, published (message id = the recommendation's
deterministic id), then flagged; a crash in between republishes it with the same id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

from couler import ir
from couler.engines.base import StepState
from couler.errors import NotFoundError, UserError
from couler_monitor import retries
from couler_monitor.recommender import (
    RecommenderConfig,
    ResourceEstimate,
    StateError,
    StepHistory,
    estimate,
    oom_bump,
    should_update,
)
from couler_monitor.store import (
    FailureRow,
    MonitorStore,
    RecommendationRow,
    RecommenderRunRow,
    RecommenderStateRow,
    RollupRow,
    RunFields,
    RunRow,
    SampleRow,
    StepRequestRow,
    StepRow,
    Tx,
)
from couler_runtime.rpc.records import (
    Recommendation,
    RecommendationKind,
    RecommendationReport,
    Run,
    RunState,
    StepPeak,
    StepRecord,
    StepRequests,
    Utilization,
    UtilizationRollup,
    UtilizationSample,
)

__all__ = [
    "DEFAULT_ROLLUP_RETENTION",
    "DEFAULT_SAMPLE_LIMIT",
    "DEFAULT_SAMPLE_RETENTION",
    "MAX_SAMPLE_LIMIT",
    "MI",
    "OOM_RETRY_LIMIT",
    "Change",
    "Maintenance",
    "Monitor",
    "Publisher",
    "cpu_quantity",
    "memory_quantity",
    "recommendation_id",
]

MI = 1024 * 1024
DEFAULT_SAMPLE_LIMIT = 1000
DEFAULT_SAMPLE_RETENTION = 24 * 3600.0  # seconds raw samples are kept
DEFAULT_ROLLUP_RETENTION = 30 * 86400.0  # seconds the 1-minute rollups are kept
COMPACT_BATCH = 5000  # raw samples folded into rollups per transaction
MAX_SAMPLE_LIMIT = 10_000
OOM_RETRY_LIMIT = 2
_MAX_RUNS_LISTED = 500
_QUICK_CHANGES = 32  # changes committed on the event loop at most (a quick store)
_INT32 = 2**31 - 1
_LAST_SECOND = 253402300799.0  # 9999-12-31T23:59:59Z, the last a Timestamp holds
_LAST_SAMPLE_SECOND = (2**63 - 1) / 1e9  # a sample's time is stored in ns (a 64-bit integer)
E = TypeVar("E", bound=enum.Enum)
log = logging.getLogger(__name__)

Publisher = Callable[[Recommendation], Awaitable[None]]
Change = Callable[[Tx], bool]
"""One checked event's writes inside a transaction; True when what it wrote may have changed
a recommendation (a new sample, a changed value): :meth:`Monitor.apply` then publishes the
pending ones."""

_RUN_RANK = {RunState.ACCEPTED: 0, RunState.PLANNING: 1, RunState.PENDING: 2,
             RunState.RUNNING: 3, RunState.SUCCEEDED: 4, RunState.FAILED: 4,
             RunState.CANCELLED: 4}
_STEP_RANK = {StepState.PENDING: 0, StepState.RUNNING: 1, StepState.RETRYING: 2}


MIN_MEMORY_BYTES = 16 * 1024 * 1024  # 16Mi
MIN_CPU = 0.01  # 10m
_REBUILD_SAMPLES = 200_000  # the newest samples a damaged histogram is rebuilt from
_INT64 = 2**63 - 1
_MEASURED = (StepState.SUCCEEDED, StepState.FAILED)  # step ends that make a run count
_MEASURED_STATES = tuple(s.value for s in _MEASURED)


def memory_quantity(peak_bytes: int, headroom: Fraction) -> str:
    """``peak_bytes`` * ``headroom`` as a Kubernetes quantity in whole Mi, rounded up."""
    return f"{max(1, math.ceil(Fraction(peak_bytes) * headroom / MI))}Mi"


def cpu_quantity(peak_cores: float, headroom: Fraction) -> str:
    """``peak_cores`` * ``headroom`` as a Kubernetes quantity in whole millicores, rounded up."""
    # The float's shortest decimal form: 1.8 cores is 1.8, not 1.8000000000000000444.
    return f"{max(1, math.ceil(Fraction(repr(float(peak_cores))) * headroom * 1000))}m"


def recommendation_id(workflow: str, step: str, kind: RecommendationKind, value: str) -> str:
    """The deterministic id (and feedback Nats-Msg-Id) of a recommendation."""
    return f"{workflow}/{step}/{kind.value}/{value}"


def _mi(n: int) -> str:
    return f"{n / MI:.0f}Mi" if n >= MI else f"{n}B"


@dataclass(frozen=True, slots=True)
class Maintenance:
    """What one :meth:`Monitor.maintain` did."""

    compacted: int = 0  # raw samples folded into rollups (and deleted)
    expired_samples: int = 0  # raw samples deleted past the rollup retention
    expired_rollups: int = 0  # rollups deleted past the rollup retention
    transactions: int = 0


@dataclass(frozen=True, slots=True)
class _Proposal:
    kind: RecommendationKind
    value: str
    reason: str
    based_on: int
    failure_class: ir.FailureClass | None = None
    evidence: _Evidence | None = None


@dataclass(frozen=True, slots=True)
class _Evidence:
    """What a resource recommendation stores beside its value."""

    target: str
    lower: str
    upper: str
    percentile: float
    runs: int
    samples: int
    span: float


@dataclass(slots=True)
class _Learned:
    """The recommender's work in one transaction: histograms read (or rebuilt), those
    changed (written back once, at the end) and the steps to recommend for."""

    histories: dict[tuple[str, str], StepHistory]
    dirty: set[tuple[str, str]]
    due: dict[tuple[str, str], None]  # ordered


class Monitor:
    """Records runs, steps and samples; computes, stores and publishes recommendations.

    Args:
        store: The history.
        publish: Sends one recommendation on ``couler.feedback.<workflow>``.
        config: The resource recommender's knobs (percentiles, margin, minimum runs,
            half-life, hysteresis; :class:`~couler_monitor.recommender.RecommenderConfig`).
        history_runs: How many of a step's latest runs out-of-memory failures are looked
            for in (the memory limit and retry proposals).
        min_memory_bytes: The smallest memory request recommended (overrides ``config``).
        min_cpu: The smallest CPU request recommended, in cores (overrides ``config``).
        sample_retention: Seconds raw utilization samples are kept before they are
            compacted into 1-minute rollups.
        rollup_retention: Seconds the rollups are kept (at least ``sample_retention``).
        clock: Seconds since the epoch (tests may pin it).
    """

    def __init__(self, store: MonitorStore, publish: Publisher, *,
                 config: RecommenderConfig | None = None, history_runs: int = 10,
                 min_memory_bytes: int | None = None, min_cpu: float | None = None,
                 sample_retention: float = DEFAULT_SAMPLE_RETENTION,
                 rollup_retention: float = DEFAULT_ROLLUP_RETENTION,
                 clock: Callable[[], float] = time.time) -> None:
        if history_runs < 1:
            raise UserError("history_runs must be at least 1")
        if not 0 < sample_retention <= rollup_retention:
            raise UserError(f"the sample retention ({sample_retention} s) must be more than 0 "
                            f"and at most the rollup retention ({rollup_retention} s)")
        self._sample_retention = sample_retention
        self._rollup_retention = rollup_retention
        config = config or RecommenderConfig(min_memory=float(MIN_MEMORY_BYTES),
                                             min_cpu=MIN_CPU)
        if min_memory_bytes is not None:
            config = dataclasses.replace(config, min_memory=float(min_memory_bytes))
        if min_cpu is not None:
            config = dataclasses.replace(config, min_cpu=min_cpu)
        self._store = store
        self._publish = publish
        self._config = config
        self._history_runs = history_runs
        self._clock = clock
        # One writer at a time in this process: concurrent handlers would otherwise race on
        # the same rows (and SQLite allows one writer anyway).
        self._lock = asyncio.Lock()
        self._outbox_dirty = True  # until a flush succeeded, assume something is left

    # ------------------------------------------------------------------ recording
    #
    # Each ``*_change`` method checks an event and returns its :data:`Change`; ``apply``
    # commits changes in one transaction (a consumer's batch of events), and each
    # ``record_*`` method is ``apply`` of one change.

    async def apply(self, changes: Sequence[Change]) -> None:
        """Commit ``changes`` in one transaction, in order; then publish the
        recommendations they changed. A few changes on a quick store (SQLite) commit on the
        event loop: less work than handing them to a thread and back."""
        def txn() -> bool:
            changed = False
            with self._store.transaction() as tx:
                for change in changes:
                    changed = change(tx) or changed
                changed = self._settle(tx) or changed
            return changed

        async with self._lock:
            if self._store.quick and len(changes) <= _QUICK_CHANGES:
                changed = txn()
            else:
                changed = await asyncio.to_thread(txn)
            # Also when an earlier publish failed (or a crash left one): send it now.
            if changed or self._outbox_dirty:
                await self._flush()

    async def record_step(self, run_id: str, workflow: str, engine: str, record: StepRecord,
                          at: float | None) -> None:
        """A step changed state (a ``StepEvent``)."""
        await self.apply((self.step_change(run_id, workflow, engine, record, at),))

    def step_change(self, run_id: str, workflow: str, engine: str, record: StepRecord,
                    at: float | None) -> Change:
        """:meth:`record_step` as a change to apply."""
        if not run_id:
            raise UserError(f"step event of workflow {workflow!r}, step {record.name!r}: "
                            "field 'run_id' is empty")
        if not record.name:
            raise UserError(f"step event of run {run_id!r} (workflow {workflow!r}): "
                            "field 'step.name' is empty")
        when = at if at is not None else (record.finished_at or record.started_at
                                          or self._clock())

        def write(tx: Tx) -> bool:
            # Core statements, not the ORM: this runs once per step event (a run may have
            # 100k steps) and the unit of work cost most of it.
            run = self._run_row(tx, run_id, workflow=workflow, engine=engine)
            try:
                state = RunState(run.state)
            except ValueError:  # a damaged row: the event says where the run is
                state = RunState.ACCEPTED
            # A step event never reopens a finished run: events published late (under load,
            # or redelivered) would otherwise leave it "running" for good. A Retry reopens
            # it through its new couler.workflow.submitted (record_submitted).
            if not state.terminal and _RUN_RANK[RunState.RUNNING] > _RUN_RANK[state]:
                run.state = RunState.RUNNING.value
            if record.started_at is not None and (run.started_at is None
                                                  or record.started_at < run.started_at):
                run.started_at = record.started_at
            tx.save_run(run)
            name = str(run.workflow or "")
            # Learned before the record is stored: histograms rebuilt from the stored
            # steps (none yet, or damaged) must not count it twice.
            self._learn_step(tx, run_id, name, record, when)
            self._merge_step(tx, run_id, name, record, when)
            return self._recommend_after(tx, name, record)

        return write

    async def record_sample(self, sample: UtilizationSample) -> None:
        """One utilization sample."""
        await self.apply((self.sample_change(sample),))

    def sample_change(self, sample: UtilizationSample) -> Change:
        """:meth:`record_sample` as a change to apply."""
        where = f"utilization sample of run {sample.run_id!r}, step {sample.step!r}"
        if not sample.run_id:
            raise UserError(f"{where}: field 'run_id' is empty")
        if not sample.step:
            raise UserError(f"{where}: field 'step' is empty")
        if sample.at is None:
            raise UserError(f"{where}: field 'at' is not set")
        if not math.isfinite(sample.cpu) or sample.cpu < 0:
            raise UserError(f"{where}: field 'cpu' must be a finite number >= 0 "
                            f"(got {sample.cpu})")
        if sample.memory_bytes < 0:
            raise UserError(f"{where}: field 'memory_bytes' must be >= 0 "
                            f"(got {sample.memory_bytes})")
        if not math.isfinite(sample.interval_seconds) or sample.interval_seconds < 0:
            raise UserError(f"{where}: field 'interval_seconds' must be a finite number >= 0 "
                            f"(got {sample.interval_seconds})")
        if not 0 <= sample.at < _LAST_SAMPLE_SECOND:
            raise UserError(f"{where}: field 'at' is out of range ({sample.at})")
        row = SampleRow(run_id=sample.run_id, workflow=sample.workflow, step=sample.step,
                        key=sample.key, attempt=sample.attempt,
                        at_ns=round(sample.at * 1e9), cpu=sample.cpu,
                        memory_bytes=sample.memory_bytes,
                        interval_seconds=sample.interval_seconds or None)

        def write(tx: Tx) -> bool:
            # The histograms are read before the sample is stored: one rebuilt from the
            # stored samples must not count it twice.
            history = self._history(tx, row.workflow, row.step) if row.workflow else None
            new = tx.insert_sample(row)
            if new and history is not None:  # fed once, when new
                self._learn_sample(tx, history, row)
            return new  # a redelivery stores nothing

        return write

    async def record_requested(self, run_id: str, *, workflow: str, engine: str,
                               at: float | None) -> None:
        """A run was accepted (``WorkflowRequested``)."""
        await self.apply((self.requested_change(run_id, workflow=workflow, engine=engine,
                                                at=at),))

    def requested_change(self, run_id: str, *, workflow: str, engine: str,
                         at: float | None) -> Change:
        """:meth:`record_requested` as a change to apply."""
        run_id = self._need_run_id(run_id, "requested")

        def write(tx: Tx) -> bool:
            run = self._run_row(tx, run_id, workflow=workflow, engine=engine)
            if run.created_at is None or (at is not None and at < run.created_at):
                run.created_at = at if at is not None else self._clock()
            tx.save_run(run)
            return False

        return write

    async def record_planned(self, run_id: str, *, workflow: str, engine: str,
                             requests: Mapping[str, ir.Resources] | None = None,
                             at: float | None = None) -> None:
        """The run was generated or optimized (its workflow's name is known)."""
        await self.apply((self.planned_change(run_id, workflow=workflow, engine=engine,
                                              requests=requests, at=at),))

    def planned_change(self, run_id: str, *, workflow: str, engine: str,
                       requests: Mapping[str, ir.Resources] | None = None,
                       at: float | None = None) -> Change:
        """:meth:`record_planned` as a change to apply.

        ``requests`` (from an optimized plan) are the resources its steps are planned
        with: by step name, ``""`` for the workflow's defaults; they replace what an older
        plan of the workflow said (a plan older than the stored one, by ``at``, does not).
        """
        run_id = self._need_run_id(run_id, "planned")

        def write(tx: Tx) -> bool:
            run = self._run_row(tx, run_id, workflow=workflow, engine=engine)
            self._advance(run, RunState.PLANNING)
            tx.save_run(run)
            if requests is not None and workflow:
                self._plan_requests(tx, run_id, workflow, requests,
                                    at if at is not None else self._clock())
            return False

        return write

    async def record_submitted(self, run_id: str, *, workflow: str, engine: str,
                               at: float | None) -> None:
        """The engine accepted the run (``WorkflowSubmitted``)."""
        await self.apply((self.submitted_change(run_id, workflow=workflow, engine=engine,
                                                at=at),))

    def submitted_change(self, run_id: str, *, workflow: str, engine: str,
                         at: float | None) -> Change:
        """:meth:`record_submitted` as a change to apply."""
        run_id = self._need_run_id(run_id, "submitted")

        def write(tx: Tx) -> bool:
            run = self._run_row(tx, run_id, workflow=workflow, engine=engine)
            terminal = run.state in (s.value for s in RunState if s.terminal)
            if terminal and at is not None and at > (run.finished_at or 0.0):
                # submitted again after the end: a Retry of the run
                run.state, run.reopened_at = RunState.PENDING.value, at
                run.finished_at, run.message = None, ""
            self._advance(run, RunState.PENDING)
            if at is not None and (run.started_at is None or at < run.started_at):
                run.started_at = at
            tx.save_run(run)
            return False

        return write

    async def record_rejected(self, run_id: str, *, stage: str, reason: str,
                              at: float | None) -> None:
        """The generator or the optimizer refused the run (``WorkflowRejected``)."""
        await self.apply((self.rejected_change(run_id, stage=stage, reason=reason, at=at),))

    def rejected_change(self, run_id: str, *, stage: str, reason: str,
                        at: float | None) -> Change:
        """:meth:`record_rejected` as a change to apply."""
        run_id = self._need_run_id(run_id, "rejected")

        def write(tx: Tx) -> bool:
            run = self._run_row(tx, run_id, workflow="", engine="")
            if self._advance(run, RunState.FAILED):
                run.finished_at = at if at is not None else self._clock()
                run.message = f"rejected by the {stage or 'planner'}: {reason}"
            tx.save_run(run)
            return False

        return write

    async def record_finished(self, record: Run) -> None:
        """The run reached a terminal state (``WorkflowFinished``; the submitter sends it
        without steps, which came as step events, but steps it carries are merged)."""
        await self.apply((self.finished_change(record),))

    def finished_change(self, record: Run) -> Change:
        """:meth:`record_finished` as a change to apply."""
        run_id = self._need_run_id(record.run_id, "finished")

        def write(tx: Tx) -> bool:
            run = self._run_row(tx, run_id, workflow=record.workflow, engine=record.engine)
            stale = (run.reopened_at is not None and record.retries <= run.retries
                     and (record.finished_at or 0.0) <= run.reopened_at)
            if not stale and self._advance(run, record.state, retries=record.retries):
                run.finished_at = record.finished_at or self._clock()
                run.message = record.message
                run.reopened_at = None
            if record.created_at is not None and run.created_at is None:
                run.created_at = record.created_at
            if record.started_at is not None and (run.started_at is None
                                                  or record.started_at < run.started_at):
                run.started_at = record.started_at
            tx.save_run(run)
            changed = False
            when = record.finished_at or self._clock()
            for step in record.steps:
                self._learn_step(tx, run_id, run.workflow, step, when)
                self._merge_step(tx, run_id, run.workflow, step, when)
                changed = self._recommend_after(tx, run.workflow, step) or changed
            return changed

        return write

    # ------------------------------------------------------------------ retention

    async def maintain(self, *, batch: int = COMPACT_BATCH) -> Maintenance:
        """Compact and expire utilization samples (see the module docstring); idempotent.

        Raw samples measured before the start of the minute ``sample_retention`` ago are
        folded into their minutes' rollups, ``batch`` at a time, each batch in one
        transaction; rollups (and raw samples) older than ``rollup_retention`` are deleted.
        Consumers go on between the transactions.
        """
        now = self._clock()
        raw_before = int((now - self._sample_retention) // 60) * 60  # a whole minute
        rollup_before = int((now - self._rollup_retention) // 60) * 60
        done = Maintenance()

        async def step(fn: Callable[[Tx], int]) -> int:
            def txn() -> int:
                with self._store.transaction() as tx:
                    return fn(tx)

            async with self._lock:  # one writer at a time, between the consumers' batches
                return await asyncio.to_thread(txn)

        expired = await step(lambda tx: tx.expire_samples(rollup_before * 10**9))
        compacted, transactions = 0, 1
        while True:
            n = await step(lambda tx: tx.compact_samples(raw_before * 10**9, batch))
            transactions += 1
            compacted += n
            if n < batch:
                break
        rollups = await step(lambda tx: tx.expire_rollups(rollup_before))
        done = Maintenance(compacted, expired, rollups, transactions + 1)
        if compacted or expired or rollups:
            log.info("utilization: %d raw sample(s) compacted into 1-minute rollups, %d "
                     "sample(s) and %d rollup(s) past the retention deleted", compacted,
                     expired, rollups)
        return done

    async def publish_pending(self) -> int:
        """Publish every committed-but-unpublished recommendation; how many were sent."""
        async with self._lock:
            return await self._flush()

    # ------------------------------------------------------------------ queries

    async def utilization(self, *, run_id: str = "", workflow: str = "", step: str = "",
                          limit: int = 0) -> Utilization:
        """The newest ``limit`` points matching the filter, oldest first -- raw samples where
        they are kept, 1-minute rollups for older time -- and per-step peaks over both
        tiers and the step records."""
        if not run_id and not workflow:
            raise UserError("utilization: give a run_id or a workflow (field 'run_id' and "
                            "field 'workflow' are both empty)")
        if limit < 0:
            raise UserError(f"utilization: field 'limit' must be >= 0 (got {limit})")
        limit = min(limit or DEFAULT_SAMPLE_LIMIT, MAX_SAMPLE_LIMIT)

        def read() -> Utilization:
            with self._store.transaction() as tx:
                raw = tx.samples(run_id=run_id, workflow=workflow, step=step, limit=limit)
                rolled = tx.rollups(run_id=run_id, workflow=workflow, step=step, limit=limit)
                # the newest ``limit`` of both, by time (a rollup's: the end of its minute)
                times = sorted([*(s.at_ns / 1e9 for s in raw),
                                *(float(r.minute + 60) for r in rolled)])
                floor = times[-limit] if len(times) > limit else float("-inf")
                samples = [s for s in raw if s.at_ns / 1e9 >= floor]
                rollups = [r for r in rolled if r.minute + 60 >= floor]
                while len(samples) + len(rollups) > limit:  # ties at the floor: drop oldest
                    if rollups and (not samples
                                    or rollups[0].minute + 60 <= samples[0].at_ns / 1e9):
                        rollups.pop(0)
                    else:
                        samples.pop(0)
                peaks: dict[tuple[str, str, str], list[object]] = {}
                for r, wf, name, key, cpu, mem, n, _last in tx.sample_peaks(
                        run_id=run_id, workflow=workflow, step=step):
                    peaks[(r, name, key)] = [wf, cpu, mem, n]
                for r, wf, name, key, cpu, mem, n in tx.rollup_peaks(
                        run_id=run_id, workflow=workflow, step=step):
                    p = peaks.setdefault((r, name, key), [wf, 0.0, 0, 0])
                    p[1] = max(float(p[1]), float(cpu or 0.0))  # type: ignore[arg-type]
                    p[2] = max(int(p[2]), int(mem or 0))  # type: ignore[call-overload]
                    p[3] = int(p[3]) + int(n or 0)  # type: ignore[call-overload]
                for s in tx.steps_matching(run_id=run_id, workflow=workflow, step=step):
                    if s.max_peak_memory_bytes is None and s.max_peak_cpu is None:
                        continue
                    p = peaks.setdefault((s.run_id, s.name, s.key), [s.workflow, 0.0, 0, 0])
                    p[1] = max(float(p[1]), s.max_peak_cpu or 0.0)  # type: ignore[arg-type]
                    p[2] = max(int(p[2]),  # type: ignore[call-overload]
                               s.max_peak_memory_bytes or 0)
                return Utilization(
                    tuple(UtilizationSample(s.run_id, s.workflow, s.step, s.at_ns / 1e9, s.cpu,
                                            s.memory_bytes, s.key, s.attempt,
                                            s.interval_seconds or 0.0) for s in samples),
                    tuple(StepPeak(r, str(p[0]), name, float(p[1]),  # type: ignore[arg-type]
                                   int(p[2]),  # type: ignore[call-overload]
                                   min(int(p[3]), _INT32), key)  # type: ignore[call-overload]
                          for (r, name, key), p in sorted(peaks.items())),
                    tuple(_rollup(r) for r in rollups
                          if _time(float(r.minute)) is not None),  # a damaged one left out
                )

        return await asyncio.to_thread(read)

    async def recommendations(self, workflow: str, step: str = "") -> tuple[Recommendation, ...]:
        """The current recommendations for ``workflow`` (one ``step``'s when given)."""
        if not workflow:
            raise UserError("recommendations: field 'workflow' is empty")

        def read() -> tuple[Recommendation, ...]:
            with self._store.transaction() as tx:
                found = (_recommendation(r) for r in tx.recommendations(workflow, step))
                return tuple(r for r in found if r is not None)

        return await asyncio.to_thread(read)

    async def recommendation_report(self, workflow: str,
                                    step: str = "") -> RecommendationReport:
        """The current recommendations for ``workflow`` (one ``step``'s when given), with
        the resources its steps were planned with in its latest plan."""
        if not workflow:
            raise UserError("recommendations: field 'workflow' is empty")

        def read() -> RecommendationReport:
            with self._store.transaction() as tx:
                found = (_recommendation(r) for r in tx.recommendations(workflow, step))
                recs = tuple(r for r in found if r is not None)
                requested = tuple(_requests(q) for q in tx.step_requests(workflow)
                                  if not step or q.step in ("", step))
                return RecommendationReport(recs, requested)

        return await asyncio.to_thread(read)

    async def runs(self, limit: int = 100) -> tuple[Run, ...]:
        """The latest runs the monitor heard of, newest first, with their steps."""
        limit = max(1, min(limit, _MAX_RUNS_LISTED))

        def read() -> tuple[Run, ...]:
            with self._store.transaction() as tx:
                rows = tx.runs(limit)
                by_run: dict[str, list[StepRow]] = {r.run_id: [] for r in rows}
                for s in tx.steps_of(list(by_run)):  # grouped once: runs may be large
                    by_run[s.run_id].append(s)
                return tuple(_run(r, by_run[r.run_id]) for r in rows)

        return await asyncio.to_thread(read)

    async def run(self, run_id: str) -> Run:
        """One run with its steps; NotFoundError if the monitor never heard of it."""
        def read() -> Run:
            with self._store.transaction() as tx:
                row = tx.run(run_id)
                if row is None:
                    raise NotFoundError(f"run {run_id!r}: not found")
                return _run(row, tx.steps_of([run_id]))

        return await asyncio.to_thread(read)

    # ------------------------------------------------------------------ internals

    async def _flush(self) -> int:
        def pending() -> Sequence[RecommendationRow]:
            with self._store.transaction() as tx:
                return tx.unpublished()

        self._outbox_dirty = True
        rows = await asyncio.to_thread(pending)
        for row in rows:
            rec = _recommendation(row)
            if rec is not None:  # a damaged one is marked too: it could never be sent
                await self._publish(rec)

            def mark(r: RecommendationRow = row) -> None:
                with self._store.transaction() as tx:
                    tx.mark_published(r.workflow, r.step, r.kind, r.id)

            await asyncio.to_thread(mark)
        self._outbox_dirty = False
        return len(rows)

    @staticmethod
    def _need_run_id(run_id: str, what: str) -> str:
        if not run_id:
            raise UserError(f"workflow {what} event: field 'run_id' is empty")
        return run_id

    def _run_row(self, tx: Tx, run_id: str, *, workflow: str, engine: str) -> RunFields:
        """The run's row to change (locked on PostgreSQL); a new one when there is none.
        The caller writes it back with ``tx.save_run``."""
        run = tx.run_namespace(run_id)
        if run is None:
            run = tx.new_run(run_id=run_id, workflow=workflow, engine=engine,
                             state=RunState.ACCEPTED.value, retries=0, message="",
                             seen_at=self._clock())
        else:
            run.workflow = run.workflow or workflow
            run.engine = run.engine or engine
        return run

    @staticmethod
    def _advance(run: RunFields, state: RunState, *, retries: int | None = None) -> bool:
        """Move ``run`` to ``state`` if that is forward; whether it moved."""
        old = (run.retries, _rank(run.state))
        new = (run.retries if retries is None else retries, _RUN_RANK[state])
        if new <= old:
            return False
        run.state = state.value
        run.retries = new[0]
        return True

    @staticmethod
    def _merge_step(tx: Tx, run_id: str, workflow: str, r: StepRecord, at: float) -> None:
        """Keep ``r`` as the step's record if it is newer than the one kept; keep the highest
        peaks and whether it ever ran out of memory in any case."""
        rank = 3 if r.state.terminal else _STEP_RANK.get(r.state, 0)
        oom = r.failure_class is ir.FailureClass.OOM
        row = tx.step_fields(run_id, r.name, r.key)
        new = row is None
        if row is None:
            row = {"run_id": run_id, "name": r.name, "key": r.key, "oom_seen": False,
                   "oom_peak_memory_bytes": None, "max_peak_cpu": None,
                   "max_peak_memory_bytes": None, "event_at": -1.0, "rank": -1,
                   "attempts": -1, "workflow": "", "failure_reason": ""}
            newer = True
        else:
            newer = (at, r.attempts, rank) > (row["event_at"], row["attempts"], row["rank"])
        if r.peak_memory_bytes is not None:
            row["max_peak_memory_bytes"] = max(row["max_peak_memory_bytes"] or 0,
                                               r.peak_memory_bytes)
        if r.peak_cpu is not None:
            row["max_peak_cpu"] = max(row["max_peak_cpu"] or 0.0, r.peak_cpu)
        if oom:
            row["oom_seen"] = True
            if r.peak_memory_bytes is not None:
                row["oom_peak_memory_bytes"] = max(row["oom_peak_memory_bytes"] or 0,
                                                   r.peak_memory_bytes)
        if newer:
            row.update(
                workflow=workflow or row["workflow"] or "", state=r.state.value,
                attempts=r.attempts, exit_code=r.exit_code, started_at=r.started_at,
                finished_at=r.finished_at, peak_cpu=r.peak_cpu,
                peak_memory_bytes=r.peak_memory_bytes,
                cached=r.cached or r.state is StepState.CACHED, cache_key=r.cache_key,
                message=r.message,
                failure_class=r.failure_class.value if r.failure_class else None,
                failure_reason=r.failure_reason, event_at=at, rank=rank)
        tx.put_step_fields(row, new=new)
        if r.failure_class is not None and r.attempts > 0 and r.state in (
                StepState.FAILED, StepState.RETRYING):
            tx.add_failure({"run_id": run_id, "step": r.name, "key": r.key,
                            "attempt": r.attempts, "workflow": workflow or row["workflow"],
                            "failure_class": r.failure_class.value,
                            "failure_reason": r.failure_reason, "exit_code": r.exit_code,
                            "at": at})

    def _recommend_after(self, tx: Tx, workflow: str, r: StepRecord) -> bool:
        """Note the step for a recommendation at the end of the transaction
        (:meth:`_settle`), when it ended with a measurement or ran out of memory."""
        oom = r.failure_class is ir.FailureClass.OOM
        measured = r.state.terminal and r.peak_memory_bytes is not None
        if not workflow:
            return False
        if measured or oom:
            self._learned(tx).due[(workflow, r.name)] = None
            return False
        if not r.key and r.state in (StepState.SUCCEEDED, StepState.FAILED):
            # finished, nothing measured: only its history of failures may say something
            return self._store_proposals(tx, workflow, r.name,
                                         self._learned_retries(tx, workflow, r.name, ()))
        return False

    def _recommend(self, tx: Tx, workflow: str, step: str) -> bool:
        peaks = tx.run_peaks(workflow, step, self._history_runs)
        proposals: list[_Proposal] = self._resource_proposals(tx, workflow, step)
        ooms = [p for p in peaks if p.oom]
        if ooms:
            killed_at = [m for p in ooms
                         if (m := p.oom_peak_memory_bytes or p.peak_memory_bytes)]
            if killed_at:
                top = max(killed_at)
                proposals.append(_Proposal(
                    RecommendationKind.MEMORY_LIMIT, memory_quantity(top, Fraction(2)),
                    f"out of memory at {_mi(top)} in {len(ooms)} of "
                    f"{_runs(len(peaks))}: 2x the memory it was killed at", len(ooms),
                    ir.FailureClass.OOM))
            proposals.append(_Proposal(
                RecommendationKind.RETRY, str(OOM_RETRY_LIMIT),
                f"out of memory in {len(ooms)} of {_runs(len(peaks))}: retry OOM "
                "failures (memory escalates per attempt)", len(ooms), ir.FailureClass.OOM))
        proposals = self._learned_retries(tx, workflow, step, proposals)
        return self._store_proposals(tx, workflow, step, proposals)

    def _learned_retries(self, tx: Tx, workflow: str, step: str,
                         proposals: Sequence[_Proposal]) -> list[_Proposal]:
        """``proposals`` with the retry limit and back-off learned from the step's history of
        failures (:func:`couler_monitor.retries.learn`). An OOM retry proposal is kept when
        it allows as many retries: a learned limit never takes memory escalation away."""
        history = [_step_run(row, failed)
                   for row, failed in tx.step_history(workflow, step, self._history_runs)]
        advice = retries.learn(history)
        if advice is None:
            return list(proposals)
        out = [p for p in proposals if p.kind is not RecommendationKind.RETRY]
        oom = next((p for p in proposals if p.kind is RecommendationKind.RETRY), None)
        kept = tx.recommendation(workflow, step, RecommendationKind.RETRY.value) \
            if oom is None else None
        if oom is not None and int(oom.value) >= advice.limit:
            out.append(oom)
        elif (kept is not None and kept.failure_class == ir.FailureClass.OOM.value
              and kept.value.isdigit() and int(kept.value) >= advice.limit):
            pass  # the stored OOM retries stay (this event measured nothing to renew them)
        else:
            out.append(_Proposal(RecommendationKind.RETRY, str(advice.limit), advice.reason,
                                 advice.based_on, advice.failure_class))
        if advice.backoff_seconds is not None:
            out.append(_Proposal(RecommendationKind.RETRY_BACKOFF, str(advice.backoff_seconds),
                                 advice.backoff_reason, advice.based_on, advice.failure_class))
        return out

    def _store_proposals(self, tx: Tx, workflow: str, step: str,
                         proposals: Iterable[_Proposal]) -> bool:
        changed = False
        for p in proposals:
            row = tx.recommendation(workflow, step, p.kind.value)
            fc = p.failure_class.value if p.failure_class else None
            if row is not None and row.value == p.value:
                row.reason, row.based_on, row.failure_class = p.reason, p.based_on, fc
                _keep_evidence(row, p.evidence)
                continue
            if row is None:
                row = RecommendationRow(workflow=workflow, step=step, kind=p.kind.value)
            row.value = p.value
            row.id = recommendation_id(workflow, step, p.kind, p.value)
            row.reason, row.based_on, row.failure_class = p.reason, p.based_on, fc
            _keep_evidence(row, p.evidence)
            row.created_at = self._clock()
            row.published = False
            tx.add(row)
            changed = True
        return changed

    # ------------------------------------------------------------------ the recommender

    def _learned(self, tx: Tx) -> _Learned:
        work = tx.scratch.get("recommender")
        if work is None:
            work = tx.scratch["recommender"] = _Learned({}, set(), {})
        assert isinstance(work, _Learned)
        return work

    def _history(self, tx: Tx, workflow: str, step: str) -> StepHistory:
        """The step's histograms, read once per transaction. Stored ones that cannot be
        read, and none at all for a step with stored history (recorded before the
        recommender existed), are rebuilt from the stored samples and steps."""
        work = self._learned(tx)
        key = (workflow, step)
        history = work.histories.get(key)
        if history is not None:
            return history
        row = tx.recommender_state(workflow, step)
        if row is not None:
            try:
                history = StepHistory.from_json(row.state)
            except StateError as exc:
                log.warning("workflow %r, step %r: the stored resource histograms cannot be "
                            "read (%s); rebuilding them from the stored samples",
                            workflow, step, exc)
                history = self._rebuild(tx, workflow, step)
                work.dirty.add(key)
        else:
            history = self._rebuild(tx, workflow, step)
            if history.runs or history.samples:
                log.info("workflow %r, step %r: resource histograms built from %d stored "
                         "sample(s) of %d run(s)", workflow, step, history.samples,
                         history.runs)
                work.dirty.add(key)
        work.histories[key] = history
        return history

    def _rebuild(self, tx: Tx, workflow: str, step: str) -> StepHistory:
        """The step's histograms from what is stored (its samples and step records); the
        per-run rows are written anew to match."""
        history = StepHistory.new(self._config.half_life)
        tx.forget_recommender_runs(workflow, step)
        runs: dict[str, list[Any]] = {}  # run -> [peak, at, ended]
        for run_id, at_ns, cpu, memory, seconds in tx.sample_series(workflow, step,
                                                                    _REBUILD_SAMPLES):
            at = _finite(at_ns / 1e9 if isinstance(at_ns, int) else None)
            if at is None:
                continue
            if isinstance(cpu, float | int):
                history.add_cpu(at, float(cpu), _finite(seconds) or 0.0)
            got = runs.setdefault(run_id, [None, at, False])
            if isinstance(memory, int) and 0 <= memory <= _INT64:
                got[0] = max(got[0] or 0, memory)
        for s in tx.steps_matching(run_id="", workflow=workflow, step=step):
            at = _finite(s.finished_at) or _finite(s.event_at) or 0.0
            got = runs.setdefault(s.run_id, [None, at, False])
            peak: float | None = _bytes(s.max_peak_memory_bytes)
            if s.oom_seen and _bytes(s.oom_peak_memory_bytes):
                peak = max(peak or 0, oom_bump(float(_bytes(s.oom_peak_memory_bytes) or 0)))
            if peak:
                got[0] = max(got[0] or 0, peak)
            got[2] = got[2] or s.state in _MEASURED_STATES
        for run_id, (peak, at, ended) in runs.items():
            if peak:
                history.set_memory_peak(at, float(peak))
            counted = bool(ended and peak)
            if counted:
                history.count_run()
            tx.add(RecommenderRunRow(workflow=workflow, step=step, run_id=run_id,
                                     memory_bytes=float(peak) if peak else None,
                                     at=at if peak else None, ended=bool(ended),
                                     counted=counted))
        return history

    def _learn_sample(self, tx: Tx, history: StepHistory, row: SampleRow) -> None:
        """A newly stored sample: its CPU into the CPU histogram, its memory into its
        run's peak. The step is recommended for again when its run has ended (a sample
        that came late); the samples of a running step wait for its end."""
        at = row.at_ns / 1e9
        history.add_cpu(at, row.cpu, row.interval_seconds or 0.0)
        ended = self._run_peak(tx, history, (row.workflow, row.step, row.run_id), at=at,
                               value=float(row.memory_bytes) if row.memory_bytes > 0
                               else None)[1]
        work = self._learned(tx)
        work.dirty.add((row.workflow, row.step))
        if ended:
            work.due[(row.workflow, row.step)] = None

    def _learn_step(self, tx: Tx, run_id: str, workflow: str, r: StepRecord,
                    when: float) -> None:
        """A step record: its memory peak (bumped up when it ran out of memory) into its
        run's peak; a run counts once its step ended with a measurement."""
        oom = r.failure_class is ir.FailureClass.OOM
        ended = r.state in _MEASURED
        peak = r.peak_memory_bytes
        if not workflow:
            return
        if peak is None or peak <= 0:
            # Nothing measured here: only the end of a run whose samples came first counts
            # (one look-up; a step nobody measured costs no more).
            if not ended or tx.recommender_run(workflow, r.name, run_id) is None:
                return
            value = None
        else:
            value = oom_bump(float(peak)) if oom else float(peak)
        history = self._history(tx, workflow, r.name)
        at = _finite(r.finished_at) or when
        if self._run_peak(tx, history, (workflow, r.name, run_id), at=at, value=value,
                          ended=ended)[0]:
            self._learned(tx).dirty.add((workflow, r.name))

    def _run_peak(self, tx: Tx, history: StepHistory, run: tuple[str, str, str], *,
                  at: float, value: float | None, ended: bool = False) -> tuple[bool, bool]:
        """Raise the memory peak of one run of a step to ``value`` (the old one taken out of
        the histogram, the new one put at the same time); count the run once it ended with a
        peak. ``run`` is (workflow, step, run id). Whether the histograms changed, and
        whether the run has ended."""
        workflow, step, run_id = run
        row = tx.recommender_run(workflow, step, run_id)
        if row is None:
            # A sample after its step's end (another consumer) finds the end stored.
            ended = ended or any(s.state in _MEASURED_STATES for s in tx.steps_matching(
                run_id=run_id, workflow="", step=step))
            row = RecommenderRunRow(workflow=workflow, step=step, run_id=run_id,
                                    memory_bytes=None, at=None, ended=False, counted=False)
            tx.add(row)
        previous, put_at = _finite(row.memory_bytes), _finite(row.at)
        if previous is not None and (previous < 0 or put_at is None):
            previous = None  # a damaged row: start the run's peak anew
        changed = False
        if value is not None and value > (previous or 0.0):
            put_at = put_at if previous is not None and put_at is not None else at
            history.set_memory_peak(put_at, value, previous)
            row.memory_bytes, row.at = value, put_at
            changed = True
        if ended and not row.ended:
            row.ended = True
        if row.ended and row.memory_bytes is not None and not row.counted:
            row.counted = True
            history.count_run()
            changed = True
        return changed, bool(row.ended)

    def _settle(self, tx: Tx) -> bool:
        """The end of a transaction: write back the histograms it changed, and recommend
        for each step it learned about. Whether a recommendation changed."""
        work = tx.scratch.get("recommender")
        if not isinstance(work, _Learned):
            return False
        changed = False
        for workflow, step in work.due:
            changed = self._recommend(tx, workflow, step) or changed
        now = self._clock()
        for workflow, step in sorted(work.dirty):  # after: recommending may rebuild one
            text = work.histories[(workflow, step)].to_json()
            row = tx.recommender_state(workflow, step)
            if row is None:
                tx.add(RecommenderStateRow(workflow=workflow, step=step, state=text,
                                           updated_at=now))
            else:
                row.state, row.updated_at = text, now
        tx.scratch.pop("recommender", None)
        return changed

    def _resource_proposals(self, tx: Tx, workflow: str, step: str) -> list[_Proposal]:
        """``memory_request`` and ``cpu_request`` from the step's histograms; the current
        value is kept unless the target moved enough (hysteresis)."""
        est = estimate(self._history(tx, workflow, step), self._config)
        out = []
        for kind, e in ((RecommendationKind.MEMORY_REQUEST, est.memory),
                        (RecommendationKind.CPU_REQUEST, est.cpu)):
            if e is None:
                continue
            row = tx.recommendation(workflow, step, kind.value)
            current = _quantity(row.value) if row is not None else None
            show = _memory if kind is RecommendationKind.MEMORY_REQUEST else _cores
            quantity = (_memory_value if kind is RecommendationKind.MEMORY_REQUEST
                        else _cpu_value)
            target = quantity(e.target)
            reason = _reason(e, show, self._config)
            if row is not None and current is not None and not should_update(
                    current, e, self._config.change_threshold):
                value = row.value
                if value != target:
                    reason += (f"; {value} kept: within "
                               f"{self._config.change_threshold:.0%} of the target and "
                               "inside the bounds")
            else:
                value = target
            out.append(_Proposal(kind, value, reason, e.runs, evidence=_Evidence(
                target, quantity(e.lower), quantity(e.upper), e.percentile, e.runs,
                e.samples, e.span)))
        return out

    def _plan_requests(self, tx: Tx, run_id: str, workflow: str,
                       requests: Mapping[str, ir.Resources], at: float) -> None:
        stored = {r.step: r for r in tx.step_requests(workflow, "")}
        marker = stored.get("")
        if marker is not None and (_finite(marker.updated_at) or 0.0) > at:
            return  # an older plan, delivered late
        tx.replace_step_requests(workflow, [
            StepRequestRow(workflow=workflow, step=name, cpu_request=r.cpu_request,
                           memory_request=r.memory_request, cpu_limit=r.cpu_limit,
                           memory_limit=r.memory_limit, run_id=run_id, updated_at=at)
            for name, r in sorted({"": ir.Resources(), **requests}.items())])


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _failure_class(value: str | None) -> ir.FailureClass | None:
    try:
        return ir.FailureClass(value) if value else None
    except ValueError:  # a damaged row: an unknown class
        return None


def _step_run(row: Any, failed: Sequence[FailureRow]) -> retries.StepRun:
    """One run of a step for :func:`couler_monitor.retries.learn`."""
    return retries.StepRun(
        run_id=row.run_id, succeeded=row.state == StepState.SUCCEEDED.value,
        attempts=max(0, row.attempts), finished_at=row.finished_at or row.event_at,
        failures=tuple(retries.AttemptFailure(f.attempt, _failure_class(f.failure_class), f.at)
                       for f in failed))
def _finite(value: object) -> float | None:
    """A stored number that is one (None for garbage, NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _bytes(value: object) -> int | None:
    return value if isinstance(value, int) and 0 <= value <= _INT64 else None


def _quantity(text: str) -> float | None:
    try:
        value = float(ir.parse_quantity(text))
    except (ValueError, TypeError, ArithmeticError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def _memory_value(n: float) -> str:
    """Bytes as whole Mi, rounded up."""
    return memory_quantity(max(0, math.ceil(n)), Fraction(1))


def _cpu_value(cores: float) -> str:
    """Cores as whole millicores, rounded up."""
    return cpu_quantity(cores, Fraction(1))


def _memory(n: float) -> str:
    """Bytes as the request they would be (whole Mi, rounded up)."""
    return _memory_value(n)


def _cores(c: float) -> str:
    """Cores as the request they would be (whole millicores, rounded up)."""
    return _cpu_value(c)


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def _reason(e: ResourceEstimate, show: Callable[[float], str],
            config: RecommenderConfig) -> str:
    """Why, in words: e.g. "p95 of 12 runs' peaks 612Mi, +15% margin x1.04 for thin
    evidence = 734Mi; range 520Mi..900Mi; 3d 4h of history"."""
    pct = f"p{e.percentile * 100:g}"
    what = (f"{pct} of {_runs(e.runs)}' peaks" if e.resource == "memory"
            else f"{pct} of {e.samples} sample{'s' if e.samples != 1 else ''} over "
                 f"{_runs(e.runs)}")
    confidence = e.factor / (1 + config.safety_margin)
    text = (f"{what} {show(e.observed)}, +{config.safety_margin:.0%} margin"
            + (f" x{confidence:.2f} for thin evidence" if confidence >= 1.005 else "")
            + f" = {show(e.observed * e.factor)}")
    if e.floored:
        text += f", raised to the minimum {show(e.target)}"
    return (text + f"; range {show(e.lower)}..{show(e.upper)}; "
            f"{_span(e.span)} of history")


def _keep_evidence(row: RecommendationRow, e: _Evidence | None) -> None:
    if e is None:
        return
    row.target, row.lower_bound, row.upper_bound = e.target, e.lower, e.upper
    row.percentile, row.runs, row.samples = e.percentile, e.runs, min(e.samples, _INT64)
    row.span_seconds = e.span


def _requests(q: StepRequestRow) -> StepRequests:
    def text(value: object) -> str:
        return value if isinstance(value, str) else ""

    return StepRequests(q.step, ir.Resources(
        cpu_request=text(q.cpu_request), memory_request=text(q.memory_request),
        cpu_limit=text(q.cpu_limit), memory_limit=text(q.memory_limit)),
        run_id=text(q.run_id), at=_time(_finite(q.updated_at)))


def _recommendation(r: RecommendationRow) -> Recommendation | None:
    """The stored recommendation; None (logged) when its row is damaged."""
    try:
        return Recommendation(
            workflow=r.workflow, step=r.step, kind=RecommendationKind(r.kind), value=r.value,
            reason=r.reason, based_on_samples=r.based_on, created_at=r.created_at,
            failure_class=ir.FailureClass(r.failure_class) if r.failure_class else None,
            id=r.id, target=_text(r.target), lower_bound=_text(r.lower_bound),
            upper_bound=_text(r.upper_bound), percentile=_finite(r.percentile) or 0.0,
            runs=max(0, min(_bytes(r.runs) or 0, _INT32)),
            samples=_bytes(r.samples) or 0, span_seconds=_finite(r.span_seconds) or 0.0)
    except (ValueError, TypeError) as exc:
        log.error("workflow %r, step %r: a stored recommendation cannot be read (%s)",
                  r.workflow, r.step, exc)
        return None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _state(kind: type[E], value: str, default: E, damaged: list[str], field: str) -> E:
    """``kind(value)``; ``default`` (noted in ``damaged``) when the stored value is not one."""
    try:
        return kind(value)
    except ValueError:
        damaged.append(field)
        return default


def _damaged(message: str, damaged: list[str]) -> str:
    if not damaged:
        return message
    said = f"the stored record is damaged ({', '.join(damaged)} could not be read)"
    return f"{said}: {message}" if message else said


def _time(value: float | None) -> float | None:
    """A stored time a record can carry (None when it is not one)."""
    return value if value is None or 0 <= value <= _LAST_SECOND else None


def _rollup(r: RollupRow) -> UtilizationRollup:
    """A stored rollup (its numbers kept within what a record carries)."""
    count = max(0, min(int(r.count or 0), _INT32))
    return UtilizationRollup(r.run_id, r.workflow, r.step, float(r.minute),
                             float(r.cpu_sum) / count if count else 0.0, float(r.cpu_max),
                             int(r.memory_max), count, r.key,
                             max(0, min(int(r.attempt), _INT32)))


def _step(s: StepRow) -> StepRecord:
    damaged: list[str] = []
    state = _state(StepState, s.state, StepState.FAILED, damaged, "state")
    failure = (_state(ir.FailureClass, s.failure_class, ir.FailureClass.INFRA, damaged,
                      "failure_class") if s.failure_class else None)
    return StepRecord(
        name=s.name, state=state, key=s.key, attempts=max(0, min(s.attempts, _INT32)),
        exit_code=s.exit_code, started_at=_time(s.started_at), finished_at=_time(s.finished_at),
        peak_cpu=s.peak_cpu, peak_memory_bytes=s.peak_memory_bytes, cache_key=s.cache_key,
        cached=bool(s.cached), message=_damaged(s.message or "", damaged),
        failure_class=failure, failure_reason=s.failure_reason or "")


def _run(r: RunRow, steps: Sequence[StepRow]) -> Run:
    damaged: list[str] = []
    state = _state(RunState, r.state, RunState.FAILED, damaged, "state")
    return Run(run_id=r.run_id, state=state, workflow=r.workflow, engine=r.engine,
               steps=tuple(_step(s) for s in steps), created_at=_time(r.created_at),
               started_at=_time(r.started_at), finished_at=_time(r.finished_at),
               message=_damaged(r.message or "", damaged),
               retries=max(0, min(r.retries, _INT32)))


def _rank(value: str) -> int:
    """How far a stored run state is; a damaged one is the least (new events fix it)."""
    try:
        return _RUN_RANK[RunState(value)]
    except ValueError:
        return -1
