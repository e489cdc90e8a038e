"""Run records in SQL: runs, their steps, registered templates, the events outbox.

Tables (created by ``couler_submitter/migrations``, version table
``alembic_version_submitter``):

* ``submitter_runs`` -- one row per run: the request (workflow protobuf or text), options,
  the plan once optimized, state, engine ids, pass reports, times, ``revision`` (bumped by
  every change, so watchers can order records), ``retries`` and how many steps it has
  (``step_count``, ``cached_step_count``). ``idempotency_key`` is UNIQUE: two Submits with
  one key race on the insert, and the loser reads the winner's row.
* ``submitter_steps`` -- the latest record of each step execution ``(run_id, name, key)``,
  with ``position`` (the run's revision when it was first seen: the steps' order) and
  ``revision`` (the run's revision when it last changed: what a watcher has not seen).
  Every step change takes a revision of its own, so both are unique within a run.
* ``submitter_outbox`` -- the events to publish, each inserted in the transaction of the
  change it reports and deleted once JetStream stored it; ``submitter_outbox_dead`` --
  those that can never be published, with the reason.
* ``submitter_templates`` -- registered templates (workflow protobuf, default engine).
* ``submitter_rejections`` -- messages the consumers terminated, with the reason.
* ``submitter_schedules`` -- the cron schedules (one per template whose workflow has one):
  paused or not, and the last tick handled; ``submitter_schedule_ticks`` -- what became of
  each tick, ``(schedule, tick)`` its primary key: the claim that keeps two submitters from
  launching one tick twice (inserted in the transaction of the tick's run, or its skip).

Records come back without their steps (:meth:`RunStore.header`) or with one page of them
(:meth:`RunStore.run_page`, :meth:`RunStore.changed_steps`): nothing reads all the steps of
a run at once but :meth:`RunStore.get_run` (for tools and tests). The API is synchronous;
the service calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import sqlalchemy as sa
from google.protobuf.message import DecodeError
from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from couler import ir
from couler.engines.base import StepState
from couler.errors import ConflictError, NotFoundError, UserError
from couler.v1 import common_pb2, workflow_pb2
from couler_runtime import codec, telemetry
from couler_runtime.rpc.records import (
    PassReport,
    Plan,
    Run,
    RunState,
    StepRecord,
    StoredArtifact,
    Template,
    UtilizationSample,
    bounded_report,
    plan_from_proto,
    plan_to_proto,
    run_to_proto,
    step_record_to_proto,
    utilization_batch_to_proto,
)
from couler_runtime.store import (
    connection_scope,
    is_local,
    make_engine,
    make_session_factory,
    migrate,
    session_scope,
)
from couler_submitter.model import RunOptions, RunRequest

__all__ = ["MIGRATIONS", "SERVICE", "EventKind", "Finish", "OutboxEntry", "RunStore",
           "ScheduleState", "parse_page_token"]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SERVICE = "submitter"
_UNSET: Any = object()
_ID = BigInteger().with_variant(Integer(), "sqlite")
_IN_CHUNK = 500  # names per IN (...) list
BATCH_SAMPLES = 400  # utilization samples per couler.metrics.batch message (~40 KiB at most)


class EventKind(enum.StrEnum):
    """What an outbox row publishes (the ``service.Events`` method it is handed to)."""

    REQUESTED = "requested"
    SUBMITTED = "submitted"
    STEP = "step"
    UTILIZATION = "utilization"  # one sample (queued by submitters before the time series)
    UTILIZATION_BATCH = "samples"  # a run's samples in a batch, couler.metrics.batch
    FINISHED = "finished"
    REFUSED = "refused"  # payload: a couler.v1.DocumentRefused (without its request)


class Base(DeclarativeBase):
    """The submitter's tables."""


class RunRow(Base):
    __tablename__ = "submitter_runs"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True, nullable=True)
    workflow: Mapped[str] = mapped_column(String(255), default="")
    workflow_digest: Mapped[str] = mapped_column(String(80), default="")
    source: Mapped[str] = mapped_column(String(16))
    # The two large columns (megabytes for a big workflow) are read only when used.
    request: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    text: Mapped[str | None] = mapped_column(Text, nullable=True)
    template: Mapped[str] = mapped_column(String(63), default="")
    options: Mapped[str] = mapped_column(Text, default="{}")
    plan: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    state: Mapped[str] = mapped_column(String(16))
    engine: Mapped[str] = mapped_column(String(32))
    engine_run_id: Mapped[str] = mapped_column(String(255), default="")
    passes: Mapped[str] = mapped_column(Text, default="[]")
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revision: Mapped[int] = mapped_column(BigInteger, default=1)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    step_count: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_step_count: Mapped[int] = mapped_column(BigInteger, default=0)


class StepRow(Base):
    __tablename__ = "submitter_steps"

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("submitter_runs.run_id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(512), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    revision: Mapped[int] = mapped_column(BigInteger, default=0)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_cpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    outputs: Mapped[str] = mapped_column(Text, default="{}")
    cache_key: Mapped[str] = mapped_column(String(255), default="")
    cached: Mapped[bool] = mapped_column(Boolean, default=False)
    message: Mapped[str] = mapped_column(Text, default="")
    failure_class: Mapped[str] = mapped_column(String(16), default="")
    artifacts: Mapped[str] = mapped_column(Text, default="{}")
    cache_saved_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    failure_reason: Mapped[str] = mapped_column(Text, default="")


class OutboxRow(Base):
    __tablename__ = "submitter_outbox"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    workflow: Mapped[str] = mapped_column(String(255), default="")
    engine: Mapped[str] = mapped_column(String(32), default="")
    retries: Mapped[int] = mapped_column(Integer, default=0)
    payload: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    trace: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str] = mapped_column(Text, default="")


class DeadOutboxRow(Base):
    __tablename__ = "submitter_outbox_dead"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    outbox_id: Mapped[int] = mapped_column(BigInteger)
    run_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    workflow: Mapped[str] = mapped_column(String(255), default="")
    engine: Mapped[str] = mapped_column(String(32), default="")
    retries: Mapped[int] = mapped_column(Integer, default=0)
    payload: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    trace: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    moved_at: Mapped[float] = mapped_column(Float)


class TemplateRow(Base):
    __tablename__ = "submitter_templates"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    workflow: Mapped[bytes] = mapped_column(LargeBinary)
    engine: Mapped[str] = mapped_column(String(32), default="")
    workflow_digest: Mapped[str] = mapped_column(String(80))
    registered_at: Mapped[float] = mapped_column(Float)


class ScheduleRow(Base):
    __tablename__ = "submitter_schedules"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    last_tick: Mapped[float] = mapped_column(Float)
    registered_at: Mapped[float] = mapped_column(Float)


