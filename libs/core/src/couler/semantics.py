"""Where an engine cannot follow Couler's semantics, and the warnings ``couler compile`` gives.

The semantics (docs/semantics.md, rules S1-S11) are Argo's where the open-source SDK
relied on them, and the local engine, Ray, Airflow and ``kfp.local`` are checked against
them by the conformance programs (tests/conformance). What an engine refuses it refuses
at compile time, naming the step and feature. What it can express but runs differently
is listed here, once, as an :class:`Exception_`: the conformance tests assert each such
difference is still real, the docs show the same table, and :func:`differences` tells
which of them a given workflow would meet on a given engine, so ``couler compile`` can
warn before anything runs.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from couler import ir

__all__ = ["EXCEPTIONS", "Exception_", "Warning_", "differences", "failed_leaves"]


@dataclass(frozen=True)
class Exception_:  # noqa: N801 - "Exception" is a builtin; this is a documented exception
    """One documented difference between an engine and the semantics."""

    id: str  # E1, E2, ... (docs/semantics.md)
    engines: tuple[str, ...]
    rule: str  # the rule it departs from (S7, ...)
    summary: str


@dataclass(frozen=True)
class Warning_:  # noqa: N801 - mirrors Exception_
    """A documented difference a workflow meets on an engine, where it meets it."""

    exception: Exception_
    engine: str
    workflow: str
    steps: tuple[str, ...]

    def __str__(self) -> str:
        where = f", steps {', '.join(repr(s) for s in self.steps[:4])}" if self.steps else ""
        more = f" (+{len(self.steps) - 4} more)" if len(self.steps) > 4 else ""
        return (f"workflow {self.workflow!r}{where}{more}: {self.exception.id} "
                f"({self.exception.rule}) on {self.engine}: {self.exception.summary}")


E_FAIL_FAST = Exception_(
    "E1", ("tekton", "kfp"), "S7",
    "a failed step ends the run: independent steps that have not started are not run "
    "(Couler runs them to completion, then fails the run)")
E_GROUP_EDGES = Exception_(
    "E2", ("airflow",), "S2",
    "edges from a sub-workflow follow Airflow's trigger rules, which do not tell a step "
    "that was not run from one skipped by its when: a dependent of a sub-workflow that was "
    "not run may still run")
E_GATED_HOOKS = Exception_(
    "E3", ("kfp",), "S8",
    "an exit hook on failed/error, or a step on a failed/completed edge, runs as a task that "
    "exits at once when the status it reads does not match, so KFP reports it succeeded "
    "where other engines report it skipped")

E_ERRORED = Exception_(
    "E4", ("airflow",), "S4",
    "an errored edge fires on any failure: Airflow does not tell a platform error from the "
    "command's own failure")

E_ERRORED_NEVER = Exception_(
    "E5", ("tekton",), "S4",
    "an errored edge never fires: a platform error (eviction, node loss, the task's "
    "timeout) fails the TaskRun itself, which ends the PipelineRun")

E_HANDLED_FAILS = Exception_(
    "E6", ("kfp",), "S7",
    "a failed step fails the run even when a failed / completed / any edge handles it: the "
    "handler runs, and KFP still fails a run one of whose tasks failed")

E_ANY_NOT_RUN = Exception_(
    "E7", ("kfp",), "S4",
    "a step on an any edge from a step that was not run is not run either: the KFP backend "
    "runs it as an exit hook of that step, which never started")

EXCEPTIONS: tuple[Exception_, ...] = (E_FAIL_FAST, E_GROUP_EDGES, E_GATED_HOOKS, E_ERRORED,
                                      E_ERRORED_NEVER, E_HANDLED_FAILS, E_ANY_NOT_RUN)
_STATUS_EDGES = frozenset({ir.EdgeCondition.FAILED, ir.EdgeCondition.COMPLETED,
                           ir.EdgeCondition.ANY})

# Edges whose Airflow trigger rule admits an upstream that was not run (checked by the
# step runner only for single-task upstreams; see couler.compilers.airflow).
_AIRFLOW_CHECKED = frozenset({ir.EdgeCondition.SUCCEEDED, ir.EdgeCondition.SKIPPED,
                              ir.EdgeCondition.FAILED, ir.EdgeCondition.ERRORED,
                              ir.EdgeCondition.COMPLETED})


def failed_leaves(steps: Sequence[ir.Step], outcome: Callable[[str], str]) -> list[str]:
    """The leaf steps whose branch failed: the run (or sub-workflow) fails iff any (rule S7).

    Argo's rule (``assessDAGPhase``): a step that completed -- ``outcome`` gives
    ``"succeeded"`` or ``"failed"`` -- carries its own phase down its branch; a step that
    did not run (``"skipped"`` by its when, or not run at all) carries its parents' --
    failed if any parent's branch failed. A leaf is a step no other step of ``steps``
    depends on. So a failure handled by a step that succeeds does not fail the run, and an
    unhandled one reaches a leaf through the steps it kept from running.

    Linear in the steps and edges. ``outcome`` is asked once per step.
    """
    names = {s.name for s in steps}
    parents = {s.name: [d.step for d in s.dependencies if d.step in names] for s in steps}
    children: dict[str, list[str]] = {s.name: [] for s in steps}
    waiting = {name: len(ups) for name, ups in parents.items()}
    for name, ups in parents.items():
        for up in ups:
            children[up].append(name)
    failed: dict[str, bool] = {}
    ready = [name for name, n in waiting.items() if n == 0]
    while ready:
        name = ready.pop()
        state = outcome(name)
        if state in ("succeeded", "failed"):
            failed[name] = state == "failed"
        else:  # skipped or not run: the branch goes on as it came
            failed[name] = any(failed[up] for up in parents[name])
        for child in children[name]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    return [s.name for s in steps if not children[s.name] and failed.get(s.name, False)]


def differences(wf: ir.Workflow, engine: str) -> list[Warning_]:
    """The documented differences ``wf`` meets on ``engine`` (empty: it runs as specified)."""
    found: list[Warning_] = []

    def add(exc: Exception_, steps: Iterable[str]) -> None:
        found.append(Warning_(exc, engine, wf.name, tuple(steps)))

    if engine in E_FAIL_FAST.engines and not (engine == "tekton" and _status_rewrite(wf)):
        branched = [name for steps in _scopes(wf) for name in _independent(steps)]
        if branched:
            add(E_FAIL_FAST, branched)
    if engine in E_GROUP_EDGES.engines:
        steps = [s.name for scope in _scopes(wf) for s in _edges_from_groups(scope)]
        if steps:
            add(E_GROUP_EDGES, steps)
    if engine in E_GATED_HOOKS.engines:
        gated = [s.name for h in wf.exit_hooks if h.on in (ir.RunStatus.FAILED,
                                                           ir.RunStatus.ERROR)
                 for s in h.steps]
        gated += [s.name for s in ir.all_steps(wf.steps)
                  if any(d.condition in (ir.EdgeCondition.FAILED, ir.EdgeCondition.COMPLETED)
                         for d in s.dependencies)]
        if gated:
            add(E_GATED_HOOKS, gated)
    if engine in E_HANDLED_FAILS.engines:
        handled = [s.name for s in ir.all_steps(wf.steps)
                   if any(d.condition in _STATUS_EDGES for d in s.dependencies)]
        if handled:
            add(E_HANDLED_FAILS, handled)
    if engine in E_ANY_NOT_RUN.engines:
        by_name = {s.name: s for s in ir.all_steps(wf.steps)}
        may_not_run = [s.name for s in by_name.values() if any(
            d.condition is ir.EdgeCondition.ANY and d.step in by_name
            and by_name[d.step].dependencies for d in s.dependencies)]
        if may_not_run:
            add(E_ANY_NOT_RUN, may_not_run)
    for exc in (E_ERRORED, E_ERRORED_NEVER):
        if engine in exc.engines:
            errored = [s.name for s in ir.all_steps(wf.steps)
                       if any(d.condition is ir.EdgeCondition.ERRORED for d in s.dependencies)]
            if errored:
                add(exc, errored)
    return found


def _status_rewrite(wf: ir.Workflow) -> bool:
    """Whether Tekton compiles ``wf`` with its step-status rewrite, under which a failed
    step does not stop the run (couler.compilers.tekton._status): an edge other than the
    default one -- a strict edge from a step without a when is the default one there --
    or a depends expression."""
    by_name = {s.name: s for s in wf.steps}

    def plain(d: ir.Dependency) -> bool:
        up = by_name.get(d.step)
        return d.condition is ir.EdgeCondition.SUCCEEDED or (
            d.condition is ir.EdgeCondition.SUCCEEDED_ONLY and up is not None
            and up.when is None)

    return any(s.depends is not None or not all(plain(d) for d in s.dependencies)
               for s in wf.steps)


def _scopes(wf: ir.Workflow) -> list[Sequence[ir.Step]]:
    """The main steps and every inline sub-workflow's steps, one list per scope."""
    out: list[Sequence[ir.Step]] = [wf.steps]
    out.extend(s.body.steps for s in ir.all_steps(wf.steps)
               if isinstance(s.body, ir.SubWorkflowSpec) and s.body.steps)
    return out


