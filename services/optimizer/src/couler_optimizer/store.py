"""The optimizer's tables: the monitor's recommendations and the plans it made.

* ``optimizer_recommendations`` — the latest recommendation per (workflow, step, kind);
  an older one arriving late (a redelivery, an out-of-order message) never replaces a
  newer one.
* ``optimizer_plans`` — one row per plan: its summary (run, workflow, engine, pass
  reports, cached steps, chunk count) and, for plans made from events, the whole plan,
  so a redelivered event is answered with the same plan instead of planning (and asking
  the cache) again.
* ``optimizer_learned_budgets`` — per engine, the document-size budget learned from the
  documents it refused as too large (``couler.workflow.refused``), in bytes of compact JSON
  (the split budget's unit): 0.8 x the smallest refused, with that refusal's details for
  the split pass's notes.

Migrations live in ``couler_optimizer/migrations`` and run at start (:meth:`OptimizerStore.open`).
The API is synchronous; the service calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError
from sqlalchemy import (
    BigInteger,
    Engine,
    Float,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    bindparam,
    delete,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from couler import ir
from couler.errors import ConflictError, UserError
from couler.optimize.split import learned_limit
from couler.v1 import common_pb2
from couler_runtime.rpc.records import (
    PassReport,
    Plan,
    Recommendation,
    RecommendationKind,
    plan_from_proto,
    plan_to_proto,
)
from couler_runtime.store import (
    connection_scope,
    make_engine,
    make_session_factory,
    migrate,
    session_scope,
)

__all__ = ["MIGRATIONS", "SERVICE", "LearnedBudget", "OptimizerStore", "PlanSummary"]

log = logging.getLogger(__name__)

SERVICE = "optimizer"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class _Base(DeclarativeBase):
    pass


class _RecommendationRow(_Base):
    __tablename__ = "optimizer_recommendations"

    workflow: Mapped[str] = mapped_column(String(255), primary_key=True)
    step: Mapped[str] = mapped_column(String(255), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    based_on_samples: Mapped[int] = mapped_column(Integer)
    failure_class: Mapped[str | None] = mapped_column(String(32), nullable=True)
    rec_id: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    received_at: Mapped[float] = mapped_column(Float)


class _PlanRow(_Base):
    __tablename__ = "optimizer_plans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(255))
    event_run_id: Mapped[str | None] = mapped_column(String(255), nullable=True, unique=True)
    workflow: Mapped[str] = mapped_column(String(255))
    engine: Mapped[str] = mapped_column(String(32))
    workflow_digest: Mapped[str] = mapped_column(String(80))
    passes: Mapped[str] = mapped_column(Text)
    cached_steps: Mapped[str] = mapped_column(Text)
    chunk_count: Mapped[int] = mapped_column(Integer)
    plan: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class _LearnedBudgetRow(_Base):
    __tablename__ = "optimizer_learned_budgets"

    engine: Mapped[str] = mapped_column(String(32), primary_key=True)
    max_bytes: Mapped[int] = mapped_column(BigInteger)
    refused_bytes: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text)
    run_id: Mapped[str] = mapped_column(String(255))
    workflow: Mapped[str] = mapped_column(String(255))
    refused_at: Mapped[float] = mapped_column(Float)
    refusals: Mapped[int] = mapped_column(Integer)


@dataclass(frozen=True, slots=True)
class LearnedBudget:
    """The budget learned for one engine from the documents it refused for their size.

    Attributes:
        engine: The engine.
        max_bytes: What a document (a chunk) for it is kept within.
        refused_bytes: The smallest document it refused.
        reason: The engine's answer to that one.
        run_id, workflow: The run and workflow it was refused for.
        refused_at: When (seconds since the epoch).
        refusals: How many refusals were received.
    """

    engine: str
    max_bytes: int
    refused_bytes: int
    reason: str
    run_id: str
    workflow: str
    refused_at: float
    refusals: int

    def note(self) -> str:
        """Why the budget is what it is, for the split pass's notes."""
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.refused_at))
        return (f"{self.engine} refused a {self.refused_bytes / 1024:.0f} KiB document at "
                f"{at} (workflow {self.workflow!r}, run {self.run_id}: {self.reason})")


