"""The optimizer's passes: pure functions over the IR, each with a report.

:func:`optimize` runs them in order — validate → prune cached steps → take them out of
the workflow (engines that cannot restore them) → apply
recommendations (right-size resources) → default retry policy → split to the
engine's limits → compile — and returns a :class:`Plan`. Every pass is usable on
its own; none does I/O: the cache is reached through a ``lookup`` callable and
recommendations arrive as values, so the optimizer service decides where they
come from (gRPC to the cache, the feedback stream from the monitor).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar, cast

from couler import ir
from couler.alloc import gc_paused
from couler.engines.base import Capability, Feature
from couler.errors import UserError
from couler.optimize.cache_key import (
    cache_policy,
    item_cache_key,
    iteration_cache_key,
    map_items,
    not_cacheable_part_reason,
    not_cacheable_reason,
    unneeded_steps,
    workflow_keys,
)
from couler.optimize.freshness import fresh
from couler.optimize.retry_fit import fit_retries
from couler.optimize.reuse import ArtifactStore, substitute_cached
from couler.optimize.split import Budget, Chunk, split_workflow

__all__ = [
    "CachedStep",
    "PassReport",
    "Plan",
    "Recommendation",
    "apply_recommendations",
    "compile_document",
    "compile_engine_document",
    "default_retry",
    "document_size",
    "optimize",
    "prune_cached",
    "render_document",
]


@dataclass(frozen=True, slots=True)
class CachedStep:
    """A step whose result is reused: its key and the outputs it produced."""

    key: str
    outputs: Mapping[str, str] = field(default_factory=dict)
    artifacts: Mapping[str, str] = field(default_factory=dict)  # name -> blob digest
    created_at: float = 0.0  # when the entry was committed (for max_age); 0: unknown


@dataclass(frozen=True, slots=True)
class PassReport:
    """What one pass did."""

    name: str
    changed: bool
    notes: tuple[str, ...] = ()
    duration_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A measured suggestion for one step, from the monitor.

    ``kind`` is ``memory_request`` / ``memory_limit`` / ``cpu_request`` (``value`` a
    Kubernetes quantity), ``retry_limit``, ``retry_backoff_seconds`` or ``timeout_seconds``
    (an integer). ``failure_class``: for a retry, the class it is for.
    """

    workflow: str
    step: str
    kind: str
    value: str
    reason: str = ""
    samples: int = 0
    failure_class: ir.FailureClass | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """The optimizer's answer: the workflow to run, how, and why.

    ``cached`` holds the reused top-level steps by name and the reused map items and loop
    iterations of a step as ``"step[N]"`` (N: the item's index, the iteration's number).
    """

    workflow: ir.Workflow
    engine: str
    document: str = ""  # the compiled engine document; empty for local and ray
    cached: Mapping[str, CachedStep] = field(default_factory=dict)
    reports: tuple[PassReport, ...] = ()
    chunks: tuple[Chunk, ...] = ()
    # substitute=True: the steps taken out because nothing left needs them and whether
    # nothing is left to run; every step's key known before the run
    unneeded: tuple[str, ...] = ()
    keys: Mapping[str, str] = field(default_factory=dict)
    nothing_to_run: bool = False


Lookup = Callable[[Sequence[str]], Mapping[str, CachedStep]]

# A loop's iterations are looked up (their keys are known before the run) up to this many.
MAX_LOOKUP_ITERATIONS = 1000

#: Retries what another attempt can fix -- a timeout or an exit seen once (TRANSIENT),
#: the platform (INFRA), out of memory with more memory (OOM) -- and never a deterministic
#: error of the step itself (USER: a Python ValueError, the same error twice; see
#: :mod:`couler.failures`).
DEFAULT_RETRY = ir.RetryPolicy(
    limit=2,
    backoff=ir.Backoff(base_seconds=5.0, factor=2.0, cap_seconds=60.0),
    on=(ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA, ir.FailureClass.OOM),
    memory_factor=1.5,
)

_RECOMMENDED_RESOURCES = {"memory_request", "memory_limit", "cpu_request", "cpu_limit"}


# ----------------------------------------------------------------------- prune


