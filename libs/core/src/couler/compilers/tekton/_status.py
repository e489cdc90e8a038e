"""Edge conditions and depends expressions on Tekton: the step-status rewrite.

A Tekton task runs only when the tasks it runs after succeeded or were skipped, a failed
task stops the PipelineRun from starting more tasks, and only ``finally`` tasks may read
``$(tasks.X.status)``. A workflow whose edges need another outcome (``failed``, ``any``,
``completed``, ``skipped``, ``omitted``, ``succeeded_only`` from a step with a ``when``,
a map's ``any_succeeded`` / ``all_failed``) or a depends expression is therefore compiled
in *status mode*, where every step decides for itself, inside its own task:

* Each task's step is a ``/bin/sh`` script with ``onError: continue`` (the TaskRun
  succeeds whatever the command's exit code, so the PipelineRun goes on; the step keeps
  its exit code). It writes two results: ``couler-status`` -- ``Succeeded``, ``Failed``,
  ``Skipped`` (its ``when`` was false) or ``Omitted`` (its edges did not hold: not run) --
  and ``couler-branch``, ``failed`` when a failure reaches it (rule S7: a step that ran
  carries its own outcome, one that did not run carries its parents').
* The task runs after every upstream (``runAfter``) and receives their ``couler-status``
  and ``couler-branch`` (a map's as whole arrays, one entry per item) as params, passed
  to the script as arguments, each list ended by ``--couler--``. The script tests its
  edges (or its depends expression) on them -- the same table as the local engine and
  Argo -- and writes ``Omitted`` without running the command when they do not hold; then
  tests its ``when`` (the operands are params) and writes ``Skipped`` when it is false.
  Every declared result is written (empty, ``[]`` for an array) first, so no task is
  ever skipped by Tekton for a missing result.
* A map step's outcome is its items': ``Failed`` if any failed, else ``Succeeded`` if any
  succeeded, else ``Skipped`` if any was skipped, else ``Omitted``; ``any_succeeded`` /
  ``all_failed`` look at the items themselves.
* A last task, ``couler-run-status``, runs after the leaves and fails -- failing the
  PipelineRun, which exit hooks then see -- when a leaf's branch failed (rule S7).

So independent branches run to completion (no fail-fast, unlike Tekton's default), and a
not-run step costs a pod that exits at once. An ``errored`` edge never holds: a platform
error -- eviction, node loss, the task's timeout -- fails the TaskRun itself, which ends
the PipelineRun (docs/semantics.md E5). Not covered: edges in workflows with inline
sub-workflows or loops (refused); empty dynamic maps (Tekton skips a matrix over an empty
array, so its dependents are skipped too).

Pure: builds text and documents.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from couler import ir

__all__ = [
    "BRANCH_RESULT",
    "END",
    "RUN_STATUS_TASK",
    "STATUS_IMAGE",
    "STATUS_RESULT",
    "Upstream",
    "args",
    "gate_test",
    "needed",
    "prologue",
    "run_status_script",
    "spec_params",
    "task_params",
]

STATUS_RESULT = "couler-status"  # Succeeded / Failed / Skipped / Omitted
BRANCH_RESULT = "couler-branch"  # failed / ok: whether a failure reaches the step (S7)
RUN_STATUS_TASK = "couler-run-status"
STATUS_IMAGE = "alpine:3.20"  # the run-status task's image: any image with /bin/sh
END = "--couler--"  # ends one upstream's list in the script's arguments

_E = ir.EdgeCondition
# The outcomes each edge accepts, tested on the upstream's (aggregated) status.
_ACCEPTS: dict[ir.EdgeCondition, tuple[str, ...]] = {
    _E.SUCCEEDED: ("Succeeded", "Skipped"),
    _E.SUCCEEDED_ONLY: ("Succeeded",),
    _E.FAILED: ("Failed",),
    _E.SKIPPED: ("Skipped",),
    _E.COMPLETED: ("Succeeded", "Failed"),
    _E.OMITTED: ("Omitted",),
}

_HELPERS = """couler_is() { couler_v=$1; shift; for couler_a in "$@"; do [ "$couler_v" = "$couler_a" ] && return 0; done; return 1; }
couler_all() { couler_v=$1; shift; [ "$#" -gt 0 ] || return 1; for couler_a in "$@"; do [ "$couler_a" = "$couler_v" ] || return 1; done; }
couler_agg() { case " $* " in *" Failed "*) echo Failed;; *" Succeeded "*) echo Succeeded;; *" Skipped "*) echo Skipped;; *) echo Omitted;; esac; }"""  # noqa: E501


def needed(steps: Sequence[ir.Step]) -> bool:
    """Whether any step has an edge other than the default one, or a depends expression."""
    return any(s.depends is not None or any(d.condition is not _E.SUCCEEDED
                                            for d in s.dependencies) for s in steps)


@dataclass(frozen=True, slots=True)
class Upstream:
    """One upstream of a task in status mode: where its status lands in the script.

    ``tasks`` are the pipeline tasks that run it: one, or a bounded map's batches.
    """

    step: str
    index: int
    is_map: bool
    tasks: tuple[str, ...] = ()

    @property
    def task_names(self) -> tuple[str, ...]:
        return self.tasks or (self.step,)

    @property
    def status_var(self) -> str:
        return f"couler_up_{self.index}"

    @property
    def branch_var(self) -> str:
        return f"couler_br_{self.index}"


def edge_test(up: Upstream, cond: ir.EdgeCondition) -> str:
    """An sh test that holds when ``up`` reached ``cond``.

    Raises:
        ValueError: an ``errored`` edge, or a map outcome on a step that is not a map.
    """
    var = f"${up.status_var}"
    if cond is _E.ANY:
        return "true"
    if cond is _E.ANY_SUCCEEDED:
        return f'couler_is Succeeded {var}'
    if cond is _E.ALL_FAILED:
        return f"couler_all Failed {var}"
    if cond is _E.ERRORED:
        # a platform error fails the TaskRun itself and ends the PipelineRun; a step's
        # script only ever sees its command's own failures (docs/semantics.md E5)
        return "false"
    accepts = _ACCEPTS.get(cond)
    if accepts is None:
        raise ValueError(f"the edge condition {cond.value!r} is not compiled on Tekton")
    return f'couler_is "$(couler_agg {var})" {" ".join(accepts)}'


def expr_test(expr: ir.DependsExpr, ups: Mapping[str, Upstream]) -> str:
    """A depends expression as an sh test (``&&``, ``||``, ``!`` over edge tests)."""
    if isinstance(expr, ir.DependsTerm):
        return edge_test(ups[expr.step], expr.condition)
    if isinstance(expr, ir.DependsNot):
        return f"! {{ {expr_test(expr.term, ups)}; }}"
    joiner = " && " if isinstance(expr, ir.DependsAll) else " || "
    return "{ " + joiner.join(f"{{ {expr_test(t, ups)}; }}" for t in expr.terms) + "; }"


def gate_test(step: ir.Step, ups: Mapping[str, Upstream]) -> str:
    """The sh test of ``step``'s edges: its depends expression, else all its dependencies."""
    if step.depends is not None:
        return expr_test(step.depends, ups)
    tests = [edge_test(ups[d.step], d.condition) for d in step.dependencies]
    return " && ".join(f"{{ {t}; }}" for t in tests) if tests else "true"