_PLANS: Table = _PlanRow.__table__  # type: ignore[assignment]
_RECS: Table = _RecommendationRow.__table__  # type: ignore[assignment]
# Core statements for what runs once per planned event (no unit of work).
_INSERT_PLAN = _PLANS.insert()
_SELECT_EVENT_PLAN = select(_PLANS.c.plan).where(
    _PLANS.c.event_run_id == bindparam("k_run_id"))
_SELECT_RECOMMENDATIONS = (select(_RECS).where(_RECS.c.workflow == bindparam("k_workflow"))
                           .order_by(_RECS.c.step, _RECS.c.kind))


@dataclass(frozen=True, slots=True)
class PlanSummary:
    """What the optimizer recorded about one plan.

    Attributes:
        run_id: The run it was made for ("" for an Optimize call without one).
        from_event: Whether it answered a planning event (else an Optimize call).
        workflow: The workflow's name.
        engine: The engine it was planned for.
        workflow_digest: The digest of the planned workflow.
        passes: The pass reports, in order (durations not kept).
        cached_steps: The steps whose results are reused.
        chunk_count: How many chunks it was split into (0: not split).
        created_at: When it was made (seconds since the epoch).
    """

    run_id: str
    from_event: bool
    workflow: str
    engine: str
    workflow_digest: str
    passes: tuple[PassReport, ...]
    cached_steps: tuple[str, ...]
    chunk_count: int
    created_at: float


