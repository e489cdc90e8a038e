"""A generated workflow before it is IR: the spec both generator paths produce.

The spec is as expressive as the IR for what plain-English requests ask: catalog steps
or custom steps (an image with a command, or a script), data passed between steps by
kind, retries, timeouts, CPU / memory / GPU, conditions on a step's metric with an else
branch, fan-out over items or N shards with a limit on how many run at once, tuning
(:func:`couler.tune`), loops until a metric holds, a cron schedule, exit hooks, and
steps in parallel (steps with no path between them).

The offline planner builds a :class:`WorkflowSpec` directly; an LLM answers with its
JSON form (:data:`SPEC_SCHEMA`), which :func:`parse_spec` reads, naming the step and
field of every problem so the repair loop can send them back. :func:`assemble` turns a
spec into validated IR: a catalog step runs its template's reviewed script in the
template's image and reads each kind it consumes from the nearest upstream step that
produces it, so a generator chooses *what* runs and in which order — never code or
file paths.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from couler import ir
from couler.errors import Issue, ValidationError
from couler.generate.templates import Template

__all__ = ["IN", "OUT", "SPEC_SCHEMA", "ConditionSpec", "FanOut", "LoopSpec", "StepSpec",
           "TuneSpec", "WorkflowSpec", "assemble", "parse_duration", "parse_spec",
           "spec_to_json"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PARAM = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")
_OPS = tuple(op.value for op in ir.CompareOp)
_SAMPLERS = ("tpe", "random", "grid", "cmaes")
_QUANTITY = re.compile(r"^\d+(\.\d+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
#: Where a catalog step finds the kinds it consumes and leaves the kinds it produces.
IN = "/tmp/couler/in"
OUT = "/tmp/couler/out"
_METRIC_FILE = f"{OUT}/metric"
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")

_STEP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "description": "lowercase DNS-1123, unique"},
        "task": {"type": "string", "description": "the sub-task of the request it does"},
        "template": {"type": "string", "description": "a catalog template; omit for a "
                     "custom step (then give image and command or script)"},
        "params": {"type": "object", "additionalProperties": {"type": "string"},
                   "description": "the template's parameters"},
        "image": {"type": "string"},
        "command": {"type": "array", "items": {"type": "string"}},
        "args": {"type": "array", "items": {"type": "string"}},
        "script": {"type": "string", "description": "Python source of a custom step"},
        "after": {"type": "array", "items": {"type": "string"},
                  "description": "steps that must succeed first"},
        "inputs": {"type": "object", "additionalProperties": {"type": "string"},
                   "description": "kind -> the step producing it (default: the nearest "
                   "upstream producer)"},
        "retries": {"type": "integer", "minimum": 0},
        "timeout": {"type": ["string", "integer"], "description": "seconds or 45m / 3h"},
        "cpu": {"type": "string"},
        "memory": {"type": "string", "description": "e.g. 48Gi"},
        "gpu": {"type": "integer", "minimum": 0},
        "when": {
            "type": "object", "required": ["step", "metric", "op", "value"],
            "properties": {"step": {"type": "string"}, "metric": {"type": "string"},
                           "op": {"enum": list(_OPS)}, "value": {"type": ["number", "string"]},
                           "otherwise": {"type": "boolean",
                                         "description": "the else branch: run when the "
                                         "comparison does not hold"}}},
        "foreach": {
            "type": "object",
            "properties": {"items": {"type": "array", "items": {"type": "string"}},
                           "shards": {"type": "integer", "minimum": 1},
                           "max_parallel": {"type": "integer", "minimum": 1}}},
        "tune": {
            "type": "object", "required": ["trials"],
            "properties": {"trials": {"type": "integer", "minimum": 1},
                           "parallel": {"type": "integer", "minimum": 1},
                           "sampler": {"enum": list(_SAMPLERS)},
                           "objective": {"type": "string"},
                           "direction": {"enum": ["maximize", "minimize"]},
                           "space": {"type": "object", "additionalProperties": {
                               "type": "array", "minItems": 2}}}},
        "loop": {
            "type": "object", "required": ["max_iterations"],
            "properties": {"max_iterations": {"type": "integer", "minimum": 1},
                           "metric": {"type": "string"},
                           "until": {"type": "object", "properties": {
                               "op": {"enum": list(_OPS)}, "value": {"type": "number"}}}}},
    },
}

#: The JSON shape asked of an LLM (and printed by ``couler generate --spec``).
SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "steps"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "schedule": {"type": "string", "description": "cron: minute hour day month weekday"},
        "timezone": {"type": "string"},
        "timeout": {"type": ["string", "integer"]},
        "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
        "steps": {"type": "array", "minItems": 1, "items": _STEP_SCHEMA},
        "on_failure": {"type": "array", "items": _STEP_SCHEMA},
        "on_success": {"type": "array", "items": _STEP_SCHEMA},
        "on_exit": {"type": "array", "items": _STEP_SCHEMA},
    },
}


@dataclass(frozen=True, slots=True)
class ConditionSpec:
    """Run a step only when ``step``'s ``metric`` compares with ``value`` (or, with
    ``otherwise``, only when it does not: the else branch). ``value`` is a number or
    ``STEP.METRIC`` of another step."""

    step: str
    metric: str
    op: str
    value: str
    otherwise: bool = False


@dataclass(frozen=True, slots=True)
class FanOut:
    """Copies of a step, one per item (``shards`` N: items ``0`` … ``N-1``)."""

    items: tuple[str, ...]
    max_parallel: int = 0  # 0: no limit


@dataclass(frozen=True, slots=True)
class TuneSpec:
    """Tune a step's parameters with an optuna study; the step reports ``objective``."""

    trials: int
    space: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # param -> range
    sampler: str = "tpe"
    parallel: int = 0  # 0: min(4, trials)
    objective: str = ""  # "" = the template's metric
    direction: str = "maximize"