def prune_cached(wf: ir.Workflow, lookup: Lookup,
                 parameters: Mapping[str, str] | None = None, *, now: float | None = None
                 ) -> tuple[dict[str, CachedStep], list[str]]:
    """Find the top-level steps whose results the cache already holds.

    Every step's key is known before the run (keys by lineage:
    :func:`~couler.optimize.cache_key.workflow_keys`), so all of them are looked up at
    once, and a step is found although an ancestor's entry was evicted. A hit older than
    the step's ``max_age`` counts as a miss. Linear in the steps and their inputs (plus
    the lookup). Returns the cached steps and notes: why steps were not looked up, and
    which steps are not needed (:func:`~couler.optimize.cache_key.unneeded_steps`: every
    step that reads them is reused). The workflow itself is unchanged: the engine skips a
    cached step's execution and reports it ``cached``, with its outputs.
    """
    by_name = {s.name: s for s in wf.steps}
    keys = workflow_keys(wf, parameters)
    notes: list[str] = []
    for step in wf.steps:
        if step.name in keys:
            continue
        reason = not_cacheable_reason(wf, step)
        notes.append(f"step {step.name!r}: not cached: "
                     + (reason or "keyed when it runs (an external input artifact's digest, "
                                  "or a step it reads from has no key)"))
    values = {p.name: p.default.text for p in wf.parameters if p.default is not None}
    values.update(parameters or {})
    # Map items and loop iterations whose keys are known now (by "step[N]"); maps whose
    # items come from a step's output wait for that step's hit (a second lookup).
    parts: dict[str, str] = {}
    later: list[ir.Step] = []
    for step in wf.steps:
        if not_cacheable_part_reason(wf, step) is not None:
            continue
        if step.foreach is not None:
            items = map_items(wf, step, values)
            if items is None:
                later.append(step)
            else:
                parts.update(_item_keys(wf, step, items, values, keys))
        elif step.loop is not None:
            parts.update(_iteration_keys(wf, step, values, keys))
    found = lookup(sorted(set(keys.values()) | set(parts.values()))) \
        if keys or parts else {}
    clock = time.time() if now is None else now
    cached: dict[str, CachedStep] = {}
    for name, key in keys.items():
        hit = _fresh(wf, by_name[name], name, key, found.get(key), clock=clock,
                     notes=notes)
        if hit is not None:
            cached[name] = hit
    late: dict[str, str] = {}
    for step in later:
        items = map_items(wf, step, values, {n: c.outputs for n, c in cached.items()})
        if items is None:
            source = step.foreach.source if step.foreach is not None else None
            origin = (f"step {source.step!r}'s output {source.output!r}, and that step "
                      "runs" if isinstance(source, ir.StepOutputRef)
                      else "a value that is not a JSON list yet")
            notes.append(f"step {step.name!r}: its items are not known before the run (they "
                         f"come from {origin}): each item is keyed and committed when it "
                         "runs, and reused by a later run whose items are known")
        else:
            late.update(_item_keys(wf, step, items, values, keys))
    if late:
        found = {**found, **lookup(sorted(set(late.values()) - set(found)))}
        parts.update(late)
    for name, key in parts.items():
        step = by_name[name.split("[", 1)[0]]
        hit = _fresh(wf, step, name, key, found.get(key), clock=clock,
                     notes=notes)
        if hit is not None:
            cached[name] = hit
    for name in sorted(unneeded_steps(wf, cached)):
        notes.append(f"step {name!r}: " + ("reused without restoring its artifacts" if name in
                                            cached else "not needed") +
                     ": every step that reads it is reused")
    return cached, notes


def _fresh(wf: ir.Workflow, step: ir.Step, name: str, key: str, hit: CachedStep | None, *,
           clock: float, notes: list[str]) -> CachedStep | None:
    """``hit`` when it is complete and not older than the step's max_age (else None)."""
    if hit is None or not _complete(step, hit):
        return None
    policy = cache_policy(wf, step)
    if not fresh(hit.created_at or None, policy, clock):
        notes.append(f"step {name!r}: cached result {key[:12]} is older than its "
                     f"max_age ({policy.max_age_seconds} s): it runs again")
        return None
    return dataclasses.replace(hit, key=key)


def _item_keys(wf: ir.Workflow, step: ir.Step, items: Sequence[object],
               params: Mapping[str, str], keys: Mapping[str, str]) -> dict[str, str]:
    """The keys of a map's items by ``"step[index]"`` (items without a key left out)."""
    out = {}
    for index, item in enumerate(items):
        key = item_cache_key(wf, step, item, params=params, producer_keys=keys)
        if key is not None:
            out[f"{step.name}[{index}]"] = key
    return out


