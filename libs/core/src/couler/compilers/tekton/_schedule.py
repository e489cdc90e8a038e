"""Cron schedules and event triggers for Tekton: a Kubernetes CronJob and Tekton Triggers objects.

Tekton Pipelines has neither, so a scheduled or triggered workflow compiles to its
``Pipeline`` plus objects that create its ``PipelineRun``:

* **Cron** (:func:`cron_documents`): a ``ConfigMap`` ``WORKFLOW-pipelinerun`` holding the
  PipelineRun manifest (``generateName``, so every tick is a new run, labelled
  ``couler.io/scheduled-by: WORKFLOW``) and a ``batch/v1`` ``CronJob`` ``WORKFLOW`` with
  the schedule's fields whose Job runs ``kubectl`` (:data:`LAUNCHER_IMAGE`) under the
  service account :data:`LAUNCHER_ACCOUNT`. A CronJob's concurrency policy applies to its
  Jobs, which end as soon as the run is created, so the Job applies the policy to the
  PipelineRuns itself: ``forbid`` creates nothing while a run it started has no
  ``completionTime``; ``replace`` cancels those runs (``spec.status: Cancelled``) first.
  The Job has ``backoffLimit: 0``: a retried Job could create a second run for one tick.
* **Event triggers** (:func:`trigger_documents`): a ``TriggerBinding`` and a
  ``TriggerTemplate`` ``WORKFLOW`` (``triggers.tekton.dev/v1beta1``) -- the template's
  resource is the PipelineRun, its string parameters bound from the event -- and an
  ``EventListener`` ``WORKFLOW`` (service ``el-WORKFLOW``, port 8080) with one trigger per
  ``ir.EventTrigger`` whose CEL interceptor tests the subject (header ``Couler-Subject``,
  NATS wildcards as a regular expression), the launchers the ``couler.io/launchers``
  annotation allows (header ``Couler-Launcher``) and the filter (:func:`cel_filter`).
  An event on Couler's bus (``couler.event.LAUNCHER.SUBJECT``) reaches the listener as an
  HTTP POST to ``el-WORKFLOW:8080`` whose body is the event's fields (a JSON object of
  strings) and whose headers are ``Couler-Subject: SUBJECT`` and ``Couler-Launcher:
  LAUNCHER``; nothing in Couler forwards bus events to it yet. The listener and the
  CronJob's Job run as :data:`LAUNCHER_ACCOUNT`, which must exist with rights to create
  (and, for the Job, list and patch) PipelineRuns, and for the listener Tekton Triggers'
  EventListener roles.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from typing import Any

from couler import ir
from couler.compilers import emit
from couler.compilers.kube import cron_policy
from couler.compilers.tekton._job import JOB_IMAGE
from couler.engines.base import Feature
from couler.errors import UnsupportedFeatureError

__all__ = [
    "LAUNCHERS_ANNOTATION",
    "LAUNCHER_ACCOUNT",
    "LAUNCHER_HEADER",
    "LAUNCHER_IMAGE",
    "SCHEDULED_BY",
    "SUBJECT_HEADER",
    "TRIGGERS_API",
    "cel_filter",
    "cron_documents",
    "trigger_documents",
]

Doc = dict[str, Any]

LAUNCHER_ACCOUNT = "couler-tekton-launcher"  # creates PipelineRuns (CronJob, EventListener)
LAUNCHER_IMAGE = JOB_IMAGE
SCHEDULED_BY = "couler.io/scheduled-by"  # label of the runs a CronJob creates
LAUNCHERS_ANNOTATION = "couler.io/launchers"  # the launchers whose events may launch
SUBJECT_HEADER = "Couler-Subject"
LAUNCHER_HEADER = "Couler-Launcher"
TRIGGERS_API = "triggers.tekton.dev/v1beta1"
_MOUNT = "/etc/couler"
_MANIFEST = "pipelinerun.yaml"
_FALSY = '["", "0", "false", "no"]'  # the submitter's false strings
_CEL_OPS: dict[type[ast.cmpop], str] = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
}


def _fail(wf: ir.Workflow, feature: Feature, detail: str) -> UnsupportedFeatureError:
    return UnsupportedFeatureError("tekton", wf.name, "", feature.value, detail)


# --------------------------------------------------------------------------- cron


def _launch_script(name: str, policy: ir.ConcurrencyPolicy) -> str:
    """The Job's /bin/sh script: apply the concurrency policy, then create the run."""
    create = f"kubectl create -f {_MOUNT}/{_MANIFEST}"
    if policy is ir.ConcurrencyPolicy.ALLOW:
        return create
    running = (f"kubectl get pipelineruns -l {shlex.quote(f'{SCHEDULED_BY}={name}')} -o "
               "jsonpath='{range .items[*]}{.metadata.name} {.status.completionTime}"
               "{\"\\n\"}{end}' | awk 'NF == 1 {print $1}'")
    lines = ["set -eu", f"running=$({running})"]
    if policy is ir.ConcurrencyPolicy.FORBID:
        lines += ['if [ -n "$running" ]; then',
                  '  echo "a run is still going ($running): this tick is skipped"; exit 0',
                  "fi"]
    else:
        lines += ["for run in $running; do",
                  "  kubectl patch pipelinerun \"$run\" --type merge "
                  "-p '{\"spec\":{\"status\":\"Cancelled\"}}'",
                  "done"]
    return "\n".join([*lines, create])


