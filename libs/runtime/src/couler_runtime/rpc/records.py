"""Frozen dataclasses for the contract's records, and their protobuf conversions.

The IR travels as ``couler.v1.Workflow`` and is converted by :mod:`couler_runtime.codec`;
everything else the services exchange (runs, step records, plans, cache entries,
reports, samples, recommendations) has a small dataclass here with ``to_proto`` /
``from_proto`` functions, so that services and clients handle Python values and touch
protobuf only at the edge. Times are seconds since the epoch (``float``, kept to the
nanosecond on the wire), as in
:class:`couler.engines.base.StepStatus`; ``None`` means "not yet" or "unknown".

Enums mirror the proto enums member for member (``RUN_STATE_FAILED`` ⇄
``RunState.FAILED``); the mapping is checked when this module is imported.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.timestamp_pb2 import Timestamp

from couler import ir
from couler.engines import base
from couler.errors import InvalidWorkflowError
from couler.v1 import cache_service_pb2, common_pb2, events_pb2, monitor_service_pb2
from couler.v1 import workflow_pb2 as wpb
from couler_runtime import codec

__all__ = [
    "MAX_NOTES",
    "MAX_NOTE_CHARS",
    "BlobRef",
    "CacheEntry",
    "CacheOrder",
    "CachePage",
    "CacheStats",
    "Chunk",
    "CommitResult",
    "EvictResult",
    "GenerationReport",
    "ListedEntry",
    "LookupResult",
    "Objective",
    "PassReport",
    "PinResult",
    "Plan",
    "Recommendation",
    "RecommendationKind",
    "RecommendationReport",
    "Run",
    "RunState",
    "StepPeak",
    "StepRecord",
    "StepRequests",
    "StoredArtifact",
    "Template",
    "Utilization",
    "UtilizationRollup",
    "UtilizationSample",
    "recommendation_json",
]

E = TypeVar("E", bound=enum.Enum)


class RunState(enum.StrEnum):
    """A run's state as the submitter records it: the engines' states plus two before."""

    ACCEPTED = "accepted"  # recorded; planning not started
    PLANNING = "planning"  # being generated / optimized
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the run will not change state again (until a Retry)."""
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)

    @classmethod
    def from_engine(cls, state: base.RunState) -> RunState:
        """The record state for an engine's normalized run state."""
        return cls(state.value)


class RecommendationKind(enum.StrEnum):
    """What a recommendation adjusts (see ``couler.v1.RecommendationKind``)."""

    MEMORY_REQUEST = "memory_request"
    CPU_REQUEST = "cpu_request"
    RETRY = "retry"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    RETRY_BACKOFF = "retry_backoff"  # the first retry's back-off, whole seconds


class Objective(enum.StrEnum):
    """What the optimizer weighs."""

    LATENCY = "latency"
    COST = "cost"
    RELIABILITY = "reliability"


class _Enum(Generic[E]):
    """A Python enum ⇄ the proto enum whose values are ``PREFIX_<MEMBER NAME>``."""

    def __init__(self, py: type[E], proto: EnumTypeWrapper, prefix: str) -> None:
        self._names = {m: f"{prefix}_{m.name}" for m in py}
        # Value() raises at import if the proto lacks a member.
        self._from = {proto.Value(name): m for m, name in self._names.items()}
        if set(proto.values()) - set(self._from) != {0}:
            raise RuntimeError(f"proto enum {prefix} does not mirror {py.__name__}")
        self._prefix = prefix

    def to_proto(self, member: E | None) -> str:
        """The proto value's name (message constructors accept enum names)."""
        return f"{self._prefix}_UNSPECIFIED" if member is None else self._names[member]

    def from_proto(self, number: int, where: str) -> E:
        member = self._from.get(number)
        if member is None:
            problem = "is not set" if number == 0 else f"has unknown value {number}"
            raise InvalidWorkflowError(f"{where}: {self._prefix} {problem}")
        return member

    def optional(self, number: int, where: str) -> E | None:
        return None if number == 0 else self.from_proto(number, where)