@dataclass(frozen=True, slots=True)
class LoopSpec:
    """Run a step again until its ``metric`` ``op`` ``value`` holds, at most N times."""

    max_iterations: int
    metric: str = ""
    op: str = ">="
    value: str = ""


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One step: a catalog template with parameters, or a custom image / script."""

    name: str
    template: str = ""
    params: Mapping[str, str] = field(default_factory=dict)
    task: str = ""
    image: str = ""
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    script: str = ""
    after: tuple[str, ...] = ()
    inputs: Mapping[str, str] = field(default_factory=dict)
    retries: int = 0
    timeout_seconds: int = 0
    cpu: str = ""
    memory: str = ""
    gpu: int = 0
    when: ConditionSpec | None = None
    foreach: FanOut | None = None
    tune: TuneSpec | None = None
    loop: LoopSpec | None = None


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    """A whole generated workflow."""

    name: str
    steps: tuple[StepSpec, ...]
    schedule: str = ""
    timezone: str = ""
    timeout_seconds: int = 0
    parameters: Mapping[str, str] = field(default_factory=dict)  # name -> default
    on_failure: tuple[StepSpec, ...] = ()
    on_success: tuple[StepSpec, ...] = ()
    on_exit: tuple[StepSpec, ...] = ()
    request: str = ""


# --------------------------------------------------------------------------- JSON


def parse_duration(value: object) -> int | None:
    """Seconds of ``value``: an integer, "90", "45m", "3h", "1h30m"; None if unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip().lower().replace(" ", "")
    if text.isdigit():
        return int(text) or None
    match = _DURATION.match(text)
    if match is None or not any(match.groups()):
        return None
    h, m, s = (int(g or 0) for g in match.groups())
    return h * 3600 + m * 60 + s or None


