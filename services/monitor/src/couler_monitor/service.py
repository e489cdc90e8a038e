"""The monitor's use cases: record what runs and steps did, and recommend what they need.

:class:`Monitor` works on record types (:mod:`couler_runtime.rpc.records`) and knows nothing
of gRPC or NATS: events reach it decoded, and recommendations leave through the
``publish`` callable given at construction.
It is the facade: the recommender's part of each transaction is in
:mod:`couler_monitor.recommendations`, the utilization tiers (retention, queries) in
:mod:`couler_monitor.utilization`, and reading stored rows into records in
:mod:`couler_monitor.rows`.

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
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from couler import ir
from couler.engines.base import StepState
from couler.errors import NotFoundError, UserError
from couler_monitor.recommendations import MIN_CPU, MIN_MEMORY_BYTES, Recommendations
from couler_monitor.recommender import RecommenderConfig
from couler_monitor.rows import _finite, _recommendation, _requests, _run
from couler_monitor.store import (
    MonitorStore,
    RecommendationRow,
    RunFields,
    SampleRow,
    StepRequestRow,
    StepRow,
    Tx,
)
from couler_monitor.utilization import Maintenance, compact, read_utilization
from couler_runtime import metrics
from couler_runtime.metrics import DURATION_BUCKETS
from couler_runtime.rpc.records import (
    Recommendation,
    RecommendationReport,
    Run,
    RunState,
    StepRecord,
    Utilization,
    UtilizationSample,
)

__all__ = [
    "DEFAULT_ROLLUP_RETENTION",
    "DEFAULT_SAMPLE_LIMIT",
    "DEFAULT_SAMPLE_RETENTION",
    "MAX_SAMPLE_LIMIT",
    "Change",
    "Monitor",
    "Publisher",
    "RunPage",
    "RunQuery",
    "RunSummary",
    "StepDetail",
]

DEFAULT_SAMPLE_LIMIT = 1000
DEFAULT_SAMPLE_RETENTION = 24 * 3600.0  # seconds raw samples are kept
DEFAULT_ROLLUP_RETENTION = 30 * 86400.0  # seconds the 1-minute rollups are kept
COMPACT_BATCH = 5000  # raw samples folded into rollups per transaction
MAX_SAMPLE_LIMIT = 10_000
_MAX_RUNS_LISTED = 500
_QUICK_CHANGES = 32  # changes committed on the event loop at most (a quick store)
_LAST_SAMPLE_SECOND = (2**63 - 1) / 1e9  # a sample's time is stored in ns (a 64-bit integer)

Publisher = Callable[[Recommendation], Awaitable[None]]
Change = Callable[[Tx], bool]
"""One checked event's writes inside a transaction; True when what it wrote may have changed
a recommendation (a new sample, a changed value): :meth:`Monitor.apply` then publishes the
pending ones."""

_RUN_RANK = {RunState.ACCEPTED: 0, RunState.PLANNING: 1, RunState.PENDING: 2,
             RunState.RUNNING: 3, RunState.SUCCEEDED: 4, RunState.FAILED: 4,
             RunState.CANCELLED: 4}
_STEP_RANK = {StepState.PENDING: 0, StepState.RUNNING: 1, StepState.RETRYING: 2}


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
        self._recommendations = Recommendations(config, history_runs, clock)
        self._clock = clock
        # One writer at a time in this process: concurrent handlers would otherwise race on
        # the same rows (and SQLite allows one writer anyway).
        self._lock = asyncio.Lock()
        self._outbox_dirty = True  # until a flush succeeded, assume something is left
        # What the transaction being applied observed, counted once it commits: runs
        # that moved to a state (state, engine), steps that finished (state, seconds).
        self._moves: list[tuple[str, str]] = []
        self._finished_steps: list[tuple[str, float]] = []
        meter = metrics.meter("couler.monitor")
        self._runs_metric = meter.create_counter(
            "couler.runs", unit="{run}",
            description="Runs that reached a state (accepted runs are counted as they "
                        "reach planning): state, engine")
        self._step_duration = meter.create_histogram(
            "couler.step.duration", unit="s",
            description="Steps that finished: seconds from start to end, by final state",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self._recommended = meter.create_counter(
            "couler.recommendations", unit="{recommendation}",
            description="Recommendations published to the optimizer: kind")

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
            self._moves.clear()
            self._finished_steps.clear()
            with self._store.transaction() as tx:
                for change in changes:
                    changed = change(tx) or changed
                changed = self._recommendations.settle(tx) or changed
            return changed

        async with self._lock:
            if self._store.quick and len(changes) <= _QUICK_CHANGES:
                changed = txn()
            else:
                changed = await asyncio.to_thread(txn)
            self._count_committed()
            # Also when an earlier publish failed (or a crash left one): send it now.
            if changed or self._outbox_dirty:
                await self._flush()

    def _count_committed(self) -> None:
        for state, engine in self._moves:
            self._runs_metric.add(1, {"state": state, "engine": engine})
        for state, seconds in self._finished_steps:
            self._step_duration.record(seconds, {"state": state})
        self._moves.clear()
        self._finished_steps.clear()

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
                self._moves.append((RunState.RUNNING.value, str(run.engine or "")))
            if (record.state.terminal and record.started_at is not None
                    and record.finished_at is not None):
                self._finished_steps.append(
                    (record.state.value, max(0.0, record.finished_at - record.started_at)))
            if record.started_at is not None and (run.started_at is None
                                                  or record.started_at < run.started_at):
                run.started_at = record.started_at
            tx.save_run(run)
            name = str(run.workflow or "")
            # Learned before the record is stored: histograms rebuilt from the stored
            # steps (none yet, or damaged) must not count it twice.
            self._recommendations.learn_step(tx, run_id, name, record, when)
            self._merge_step(tx, run_id, name, record, when)
            return self._recommendations.recommend_after(tx, name, record)

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
            history = (self._recommendations.history(tx, row.workflow, row.step)
                       if row.workflow else None)
            new = tx.insert_sample(row)
            if new and history is not None:  # fed once, when new
                self._recommendations.learn_sample(tx, history, row)
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
                             at: float | None = None, plan: bytes = b"") -> None:
        """The run was generated or optimized (its workflow's name is known)."""
        await self.apply((self.planned_change(run_id, workflow=workflow, engine=engine,
                                              requests=requests, at=at, plan=plan),))

    def planned_change(self, run_id: str, *, workflow: str, engine: str,
                       requests: Mapping[str, ir.Resources] | None = None,
                       at: float | None = None, plan: bytes = b"") -> Change:
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
            if plan:
                tx.put_plan(run_id, plan, at if at is not None else self._clock())
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
                self._moves.append((RunState.PENDING.value, str(run.engine or "")))
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
                self._recommendations.learn_step(tx, run_id, run.workflow, step, when)
                self._merge_step(tx, run_id, run.workflow, step, when)
                changed = self._recommendations.recommend_after(tx, run.workflow, step) or changed
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
        return await compact(self._store, self._lock, now=self._clock(),
                             sample_retention=self._sample_retention,
                             rollup_retention=self._rollup_retention, batch=batch)

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
                return read_utilization(tx, run_id=run_id, workflow=workflow, step=step,
                                        limit=limit)

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

    async def run_page(self, query: RunQuery) -> RunPage:
        """One page of the runs matching ``query`` (without their step records: counts)."""
        limit = max(1, min(query.limit, _MAX_RUNS_LISTED))

        def read() -> RunPage:
            with self._store.transaction() as tx:
                rows, total = tx.find_runs(
                    state=query.state, workflow=query.workflow, engine=query.engine,
                    since=query.since, until=query.until, text=query.text,
                    offset=max(0, query.offset), limit=limit)
                counts = tx.step_counts([r.run_id for r in rows])
                workflows, engines = tx.filter_values()
                listed = tuple(
                    RunSummary(_run(r, ()), *counts.get(r.run_id, (0, 0, 0))) for r in rows)
                return RunPage(listed, total, tuple(workflows), tuple(engines))

        return await asyncio.to_thread(read)

    async def plan(self, run_id: str) -> bytes | None:
        """The protobuf of the workflow of the run's latest plan; None when none was seen."""
        def read() -> bytes | None:
            with self._store.transaction() as tx:
                row = tx.plan(run_id)
                if row is None or not isinstance(row.workflow, bytes | memoryview):
                    return None  # none, or a damaged row (the console draws the records)
                return bytes(row.workflow)

        return await asyncio.to_thread(read)

    async def step_details(self, run_id: str) -> dict[tuple[str, str], StepDetail]:
        """Per (step, key) of the run: its outputs, stored artifacts and cache savings."""
        def read() -> dict[tuple[str, str], StepDetail]:
            with self._store.transaction() as tx:
                return {(s.name, s.key): StepDetail(_json_map(s.outputs),
                                                    _json_map(s.artifacts),
                                                    _finite(s.cache_saved_seconds) or 0.0)
                        for s in tx.steps_of([run_id])}

        return await asyncio.to_thread(read)

    async def computed_seconds(self, workflow: str, names: Sequence[str]) -> dict[str, float]:
        """Per step of ``workflow``: how long its latest computed (not cached) success took."""
        def read() -> dict[str, float]:
            with self._store.transaction() as tx:
                return tx.last_computed(workflow, names)

        return await asyncio.to_thread(read)

    async def cache_totals(self) -> tuple[int, int, int, float]:
        """Over every step record kept: (records, reused from the cache, bytes of the
        reused artifacts, compute saved in seconds, as the engines reported it)."""
        def read() -> tuple[int, int, int, float]:
            with self._store.transaction() as tx:
                total, hits, saved, artifacts = tx.cache_totals()
            size = sum(_size(a) for text in artifacts for a in _json_map(text).values())
            return total, hits, size, saved

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
            if rec is not None:
                self._recommended.add(1, {"kind": row.kind})
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

    def _advance(self, run: RunFields, state: RunState, *, retries: int | None = None) -> bool:
        """Move ``run`` to ``state`` if that is forward (counted once committed); whether
        it moved."""
        old = (run.retries, _rank(run.state))
        new = (run.retries if retries is None else retries, _RUN_RANK[state])
        if new <= old:
            return False
        run.state = state.value
        run.retries = new[0]
        self._moves.append((state.value, str(run.engine or "")))
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
                failure_reason=r.failure_reason, event_at=at, rank=rank,
                outputs=json.dumps(dict(r.outputs), sort_keys=True),
                artifacts=json.dumps({name: {"digest": a.digest, "size_bytes": a.size_bytes,
                                             "uri": a.uri}
                                      for name, a in r.artifacts.items()}, sort_keys=True),
                cache_saved_seconds=r.cache_saved_seconds or None)
        tx.put_step_fields(row, new=new)
        if r.failure_class is not None and r.attempts > 0 and r.state in (
                StepState.FAILED, StepState.RETRYING):
            tx.add_failure({"run_id": run_id, "step": r.name, "key": r.key,
                            "attempt": r.attempts, "workflow": workflow or row["workflow"],
                            "failure_class": r.failure_class.value,
                            "failure_reason": r.failure_reason, "exit_code": r.exit_code,
                            "at": at})

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