def _iteration_keys(wf: ir.Workflow, step: ir.Step, params: Mapping[str, str],
                    keys: Mapping[str, str]) -> dict[str, str]:
    """The keys of a loop's iterations by ``"step[n]"`` (each follows the one before)."""
    assert step.loop is not None
    out: dict[str, str] = {}
    previous = ""
    for n in range(min(max(step.loop.max_iterations, 1), MAX_LOOKUP_ITERATIONS)):
        key = iteration_cache_key(wf, step, n, previous, params=params, producer_keys=keys)
        if key is None:
            break
        out[f"{step.name}[{n}]"] = previous = key
    return out


def _used_keys(wf: ir.Workflow, keys: Mapping[str, str], cached: Mapping[str, CachedStep],
               idle: Collection[str]) -> list[str]:
    """The keys a plan uses: its hits but those nothing reads (``idle``), and the keys of
    the steps it runs."""
    used = [hit.key for name, hit in cached.items() if name not in idle]
    used += [keys[s.name] for s in wf.steps
             if s.name in keys and s.name not in cached and s.name not in idle]
    return sorted(set(used))


def _complete(step: ir.Step, hit: CachedStep) -> bool:
    return (all(o.name in hit.outputs for o in step.outputs)
            and all(a.name in hit.artifacts for a in step.output_artifacts))


# ------------------------------------------------------------ recommendations


def apply_recommendations(wf: ir.Workflow, recs: Sequence[Recommendation]
                          ) -> tuple[ir.Workflow, list[str]]:
    """Apply the monitor's recommendations for this workflow's top-level steps.

    A resource recommendation sets the step's request/limit (never lowering a limit
    below the request it sets); ``retry_limit`` -- learned from the step's failures --
    sets the limit of a step under the default policy (no policy of its own or of the
    workflow: 0 drops the default's retries for it; 0 *for transient failures* drops only
    those, the platform's and out-of-memory retries are kept); a policy the program wrote is kept,
    except that out-of-memory retries (``failure_class`` OOM) raise its limit;
    ``retry_backoff_seconds`` sets the default policy's back-off base (a written
    back-off is kept); ``timeout_seconds`` sets a timeout only where none was written.
    Recommendations for other workflows or unknown steps are ignored; later ones win.
    """
    notes: list[str] = []
    latest: dict[tuple[str, str], Recommendation] = {}
    for rec in recs:
        if rec.workflow == wf.name:
            latest[(rec.step, rec.kind)] = rec
    if not latest:
        return wf, notes
    steps = []
    for step in wf.steps:
        new = step
        for (name, kind), rec in sorted(latest.items()):
            if name != step.name:
                continue
            new, note = _apply_one(wf, new, kind, rec, written=step.retry or wf.defaults.retry)
            if note:
                notes.append(f"step {step.name!r}: {note}")
        steps.append(new)
    unknown = sorted({n for n, _ in latest} - {s.name for s in wf.steps})
    notes.extend(f"step {n!r}: recommendation ignored: no such step" for n in unknown)
    return dataclasses.replace(wf, steps=tuple(steps)), notes