_RUN_STATE = _Enum(RunState, common_pb2.RunState, "RUN_STATE")
_STEP_STATE = _Enum(base.StepState, common_pb2.StepState, "STEP_STATE")
_KIND = _Enum(RecommendationKind, common_pb2.RecommendationKind, "RECOMMENDATION_KIND")
_OBJECTIVE = _Enum(Objective, common_pb2.Objective, "OBJECTIVE")
_FAILURE = _Enum(ir.FailureClass, wpb.FailureClass, "FAILURE_CLASS")


def run_states_to_proto(states: Iterable[RunState]) -> list[str]:
    """Proto value names of ``states`` (for ``ListRunsRequest.states``)."""
    return [_RUN_STATE.to_proto(s) for s in states]


def run_states_from_proto(values: Iterable[int]) -> tuple[RunState, ...]:
    """The states of a ``ListRunsRequest``."""
    return tuple(_RUN_STATE.from_proto(v, "states") for v in values)


def objectives_to_proto(objectives: Iterable[Objective]) -> list[str]:
    """Proto values of ``objectives``."""
    return [_OBJECTIVE.to_proto(o) for o in objectives]


def objectives_from_proto(values: Iterable[int]) -> tuple[Objective, ...]:
    """The objectives of a request."""
    return tuple(_OBJECTIVE.from_proto(v, "objectives") for v in values)


# =========================================================================== time


def _ts(seconds: float | None) -> Timestamp | None:
    if seconds is None:
        return None
    whole = math.floor(seconds)
    nanos = round((seconds - whole) * 1e9)  # exact split: no precision lost to 1e18 ns
    if nanos == 1_000_000_000:
        whole, nanos = whole + 1, 0
    return Timestamp(seconds=whole, nanos=nanos)


def _seconds(msg: object, name: str) -> float | None:
    if not msg.HasField(name):  # type: ignore[attr-defined]
        return None
    ts: Timestamp = getattr(msg, name)
    return ts.seconds + ts.nanos / 1e9