def parse_spec(text: str, workflow: str = "generated") -> WorkflowSpec:
    """Parse a JSON answer (a fenced code block is accepted) into a spec.

    Raises ValidationError listing every problem, each naming the workflow, step and
    field — what the repair loop sends back to the model.
    """
    body = text.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", body, re.DOTALL)
    if fenced is not None:
        body = fenced.group(1).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValidationError([Issue(workflow, "", "json", f"not valid JSON: {exc}")]) from exc
    if not isinstance(data, dict):
        raise ValidationError([Issue(workflow, "", "json", "expected a JSON object")])
    issues: list[Issue] = []
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        issues.append(Issue(workflow, "", "name", f"{name!r} is not a lowercase DNS-1123 name"))
        name = workflow
    for key in sorted(set(data) - set(SPEC_SCHEMA["properties"])):
        issues.append(Issue(name, "", key, "unknown field"))
    schedule = data.get("schedule", "")
    if not isinstance(schedule, str) or (schedule and len(schedule.split()) != 5):
        issues.append(Issue(name, "", "schedule",
                            f"{schedule!r} is not a 5-field cron expression"))
        schedule = ""
    timezone = data.get("timezone", "")
    if not isinstance(timezone, str):
        issues.append(Issue(name, "", "timezone", "must be a string"))
        timezone = ""
    timeout = 0
    if data.get("timeout") not in (None, "", 0):
        timeout = parse_duration(data["timeout"]) or 0
        if not timeout:
            issues.append(Issue(name, "", "timeout", f"{data['timeout']!r} is not a duration "
                                "(seconds, or e.g. 45m, 3h)"))
    parameters = data.get("parameters", {})
    if not isinstance(parameters, dict) or not all(
            isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in parameters.items()):
        issues.append(Issue(name, "", "parameters", "must map names to values"))
        parameters = {}
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        issues.append(Issue(name, "", "steps", "must be a non-empty list"))
        raise ValidationError(issues)
    groups: dict[str, tuple[StepSpec, ...]] = {}
    for key in ("steps", "on_failure", "on_success", "on_exit"):
        raw = data.get(key, [])
        if not isinstance(raw, list):
            issues.append(Issue(name, "", key, "must be a list of steps"))
            raw = []
        groups[key] = tuple(s for s in (_parse_step(r, i, name, key, issues)
                                         for i, r in enumerate(raw)) if s is not None)
    if issues:
        raise ValidationError(issues)
    return WorkflowSpec(name, groups["steps"], schedule, timezone, timeout,
                        {k: str(v) for k, v in parameters.items()},
                        groups["on_failure"], groups["on_success"], groups["on_exit"])


def _strings(raw: object) -> tuple[str, ...] | None:
    if not isinstance(raw, list) or not all(isinstance(a, (str, int, float)) for a in raw):
        return None
    return tuple(str(a) for a in raw)


def _parse_step(raw: object, i: int, wf: str, group: str,
                issues: list[Issue]) -> StepSpec | None:
    if not isinstance(raw, dict):
        issues.append(Issue(wf, f"{group}[{i}]", "", "each step must be an object"))
        return None
    where = raw.get("name")
    step = where if isinstance(where, str) and where else f"{group}[{i}]"

    def bad(fld: str, why: str) -> None:
        issues.append(Issue(wf, step, fld, why))

    for key in sorted(set(raw) - set(_STEP_SCHEMA["properties"])):
        bad(key, "unknown field")
    texts: dict[str, str] = {}
    for key in ("template", "task", "image", "script", "cpu", "memory"):
        value = raw.get(key, "")
        if not isinstance(value, str):
            bad(key, "must be a string")
            value = ""
        texts[key] = value
    maps: dict[str, dict[str, str]] = {}
    for key in ("params", "inputs"):
        value = raw.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, (str, int, float))
                                                  for v in value.values()):
            bad(key, "must map names to values")
            value = {}
        maps[key] = {str(k): str(v) for k, v in value.items()}
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("command", "args", "after"):
        value = _strings(raw.get(key, []))
        if value is None:
            bad(key, "must be a list of strings")
            value = ()
        lists[key] = value
    ints: dict[str, int] = {}
    for key in ("retries", "gpu"):
        value = raw.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            bad(key, "must be a non-negative integer")
            value = 0
        ints[key] = value
    timeout = 0
    if raw.get("timeout") not in (None, "", 0):
        timeout = parse_duration(raw["timeout"]) or 0
        if not timeout:
            bad("timeout", f"{raw['timeout']!r} is not a duration (seconds, or e.g. 45m, 3h)")
    when = _parse_when(raw.get("when"), bad)
    foreach = _parse_foreach(raw.get("foreach"), bad)
    tune = _parse_tune(raw.get("tune"), bad)
    loop = _parse_loop(raw.get("loop"), bad)
    return StepSpec(step, texts["template"], maps["params"], texts["task"], texts["image"],
                    lists["command"], lists["args"], texts["script"], lists["after"],
                    maps["inputs"], ints["retries"], timeout, texts["cpu"], texts["memory"],
                    ints["gpu"], when, foreach, tune, loop)


