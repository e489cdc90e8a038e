"""The monitor's history in SQL: runs, step records, utilization samples, recommendations.

Tables (created by ``couler_monitor/migrations``, version table ``alembic_version_monitor``):

* ``monitor_runs`` -- one row per run: workflow, engine, state, times, message;
* ``monitor_steps`` -- the latest record per (run, step, key), with the ordering key
  (``event_at``, ``attempts``, ``rank``) that decides which record is the latest, the highest
  peaks over all its records (attempts), and a sticky ``oom_seen`` flag (an out-of-memory
  attempt is remembered after the step later succeeds);
* ``monitor_samples`` -- utilization samples (the raw time series), unique per measurement
  (a redelivered sample is stored once), kept for the raw retention;
* ``monitor_sample_rollups`` -- older samples compacted into one row per step execution and
  minute: count, CPU sum (mean = sum / count) and highest, highest memory; kept for the
  rollup retention (:meth:`Tx.compact_samples`, :meth:`Tx.expire_rollups`);
* ``monitor_recommendations`` -- the current recommendation per (workflow, step, kind); its
  ``published`` flag is the outbox: a changed value is committed unpublished, published on
  ``couler.feedback.<workflow>`` after the commit, then flagged. Resource recommendations
  also keep their evidence (the recommender's latest target, bounds, percentile, runs,
  samples, time span);
* ``monitor_recommender_state`` -- per (workflow, step), the recommender's histograms
  (:class:`couler_monitor.recommender.StepHistory` as JSON), updated in the transaction
  that records the sample or step end they learned from;
* ``monitor_recommender_runs`` -- per (workflow, step, run), the memory peak that run put
  in the histogram (so that a higher one replaces it, and a redelivery adds nothing) and
  whether the run was counted;
* ``monitor_step_requests`` -- per (workflow, step), the resources its latest plan asked
  for (from ``couler.workflow.optimized``): the "current" requests ``couler recommend``
  shows;
* ``monitor_run_plans`` -- per run, the workflow of its latest plan (the protobuf of
  ``couler.workflow.optimized``'s workflow): the console draws the run's graph from it and
  resubmits it.

:class:`MonitorStore` hands out :class:`Tx` objects, one per transaction, with primitive
operations; the use cases (:mod:`couler_monitor.service`) compose them. Everything here is
synchronous: the service calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import BigInteger, Boolean, Float, Integer, LargeBinary, String, Text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from couler.errors import ConflictError, RetryableError
from couler_runtime.store import (
    is_local,
    make_engine,
    make_session_factory,
    migrate,
    session_scope,
)

__all__ = [
    "MIGRATIONS",
    "SERVICE",
    "FailureRow",
    "MonitorStore",
    "RecommendationRow",
    "RecommenderRunRow",
    "RecommenderStateRow",
    "RollupRow",
    "RunFields",
    "RunPlanRow",
    "RunRow",
    "SampleRow",
    "StepRequestRow",
    "StepRow",
    "Tx",
]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SERVICE = "monitor"


class Base(DeclarativeBase):
    """The monitor's tables."""


class RunRow(Base):
    __tablename__ = "monitor_runs"

    run_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    workflow: Mapped[str] = mapped_column(String(255), default="")
    engine: Mapped[str] = mapped_column(String(64), default="")
    state: Mapped[str] = mapped_column(String(16))
    retries: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # When a step event showed the run running again after it had finished (a Retry).
    reopened_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    # When the monitor first heard of it: orders the dashboard.
    seen_at: Mapped[float] = mapped_column(Float, index=True)


class StepRow(Base):
    __tablename__ = "monitor_steps"

    run_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    workflow: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_cpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cached: Mapped[bool] = mapped_column(Boolean)
    cache_key: Mapped[str] = mapped_column(String(255))
    message: Mapped[str] = mapped_column(Text)
    failure_class: Mapped[str | None] = mapped_column(String(16), nullable=True)
    failure_reason: Mapped[str] = mapped_column(Text, default="")
    # The highest peaks over all of its records (attempts), for the recommendations.
    max_peak_cpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    oom_seen: Mapped[bool] = mapped_column(Boolean, default=False)
    oom_peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    event_at: Mapped[float] = mapped_column(Float)
    rank: Mapped[int] = mapped_column(Integer)
    # The latest record's outputs ({name: value}) and stored artifacts ({name: {digest,
    # size_bytes, uri}}) as JSON, and the compute its cache reuse saved (seconds).
    outputs: Mapped[str] = mapped_column(Text, default="{}")
    artifacts: Mapped[str] = mapped_column(Text, default="{}")
    cache_saved_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)