# =========================================================================== runs


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step (one map item / loop iteration: ``key``) of a run."""

    name: str
    state: base.StepState
    key: str = ""
    attempts: int = 0
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    peak_cpu: float | None = None  # cores
    peak_memory_bytes: int | None = None
    outputs: Mapping[str, str] = field(default_factory=dict)
    cache_key: str = ""
    cached: bool = False
    message: str = ""
    failure_class: ir.FailureClass | None = None
    artifacts: Mapping[str, StoredArtifact] = field(default_factory=dict)  # outputs, stored
    cache_lineage: tuple[str, ...] = ()  # the cache keys of the steps it read from
    cache_saved_seconds: float = 0.0  # cached: the compute its reuse saved (entry's cost)
    failure_reason: str = ""  # why of failure_class, and whether it was retried

    @classmethod
    def from_status(
        cls, status: base.StepStatus, *, cache_key: str = "",
        failure_class: ir.FailureClass | None = None,
        failure_reason: str = "",
    ) -> StepRecord:
        """The record of an engine's :class:`~couler.engines.base.StepStatus`.

        ``failure_class`` / ``failure_reason`` default to the engine's own (``status.failure``).
        """
        if failure_class is None and status.failure:
            failure_class = ir.FailureClass(status.failure)
        return cls(
            name=status.step, state=status.state, key=status.key, attempts=status.attempts,
            exit_code=status.exit_code, started_at=status.started_at,
            finished_at=status.finished_at, peak_cpu=status.peak_cpu,
            peak_memory_bytes=status.peak_memory_bytes, outputs=dict(status.outputs),
            cache_key=cache_key or status.cache_key,
            cached=status.state is base.StepState.CACHED,
            message=status.message, failure_class=failure_class,
            cache_lineage=tuple(status.cache_lineage),
            cache_saved_seconds=status.cache_saved_seconds,
            failure_reason=failure_reason or status.failure_reason,
        )


def step_record_to_proto(r: StepRecord) -> common_pb2.StepRecord:
    """The ``couler.v1.StepRecord`` of ``r``."""
    return common_pb2.StepRecord(
        name=r.name, key=r.key, state=_STEP_STATE.to_proto(r.state), attempts=r.attempts,
        exit_code=r.exit_code, started_at=_ts(r.started_at), finished_at=_ts(r.finished_at),
        peak_cpu=r.peak_cpu, peak_memory_bytes=r.peak_memory_bytes, outputs=dict(r.outputs),
        cache_key=r.cache_key, cached=r.cached, message=r.message,
        failure_class=_FAILURE.to_proto(r.failure_class),
        artifacts={n: common_pb2.StoredArtifact(digest=a.digest, size_bytes=a.size_bytes,
                                                uri=a.uri) for n, a in r.artifacts.items()},
        cache_lineage=list(r.cache_lineage), cache_saved_seconds=r.cache_saved_seconds,
        failure_reason=r.failure_reason,
    )


def step_record_from_proto(m: common_pb2.StepRecord) -> StepRecord:
    """The :class:`StepRecord` of ``m``."""
    where = f"step {m.name!r}"
    return StepRecord(
        name=m.name, key=m.key, state=_STEP_STATE.from_proto(m.state, f"{where}, state"),
        attempts=m.attempts, exit_code=m.exit_code if m.HasField("exit_code") else None,
        started_at=_seconds(m, "started_at"), finished_at=_seconds(m, "finished_at"),
        peak_cpu=m.peak_cpu if m.HasField("peak_cpu") else None,
        peak_memory_bytes=m.peak_memory_bytes if m.HasField("peak_memory_bytes") else None,
        outputs=dict(m.outputs), cache_key=m.cache_key, cached=m.cached, message=m.message,
        failure_class=_FAILURE.optional(m.failure_class, f"{where}, failure_class"),
        artifacts={n: StoredArtifact(a.digest, a.size_bytes, a.uri)
                   for n, a in m.artifacts.items()},
        cache_lineage=tuple(m.cache_lineage), cache_saved_seconds=m.cache_saved_seconds,
        failure_reason=m.failure_reason,
    )


@dataclass(frozen=True, slots=True)
class PassReport:
    """What one optimizer pass did."""

    name: str
    changed: bool = False
    notes: tuple[str, ...] = ()
    duration_ms: float = 0.0


MAX_NOTES = 50  # notes kept per pass report
MAX_NOTE_CHARS = 1000  # characters kept per note


def _cut(note: str) -> str:
    return note if len(note) <= MAX_NOTE_CHARS else note[:MAX_NOTE_CHARS - 1] + "…"


def bounded_notes(notes: Iterable[str]) -> tuple[str, ...]:
    """``notes`` bounded as ``couler.v1.PassReport`` documents: at most :data:`MAX_NOTES`
    (the last counting those left out), each at most :data:`MAX_NOTE_CHARS` characters."""
    items = list(notes)
    if len(items) <= MAX_NOTES:
        return tuple(_cut(n) for n in items)
    kept = [_cut(n) for n in items[:MAX_NOTES - 1]]
    return (*kept, f"{len(items) - len(kept)} more notes left out")


def bounded_report(r: PassReport) -> PassReport:
    """``r`` with :func:`bounded_notes` (itself when already within the bounds)."""
    if len(r.notes) <= MAX_NOTES and all(len(n) <= MAX_NOTE_CHARS for n in r.notes):
        return r
    return PassReport(r.name, r.changed, bounded_notes(r.notes), r.duration_ms)


def pass_report_to_proto(r: PassReport) -> common_pb2.PassReport:
    """The ``couler.v1.PassReport`` of ``r``."""
    return common_pb2.PassReport(name=r.name, changed=r.changed, notes=list(r.notes),
                                 duration_ms=r.duration_ms)


def pass_report_from_proto(m: common_pb2.PassReport) -> PassReport:
    """The :class:`PassReport` of ``m``."""
    return PassReport(m.name, m.changed, tuple(m.notes), m.duration_ms)


@dataclass(frozen=True, slots=True)
class Run:
    """The submitter's record of one run."""

    run_id: str
    state: RunState
    workflow: str = ""
    engine: str = ""
    engine_run_id: str = ""
    steps: tuple[StepRecord, ...] = ()
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    message: str = ""
    passes: tuple[PassReport, ...] = ()
    idempotency_key: str = ""
    parameters: Mapping[str, str] = field(default_factory=dict)
    workflow_digest: str = ""
    template: str = ""
    dry_run: bool = False
    revision: int = 0
    retries: int = 0
    # How many step records the run has in all (``steps`` may hold a page of them, the
    # ones that changed, or none) and how many of them were cached; the token of the next
    # page of steps when ``steps`` is one page ("" on the last).
    step_count: int = 0
    cached_step_count: int = 0
    next_step_page_token: str = ""

    def step(self, name: str, key: str = "") -> StepRecord:
        """The record of step ``name`` (item ``key``); KeyError if there is none."""
        for s in self.steps:
            if s.name == name and s.key == key:
                return s
        raise KeyError(f"run {self.run_id!r} has no step {name!r}" + (f" [{key}]" if key else ""))