def _take(var: str) -> str:
    return (f'{var}=; while [ "$#" -gt 0 ] && [ "$1" != {END} ]; do {var}="${var} $1"; '
            "shift; done; shift")


_KINDS = {"status": ("couler-up", STATUS_RESULT), "branch": ("couler-br", BRANCH_RESULT)}
BOTH = ("status", "branch")


def _params(up: Upstream, kind: str) -> list[tuple[str, str]]:
    """(param name, task) pairs carrying ``up``'s ``kind`` result, one per task."""
    prefix = _KINDS[kind][0]
    tasks = up.task_names
    if len(tasks) == 1:
        return [(f"{prefix}-{up.index}", tasks[0])]
    return [(f"{prefix}-{up.index}-{j}", t) for j, t in enumerate(tasks)]


def task_params(ups: Sequence[Upstream], kinds: Sequence[str] = BOTH) -> list[dict[str, str]]:
    """The pipeline task's params: each upstream task's status / branch result."""
    star = {True: "[*]", False: ""}
    return [{"name": name, "value": f"$(tasks.{task}.results.{_KINDS[k][1]}{star[u.is_map]})"}
            for u in ups for k in kinds for name, task in _params(u, k)]


def spec_params(ups: Sequence[Upstream], kinds: Sequence[str] = BOTH) -> list[dict[str, str]]:
    """The taskSpec's declarations of :func:`task_params` (a map's are arrays)."""
    return [{"name": name, "type": "array" if u.is_map else "string"}
            for u in ups for k in kinds for name, _ in _params(u, k)]