class TickRow(Base):
    __tablename__ = "submitter_schedule_ticks"

    schedule: Mapped[str] = mapped_column(String(63), primary_key=True)
    tick: Mapped[float] = mapped_column(Float, primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[str] = mapped_column(String(64), default="")
    reason: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[float] = mapped_column(Float)


class RejectionRow(Base):
    __tablename__ = "submitter_rejections"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    durable: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(255))
    stream_sequence: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[float] = mapped_column(Float)


_RUNS: sa.Table = RunRow.__table__  # type: ignore[assignment]
_STEPS: sa.Table = StepRow.__table__  # type: ignore[assignment]
_OUTBOX: sa.Table = OutboxRow.__table__  # type: ignore[assignment]
_TICKS: sa.Table = TickRow.__table__  # type: ignore[assignment]
# Core statements for what runs per event and per step change (built once, bound per
# call): no unit of work, no identity map -- the ORM cost most of each transaction.
_HEADER_COLUMNS = [c for c in _RUNS.columns if c.name not in ("request", "plan")]
_SELECT_HEADER = sa.select(*_HEADER_COLUMNS).where(_RUNS.c.run_id == sa.bindparam("k_run_id"))
_SELECT_HEADER_LOCKED = _SELECT_HEADER.with_for_update()
_INSERT_RUN = sa.insert(_RUNS)
_INSERT_STEP = sa.insert(_STEPS)
_STEP_FIELDS = ("revision", "state", "attempts", "exit_code", "started_at", "finished_at",
                "peak_cpu", "peak_memory_bytes", "outputs", "cache_key", "cached", "message",
                "failure_class", "artifacts", "cache_saved_seconds", "failure_reason")
_UPDATE_STEP = sa.update(_STEPS).where(
    _STEPS.c.run_id == sa.bindparam("k_run_id"), _STEPS.c.name == sa.bindparam("k_name"),
    _STEPS.c.key == sa.bindparam("k_key"),
).values({name: sa.bindparam(name) for name in _STEP_FIELDS})
_INSERT_OUTBOX = sa.insert(_OUTBOX)
_INSERT_OUTBOX_IDS = _INSERT_OUTBOX.returning(_OUTBOX.c.id, sort_by_parameter_order=True)
_KEY = _RUNS.c.run_id == sa.bindparam("k_run_id")
# A run's row written back whole (every column but the two large ones): one statement for
# every change, instead of one built per set of changed columns.
_UPDATE_HEADER = sa.update(_RUNS).where(_KEY).values(
    {c.name: sa.bindparam(c.name) for c in _HEADER_COLUMNS if not c.primary_key})
_UPDATE_HEADER_PLAN = sa.update(_RUNS).where(_KEY).values(
    {c.name: sa.bindparam(c.name) for c in _HEADER_COLUMNS if not c.primary_key}
    | {"plan": sa.bindparam("plan")})
_STEPS_STORED = sa.select(_STEPS.c.name, _STEPS.c.key, _STEPS.c.cached).where(
    _STEPS.c.run_id == sa.bindparam("k_run_id"),
    _STEPS.c.name.in_(sa.bindparam("k_names", expanding=True)))
_CHANGED_STEPS = (
    sa.select(_STEPS).where(
        _STEPS.c.run_id == sa.bindparam("k_run_id"),
        _STEPS.c.position > sa.bindparam("k_after"),
        sa.or_(sa.and_(_STEPS.c.revision > sa.bindparam("k_since"),
                       _STEPS.c.revision <= sa.bindparam("k_upto")),
               sa.and_(_STEPS.c.position > sa.bindparam("k_since"),
                       _STEPS.c.position <= sa.bindparam("k_upto"))))
    .order_by(_STEPS.c.position).limit(sa.bindparam("k_limit")))
_DELETE_OUTBOX = sa.delete(_OUTBOX).where(
    _OUTBOX.c.id.in_(sa.bindparam("k_ids", expanding=True)))
_PENDING = (sa.select(_OUTBOX.c.id, _OUTBOX.c.run_id, _OUTBOX.c.kind, _OUTBOX.c.workflow,
                      _OUTBOX.c.engine, _OUTBOX.c.retries, _OUTBOX.c.payload, _OUTBOX.c.trace,
                      _OUTBOX.c.attempts)
            .where(_OUTBOX.c.id > sa.bindparam("k_after")).order_by(_OUTBOX.c.id)
            .limit(sa.bindparam("k_limit")))


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule's stored state (its cron spec is its template's workflow's).

    Attributes:
        name: The template's name.
        paused: Paused with ``couler schedule pause``.
        last_tick: The last tick handled, seconds since the epoch.
        last_outcome: What became of it ("launched", "skipped"; "" before the first).
        last_run_id: The run it launched.
        last_reason: Why it was skipped.
    """

    name: str
    paused: bool
    last_tick: float
    last_outcome: str = ""
    last_run_id: str = ""
    last_reason: str = ""


@dataclass(frozen=True, slots=True)
class Finish:
    """A run's end, recorded with its last step changes (:meth:`RunStore.put_steps`).

    Attributes:
        state: The terminal state.
        message: Why (or "").
        finished_at: When.
        expect: The states the run may end from; from any other, it is left as it is.
    """

    state: RunState
    message: str
    finished_at: float
    expect: tuple[RunState, ...]


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One event waiting to be published (see :meth:`RunStore.pending_events`).

    Attributes:
        id: Its place in the outbox: events are published in id order.
        run_id: The run it is about.
        kind: Which event.
        workflow: The run's workflow name when the event was recorded.
        engine: The run's engine.
        retries: The run's retry count (part of the events' msg ids).
        payload: The encoded record it carries: a ``StepRecord`` (step), a
            ``UtilizationSample`` (utilization), a ``UtilizationBatch``
            (samples), a ``Run`` without steps (submitted,
            finished); empty for requested (the request is read from the run's row).
        trace: The trace context of the change (``traceparent`` ...), to continue.
        attempts: Failed attempts to publish it so far.
    """

    id: int
    run_id: str
    kind: str
    workflow: str
    engine: str
    retries: int
    payload: bytes
    trace: dict[str, str]
    attempts: int = 0


log = logging.getLogger(__name__)

# A stored row as the record builders read it: an ORM object, a Core row of the table's
# columns, or a namespace of them (what a transaction is about to write).
_Fields = Any

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)
N = TypeVar("N", int, float)
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
_LAST_SECOND = 253402300799.0  # 9999-12-31T23:59:59Z, the last a Timestamp holds


