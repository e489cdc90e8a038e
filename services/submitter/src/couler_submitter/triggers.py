"""Event triggers on the embedded stack: a message on the bus launches a workflow's run.

A workflow with event triggers (``ir.EventTrigger(subject, filter)``) submitted to the
submitter, or registered as a template, is kept as the template of its name; each trigger
subscribes it to ``subject`` on the bus. The submitter's durable consumer
``submitter-events`` reads ``couler.event.>``:

* **Who published.** Outside launchers publish events as ``couler.event.<launcher>.<subject>``
  and the NATS server lets launcher ``launch-<name>`` publish only under its own name
  (``couler_runtime.bus_access.launcher_grant``): the token after ``couler.event`` is the
  publisher, vouched for by the server. The body is a ``couler.v1.LaunchRequest`` (what
  launchers send on ``couler.launch.<template>``): its ``parameters`` are the event's
  fields, its ``idempotency_key`` makes a redelivered event one run. (On an open bus,
  ``COULER_BUS_INSECURE``, nothing vouches for the name: anyone may publish anything.)
* **Who may launch the workflow.** The workflow's annotation ``couler.io/launchers`` lists
  the launchers (comma-separated names) whose events may launch it; without it, any
  launcher may -- as any launcher may publish ``couler.launch.<template>``. An event from a
  launcher not listed launches nothing and is logged (WARNING, naming launcher, subject and
  workflow).
* **Filter.** An expression over ``body`` (the event's parameters): ``body.size > 0``,
  ``body["kind"] == "csv" and not body.partial``; comparisons (``== != < <= > >= in``,
  ``not in``), ``and``, ``or``, ``not``, string and number constants. A value that reads as
  a number is compared as one (as ``when`` conditions are); a field the event lacks makes
  the filter false. An empty filter takes every event. A filter that does not parse is
  refused when the workflow is registered.
* **The run.** ``submit(template=...)`` with the event's parameters the workflow declares
  (others are left out), idempotency key ``event.<workflow>.<launcher>.<key>``: the normal
  path (planning, cache, monitor events), one run per event and workflow.
"""

from __future__ import annotations

import ast
import logging
import operator
from collections.abc import Callable, Mapping
from typing import Any

from couler import ir
from couler.errors import UserError

__all__ = ["LAUNCHERS_ANNOTATION", "allowed_launchers", "check_triggers", "filter_matches",
           "subject_matches"]

log = logging.getLogger(__name__)

LAUNCHERS_ANNOTATION = "couler.io/launchers"
_MAX_FILTER = 4096  # characters of a filter expression


class _MissingFieldError(Exception):
    """The event has no such field: the filter is false."""


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}


def _number(value: object) -> object:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _pair(a: object, b: object) -> tuple[object, object]:
    """Numbers compared as numbers, everything else as strings."""
    na, nb = _number(a), _number(b)
    if isinstance(na, float | int) and isinstance(nb, float | int) \
            and not isinstance(na, bool) and not isinstance(nb, bool):
        return na, nb
    return (a if isinstance(a, str) else str(a)), (b if isinstance(b, str) else str(b))


def _check(node: ast.AST) -> None:
    """Refuse anything but the filter language (ValueError naming it)."""
    if isinstance(node, ast.Expression):
        _check(node.body)
    elif isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check(node.operand)
    elif isinstance(node, ast.Compare):
        if not all(type(op) in _COMPARE for op in node.ops):
            raise ValueError("only == != < <= > >= in and not in compare")
        for v in (node.left, *node.comparators):
            _check(v)
    elif isinstance(node, ast.Constant):
        if not isinstance(node.value, str | int | float | bool):
            raise ValueError(f"constant {node.value!r} is not a string, number or boolean")
    elif isinstance(node, ast.Attribute):
        if not (isinstance(node.value, ast.Name) and node.value.id == "body"):
            raise ValueError("fields are read as body.NAME or body['NAME']")
    elif isinstance(node, ast.Subscript):
        if not (isinstance(node.value, ast.Name) and node.value.id == "body"
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            raise ValueError("fields are read as body.NAME or body['NAME']")
    elif isinstance(node, ast.Tuple | ast.List):
        for v in node.elts:
            _check(v)
    else:
        raise ValueError(f"{type(node).__name__} is not part of the filter language")


def _parse(expr: str) -> ast.Expression:
    if len(expr) > _MAX_FILTER:
        raise ValueError(f"longer than {_MAX_FILTER} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"does not parse: {exc.msg}") from None
    _check(tree)
    return tree


def _eval(node: ast.AST, body: Mapping[str, str]) -> object:
    if isinstance(node, ast.Expression):
        return _eval(node.body, body)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_truth(_eval(v, body)) for v in node.values)
        return any(_truth(_eval(v, body)) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return not _truth(_eval(node.operand, body))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, body)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, body)
            if isinstance(op, ast.In | ast.NotIn) and isinstance(right, tuple | list):
                ok = (str(left) in [str(r) for r in right]) == isinstance(op, ast.In)
            else:
                a, b = _pair(left, right)
                try:
                    ok = bool(_COMPARE[type(op)](a, b))
                except TypeError:
                    ok = False
            if not ok:
                return False
            left = right
        return True
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute | ast.Subscript):
        name = node.attr if isinstance(node, ast.Attribute) else \
            str(node.slice.value)  # type: ignore[attr-defined]
        if name not in body:
            raise _MissingFieldError(name)
        return body[name]
    if isinstance(node, ast.Tuple | ast.List):
        return [_eval(v, body) for v in node.elts]
    raise ValueError(type(node).__name__)  # refused by _check before


def _truth(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no")
    return bool(value)


def filter_matches(expr: str, body: Mapping[str, str]) -> bool:
    """Whether an event with fields ``body`` passes the filter ``expr`` (see the module
    docstring); ValueError for a filter that is not one."""
    if not expr.strip():
        return True
    tree = _parse(expr.strip())
    try:
        return _truth(_eval(tree, body))
    except _MissingFieldError:
        return False


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether event ``subject`` matches the trigger's ``pattern`` (NATS wildcards: ``*``
    one token, ``>`` the rest)."""
    pat, sub = pattern.split("."), subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def allowed_launchers(wf: ir.Workflow) -> frozenset[str] | None:
    """The launchers whose events may launch ``wf`` (None: any launcher)."""
    value = dict(wf.annotations).get(LAUNCHERS_ANNOTATION)
    if value is None:
        return None
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def check_triggers(wf: ir.Workflow) -> None:
    """Refuse triggers the submitter cannot keep (UserError naming the field)."""
    for i, t in enumerate(wf.triggers):
        try:
            _parse(t.filter.strip()) if t.filter.strip() else None
        except ValueError as exc:
            raise UserError(f"workflow {wf.name!r}: field 'triggers[{i}].filter': "
                            f"{t.filter[:80]!r} {exc}") from None