def _apply_one(wf: ir.Workflow, step: ir.Step, kind: str, rec: Recommendation, *,
               written: ir.RetryPolicy | None) -> tuple[ir.Step, str]:
    """One recommendation on ``step``; ``written`` is the retry policy the program gave it
    (its own or the workflow's), None when it runs under the default."""
    if kind in _RECOMMENDED_RESOURCES:
        try:
            ir.parse_quantity(rec.value)
        except ValueError:
            return step, f"recommendation {kind}={rec.value!r} ignored: not a quantity"
        res = step.resources or wf.defaults.resources or ir.Resources()
        res = _replace(res, **{kind: rec.value})
        limit_kind = kind.replace("request", "limit")
        if (kind.endswith("request") and getattr(res, limit_kind)
                and ir.parse_quantity(getattr(res, limit_kind)) < ir.parse_quantity(rec.value)):
            res = _replace(res, **{limit_kind: rec.value})
        why = f" ({rec.reason})" if rec.reason else ""
        return dataclasses.replace(step, resources=res), f"{kind} = {rec.value}{why}"
    if kind == "retry_limit":
        limit = _int(rec.value)
        if limit is None:
            return step, f"recommendation retry_limit={rec.value!r} ignored: not an integer"
        retry = step.retry or wf.defaults.retry or DEFAULT_RETRY
        why = f" ({rec.reason})" if rec.reason else ""
        if (limit == 0 and written is None and rec.failure_class is ir.FailureClass.TRANSIENT
                and ir.FailureClass.TRANSIENT in retry.on):
            # never failed transiently: its own failures are not retried, the platform's
            # (an eviction, a lost node) and out-of-memory kills still are -- they are not
            # the step's and strike any step
            on = tuple(c for c in retry.on if c is not ir.FailureClass.TRANSIENT)
            return (dataclasses.replace(step, retry=dataclasses.replace(retry, on=on)),
                    f"transient failures not retried{why}")
        # the default policy's limit is what was learned; the program's own policy is kept,
        # only raised for out-of-memory retries (memory escalation)
        if retry.limit == limit or (written is not None and (
                retry.limit > limit or rec.failure_class is not ir.FailureClass.OOM)):
            return step, ""
        return (dataclasses.replace(step, retry=dataclasses.replace(retry, limit=limit)),
                f"retry limit = {limit}{why}")
    if kind == "retry_backoff_seconds":
        seconds = _int(rec.value)
        if seconds is None or seconds < 1:
            return step, (f"recommendation retry_backoff_seconds={rec.value!r} ignored: "
                          "not a whole number of seconds, at least 1")
        retry = step.retry or wf.defaults.retry or DEFAULT_RETRY
        if (written is not None and written.backoff is not None) or retry.limit == 0:
            return step, ""  # a written back-off is kept; no retries, no back-off
        backoff = retry.backoff or ir.Backoff()
        if backoff.base_seconds == seconds:
            return step, ""
        cap = backoff.cap_seconds
        backoff = dataclasses.replace(backoff, base_seconds=float(seconds),
                                      cap_seconds=max(cap, seconds) if cap is not None else None)
        why = f" ({rec.reason})" if rec.reason else ""
        return (dataclasses.replace(step, retry=dataclasses.replace(retry, backoff=backoff)),
                f"retry back-off = {seconds}s{why}")
    if kind == "timeout_seconds":
        seconds = _int(rec.value)
        if seconds is None or step.timeout_seconds is not None:
            return step, ""
        return dataclasses.replace(step, timeout_seconds=seconds), f"timeout = {seconds}s"
    return step, f"recommendation kind {kind!r} ignored: unknown"


# Resources' string fields chosen by name (the kinds above); mypy cannot type **kwargs.
_replace = cast(Any, dataclasses.replace)


