"""Hyperparameter tuning with Katib as a step: ``couler.steps.katib.run``.

Creates a Katib ``Experiment`` (``kubeflow.org/v1beta1``) and waits for it.
The open-source SDK wrote ``kubeflow.org/v1alpha3`` experiments whose trial
was a Go template (``goTemplate.rawTemplate``); v1beta1 replaced that with a
``trialSpec`` holding ``${trialParameters.NAME}`` placeholders. ``run``
accepts both:

* a trial spec (YAML text or a dict) with ``${trialParameters.NAME}`` for each
  tuning parameter ``NAME``;
* the SDK's Go template, translated: ``{{.Trial}}`` and ``{{.NameSpace}}``
  become the trial's name and namespace, and the loop
  ``{{- with .HyperParameters}}{{- range .}} ... {{.Name}}={{.Value}} ...
  {{- end}}{{- end}}`` becomes one ``--NAME=${trialParameters.NAME}`` item per
  parameter. Any other template action is refused, naming it.

Katib names and places each trial's job itself, so the trial spec has no
``metadata.name``/``namespace`` (a translated template's are dropped).
"""

from __future__ import annotations

import copy
import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import yaml

from couler.api.handles import StepOutput
from couler.api.steps import run_job
from couler.errors import UserError
from couler.steps._kubeflow import Call, count

__all__ = ["API_VERSION", "run"]

API_VERSION = "kubeflow.org/v1beta1"

_OBJECTIVE_TYPES = ("maximize", "minimize")
_PARAMETER_TYPES = ("int", "double")
_PARAMETER_NAME = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")
_PLACEHOLDER = re.compile(r"\$\{trialParameters\.([^}]*)\}")
# Trial parameters for the trial's own metadata, referenced as Katib's trialSpec keys.
_TRIAL_NAME = "trialName"
_TRIAL_NAMESPACE = "trialNamespace"
_METADATA = {_TRIAL_NAME: "${trialSpec.Name}", _TRIAL_NAMESPACE: "${trialSpec.Namespace}"}
# A container named after the trial in a Go template gets this fixed name instead.
_CONTAINER = "training"
# Success: the experiment completed (goal reached, trials used up, or the search exhausted).
_SUCCESS = "status.completionTime"


def run(  # noqa: PLR0917 - the SDK's positional signature
    raw_template: str | Mapping[str, object],
    tuning_params: Sequence[Mapping[str, object]],
    objective: Mapping[str, object],
    success_condition: str | None = None,
    failure_condition: str | None = None,
    algorithm: str = "random",
    parallel_trial_count: int = 3,
    max_trial_count: int = 12,
    max_failed_trial_count: int = 3,
    *,
    primary_container_name: str | None = None,
    timeout: int | str | None = None,
    step_name: str | None = None,
) -> list[StepOutput]:
    """Tune hyperparameters with a Katib ``Experiment`` as one step, and wait for it.

    Args:
        raw_template: The trial: a Kubernetes job (``batch/v1`` ``Job``,
            ``TFJob``, ...) as YAML text or a dict, reading each tuning
            parameter as ``${trialParameters.NAME}``; or the SDK's Go template
            (see the module docstring).
        tuning_params: The search space: ``[{"name": "lr", "type": "double",
            "range": [0.001, 0.1]}, ...]``; ``type`` is ``int`` or ``double``.
        objective: ``{"type": "maximize" | "minimize", "goal": 0.99,
            "metric_name": "accuracy"}``; ``goal`` may be left out.
        success_condition: When the step succeeds (an Argo resource condition
            on the experiment); default: once the experiment has completed.
        failure_condition: When it fails; default: once
            ``max_failed_trial_count`` trials failed, which is when Katib fails
            the experiment.
        algorithm: Katib's search algorithm (``random``, ``grid``,
            ``bayesianoptimization``, ``tpe``, ...; Katib checks the name).
        parallel_trial_count: Trials run at once; at least 1.
        max_trial_count: Trials in all; at least 1.
        max_failed_trial_count: Failed trials that fail the experiment.
        primary_container_name: The trial's training container, whose output
            Katib reads for metrics (not in the SDK); default: the trial's
            first container.
        timeout: Deadline of the step, in seconds or as ``"6h"`` (not in the SDK).
        step_name: Names the step (not in the SDK); default: the calling
            function's name, as the SDK names it, else ``katib``.

    Returns:
        ``[job-name, job-id, job-obj]`` output handles, as ``run_job`` returns.

    Raises:
        UserError: for a malformed search space, objective, count or trial
            template; the message names the argument.
    """
    call = Call("katib.run", step_name)
    params = _tuning_params(call, tuning_params)
    parallel = count(call, "parallel_trial_count", parallel_trial_count, minimum=1)
    total = count(call, "max_trial_count", max_trial_count, minimum=1)
    max_failed = count(call, "max_failed_trial_count", max_failed_trial_count, minimum=0)
    if parallel > total:
        raise call.error("parallel_trial_count", f"{parallel} exceeds max_trial_count ({total})")
    if max_failed > total:
        raise call.error("max_failed_trial_count",
                         f"{max_failed} exceeds max_trial_count ({total})")
    if not isinstance(algorithm, str) or not algorithm.strip():
        raise call.error("algorithm", f"must name a Katib algorithm, got {algorithm!r}")
    experiment = {
        "apiVersion": API_VERSION,
        "kind": "Experiment",
        "metadata": {"generateName": "katib-"},
        "spec": {
            "parallelTrialCount": parallel,
            "maxTrialCount": total,
            "maxFailedTrialCount": max_failed,
            "objective": _objective(call, objective),
            "algorithm": {"algorithmName": algorithm},
            "parameters": [p.search_space() for p in params],
            "trialTemplate": _trial_template(call, raw_template, params, primary_container_name),
        },
    }
    return run_job(experiment, success_condition or _SUCCESS,
                   failure_condition or _default_failure(max_failed), timeout=timeout,
                   step_name=step_name, caller_depth=1)