def run_to_proto(r: Run) -> common_pb2.Run:
    """The ``couler.v1.Run`` of ``r``."""
    return common_pb2.Run(
        run_id=r.run_id, workflow=r.workflow, state=_RUN_STATE.to_proto(r.state),
        engine=r.engine, engine_run_id=r.engine_run_id,
        steps=[step_record_to_proto(s) for s in r.steps],
        created_at=_ts(r.created_at), started_at=_ts(r.started_at),
        finished_at=_ts(r.finished_at), message=r.message,
        passes=[pass_report_to_proto(p) for p in r.passes],
        idempotency_key=r.idempotency_key, parameters=dict(r.parameters),
        workflow_digest=r.workflow_digest, template=r.template, dry_run=r.dry_run,
        revision=r.revision, retries=r.retries, step_count=r.step_count,
        cached_step_count=r.cached_step_count, next_step_page_token=r.next_step_page_token,
    )


def run_from_proto(m: common_pb2.Run) -> Run:
    """The :class:`Run` of ``m``."""
    return Run(
        run_id=m.run_id, workflow=m.workflow,
        state=_RUN_STATE.from_proto(m.state, f"run {m.run_id!r}, state"),
        engine=m.engine, engine_run_id=m.engine_run_id,
        steps=tuple(step_record_from_proto(s) for s in m.steps),
        created_at=_seconds(m, "created_at"), started_at=_seconds(m, "started_at"),
        finished_at=_seconds(m, "finished_at"), message=m.message,
        passes=tuple(pass_report_from_proto(p) for p in m.passes),
        idempotency_key=m.idempotency_key, parameters=dict(m.parameters),
        workflow_digest=m.workflow_digest, template=m.template, dry_run=m.dry_run,
        revision=m.revision, retries=m.retries, step_count=m.step_count,
        cached_step_count=m.cached_step_count, next_step_page_token=m.next_step_page_token,
    )


@dataclass(frozen=True, slots=True)
class Template:
    """A registered workflow template."""

    name: str
    workflow: ir.Workflow
    engine: str = ""
    workflow_digest: str = ""
    registered_at: float | None = None


def template_to_proto(t: Template) -> common_pb2.Template:
    """The ``couler.v1.Template`` of ``t``."""
    return common_pb2.Template(
        name=t.name, workflow=codec.workflow_to_proto(t.workflow), engine=t.engine,
        workflow_digest=t.workflow_digest, registered_at=_ts(t.registered_at),
    )


def template_from_proto(m: common_pb2.Template) -> Template:
    """The :class:`Template` of ``m``."""
    return Template(m.name, codec.workflow_from_proto(m.workflow), m.engine,
                    m.workflow_digest, _seconds(m, "registered_at"))


# =========================================================================== cache


@dataclass(frozen=True, slots=True)
class BlobRef:
    """Bytes in the shared blob store: ``sha256:<hex>`` digest and size."""

    digest: str
    size_bytes: int


def blob_ref_to_proto(r: BlobRef) -> common_pb2.BlobRef:
    """The ``couler.v1.BlobRef`` of ``r``."""
    return common_pb2.BlobRef(digest=r.digest, size_bytes=r.size_bytes)


def blob_ref_from_proto(m: common_pb2.BlobRef) -> BlobRef:
    """The :class:`BlobRef` of ``m``."""
    return BlobRef(m.digest, m.size_bytes)