class SampleRow(Base):
    __tablename__ = "monitor_samples"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "step", "key", "attempt", "at_ns",
                            name="uq_monitor_samples_measurement"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"),
                                    primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(255))
    workflow: Mapped[str] = mapped_column(String(255))
    step: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(255))
    attempt: Mapped[int] = mapped_column(Integer)
    at_ns: Mapped[int] = mapped_column(BigInteger)
    cpu: Mapped[float] = mapped_column(Float)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    interval_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)


class RollupRow(Base):
    __tablename__ = "monitor_sample_rollups"

    run_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    step: Mapped[str] = mapped_column(String(255), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch s, whole min
    workflow: Mapped[str] = mapped_column(String(255))
    count: Mapped[int] = mapped_column(Integer)
    cpu_sum: Mapped[float] = mapped_column(Float)
    cpu_max: Mapped[float] = mapped_column(Float)
    memory_max: Mapped[int] = mapped_column(BigInteger)


class FailureRow(Base):
    """One failed attempt of a step (a FAILED or RETRYING record with a failure class):
    :class:`StepRow` keeps only the latest record, the learned retries need every attempt."""

    __tablename__ = "monitor_step_failures"
    __table_args__ = (sa.Index("ix_monitor_step_failures_workflow_step", "workflow", "step"),)

    run_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    step: Mapped[str] = mapped_column(String(255), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    workflow: Mapped[str] = mapped_column(String(255))
    failure_class: Mapped[str | None] = mapped_column(String(16), nullable=True)
    failure_reason: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    at: Mapped[float] = mapped_column(Float)


class RecommendationRow(Base):
    __tablename__ = "monitor_recommendations"

    workflow: Mapped[str] = mapped_column(String(255), primary_key=True)
    step: Mapped[str] = mapped_column(String(255), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[str] = mapped_column(String(64))
    id: Mapped[str] = mapped_column(String(700))
    reason: Mapped[str] = mapped_column(Text)
    based_on: Mapped[int] = mapped_column(Integer)
    failure_class: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    published: Mapped[bool] = mapped_column(Boolean, index=True)
    # The evidence of a resource recommendation (None for the other kinds): the
    # recommender's latest target and bounds (quantities; ``value`` follows ``target`` only
    # past the hysteresis), the target's percentile, runs and samples, and the seconds the
    # histogram covers.
    target: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lower_bound: Mapped[str | None] = mapped_column(String(64), nullable=True)
    upper_bound: Mapped[str | None] = mapped_column(String(64), nullable=True)
    percentile: Mapped[float | None] = mapped_column(Float, nullable=True)
    runs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    samples: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    span_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)


class RecommenderStateRow(Base):
    __tablename__ = "monitor_recommender_state"

    workflow: Mapped[str] = mapped_column(String(255), primary_key=True)
    step: Mapped[str] = mapped_column(String(255), primary_key=True)
    state: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)


class RecommenderRunRow(Base):
    __tablename__ = "monitor_recommender_runs"

    workflow: Mapped[str] = mapped_column(String(255), primary_key=True)
    step: Mapped[str] = mapped_column(String(255), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    # The value this run put in the memory histogram (bytes, OOM bump included) and the
    # time it was put at; None until the run has a measured peak.
    memory_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)
    at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended: Mapped[bool] = mapped_column(Boolean, default=False)
    counted: Mapped[bool] = mapped_column(Boolean, default=False)


class RunPlanRow(Base):
    """The workflow of a run's latest plan (its protobuf), and when it was planned."""

    __tablename__ = "monitor_run_plans"

    run_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    workflow: Mapped[bytes] = mapped_column(LargeBinary)
    at: Mapped[float] = mapped_column(Float)


class StepRequestRow(Base):
    __tablename__ = "monitor_step_requests"

    workflow: Mapped[str] = mapped_column(String(255), primary_key=True)
    step: Mapped[str] = mapped_column(String(255), primary_key=True)
    cpu_request: Mapped[str] = mapped_column(String(64), default="")
    memory_request: Mapped[str] = mapped_column(String(64), default="")
    cpu_limit: Mapped[str] = mapped_column(String(64), default="")
    memory_limit: Mapped[str] = mapped_column(String(64), default="")
    run_id: Mapped[str] = mapped_column(String(255), default="")
    updated_at: Mapped[float] = mapped_column(Float)


_RUNS: sa.Table = RunRow.__table__  # type: ignore[assignment]
_SAMPLES: sa.Table = SampleRow.__table__  # type: ignore[assignment]
_ROLLUPS: sa.Table = RollupRow.__table__  # type: ignore[assignment]
_ROLLUP_KEY = ("run_id", "step", "key", "attempt", "minute")
MINUTE_NS = 60 * 10**9
_STEPS: sa.Table = StepRow.__table__  # type: ignore[assignment]
_TERMINAL_STEPS = ("succeeded", "failed", "skipped", "cached", "cancelled", "pruned")
_SELECT_RUN = sa.select(_RUNS).where(_RUNS.c.run_id == sa.bindparam("k_run_id")) \
    .with_for_update()
_STEP_KEY = (_STEPS.c.run_id == sa.bindparam("k_run_id"),
             _STEPS.c.name == sa.bindparam("k_name"), _STEPS.c.key == sa.bindparam("k_key"))
_SELECT_STEP = sa.select(_STEPS).where(*_STEP_KEY)
_INSERT_STEP = sa.insert(_STEPS)
_UPDATE_STEP = sa.update(_STEPS).where(*_STEP_KEY).values(
    {c.name: sa.bindparam(c.name) for c in _STEPS.columns if not c.primary_key})
_INSERT_RUN = sa.insert(_RUNS)
_UPDATE_RUN = sa.update(_RUNS).where(_RUNS.c.run_id == sa.bindparam("k_run_id")).values(
    {c.name: sa.bindparam(c.name) for c in _RUNS.columns if not c.primary_key})


class RunFields:
    """The columns of one ``monitor_runs`` row as attributes, noting which changed (a Core
    row to change without the ORM's unit of work)."""

    def __init__(self, values: dict[str, Any], *, new: bool) -> None:
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_changed", set())
        object.__setattr__(self, "is_new", new)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(f"monitor_runs has no column {name!r}")
        if self._values[name] != value or type(self._values[name]) is not type(value):
            self._values[name] = value
            self._changed.add(name)

    def values(self) -> dict[str, Any]:
        """Every column."""
        return dict(self._values)

    def changed(self) -> dict[str, Any]:
        """The columns changed since read (or stored)."""
        return {name: self._values[name] for name in self._changed}

    def stored(self) -> None:
        """Written: nothing is new or changed any more."""
        object.__setattr__(self, "is_new", False)
        self._changed.clear()


@dataclass(frozen=True, slots=True)
class RunPeak:
    """The highest use of one step in one run (over its keys and samples)."""

    run_id: str
    at: float  # when it was last seen: orders the runs
    peak_memory_bytes: int | None
    peak_cpu: float | None
    oom: bool
    oom_peak_memory_bytes: int | None


class Tx:
    """One transaction's primitive operations.

    The hot path's Core statements run on the session's connection directly (not through
    ``Session.execute``, whose ORM layer costs as much as the statement).
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self._conn: sa.Connection | None = None
        # What the use cases keep for the rest of the transaction (the recommender's
        # histograms, written back once at its end).
        self.scratch: dict[str, Any] = {}

    @property
    def conn(self) -> sa.Connection:
        """The transaction's connection (the session's)."""
        if self._conn is None:
            self._conn = self.session.connection()
        return self._conn

    # ----------------------------------------------------------------- runs and steps

    def run(self, run_id: str, *, lock: bool = False) -> RunRow | None:
        stmt = sa.select(RunRow).where(RunRow.run_id == run_id)
        if lock:
            stmt = stmt.with_for_update()
        return self.session.scalars(stmt).one_or_none()

    def add(self, row: Base) -> None:
        self.session.add(row)
        self.session.flush()

    # Core statements for the hot path (a step event), built once with bound parameters:
    # no unit of work, no identity map, no statement construction per call -- a run of
    # 100k steps sends 100k events, and those cost most of each.

    def run_namespace(self, run_id: str) -> RunFields | None:
        """The run's row (locked on PostgreSQL) as a :class:`RunFields` to change and
        :meth:`save_run`, or None."""
        row = self.conn.execute(_SELECT_RUN, {"k_run_id": run_id}).mappings().one_or_none()
        return RunFields(dict(row), new=False) if row is not None else None

    @staticmethod
    def new_run(**values: Any) -> RunFields:
        """A run row not stored yet (:meth:`save_run` inserts it)."""
        full = {c.name: None for c in _RUNS.columns} | {"retries": 0, "message": ""}
        return RunFields(full | values, new=True)

    def save_run(self, run: RunFields) -> None:
        """Insert the run's row, or update it when something changed (every column: one
        statement built once)."""
        if run.is_new:
            self.conn.execute(_INSERT_RUN, run.values())
        elif run.changed():
            self.conn.execute(_UPDATE_RUN, {**run.values(), "k_run_id": run.run_id})
        run.stored()

    def step_fields(self, run_id: str, name: str, key: str) -> dict[str, Any] | None:
        """The step's row as a dict, or None."""
        row = self.conn.execute(_SELECT_STEP, {"k_run_id": run_id, "k_name": name,
                                               "k_key": key}).mappings().one_or_none()
        return dict(row) if row is not None else None

    def put_step_fields(self, values: dict[str, Any], *, new: bool) -> None:
        """Insert (``new``) or update the step row ``values`` describe (every column)."""
        if new:
            self.conn.execute(_INSERT_STEP, values)
            return
        self.conn.execute(_UPDATE_STEP, {**values, "k_run_id": values["run_id"],
                                         "k_name": values["name"], "k_key": values["key"]})

    def runs(self, limit: int) -> Sequence[RunRow]:
        stmt = (sa.select(RunRow).order_by(RunRow.seen_at.desc(), RunRow.run_id)
                .limit(limit))
        return self.session.scalars(stmt).all()

    def steps_of(self, run_ids: Sequence[str]) -> Sequence[StepRow]:
        if not run_ids:
            return ()
        stmt = (sa.select(StepRow).where(StepRow.run_id.in_(run_ids))
                .order_by(StepRow.run_id, sa.func.coalesce(StepRow.started_at,
                                                           StepRow.finished_at,
                                                           StepRow.event_at),
                          StepRow.name, StepRow.key))
        return self.session.scalars(stmt).all()

    def steps_matching(self, *, run_id: str, workflow: str, step: str) -> Sequence[StepRow]:
        stmt = sa.select(StepRow)
        if run_id:
            stmt = stmt.where(StepRow.run_id == run_id)
        if workflow:
            stmt = stmt.where(StepRow.workflow == workflow)
        if step:
            stmt = stmt.where(StepRow.name == step)
        return self.session.scalars(stmt).all()

    # ----------------------------------------------------------------- samples

    def insert_sample(self, row: SampleRow) -> bool:
        """Store a sample unless the same measurement is stored; True when it was new."""
        values = {c.name: getattr(row, c.name) for c in _SAMPLES.columns if c.name != "id"}
        insert = postgresql.insert if self.conn.dialect.name == "postgresql" else sqlite.insert
        stmt = insert(_SAMPLES).values(**values).on_conflict_do_nothing(
            index_elements=["run_id", "step", "key", "attempt", "at_ns"]
        ).returning(_SAMPLES.c.id)
        # RETURNING, not the row count: a driver may report -1 for an ON CONFLICT insert
        return self.conn.execute(stmt).first() is not None

    def samples(self, *, run_id: str, workflow: str, step: str,
                limit: int) -> Sequence[SampleRow]:
        """The newest ``limit`` matching samples, oldest first."""
        stmt = self._filter(sa.select(SampleRow), run_id, workflow, step)
        newest = self.session.scalars(
            stmt.order_by(SampleRow.at_ns.desc(), SampleRow.id.desc()).limit(limit)).all()
        return newest[::-1]

    def rollups(self, *, run_id: str, workflow: str, step: str,
                limit: int) -> Sequence[RollupRow]:
        """The newest ``limit`` matching rollups, oldest first."""
        stmt = self._filter(sa.select(RollupRow), run_id, workflow, step, RollupRow)
        newest = self.session.scalars(stmt.order_by(
            RollupRow.minute.desc(), RollupRow.run_id.desc(), RollupRow.step.desc(),
            RollupRow.key.desc(), RollupRow.attempt.desc()).limit(limit)).all()
        return newest[::-1]

    def rollup_peaks(self, *, run_id: str, workflow: str,
                     step: str) -> list[tuple[str, str, str, str, float, int, int]]:
        """(run, workflow, step, key, max cpu, max memory, samples) per step item, over the
        rollups."""
        stmt = self._filter(sa.select(
            RollupRow.run_id, RollupRow.workflow, RollupRow.step, RollupRow.key,
            sa.func.max(RollupRow.cpu_max), sa.func.max(RollupRow.memory_max),
            sa.func.sum(RollupRow.count),
        ), run_id, workflow, step, RollupRow).group_by(
            RollupRow.run_id, RollupRow.workflow, RollupRow.step, RollupRow.key)
        return [tuple(row) for row in self.session.execute(stmt)]

    def compact_samples(self, before_ns: int, limit: int) -> int:
        """Fold the oldest raw samples measured before ``before_ns`` (at most ``limit``) into
        their minutes' rollups and delete them; how many were folded (0: none left).

        All in this transaction: a crash before the commit leaves the samples as they were
        and no rollup touched, so running it again neither loses nor counts twice. Rows
        another transaction is compacting are skipped (``SKIP LOCKED`` on PostgreSQL), and
        when fewer rows are deleted than were read (compacted meanwhile) the transaction
        fails instead of counting them again.
        """
        rows = self.conn.execute(
            sa.select(_SAMPLES.c.id, _SAMPLES.c.run_id, _SAMPLES.c.workflow, _SAMPLES.c.step,
                      _SAMPLES.c.key, _SAMPLES.c.attempt, _SAMPLES.c.at_ns, _SAMPLES.c.cpu,
                      _SAMPLES.c.memory_bytes)
            .where(_SAMPLES.c.at_ns < before_ns)
            .order_by(_SAMPLES.c.at_ns, _SAMPLES.c.id).limit(limit)
            .with_for_update(skip_locked=True)).all()
        if not rows:
            return 0
        buckets: dict[tuple[str, str, str, int, int], dict[str, Any]] = {}
        for r in rows:
            minute = (int(r.at_ns) // MINUTE_NS) * 60
            b = buckets.get((r.run_id, r.step, r.key, r.attempt, minute))
            if b is None:
                buckets[(r.run_id, r.step, r.key, r.attempt, minute)] = {
                    "run_id": r.run_id, "step": r.step, "key": r.key, "attempt": r.attempt,
                    "minute": minute, "workflow": r.workflow, "count": 1,
                    "cpu_sum": float(r.cpu), "cpu_max": float(r.cpu),
                    "memory_max": int(r.memory_bytes)}
            else:
                b["count"] += 1
                b["cpu_sum"] += float(r.cpu)
                b["cpu_max"] = max(b["cpu_max"], float(r.cpu))
                b["memory_max"] = max(b["memory_max"], int(r.memory_bytes))
                b["workflow"] = b["workflow"] or r.workflow
        self._merge_rollups(list(buckets.values()))
        ids = [int(r.id) for r in rows]
        deleted = 0
        for i in range(0, len(ids), 500):
            result = self.conn.execute(sa.delete(_SAMPLES).where(
                _SAMPLES.c.id.in_(ids[i:i + 500])))
            deleted += int(getattr(result, "rowcount", 0) or 0)
        if deleted != len(ids):
            raise RetryableError(f"monitor store: {len(ids) - deleted} of {len(ids)} samples "
                                 "were compacted by another transaction meanwhile; not "
                                 "counted twice (rolled back)")
        return len(ids)

    def _merge_rollups(self, rows: list[dict[str, Any]]) -> None:
        """Add ``rows`` to the stored rollups of their minutes (new ones are inserted)."""
        dialect = self.conn.dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        greatest = sa.func.greatest if dialect == "postgresql" else sa.func.max
        stmt = insert(_ROLLUPS)
        stmt = stmt.on_conflict_do_update(index_elements=list(_ROLLUP_KEY), set_={
            "count": _ROLLUPS.c.count + stmt.excluded.count,
            "cpu_sum": _ROLLUPS.c.cpu_sum + stmt.excluded.cpu_sum,
            "cpu_max": greatest(_ROLLUPS.c.cpu_max, stmt.excluded.cpu_max),
            "memory_max": greatest(_ROLLUPS.c.memory_max, stmt.excluded.memory_max),
        })
        if rows:  # one row per key (the buckets): no upsert touches a row twice
            self.conn.execute(stmt, rows)

    def expire_samples(self, before_ns: int) -> int:
        """Delete the raw samples measured before ``before_ns`` (older than any rollup kept:
        compacting them would make rollups expired at once); how many."""
        result = self.conn.execute(sa.delete(_SAMPLES).where(_SAMPLES.c.at_ns < before_ns))
        return int(getattr(result, "rowcount", 0) or 0)

    def expire_rollups(self, before_minute: int) -> int:
        """Delete the rollups of minutes that started before ``before_minute`` (epoch s)."""
        result = self.conn.execute(sa.delete(_ROLLUPS).where(_ROLLUPS.c.minute < before_minute))
        return int(getattr(result, "rowcount", 0) or 0)

    def sample_peaks(self, *, run_id: str, workflow: str,
                     step: str) -> list[tuple[str, str, str, str, float, int, int, int]]:
        """(run, workflow, step, key, max cpu, max memory, count, last at_ns) per step item."""
        stmt = self._filter(sa.select(
            SampleRow.run_id, SampleRow.workflow, SampleRow.step, SampleRow.key,
            sa.func.max(SampleRow.cpu), sa.func.max(SampleRow.memory_bytes),
            sa.func.count(SampleRow.id), sa.func.max(SampleRow.at_ns),
        ), run_id, workflow, step).group_by(SampleRow.run_id, SampleRow.workflow,
                                            SampleRow.step, SampleRow.key)
        return [tuple(row) for row in self.session.execute(stmt)]

    @staticmethod
    def _filter(stmt: Any, run_id: str, workflow: str, step: str,
                table: type[SampleRow] | type[RollupRow] = SampleRow) -> Any:
        if run_id:
            stmt = stmt.where(table.run_id == run_id)
        if workflow:
            stmt = stmt.where(table.workflow == workflow)
        if step:
            stmt = stmt.where(table.step == step)
        return stmt

    # ----------------------------------------------------------------- recommendations

    def run_peaks(self, workflow: str, step: str, runs: int) -> list[RunPeak]:
        """The peaks of ``step`` of ``workflow`` in its latest ``runs`` runs, newest first.

        Runs are those with a record of the step, ordered by when it last changed; a run's
        peak is the highest over its items, attempts and samples.
        """
        when = sa.func.max(sa.func.coalesce(StepRow.finished_at, StepRow.event_at))
        latest = self.session.execute(
            sa.select(StepRow.run_id, when)
            .where(StepRow.workflow == workflow, StepRow.name == step)
            .group_by(StepRow.run_id).order_by(when.desc(), StepRow.run_id.desc())
            .limit(runs)).all()
        if not latest:
            return []
        at = {run_id: float(t) for run_id, t in latest}
        peaks = {run_id: RunPeak(run_id, at[run_id], None, None, False, None) for run_id in at}
        rows = self.session.scalars(sa.select(StepRow).where(
            StepRow.workflow == workflow, StepRow.name == step, StepRow.run_id.in_(at))).all()
        for r in rows:
            p = peaks[r.run_id]
            peaks[r.run_id] = RunPeak(
                r.run_id, p.at, _max(p.peak_memory_bytes, r.max_peak_memory_bytes),
                _max(p.peak_cpu, r.max_peak_cpu), p.oom or r.oom_seen,
                _max(p.oom_peak_memory_bytes, r.oom_peak_memory_bytes if r.oom_seen else None))
        stmt = (sa.select(SampleRow.run_id, sa.func.max(SampleRow.cpu),
                          sa.func.max(SampleRow.memory_bytes))
                .where(SampleRow.workflow == workflow, SampleRow.step == step,
                       SampleRow.run_id.in_(at))
                .group_by(SampleRow.run_id))
        rolled = (sa.select(RollupRow.run_id, sa.func.max(RollupRow.cpu_max),
                            sa.func.max(RollupRow.memory_max))
                  .where(RollupRow.workflow == workflow, RollupRow.step == step,
                         RollupRow.run_id.in_(at))
                  .group_by(RollupRow.run_id))
        for run_id, cpu, mem in [*self.session.execute(stmt).all(),
                                 *self.session.execute(rolled).all()]:
            p = peaks[run_id]
            peaks[run_id] = RunPeak(run_id, p.at, _max(p.peak_memory_bytes, mem),
                                    _max(p.peak_cpu, cpu), p.oom, p.oom_peak_memory_bytes)
        return sorted(peaks.values(), key=lambda p: (p.at, p.run_id), reverse=True)

    def recommendation(self, workflow: str, step: str, kind: str) -> RecommendationRow | None:
        return self.session.get(RecommendationRow, (workflow, step, kind))

    def recommendations(self, workflow: str, step: str = "") -> Sequence[RecommendationRow]:
        stmt = sa.select(RecommendationRow).where(RecommendationRow.workflow == workflow)
        if step:
            stmt = stmt.where(RecommendationRow.step == step)
        return self.session.scalars(
            stmt.order_by(RecommendationRow.step, RecommendationRow.kind)).all()

    def recommender_state(self, workflow: str, step: str) -> RecommenderStateRow | None:
        """The stored histograms of a step, or None."""
        return self.session.get(RecommenderStateRow, (workflow, step))

    def recommender_run(self, workflow: str, step: str, run_id: str) -> RecommenderRunRow | None:
        """What one run of a step put in its histograms, or None."""
        return self.session.get(RecommenderRunRow, (workflow, step, run_id))

    def forget_recommender_runs(self, workflow: str, step: str) -> None:
        """Drop every run row of a step (its histograms are being rebuilt)."""
        self.session.execute(sa.delete(RecommenderRunRow).where(
            RecommenderRunRow.workflow == workflow, RecommenderRunRow.step == step))

    def sample_series(self, workflow: str, step: str,
                      limit: int) -> list[tuple[str, int, float, int, float | None]]:
        """(run, at_ns, cpu, memory, interval seconds) of the newest ``limit`` samples of a
        step, oldest first."""
        stmt = (sa.select(SampleRow.run_id, SampleRow.at_ns, SampleRow.cpu,
                          SampleRow.memory_bytes, SampleRow.interval_seconds)
                .where(SampleRow.workflow == workflow, SampleRow.step == step)
                .order_by(SampleRow.at_ns.desc(), SampleRow.id.desc()).limit(limit))
        return [(r[0], r[1], r[2], r[3], r[4]) for r in self.session.execute(stmt)][::-1]

    def step_requests(self, workflow: str, step: str = "") -> Sequence[StepRequestRow]:
        """The requests of a workflow's steps in its latest plan."""
        stmt = sa.select(StepRequestRow).where(StepRequestRow.workflow == workflow)
        if step:
            stmt = stmt.where(StepRequestRow.step == step)
        return self.session.scalars(stmt.order_by(StepRequestRow.step)).all()

    def replace_step_requests(self, workflow: str, rows: Sequence[StepRequestRow]) -> None:
        """Replace every stored request of ``workflow`` by ``rows``."""
        self.session.execute(sa.delete(StepRequestRow).where(
            StepRequestRow.workflow == workflow))
        if rows:
            self.session.execute(sa.insert(StepRequestRow), [
                {c.name: getattr(r, c.name) for c in StepRequestRow.__table__.columns}
                for r in rows])

    def put_plan(self, run_id: str, workflow: bytes, at: float) -> None:
        """Keep ``workflow`` as the run's plan unless a later one is stored."""
        row = self.session.get(RunPlanRow, run_id)
        if row is None:
            self.session.add(RunPlanRow(run_id=run_id, workflow=workflow, at=at))
            self.session.flush()
        elif at >= row.at:
            row.workflow, row.at = workflow, at

    def plan(self, run_id: str) -> RunPlanRow | None:
        return self.session.get(RunPlanRow, run_id)

    def find_runs(self, *, state: str, workflow: str, engine: str, since: float | None,
                  until: float | None, text: str, offset: int, limit: int
                  ) -> tuple[Sequence[RunRow], int]:
        """One page of the runs matching the filters, newest first, and how many match.
        ``text`` is found (case-insensitively) in the run id, workflow or message."""
        r = RunRow
        where: list[Any] = []
        if state:
            where.append(r.state == state)
        if workflow:
            where.append(r.workflow == workflow)
        if engine:
            where.append(r.engine == engine)
        if since is not None:
            where.append(r.seen_at >= since)
        if until is not None:
            where.append(r.seen_at < until)
        if text:
            pattern = "%" + text.lower().replace("\\", "\\\\").replace("%", "\\%") \
                .replace("_", "\\_") + "%"
            where.append(sa.or_(*(sa.func.lower(c).like(pattern, escape="\\")
                                  for c in (r.run_id, r.workflow, r.message))))
        total = self.session.execute(
            sa.select(sa.func.count()).select_from(r).where(*where)).scalar_one()
        rows = self.session.scalars(
            sa.select(r).where(*where).order_by(r.seen_at.desc(), r.run_id)
            .offset(offset).limit(limit)).all()
        return rows, int(total)

    def step_counts(self, run_ids: Sequence[str]) -> dict[str, tuple[int, int, int]]:
        """Per run: (step records, terminal ones, cached ones)."""
        if not run_ids:
            return {}
        s = _STEPS.c
        terminal = sa.func.sum(sa.case((s.state.in_(_TERMINAL_STEPS), 1), else_=0))
        cached = sa.func.sum(sa.case((sa.or_(s.cached.is_(True), s.state == "cached"), 1),
                                     else_=0))
        rows = self.conn.execute(sa.select(s.run_id, sa.func.count(), terminal, cached)
                                 .where(s.run_id.in_(run_ids)).group_by(s.run_id)).all()
        return {row[0]: (int(row[1]), int(row[2] or 0), int(row[3] or 0)) for row in rows}

    def filter_values(self) -> tuple[list[str], list[str]]:
        """The workflows and engines the stored runs name (for the console's filters)."""
        workflows = self.session.scalars(sa.select(RunRow.workflow).distinct()
                                         .where(RunRow.workflow != "")
                                         .order_by(RunRow.workflow).limit(500)).all()
        engines = self.session.scalars(sa.select(RunRow.engine).distinct()
                                       .where(RunRow.engine != "")
                                       .order_by(RunRow.engine).limit(100)).all()
        return list(workflows), list(engines)

    def last_computed(self, workflow: str, names: Sequence[str]) -> dict[str, float]:
        """Per step name of ``workflow``: the duration of its latest succeeded, computed
        (not cached) top-level record -- what a cache hit of it saves."""
        if not names or not workflow:
            return {}
        s = _STEPS.c
        rows = self.conn.execute(
            sa.select(s.name, s.started_at, s.finished_at)
            .where(s.workflow == workflow, s.name.in_(names), s.key == "",
                   s.state == "succeeded", s.cached.is_(False),
                   s.started_at.is_not(None), s.finished_at.is_not(None))
            .order_by(s.finished_at)).all()
        return {name: max(0.0, float(end) - float(start)) for name, start, end in rows
                if isinstance(start, int | float) and isinstance(end, int | float)}

    def cache_totals(self) -> tuple[int, int, float, list[str]]:
        """Over every stored step record: how many, how many reused from the cache, the
        compute their reuse saved (as the engines gave it), and the cached ones' artifacts
        (JSON)."""
        s = _STEPS.c
        cached = sa.or_(s.cached.is_(True), s.state == "cached")
        total, hits, saved = self.conn.execute(sa.select(
            sa.func.count(), sa.func.sum(sa.case((cached, 1), else_=0)),
            sa.func.sum(sa.case((cached, s.cache_saved_seconds), else_=0.0)))).one()
        artifacts = self.conn.execute(sa.select(s.artifacts).where(
            cached, s.artifacts != "{}")).scalars().all()
        return int(total or 0), int(hits or 0), float(saved or 0.0), list(artifacts)

    def unpublished(self) -> Sequence[RecommendationRow]:
        stmt = (sa.select(RecommendationRow).where(RecommendationRow.published.is_(False))
                .order_by(RecommendationRow.created_at, RecommendationRow.id))
        return self.session.scalars(stmt).all()

    def mark_published(self, workflow: str, step: str, kind: str, rec_id: str) -> None:
        """Flag the row published, unless its value changed since (then it is due again)."""
        self.session.execute(sa.update(RecommendationRow).where(
            RecommendationRow.workflow == workflow, RecommendationRow.step == step,
            RecommendationRow.kind == kind, RecommendationRow.id == rec_id,
        ).values(published=True))


    # ----------------------------------------------------------------- failures

    def add_failure(self, values: dict[str, Any]) -> None:
        """Keep one failed attempt (``FailureRow``'s columns); a redelivered one is kept once."""
        key = (values["run_id"], values["step"], values["key"], values["attempt"])
        if self.session.get(FailureRow, key) is None:
            self.session.add(FailureRow(**values))
            self.session.flush()

    def step_history(self, workflow: str, step: str, runs: int
                     ) -> list[tuple[Any, list[FailureRow]]]:
        """The step's finished records (its top-level row, key "": ``run_id``, ``state``,
        ``attempts``, ``finished_at``, ``event_at``) in its latest ``runs`` runs, newest
        first, each with the run's failed attempts of it (every key). Runs once per finished
        step event: Core rows, and the failures only when a row says there were some."""
        s = _STEPS.c
        rows = self.conn.execute(
            sa.select(s.run_id, s.state, s.attempts, s.finished_at, s.event_at)
            .where(s.workflow == workflow, s.name == step, s.key == "",
                   s.state.in_(("succeeded", "failed")))
            .order_by(sa.func.coalesce(s.finished_at, s.event_at).desc(), s.run_id.desc())
            .limit(runs)).all()
        failures: dict[str, list[FailureRow]] = {r.run_id: [] for r in rows}
        if not any(r.attempts > 1 or r.state == "failed" for r in rows):
            # one attempt each, all succeeded: no failed attempt was recorded
            return [(r, []) for r in rows]
        for f in self.session.scalars(sa.select(FailureRow).where(
                FailureRow.workflow == workflow, FailureRow.step == step,
                FailureRow.run_id.in_(failures))
                .order_by(FailureRow.run_id, FailureRow.at, FailureRow.attempt)).all():
            failures[f.run_id].append(f)
        return [(r, failures[r.run_id]) for r in rows]


def _max(a: Any, b: Any) -> Any:
    if b is None:
        return a
    if a is None:
        return b
    return max(a, b)


class MonitorStore:
    """The monitor's database; :meth:`open` migrates it to the current schema.

    Args:
        url: A SQLAlchemy URL (SQLite file or PostgreSQL).

    Attributes:
        quick: Short transactions may run on the caller's event loop (SQLite:
            :func:`couler_runtime.store.is_local`).
    """

    def __init__(self, url: str) -> None:
        self._engine = make_engine(url)
        self._sessions = make_session_factory(self._engine)
        self.quick = is_local(self._engine)

    @classmethod
    def open(cls, url: str) -> MonitorStore:
        """Run the migrations (idempotent), then connect."""
        migrate(url, SERVICE, MIGRATIONS)
        return cls(url)

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        """One transaction; committed when the block ends.

        A constraint violation here means another writer raced this one (a second replica):
        retrying sees its row, so it is reported as retryable rather than as bad input.
        """
        try:
            with session_scope(self._sessions) as session:
                yield Tx(session)
        except ConflictError as e:
            raise RetryableError(f"monitor store: concurrent update: {e}") from e

    def close(self) -> None:
        """Release the connections."""
        self._engine.dispose()
