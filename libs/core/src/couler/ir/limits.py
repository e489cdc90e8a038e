"""Size limits of a workflow: what one value and one workflow may weigh.

A workflow travels through every service, the event bus and the engines' own stores
(Kubernetes objects are at most 1 MiB in etcd; an Argo parameter, a ConfigMap entry or an
annotation lives inside such an object), so sizes are checked once, when work is accepted,
and a value over its limit is refused naming the workflow, the step, the field and the
limit -- never left to fail later as an "internal error" somewhere downstream.

:func:`check_sizes` is pure and linear in the size of the workflow. What it measures, in
UTF-8 bytes:

* per value (``SizeLimits.max_value_bytes``): every command and args item, working
  directory and image of a container or script, a script's source, a job's manifest, every
  environment value, literal input value, map item, condition literal, output selector and
  output artifact path, every workflow parameter default and allowed value, every label
  and annotation value, and every run-time parameter value given with the submission;
* per literal value (inputs, map items, condition operands, parameter defaults and allowed
  values, which are JSON): how deeply its arrays and objects nest (``max_json_depth``) --
  decoding a deeper one would exhaust the interpreter's recursion limit;
* per workflow: the number of steps (nested ones included, ``max_steps``), how deeply
  sub-workflows nest (``max_depth``), and the size of the workflow as encoded on the wire
  (``max_workflow_bytes``; the caller passes the size it received, as only it knows the
  encoding).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from couler.errors import Issue, ValidationError
from couler.ir.model import (
    Condition,
    ContainerSpec,
    JobSpec,
    Literal,
    ScriptSpec,
    Step,
    SubWorkflowSpec,
    Workflow,
)

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_ISSUES",
    "SizeLimits",
    "check_sizes",
    "json_depth",
    "size_issues",
]

KIB = 1024
MIB = 1024 * KIB
MAX_ISSUES = 20  # problems listed in one error; the rest are counted


@dataclass(frozen=True, slots=True)
class SizeLimits:
    """What one value and one workflow may weigh (see the module docstring).

    Attributes:
        max_value_bytes: The largest single value (argument, env value, script source,
            parameter value, ...), in UTF-8 bytes. 256 KiB by default: a quarter of the
            1 MiB a Kubernetes object (an Argo Workflow, a ConfigMap) may hold.
        max_workflow_bytes: The largest encoded workflow, in bytes (64 MiB by default;
            a 100,000-step workflow of small steps is about 5 MiB).
        max_steps: The most steps a workflow may have, nested ones included.
        max_depth: How deeply sub-workflows may nest inside each other.
        max_json_depth: How deeply the arrays and objects of a literal value may nest.
    """

    max_value_bytes: int = 256 * KIB
    max_workflow_bytes: int = 64 * MIB
    max_steps: int = 200_000
    max_depth: int = 16
    max_json_depth: int = 64

    def __post_init__(self) -> None:
        for name in ("max_value_bytes", "max_workflow_bytes", "max_steps", "max_depth",
                     "max_json_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SizeLimits.{name} must be a positive int (got {value!r})")


DEFAULT_LIMITS = SizeLimits()


def _size(text: str) -> int:
    # ASCII text (the common case) is as long in bytes as in characters; encode only
    # when a character could be wider, and only a value that could be over a limit.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _human(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} bytes"


def json_brackets(text: str) -> tuple[list[str], bool]:
    """The brackets of the JSON ``text`` outside its strings, in order, and whether the text
    ends inside a string. Linear, and meant for text that may not be valid JSON."""
    brackets: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[]{}":
            brackets.append(ch)
    return brackets, in_string


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of the JSON ``text`` nest (0 for a scalar);
    brackets inside strings do not count. Linear, without recursion, and meant for text
    that may not be valid JSON."""
    if text.count("[") + text.count("{") <= 1:
        return 1 if ("[" in text or "{" in text) else 0
    depth = deepest = 0
    for ch in json_brackets(text)[0]:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _condition_values(prefix: str, cond: Condition) -> Iterator[tuple[str, str, bool]]:
    for side, value in (("left", cond.left), ("right", cond.right)):
        if isinstance(value, Literal):
            yield f"{prefix}.{side}", value.json, True