def _parse_when(raw: object, bad: Any) -> ConditionSpec | None:
    if raw is None:
        return None
    if (not isinstance(raw, dict) or not isinstance(raw.get("step"), str)
            or not isinstance(raw.get("metric"), str) or raw.get("op") not in _OPS
            or isinstance(raw.get("value"), bool)
            or not isinstance(raw.get("value"), (int, float, str))):
        bad("when", f"needs step, metric, op (one of {' '.join(_OPS)}) and value (a number "
            "or STEP.METRIC)")
        return None
    return ConditionSpec(raw["step"], raw["metric"], raw["op"], str(raw["value"]),
                         bool(raw.get("otherwise", False)))


def _parse_foreach(raw: object, bad: Any) -> FanOut | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        bad("foreach", "must be an object with items or shards")
        return None
    items = _strings(raw.get("items", []))
    shards = raw.get("shards", 0)
    limit = raw.get("max_parallel", 0)
    if (items is None or isinstance(shards, bool) or not isinstance(shards, int)
            or isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
            or bool(items) == bool(shards) or shards < 0):
        bad("foreach", "needs either items (a non-empty list) or shards (a positive "
            "integer), and optionally max_parallel (a positive integer)")
        return None
    return FanOut(items or tuple(str(i) for i in range(shards)), limit)


def _parse_tune(raw: object, bad: Any) -> TuneSpec | None:
    if raw is None:
        return None
    ok = isinstance(raw, dict)
    trials = raw.get("trials") if isinstance(raw, dict) else None
    parallel = raw.get("parallel", 0) if isinstance(raw, dict) else 0
    space = raw.get("space", {}) if isinstance(raw, dict) else {}
    if (not ok or isinstance(trials, bool) or not isinstance(trials, int) or trials < 1
            or isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 0
            or not isinstance(space, dict)
            or not all(_strings(v) is not None and len(v) >= 2 for v in space.values())
            or (isinstance(raw, dict) and raw.get("sampler", "tpe") not in _SAMPLERS)
            or (isinstance(raw, dict)
                and raw.get("direction", "maximize") not in ("maximize", "minimize"))):
        bad("tune", "needs trials (a positive integer), optionally parallel, sampler "
            f"({', '.join(_SAMPLERS)}), objective, direction and space "
            "(param -> [low, high] or a list of choices)")
        return None
    assert isinstance(raw, dict) and isinstance(trials, int)
    return TuneSpec(trials, {str(k): _strings(v) or () for k, v in space.items()},
                    str(raw.get("sampler", "tpe")), parallel, str(raw.get("objective", "")),
                    str(raw.get("direction", "maximize")))


def _parse_loop(raw: object, bad: Any) -> LoopSpec | None:
    if raw is None:
        return None
    until = raw.get("until", {}) if isinstance(raw, dict) else None
    limit = raw.get("max_iterations") if isinstance(raw, dict) else None
    if (not isinstance(raw, dict) or isinstance(limit, bool) or not isinstance(limit, int)
            or limit < 1 or not isinstance(until, dict)
            or until.get("op", ">=") not in _OPS):
        bad("loop", "needs max_iterations (a positive integer), optionally metric and "
            "until {op, value}")
        return None
    assert isinstance(until, dict)
    return LoopSpec(limit, str(raw.get("metric", "")), str(until.get("op", ">=")),
                    str(until.get("value", "")))