@dataclasses.dataclass(frozen=True, slots=True)
class RunQuery:
    """The console's filters over the runs: exact state, workflow and engine, a time range
    (when the monitor first heard of the run), text in the id, workflow or message."""

    state: str = ""
    workflow: str = ""
    engine: str = ""
    since: float | None = None
    until: float | None = None
    text: str = ""
    offset: int = 0
    limit: int = 50


@dataclasses.dataclass(frozen=True, slots=True)
class RunSummary:
    """A listed run (its record without steps) and its step records' counts."""

    run: Run
    steps: int
    done: int
    cached: int


@dataclasses.dataclass(frozen=True, slots=True)
class RunPage:
    """One page of runs, how many match in all, and the values the filters offer."""

    runs: tuple[RunSummary, ...]
    total: int
    workflows: tuple[str, ...]
    engines: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class StepDetail:
    """What the monitor keeps of a step record beyond its state."""

    outputs: dict[str, Any]
    artifacts: dict[str, Any]
    cache_saved_seconds: float


def _size(artifact: object) -> int:
    """A stored artifact's ``size_bytes``; 0 when it has none (or a damaged one)."""
    size = artifact.get("size_bytes") if isinstance(artifact, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


def _json_map(text: object) -> dict[str, Any]:
    """A stored JSON object; {} for anything else (a damaged row)."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _rank(value: str) -> int:
    """How far a stored run state is; a damaged one is the least (new events fix it)."""
    try:
        return _RUN_RANK[RunState(value)]
    except ValueError:
        return -1