def cron_documents(wf: ir.Workflow, run: Doc, meta: Doc) -> list[Doc]:
    """``[ConfigMap, CronJob]`` creating ``run`` (the compiled PipelineRun) on ``wf``'s
    schedule; ``meta`` is the metadata (namespace, labels, annotations) of every object."""
    s = wf.schedule
    assert s is not None
    run_meta = dict(run["metadata"])
    run_meta["labels"] = {**run_meta.get("labels", {}), SCHEDULED_BY: wf.name}
    manifest = {**run, "metadata": run_meta}
    config_name = f"{wf.name}-pipelinerun"
    config: Doc = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": config_name, **meta},
                   "data": {_MANIFEST: emit.to_yaml(manifest)}}
    pod: Doc = {
        "serviceAccountName": LAUNCHER_ACCOUNT,
        "restartPolicy": "Never",
        "containers": [{
            "name": "create-pipelinerun",
            "image": LAUNCHER_IMAGE,
            "command": ["/bin/sh", "-c", _launch_script(wf.name, s.concurrency_policy)],
            "volumeMounts": [{"name": "pipelinerun", "mountPath": _MOUNT, "readOnly": True}],
        }],
        "volumes": [{"name": "pipelinerun", "configMap": {"name": config_name}}],
    }
    spec: Doc = {"schedule": s.schedule}
    if s.timezone:
        spec["timeZone"] = s.timezone
    spec.update(cron_policy(s))
    spec["jobTemplate"] = {"spec": {"backoffLimit": 0, "template": {"spec": pod}}}
    cron: Doc = {"apiVersion": "batch/v1", "kind": "CronJob",
                 "metadata": {"name": wf.name, **meta}, "spec": spec}
    return [config, cron]


# --------------------------------------------------------------------------- triggers


def _field(node: ast.AST, fields: set[str]) -> str | None:
    """``body['NAME']`` for a field read (recorded in ``fields``), else None."""
    name: str | None = None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == "body":
        name = node.attr
    elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
            and node.value.id == "body" and isinstance(node.slice, ast.Constant) \
            and isinstance(node.slice.value, str):
        name = node.slice.value
    if name is None:
        return None
    fields.add(name)
    return f"body[{json.dumps(name)}]"


_NUMBER = r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"  # reads as a number
_NUMBER_RE = re.compile(_NUMBER)


def _operand(node: ast.AST, fields: set[str]) -> tuple[str, str, str]:
    """``(is a number, as a number, as a string)`` of a comparison's operand, as CEL: the
    submitter compares two values that read as numbers as numbers, others as strings."""
    field = _field(node, fields)
    if field is not None:
        text = f"string({field})"
        return (f"{text}.matches({json.dumps(_NUMBER)})", f"double({text}.trim())", text)
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool):
        value = node.value
        text = value if isinstance(value, str) else str(value)
        if isinstance(value, bool) or not _NUMBER_RE.match(text):
            return "false", "", json.dumps(text)
        return "true", f"double({json.dumps(float(text))})", json.dumps(text)
    raise ValueError(f"{type(node).__name__} cannot be compared")


def _compare(left: ast.AST, op: str, right: ast.AST, fields: set[str]) -> str:
    ln, lv, ls = _operand(left, fields)
    rn, rv, rs = _operand(right, fields)
    if "false" in (ln, rn):
        return f"{ls} {op} {rs}"
    if ln == rn == "true":
        return f"{lv} {op} {rv}"
    test = " && ".join(t for t in (ln, rn) if t != "true")
    return f"({test} ? {lv} {op} {rv} : {ls} {op} {rs})"