def _default_failure(max_failed: int) -> str:
    """Katib fails an experiment once its failed trials (failed, or without metrics) reach
    ``max_failed`` (at the first failure when it is 0); either count alone reaching it fails
    the step (Argo ORs failure requirements)."""
    limit = max(max_failed, 1) - 1
    return f"status.trialsFailed > {limit},status.trialMetricsUnavailable > {limit}"


# --------------------------------------------------------------------------- search space


@dataclass(frozen=True)
class _Param:
    """One tuning parameter: a name, ``int`` or ``double``, and an inclusive range."""

    name: str
    type: str
    low: int | float
    high: int | float

    def search_space(self) -> dict[str, object]:
        """The experiment's entry for it (Katib reads the bounds as strings)."""
        return {"name": self.name, "parameterType": self.type,
                "feasibleSpace": {"min": str(self.low), "max": str(self.high)}}


_PARAM_SHAPE = "{'name': 'lr', 'type': 'double', 'range': [0.001, 0.1]}"


def _tuning_params(call: Call, tuning_params: object) -> list[_Param]:
    if (isinstance(tuning_params, (str, bytes, Mapping))
            or not isinstance(tuning_params, Sequence) or not tuning_params):
        raise call.error("tuning_params", f"must be a non-empty list like [{_PARAM_SHAPE}, ...]")
    params: list[_Param] = []
    for i, entry in enumerate(tuning_params):
        field = f"tuning_params[{i}]"
        if not isinstance(entry, Mapping):
            raise call.error(field, f"must be a dict like {_PARAM_SHAPE}")
        missing = [key for key in ("name", "type", "range") if key not in entry]
        if missing:
            raise call.error(field, f"needs {', '.join(missing)}")
        name, kind, bounds = entry["name"], entry["type"], entry["range"]
        if not isinstance(name, str) or not _PARAMETER_NAME.match(name):
            raise call.error(f"{field}.name", f"{name!r} is not a parameter name: use letters, "
                                              "digits, '-', '_' and '.'")
        if name in _METADATA:
            raise call.error(f"{field}.name", f"{name!r} is reserved for the trial's metadata")
        if any(p.name == name for p in params):
            raise call.error(f"{field}.name", f"{name!r} is defined twice")
        if kind not in _PARAMETER_TYPES:
            raise call.error(f"{field}.type", f"{kind!r} is not one of "
                                              f"{', '.join(_PARAMETER_TYPES)}")
        low, high = _bounds(call, f"{field}.range", bounds, integer=kind == "int")
        params.append(_Param(name, str(kind), low, high))
    return params


def _bounds(call: Call, field: str, bounds: object, *,
            integer: bool) -> tuple[int | float, int | float]:
    if isinstance(bounds, (str, bytes)) or not isinstance(bounds, Sequence) or len(bounds) != 2:
        raise call.error(field, f"must be [min, max], got {bounds!r}")
    low, high = bounds
    allowed: tuple[type, ...] = (int,) if integer else (int, float)
    for value in (low, high):
        if isinstance(value, bool) or not isinstance(value, allowed):
            what = "integers" if integer else "numbers"
            raise call.error(field, f"the bounds must be {what}, got {value!r}")
    if low > high:
        raise call.error(field, f"min {low} exceeds max {high}")
    return low, high