class _Reading:
    """Reads the columns of one stored row, noting those it cannot: a damaged row must
    never stop the service, nor a call that lists it (it is shown as damaged instead)."""

    def __init__(self) -> None:
        self.damaged: list[str] = []

    def json(self, field: str, text: str | None, kind: type[T], default: T) -> T:
        try:
            value = json.loads(text or "null")
        except (ValueError, TypeError):
            value = None
        if isinstance(value, kind):
            return value
        if text not in (None, ""):
            self.damaged.append(field)
        return default

    def enum(self, field: str, kind: type[E], value: str | None, default: E) -> E:
        try:
            return kind(value)
        except ValueError:
            self.damaged.append(field)
            return default

    def number(self, field: str, value: N | None, low: float, high: float) -> N | None:
        """``value`` when it lies in ``low..high`` (what its protobuf field can carry);
        None otherwise, noted."""
        if value is None or (low <= value <= high):
            return value
        self.damaged.append(field)
        return None

    def when(self, field: str, value: float | None) -> float | None:
        """A time (seconds since the epoch) a protobuf Timestamp can carry."""
        return self.number(field, value, 0.0, _LAST_SECOND)

    def note(self, message: str) -> str:
        """``message`` with what could not be read said first."""
        if not self.damaged:
            return message
        said = (f"the stored record is damaged (field(s) {', '.join(self.damaged)} could not "
                "be read)")
        return f"{said}: {message}" if message else said


def _step_record(row: _Fields) -> StepRecord:
    read = _Reading()
    artifacts: dict[str, StoredArtifact] = {}
    for name, a in read.json("artifacts", row.artifacts, dict, {}).items():
        try:
            artifacts[str(name)] = StoredArtifact(str(a["digest"]), int(a.get("size_bytes", 0)),
                                                  str(a.get("uri", "")))
        except (TypeError, KeyError, ValueError, AttributeError):
            read.damaged.append(f"artifacts.{name}")
    outputs = {str(k): str(v) for k, v in read.json("outputs", row.outputs, dict, {}).items()}
    state = read.enum("state", StepState, row.state, StepState.FAILED)
    failure = (read.enum("failure_class", ir.FailureClass, row.failure_class,
                         ir.FailureClass.INFRA) if row.failure_class else None)
    return StepRecord(
        name=row.name, key=row.key, state=state,
        attempts=read.number("attempts", row.attempts, 0, _INT32) or 0,
        exit_code=read.number("exit_code", row.exit_code, -_INT32 - 1, _INT32),
        started_at=read.when("started_at", row.started_at),
        finished_at=read.when("finished_at", row.finished_at),
        peak_cpu=read.number("peak_cpu", row.peak_cpu, 0.0, 1e9),
        peak_memory_bytes=read.number("peak_memory_bytes", row.peak_memory_bytes, 0, _INT64),
        outputs=outputs, cache_key=row.cache_key or "", cached=bool(row.cached),
        message=read.note(row.message or ""), failure_class=failure, artifacts=artifacts,
        cache_saved_seconds=read.number("cache_saved_seconds", row.cache_saved_seconds,
                                        0.0, 1e15) or 0.0,
        failure_reason=row.failure_reason or "",
    )


def _run_state(row: _Fields) -> RunState:
    """The row's state; a state that cannot be read counts as FAILED (terminal: nothing
    resumes or changes a run whose record is damaged)."""
    try:
        return RunState(row.state)
    except ValueError:
        return RunState.FAILED


def _step_values(rec: StepRecord) -> dict[str, Any]:
    """The columns of a step row that record ``rec`` (all but the key and the order)."""
    return {
        "state": rec.state.value, "attempts": rec.attempts, "exit_code": rec.exit_code,
        "started_at": rec.started_at, "finished_at": rec.finished_at,
        "peak_cpu": rec.peak_cpu, "peak_memory_bytes": rec.peak_memory_bytes,
        "outputs": json.dumps(dict(rec.outputs), sort_keys=True) if rec.outputs else "{}",
        "cache_key": rec.cache_key, "cached": rec.cached, "message": rec.message,
        "failure_class": rec.failure_class.value if rec.failure_class is not None else "",
        "artifacts": json.dumps({n: {"digest": a.digest, "size_bytes": a.size_bytes,
                                     "uri": a.uri} for n, a in rec.artifacts.items()},
                                sort_keys=True) if rec.artifacts else "{}",
        "cache_saved_seconds": rec.cache_saved_seconds,
        "failure_reason": rec.failure_reason,
    }


def _run_record(row: _Fields, steps: Sequence[_Fields] = (), next_token: str = "") -> Run:
    """The run's record with ``steps`` (already in order)."""
    read = _Reading()
    try:
        options = RunOptions.from_json(read.json("options", row.options, dict, {}))
    except (TypeError, ValueError, KeyError, AttributeError, UserError):
        read.damaged.append("options")
        options = RunOptions()
    passes: list[PassReport] = []
    for p in read.json("passes", row.passes, list, []):
        try:
            passes.append(PassReport(str(p["name"]), bool(p.get("changed")),
                                     tuple(str(n) for n in p.get("notes", ())),
                                     float(p.get("duration_ms", 0.0))))
        except (TypeError, KeyError, ValueError, AttributeError):
            read.damaged.append("passes")
    state = read.enum("state", RunState, row.state, RunState.FAILED)
    created = read.when("created_at", row.created_at)
    started = read.when("started_at", row.started_at)
    finished = read.when("finished_at", row.finished_at)
    revision = read.number("revision", row.revision, 0, _INT64) or 0
    retries = read.number("retries", row.retries, 0, _INT32) or 0
    step_count = read.number("step_count", row.step_count, 0, _INT32) or 0
    cached = read.number("cached_step_count", row.cached_step_count, 0, _INT32) or 0
    return Run(
        run_id=row.run_id, state=state, workflow=row.workflow, engine=row.engine,
        engine_run_id=row.engine_run_id, steps=tuple(_step_record(s) for s in steps),
        created_at=created, started_at=started, finished_at=finished,
        message=read.note(row.message or ""), passes=tuple(passes),
        idempotency_key=row.idempotency_key or "", parameters=dict(options.parameters),
        workflow_digest=row.workflow_digest, template=row.template, dry_run=bool(row.dry_run),
        revision=revision, retries=retries, step_count=step_count, cached_step_count=cached,
        next_step_page_token=next_token,
    )


@contextlib.contextmanager
def _damaged(run_id: str, what: str) -> Iterator[None]:
    """A stored value that cannot be decoded is a UserError naming the run and the field."""
    try:
        yield
    except UserError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, DecodeError) as exc:
        raise UserError(f"run {run_id!r}: its stored {what} is damaged and cannot be read "
                        f"({type(exc).__name__})") from exc


def page_token(position: int) -> str:
    """The opaque token of the page of steps after ``position``."""
    return f"p{position}"


def parse_page_token(token: str, *, field: str = "step_page_token") -> int:
    """The position a :func:`page_token` names (0 for ""); UserError naming ``field``."""
    if not token:
        return 0
    if token.startswith("p") and token[1:].isdigit() and len(token) <= 20:
        return int(token[1:])
    raise UserError(f"field {field!r}: {token[:40]!r} is not a token this server gave")