def _compare_parts(node: ast.Compare, fields: set[str]) -> list[str]:
    """One CEL test per comparison of a chain (``a < b < c``: ``a < b``, ``b < c``)."""
    parts = []
    left = node.left
    for op, right in zip(node.ops, node.comparators, strict=True):
        if isinstance(op, ast.In | ast.NotIn):
            if not isinstance(right, ast.Tuple | ast.List) or not all(
                    isinstance(e, ast.Constant) for e in right.elts):
                raise ValueError("`in` takes a list of constants")
            items = ", ".join(json.dumps(str(e.value)) for e in right.elts
                              if isinstance(e, ast.Constant))
            test = f"{_operand(left, fields)[2]} in [{items}]"
            parts.append(test if isinstance(op, ast.In) else f"!({test})")
        elif type(op) in _CEL_OPS:
            parts.append(_compare(left, _CEL_OPS[type(op)], right, fields))
        else:
            raise ValueError(f"{type(op).__name__} is not a comparison of the filter")
        left = right
    return parts


def _cel(node: ast.AST, fields: set[str]) -> str:
    """The value of ``node`` as a CEL boolean (the submitter's truth of strings)."""
    if isinstance(node, ast.Expression):
        return _cel(node.body, fields)
    if isinstance(node, ast.BoolOp):
        joiner = " && " if isinstance(node.op, ast.And) else " || "
        return "(" + joiner.join(_cel(v, fields) for v in node.values) + ")"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return f"!{_cel(node.operand, fields)}"
    if isinstance(node, ast.Compare):
        return "(" + " && ".join(_compare_parts(node, fields)) + ")"
    field = _field(node, fields)
    if field is not None:
        return f"!(string({field}).lowerAscii().trim() in {_FALSY})"
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool):
        truth = node.value.strip().lower() not in ("", "0", "false", "no") \
            if isinstance(node.value, str) else bool(node.value)
        return "true" if truth else "false"
    raise ValueError(f"{type(node).__name__} is not part of the filter language")


def _or(a: str, b: str) -> str:
    return b if a == "false" else a if b == "false" else f"({a} || {b})"


def _and(a: str, b: str) -> str:
    return "false" if "false" in (a, b) else f"({a} && {b})"


def _missing(node: ast.AST, fields: set[str]) -> str:
    """CEL: the submitter, evaluating ``node`` left to right and short-circuiting, reads
    a field the event lacks (which makes the whole filter false)."""
    if isinstance(node, ast.Expression):
        return _missing(node.body, fields)
    if isinstance(node, ast.BoolOp):
        *first, last = node.values
        result = _missing(last, fields)
        for v in reversed(first):  # a or b: a is missing, or a is false and b is missing
            value = _cel(v, fields)
            go_on = value if isinstance(node.op, ast.And) else f"!{value}"
            result = _or(_missing(v, fields), _and(go_on, result))
        return result
    if isinstance(node, ast.UnaryOp):
        return _missing(node.operand, fields)
    if isinstance(node, ast.Compare):
        parts = _compare_parts(node, fields)
        reads = [_missing(node.left, fields)] + [_missing(c, fields) for c in node.comparators]
        result = reads[-1]
        for i in range(len(parts) - 1, 0, -1):  # the chain stops at the first false test
            result = _or(reads[i], _and(parts[i - 1], result))
        return _or(reads[0], result)
    field = _field(node, fields)
    if field is not None:
        name = field[len("body["):-1]
        return f"!({name} in body)"
    return "false"


def cel_filter(expr: str, required: tuple[str, ...] = ()) -> str:
    """The CEL expression (Tekton Triggers' CEL interceptor, over the JSON ``body``) of a
    Couler event filter (the submitter's language: comparisons, ``and`` / ``or`` / ``not``,
    ``body.NAME`` / ``body['NAME']``), as the submitter evaluates it: a field the event
    lacks, read before the result is decided, makes the filter false; two values that read
    as numbers compare as numbers, others as strings. Every name of ``required`` must be
    in the body. ValueError for a filter outside the language."""
    fields: set[str] = set()
    body = "true"
    if expr.strip():
        try:
            tree = ast.parse(expr.strip(), mode="eval")
        except SyntaxError as exc:
            raise ValueError(f"does not parse: {exc.msg}") from None
        value, missing = _cel(tree, fields), _missing(tree, fields)
        only = re.fullmatch(r'!\(("[^"\\]*" in body)\)', missing)
        present = only.group(1) if only else f"!{missing}"
        body = value if missing == "false" else f"{present} && {value}"
    present = [f"{json.dumps(f)} in body" for f in sorted(required)]
    return " && ".join([*present, body]) if present else body


