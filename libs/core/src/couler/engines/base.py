"""The engine contract: features, capability matrices, limits, and normalized run states.

Every engine declares, per IR :class:`Feature`, whether it supports it natively,
through a documented rewrite, or not at all (:class:`Capability`), and a table of
:class:`Limit` values with their sources. :func:`check_capabilities` scans a workflow
(:func:`features_used`) and raises :class:`~couler.errors.UnsupportedFeatureError`
naming the step and the feature before anything is compiled.

Adapters that run workflows report :class:`RunState` / :class:`StepState`, the same
vocabulary on every engine, through :class:`StepStatus` and :class:`RunStatus`
records. Each engine's adapter follows the :class:`EngineAdapter` protocol.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from couler import ir
from couler.errors import UnsupportedFeatureError

if TYPE_CHECKING:
    from couler.api.handles import SecretMaterial

__all__ = [
    "Capability",
    "EngineAdapter",
    "Feature",
    "Limit",
    "RunState",
    "RunStatus",
    "SamplingAdapter",
    "StepSample",
    "StepState",
    "StepStatus",
    "Support",
    "check_capabilities",
    "features_used",
    "first_unsupported",
    "plain_edges",
]


class Feature(enum.StrEnum):
    """An IR feature an engine may or may not express."""

    CONTAINER = "container step"
    SCRIPT = "script step"
    JOB = "job step (Kubernetes resource)"
    SUBWORKFLOW_INLINE = "inline sub-workflow"
    SUBWORKFLOW_REF = "sub-workflow reference"
    PARAMETERS = "step parameters"
    WORKFLOW_PARAMETERS = "workflow parameters"
    ARTIFACTS = "artifacts"
    EDGE_CONDITIONS = "edge conditions (failed / any)"
    DEPENDS_EXPRESSION = "depends expression (and / or / not)"
    WHEN = "when condition"
    ELSE = "else branch"
    MAP_STATIC = "map over static items"
    MAP_DYNAMIC = "map over an upstream output"
    MAP_PARALLELISM = "map parallelism bound"
    LOOP = "bounded loop"
    EXIT_HOOKS = "exit hooks"
    RETRY = "retry"
    RETRY_BACKOFF = "retry back-off"
    RETRY_FAILURE_CLASSES = "retry by failure class"
    MEMORY_ESCALATION = "memory escalation on OOM"
    TIMEOUT = "timeout"
    RESOURCES = "resources"
    GPU = "GPU resources"
    CACHE = "cache policy"
    PRIORITY = "priority"
    NODE_SELECTOR = "node selector"
    TOLERATIONS = "tolerations"
    VOLUMES = "volumes"
    SECRETS = "secret references"
    DAEMON = "daemon step"
    CRON = "cron schedule"
    EVENT_TRIGGERS = "event triggers"
    TUNE = "hyperparameter tuning (optuna study)"


class Support(enum.StrEnum):
    """How an engine handles a feature."""

    NATIVE = "native"
    REWRITTEN = "rewritten"  # expressed through a documented rewrite
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True, slots=True)
class Capability:
    """An engine's support for one feature, with a note on the mapping or rewrite."""

    support: Support
    note: str = ""


@dataclass(frozen=True, slots=True)
class Limit:
    """A documented limit of an engine (object size, steps, fan-out, parameter size...)."""

    name: str
    value: int
    unit: str
    source: str  # where the number comes from: docs page, source file, issue


# Features are scanned per step; workflow-level ones are reported with step "".
_STEP_BODY = {
    ir.ContainerSpec: Feature.CONTAINER,
    ir.ScriptSpec: Feature.SCRIPT,
    ir.JobSpec: Feature.JOB,
}