class OptimizerStore:
    """Recommendations and plans in SQL (SQLite or PostgreSQL).

    Args:
        engine: The SQLAlchemy engine (migrated: use :meth:`open`).
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sessions = make_session_factory(engine)

    @classmethod
    def open(cls, url: str) -> OptimizerStore:
        """Connect to ``url`` and bring the tables to the current migration."""
        engine = make_engine(url)
        try:
            migrate(engine, SERVICE, MIGRATIONS)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    def close(self) -> None:
        """Close the connections."""
        self._engine.dispose()

    # ------------------------------------------------------------ recommendations

    def put_recommendation(self, rec: Recommendation) -> bool:
        """Keep ``rec`` as the latest for its (workflow, step, kind).

        Returns False (and keeps the stored one) when the stored one is newer, i.e. was
        made later by the monitor; a redelivery of the same recommendation is a no-op.
        """
        now = time.time()
        with session_scope(self._sessions) as session:
            row = session.get(_RecommendationRow, (rec.workflow, rec.step, rec.kind.value))
            if row is None:
                session.add(_RecommendationRow(
                    workflow=rec.workflow, step=rec.step, kind=rec.kind.value, value=rec.value,
                    reason=rec.reason, based_on_samples=rec.based_on_samples,
                    failure_class=rec.failure_class.value if rec.failure_class else None,
                    rec_id=rec.id, created_at=rec.created_at, received_at=now))
                return True
            if (row.created_at is not None and rec.created_at is not None
                    and rec.created_at < row.created_at):
                return False
            row.value, row.reason = rec.value, rec.reason
            row.based_on_samples = rec.based_on_samples
            row.failure_class = rec.failure_class.value if rec.failure_class else None
            row.rec_id, row.created_at, row.received_at = rec.id, rec.created_at, now
            return True

    def recommendations(self, workflow: str) -> tuple[Recommendation, ...]:
        """The latest recommendations for ``workflow``, by step and kind."""
        with connection_scope(self._engine) as conn:
            rows = conn.execute(_SELECT_RECOMMENDATIONS, {"k_workflow": workflow}).all()
            found = []
            for r in rows:
                try:
                    found.append(Recommendation(
                        workflow=r.workflow, step=r.step, kind=RecommendationKind(r.kind),
                        value=str(r.value), reason=str(r.reason or ""),
                        based_on_samples=r.based_on_samples, created_at=r.created_at,
                        failure_class=(ir.FailureClass(r.failure_class) if r.failure_class
                                       else None),
                        id=str(r.rec_id or "")))
                except (ValueError, TypeError) as exc:  # a damaged row is not applied
                    log.error("workflow %r, step %r: a stored recommendation cannot be read "
                              "(%s); not applied", workflow, r.step, exc)
            return tuple(found)

    # ------------------------------------------------------------ learned budgets

    def put_refusal(self, engine: str, size_bytes: int, *, reason: str, run_id: str,
                    workflow: str, at: float) -> LearnedBudget:
        """Learn from ``engine`` refusing a ``size_bytes`` document: its budget becomes
        ``learned_limit(size_bytes)`` unless a smaller one was learned. Returns the budget
        kept. A redelivered refusal changes nothing but the count."""
        if size_bytes <= 0:
            raise UserError(f"refusal of run {run_id!r} by engine {engine!r}: field "
                            f"'size_bytes' must be positive (got {size_bytes})")
        with session_scope(self._sessions) as session:
            row = session.get(_LearnedBudgetRow, engine, with_for_update=True)
            if row is None:
                row = _LearnedBudgetRow(
                    engine=engine, max_bytes=learned_limit(size_bytes),
                    refused_bytes=size_bytes, reason=reason, run_id=run_id,
                    workflow=workflow, refused_at=at, refusals=1)
                session.add(row)
            else:
                row.refusals += 1
                if size_bytes < row.refused_bytes:
                    row.max_bytes, row.refused_bytes = learned_limit(size_bytes), size_bytes
                    row.reason, row.run_id, row.workflow = reason, run_id, workflow
                    row.refused_at = at
            session.flush()
            return _learned(row)

    def learned_budget(self, engine: str) -> LearnedBudget | None:
        """The budget learned for ``engine``, if it refused a document (and the row reads)."""
        with session_scope(self._sessions) as session:
            row = session.get(_LearnedBudgetRow, engine)
            if row is None:
                return None
            try:
                found = _learned(row)
            except (ValueError, TypeError) as exc:  # damaged: plan with the static budget
                log.error("engine %r: the learned budget cannot be read (%s); not applied",
                          engine, exc)
                return None
            if found.max_bytes <= 0:
                log.error("engine %r: the learned budget %d is not positive; not applied",
                          engine, found.max_bytes)
                return None
            return found

    # ---------------------------------------------------------------------- plans

    def save_plan(self, plan: Plan, *, run_id: str = "", from_event: bool = False) -> Plan:
        """Record ``plan``; for an event plan, the whole plan once per run.

        Returns the plan recorded for the run: ``plan``, or the one an earlier delivery
        of the same event recorded first (then ``plan`` is not recorded).
        """
        encoded = plan_to_proto(plan) if from_event else None
        kept = self.save_encoded(plan, encoded, run_id=run_id)
        if kept is encoded:
            return plan
        assert kept is not None  # an event plan recorded first
        return plan_from_proto(kept)

    def save_encoded(self, plan: Plan, encoded: common_pb2.Plan | None, *,
                     run_id: str = "") -> common_pb2.Plan | None:
        """:meth:`save_plan` of ``plan`` already encoded: an event plan when ``encoded``
        is given (kept whole). Returns the encoding recorded for the run: ``encoded``, or
        the one an earlier delivery of the same event recorded first."""
        from_event = encoded is not None
        values = {
            "run_id": run_id, "event_run_id": run_id if from_event else None,
            "workflow": plan.workflow.name, "engine": plan.engine,
            "workflow_digest": plan.workflow_digest,
            "passes": json.dumps([{"name": p.name, "changed": p.changed,
                                   "notes": list(p.notes)} for p in plan.passes]),
            "cached_steps": json.dumps(sorted(plan.cached)), "chunk_count": len(plan.chunks),
            "plan": encoded.SerializeToString() if encoded is not None else None,
            "created_at": time.time()}
        try:
            with connection_scope(self._engine) as conn:
                conn.execute(_INSERT_PLAN, values)
        except ConflictError:
            if not from_event:
                raise
            earlier = self.event_plan_message(run_id)
            if earlier is not None:
                return earlier
            with connection_scope(self._engine) as conn:  # the recorded one is damaged
                conn.execute(delete(_PLANS).where(_PLANS.c.event_run_id == run_id))
                conn.execute(_INSERT_PLAN, values)
        return encoded

    def replace_event_plan(self, plan: Plan, encoded: common_pb2.Plan, *,
                           run_id: str) -> None:
        """Record ``plan`` as the event plan of ``run_id`` instead of the one recorded (the
        run was planned again: its engine refused the first plan's document)."""
        with connection_scope(self._engine) as conn:
            conn.execute(delete(_PLANS).where(_PLANS.c.event_run_id == run_id))
        self.save_encoded(plan, encoded, run_id=run_id)

    def event_plan(self, run_id: str) -> Plan | None:
        """The plan recorded for the event of run ``run_id``, if one was."""
        message = self.event_plan_message(run_id)
        return plan_from_proto(message) if message is not None else None

    def event_plan_message(self, run_id: str) -> common_pb2.Plan | None:
        """The plan recorded for the event of run ``run_id`` as its ``couler.v1.Plan``, if
        one was (and it can be read)."""
        with connection_scope(self._engine) as conn:
            data = conn.scalar(_SELECT_EVENT_PLAN, {"k_run_id": run_id})
        if data is None:
            return None
        try:
            message = common_pb2.Plan.FromString(data)
            plan_from_proto(message)  # a damaged plan is made again, not sent on
        except (UserError, DecodeError, ValueError, TypeError) as exc:
            log.error("run %s: the stored plan cannot be read (%s); planning again", run_id,
                      type(exc).__name__)
            return None
        return message

    def history(self, workflow: str | None = None, *, run_id: str | None = None
                ) -> tuple[PlanSummary, ...]:
        """The plans recorded, oldest first; only ``workflow``'s / ``run_id``'s when given."""
        query = select(_PlanRow).order_by(_PlanRow.id)
        if workflow is not None:
            query = query.where(_PlanRow.workflow == workflow)
        if run_id is not None:
            query = query.where(_PlanRow.run_id == run_id)
        with session_scope(self._sessions) as session:
            rows = session.scalars(query).all()
            return tuple(
                PlanSummary(
                    run_id=r.run_id, from_event=r.event_run_id is not None,
                    workflow=r.workflow, engine=r.engine, workflow_digest=r.workflow_digest,
                    passes=_passes(r.passes), cached_steps=_names(r.cached_steps),
                    chunk_count=r.chunk_count, created_at=r.created_at)
                for r in rows)


def _learned(row: _LearnedBudgetRow) -> LearnedBudget:
    return LearnedBudget(engine=row.engine, max_bytes=int(row.max_bytes),
                         refused_bytes=int(row.refused_bytes), reason=str(row.reason),
                         run_id=str(row.run_id), workflow=str(row.workflow),
                         refused_at=float(row.refused_at), refusals=int(row.refusals))


def _passes(text: str) -> tuple[PassReport, ...]:
    """The stored pass reports; none when the row is damaged."""
    try:
        return tuple(PassReport(str(p["name"]), bool(p["changed"]),
                                tuple(str(n) for n in p["notes"]))
                     for p in json.loads(text))
    except (ValueError, TypeError, KeyError):
        return ()


def _names(text: str) -> tuple[str, ...]:
    """The stored step names; none when the row is damaged."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError):
        return ()
    return tuple(str(n) for n in value) if isinstance(value, list) else ()
