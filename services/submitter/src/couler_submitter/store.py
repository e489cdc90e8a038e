"""Run records in SQL: runs, their steps, registered templates, terminated messages.

Tables (created by ``couler_submitter/migrations``, version table
``alembic_version_submitter``):

* ``submitter_runs`` -- one row per run: the request (workflow protobuf or text), options,
  the plan once optimized, state, engine ids, pass reports, times, ``revision`` (bumped by
  every change, so watchers can order records) and ``retries``. ``idempotency_key`` is
  UNIQUE: two Submits with one key race on the insert, and the loser reads the winner's row.
* ``submitter_steps`` -- the latest record of each step execution ``(run_id, name, key)``.
* ``submitter_templates`` -- registered templates (workflow protobuf, default engine).
* ``submitter_rejections`` -- messages the consumers terminated, with the reason.

The API is synchronous; the service calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from google.protobuf.message import DecodeError
from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from couler import ir
from couler.engines.base import StepState
from couler.errors import ConflictError, NotFoundError, UserError
from couler.v1 import common_pb2, workflow_pb2
from couler_runtime import codec
from couler_runtime.rpc.records import (
    PassReport,
    Plan,
    Run,
    RunState,
    StepRecord,
    StoredArtifact,
    Template,
    plan_from_proto,
    plan_to_proto,
)
from couler_runtime.store import make_engine, make_session_factory, migrate, session_scope
from couler_submitter.model import RunOptions, RunRequest

__all__ = ["MIGRATIONS", "SERVICE", "RunStore"]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SERVICE = "submitter"
_UNSET: Any = object()


class Base(DeclarativeBase):
    """The submitter's tables."""


class RunRow(Base):
    __tablename__ = "submitter_runs"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True, nullable=True)
    workflow: Mapped[str] = mapped_column(String(255), default="")
    workflow_digest: Mapped[str] = mapped_column(String(80), default="")
    source: Mapped[str] = mapped_column(String(16))
    request: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    text: Mapped[str | None] = mapped_column(Text, nullable=True)
    template: Mapped[str] = mapped_column(String(63), default="")
    options: Mapped[str] = mapped_column(Text, default="{}")
    plan: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
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


