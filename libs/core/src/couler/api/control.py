"""Control flow: conditions, fan-out, concurrency, DAG edges, loops and exit handlers.

Every scope is managed with try/finally (and the steps a failing body added
are removed), so an exception inside a ``when``, ``exec_while``, ``map``,
``concurrent`` or exit-handler body leaves no state behind.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from couler import ir
from couler.api.builder import StepDraft, WorkflowBuilder, current_builder
from couler.api.config import WFStatus
from couler.api.depends import DEPENDS_STATUSES, parse_depends
from couler.api.handles import ItemHandle, ParameterOutput, StepOutput, WorkflowParam
from couler.api.naming import sanitize
from couler.errors import UserError

__all__ = [
    "Predicate",
    "bigger",
    "bigger_equal",
    "concurrent",
    "dag",
    "equal",
    "exec_while",
    "map",
    "not_equal",
    "set_dependencies",
    "set_exit_handler",
    "smaller",
    "smaller_equal",
    "when",
]


# --------------------------------------------------------------------------- predicates


@dataclass(frozen=True)
class Predicate:
    """A comparison for :func:`when` and :func:`exec_while`: ``pre <op> post``.

    Indexing with ``"pre"``, ``"post"`` and ``"condition"`` works as with the
    SDK's dict form.
    """

    pre: object
    post: object
    op: ir.CompareOp

    def __getitem__(self, key: str) -> object:
        return {"pre": self.pre, "post": self.post, "condition": self.op.value}[key]


def equal(pre: object, post: object = None) -> Predicate:
    """``pre == post`` (with one operand: the loop body's result ``== pre``)."""
    return Predicate(pre, post, ir.CompareOp.EQ)


def not_equal(pre: object, post: object = None) -> Predicate:
    """``pre != post``."""
    return Predicate(pre, post, ir.CompareOp.NE)


def bigger(pre: object, post: object = None) -> Predicate:
    """``pre > post``."""
    return Predicate(pre, post, ir.CompareOp.GT)


def smaller(pre: object, post: object = None) -> Predicate:
    """``pre < post``."""
    return Predicate(pre, post, ir.CompareOp.LT)


def bigger_equal(pre: object, post: object = None) -> Predicate:
    """``pre >= post``."""
    return Predicate(pre, post, ir.CompareOp.GE)


def smaller_equal(pre: object, post: object = None) -> Predicate:
    """``pre <= post``."""
    return Predicate(pre, post, ir.CompareOp.LE)


def _predicate(condition: object, what: str) -> Predicate:
    if not isinstance(condition, Predicate):
        raise UserError(f"{what} needs a predicate such as couler.equal(output, value), "
                        f"not {condition!r}")
    return condition


def _operand(b: WorkflowBuilder, value: object, what: str,
             ) -> tuple[ir.ValueSource, StepDraft | None, bool]:
    """An operand's source, the step it reads (if any) and whether it reads its stdout."""
    source, _, upstream = b.operand(value, what=what)
    stdout = (upstream is not None and isinstance(source, ir.StepOutputRef)
              and upstream.is_stdout(source.output))
    return source, upstream, stdout


def _fn_name(fn: object) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return str(name)


# --------------------------------------------------------------------------- when


def when(condition: Predicate, function: Callable[[], Any],
         else_function: Callable[[], Any] | None = None) -> Any:
    """Run the steps ``function`` creates only if ``condition`` holds (else ``else_function``'s).

    Args:
        condition: e.g. ``couler.equal(flip_result, "heads")``.
        function: Creates the steps of the "then" branch.
        else_function: Creates the steps of the "else" branch.

    Returns:
        What ``function`` returned.

    Raises:
        UserError: for a condition that is not a two-operand predicate.
    """
    b = current_builder()
    pred = _predicate(condition, "when()")
    if pred.post is None:
        raise UserError(f"workflow {b.workflow_name()!r}: when() compares two values, e.g. "
                        "couler.equal(output, 'heads'); got one operand")
    left, up_l, out_l = _operand(b, pred.pre, "when() condition")
    right, up_r, out_r = _operand(b, pred.post, "when() condition")
    cond = ir.Condition(left, pred.op, right)
    upstream = tuple(u for u in (up_l, up_r) if u is not None)
    stdout_of = tuple(u for u, s in ((up_l, out_l), (up_r, out_r)) if u is not None and s)
    scope = b.scope
    entry = list(scope.prev)
    exits: list[StepDraft] = []
    key = tuple(sorted(id(u) for u in upstream))
    last = scope.last_when
    if scope.chain and key and last is not None and last[0] == key and scope.prev == last[2]:
        # right after a when() on the same upstream: a sibling branch (both start after
        # that upstream; the next statement waits for both), not a step after it
        entry = list(last[1])
        exits = list(last[2])
        scope.prev = list(entry)
    with b.atomic():
        with b.capture() as frame, b.when_context(ir.When(cond, True), upstream, stdout_of):
            result = function()
        if any(d.scope is scope for d in frame.created):
            exits.extend(d for d in scope.prev if d not in exits)
        if else_function is not None:
            scope.prev = list(entry)
            with b.capture() as frame, b.when_context(ir.When(cond, False), upstream, stdout_of):
                else_function()
            if any(d.scope is scope for d in frame.created):
                exits.extend(d for d in scope.prev if d not in exits)
        scope.prev = exits or entry
        scope.last_when = (key, entry, list(scope.prev)) if key else None
    return result


# --------------------------------------------------------------------------- concurrency


def concurrent(function_list: Sequence[Callable[[], Any]], subtasks: bool = False) -> list[Any]:
    """Run the steps of several functions in parallel.

    In steps mode every function's steps start after the previous group, and
    the next group waits for all of them.

    Args:
        function_list: Functions that each create one or more steps.
        subtasks: Wrap each function's steps into one sub-workflow step (its
            steps run one after another inside it).

    Returns:
        What each function returned, in order.
    """
    b = current_builder()
    if isinstance(function_list, (str, bytes)) or not isinstance(function_list, Sequence):
        raise UserError("concurrent() needs a list of functions")
    scope = b.scope
    entry = list(scope.prev)
    exits: list[StepDraft] = []
    results: list[Any] = []
    with b.atomic():
        for fn in function_list:
            if not callable(fn):
                raise UserError(f"concurrent(): {fn!r} is not callable")
            scope.prev = list(entry)
            if subtasks:
                sub = b.new_scope("subtask")
                with b.in_scope(sub), b.isolated():
                    results.append(fn())
                if not sub.drafts:
                    continue
                draft = StepDraft(builder=b, base_name="concurrent-task",
                                  template="concurrent-task", body=None, children=sub)
                b.add_step(draft)
                exits.append(draft)
            else:
                with b.capture() as frame:
                    results.append(fn())
                if any(d.scope is scope for d in frame.created):
                    exits.extend(d for d in scope.prev if d not in exits)
        scope.prev = exits or entry
    return results


# --------------------------------------------------------------------------- map


def map(function: Callable[..., Any], *arguments: object,
        parallelism: int | None = None) -> Any:
    """Fan one step out over items: ``map(fn, [1, 2, 3])`` or ``map(fn, upstream_output)``.

    ``function`` is called once with item handles and must create exactly one
    step; that step runs once per item. Several lists are zipped by index
    (each item is a dict keyed by argument position, ``"0"``, ``"1"``, ...).
    A single upstream output (a JSON list printed or written by an earlier
    step) or a workflow parameter fans out over its value at run time.

    Args:
        function: Creates the step, taking one argument per list.
        *arguments: Lists of equal length, or one upstream output / parameter.
        parallelism: At most this many items run at once.

    Returns:
        What ``function`` returned (the mapped step's outputs).

    Raises:
        UserError: if the lists differ in length, are empty, or ``function``
            does not create exactly one step.
    """
    b = current_builder()
    if not arguments:
        raise UserError("map() needs at least one list of items or an upstream output")
    if parallelism is not None and parallelism < 1:
        raise UserError(f"map(): parallelism must be at least 1, got {parallelism}")
    token = object()
    source: ir.StepOutputRef | ir.WorkflowParamRef | None = None
    source_step: StepDraft | None = None
    items: tuple[ir.Literal, ...] = ()
    first = arguments[0]
    if len(arguments) == 1 and _is_dynamic(first):
        value = b.unwrap(first)
        if isinstance(value, ParameterOutput):
            source_step = b.check_output(value, what="map() source")
            source = ir.StepOutputRef(source_step.name, value.name)
            handles = [ItemHandle(token, "", ir.ValueType.STRING)]
        elif isinstance(value, WorkflowParam):
            if value.builder is not b:
                raise UserError("map(): the parameter belongs to another workflow")
            source = ir.WorkflowParamRef(value.name)
            handles = [ItemHandle(token, "", ir.ValueType.STRING)]
        else:
            raise UserError(f"map(): cannot fan out over {value!r}; pass lists of items or an "
                            "output parameter of an earlier step")
    else:
        lists = [_items(a, i) for i, a in enumerate(arguments)]
        lengths = {len(lst) for lst in lists}
        if len(lengths) != 1:
            raise UserError(f"map(): the lists differ in length ({sorted(lengths)}); they are "
                            "zipped by index")
        if 0 in lengths:
            raise UserError("map(): the list of items is empty")
        try:
            if len(lists) == 1:
                items = tuple(ir.Literal.of(v) for v in lists[0])
                handles = [ItemHandle(token, "", _common_type(lists[0]))]
            else:
                items = tuple(ir.Literal.of({str(k): lst[j] for k, lst in enumerate(lists)})
                              for j in builtins.range(len(lists[0])))
                handles = [ItemHandle(token, str(k), _common_type(lst))
                           for k, lst in enumerate(lists)]
        except (TypeError, ValueError) as e:
            raise UserError(f"map(): the items must be JSON-compatible values ({e})") from e
    with b.atomic():
        with b.map_context(token), b.capture() as frame:
            result = function(*handles)
        created = [d for d in frame.created if d.scope is b.scope]
        if len(created) != 1:
            names = [d.name for d in created]
            raise UserError(f"workflow {b.workflow_name()!r}: map() over {_fn_name(function)} "
                            f"created {len(created)} steps {names}; the function must create "
                            "exactly one step")
        step = created[0]
        if step.loop is not None:
            raise UserError(f"workflow {b.workflow_name()!r}, step {step.name!r}: a step cannot "
                            "both loop (exec_while) and map")
        step.foreach = ir.ForEach(items=items, source=source, parallelism=parallelism)
        if source_step is not None and isinstance(source, ir.StepOutputRef):
            step.add_dep(source_step.name)
            _mark_list_output(source_step, source.output)
    return result


def _mark_list_output(step: StepDraft, output: str) -> None:
    """A step output a map fans out over carries a list."""
    if step.is_stdout(output):
        step.stdout_used = True
        step.stdout_type = ir.ValueType.LIST
        return
    step.outputs = [dataclasses.replace(o, type=ir.ValueType.LIST)
                    if o.name == output and o.type == ir.ValueType.STRING else o
                    for o in step.outputs]


def _is_dynamic(value: object) -> bool:
    if isinstance(value, (ParameterOutput, WorkflowParam)):
        return True
    return isinstance(value, (list, tuple)) and len(value) > 0 and isinstance(value[0], StepOutput)


def _items(value: object, position: int) -> list[object]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise UserError(f"map(): argument {position + 1} must be a list of items, not {value!r}")
    for v in value:
        if isinstance(v, (StepOutput, ItemHandle, WorkflowParam)):
            raise UserError(f"map(): argument {position + 1} mixes step outputs into a list of "
                            "items; map over one upstream output instead")
    return list(value)


def _common_type(values: Sequence[object]) -> ir.ValueType:
    types = {ir.type_of(v) for v in values}
    if len(types) == 1:
        return types.pop()
    if types == {ir.ValueType.INT, ir.ValueType.FLOAT}:
        return ir.ValueType.FLOAT
    return ir.ValueType.STRING


# --------------------------------------------------------------------------- DAG


def dag(dependency_graph: Sequence[Sequence[Callable[[], Any]]]) -> None:
    """Build a DAG from edge lists: ``[[A], [A, B], [B, C]]`` means A, A -> B, B -> C.

    Each callable creates a step (normally with an explicit ``step_name``);
    calling a callable whose step already exists reuses it, so a step can be
    named in several edges. Switches the workflow to DAG mode (only explicit
    edges). Declared outputs of an upstream step are passed to its downstream
    steps implicitly, as in the SDK.

    Args:
        dependency_graph: A list of edge lists of callables.

    Raises:
        UserError: for an edge that is not a list of callables, or a callable
            that creates no step.
    """
    b = current_builder()
    if isinstance(dependency_graph, (str, bytes)) or not isinstance(dependency_graph, Sequence):
        raise UserError("dag() needs a list of edges, each a list of callables")
    b.enter_dag_mode()
    memo: dict[int, tuple[object, list[StepDraft]]] = {}

    def steps_of(fn: Callable[[], Any]) -> list[StepDraft]:
        hit = memo.get(id(fn))
        if hit is not None and hit[0] is fn:
            return hit[1]
        with b.capture() as frame:
            fn()
        steps = [d for d in frame.touched if d.scope is b.scope]
        if not steps:
            raise UserError(f"workflow {b.workflow_name()!r}: dag(): {_fn_name(fn)} created "
                            "no step")
        memo[id(fn)] = (fn, steps)
        return steps

    with b.atomic(), b.dedupe_context():
        for edge in dependency_graph:
            if isinstance(edge, (str, bytes)) or not isinstance(edge, Sequence) or not edge:
                raise UserError(f"dag(): every edge must be a non-empty list of callables, "
                                f"got {edge!r}")
            previous: list[StepDraft] | None = None
            for fn in edge:
                if not callable(fn):
                    raise UserError(f"dag(): {fn!r} is not callable")
                steps = steps_of(fn)
                if previous is not None:
                    for step in steps:
                        for up in previous:
                            _edge(step, up.name)
                previous = steps


def _edge(step: StepDraft, upstream: str) -> None:
    if upstream == step.name:
        return
    step.add_dep(upstream)
    if upstream not in step.implicit_from:
        step.implicit_from.append(upstream)


def set_dependencies(step_function: Callable[[], Any],
                     dependencies: Sequence[str] | str | None = None) -> Any:
    """Create the steps of ``step_function`` with explicit upstream dependencies.

    Switches the workflow to DAG mode.

    Args:
        step_function: Creates one or more steps.
        dependencies: None (a root), a list of step names (each must succeed,
            or be skipped by its own ``when``; their declared outputs are
            passed implicitly), or an Argo enhanced-depends expression such as
            ``"A && (C.Succeeded || C.Failed)"``.

    Returns:
        What ``step_function`` returned.

    Raises:
        UserError: for a malformed expression or a function that creates no step.
    """
    b = current_builder()
    b.enter_dag_mode()
    expr: ir.DependsExpr | None = None
    parsed: tuple[ir.Dependency, ...] = ()
    if isinstance(dependencies, str):
        expr, parsed = parse_depends(dependencies)
    elif dependencies is not None and (not isinstance(dependencies, Sequence)
                                       or not all(isinstance(d, str) for d in dependencies)):
        raise UserError(f"set_dependencies(): dependencies must be a list of step names or a "
                        f"depends expression, not {dependencies!r}")
    with b.atomic():
        with b.dedupe_context(), b.capture() as frame:
            result = step_function()
        steps = [d for d in frame.touched if d.scope is b.scope]
        if not steps:
            raise UserError(f"workflow {b.workflow_name()!r}: set_dependencies(): "
                            f"{_fn_name(step_function)} created no step")
        for step in steps:
            if expr is not None:
                for dep in parsed:
                    if dep.step != step.name:  # the stated outcome wins over an implicit edge
                        step.deps[dep.step] = dep.condition
                if _edges_only(expr):
                    continue  # "A.Failed", "A && B": the edges say it all, on every engine
                step.depends = expr if step.depends is None else ir.DependsAll((step.depends, expr))
            elif dependencies is not None:
                for name in dependencies:
                    _listed_edge(step, name)
    return result


def _listed_edge(step: StepDraft, name: str) -> None:
    """An edge from one entry of a ``dependencies`` list: a step name, or ``NAME.Status``."""
    if name.rpartition(".")[2] not in DEPENDS_STATUSES:
        _edge(step, sanitize(name))
        return
    expr, _ = parse_depends(name)
    if not isinstance(expr, ir.DependsTerm):
        raise UserError(f"set_dependencies(): list entry {name!r} is an expression; pass it as "
                        "a string (dependencies=\"A && B.Failed\"), not inside a list")
    if expr.step != step.name:
        _edge(step, expr.step)
        step.deps[expr.step] = expr.condition


def _edges_only(expr: ir.DependsExpr) -> bool:
    """Whether ``expr`` is one term or an ``&&`` of terms on distinct steps: exactly what
    the edges with those conditions mean, so no depends expression is needed."""
    terms = expr.terms if isinstance(expr, ir.DependsAll) else (expr,)
    if not all(isinstance(t, ir.DependsTerm) for t in terms):
        return False
    steps = [t.step for t in terms if isinstance(t, ir.DependsTerm)]
    return len(set(steps)) == len(steps)


# --------------------------------------------------------------------------- loops


def exec_while(condition: Predicate, inner_while: Callable[[], Any],
               max_iterations: int = 100) -> Any:
    """Run the step ``inner_while`` creates, and repeat it while ``condition`` holds.

    ``exec_while(couler.equal("tails"), flip)`` compares the step's own
    result (stdout) with ``"tails"`` after each run. With two operands, an
    operand that is ``inner_while`` itself or one of the body step's outputs
    reads the latest run.

    Args:
        condition: A predicate (one operand: compared with the body's result).
        inner_while: Creates exactly one step, the loop body.
        max_iterations: Upper bound on the number of runs.

    Returns:
        What ``inner_while`` returned.

    Raises:
        UserError: if the body creates no step or several steps (the loop
            condition reads one step's own result), or for a bad condition.
    """
    b = current_builder()
    pred = _predicate(condition, "exec_while()")
    if max_iterations < 1:
        raise UserError(f"exec_while(): max_iterations must be at least 1, got {max_iterations}")
    with b.atomic():
        with b.capture() as frame:
            result = inner_while()
        created = [d for d in frame.created if d.scope is b.scope]
        loop_name = _fn_name(inner_while)
        if len(created) != 1:
            names = [d.name for d in created]
            raise UserError(
                f"workflow {b.workflow_name()!r}: exec_while loop over {loop_name!r} created "
                f"{len(created)} steps {names}; the loop repeats one step and its condition reads "
                "that step's own result, which a group of steps does not have. Put the loop body "
                "into one run_script or run_container step")
        step = created[0]
        if step.foreach is not None:
            raise UserError(f"workflow {b.workflow_name()!r}, step {step.name!r}: a step cannot "
                            "both loop and map")
        if pred.post is None:
            left: ir.ValueSource = _self_result(b, step, loop_name)
            right, up, _ = _operand(b, pred.pre, "exec_while() condition")
            if up is not None:
                step.add_dep(up.name)
        else:
            left = _loop_operand(b, step, pred.pre, inner_while, loop_name)
            right = _loop_operand(b, step, pred.post, inner_while, loop_name)
        step.loop = ir.Loop(ir.Condition(left, pred.op, right), max_iterations=max_iterations)
    return result


def _self_result(b: WorkflowBuilder, step: StepDraft, loop_name: str) -> ir.StepOutputRef:
    if not isinstance(step.body, (ir.ContainerSpec, ir.ScriptSpec)):
        raise UserError(f"workflow {b.workflow_name()!r}: exec_while loop over {loop_name!r}: "
                        f"step {step.name!r} has no stdout result to compare")
    step.stdout_used = True
    return ir.StepOutputRef(step.name, "result")


def _loop_operand(b: WorkflowBuilder, step: StepDraft, value: object,
                  body: Callable[[], Any], loop_name: str) -> ir.ValueSource:
    if value is body:
        return _self_result(b, step, loop_name)
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], StepOutput):
        value = value[0]
    if isinstance(value, StepOutput) and value.draft is step:
        if step.is_stdout(value.name):
            return _self_result(b, step, loop_name)
        return ir.StepOutputRef(step.name, value.name)
    source, up, _ = _operand(b, value, "exec_while() condition")
    if up is not None:
        step.add_dep(up.name)
    return source


# --------------------------------------------------------------------------- exit handlers


def set_exit_handler(status: WFStatus | ir.RunStatus | str,
                     exit_handler: Callable[[], Any]) -> Any:
    """Run the steps ``exit_handler`` creates after the workflow ends with ``status``.

    Calling it again for the same status appends to that handler; its steps
    run one after another.

    Args:
        status: ``WFStatus.Succeeded``, ``WFStatus.Failed`` or ``WFStatus.Error``.
        exit_handler: Creates the handler's steps.

    Returns:
        What ``exit_handler`` returned.
    """
    b = current_builder()
    run_status = _run_status(status)
    with b.atomic():
        scope = b.exit_scope(run_status)
        with b.in_scope(scope), b.isolated():
            return exit_handler()


def _run_status(status: object) -> ir.RunStatus:
    if isinstance(status, WFStatus):
        return status.to_ir()
    if isinstance(status, ir.RunStatus):
        return status
    if isinstance(status, (str, enum.Enum)):
        text = str(status.value if isinstance(status, enum.Enum) else status).lower()
        for s in ir.RunStatus:
            if s.value == text:
                return s
    raise UserError(f"set_exit_handler(): unknown status {status!r}; use couler.WFStatus."
                    "Succeeded, Failed or Error")