def _int(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None


# ----------------------------------------------------------------------- retry


def _flaky(wf: ir.Workflow, recs: Sequence[Recommendation]) -> set[str]:
    """The steps of ``wf`` the monitor saw fail transiently: a learned retry limit above 0
    for transient or infrastructure failures."""
    out = set()
    for rec in recs:
        if (rec.workflow == wf.name and rec.kind == "retry_limit"
                and rec.failure_class in (ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA)
                and (_int(rec.value) or 0) > 0):
            out.add(rec.step)
    return out


def default_retry(wf: ir.Workflow, policy: ir.RetryPolicy = DEFAULT_RETRY
                  ) -> tuple[ir.Workflow, list[str]]:
    """Give every step that has no retry policy (own or workflow default) ``policy``.

    The default retries transient and platform failures and OOM kills (with more memory)
    twice, with back-off, and never a user error; a program's own policy always wins.
    Exit hooks keep theirs.
    """
    if wf.defaults.retry is not None:
        return wf, []
    notes = []
    steps = []
    for step in wf.steps:
        if step.retry is None and not step.daemon and not isinstance(step.body, ir.JobSpec):
            notes.append(step.name)
            steps.append(dataclasses.replace(step, retry=policy))
        else:
            steps.append(step)
    if not notes:
        return wf, []
    return (dataclasses.replace(wf, steps=tuple(steps)),
            [f"default retry policy (limit {policy.limit}) on: " + ", ".join(notes)])


# --------------------------------------------------------------------- compile


def compile_document(wf: ir.Workflow, engine: str, *, validate: bool = True) -> str:
    """The engine document for ``wf``: YAML for argo/tekton/kfp, a DAG file for airflow,
    empty for engines that take the IR itself (local, ray, and the submitter's dryrun).
    ``validate=False`` for a workflow known to be valid (validated, or a chunk of one)."""
    return render_document(compile_engine_document(wf, engine, validate=validate), engine)


def compile_engine_document(wf: ir.Workflow, engine: str, *, validate: bool = True) -> Any:
    """The engine's document for ``wf`` as data, before it is rendered as text: a dict for
    argo and kfp, a list of dicts for tekton, the DAG file's source for airflow, None for
    engines that take the IR itself. See :func:`compile_document`."""
    if engine in ("local", "ray", "dryrun"):
        return None
    if engine == "argo":
        from couler.compilers import argo

        return argo.compile_workflow(wf, validate=validate)
    if engine == "tekton":
        from couler.compilers import tekton

        return tekton.compile_workflow(wf, validate=validate)
    if engine == "airflow":
        from couler.compilers import airflow

        return airflow.compile_workflow(wf, validate=validate)
    if engine == "kfp":
        from couler.compilers import kfp

        return kfp.compile_workflow(wf, validate=validate)
    raise UserError(f"workflow {wf.name!r}: unknown engine {engine!r} "
                    "(argo, tekton, airflow, kfp, ray, local)")


def render_document(doc: Any, engine: str) -> str:
    """The text of a document from :func:`compile_engine_document` (what ``couler compile``
    writes): YAML for argo/tekton/kfp, the DAG file for airflow, empty for None."""
    if doc is None:
        return ""
    if engine == "tekton":
        from couler.compilers import tekton

        return tekton.to_yaml(doc)
    if isinstance(doc, str):
        return doc
    from couler.compilers import emit

    return emit.to_yaml(doc)


def document_size(doc: Any, engine: str) -> int:
    """The size of a document from :func:`compile_engine_document` in the unit of the
    engine's byte limits (:func:`couler.optimize.split.budget_for`): its compact JSON
    (:func:`couler.compilers.wire.json_size`) for the engines behind the Kubernetes API
    (argo, tekton, kfp) -- for tekton the sum over its objects, since Tekton copies the
    Pipeline's spec into the PipelineRun's status -- and the file's bytes for airflow
    (a DAG file); 0 for None."""
    if doc is None:
        return 0
    if isinstance(doc, str):
        return len(doc.encode())
    from couler.compilers.wire import json_size

    if engine == "tekton":
        return sum(json_size(d) for d in doc)
    return json_size(doc)


# -------------------------------------------------------------------- pipeline


@contextmanager
def _timed(reports: list[PassReport], name: str) -> Iterator[list[PassReport]]:
    start = time.perf_counter()
    box: list[PassReport] = []
    yield box
    (report,) = box
    reports.append(dataclasses.replace(report, name=name,
                                       duration_ms=(time.perf_counter() - start) * 1000))


P = ParamSpec("P")
R = TypeVar("R")


def _collector_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn`` with the cyclic garbage collector paused (:func:`couler.alloc.gc_paused`):
    a plan allocates a few objects per step in every pass, all acyclic, and full
    collections re-scanning the growing heap made a 100k-step plan superlinear."""

    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return fn(*args, **kwargs)

    return paused


@_collector_paused
def optimize(wf: ir.Workflow, engine: str = "local", *, lookup: Lookup | None = None,
             recommendations: Sequence[Recommendation] = (),
             parameters: Mapping[str, str] | None = None,
             budget: Budget | None = None, retry: ir.RetryPolicy | None = DEFAULT_RETRY,
             compile: bool = True, substitute: bool = False,
             store: ArtifactStore | None = None,
             record_use: Callable[[Sequence[str]], object] | None = None,
             validated: bool = False,
             capabilities: Mapping[Feature, Capability] | None = None) -> Plan:
    """Run the pass pipeline over ``wf`` for ``engine`` and return the plan.

    ``lookup`` is None to skip the cache; ``retry`` None to skip the default retry
    pass; ``budget`` None for the engine's own (see :func:`couler.optimize.split.
    budget_for`). ``substitute``: take cached steps out of the workflow, their results
    written into their readers (:func:`couler.optimize.reuse.substitute_cached`; for
    engines that cannot restore cached results themselves), artifacts referenced in
    ``store``. ``record_use`` is given the keys the plan uses -- the hits it reuses (not
    those nothing reads) and the keys of the steps it runs -- once it is made, for a cache
    that counts use (``lookup`` only finds entries). ``validated``: the caller has just
    validated ``wf`` (the validate pass does not again). ``capabilities``: the engine's
    matrix, to which the retry policies the optimizer supplied (default or learned) are
    fitted (:func:`couler.optimize.retry_fit.fit_retries`); None leaves them as they are.
    Raises ValidationError / UnsupportedFeatureError naming the step.
    """
    from couler.optimize.split import budget_for

    reports: list[PassReport] = []
    with _timed(reports, "validate") as box:
        if not validated:
            ir.validate(wf)
        box.append(PassReport("", changed=False, notes=(f"{len(wf.steps)} top-level steps",)))
    cached: dict[str, CachedStep] = {}
    with _timed(reports, "prune_cached") as box:
        if lookup is None:
            box.append(PassReport("", changed=False, notes=("cache not consulted",)))
        else:
            cached, notes = prune_cached(wf, lookup, parameters)
            hit = [f"step {n!r}: cached ({c.key[:12]})" for n, c in sorted(cached.items())]
            box.append(PassReport("", changed=bool(cached), notes=tuple(hit + notes)))
    unneeded: tuple[str, ...] = ()
    original = wf
    keys = workflow_keys(wf, parameters)  # what the run's results are committed under
    nothing = False
    with _timed(reports, "substitute_cached") as box:
        if not substitute or lookup is None:
            box.append(PassReport("", changed=False, notes=(
                "skipped: " + ("cache not consulted" if lookup is None
                               else f"{engine} restores cached steps itself"),)))
        else:
            done = substitute_cached(wf, {n: c.outputs for n, c in cached.items()},
                                     {n: c.artifacts for n, c in cached.items()}, store)
            cached = {n: cached[n] for n in done.cached}
            unneeded = done.unneeded
            nothing = not done.workflow.steps
            if not nothing:
                wf = done.workflow
            taken = [f"step {n!r}: taken out, its results written into its readers"
                     for n in done.cached]
            taken += [f"step {n!r}: taken out, nothing left needs it" for n in unneeded]
            box.append(PassReport("", changed=bool(done.cached),
                                  notes=tuple(taken) + done.notes))
    if record_use is not None:
        record_use(_used_keys(original, keys, cached, unneeded_steps(original, cached)))
    written = {s.name for s in wf.steps if s.retry is not None}
    with _timed(reports, "right_size") as box:
        wf, notes = apply_recommendations(wf, recommendations)
        box.append(PassReport("", changed=bool(notes), notes=tuple(notes)))
    with _timed(reports, "default_retry") as box:
        notes = []
        if retry is not None:
            wf, notes = default_retry(wf, retry)
        if capabilities is not None:
            wf, fitted = fit_retries(wf, engine, capabilities, written=written,
                                     flaky=_flaky(wf, recommendations))
            notes += fitted
        box.append(PassReport("", changed=bool(notes),
                              notes=tuple(notes) if notes or retry is not None
                              else ("skipped",)))
    chunks: tuple[Chunk, ...] = ()
    whole: list[Any] = []  # the document of ``wf`` when the split pass compiled it

    def measure(w: ir.Workflow) -> int:
        # Every workflow measured is valid: ``wf`` (validated above, its passes keep it
        # so; checked again below) or a chunk of it. Measured as the engine's API takes
        # it (compact JSON), not as rendered for people (YAML).
        if not compile:
            return 0
        doc = compile_engine_document(w, engine, validate=False)
        if w is wf:
            whole.append(doc)
        return document_size(doc, engine)

    with _timed(reports, "split") as box:
        if nothing:
            box.append(PassReport("", changed=False, notes=("skipped: nothing to run",)))
        else:
            limit = budget if budget is not None else budget_for(engine)
            result = split_workflow(wf, limit, measure=measure)
            chunks = result.chunks if len(result.chunks) > 1 else ()
            box.append(PassReport("", changed=bool(chunks), notes=tuple(result.notes)))
    document = ""
    with _timed(reports, "compile") as box:
        if nothing:
            note = "skipped: every step is reused, the engine runs nothing"
        elif compile and not chunks:
            document = (render_document(whole[0], engine) if whole
                        else compile_document(wf, engine, validate=False))
            note = f"{len(document)} bytes of {engine} document" if document else \
                f"{engine} runs the IR itself"
        elif chunks:
            note = f"{len(chunks)} chunk documents (compile each chunk's workflow)"
        else:
            note = "skipped"
        box.append(PassReport("", changed=False, notes=(note,)))
    ir.validate(wf)
    return Plan(workflow=wf, engine=engine, document=document, cached=cached,
                reports=tuple(reports), chunks=chunks, unneeded=unneeded, keys=keys,
                nothing_to_run=nothing)