def args(ups: Sequence[Upstream], kinds: Sequence[str] = BOTH) -> list[str]:
    """The step's leading arguments: per upstream and kind, the values of all its tasks,
    the list ended by :data:`END`."""
    out: list[str] = []
    for u in ups:
        for k in kinds:
            out += [f"$(params.{name}{'[*]' if u.is_map else ''})" for name, _ in _params(u, k)]
            out.append(END)
    return out


def prologue(ups: Sequence[Upstream], gate: str, when: str,
             results: Sequence[tuple[str, bool]]) -> list[str]:
    """The script's first lines: read the upstreams, pre-write every result, test the edges
    (``Omitted``) and the when (``Skipped``). ``results`` are (name, is_array)."""
    lines = [_HELPERS]
    lines += [_take(v) for up in ups for v in (up.status_var, up.branch_var)]
    branches = " ".join(f"${up.branch_var}" for up in ups)
    lines.append(f'case " {branches} " in *" failed "*) couler_pbranch=failed;; '
                 "*) couler_pbranch=ok;; esac")
    for name, is_array in results:
        lines.append(f"printf '{'[]' if is_array else ''}' > \"$(results.{name}.path)\"")
    lines.append(
        "couler_finish() { "
        f"printf '%s' \"$1\" > \"$(results.{STATUS_RESULT}.path)\"; "
        f"printf '%s' \"$2\" > \"$(results.{BRANCH_RESULT}.path)\"; }}")
    lines.append(f"if ! {{ {gate}; }}; then echo 'couler: not run: its dependencies did not "
                 "hold' >&2; couler_finish Omitted \"$couler_pbranch\"; exit 0; fi")
    if when:
        lines.append(f"if ! {{ {when}; }}; then echo 'couler: skipped: its when is false' >&2; "
                     "couler_finish Skipped \"$couler_pbranch\"; exit 0; fi")
    return lines


def epilogue() -> list[str]:
    """The script's last lines: record the outcome, exit with the command's exit code."""
    return ['if [ "$rc" -eq 0 ]; then couler_finish Succeeded ok; '
            "else couler_finish Failed failed; fi",
            'exit "$rc"']


def when_test(op: ir.CompareOp) -> str:
    """The sh test of a when's comparison of ``$COULER_WHEN_L`` and ``$COULER_WHEN_R``."""
    if op is ir.CompareOp.EQ:
        return '[ "$COULER_WHEN_L" = "$COULER_WHEN_R" ]'
    if op is ir.CompareOp.NE:
        return '[ "$COULER_WHEN_L" != "$COULER_WHEN_R" ]'
    # an ordered comparison is of numbers: a value that is not one makes it false
    number = r"^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$"
    return (f"awk -v l=\"$COULER_WHEN_L\" -v r=\"$COULER_WHEN_R\" 'BEGIN {{ n = \"{number}\"; "
            f"exit !(l ~ n && r ~ n && (l + 0) {op.value} (r + 0)) }}'")


def run_status_script(leaves: Sequence[tuple[str, Upstream]]) -> str:
    """The ``couler-run-status`` script: fail when a leaf's branch failed (rule S7)."""
    lines = ["#!/bin/sh", "couler_failed="]
    for name, up in leaves:
        lines.append(_take(up.branch_var))
        lines.append(f'case " ${up.branch_var} " in *" failed "*) '
                     f"couler_failed=\"$couler_failed {shlex.quote(name)}\";; esac")
    lines += ['if [ -n "$couler_failed" ]; then',
              '  echo "couler: the run failed: a failure reached leaf step(s):$couler_failed" '
              ">&2",
              "  exit 1",
              "fi",
              'echo "couler: the run succeeded"']
    return "\n".join(lines) + "\n"