def _objective(call: Call, objective: object) -> dict[str, object]:
    if not isinstance(objective, Mapping):
        raise call.error("objective", "must be a dict like {'type': 'maximize', 'goal': 0.99, "
                                      "'metric_name': 'accuracy'}")
    missing = [key for key in ("type", "metric_name") if key not in objective]
    if missing:
        raise call.error("objective", f"needs {', '.join(missing)}")
    kind, metric = objective["type"], objective["metric_name"]
    if kind not in _OBJECTIVE_TYPES:
        raise call.error("objective.type", f"{kind!r} is not one of {', '.join(_OBJECTIVE_TYPES)}")
    if not isinstance(metric, str) or not metric.strip():
        raise call.error("objective.metric_name", f"must name a metric, got {metric!r}")
    out: dict[str, object] = {"type": kind, "objectiveMetricName": metric}
    goal = objective.get("goal")
    if goal is not None:
        if isinstance(goal, bool) or not isinstance(goal, (int, float)):
            raise call.error("objective.goal", f"must be a number, got {goal!r}")
        out["goal"] = goal
    return out


# --------------------------------------------------------------------------- trial template


def _trial_template(call: Call, raw_template: object, params: Sequence[_Param],
                    primary_container_name: str | None) -> dict[str, object]:
    """``spec.trialTemplate``: the trial spec, its container and its parameters."""
    translated = isinstance(raw_template, str) and "{{" in raw_template
    if isinstance(raw_template, Mapping):
        spec: object = copy.deepcopy(dict(raw_template))
    elif isinstance(raw_template, str):
        text = _translate(call, raw_template, params) if translated else raw_template
        try:
            spec = yaml.safe_load(textwrap.dedent(text))
        except yaml.YAMLError as e:
            raise call.error("raw_template", f"is not valid YAML: {e}") from e
    else:
        raise call.error("raw_template", "must be YAML text or a dict (the trial's job), not "
                                         f"{type(raw_template).__name__}")
    if not isinstance(spec, dict) or not spec.get("apiVersion") or not spec.get("kind"):
        raise call.error("raw_template", "must be a Kubernetes object with apiVersion and kind")
    _drop_trial_identity(call, spec, translated=translated)
    containers = [c for group in _container_lists(spec) for c in group]
    if translated:
        _name_trial_containers(spec)
    names = [c.get("name") for c in containers]
    primary = primary_container_name or next((n for n in names if isinstance(n, str)), None)
    if not primary:
        raise call.error("primary_container_name", "the trial has no named container; name the "
                                                   "one that trains")
    if names and primary not in names:
        raise call.error("primary_container_name", f"the trial has no container {primary!r} "
                                                   f"(it has {names})")
    return {"primaryContainerName": primary,
            "trialParameters": _trial_parameters(call, spec, params),
            "trialSpec": spec}


def _drop_trial_identity(call: Call, spec: dict[str, object], *, translated: bool) -> None:
    meta = spec.get("metadata")
    if not isinstance(meta, dict):
        return
    for key in ("name", "namespace"):
        if key in meta:
            if not translated:
                raise call.error("raw_template", f"metadata.{key} must be left out: Katib "
                                                 "names each trial's job itself")
            del meta[key]
    if not meta:
        del spec["metadata"]