def _independent(steps: Sequence[ir.Step]) -> list[str]:
    """The roots of a scope's branches when it has more than one branch, else nothing.

    A scope is one branch when every step but the first depends on exactly the one
    before it; otherwise the roots and the steps with several dependents start branches.
    """
    if all(s.depends is None and [d.step for d in s.dependencies] ==
           ([steps[i - 1].name] if i else []) for i, s in enumerate(steps)):
        return []
    children: dict[str, int] = {}
    for s in steps:
        for d in s.dependencies:
            children[d.step] = children.get(d.step, 0) + 1
    roots = [s.name for s in steps if not s.dependencies]
    forks = [name for name, n in children.items() if n > 1]
    return roots + forks if len(roots) > 1 or forks else []


def _edges_from_groups(steps: Sequence[ir.Step]) -> list[ir.Step]:
    """Steps with a checked edge from a sub-workflow that may end up not run while Airflow
    reads it as skipped: one with an edge other than the default among its ancestors (a
    strict, failed, skipped... edge is where a skip without a when begins)."""
    by_name = {s.name: s for s in steps}
    out = []
    for s in steps:
        for d in s.dependencies:
            up = by_name.get(d.step)
            if up is not None and d.condition in _AIRFLOW_CHECKED \
                    and isinstance(up.body, ir.SubWorkflowSpec) \
                    and _may_skip_unmarked(up, by_name):
                out.append(s)
                break
    return out


def _may_skip_unmarked(step: ir.Step, by_name: dict[str, ir.Step]) -> bool:
    seen: set[str] = set()
    todo = [step]
    while todo:
        s = todo.pop()
        if s.name in seen:
            continue
        seen.add(s.name)
        if s.depends is not None or any(d.condition is not ir.EdgeCondition.SUCCEEDED
                                        for d in s.dependencies):
            return True
        todo.extend(by_name[d.step] for d in s.dependencies if d.step in by_name)
    return False