@dataclass(frozen=True, slots=True)
class StoredArtifact:
    """An artifact in the artifact store."""

    digest: str
    size_bytes: int = 0
    uri: str = ""


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A cached step result."""

    key: str
    workflow: str = ""
    step: str = ""
    outputs: Mapping[str, str] = field(default_factory=dict)
    artifacts: Mapping[str, StoredArtifact] = field(default_factory=dict)
    size_bytes: int = 0
    created_at: float | None = None
    last_used_at: float | None = None
    hits: int = 0
    cost_seconds: float = 0.0  # compute it took to produce (0: unknown)
    lineage: tuple[str, ...] = ()  # the keys of the entries whose outputs it read
    pinned: bool = False  # never evicted to keep the budget


def cache_entry_to_proto(e: CacheEntry) -> common_pb2.CacheEntry:
    """The ``couler.v1.CacheEntry`` of ``e``."""
    return common_pb2.CacheEntry(
        key=e.key, workflow=e.workflow, step=e.step, outputs=dict(e.outputs),
        artifacts={
            name: common_pb2.StoredArtifact(digest=a.digest, size_bytes=a.size_bytes, uri=a.uri)
            for name, a in e.artifacts.items()
        },
        size_bytes=e.size_bytes, created_at=_ts(e.created_at),
        last_used_at=_ts(e.last_used_at), hits=e.hits, cost_seconds=e.cost_seconds,
        lineage=list(e.lineage), pinned=e.pinned,
    )


def cache_entry_from_proto(m: common_pb2.CacheEntry) -> CacheEntry:
    """The :class:`CacheEntry` of ``m``."""
    return CacheEntry(
        key=m.key, workflow=m.workflow, step=m.step, outputs=dict(m.outputs),
        artifacts={n: StoredArtifact(a.digest, a.size_bytes, a.uri)
                   for n, a in m.artifacts.items()},
        size_bytes=m.size_bytes, created_at=_seconds(m, "created_at"),
        last_used_at=_seconds(m, "last_used_at"), hits=m.hits, cost_seconds=m.cost_seconds,
        lineage=tuple(m.lineage), pinned=m.pinned,
    )


@dataclass(frozen=True, slots=True)
class LookupResult:
    """Entries found by key, and the keys not found."""

    entries: Mapping[str, CacheEntry]
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CommitResult:
    """Whether a commit added the entry, and what it evicted to make room."""

    created: bool
    evicted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EvictResult:
    """What an eviction removed."""

    evicted: tuple[str, ...]
    freed_bytes: int


@dataclass(frozen=True, slots=True)
class PinResult:
    """The keys a pin (or unpin) changed, and those with no entry."""

    keys: tuple[str, ...]
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CacheStats:
    """The cache's size and counters."""

    entries: int
    bytes: int
    hits: int
    misses: int
    evictions: int
    budget_bytes: int  # 0: unlimited


def cache_stats_from_proto(m: cache_service_pb2.StatsResponse) -> CacheStats:
    """The :class:`CacheStats` of ``m``."""
    return CacheStats(m.entries, m.bytes, m.hits, m.misses, m.evictions, m.budget_bytes)


class CacheOrder(enum.StrEnum):
    """The order of a cache listing (``couler.v1.CacheOrder``)."""

    VICTIM = "victim"  # the next entry eviction takes first; pinned ones last
    RECENT = "recent"  # most recently committed or used first
    SIZE = "size"  # largest first
    COST = "cost"  # most compute first


_CACHE_ORDER = _Enum(CacheOrder, cache_service_pb2.CacheOrder, "CACHE_ORDER")


def cache_order_to_proto(order: CacheOrder) -> str:
    """The proto value name of ``order``."""
    return _CACHE_ORDER.to_proto(order)


def cache_order_from_proto(number: int) -> CacheOrder:
    """The order of a ``ListEntriesRequest`` (unspecified: :attr:`CacheOrder.VICTIM`)."""
    return _CACHE_ORDER.optional(number, "list, field 'order'") or CacheOrder.VICTIM


@dataclass(frozen=True, slots=True)
class ListedEntry:
    """A cache entry as a listing shows it, with its current eviction priority."""

    entry: CacheEntry
    priority: float = 0.0
    evicted_at: float | None = None  # its bytes evicted then (its metadata kept)


def listed_entry_to_proto(e: ListedEntry) -> cache_service_pb2.ListedEntry:
    """The ``couler.v1.ListedEntry`` of ``e``."""
    return cache_service_pb2.ListedEntry(entry=cache_entry_to_proto(e.entry),
                                         priority=e.priority, evicted_at=e.evicted_at or 0.0)


def listed_entry_from_proto(m: cache_service_pb2.ListedEntry) -> ListedEntry:
    """The :class:`ListedEntry` of ``m``."""
    return ListedEntry(cache_entry_from_proto(m.entry), m.priority, m.evicted_at or None)