def spec_to_json(spec: WorkflowSpec) -> dict[str, Any]:
    """The JSON form of ``spec`` (what :func:`parse_spec` reads): few-shot examples."""

    def step(s: StepSpec) -> dict[str, Any]:
        out: dict[str, Any] = {"name": s.name}
        for key in ("template", "task", "image", "script", "cpu", "memory"):
            if getattr(s, key):
                out[key] = getattr(s, key)
        for key in ("params", "inputs"):
            if getattr(s, key):
                out[key] = dict(getattr(s, key))
        for key in ("command", "args", "after"):
            if getattr(s, key):
                out[key] = list(getattr(s, key))
        if s.retries:
            out["retries"] = s.retries
        if s.gpu:
            out["gpu"] = s.gpu
        if s.timeout_seconds:
            out["timeout"] = s.timeout_seconds
        if s.when is not None:
            out["when"] = {"step": s.when.step, "metric": s.when.metric, "op": s.when.op,
                           "value": _number_or_text(s.when.value)}
            if s.when.otherwise:
                out["when"]["otherwise"] = True
        if s.foreach is not None:
            out["foreach"] = {"items": list(s.foreach.items)}
            if s.foreach.max_parallel:
                out["foreach"]["max_parallel"] = s.foreach.max_parallel
        if s.tune is not None:
            out["tune"] = {"trials": s.tune.trials, "sampler": s.tune.sampler,
                           "direction": s.tune.direction}
            if s.tune.parallel:
                out["tune"]["parallel"] = s.tune.parallel
            if s.tune.objective:
                out["tune"]["objective"] = s.tune.objective
            if s.tune.space:
                out["tune"]["space"] = {k: list(v) for k, v in s.tune.space.items()}
        if s.loop is not None:
            out["loop"] = {"max_iterations": s.loop.max_iterations}
            if s.loop.metric:
                out["loop"]["metric"] = s.loop.metric
                out["loop"]["until"] = {"op": s.loop.op,
                                        "value": _number_or_text(s.loop.value)}
        return out

    data: dict[str, Any] = {"name": spec.name, "steps": [step(s) for s in spec.steps]}
    if spec.schedule:
        data["schedule"] = spec.schedule
    if spec.timezone:
        data["timezone"] = spec.timezone
    if spec.timeout_seconds:
        data["timeout"] = spec.timeout_seconds
    if spec.parameters:
        data["parameters"] = dict(spec.parameters)
    for key in ("on_failure", "on_success", "on_exit"):
        if getattr(spec, key):
            data[key] = [step(s) for s in getattr(spec, key)]
    return data


def _number_or_text(value: str) -> float | int | str:
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() and "." not in value else number


# --------------------------------------------------------------------------- IR


def assemble(spec: WorkflowSpec, templates: Mapping[str, Template]) -> ir.Workflow:
    """The validated IR of ``spec``; raises ValidationError naming the step and field."""
    wf = spec.name
    issues: list[Issue] = []
    main = list(spec.steps)
    hooks = [*spec.on_failure, *spec.on_success, *spec.on_exit]
    names = [s.name for s in (*main, *hooks)]
    by_name = {s.name: s for s in main}
    for s in (*main, *hooks):
        _check_step(wf, s, names, by_name, templates=templates, issues=issues)
    for p in spec.parameters:
        if not _PARAM.match(p):
            issues.append(Issue(wf, "", f"parameters.{p}", "not a valid parameter name"))
    if issues:
        raise ValidationError(issues)
    steps = tuple(_build(wf, s, by_name, templates, issues) for s in main)
    exit_hooks = []
    for status, group in ((ir.RunStatus.FAILED, spec.on_failure),
                          (ir.RunStatus.SUCCEEDED, spec.on_success),
                          (ir.RunStatus.ANY, spec.on_exit)):
        if group:
            local = {s.name: s for s in group}
            exit_hooks.append(ir.ExitHook(status, tuple(
                _build(wf, s, local, templates, issues) for s in group)))
    if issues:
        raise ValidationError(issues)
    defaults = ir.StepDefaults(timeout_seconds=spec.timeout_seconds or None)
    out = ir.Workflow(
        name=wf, steps=steps,
        parameters=tuple(ir.Parameter(k, default=ir.Literal.of(v) if v else None,
                                      description=_PARAM_HELP)
                         for k, v in sorted(spec.parameters.items())),
        exit_hooks=tuple(exit_hooks),
        schedule=ir.CronSchedule(spec.schedule, timezone=spec.timezone)
        if spec.schedule else None,
        defaults=defaults,
        annotations=(("couler.io/request", spec.request[:256]),) if spec.request else ())
    ir.validate(out)
    return out