def _current_trace() -> str:
    """The current trace context as JSON headers ("" outside a trace)."""
    headers = telemetry.inject({})
    return json.dumps(headers, sort_keys=True) if headers else ""


def _trace(text: str) -> dict[str, str]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


class RunStore:
    """The submitter's tables in one database (SQLite or PostgreSQL).

    The statements a run goes through many times (its header, step changes, the outbox)
    are Core statements; the rest use the ORM.

    Args:
        url: The SQLAlchemy URL; the tables are migrated to the newest revision.

    Attributes:
        quick: Short transactions may run on the caller's event loop (SQLite:
            :func:`couler_runtime.store.is_local`); otherwise every call goes to a thread.
    """

    def __init__(self, url: str) -> None:
        self._engine = make_engine(url)
        migrate(self._engine, SERVICE, MIGRATIONS)
        self._sessions = make_session_factory(self._engine)
        self.quick = is_local(self._engine)
        # SQLite's driver runs a transaction's first SELECT outside it (no lock is taken
        # before the first write): two threads of this process could both read a run's
        # revision and write the same next one. One writer at a time in this process
        # (SQLite allows one anyway); PostgreSQL's row locks do the same there.
        self._one_writer: contextlib.AbstractContextManager[object] = (
            threading.Lock() if self._engine.dialect.name == "sqlite"
            else contextlib.nullcontext())
        self._local = threading.local()  # .captured: see capturing(); .queued: this txn's

    def close(self) -> None:
        """Release the connections."""
        self._engine.dispose()

    @contextlib.contextmanager
    def capturing(self) -> Iterator[list[OutboxEntry]]:
        """Collect the events that calls made inside the block, in this thread, queue in
        the outbox: those of committed transactions only, with their ids, in order (the
        service hands them to its sender without reading them back)."""
        captured: list[OutboxEntry] = []
        self._local.captured = captured
        try:
            yield captured
        finally:
            self._local.captured = None

    @contextlib.contextmanager
    def _write(self) -> Iterator[sa.Connection]:
        """One write transaction (one at a time in this process on SQLite)."""
        captured: list[OutboxEntry] | None = getattr(self._local, "captured", None)
        queued: list[OutboxEntry] = []
        self._local.queued = queued if captured is not None else None
        try:
            with self._one_writer, connection_scope(self._engine) as conn:
                yield conn
        finally:
            self._local.queued = None
        if captured is not None:  # committed
            captured.extend(queued)

    def _queue(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
        """Insert outbox rows (noting them, with their ids, when captured)."""
        queued: list[OutboxEntry] | None = getattr(self._local, "queued", None)
        if queued is None:
            conn.execute(_INSERT_OUTBOX, rows)
            return
        ids = conn.execute(_INSERT_OUTBOX_IDS, rows).scalars().all()
        queued.extend(OutboxEntry(i, r["run_id"], r["kind"], r["workflow"], r["engine"],
                                  r["retries"], r["payload"] or b"", _trace(r["trace"]))
                      for i, r in zip(ids, rows, strict=True))

    def _read(self) -> contextlib.AbstractContextManager[sa.Connection]:
        return connection_scope(self._engine)

    # ------------------------------------------------------------------ runs

    def create_run(self, run_id: str, request: RunRequest, *, idempotency_key: str = "",
                   now: float | None = None, encoded: bytes | None = None,
                   tick: tuple[str, float] | None = None) -> tuple[Run, bool]:
        """Insert a run in state ACCEPTED, and its ``requested`` event; ``(run, created)``.

        ``encoded`` is the workflow's protobuf encoding when the caller has it (it is
        stored as given rather than encoded again). With an ``idempotency_key`` already
        used, the existing run and False: the UNIQUE constraint decides between
        concurrent submits, not a read before the write. The record has no steps.

        ``tick``: the run is schedule ``tick[0]``'s run of tick ``tick[1]``; the tick's row
        is inserted in the same transaction (ConflictError when the tick was handled
        already and no run has the key: it was skipped).
        """
        wf = request.workflow
        if wf is not None and encoded is None:
            encoded = codec.workflow_to_proto(wf).SerializeToString()
        at = now or time.time()
        values: dict[str, Any] = {
            "run_id": run_id, "idempotency_key": idempotency_key or None,
            "workflow": wf.name if wf is not None else "", "workflow_digest": "",
            "source": "workflow" if wf is not None else "text",
            "request": encoded if wf is not None else None,
            "text": request.text, "template": request.template,
            "options": json.dumps(request.options.to_json(), sort_keys=True),
            "plan": None, "state": RunState.ACCEPTED.value, "engine": request.options.engine,
            "engine_run_id": "", "passes": "[]", "message": "", "created_at": at,
            "started_at": None, "finished_at": None, "revision": 1, "retries": 0,
            "dry_run": request.options.dry_run, "step_count": 0, "cached_step_count": 0,
        }
        row = SimpleNamespace(**values)
        try:
            with self._write() as conn:
                if tick is not None:
                    conn.execute(sa.insert(_TICKS), {
                        "schedule": tick[0], "tick": tick[1], "outcome": "launched",
                        "run_id": run_id, "reason": "", "at": at})
                conn.execute(_INSERT_RUN, values)
                self._emit(conn, row, EventKind.REQUESTED)
        except ConflictError:
            if not idempotency_key:
                raise
            with self._read() as conn:
                found = conn.execute(sa.select(*_HEADER_COLUMNS).where(
                    _RUNS.c.idempotency_key == idempotency_key)).one_or_none()
                if found is None:
                    raise
                return _run_record(found), False
        return _run_record(row), True

    def header(self, run_id: str) -> Run:
        """The run's record without its steps; NotFoundError for an unknown run."""
        with self._read() as conn:
            return _run_record(self._row(conn, run_id))

    def header_options(self, run_id: str) -> tuple[Run, RunOptions]:
        """The run's record without its steps, and the options it was submitted with,
        read at once; NotFoundError for an unknown run, UserError for damaged options."""
        with self._read() as conn:
            row = self._row(conn, run_id)
        with _damaged(run_id, "options"):
            options = RunOptions.from_json(json.loads(row.options))
        return _run_record(row), options

    def get_run(self, run_id: str) -> Run:
        """The run's record with every step, in order (tools and tests; the service reads
        steps a page at a time)."""
        with self._read() as conn:
            row = self._row(conn, run_id)
            steps = conn.execute(sa.select(_STEPS).where(_STEPS.c.run_id == run_id)
                                 .order_by(_STEPS.c.position)).all()
            return _run_record(row, steps)

    def run_page(self, run_id: str, *, limit: int, after: int = 0) -> Run:
        """The run's record with at most ``limit`` steps, those after position ``after``
        in order; ``next_step_page_token`` names the next page ("" on the last)."""
        with self._read() as conn:
            row = self._row(conn, run_id)
            steps = conn.execute(
                sa.select(_STEPS).where(_STEPS.c.run_id == run_id, _STEPS.c.position > after)
                .order_by(_STEPS.c.position).limit(limit + 1)).all()
            more = len(steps) > limit
            steps = steps[:limit]
            token = page_token(steps[-1].position) if more and steps else ""
            return _run_record(row, steps, token)

    def changed_steps(self, run_id: str, *, since: int, upto: int, after: int,
                      limit: int) -> tuple[tuple[StepRecord, ...], int, bool]:
        """The steps that changed in revisions ``(since, upto]`` or were first seen then,
        after position ``after``, in order of position: ``(steps, last position, more)``.

        A watcher that knows every step first seen by revision ``since`` learns of new
        steps in the order of their positions this way (a step's position never exceeds
        its revision).
        """
        with self._read() as conn:
            rows = conn.execute(_CHANGED_STEPS, {
                "k_run_id": run_id, "k_after": after, "k_since": since, "k_upto": upto,
                "k_limit": limit + 1}).all()
        more = len(rows) > limit
        rows = rows[:limit]
        last = rows[-1].position if rows else after
        return tuple(_step_record(r) for r in rows), last, more

    def request(self, run_id: str) -> RunRequest:
        """What the run was submitted with (its workflow decoded)."""
        with self._read() as conn:
            row = conn.execute(sa.select(_RUNS.c.request, _RUNS.c.text, _RUNS.c.options,
                                         _RUNS.c.template)
                               .where(_RUNS.c.run_id == run_id)).one_or_none()
        if row is None:
            raise NotFoundError(f"run {run_id!r} does not exist")
        with _damaged(run_id, "request"):
            wf = (codec.workflow_from_proto(common_workflow(row.request))
                  if row.request is not None else None)
            options = RunOptions.from_json(json.loads(row.options))
        return RunRequest(wf, row.text, options, row.template)

    def options(self, run_id: str) -> RunOptions:
        """The options the run was submitted with (without decoding its workflow)."""
        with self._read() as conn:
            options = conn.scalar(sa.select(_RUNS.c.options).where(_RUNS.c.run_id == run_id))
        if options is None:
            raise NotFoundError(f"run {run_id!r} does not exist")
        with _damaged(run_id, "options"):
            return RunOptions.from_json(json.loads(options))

    def plan(self, run_id: str) -> Plan | None:
        """The stored plan (None before the optimizer answered)."""
        with self._read() as conn:
            data = conn.scalar(sa.select(_RUNS.c.plan).where(_RUNS.c.run_id == run_id))
            if data is None:
                self._row(conn, run_id)  # NotFoundError for an unknown run
                return None
        with _damaged(run_id, "plan"):
            return plan_from_proto(common_pb2.Plan.FromString(data))

    def update_run(self, run_id: str, *, expect: Iterable[RunState] | None = None,
                   state: RunState | None = None, workflow: str | None = None,
                   workflow_digest: str | None = None, plan: Plan | None = None,
                   engine: str | None = None, engine_run_id: str | None = None,
                   passes: Sequence[PassReport] | None = None, message: str | None = None,
                   started_at: float | None = _UNSET, finished_at: float | None = _UNSET,
                   retries: int | None = None, clear_steps: bool = False,
                   emit: Sequence[EventKind] = (), encoded_plan: bytes | None = None,
                   refusal: bytes | None = None) -> Run | None:
        """Change a run (revision + 1) and return the new record (without steps).

        With ``expect``, the change is made only while the run is in one of those states
        (checked under a row lock); otherwise nothing changes and None is returned.
        ``emit``: events reporting the change, committed with it (``submitted``,
        ``finished``: they carry the new record; ``refused``: ``refusal``, an encoded
        ``DocumentRefused``). ``encoded_plan``: ``plan``'s protobuf encoding when the
        caller has it (stored as given).
        """
        with self._write() as conn:
            row = self._row(conn, run_id, lock=True)
            if expect is not None and _run_state(row) not in set(expect):
                return None
            changes: dict[str, Any] = {}
            if state is not None:
                changes["state"] = state.value
            if workflow is not None:
                changes["workflow"] = workflow
            if workflow_digest is not None:
                changes["workflow_digest"] = workflow_digest
            if plan is not None:
                changes["plan"] = (encoded_plan if encoded_plan is not None
                                   else plan_to_proto(plan).SerializeToString())
            if engine is not None:
                changes["engine"] = engine
            if engine_run_id is not None:
                changes["engine_run_id"] = engine_run_id
            if passes is not None:
                changes["passes"] = json.dumps([{"name": p.name, "changed": p.changed,
                                                 "notes": list(p.notes),
                                                 "duration_ms": p.duration_ms}
                                                for p in map(bounded_report, passes)])
            if message is not None:
                changes["message"] = message
            if started_at is not _UNSET:
                changes["started_at"] = started_at
            if finished_at is not _UNSET:
                changes["finished_at"] = finished_at
            if retries is not None:
                changes["retries"] = retries
            if clear_steps:
                conn.execute(sa.delete(_STEPS).where(_STEPS.c.run_id == run_id))
                changes["step_count"] = changes["cached_step_count"] = 0
            changes["revision"] = row.revision + 1
            plan_data = changes.pop("plan", None)
            for name, value in changes.items():
                setattr(row, name, value)
            if plan_data is not None:
                conn.execute(_UPDATE_HEADER_PLAN, {**vars(row), "k_run_id": run_id,
                                                   "plan": plan_data})
            else:
                self._save(conn, row)
            for kind in emit:
                self._emit(conn, row, kind, refusal if kind is EventKind.REFUSED else None)
            return _run_record(row)

    def emit(self, run_id: str, kind: EventKind) -> Run:
        """Queue an event carrying the run's current record (e.g. ``submitted`` again
        after a restart: the bus drops it when the first one was stored); the record."""
        with self._write() as conn:
            row = self._row(conn, run_id)
            self._emit(conn, row, kind)
            return _run_record(row)

    def put_steps(self, run_id: str, records: Sequence[StepRecord], *,
                  state: RunState | None = None, started_at: float | None = None,
                  samples: Sequence[UtilizationSample] = (),
                  finish: Finish | None = None,
                  unreported: Sequence[StepRecord] = ()) -> Run:
        """Record the latest state of step executions, and their events, in one transaction.

        Every record takes a revision of its own (the run's revision + 1 each), in order;
        a step first seen takes that revision as its position. Each record's ``step``
        event is queued in the same transaction, after the ``samples`` (utilization samples
        of the run's steps, queued as batches: :meth:`queue_samples`).
        ``state`` moves the run along too (PENDING -> RUNNING), only from a non-terminal
        state; ``started_at`` is set when the run has none. ``finish`` ends the run after
        them (one more revision, and its ``finished`` event), as :meth:`update_run` with
        ``expect`` would. ``unreported``: records of steps the engine never reported
        (:mod:`couler_submitter.unreported`), written after ``records`` only when
        ``finish`` ends the run here, and only for a step with no record at all (under
        any key, stored or in ``records``): they never replace what an engine said.
        Returns the record without steps.
        """
        with self._write() as conn:
            row = self._row(conn, run_id, lock=True)
            now_state = _run_state(row)
            if state is not None and not now_state.terminal:
                now_state = state
            ending = finish is not None and now_state in finish.expect
            if not ending:
                unreported = ()
            cached: dict[tuple[str, str], bool] = {}  # the steps stored: whether cached
            names = sorted({r.name for r in records} | {r.name for r in unreported})
            for i in range(0, len(names), _IN_CHUNK):
                for name, key, was in conn.execute(_STEPS_STORED, {
                        "k_run_id": run_id, "k_names": names[i:i + _IN_CHUNK]}):
                    cached[(name, key)] = bool(was)
            if unreported:
                known = {name for name, _ in cached} | {r.name for r in records}
                records = [*records, *(r for r in unreported if r.name not in known)]
            inserted: dict[tuple[str, str], dict[str, Any]] = {}
            updated: dict[tuple[str, str], dict[str, Any]] = {}
            outbox: list[dict[str, Any]] = []
            now = time.time()
            trace = _current_trace()
            revision = row.revision
            step_count = row.step_count or 0
            cached_count = row.cached_step_count or 0
            outbox += self._sample_entries(row, samples, now, trace)
            for rec in records:
                revision += 1
                ident = (rec.name, rec.key)
                values = _step_values(rec)
                values["revision"] = revision
                if ident in inserted:  # first seen earlier in this batch
                    inserted[ident].update(values)
                elif ident in cached:
                    updated[ident] = {**values, "k_run_id": run_id, "k_name": rec.name,
                                      "k_key": rec.key}
                else:
                    inserted[ident] = {"run_id": run_id, "name": rec.name, "key": rec.key,
                                       "position": revision, **values}
                    step_count += 1
                    cached[ident] = False
                cached_count += int(bool(rec.cached)) - int(cached[ident])
                cached[ident] = bool(rec.cached)
                outbox.append(self._entry(row, EventKind.STEP, now,
                                          step_record_to_proto(rec).SerializeToString(), trace))
            if inserted:
                conn.execute(_INSERT_STEP, list(inserted.values()))
            if updated:
                conn.execute(_UPDATE_STEP, list(updated.values()))
            changes: dict[str, Any] = {"step_count": step_count,
                                       "cached_step_count": cached_count,
                                       "revision": max(revision, row.revision + 1)}
            if state is not None and not _run_state(row).terminal:
                changes["state"] = state.value
            if started_at is not None and row.started_at is None:
                changes["started_at"] = started_at
            if finish is not None and ending:
                changes.update(state=finish.state.value, message=finish.message,
                               finished_at=finish.finished_at,
                               revision=changes["revision"] + 1)
            for name, value in changes.items():
                setattr(row, name, value)
            self._save(conn, row)
            if outbox:
                self._queue(conn, outbox)
            if ending:
                self._emit(conn, row, EventKind.FINISHED)
            return _run_record(row)

    def queue_samples(self, samples: Mapping[str, Sequence[UtilizationSample]]) -> int:
        """Queue the utilization samples of runs (by run id) in one transaction, as
        ``samples`` events (``couler.metrics.batch``) of at most :data:`BATCH_SAMPLES`
        samples each; how many events. A run that does not exist (any more) is skipped."""
        if not any(samples.values()):
            return 0
        with self._write() as conn:
            now, trace = time.time(), _current_trace()
            outbox: list[dict[str, Any]] = []
            for run_id, some in samples.items():
                if not some:
                    continue
                try:
                    row = self._row(conn, run_id)
                except NotFoundError:
                    continue
                outbox += self._sample_entries(row, some, now, trace)
            if outbox:
                self._queue(conn, outbox)
            return len(outbox)

    def _sample_entries(self, row: _Fields, samples: Sequence[UtilizationSample], now: float,
                        trace: str) -> list[dict[str, Any]]:
        return [self._entry(row, EventKind.UTILIZATION_BATCH, now, utilization_batch_to_proto(
                    row.run_id, samples[i:i + BATCH_SAMPLES]).SerializeToString(), trace)
                for i in range(0, len(samples), BATCH_SAMPLES)]

    def put_step(self, run_id: str, rec: StepRecord, *, state: RunState | None = None,
                 started_at: float | None = None) -> Run:
        """:meth:`put_steps` of one record."""
        return self.put_steps(run_id, (rec,), state=state, started_at=started_at)

    def runs_in(self, states: Iterable[RunState]) -> list[Run]:
        """Every run in one of ``states``, oldest first (without steps)."""
        values = [s.value for s in states]
        with self._read() as conn:
            rows = conn.execute(sa.select(*_HEADER_COLUMNS).where(_RUNS.c.state.in_(values))
                                .order_by(_RUNS.c.created_at, _RUNS.c.run_id)).all()
        return [_run_record(r) for r in rows]

    def list_runs(self, *, workflow: str = "", states: Iterable[RunState] = (),
                  limit: int = 50, offset: int = 0) -> tuple[list[Run], bool]:
        """Runs newest first from ``offset`` (without steps; counted); ``(runs, more)``."""
        query = sa.select(*_HEADER_COLUMNS)
        if workflow:
            query = query.where(_RUNS.c.workflow == workflow)
        values = [s.value for s in states]
        if values:
            query = query.where(_RUNS.c.state.in_(values))
        query = query.order_by(_RUNS.c.created_at.desc(), _RUNS.c.run_id.desc())
        with self._read() as conn:
            rows = conn.execute(query.offset(offset).limit(limit + 1)).all()
        return [_run_record(r) for r in rows[:limit]], len(rows) > limit

    # ------------------------------------------------------------------ outbox

    def pending_events(self, limit: int, *, after: int = 0) -> list[OutboxEntry]:
        """The oldest ``limit`` events waiting to be published (id > ``after``)."""
        with self._read() as conn:
            return self._pending(conn, limit, after)

    def published(self, ids: Sequence[int], *, requested: Sequence[str] = ()) -> list[Run]:
        """Delete the events JetStream stored; the runs of ``requested`` (their requested
        event was among them) move from ACCEPTED to PLANNING in the same transaction.
        Returns the records of the runs that moved."""
        with self._write() as conn:
            return self._published(conn, ids, requested)

    def next_events(self, limit: int, *, published: Sequence[int] = (),
                    requested: Sequence[str] = ()) -> tuple[list[Run], list[OutboxEntry]]:
        """:meth:`published` (when ``published`` names events) and then
        :meth:`pending_events` in one transaction: ``(runs moved, events waiting)``."""
        if not published:
            return [], self.pending_events(limit)
        with self._write() as conn:
            moved = self._published(conn, published, requested)
            return moved, self._pending(conn, limit, 0)

    @staticmethod
    def _pending(conn: sa.Connection, limit: int, after: int) -> list[OutboxEntry]:
        rows = conn.execute(_PENDING, {"k_after": after, "k_limit": limit}).all()
        return [OutboxEntry(r.id, r.run_id, r.kind, r.workflow, r.engine, r.retries,
                            r.payload or b"", _trace(r.trace), r.attempts) for r in rows]

    @staticmethod
    def _published(conn: sa.Connection, ids: Sequence[int],
                   requested: Sequence[str]) -> list[Run]:
        moved: list[Run] = []
        for i in range(0, len(ids), _IN_CHUNK):
            conn.execute(_DELETE_OUTBOX, {"k_ids": list(ids[i:i + _IN_CHUNK])})
        for run_id in requested:
            found = conn.execute(_SELECT_HEADER_LOCKED, {"k_run_id": run_id}).one_or_none()
            if found is None or found.state != RunState.ACCEPTED.value:
                log.debug("run %s: left ACCEPTED before planning was recorded", run_id)
                continue
            row = SimpleNamespace(**found._mapping)
            row.state, row.revision = RunState.PLANNING.value, row.revision + 1
            RunStore._save(conn, row)
            moved.append(_run_record(row))
        return moved

    def failed_attempt(self, event_id: int, error: str) -> int:
        """Count a failed attempt to publish event ``event_id``; the attempts so far."""
        with session_scope(self._sessions) as session:
            row = session.get(OutboxRow, event_id)
            if row is None:
                return 0
            row.attempts += 1
            row.last_error = error[:2000]
            return row.attempts

    def move_aside(self, event_id: int, reason: str) -> None:
        """Move an event that can never be published to the dead table, with the reason."""
        with session_scope(self._sessions) as session:
            row = session.get(OutboxRow, event_id)
            if row is None:
                return
            session.add(DeadOutboxRow(
                outbox_id=row.id, run_id=row.run_id, kind=row.kind, workflow=row.workflow,
                engine=row.engine, retries=row.retries, payload=row.payload, trace=row.trace,
                created_at=row.created_at, reason=reason, moved_at=time.time()))
            session.delete(row)

    def outbox_size(self) -> int:
        """How many events wait to be published."""
        with session_scope(self._sessions) as session:
            return int(session.scalar(sa.select(sa.func.count()).select_from(OutboxRow)) or 0)

    def dead_events(self) -> list[tuple[int, str, str, str]]:
        """``(outbox id, run id, kind, reason)`` of every event moved aside."""
        with session_scope(self._sessions) as session:
            rows = session.scalars(sa.select(DeadOutboxRow).order_by(DeadOutboxRow.id)).all()
            return [(r.outbox_id, r.run_id, r.kind, r.reason) for r in rows]

    def requeue_unrequested(self) -> int:
        """Queue ``requested`` for ACCEPTED runs that have none queued (runs accepted by a
        version without the outbox); how many."""
        queued = sa.select(_OUTBOX.c.run_id).where(_OUTBOX.c.kind == EventKind.REQUESTED.value)
        with self._write() as conn:
            rows = conn.execute(sa.select(*_HEADER_COLUMNS).where(
                _RUNS.c.state == RunState.ACCEPTED.value, _RUNS.c.run_id.not_in(queued))).all()
            for row in rows:
                self._emit(conn, row, EventKind.REQUESTED)
            return len(rows)

    @staticmethod
    def _entry(row: _Fields, kind: EventKind, now: float, payload: bytes | None,
               trace: str = "") -> dict[str, Any]:
        return {"run_id": row.run_id, "kind": kind.value, "workflow": row.workflow,
                "engine": row.engine, "retries": row.retries, "payload": payload,
                "trace": trace, "created_at": now, "attempts": 0, "last_error": ""}

    def _emit(self, conn: sa.Connection, row: _Fields, kind: EventKind,
              payload: bytes | None = None) -> None:
        if kind in (EventKind.SUBMITTED, EventKind.FINISHED):
            payload = run_to_proto(_run_record(row)).SerializeToString()
        self._queue(conn, [self._entry(row, kind, time.time(), payload, _current_trace())])

    # ------------------------------------------------------------------ templates

    def put_template(self, name: str, wf: ir.Workflow, engine: str,
                     now: float | None = None, *, encoded: bytes | None = None) -> Template:
        """Register (or replace) a template (``encoded``: its protobuf, when known)."""
        digest = ir.digest(wf)
        at = now or time.time()
        data = encoded if encoded is not None else \
            codec.workflow_to_proto(wf).SerializeToString()
        with session_scope(self._sessions) as session:
            row = session.get(TemplateRow, name, with_for_update=True)
            if row is None:
                row = TemplateRow(name=name)
                session.add(row)
            row.workflow = data
            row.engine = engine
            row.workflow_digest = digest
            row.registered_at = at
        return Template(name, wf, engine, digest, at)

    def get_template(self, name: str) -> Template:
        """A registered template; NotFoundError when there is none."""
        with session_scope(self._sessions) as session:
            row = session.get(TemplateRow, name)
            if row is None:
                raise NotFoundError(f"template {name!r} is not registered")
            return self._template(row)

    def templates(self) -> list[Template]:
        """Every registered template, by name."""
        with session_scope(self._sessions) as session:
            rows = session.scalars(sa.select(TemplateRow).order_by(TemplateRow.name)).all()
            found = []
            for row in rows:
                try:
                    found.append(self._template(row))
                except UserError as exc:  # one damaged row must not hide the others
                    log.error("template %r: %s; left out of the list", row.name, exc)
            return found

    # ------------------------------------------------------------------ schedules

    def put_schedule(self, name: str, now: float | None = None) -> ScheduleState:
        """Keep a schedule for template ``name``; a new one's first tick is after ``now``
        (a schedule registered again keeps its state)."""
        at = now or time.time()
        try:
            with session_scope(self._sessions) as session:
                row = session.get(ScheduleRow, name)
                if row is None:
                    session.add(ScheduleRow(name=name, paused=False, last_tick=at,
                                            registered_at=at))
        except ConflictError:
            pass  # another replica registered it at the same time
        return self.schedule(name)

    def drop_schedule(self, name: str) -> None:
        """Forget the schedule of template ``name`` (its workflow has none any more)."""
        with session_scope(self._sessions) as session:
            row = session.get(ScheduleRow, name)
            if row is not None:
                session.delete(row)

    def schedule(self, name: str) -> ScheduleState:
        """A schedule's state; NotFoundError when there is none."""
        found = [s for s in self.schedules() if s.name == name]
        if not found:
            raise NotFoundError(f"schedule {name!r} does not exist")
        return found[0]

    def schedules(self) -> list[ScheduleState]:
        """Every schedule, by name, with its last tick's outcome."""
        last = (sa.select(TickRow.schedule, sa.func.max(TickRow.tick).label("tick"))
                .group_by(TickRow.schedule).subquery())
        query = (sa.select(ScheduleRow.name, ScheduleRow.paused, ScheduleRow.last_tick,
                           TickRow.outcome, TickRow.run_id, TickRow.reason)
                 .select_from(ScheduleRow)
                 .outerjoin(last, last.c.schedule == ScheduleRow.name)
                 .outerjoin(TickRow, sa.and_(TickRow.schedule == last.c.schedule,
                                             TickRow.tick == last.c.tick))
                 .order_by(ScheduleRow.name))
        with self._read() as conn:
            return [ScheduleState(r.name, bool(r.paused), r.last_tick, r.outcome or "",
                                  r.run_id or "", r.reason or "")
                    for r in conn.execute(query)]

    def set_paused(self, name: str, paused: bool, now: float | None = None) -> ScheduleState:
        """Pause or resume a schedule; a resumed one's next tick is after ``now`` (the
        ticks while it was paused are not caught up). NotFoundError for an unknown one."""
        with session_scope(self._sessions) as session:
            row = session.get(ScheduleRow, name, with_for_update=True)
            if row is None:
                raise NotFoundError(f"schedule {name!r} does not exist")
            if row.paused and not paused:
                row.last_tick = max(row.last_tick, now or time.time())
            row.paused = paused
        return self.schedule(name)

    def advance(self, name: str, tick: float) -> None:
        """The schedule's ticks up to ``tick`` are handled (never moves back)."""
        with self._write() as conn:
            conn.execute(sa.update(ScheduleRow).where(ScheduleRow.name == name,
                                                      ScheduleRow.last_tick < tick)
                         .values(last_tick=tick))

    def skip_tick(self, name: str, tick: float, reason: str, now: float | None = None) -> bool:
        """Record that tick ``tick`` of schedule ``name`` launches nothing, and why; False
        when it was handled already (by another submitter)."""
        try:
            with self._write() as conn:
                conn.execute(sa.insert(_TICKS), {
                    "schedule": name, "tick": tick, "outcome": "skipped", "run_id": "",
                    "reason": reason, "at": now or time.time()})
        except ConflictError:
            return False
        return True

    def ticks(self, name: str) -> list[tuple[float, str, str, str]]:
        """``(tick, outcome, run_id, reason)`` of every tick of schedule ``name`` handled,
        oldest first."""
        with self._read() as conn:
            rows = conn.execute(sa.select(_TICKS.c.tick, _TICKS.c.outcome, _TICKS.c.run_id,
                                          _TICKS.c.reason)
                                .where(_TICKS.c.schedule == name).order_by(_TICKS.c.tick))
            return [(r.tick, r.outcome, r.run_id, r.reason) for r in rows]

    def template_runs(self, template: str, states: Iterable[RunState]) -> list[Run]:
        """The runs of ``template`` in one of ``states``, newest first (without steps)."""
        wanted = [s.value for s in states]
        with self._read() as conn:
            rows = conn.execute(sa.select(*_HEADER_COLUMNS).where(
                _RUNS.c.template == template, _RUNS.c.state.in_(wanted))
                .order_by(_RUNS.c.created_at.desc(), _RUNS.c.run_id.desc()))
            return [_run_record(r) for r in rows]

    def delete_runs(self, run_ids: Sequence[str]) -> None:
        """Forget finished runs (a schedule's history limit): their records and steps."""
        if not run_ids:
            return
        with self._write() as conn:
            for start in range(0, len(run_ids), _IN_CHUNK):
                # finished, and no event of theirs waiting to be published
                chunk = conn.execute(sa.select(_RUNS.c.run_id).where(
                    _RUNS.c.run_id.in_(list(run_ids[start:start + _IN_CHUNK])),
                    _RUNS.c.state.in_([s.value for s in RunState if s.terminal]),
                    _RUNS.c.run_id.not_in(sa.select(_OUTBOX.c.run_id)))).scalars().all()
                if chunk:
                    conn.execute(sa.delete(_STEPS).where(_STEPS.c.run_id.in_(chunk)))
                    conn.execute(sa.delete(_RUNS).where(_RUNS.c.run_id.in_(chunk)))

    # ------------------------------------------------------------------ rejections

    def record_rejection(self, durable: str, subject: str, stream_sequence: int,
                         reason: str) -> None:
        """Keep why a consumer terminated a message."""
        with session_scope(self._sessions) as session:
            session.add(RejectionRow(durable=durable, subject=subject,
                                     stream_sequence=stream_sequence, reason=reason,
                                     at=time.time()))

    def rejections(self) -> list[tuple[str, str, int, str]]:
        """``(durable, subject, stream sequence, reason)`` of every terminated message."""
        with session_scope(self._sessions) as session:
            rows = session.scalars(sa.select(RejectionRow).order_by(RejectionRow.id)).all()
            return [(r.durable, r.subject, r.stream_sequence, r.reason) for r in rows]

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _save(conn: sa.Connection, row: SimpleNamespace) -> None:
        """Write ``row`` (read by :meth:`_row`, then changed) back whole."""
        conn.execute(_UPDATE_HEADER, {**vars(row), "k_run_id": row.run_id})

    @staticmethod
    def _row(conn: sa.Connection, run_id: str, *, lock: bool = False) -> SimpleNamespace:
        """The run's row without its two large columns (a namespace a writer may change);
        NotFoundError for an unknown run."""
        found = conn.execute(_SELECT_HEADER_LOCKED if lock else _SELECT_HEADER,
                             {"k_run_id": run_id}).one_or_none()
        if found is None:
            raise NotFoundError(f"run {run_id!r} does not exist")
        return SimpleNamespace(**found._mapping)

    @staticmethod
    def _template(row: TemplateRow) -> Template:
        try:
            wf = codec.workflow_from_proto(common_workflow(row.workflow))
        except (UserError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UserError(f"template {row.name!r}: its stored workflow is damaged and "
                            f"cannot be read ({type(exc).__name__}); register it again") from exc
        return Template(row.name, wf, row.engine, row.workflow_digest, row.registered_at)


def common_workflow(data: bytes) -> workflow_pb2.Workflow:
    """The ``couler.v1.Workflow`` message stored as ``data``."""
    try:
        return workflow_pb2.Workflow.FromString(data)
    except DecodeError as exc:  # a corrupt row: say so
        raise UserError(f"stored workflow cannot be decoded: {exc}") from exc