def _nats_regex(subject: str) -> str:
    """A regular expression matching the subjects of NATS pattern ``subject``."""
    parts = []
    for token in subject.split("."):
        parts.append("[^.]+" if token == "*" else ".+" if token == ">" else re.escape(token))
    return "^" + r"\.".join(parts) + "$"


def trigger_documents(wf: ir.Workflow, run: Doc, meta: Doc) -> list[Doc]:
    """``[TriggerBinding, TriggerTemplate, EventListener]`` creating ``run`` (the compiled
    PipelineRun) for each of ``wf``'s triggers; ``meta`` as for :func:`cron_documents`."""
    strings = [p for p in wf.parameters if p.type is not ir.ValueType.LIST]
    required = tuple(p.name for p in strings if p.default is None)
    bad = [p.name for p in wf.parameters if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p.name)]
    if bad:
        raise _fail(wf, Feature.EVENT_TRIGGERS, f"parameter {bad[0]!r} is not a CEL identifier, "
                                            "so the event cannot bind it")
    overlays = [{"key": f"couler.{p.name}",
                 "expression": f"{json.dumps(p.name)} in body ? string(body[{json.dumps(p.name)}])"
                               f" : {json.dumps(p.default.text if p.default else '')}"}
                for p in strings]
    binding: Doc = {"apiVersion": TRIGGERS_API, "kind": "TriggerBinding",
                    "metadata": {"name": wf.name, **meta},
                    "spec": {"params": [{"name": p.name, "value": f"$(extensions.couler.{p.name})"}
                                        for p in strings]}}
    template_params: list[Doc] = []
    for p in strings:
        param: Doc = {"name": p.name}
        if p.description:
            param["description"] = p.description
        template_params.append(param)
    run_params = {p.name: f"$(tt.params.{p.name})" for p in strings}
    spec = dict(run["spec"])
    given = [q for q in spec.get("params", []) if q["name"] not in run_params]
    params = given + [{"name": n, "value": v} for n, v in run_params.items()]
    if params:
        spec["params"] = params
    template_spec: Doc = {"resourcetemplates": [{**run, "spec": spec}]}
    if template_params:
        template_spec["params"] = template_params
    template: Doc = {"apiVersion": TRIGGERS_API, "kind": "TriggerTemplate",
                     "metadata": {"name": wf.name, **meta}, "spec": template_spec}
    launchers = dict(wf.annotations).get(LAUNCHERS_ANNOTATION)
    triggers = []
    for i, t in enumerate(wf.triggers):
        try:
            test = cel_filter(t.filter, required)
        except ValueError as exc:
            raise _fail(wf, Feature.EVENT_TRIGGERS, f"trigger {i}: filter {t.filter[:80]!r} "
                                                f"{exc}") from None
        tests = [f"header.canonical({json.dumps(SUBJECT_HEADER)})"
                 f".matches({json.dumps(_nats_regex(t.subject))})"]
        if launchers is not None:
            names = sorted({n.strip() for n in launchers.split(",") if n.strip()})
            tests.append(f"header.canonical({json.dumps(LAUNCHER_HEADER)}) in "
                         f"{json.dumps(names)}")
        tests.append(f"({test})")
        cel_params: list[Doc] = [{"name": "filter", "value": " && ".join(tests)}]
        if overlays:
            cel_params.append({"name": "overlays", "value": overlays})
        triggers.append({
            "name": f"trigger-{i}",
            "interceptors": [{"ref": {"name": "cel", "kind": "ClusterInterceptor"},
                              "params": cel_params}],
            "bindings": [{"ref": wf.name}],
            "template": {"ref": wf.name},
        })
    listener: Doc = {"apiVersion": TRIGGERS_API, "kind": "EventListener",
                     "metadata": {"name": wf.name, **meta},
                     "spec": {"serviceAccountName": LAUNCHER_ACCOUNT, "triggers": triggers}}
    return [binding, template, listener]