_PARAM_REF = re.compile(r"\{\{\s*parameters\.([A-Za-z0-9_-]+)\s*\}\}")
_PARAM_HELP = "set with -p NAME=VALUE (a path, URI or name the request did not give)"


def _check_step(wf: str, s: StepSpec, names: Sequence[str], by_name: Mapping[str, StepSpec], *,
                templates: Mapping[str, Template], issues: list[Issue]) -> None:
    def bad(fld: str, why: str) -> None:
        issues.append(Issue(wf, s.name, fld, why))

    if not _NAME.match(s.name):
        bad("name", "not a lowercase DNS-1123 name (a-z, 0-9, '-'; at most 63)")
    if names.count(s.name) > 1:
        bad("name", "used twice")
    for a in s.after:
        if a not in by_name:
            bad("after", f"unknown step {a!r}")
    if s.template:
        t = templates.get(s.template)
        if t is None:
            close = difflib.get_close_matches(s.template, list(templates), n=3, cutoff=0.5)
            bad("template", f"{s.template!r} is not in the catalog" + (
                f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""))
            return
        known = {p.name for p in t.params}
        for unknown in sorted(set(s.params) - known):
            bad(f"params.{unknown}", f"not a parameter of {t.name!r} "
                f"({', '.join(sorted(known)) or 'none'})")
        for tp in t.params:
            if tp.default is None and not s.params.get(tp.name):
                bad(f"params.{tp.name}",
                    f"{t.name!r} needs it ({tp.description or 'no default'})")
        for kind, producer in s.inputs.items():
            if kind not in t.consumes:
                bad(f"inputs.{kind}", f"{t.name!r} does not consume {kind!r} "
                    f"(it consumes {', '.join(t.consumes) or 'nothing'})")
            elif producer not in by_name:
                bad(f"inputs.{kind}", f"unknown step {producer!r}")
    elif not s.image:
        bad("template", "give a catalog template, or an image with a command or script")
    elif not (s.command or s.script):
        bad("command", f"the custom step in image {s.image!r} needs a command or a script")
    for fld in ("cpu", "memory"):
        value = getattr(s, fld)
        if value and not _QUANTITY.match(value):
            bad(fld, f"{value!r} is not a quantity (e.g. 2, 500m, 48Gi)")
    if s.when is not None:
        if s.when.step not in by_name:
            bad("when.step", f"unknown step {s.when.step!r}")
        elif not _reports(by_name[s.when.step], s.when.metric, templates):
            bad("when.metric", f"step {s.when.step!r} does not report {s.when.metric!r}")
        if s.when.step == s.name:
            bad("when.step", "a step cannot depend on its own metric (use loop)")
    if s.tune is not None and s.foreach is not None:
        bad("tune", "a step either fans out or tunes, not both")
    if s.loop is not None and s.loop.metric and not _reports(s, s.loop.metric, templates):
        bad("loop.metric", f"the step does not report {s.loop.metric!r}")


def _reports(s: StepSpec, metric: str, templates: Mapping[str, Template]) -> bool:
    t = templates.get(s.template)
    return t is not None and bool(t.metric) and metric == t.metric


#: A kind a step may read in place of another: tables are tables.
COMPATIBLE = {"predictions": ("data",), "data": ("predictions",)}


def _producers(step: StepSpec, kind: str, by_name: Mapping[str, StepSpec],
               templates: Mapping[str, Template]) -> list[tuple[str, str]]:
    """(step, kind) pairs ``step`` reads ``kind`` from: every producer in the nearest layer
    upstream that has one (several when parallel branches produce it, e.g. one report per
    model to rank), else the nearest producers of a compatible kind."""
    for wanted in (kind, *COMPATIBLE.get(kind, ())):
        seen: set[str] = set()
        frontier = list(dict.fromkeys(step.after))
        while frontier:
            layer = [by_name[n] for n in frontier if n in by_name and n not in seen]
            seen.update(u.name for u in layer)
            found = [(u.name, wanted) for u in layer
                     if u.template in templates and wanted in templates[u.template].produces]
            if found:
                return found
            frontier = list(dict.fromkeys(a for u in layer for a in u.after))
    return []


