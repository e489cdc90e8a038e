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
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from google.protobuf.message import DecodeError
from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

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
    utilization_sample_to_proto,
)
from couler_runtime.store import make_engine, make_session_factory, migrate, session_scope
from couler_submitter.model import RunOptions, RunRequest

__all__ = ["MIGRATIONS", "SERVICE", "EventKind", "OutboxEntry", "RunStore", "parse_page_token"]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SERVICE = "submitter"
_UNSET: Any = object()
_ID = BigInteger().with_variant(Integer(), "sqlite")
_IN_CHUNK = 500  # names per IN (...) list


class EventKind(enum.StrEnum):
    """What an outbox row publishes (the ``service.Events`` method it is handed to)."""

    REQUESTED = "requested"
    SUBMITTED = "submitted"
    STEP = "step"
    UTILIZATION = "utilization"
    FINISHED = "finished"


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


class RejectionRow(Base):
    __tablename__ = "submitter_rejections"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    durable: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(255))
    stream_sequence: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[float] = mapped_column(Float)


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
            ``UtilizationSample`` (utilization), a ``Run`` without steps (submitted,
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


def _step_record(row: StepRow) -> StepRecord:
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
    )


def _run_state(row: RunRow) -> RunState:
    """The row's state; a state that cannot be read counts as FAILED (terminal: nothing
    resumes or changes a run whose record is damaged)."""
    try:
        return RunState(row.state)
    except ValueError:
        return RunState.FAILED


def _fill_step(row: StepRow, rec: StepRecord) -> None:
    row.state = rec.state.value
    row.attempts = rec.attempts
    row.exit_code = rec.exit_code
    row.started_at = rec.started_at
    row.finished_at = rec.finished_at
    row.peak_cpu = rec.peak_cpu
    row.peak_memory_bytes = rec.peak_memory_bytes
    row.outputs = json.dumps(dict(rec.outputs), sort_keys=True)
    row.cache_key = rec.cache_key
    row.cached = rec.cached
    row.message = rec.message
    row.failure_class = rec.failure_class.value if rec.failure_class is not None else ""
    row.artifacts = json.dumps({n: {"digest": a.digest, "size_bytes": a.size_bytes,
                                    "uri": a.uri} for n, a in rec.artifacts.items()},
                               sort_keys=True)