@dataclass(frozen=True, slots=True)
class CachePage:
    """A page of cache entries; ``next_page_token`` is "" on the last page."""

    entries: tuple[ListedEntry, ...]
    next_page_token: str = ""
    policy: str = ""


# =========================================================================== planning


@dataclass(frozen=True, slots=True)
class GenerationReport:
    """How the generator made a workflow from text."""

    planner: str
    model: str = ""
    subtasks: tuple[str, ...] = ()
    catalog_steps: tuple[str, ...] = ()
    rounds: int = 1
    repairs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def generation_report_to_proto(r: GenerationReport) -> common_pb2.GenerationReport:
    """The ``couler.v1.GenerationReport`` of ``r``."""
    return common_pb2.GenerationReport(
        planner=r.planner, model=r.model, subtasks=list(r.subtasks),
        catalog_steps=list(r.catalog_steps), rounds=r.rounds, repairs=list(r.repairs),
        notes=list(r.notes),
    )


def generation_report_from_proto(m: common_pb2.GenerationReport) -> GenerationReport:
    """The :class:`GenerationReport` of ``m``."""
    return GenerationReport(m.planner, m.model, tuple(m.subtasks), tuple(m.catalog_steps),
                            m.rounds, tuple(m.repairs), tuple(m.notes))


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a split workflow, run as its own engine workflow."""

    name: str
    steps: tuple[str, ...]
    depends_on: tuple[str, ...] = ()
    workflow: ir.Workflow | None = None
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    """The optimizer's result."""

    workflow: ir.Workflow
    engine: str
    compiled: str = ""
    cached: Mapping[str, CacheEntry] = field(default_factory=dict)  # by step name
    passes: tuple[PassReport, ...] = ()
    chunks: tuple[Chunk, ...] = ()
    workflow_digest: str = ""
    unneeded: tuple[str, ...] = ()  # taken out: every step that reads them is reused
    step_keys: Mapping[str, str] = field(default_factory=dict)  # keys known before the run
    nothing_to_run: bool = False  # every step is reused or unneeded


def plan_to_proto(p: Plan) -> common_pb2.Plan:
    """The ``couler.v1.Plan`` of ``p``."""
    return common_pb2.Plan(
        workflow=codec.workflow_to_proto(p.workflow), engine=p.engine, compiled=p.compiled,
        cached={name: cache_entry_to_proto(e) for name, e in p.cached.items()},
        passes=[pass_report_to_proto(r) for r in p.passes],
        chunks=[common_pb2.Chunk(name=c.name, steps=list(c.steps), depends_on=list(c.depends_on),
                                 workflow=(codec.workflow_to_proto(c.workflow)
                                           if c.workflow is not None else None),
                                 size_bytes=c.size_bytes)
                for c in p.chunks],
        workflow_digest=p.workflow_digest, unneeded=list(p.unneeded),
        step_keys=dict(p.step_keys), nothing_to_run=p.nothing_to_run,
    )


def plan_from_proto(m: common_pb2.Plan) -> Plan:
    """The :class:`Plan` of ``m`` (its workflow decoded by the codec)."""
    return Plan(
        workflow=codec.workflow_from_proto(m.workflow), engine=m.engine, compiled=m.compiled,
        cached={name: cache_entry_from_proto(e) for name, e in m.cached.items()},
        passes=tuple(pass_report_from_proto(r) for r in m.passes),
        chunks=tuple(Chunk(c.name, tuple(c.steps), tuple(c.depends_on),
                           codec.workflow_from_proto(c.workflow)
                           if c.HasField("workflow") else None, c.size_bytes)
                     for c in m.chunks),
        workflow_digest=m.workflow_digest, unneeded=tuple(m.unneeded),
        step_keys=dict(m.step_keys), nothing_to_run=m.nothing_to_run,
    )


# =========================================================================== metrics


@dataclass(frozen=True, slots=True)
class UtilizationSample:
    """One measurement of a running step, over the ``interval_seconds`` ending at ``at``
    (``cpu``: the average cores over it; 0 s: a single reading)."""

    run_id: str
    workflow: str
    step: str
    at: float | None
    cpu: float  # cores
    memory_bytes: int
    key: str = ""
    attempt: int = 1
    interval_seconds: float = 0.0