def _container_lists(node: object) -> list[list[dict[str, object]]]:
    """Every ``containers`` list of the trial (a Job has one, a TFJob one per replica group)."""
    found: list[list[dict[str, object]]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "containers" and isinstance(value, list):
                found.append([c for c in value if isinstance(c, dict)])
            else:
                found.extend(_container_lists(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_container_lists(item))
    return found


def _name_trial_containers(spec: dict[str, object]) -> None:
    """Give containers the Go template named after the trial a fixed name: Katib's
    ``primaryContainerName`` must match one literally."""
    for group in _container_lists(spec):
        for i, container in enumerate(group):
            name = container.get("name")
            if isinstance(name, str) and "${trialParameters." in name:
                container["name"] = _CONTAINER if i == 0 else f"{_CONTAINER}-{i}"


def _trial_parameters(call: Call, spec: dict[str, object],
                      params: Sequence[_Param]) -> list[dict[str, str]]:
    """One trial parameter per tuning parameter (each must be used), and per metadata used."""
    used = set(_PLACEHOLDER.findall(json.dumps(spec)))
    known = {p.name for p in params} | set(_METADATA)
    unknown = sorted(used - known)
    if unknown:
        raise call.error("raw_template", f"${{trialParameters.{unknown[0]}}} names no tuning "
                                         f"parameter (they are {sorted(p.name for p in params)})")
    unused = [p.name for p in params if p.name not in used]
    if unused:
        raise call.error("raw_template", f"tuning parameter {unused[0]!r} is not used; write "
                                         f"${{trialParameters.{unused[0]}}} where the trial "
                                         "reads it")
    out = [{"name": p.name, "reference": p.name} for p in params]
    out += [{"name": name, "reference": ref} for name, ref in _METADATA.items() if name in used]
    return out


# --------------------------------------------------------------------------- Go templates

# An action: "{{- " and " -}}" trim the white space next to it, as in Go's text/template.
_ACTION = re.compile(r"\{\{(-\s)?\s*(.*?)\s*(\s-)?\}\}", re.DOTALL)
_FIELD = re.compile(r"^\.[A-Za-z]\w*$")


@dataclass(frozen=True)
class _Field:
    name: str  # without the dot


@dataclass
class _Block:
    action: str  # "with .HyperParameters", "range ."
    body: list[_Node]


_Node: TypeAlias = str | _Field | _Block
_Root = object()  # "." at the top of the template
_Dot: TypeAlias = object


def _translate(call: Call, text: str, params: Sequence[_Param]) -> str:
    """The SDK's Go template rendered into a v1beta1 trial spec with placeholders."""
    return _render(call, _parse(call, _tokens(text)), _Root, params)


def _tokens(text: str) -> list[str | _Field | tuple[str]]:
    """Text pieces (trimmed as the actions say) and actions: a field, or ``(action,)``."""
    out: list[str | _Field | tuple[str]] = []
    pos, trim_next = 0, False
    for m in _ACTION.finditer(text):
        piece = text[pos:m.start()]
        if trim_next:
            piece = piece.lstrip()
        if m.group(1):
            piece = piece.rstrip()
        out.append(piece)
        action = m.group(2)
        out.append(_Field(action[1:]) if _FIELD.match(action) else (action,))
        pos, trim_next = m.end(), bool(m.group(3))
    tail = text[pos:]
    out.append(tail.lstrip() if trim_next else tail)
    return out


def _parse(call: Call, tokens: list[str | _Field | tuple[str]]) -> list[_Node]:
    root: list[_Node] = []
    stack: list[list[_Node]] = [root]
    for token in tokens:
        if not isinstance(token, tuple):
            stack[-1].append(token)
            continue
        action = token[0]
        keyword = action.split(maxsplit=1)[0] if action else ""
        if keyword in ("with", "range"):
            block = _Block(action, [])
            stack[-1].append(block)
            stack.append(block.body)
        elif action == "end" and len(stack) > 1:
            stack.pop()
        else:
            raise _unsupported(call, action)
    if len(stack) > 1:
        raise call.error("raw_template", "a {{with}} or {{range}} has no {{end}}")
    return root


def _render(call: Call, nodes: Sequence[_Node], dot: _Dot, params: Sequence[_Param]) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, _Field):
            out.append(_field(call, node, dot))
        else:
            keyword, _, arg = node.action.partition(" ")
            value = _value(call, node.action, arg.strip(), dot, params)
            if keyword == "with":
                out.append(_render(call, node.body, value, params))
            elif isinstance(value, list):
                out.extend(_render(call, node.body, item, params) for item in value)
            else:
                raise _unsupported(call, node.action)
    return "".join(out)


def _value(call: Call, action: str, arg: str, dot: _Dot, params: Sequence[_Param]) -> _Dot:
    """What ``arg`` of a with/range means: ``.HyperParameters`` at the top, or ``.``."""
    if arg == "." and dot is not _Root:
        return dot
    if arg == ".HyperParameters" and dot is _Root:
        return list(params)
    raise _unsupported(call, action)


def _field(call: Call, field: _Field, dot: _Dot) -> str:
    if isinstance(dot, _Param):
        if field.name == "Name":
            return f"--{dot.name}"  # the SDK named the search parameters "--NAME"
        if field.name == "Value":
            return f"${{trialParameters.{dot.name}}}"
    elif field.name == "Trial":
        return f"${{trialParameters.{_TRIAL_NAME}}}"
    elif field.name in ("NameSpace", "Namespace"):
        return f"${{trialParameters.{_TRIAL_NAMESPACE}}}"
    raise _unsupported(call, f".{field.name}")


def _unsupported(call: Call, action: str) -> UserError:
    return call.error("raw_template", f"{{{{{action}}}}} cannot be translated to Katib "
                                      "v1beta1 (translated: .Trial, .NameSpace and the "
                                      ".HyperParameters loop with .Name and .Value); write "
                                      "the trial spec with ${trialParameters.NAME} instead")