def _step_values(step: Step) -> Iterator[tuple[str, str, bool]]:
    """``(field, value, is JSON)`` of every value of one step that has a size limit."""
    body = step.body
    if isinstance(body, (ContainerSpec, ScriptSpec)):
        yield "image", body.image, False
        for i, item in enumerate(body.command):
            yield f"command[{i}]", item, False
        for i, item in enumerate(body.args):
            yield f"args[{i}]", item, False
        yield "working_dir", body.working_dir, False
        if isinstance(body, ScriptSpec):
            yield "source", body.source, False
    elif isinstance(body, JobSpec):
        yield "manifest", body.manifest, True
        yield "success_condition", body.success_condition, False
        yield "failure_condition", body.failure_condition, False
    for env in step.env:
        yield f"env.{env.name}", env.value, False
    for inp in step.inputs:
        if isinstance(inp.value, Literal):
            yield f"inputs.{inp.name}", inp.value.json, True
    for out in step.outputs:
        yield f"outputs.{out.name}.selector", out.selector, False
    for out_art in step.output_artifacts:
        yield f"output_artifacts.{out_art.name}.path", out_art.path, False
    for in_art in step.input_artifacts:
        yield f"input_artifacts.{in_art.name}.path", in_art.path, False
    if step.foreach is not None:
        for i, lit in enumerate(step.foreach.items):
            yield f"foreach.items[{i}]", lit.json, True
    if step.when is not None:
        yield from _condition_values("when", step.when.condition)
    if step.loop is not None:
        yield from _condition_values("loop", step.loop.condition)
    for key, value in step.labels:
        yield f"labels.{key}", value, False


def _walk(steps: tuple[Step, ...], depth: int) -> Iterator[tuple[Step, int]]:
    """Every step with its nesting depth (1 for top level), without recursion."""
    stack: list[tuple[tuple[Step, ...], int, int]] = [(steps, depth, 0)]
    while stack:
        group, level, i = stack.pop()
        if i >= len(group):
            continue
        step = group[i]
        stack.append((group, level, i + 1))
        yield step, level
        if isinstance(step.body, SubWorkflowSpec) and step.body.steps:
            stack.append((step.body.steps, level + 1, 0))


def size_issues(wf: Workflow, limits: SizeLimits = DEFAULT_LIMITS, *,
                parameters: Mapping[str, str] | None = None,
                encoded_bytes: int | None = None) -> list[Issue]:
    """Every size problem of ``wf`` (see the module docstring); empty when it fits.

    Args:
        wf: The workflow.
        limits: The limits to check against.
        parameters: Run-time parameter values given with the submission.
        encoded_bytes: The size of the workflow as received (e.g. its protobuf
            encoding); not checked when None.
    """
    issues: list[Issue] = []
    cap = limits.max_value_bytes

    def value(step: str, field: str, text: str, is_json: bool = False) -> None:
        # len() counts characters; a UTF-8 character takes at most 4 bytes.
        if len(text) * 4 > cap and (n := _size(text)) > cap:
            issues.append(Issue(wf.name, step, field,
                                f"{n} bytes is over the limit of {_human(cap)} per value"))
        elif is_json and len(text) > 2 * limits.max_json_depth and \
                (depth := json_depth(text)) > limits.max_json_depth:
            issues.append(Issue(wf.name, step, field,
                                f"its arrays and objects nest {depth} deep, over the limit "
                                f"of {limits.max_json_depth}"))

    if encoded_bytes is not None and encoded_bytes > limits.max_workflow_bytes:
        issues.append(Issue(wf.name, "", "", f"the workflow is {encoded_bytes} bytes encoded, "
                            f"over the limit of {_human(limits.max_workflow_bytes)}"))
    for name, text in (parameters or {}).items():
        value("", f"parameters.{name}", text)
    for param in wf.parameters:
        if param.default is not None:
            value("", f"parameters.{param.name}.default", param.default.json, True)
        for i, lit in enumerate(param.enum):
            value("", f"parameters.{param.name}.enum[{i}]", lit.json, True)
    for key, text in wf.labels:
        value("", f"labels.{key}", text)
    for key, text in wf.annotations:
        value("", f"annotations.{key}", text)
    count = 0
    too_deep = False
    hooks = tuple(s for hook in wf.exit_hooks for s in hook.steps)
    for step, depth in (*_walk(wf.steps, 1), *_walk(hooks, 1)):
        count += 1
        if depth > limits.max_depth and not too_deep:
            too_deep = True
            issues.append(Issue(wf.name, step.name, "body",
                                f"sub-workflows nest {depth} deep, over the limit of "
                                f"{limits.max_depth}"))
        for field, text, is_json in _step_values(step):
            value(step.name, field, text, is_json)
    if count > limits.max_steps:
        issues.append(Issue(wf.name, "", "steps", f"{count} steps is over the limit of "
                            f"{limits.max_steps} steps per workflow"))
    return issues


def check_sizes(wf: Workflow, limits: SizeLimits = DEFAULT_LIMITS, *,
                parameters: Mapping[str, str] | None = None,
                encoded_bytes: int | None = None) -> None:
    """Raise :class:`~couler.errors.ValidationError` when ``wf`` is over a size limit.

    The error lists the first :data:`MAX_ISSUES` problems (each naming the workflow,
    step, field and limit) and counts the rest. Arguments as :func:`size_issues`.
    """
    issues = size_issues(wf, limits, parameters=parameters, encoded_bytes=encoded_bytes)
    if not issues:
        return
    if len(issues) > MAX_ISSUES:
        more = len(issues) - MAX_ISSUES
        issues = [*issues[:MAX_ISSUES],
                  Issue(wf.name, "", "", f"and {more} more value(s) over the size limits")]
    raise ValidationError(issues)