class StepRow(Base):
    __tablename__ = "submitter_steps"

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("submitter_runs.run_id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(512), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
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


def _step_record(row: StepRow) -> StepRecord:
    artifacts = {name: StoredArtifact(a["digest"], int(a.get("size_bytes", 0)), a.get("uri", ""))
                 for name, a in json.loads(row.artifacts).items()}
    return StepRecord(
        name=row.name, key=row.key, state=StepState(row.state), attempts=row.attempts,
        exit_code=row.exit_code, started_at=row.started_at, finished_at=row.finished_at,
        peak_cpu=row.peak_cpu, peak_memory_bytes=row.peak_memory_bytes,
        outputs=json.loads(row.outputs), cache_key=row.cache_key, cached=row.cached,
        message=row.message,
        failure_class=ir.FailureClass(row.failure_class) if row.failure_class else None,
        artifacts=artifacts,
    )


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


def _run_record(row: RunRow, steps: Sequence[StepRow]) -> Run:
    options = RunOptions.from_json(json.loads(row.options))
    passes = tuple(PassReport(p["name"], bool(p.get("changed")), tuple(p.get("notes", ())),
                              float(p.get("duration_ms", 0.0)))
                   for p in json.loads(row.passes))
    return Run(
        run_id=row.run_id, state=RunState(row.state), workflow=row.workflow, engine=row.engine,
        engine_run_id=row.engine_run_id,
        steps=tuple(_step_record(s) for s in sorted(steps, key=lambda s: s.position)),
        created_at=row.created_at, started_at=row.started_at, finished_at=row.finished_at,
        message=row.message, passes=passes, idempotency_key=row.idempotency_key or "",
        parameters=dict(options.parameters), workflow_digest=row.workflow_digest,
        template=row.template, dry_run=row.dry_run, revision=row.revision, retries=row.retries,
    )


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
                   now: float | None = None) -> tuple[Run, bool]:
        """Insert a run in state ACCEPTED; ``(run, created)``.

        With an ``idempotency_key`` already used, the existing run and False: the UNIQUE
        constraint decides between concurrent submits, not a read before the write.
        """
        wf = request.workflow
        row = RunRow(
            run_id=run_id, idempotency_key=idempotency_key or None,
            workflow=wf.name if wf is not None else "",
            workflow_digest="",
            source="workflow" if wf is not None else "text",
            request=codec.workflow_to_proto(wf).SerializeToString() if wf is not None else None,
            text=request.text, template=request.template,
            options=json.dumps(request.options.to_json(), sort_keys=True),
            plan=None, state=RunState.ACCEPTED.value, engine=request.options.engine,
            engine_run_id="", passes="[]", message="", created_at=now or time.time(),
            started_at=None, finished_at=None, revision=1, retries=0,
            dry_run=request.options.dry_run,
        )
        try:
            with session_scope(self._sessions) as session:
                session.add(row)
        except ConflictError:
            if not idempotency_key:
                raise
            with session_scope(self._sessions) as session:
                found = session.scalars(sa.select(RunRow).where(
                    RunRow.idempotency_key == idempotency_key)).one_or_none()
                if found is None:
                    raise
                return self._load(session, found), False
        return self.get_run(run_id), True

    def get_run(self, run_id: str) -> Run:
        """The run's record; NotFoundError for an unknown run."""
        with session_scope(self._sessions) as session:
            return self._load(session, self._row(session, run_id))

    def request(self, run_id: str) -> RunRequest:
        """What the run was submitted with."""
        with session_scope(self._sessions) as session:
            row = self._row(session, run_id)
            wf = (codec.workflow_from_proto(common_workflow(row.request))
                  if row.request is not None else None)
            return RunRequest(wf, row.text, RunOptions.from_json(json.loads(row.options)),
                              row.template)

    def plan(self, run_id: str) -> Plan | None:
        """The stored plan (None before the optimizer answered)."""
        with session_scope(self._sessions) as session:
            row = self._row(session, run_id)
            if row.plan is None:
                return None
            return plan_from_proto(common_pb2.Plan.FromString(row.plan))

    def update_run(self, run_id: str, *, expect: Iterable[RunState] | None = None,
                   state: RunState | None = None, workflow: str | None = None,
                   workflow_digest: str | None = None, plan: Plan | None = None,
                   engine: str | None = None, engine_run_id: str | None = None,
                   passes: Sequence[PassReport] | None = None, message: str | None = None,
                   started_at: float | None = _UNSET, finished_at: float | None = _UNSET,
                   retries: int | None = None, clear_steps: bool = False) -> Run | None:
        """Change a run (revision + 1) and return the new record.

        With ``expect``, the change is made only while the run is in one of those states
        (checked under a row lock); otherwise nothing changes and None is returned.
        """
        with session_scope(self._sessions) as session:
            row = self._row(session, run_id, lock=True)
            if expect is not None and RunState(row.state) not in set(expect):
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
                                          "duration_ms": p.duration_ms} for p in passes])
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
            row.revision += 1
            session.flush()
            return self._load(session, row)

    def put_step(self, run_id: str, rec: StepRecord, *, state: RunState | None = None,
                 started_at: float | None = None) -> Run:
        """Record the latest state of one step execution (revision + 1).

        Returns the run's record *without* its steps (cheap for runs of many steps).
        ``state`` moves the run along too (PENDING -> RUNNING on the first step), only from
        a non-terminal state; ``started_at`` is set when the run has none.
        """
        with session_scope(self._sessions) as session:
            row = self._row(session, run_id, lock=True)
            step = session.get(StepRow, (run_id, rec.name, rec.key))
            if step is None:
                # The run's revision only grows: it orders the steps as first seen, without
                # counting them (a run may have 100k steps).
                step = StepRow(run_id=run_id, name=rec.name, key=rec.key,
                               position=row.revision)
                session.add(step)
            _fill_step(step, rec)
            if state is not None and not RunState(row.state).terminal:
                row.state = state.value
            if started_at is not None and row.started_at is None:
                row.started_at = started_at
            row.revision += 1
            session.flush()
            return _run_record(row, ())

    def runs_in(self, states: Iterable[RunState]) -> list[Run]:
        """Every run in one of ``states``, oldest first."""
        values = [s.value for s in states]
        with session_scope(self._sessions) as session:
            rows = session.scalars(sa.select(RunRow).where(RunRow.state.in_(values))
                                   .order_by(RunRow.created_at, RunRow.run_id)).all()
            return [self._load(session, r) for r in rows]

    def list_runs(self, *, workflow: str = "", states: Iterable[RunState] = (),
                  limit: int = 50, offset: int = 0) -> tuple[list[Run], bool]:
        """Runs newest first from ``offset``; ``(runs, more)``."""
        query = sa.select(RunRow)
        if workflow:
            query = query.where(RunRow.workflow == workflow)
        values = [s.value for s in states]
        if values:
            query = query.where(RunRow.state.in_(values))
        query = query.order_by(RunRow.created_at.desc(), RunRow.run_id.desc())
        with session_scope(self._sessions) as session:
            rows = session.scalars(query.offset(offset).limit(limit + 1)).all()
            return [self._load(session, r) for r in rows[:limit]], len(rows) > limit

    # ------------------------------------------------------------------ templates

    def put_template(self, name: str, wf: ir.Workflow, engine: str,
                     now: float | None = None) -> Template:
        """Register (or replace) a template."""
        digest = ir.digest(wf)
        at = now or time.time()
        with session_scope(self._sessions) as session:
            row = session.get(TemplateRow, name, with_for_update=True)
            if row is None:
                row = TemplateRow(name=name)
                session.add(row)
            row.workflow = codec.workflow_to_proto(wf).SerializeToString()
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
            return [self._template(r) for r in rows]

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
    def _load(session: Session, row: RunRow) -> Run:
        steps = session.scalars(sa.select(StepRow).where(StepRow.run_id == row.run_id)).all()
        return _run_record(row, steps)

    @staticmethod
    def _template(row: TemplateRow) -> Template:
        wf = codec.workflow_from_proto(common_workflow(row.workflow))
        return Template(row.name, wf, row.engine, row.workflow_digest, row.registered_at)


def common_workflow(data: bytes) -> workflow_pb2.Workflow:
    """The ``couler.v1.Workflow`` message stored as ``data``."""
    try:
        return workflow_pb2.Workflow.FromString(data)
    except DecodeError as exc:  # a corrupt row: say so
        raise UserError(f"stored workflow cannot be decoded: {exc}") from exc