def _step_features(step: ir.Step) -> Iterable[Feature]:
    body = step.body
    if isinstance(body, ir.SubWorkflowSpec):
        yield Feature.SUBWORKFLOW_INLINE if body.steps else Feature.SUBWORKFLOW_REF
    else:
        yield _STEP_BODY[type(body)]
    if step.inputs or step.outputs:
        yield Feature.PARAMETERS
    if step.input_artifacts or step.output_artifacts:
        yield Feature.ARTIFACTS
    if any(d.condition is not ir.EdgeCondition.SUCCEEDED for d in step.dependencies):
        yield Feature.EDGE_CONDITIONS
    if step.depends is not None:
        yield Feature.DEPENDS_EXPRESSION
    if step.when is not None:
        yield Feature.WHEN if step.when.expect else Feature.ELSE
    if step.foreach is not None:
        yield Feature.MAP_STATIC if step.foreach.items else Feature.MAP_DYNAMIC
        if step.foreach.parallelism is not None:
            yield Feature.MAP_PARALLELISM
    if step.loop is not None:
        yield Feature.LOOP
    if step.tune is not None:
        yield Feature.TUNE
    if step.retry is not None:
        yield from _retry_features(step.retry)
    if step.timeout_seconds is not None:
        yield Feature.TIMEOUT
    if step.resources is not None:
        yield Feature.RESOURCES
        if step.resources.gpu:
            yield Feature.GPU
    if step.cache is not None and step.cache.enabled:
        yield Feature.CACHE
    if step.priority is not None:
        yield Feature.PRIORITY
    if step.node_selector:
        yield Feature.NODE_SELECTOR
    if step.tolerations:
        yield Feature.TOLERATIONS
    if step.volume_mounts:
        yield Feature.VOLUMES
    if any(e.secret is not None for e in step.env):
        yield Feature.SECRETS
    if step.daemon:
        yield Feature.DAEMON


def _retry_features(retry: ir.RetryPolicy) -> Iterable[Feature]:
    yield Feature.RETRY
    if retry.backoff is not None:
        yield Feature.RETRY_BACKOFF
    if set(retry.on) != {ir.FailureClass.ANY}:
        yield Feature.RETRY_FAILURE_CLASSES
    if retry.memory_factor is not None:
        yield Feature.MEMORY_ESCALATION


def features_used(wf: ir.Workflow) -> dict[Feature, list[str]]:
    """Which features ``wf`` uses, each with the steps that use it ("" = workflow level).

    Step defaults count for every step they apply to; exit-hook and inline
    sub-workflow steps are included.
    """
    used: dict[Feature, dict[str, None]] = {}  # an ordered set per feature: linear

    def add(feature: Feature, where: str) -> None:
        used.setdefault(feature, {})[where] = None

    d = wf.defaults
    steps = [*wf.steps, *(s for hook in wf.exit_hooks for s in hook.steps)]
    for step in ir.all_steps(steps):
        for feature in _step_features(step):
            add(feature, step.name)
        if step.retry is None and d.retry is not None:
            for feature in _retry_features(d.retry):
                add(feature, step.name)
        if step.timeout_seconds is None and d.timeout_seconds is not None:
            add(Feature.TIMEOUT, step.name)
        if step.resources is None and d.resources is not None:
            add(Feature.RESOURCES, step.name)
        if step.priority is None and d.priority is not None:
            add(Feature.PRIORITY, step.name)
        if step.cache is None and d.cache is not None and d.cache.enabled:
            add(Feature.CACHE, step.name)
    if wf.parameters:
        add(Feature.WORKFLOW_PARAMETERS, "")
    if wf.exit_hooks:
        add(Feature.EXIT_HOOKS, "")
    if wf.schedule is not None:
        add(Feature.CRON, "")
    if wf.triggers:
        add(Feature.EVENT_TRIGGERS, "")
    if wf.volumes:
        add(Feature.VOLUMES, "")
    if wf.tolerations:
        add(Feature.TOLERATIONS, "")
    if wf.node_selector:
        add(Feature.NODE_SELECTOR, "")
    return {feature: list(names) for feature, names in used.items()}