def _run_record(row: RunRow, steps: Sequence[StepRow] = (), next_token: str = "") -> Run:
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

    Args:
        url: The SQLAlchemy URL; the tables are migrated to the newest revision.
    """

    def __init__(self, url: str) -> None:
        self._engine = make_engine(url)
        migrate(self._engine, SERVICE, MIGRATIONS)
        self._sessions = make_session_factory(self._engine)

    def close(self) -> None:
        """Release the connections."""
        self._engine.dispose()

    # ------------------------------------------------------------------ runs

    def create_run(self, run_id: str, request: RunRequest, *, idempotency_key: str = "",
                   now: float | None = None, encoded: bytes | None = None
                   ) -> tuple[Run, bool]:
        """Insert a run in state ACCEPTED, and its ``requested`` event; ``(run, created)``.

        ``encoded`` is the workflow's protobuf encoding when the caller has it (it is
        stored as given rather than encoded again). With an ``idempotency_key`` already
        used, the existing run and False: the UNIQUE constraint decides between
        concurrent submits, not a read before the write. The record has no steps.
        """
        wf = request.workflow
        if wf is not None and encoded is None:
            encoded = codec.workflow_to_proto(wf).SerializeToString()
        at = now or time.time()
        row = RunRow(
            run_id=run_id, idempotency_key=idempotency_key or None,
            workflow=wf.name if wf is not None else "",
            workflow_digest="",
            source="workflow" if wf is not None else "text",
            request=encoded if wf is not None else None,
            text=request.text, template=request.template,
            options=json.dumps(request.options.to_json(), sort_keys=True),
            plan=None, state=RunState.ACCEPTED.value, engine=request.options.engine,
            engine_run_id="", passes="[]", message="", created_at=at,
            started_at=None, finished_at=None, revision=1, retries=0,
            dry_run=request.options.dry_run, step_count=0, cached_step_count=0,
        )
        try:
            with session_scope(self._sessions) as session:
                session.add(row)
                session.flush()
                self._emit(session, row, EventKind.REQUESTED)
        except ConflictError:
            if not idempotency_key:
                raise
            with session_scope(self._sessions) as session:
                found = session.scalars(sa.select(RunRow).where(
                    RunRow.idempotency_key == idempotency_key)).one_or_none()
                if found is None:
                    raise
                return _run_record(found), False
        return _run_record(row), True

    def header(self, run_id: str) -> Run:
        """The run's record without its steps; NotFoundError for an unknown run."""
        with session_scope(self._sessions) as session:
            return _run_record(self._row(session, run_id))

    def get_run(self, run_id: str) -> Run:
        """The run's record with every step, in order (tools and tests; the service reads
        steps a page at a time)."""
        with session_scope(self._sessions) as session:
            row = self._row(session, run_id)
            steps = session.scalars(sa.select(StepRow).where(StepRow.run_id == run_id)
                                    .order_by(StepRow.position)).all()
            return _run_record(row, steps)

    def run_page(self, run_id: str, *, limit: int, after: int = 0) -> Run:
        """The run's record with at most ``limit`` steps, those after position ``after``
        in order; ``next_step_page_token`` names the next page ("" on the last)."""
        with session_scope(self._sessions) as session:
            row = self._row(session, run_id)
            steps = session.scalars(
                sa.select(StepRow).where(StepRow.run_id == run_id, StepRow.position > after)
                .order_by(StepRow.position).limit(limit + 1)).all()
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
        changed = sa.or_(sa.and_(StepRow.revision > since, StepRow.revision <= upto),
                         sa.and_(StepRow.position > since, StepRow.position <= upto))
        with session_scope(self._sessions) as session:
            rows = session.scalars(
                sa.select(StepRow).where(StepRow.run_id == run_id, StepRow.position > after,
                                         changed)
                .order_by(StepRow.position).limit(limit + 1)).all()
            more = len(rows) > limit
            rows = rows[:limit]
            last = rows[-1].position if rows else after
            return tuple(_step_record(r) for r in rows), last, more

    def request(self, run_id: str) -> RunRequest:
        """What the run was submitted with (its workflow decoded)."""
        with session_scope(self._sessions) as session:
            row = self._row(session, run_id)
            with _damaged(run_id, "request"):
                wf = (codec.workflow_from_proto(common_workflow(row.request))
                      if row.request is not None else None)
                options = RunOptions.from_json(json.loads(row.options))
            return RunRequest(wf, row.text, options, row.template)

    def options(self, run_id: str) -> RunOptions:
        """The options the run was submitted with (without decoding its workflow)."""
        with session_scope(self._sessions) as session:
            options = session.scalar(sa.select(RunRow.options).where(RunRow.run_id == run_id))
            if options is None:
                raise NotFoundError(f"run {run_id!r} does not exist")
            with _damaged(run_id, "options"):
                return RunOptions.from_json(json.loads(options))

    def plan(self, run_id: str) -> Plan | None:
        """The stored plan (None before the optimizer answered)."""
        with session_scope(self._sessions) as session:
            data = session.scalar(sa.select(RunRow.plan).where(RunRow.run_id == run_id))
            if data is None:
                self._row(session, run_id)  # NotFoundError for an unknown run
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
                   emit: Sequence[EventKind] = ()) -> Run | None:
        """Change a run (revision + 1) and return the new record (without steps).

        With ``expect``, the change is made only while the run is in one of those states
        (checked under a row lock); otherwise nothing changes and None is returned.
        ``emit``: events reporting the change, committed with it (``submitted``,
        ``finished``: they carry the new record).
        """
        with session_scope(self._sessions) as session:
            row = self._row(session, run_id, lock=True)
            if expect is not None and _run_state(row) not in set(expect):
                return None
            if state is not None:
                row.state = state.value
            if workflow is not None:
                row.workflow = workflow
            if workflow_digest is not None:
                row.workflow_digest = workflow_digest
            if plan is not None:
                row.plan = plan_to_proto(plan).SerializeToString()
            if engine is not None:
                row.engine = engine
            if engine_run_id is not None:
                row.engine_run_id = engine_run_id
            if passes is not None:
                row.passes = json.dumps([{"name": p.name, "changed": p.changed,
                                          "notes": list(p.notes),
                                          "duration_ms": p.duration_ms}
                                         for p in map(bounded_report, passes)])
            if message is not None:
                row.message = message
            if started_at is not _UNSET:
                row.started_at = started_at
            if finished_at is not _UNSET:
                row.finished_at = finished_at
            if retries is not None:
                row.retries = retries
            if clear_steps:
                session.execute(sa.delete(StepRow).where(StepRow.run_id == run_id))
                row.step_count = row.cached_step_count = 0
            row.revision += 1
            session.flush()
            for kind in emit:
                self._emit(session, row, kind)
            return _run_record(row)

    def emit(self, run_id: str, kind: EventKind) -> None:
        """Queue an event carrying the run's current record (e.g. ``submitted`` again
        after a restart: the bus drops it when the first one was stored)."""
        with session_scope(self._sessions) as session:
            self._emit(session, self._row(session, run_id), kind)

    def put_steps(self, run_id: str, records: Sequence[StepRecord], *,
                  state: RunState | None = None, started_at: float | None = None,
                  samples: Sequence[UtilizationSample] = ()) -> Run:
        """Record the latest state of step executions, and their events, in one transaction.

        Every record takes a revision of its own (the run's revision + 1 each), in order;
        a step first seen takes that revision as its position. Each record's ``step``
        event (and each sample's ``utilization`` event) is queued in the same transaction.
        ``state`` moves the run along too (PENDING -> RUNNING), only from a non-terminal
        state; ``started_at`` is set when the run has none. Returns the record without
        steps.
        """
        with session_scope(self._sessions) as session:
            row = self._row(session, run_id, lock=True)
            existing: dict[tuple[str, str], StepRow] = {}
            names = sorted({r.name for r in records})
            for i in range(0, len(names), _IN_CHUNK):
                for step in session.scalars(sa.select(StepRow).where(
                        StepRow.run_id == run_id,
                        StepRow.name.in_(names[i:i + _IN_CHUNK]))):
                    existing[(step.name, step.key)] = step
            outbox: list[dict[str, Any]] = []
            now = time.time()
            trace = _current_trace()
            revision = row.revision
            for rec in records:
                revision += 1
                found = existing.get((rec.name, rec.key))
                if found is not None:
                    step = found
                else:
                    step = StepRow(run_id=run_id, name=rec.name, key=rec.key,
                                   position=revision, cached=False)
                    session.add(step)
                    existing[(rec.name, rec.key)] = step
                    row.step_count = (row.step_count or 0) + 1
                was_cached = bool(step.cached)
                _fill_step(step, rec)
                step.revision = revision
                row.cached_step_count = (row.cached_step_count or 0) + \
                    int(bool(rec.cached)) - int(was_cached)
                outbox.append(self._entry(row, EventKind.STEP, now,
                                          step_record_to_proto(rec).SerializeToString(), trace))
            for sample in samples:
                outbox.append(self._entry(row, EventKind.UTILIZATION, now,
                                          utilization_sample_to_proto(sample)
                                          .SerializeToString(), trace))
            if state is not None and not _run_state(row).terminal:
                row.state = state.value
            if started_at is not None and row.started_at is None:
                row.started_at = started_at
            row.revision = max(revision, row.revision + 1)
            session.flush()
            if outbox:
                session.execute(sa.insert(OutboxRow), outbox)
            return _run_record(row)

    def put_step(self, run_id: str, rec: StepRecord, *, state: RunState | None = None,
                 started_at: float | None = None) -> Run:
        """:meth:`put_steps` of one record."""
        return self.put_steps(run_id, (rec,), state=state, started_at=started_at)

    def runs_in(self, states: Iterable[RunState]) -> list[Run]:
        """Every run in one of ``states``, oldest first (without steps)."""
        values = [s.value for s in states]
        with session_scope(self._sessions) as session:
            rows = session.scalars(sa.select(RunRow).where(RunRow.state.in_(values))
                                   .order_by(RunRow.created_at, RunRow.run_id)).all()
            return [_run_record(r) for r in rows]

    def list_runs(self, *, workflow: str = "", states: Iterable[RunState] = (),
                  limit: int = 50, offset: int = 0) -> tuple[list[Run], bool]:
        """Runs newest first from ``offset`` (without steps; counted); ``(runs, more)``."""
        query = sa.select(RunRow)
        if workflow:
            query = query.where(RunRow.workflow == workflow)
        values = [s.value for s in states]
        if values:
            query = query.where(RunRow.state.in_(values))
        query = query.order_by(RunRow.created_at.desc(), RunRow.run_id.desc())
        with session_scope(self._sessions) as session:
            rows = session.scalars(query.offset(offset).limit(limit + 1)).all()
            return [_run_record(r) for r in rows[:limit]], len(rows) > limit

    # ------------------------------------------------------------------ outbox

    def pending_events(self, limit: int, *, after: int = 0) -> list[OutboxEntry]:
        """The oldest ``limit`` events waiting to be published (id > ``after``)."""
        with session_scope(self._sessions) as session:
            rows = session.scalars(sa.select(OutboxRow).where(OutboxRow.id > after)
                                   .order_by(OutboxRow.id).limit(limit)).all()
            return [OutboxEntry(r.id, r.run_id, r.kind, r.workflow, r.engine, r.retries,
                                r.payload or b"", _trace(r.trace), r.attempts) for r in rows]

    def published(self, ids: Sequence[int]) -> None:
        """Delete the events JetStream stored."""
        with session_scope(self._sessions) as session:
            for i in range(0, len(ids), _IN_CHUNK):
                session.execute(sa.delete(OutboxRow).where(
                    OutboxRow.id.in_(ids[i:i + _IN_CHUNK])))

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
        with session_scope(self._sessions) as session:
            queued = sa.select(OutboxRow.run_id).where(
                OutboxRow.kind == EventKind.REQUESTED.value)
            rows = session.scalars(sa.select(RunRow).where(
                RunRow.state == RunState.ACCEPTED.value, RunRow.run_id.not_in(queued))).all()
            for row in rows:
                self._emit(session, row, EventKind.REQUESTED)
            return len(rows)

    @staticmethod
    def _entry(row: RunRow, kind: EventKind, now: float, payload: bytes | None,
               trace: str = "") -> dict[str, Any]:
        return {"run_id": row.run_id, "kind": kind.value, "workflow": row.workflow,
                "engine": row.engine, "retries": row.retries, "payload": payload,
                "trace": trace, "created_at": now, "attempts": 0, "last_error": ""}

    def _emit(self, session: Session, row: RunRow, kind: EventKind) -> None:
        payload = None
        if kind in (EventKind.SUBMITTED, EventKind.FINISHED):
            payload = run_to_proto(_run_record(row)).SerializeToString()
        session.execute(sa.insert(OutboxRow),
                        [self._entry(row, kind, time.time(), payload, _current_trace())])

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
    def _row(session: Session, run_id: str, *, lock: bool = False) -> RunRow:
        row = session.get(RunRow, run_id, with_for_update=lock)
        if row is None:
            raise NotFoundError(f"run {run_id!r} does not exist")
        return row

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
