"""The optimizer's use cases: plan a workflow for an engine, keep the monitor's feedback.

:class:`Optimizer` runs the pure pass pipeline :func:`couler.optimize.optimize` (validate →
prune cached steps → right-size from recommendations → default retry → split to the
engine's limits → compile) in a worker thread, so the event loop (gRPC, NATS) stays free,
with what only the service knows:

* **the cache** — a :data:`CacheFetch` callable (``keys -> {key: CacheEntry}``; in
  production a gRPC call to ``couler.v1.CacheService.Lookup``, see
  :mod:`couler_optimizer.lookup`). When the cache cannot be asked (it is down, times out,
  refuses), the plan is made **without** the cache rather than failing the run: every step
  runs, and the ``prune_cached`` report says why none was reused;
* **recommendations** — the latest per (workflow, step, kind) from the store, applied to
  every later plan of the same workflow name by the ``right_size`` pass, whose report lists
  each one applied (a workflow-level one, without a step, applies to every top-level step
  that has none of its own);
* **engine capabilities** — the target engine's table (as ``couler validate`` uses), so a
  feature the engine cannot express is refused before planning;
* **learned budgets** — an engine that refused a document for its size
  (``couler.workflow.refused``) gets a smaller document budget for every later plan
  (min of its static budget and 0.8 x the smallest refused size; the split pass's notes
  say why), and the refused run is planned again (:meth:`Optimizer.replan_event`);
* **the record** — every plan's summary in the store; a plan made for a run (an event) is
  kept whole, and asking again for the same run returns it instead of planning again, so a
  redelivered event neither asks the cache again (no double-counted hits) nor records a
  second plan.

Errors, by type (mapped to gRPC statuses and NATS answers by the runtime)::

    UserError                     unknown engine, a split that cannot fit the engine
    ├── ValidationError           the workflow is invalid (issues name step and field)
    └── UnsupportedFeatureError   the engine cannot express a feature the workflow uses
    RetryableError                the store is unavailable
    └── CacheUnavailableError          (raised by a CacheFetch; handled here: no cache)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from couler import ir
from couler import optimize as passes
from couler.alloc import gc_paused
from couler.errors import RetryableError, UserError
from couler.optimize.reuse import ArtifactStore
from couler.v1 import common_pb2
from couler_optimizer.store import LearnedBudget, OptimizerStore, PlanSummary
from couler_runtime import metrics
from couler_runtime.engines import capabilities_of, check_engine
from couler_runtime.rpc.records import (
    CacheEntry,
    Chunk,
    Objective,
    PassReport,
    Plan,
    Recommendation,
    RecommendationKind,
    StoredArtifact,
    bounded_notes,
    plan_from_proto,
    plan_to_proto,
)

__all__ = [
    "CacheFetch",
    "CacheUnavailableError",
    "Optimizer",
]

log = logging.getLogger(__name__)

# The contract's recommendation kinds → the right_size pass's names.
_KINDS: Mapping[RecommendationKind, str] = {
    RecommendationKind.MEMORY_REQUEST: "memory_request",
    RecommendationKind.MEMORY_LIMIT: "memory_limit",
    RecommendationKind.CPU_REQUEST: "cpu_request",
    RecommendationKind.RETRY: "retry_limit",
    RecommendationKind.TIMEOUT: "timeout_seconds",
    RecommendationKind.RETRY_BACKOFF: "retry_backoff_seconds",
}
_PRUNE = "prune_cached"
#: The engines whose runs restore a cached step's outputs and artifacts instead of running
#: it (the submitter's local engine; the dry run runs nothing anyway). For the others the
#: plan's workflow has its cached steps taken out (:mod:`couler.optimize.reuse`).
REUSING_ENGINES = frozenset({"local", "dryrun"})
#: The engines that read an input artifact from an S3 location, so a cached artifact is
#: handed to them from the artifact store (the others run its producer again).
S3_READING_ENGINES = frozenset({"argo"})


class CacheUnavailableError(RetryableError):
    """The cache could not be asked (unreachable, timed out, refused the call)."""


class CacheFetch(Protocol):
    """Blocking: the cache entries found for ``keys``, by key (``peek``: counting no hit or
    miss); raises :class:`CacheUnavailableError`."""

    def __call__(self, keys: Sequence[str], *, peek: bool = False
                 ) -> Mapping[str, CacheEntry]:
        """The entries found."""
        ...


class _PlanLookup:
    """One plan's view of the cache: a ``couler.optimize`` lookup that remembers the entries
    it found and stops asking after the first failure."""

    def __init__(self, fetch: CacheFetch) -> None:
        self._fetch = fetch
        self.entries: dict[str, CacheEntry] = {}
        self.failure: CacheUnavailableError | None = None

    def __call__(self, keys: Sequence[str]) -> Mapping[str, passes.CachedStep]:
        if self.failure is not None:
            return {}
        try:
            found = self._fetch(keys, peek=True)  # which it will use is decided later
        except CacheUnavailableError as exc:
            self.failure = exc
            return {}
        self.entries.update(found)
        return {key: passes.CachedStep(key=key, outputs=dict(e.outputs),
                                       artifacts={n: a.digest for n, a in e.artifacts.items()},
                                       created_at=e.created_at or 0.0)
                for key, e in found.items()}

    def record(self, keys: Sequence[str]) -> None:
        """Look up the keys the plan uses (the hits it reuses, the misses it runs), so the
        cache counts them and ranks its entries by the use they get."""
        if self.failure is not None or not keys:
            return
        try:
            self._fetch(keys)
        except CacheUnavailableError as exc:  # the plan stands; the counts are late
            log.warning("cache: the plan's %d lookups not counted: %s", len(keys), exc)


class Optimizer:
    """Plans workflows (see the module docstring).

    Args:
        store: Recommendations and plan records.
        cache: Asks the cache; None when no cache is configured (no step is reused).
        cache_address: Where the cache is, for the reports.
        default_retry: Give steps without a retry policy the default one.
        max_steps_per_chunk: Split workflows into chunks of at most this many steps
            (besides the engine's own document-size limit); None for no step limit.
    """

    def __init__(self, store: OptimizerStore, cache: CacheFetch | None = None, *,
                 cache_address: str = "", default_retry: bool = True,
                 max_steps_per_chunk: int | None = None,
                 artifact_store: ArtifactStore | None = None) -> None:
        self._store = store
        self._cache = cache
        self._artifact_store = artifact_store
        self._cache_address = cache_address
        self._retry = passes.DEFAULT_RETRY if default_retry else None
        self._max_steps = max_steps_per_chunk
        meter = metrics.meter("couler.optimizer")
        self._plans = meter.create_counter(
            "couler.optimizer.plans", unit="{plan}",
            description="Plans made: engine, result=planned or refused (invalid workflow, "
                        "engine unable to run it)")
        self._applied = meter.create_counter(
            "couler.optimizer.recommendations_applied", unit="{recommendation}",
            description="The monitor's recommendations a plan was made with")
        self._cached_steps = meter.create_counter(
            "couler.optimizer.cached_steps", unit="{step}",
            description="Steps planned as reused from the cache (not run)")

    async def optimize(self, wf: ir.Workflow, engine: str = "", *,
                       objectives: Sequence[Objective] = (), no_cache: bool = False,
                       parameters: Mapping[str, str] | None = None, run_id: str = "") -> Plan:
        """The plan for running ``wf`` on ``engine`` (recorded in the plan history).

        Args:
            wf: The workflow.
            engine: The target engine; "" means "local".
            objectives: What to weigh. Every pass keeps the result correct and all run
                today; the objectives are recorded in the validate report.
            no_cache: Reuse no cached result (the cache is not asked).
            parameters: Workflow parameter values (part of the steps' cache keys).
            run_id: The run being planned, for the record; may be empty.

        Raises:
            ValidationError: The workflow is invalid.
            UnsupportedFeatureError: The engine cannot express a feature it uses.
            UserError: Unknown engine, or it cannot be split to fit the engine.
            RetryableError: The store is unavailable.
        """
        plan = await asyncio.to_thread(self._plan, wf, engine, tuple(objectives), no_cache,
                                       dict(parameters or {}))
        await asyncio.to_thread(self._store.save_plan, plan, run_id=run_id)
        return plan

    async def plan_run(self, run_id: str, wf: ir.Workflow, engine: str = "", *,
                       objectives: Sequence[Objective] = (), no_cache: bool = False,
                       parameters: Mapping[str, str] | None = None) -> Plan:
        """The plan for run ``run_id``: made once, then the recorded one (idempotent).

        Same arguments and errors as :meth:`optimize`.
        """
        message = await self.plan_event(run_id, wf, engine, objectives=objectives,
                                        no_cache=no_cache, parameters=parameters)
        return plan_from_proto(message)

    async def plan_event(self, run_id: str, wf: ir.Workflow, engine: str = "", *,
                         objectives: Sequence[Objective] = (), no_cache: bool = False,
                         parameters: Mapping[str, str] | None = None) -> common_pb2.Plan:
        """:meth:`plan_run` answered as the ``couler.v1.Plan`` an event carries: encoded
        once (the same bytes are recorded and sent), in one worker thread (the cache is
        asked over gRPC, a blocking call).
        """
        return await asyncio.to_thread(self._plan_event, run_id, wf, engine, tuple(objectives),
                                       no_cache=no_cache, parameters=dict(parameters or {}))

    def _plan_event(self, run_id: str, wf: ir.Workflow, engine: str,
                    objectives: tuple[Objective, ...], *, no_cache: bool,
                    parameters: dict[str, str]) -> common_pb2.Plan:
        earlier = self._store.event_plan_message(run_id)
        if earlier is not None:
            log.info("run %s: planned before; answering with the recorded plan", run_id)
            return earlier
        plan = self._plan(wf, engine, objectives, no_cache, parameters)
        kept = self._store.save_encoded(plan, plan_to_proto(plan), run_id=run_id)
        assert kept is not None  # an event plan is recorded whole
        return kept

    async def replan_event(self, run_id: str, wf: ir.Workflow, engine: str = "", *,
                           objectives: Sequence[Objective] = (), no_cache: bool = False,
                           parameters: Mapping[str, str] | None = None) -> common_pb2.Plan:
        """Plan run ``run_id`` again (its engine refused the first plan's document): the
        new plan replaces the recorded one. Same arguments and errors as :meth:`optimize`."""

        def work() -> common_pb2.Plan:
            plan = self._plan(wf, engine, tuple(objectives), no_cache, dict(parameters or {}))
            encoded = plan_to_proto(plan)
            self._store.replace_event_plan(plan, encoded, run_id=run_id)
            return encoded

        return await asyncio.to_thread(work)

    async def record_refusal(self, engine: str, size_bytes: int, *, reason: str,
                             run_id: str = "", workflow: str = "",
                             at: float | None = None) -> LearnedBudget:
        """Learn from ``engine`` refusing a ``size_bytes`` document: the budget kept."""
        if not engine:
            raise UserError(f"refusal of run {run_id!r}: field 'engine' is empty")
        return await asyncio.to_thread(
            self._store.put_refusal, engine, size_bytes, reason=reason, run_id=run_id,
            workflow=workflow, at=at if at is not None else time.time())

    def budget(self, engine: str) -> passes.Budget:
        """The split budget of ``engine``'s next plan: its static one, lowered by what it
        refused (blocking: reads the store)."""
        budget = passes.budget_for(engine, max_steps=self._max_steps)
        learned = self._store.learned_budget(engine)
        if learned is None:
            return budget
        return dataclasses.replace(budget, learned_bytes=learned.max_bytes,
                                   learned_reason=learned.note())

    async def record_recommendation(self, rec: Recommendation) -> bool:
        """Keep ``rec`` for the next plans of its workflow; False if a newer one is kept."""
        if not rec.workflow:
            raise UserError(f"recommendation {rec.id!r}: field 'workflow' is empty")
        return await asyncio.to_thread(self._store.put_recommendation, rec)

    async def history(self, workflow: str | None = None, *, run_id: str | None = None
                      ) -> tuple[PlanSummary, ...]:
        """The plans recorded (see :meth:`OptimizerStore.history`)."""
        return await asyncio.to_thread(self._store.history, workflow, run_id=run_id)

    # ----------------------------------------------------------------- in a thread

    def _plan(self, wf: ir.Workflow, engine: str, objectives: tuple[Objective, ...],
              no_cache: bool, parameters: dict[str, str]) -> Plan:
        try:
            with gc_paused():  # a plan allocates per step, nothing cyclic (couler.alloc)
                plan = self._plan_paused(wf, engine, objectives, no_cache, parameters)
        except UserError:  # invalid, unsupported, unknown engine (not a retryable failure)
            self._plans.add(1, {"engine": engine or "local", "result": "refused"})
            raise
        self._plans.add(1, {"engine": plan.engine, "result": "planned"})
        if plan.cached:
            self._cached_steps.add(len(plan.cached), {"engine": plan.engine})
        return plan

    def _plan_paused(self, wf: ir.Workflow, engine: str, objectives: tuple[Objective, ...],
                     no_cache: bool, parameters: dict[str, str]) -> Plan:
        ir.validate(wf)
        name = check_engine(engine, wf)
        recs = _core_recommendations(wf, self._store.recommendations(wf.name))
        if recs:
            self._applied.add(len(recs))
        # The local engine restores cached results itself; for the others the cached
        # steps are taken out of the workflow, their results written into their readers.
        substitute = name not in REUSING_ENGINES
        lookup = None if no_cache or self._cache is None else _PlanLookup(self._cache)
        plan = passes.optimize(
            wf, name, lookup=lookup, recommendations=recs, parameters=parameters,
            budget=self.budget(name), retry=self._retry,
            substitute=substitute,
            store=self._artifact_store if name in S3_READING_ENGINES else None,
            record_use=None if lookup is None else lookup.record, validated=True,
            capabilities=capabilities_of(name))
        reports = list(plan.reports)
        cached: dict[str, CacheEntry] = {}
        for i, report in enumerate(reports):
            if report.name == "validate" and objectives:
                reports[i] = dataclasses.replace(report, notes=(
                    *report.notes, "objectives: " + ", ".join(o.value for o in objectives)))
            elif report.name == _PRUNE:
                reports[i] = self._prune_report(report, lookup, no_cache)
        if lookup is not None and lookup.failure is None:
            cached = {step: _entry(wf.name, step, c, lookup.entries.get(c.key))
                      for step, c in plan.cached.items()}
        elif lookup is not None and lookup.failure is not None:
            log.warning("workflow %r: cache at %s unavailable, planned without it: %s",
                        wf.name, self._cache_address, lookup.failure)
        return Plan(
            workflow=plan.workflow, engine=name, compiled=plan.document, cached=cached,
            passes=tuple(PassReport(r.name, r.changed, bounded_notes(r.notes), r.duration_ms)
                         for r in reports),
            chunks=tuple(Chunk(c.name, c.steps, c.depends_on, c.workflow, c.size_bytes)
                         for c in plan.chunks),
            workflow_digest=ir.digest(plan.workflow), unneeded=plan.unneeded,
            step_keys=plan.keys, nothing_to_run=plan.nothing_to_run)

    def _prune_report(self, report: passes.PassReport, lookup: _PlanLookup | None,
                      no_cache: bool) -> passes.PassReport:
        if no_cache:
            return dataclasses.replace(report, notes=("no_cache: the cache was not consulted",))
        if lookup is None:
            return dataclasses.replace(report, notes=("no cache configured "
                                                      "(COULER_CACHE_ADDRESS is empty)",))
        if lookup.failure is not None:
            return dataclasses.replace(report, changed=False, notes=(
                f"cache unavailable at {self._cache_address}: {lookup.failure}; "
                "planned without the cache (every step runs)",))
        return report


def _core_recommendations(wf: ir.Workflow, recs: Sequence[Recommendation]
                          ) -> list[passes.Recommendation]:
    """The contract's recommendations as the right_size pass takes them; workflow-level
    ones expanded to every top-level step without one of the same kind."""
    specific = {(r.step, r.kind) for r in recs if r.step}
    out: list[passes.Recommendation] = []
    for rec in recs:
        steps = [rec.step] if rec.step else [
            s.name for s in wf.steps if (s.name, rec.kind) not in specific]
        for step in steps:
            out.append(passes.Recommendation(
                workflow=rec.workflow, step=step, kind=_KINDS[rec.kind], value=rec.value,
                reason=rec.reason, samples=rec.based_on_samples,
                failure_class=rec.failure_class))
    return out


def _entry(workflow: str, step: str, cached: passes.CachedStep,
           entry: CacheEntry | None) -> CacheEntry:
    """The cache's entry for a reused step (as the cache returned it, when it did)."""
    if entry is not None:
        return dataclasses.replace(entry, key=cached.key)
    return CacheEntry(key=cached.key, workflow=workflow, step=step, outputs=cached.outputs,
                      artifacts={n: StoredArtifact(d) for n, d in cached.artifacts.items()})