def utilization_sample_to_proto(s: UtilizationSample) -> common_pb2.UtilizationSample:
    """The ``couler.v1.UtilizationSample`` of ``s``."""
    return common_pb2.UtilizationSample(
        run_id=s.run_id, workflow=s.workflow, step=s.step, key=s.key, attempt=s.attempt,
        at=_ts(s.at), cpu=s.cpu, memory_bytes=s.memory_bytes,
        interval_seconds=s.interval_seconds,
    )


def utilization_sample_from_proto(m: common_pb2.UtilizationSample) -> UtilizationSample:
    """The :class:`UtilizationSample` of ``m``."""
    return UtilizationSample(m.run_id, m.workflow, m.step, _seconds(m, "at"), m.cpu,
                             m.memory_bytes, m.key, m.attempt, m.interval_seconds)


def utilization_batch_to_proto(run_id: str, samples: Sequence[UtilizationSample]
                               ) -> events_pb2.UtilizationBatch:
    """The ``couler.v1.UtilizationBatch`` of one run's ``samples``."""
    return events_pb2.UtilizationBatch(
        run_id=run_id, samples=[utilization_sample_to_proto(s) for s in samples])


def utilization_batch_from_proto(m: events_pb2.UtilizationBatch
                                 ) -> tuple[UtilizationSample, ...]:
    """The samples of ``m``; a sample without a run id is the batch's run's."""
    return tuple(dataclasses.replace(s, run_id=s.run_id or m.run_id)
                 for s in map(utilization_sample_from_proto, m.samples))


@dataclass(frozen=True, slots=True)
class StepPeak:
    """The highest use seen for one step of one run."""

    run_id: str
    workflow: str
    step: str
    peak_cpu: float
    peak_memory_bytes: int
    samples: int
    key: str = ""


@dataclass(frozen=True, slots=True)
class UtilizationRollup:
    """The samples of one step execution in one minute, compacted (older than the raw
    samples the monitor keeps)."""

    run_id: str
    workflow: str
    step: str
    start: float  # the minute's start, seconds since the epoch
    cpu_mean: float  # cores
    cpu_max: float
    memory_max_bytes: int
    samples: int
    key: str = ""
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class Utilization:
    """Samples and rollups (each oldest first) and peaks over both."""

    samples: tuple[UtilizationSample, ...]
    peaks: tuple[StepPeak, ...]
    rollups: tuple[UtilizationRollup, ...] = ()


def utilization_from_proto(m: monitor_service_pb2.UtilizationResponse) -> Utilization:
    """The :class:`Utilization` of ``m``."""
    return Utilization(
        tuple(utilization_sample_from_proto(s) for s in m.samples),
        tuple(StepPeak(p.run_id, p.workflow, p.step, p.peak_cpu, p.peak_memory_bytes,
                       p.samples, p.key) for p in m.peaks),
        tuple(UtilizationRollup(r.run_id, r.workflow, r.step, _seconds(r, "start") or 0.0,
                                r.cpu_mean, r.cpu_max, r.memory_max_bytes, r.samples, r.key,
                                r.attempt) for r in m.rollups),
    )