def _literal(value: str) -> ir.Literal:
    try:
        number = float(value)
    except ValueError:
        return ir.Literal.of(value)
    return ir.Literal.of(int(number) if number.is_integer() and "." not in value else number)


def _ref(value: str, by_name: Mapping[str, StepSpec]) -> ir.ValueSource:
    if value.startswith("parameters."):
        return ir.WorkflowParamRef(value[len("parameters."):])
    step, dot, metric = value.partition(".")
    if dot and step in by_name:
        return ir.StepOutputRef(step, metric)
    return _literal(value)


def _tune_key(name: str) -> str:
    """A tuned parameter's name in the study and in its trial's item: an identifier
    ("n-estimators" → "n_estimators"), as KFP's loop sub-variables must be; the step's
    argument keeps the template's spelling."""
    return re.sub(r"\W", "_", name)


_ITEM_TEXT = re.compile(r"\{\{\s*item(?:\.[\w-]+)?\s*\}\}")


def _build(wf: str, s: StepSpec, by_name: Mapping[str, StepSpec],
           templates: Mapping[str, Template], issues: list[Issue]) -> ir.Step:
    deps = list(dict.fromkeys(s.after))
    # TASK describes the step (the request's words); a literal, so every engine can set it
    # (KFP sets environment variables to literal values only): a catalog step reads its
    # item from its arguments, a custom step from ITEM
    env = [ir.EnvVar("TASK", _ITEM_TEXT.sub("each item", s.task))] if s.task else []
    inputs: list[ir.InputParameter] = []
    outputs: list[ir.OutputParameter] = []
    input_artifacts: list[ir.InputArtifact] = []
    output_artifacts: list[ir.OutputArtifact] = []
    if s.foreach is not None and not s.template:
        env.append(ir.EnvVar("ITEM", "{{item}}"))
    if s.template:
        t = templates[s.template]
        args: list[str] = []
        values = {p.name: p.default for p in t.params}
        values.update(s.params)
        if s.tune is not None:
            values.update({k: f"{{{{item.{_tune_key(k)}}}}}" for k in s.tune.space})
        for p in t.params:
            value = values.get(p.name)
            if value:
                ref = _PARAM_REF.fullmatch(value)
                if ref is not None:
                    # a workflow parameter: the step reads it as an input
                    inputs.append(ir.InputParameter(p.name, ir.WorkflowParamRef(ref.group(1))))
                    value = f"{{{{inputs.{p.name}}}}}"
                args += [f"--{p.name}", value]
        for kind in t.consumes:
            producers = ([(s.inputs[kind], kind)] if kind in s.inputs
                         else _producers(s, kind, by_name, templates))
            if not producers and kind in t.optional:
                continue
            if not producers:
                issues.append(Issue(wf, s.name, f"inputs.{kind}",
                                    f"{t.name!r} consumes {kind!r} but no step before it "
                                    "produces it: add a step that loads or makes it"))
                continue
            path = f"{IN}/{kind}"
            for producer, produced in producers:
                input_artifacts.append(ir.InputArtifact(
                    kind if len(producers) == 1 else f"{kind}-{producer}",
                    path if len(producers) == 1 else f"{path}/{producer}",
                    ir.StepArtifactRef(producer, produced)))
                if producer not in deps:
                    deps.append(producer)
            args += [f"--in-{kind}", path]
        for kind in t.produces:
            path = f"{OUT}/{kind}"
            output_artifacts.append(ir.OutputArtifact(kind, path))
            args += [f"--out-{kind}", path]
        if t.metric:
            args += ["--metric-file", _METRIC_FILE]
            outputs.append(ir.OutputParameter(t.metric, ir.OutputSource.PATH, _METRIC_FILE,
                                              type=ir.ValueType.FLOAT))
        body: ir.StepBody = ir.ScriptSpec(image=t.image, source=t.source, args=tuple(args))
        labels: tuple[tuple[str, str], ...] = (("couler.io/catalog", t.name),)
    elif s.script:
        body = ir.ScriptSpec(image=s.image, source=s.script, args=s.args)
        labels = ()
    else:
        body = ir.ContainerSpec(image=s.image, command=s.command, args=s.args)
        labels = ()
    when = None
    if s.when is not None:
        if s.when.step not in deps:
            deps.append(s.when.step)
        when = ir.When(ir.Condition(ir.StepOutputRef(s.when.step, s.when.metric),
                                    ir.CompareOp(s.when.op), _ref(s.when.value, by_name)),
                       expect=not s.when.otherwise)
    foreach = None
    if s.foreach is not None:
        foreach = ir.ForEach(items=tuple(ir.Literal.of(i) for i in s.foreach.items),
                             parallelism=s.foreach.max_parallel or None)
    loop = None
    if s.loop is not None:
        metric = s.loop.metric or (templates[s.template].metric if s.template else "")
        if metric and s.loop.value:
            # repeat while the goal is not reached
            loop = ir.Loop(ir.Condition(ir.StepOutputRef(s.name, metric),
                                        ir.CompareOp(s.loop.op).negated(),
                                        _literal(s.loop.value)), s.loop.max_iterations)
        elif s.loop.value:
            issues.append(Issue(wf, s.name, "loop.metric", "a value to reach needs a metric "
                                "the step reports"))
        else:
            # "repeat 5 times": no goal, the iteration limit ends the loop
            loop = ir.Loop(ir.Condition(_literal("again"), ir.CompareOp.EQ, _literal("again")),
                           s.loop.max_iterations)
    tune = None
    if s.tune is not None:
        tune = _tune(wf, s, templates, issues)
        env = [e for e in env if e.name != "ITEM"]
    resources = None
    if s.cpu or s.memory or s.gpu:
        resources = ir.Resources(cpu_request=s.cpu, memory_request=s.memory,
                                 memory_limit=s.memory, gpu=s.gpu)
    return ir.Step(
        name=s.name, body=body, template=s.template or s.name, outputs=tuple(outputs),
        inputs=tuple(inputs),
        input_artifacts=tuple(input_artifacts), output_artifacts=tuple(output_artifacts),
        env=tuple(env), dependencies=tuple(ir.Dependency(d) for d in deps), when=when,
        foreach=foreach, loop=loop,
        retry=ir.RetryPolicy(s.retries) if s.retries else None,
        timeout_seconds=s.timeout_seconds or None, resources=resources, labels=labels,
        tune=tune)


