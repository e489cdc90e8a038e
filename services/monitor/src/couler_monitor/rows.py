"""What the monitor's stored rows read as: records, and numbers a record can carry.

It owns turning stored rows into the record types the monitor answers with (runs, steps,
recommendations, planned requests, rollups) and reading a damaged row defensively: a number
that is not one, a time a record cannot carry, a state or class that does not exist (noted
in the record's message, or the row left out and logged).
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Sequence
from typing import TypeVar

from couler import ir
from couler.engines.base import StepState
from couler_monitor.store import RecommendationRow, RollupRow, RunRow, StepRequestRow, StepRow
from couler_runtime.rpc.records import (
    Recommendation,
    RecommendationKind,
    Run,
    RunState,
    StepRecord,
    StepRequests,
    UtilizationRollup,
)

E = TypeVar("E", bound=enum.Enum)
log = logging.getLogger(__name__)

_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
_LAST_SECOND = 253402300799.0  # 9999-12-31T23:59:59Z, the last a Timestamp holds


def _finite(value: object) -> float | None:
    """A stored number that is one (None for garbage, NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _bytes(value: object) -> int | None:
    return value if isinstance(value, int) and 0 <= value <= _INT64 else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _time(value: float | None) -> float | None:
    """A stored time a record can carry (None when it is not one)."""
    return value if value is None or 0 <= value <= _LAST_SECOND else None


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


def _requests(q: StepRequestRow) -> StepRequests:
    def text(value: object) -> str:
        return value if isinstance(value, str) else ""

    return StepRequests(q.step, ir.Resources(
        cpu_request=text(q.cpu_request), memory_request=text(q.memory_request),
        cpu_limit=text(q.cpu_limit), memory_limit=text(q.memory_limit)),
        run_id=text(q.run_id), at=_time(_finite(q.updated_at)))