def plain_edges(wf: ir.Workflow) -> ir.Workflow:
    """``wf`` with each ``succeeded_only`` edge from a step without a ``when`` made plain.

    Such a step cannot be skipped by its own ``when``, so "ran and succeeded"
    and the default edge ("succeeded, or skipped by its when") accept the same
    outcomes. Engines without per-edge conditions compile the plain edge, so an
    open-source program's ``A.Succeeded`` runs there unchanged.
    """

    def scope(steps: tuple[ir.Step, ...]) -> tuple[ir.Step, ...]:
        by_name = {s.name: s for s in steps}
        return tuple(one(s, by_name) for s in steps)

    def plain(step: str, cond: ir.EdgeCondition, by_name: Mapping[str, ir.Step],
              ) -> ir.EdgeCondition:
        up = by_name.get(step)
        if cond is ir.EdgeCondition.SUCCEEDED_ONLY and up is not None and up.when is None:
            return ir.EdgeCondition.SUCCEEDED
        return cond

    def expr(e: ir.DependsExpr, by_name: Mapping[str, ir.Step]) -> ir.DependsExpr:
        if isinstance(e, ir.DependsTerm):
            return ir.DependsTerm(e.step, plain(e.step, e.condition, by_name))
        if isinstance(e, ir.DependsNot):
            return ir.DependsNot(expr(e.term, by_name))
        return type(e)(tuple(expr(t, by_name) for t in e.terms))

    def one(step: ir.Step, by_name: Mapping[str, ir.Step]) -> ir.Step:
        deps = tuple(ir.Dependency(d.step, plain(d.step, d.condition, by_name))
                     for d in step.dependencies)
        depends = expr(step.depends, by_name) if step.depends is not None else None
        body = step.body
        if isinstance(body, ir.SubWorkflowSpec) and body.steps:
            body = dataclasses.replace(body, steps=scope(body.steps))
        if deps == step.dependencies and depends == step.depends and body is step.body:
            return step
        return dataclasses.replace(step, dependencies=deps, depends=depends, body=body)

    hooks = tuple(dataclasses.replace(h, steps=scope(h.steps)) for h in wf.exit_hooks)
    return dataclasses.replace(wf, steps=scope(wf.steps), exit_hooks=hooks)


def first_unsupported(capabilities: Mapping[Feature, Capability],
                      wf: ir.Workflow) -> tuple[Feature, str] | None:
    """The first feature ``wf`` uses that ``capabilities`` cannot express, and the step using it.

    A feature missing from ``capabilities`` counts as unsupported.
    """
    for feature, steps in features_used(wf).items():
        cap = capabilities.get(feature)
        if cap is None or cap.support is Support.UNSUPPORTED:
            return feature, steps[0]
    return None


def check_capabilities(engine: str, capabilities: Mapping[Feature, Capability],
                       wf: ir.Workflow) -> None:
    """Raise if ``wf`` uses a feature ``engine`` cannot express, naming the step and feature."""
    found = first_unsupported(capabilities, wf)
    if found is not None:
        feature, step = found
        cap = capabilities.get(feature)
        detail = cap.note if cap is not None else ""
        raise UnsupportedFeatureError(engine, wf.name, step, feature.value, detail)


class StepState(enum.StrEnum):
    """The state of one step, the same on every engine."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # its when was false, or an upstream edge condition was not met
    CACHED = "cached"  # its result was reused
    RETRYING = "retrying"  # an attempt failed and another will start
    CANCELLED = "cancelled"
    PRUNED = "pruned"  # a tuning trial its study's pruner stopped (not a failure)

    @property
    def terminal(self) -> bool:
        """Whether the step will not change state again."""
        return self in _TERMINAL_STEP


_TERMINAL_STEP = {StepState.SUCCEEDED, StepState.FAILED, StepState.SKIPPED, StepState.CACHED,
                  StepState.CANCELLED, StepState.PRUNED}


class RunState(enum.StrEnum):
    """The state of a whole run, the same on every engine."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the run will not change state again."""
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