def utilization_to_proto(u: Utilization) -> monitor_service_pb2.UtilizationResponse:
    """The ``couler.v1.UtilizationResponse`` of ``u``."""
    return monitor_service_pb2.UtilizationResponse(
        samples=[utilization_sample_to_proto(s) for s in u.samples],
        peaks=[common_pb2.StepPeak(run_id=p.run_id, workflow=p.workflow, step=p.step, key=p.key,
                                   peak_cpu=p.peak_cpu, peak_memory_bytes=p.peak_memory_bytes,
                                   samples=p.samples) for p in u.peaks],
        rollups=[monitor_service_pb2.UtilizationRollup(
            run_id=r.run_id, workflow=r.workflow, step=r.step, key=r.key, attempt=r.attempt,
            start=_ts(r.start), cpu_mean=r.cpu_mean, cpu_max=r.cpu_max,
            memory_max_bytes=r.memory_max_bytes, samples=r.samples) for r in u.rollups],
    )


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A change the monitor proposes for the next plans of a workflow."""

    workflow: str
    step: str
    kind: RecommendationKind
    value: str
    reason: str = ""
    based_on_samples: int = 0
    created_at: float | None = None
    failure_class: ir.FailureClass | None = None
    id: str = ""
    # The evidence of a resource recommendation (see ``couler.v1.Recommendation``).
    target: str = ""
    lower_bound: str = ""
    upper_bound: str = ""
    percentile: float = 0.0
    runs: int = 0
    samples: int = 0
    span_seconds: float = 0.0


def recommendation_json(r: Recommendation) -> dict[str, Any]:
    """``r`` as JSON (the dashboard's API and ``couler recommend --json``): quantities as
    text, seconds and epoch times as numbers."""
    return {"kind": r.kind.value, "value": r.value, "target": r.target,
            "lower_bound": r.lower_bound, "upper_bound": r.upper_bound,
            "percentile": r.percentile, "runs": r.runs, "samples": r.samples,
            "span_seconds": r.span_seconds, "reason": r.reason,
            "based_on": r.based_on_samples, "created_at": r.created_at, "id": r.id,
            "failure_class": r.failure_class.value if r.failure_class else None}


def recommendation_to_proto(r: Recommendation) -> common_pb2.Recommendation:
    """The ``couler.v1.Recommendation`` of ``r``."""
    return common_pb2.Recommendation(
        workflow=r.workflow, step=r.step, kind=_KIND.to_proto(r.kind), value=r.value,
        reason=r.reason, based_on_samples=r.based_on_samples, created_at=_ts(r.created_at),
        failure_class=_FAILURE.to_proto(r.failure_class), id=r.id, target=r.target,
        lower_bound=r.lower_bound, upper_bound=r.upper_bound, percentile=r.percentile,
        runs=r.runs, samples=r.samples, span_seconds=r.span_seconds,
    )


def recommendation_from_proto(m: common_pb2.Recommendation) -> Recommendation:
    """The :class:`Recommendation` of ``m``."""
    where = f"recommendation for {m.workflow!r}"
    return Recommendation(
        workflow=m.workflow, step=m.step, kind=_KIND.from_proto(m.kind, f"{where}, kind"),
        value=m.value, reason=m.reason, based_on_samples=m.based_on_samples,
        created_at=_seconds(m, "created_at"),
        failure_class=_FAILURE.optional(m.failure_class, f"{where}, failure_class"), id=m.id,
        target=m.target, lower_bound=m.lower_bound, upper_bound=m.upper_bound,
        percentile=m.percentile, runs=m.runs, samples=m.samples, span_seconds=m.span_seconds,
    )


@dataclass(frozen=True, slots=True)
class StepRequests:
    """The resources one step was planned with (its workflow's latest plan)."""

    step: str
    resources: ir.Resources
    run_id: str = ""
    at: float | None = None


@dataclass(frozen=True, slots=True)
class RecommendationReport:
    """A workflow's recommendations and what its steps were last planned with."""

    recommendations: tuple[Recommendation, ...]
    requested: tuple[StepRequests, ...] = ()


def _resources_to_proto(r: ir.Resources) -> wpb.Resources:
    return wpb.Resources(cpu_request=r.cpu_request, cpu_limit=r.cpu_limit,
                         memory_request=r.memory_request, memory_limit=r.memory_limit)


def recommendation_report_to_proto(
        report: RecommendationReport) -> monitor_service_pb2.RecommendationsResponse:
    """The ``couler.v1.RecommendationsResponse`` of ``report``."""
    return monitor_service_pb2.RecommendationsResponse(
        recommendations=[recommendation_to_proto(r) for r in report.recommendations],
        requested=[monitor_service_pb2.StepRequests(
            step=q.step, resources=_resources_to_proto(q.resources), run_id=q.run_id,
            at=_ts(q.at)) for q in report.requested])


def recommendation_report_from_proto(
        m: monitor_service_pb2.RecommendationsResponse) -> RecommendationReport:
    """The :class:`RecommendationReport` of ``m``."""
    return RecommendationReport(
        tuple(recommendation_from_proto(r) for r in m.recommendations),
        tuple(StepRequests(q.step, ir.Resources(
            cpu_request=q.resources.cpu_request, cpu_limit=q.resources.cpu_limit,
            memory_request=q.resources.memory_request,
            memory_limit=q.resources.memory_limit), q.run_id, _seconds(q, "at"))
            for q in m.requested))