def _tune(wf: str, s: StepSpec, templates: Mapping[str, Template],
          issues: list[Issue]) -> ir.Tune | None:
    assert s.tune is not None
    t = templates.get(s.template)
    objective = s.tune.objective or (t.metric if t is not None else "")
    if not objective:
        issues.append(Issue(wf, s.name, "tune.objective",
                            "the tuned step must report a metric to optimize"))
        return None
    space = []
    for pname, rng in s.tune.space.items():
        try:
            if len(rng) == 2 and all(_is_number(v) for v in rng):
                low, high = float(rng[0]), float(rng[1])
                kind = (ir.TuneKind.INT if all(v.lstrip("-").isdigit() for v in rng)
                        else ir.TuneKind.LOGUNIFORM if low > 0 and high / low >= 100
                        else ir.TuneKind.UNIFORM)
                space.append(ir.TuneParam(_tune_key(pname), kind, low, high))
            else:
                space.append(ir.TuneParam(_tune_key(pname), ir.TuneKind.CHOICE,
                                          choices=tuple(_literal(v) for v in rng)))
        except ValueError as exc:
            issues.append(Issue(wf, s.name, f"tune.space.{pname}", str(exc)))
    if not space:
        issues.append(Issue(wf, s.name, "tune.space", "name at least one parameter to tune"))
        return None
    return ir.Tune(space=tuple(space), objective=objective, trials=s.tune.trials,
                   parallel=s.tune.parallel or min(4, s.tune.trials),
                   direction=ir.TuneDirection(s.tune.direction),
                   sampler=ir.TuneSampler(s.tune.sampler), seed=0)


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True