@dataclass(frozen=True, slots=True)
class StepStatus:
    """What is known about one step (one map item / loop iteration has its own ``key``)."""

    step: str
    state: StepState
    key: str = ""  # "" for a plain step; the item index or iteration number otherwise
    attempts: int = 0
    exit_code: int | None = None
    started_at: float | None = None  # seconds since the epoch
    finished_at: float | None = None
    peak_cpu: float | None = None  # cores
    peak_memory_bytes: int | None = None
    outputs: Mapping[str, str] = field(default_factory=dict)
    message: str = ""
    cache_key: str = ""  # the step's content key when the engine computed one (or reused it)
    # the cache keys of the steps whose outputs it read, as far as the engine knew them
    cache_lineage: tuple[str, ...] = ()
    # a CACHED step: the compute its reuse saved, in seconds (the cache entry's cost)
    cache_saved_seconds: float = 0.0
    # a FAILED or RETRYING step, when the engine classified it: the ir.FailureClass value
    # and why (couler.failures.classify), e.g. "user error: Python ValueError in the
    # traceback; not retried"
    failure: str = ""
    failure_reason: str = ""


@dataclass(frozen=True, slots=True)
class StepSample:
    """The resources one step execution used over an interval, measured while it runs.

    ``cpu`` is the *average* number of cores used over the ``interval_seconds`` that end at
    ``at`` (CPU time over wall time, child processes included), not an instantaneous
    reading; ``memory_bytes`` is the resident memory of the step's processes (a pod's
    containers' working set on Kubernetes) at ``at``.
    """

    step: str
    at: float  # seconds since the epoch: the end of the interval
    cpu: float  # average cores over the interval
    memory_bytes: int
    key: str = ""  # "" for a plain step; the item index or iteration number otherwise
    attempt: int = 1
    interval_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class RunStatus:
    """What is known about a whole run."""

    run_id: str
    workflow: str
    state: RunState
    steps: tuple[StepStatus, ...] = ()
    started_at: float | None = None
    finished_at: float | None = None
    message: str = ""


@runtime_checkable
class EngineAdapter(Protocol):
    """What every engine adapter does with a running engine.

    ``submit`` compiles and hands the workflow to the engine and returns the run's
    id; with the same ``idempotency_key`` a second submit returns the first run's id
    and starts nothing. ``watch`` yields a :class:`RunStatus` whenever something
    changed and stops after a terminal one (or at ``timeout`` seconds, raising
    :class:`~couler.errors.OperationTimeoutError`). ``logs`` returns the text one
    step (one map item / iteration: ``key``) wrote. ``cancel`` stops the run; it is a
    no-op on a finished run. Errors follow :mod:`couler.errors`: ``UserError`` for
    what the caller must fix, ``NotFoundError`` for an unknown run, ``RetryableError``
    for engine or network trouble.
    """

    def submit(self, wf: ir.Workflow, secrets: Sequence[SecretMaterial] = (), *,
               idempotency_key: str | None = None) -> str: ...

    def status(self, run_id: str) -> RunStatus: ...

    def watch(self, run_id: str, timeout: float | None = None) -> Iterator[RunStatus]: ...

    def logs(self, run_id: str, step: str, key: str = "") -> str: ...

    def cancel(self, run_id: str) -> None: ...


@runtime_checkable
class SamplingAdapter(Protocol):
    """An adapter whose engine exposes what running steps use (optional).

    ``utilization`` returns what the run's running steps use now, one
    :class:`StepSample` per step execution it can measure (``()`` when the engine
    exposes nothing, e.g. no metrics API in the cluster: not an error). The caller polls it
    while the run goes on; a reading the engine has not refreshed since the last poll
    comes back with the same ``at`` (the receiver drops such repeats).
    """

    def utilization(self, run_id: str) -> Sequence[StepSample]: ...
