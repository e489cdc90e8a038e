"""Job steps: create (apply, replace, patch, delete) a Kubernetes resource and wait for it.

The step runner does it on the worker with the Kubernetes client of the
``cncf-kubernetes`` provider (``KubernetesHook``: the ``kubernetes_default``
connection, in-cluster or a kube config): it fills the step's placeholders into the
manifest, performs the action through the dynamic client (server-side apply for
``apply``; ``apply`` of a manifest with only ``generateName`` creates it), then polls
the resource every 5 seconds until the failure condition holds (the step fails) or
the success condition holds (it succeeds).

Conditions use Argo's syntax: comma-separated requirements over the resource's JSON
fields -- ``PATH OP VALUE`` with ``==``, ``=``, ``!=``, ``>``, ``<`` (numbers compared
as numbers), ``PATH in (A, B)``, ``PATH notin (A, B)``, ``PATH`` (set) and ``!PATH``
(unset). Without a success condition the step succeeds once the action is done.

The created resource is not owned by anything (Argo's owner reference points at its
workflow object, which Airflow does not have): delete it with a ``delete`` step or a
TTL in the manifest. A job step's outputs are read from the resource when it is done:
plain field paths (``{.metadata.name}`` JSONPath, ``.metadata.uid`` jq; ``.`` is the
whole object as JSON); other JSONPath / jq expressions are refused.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from couler import ir
from couler.engines.base import Feature

__all__ = ["JOB_RUNTIME", "job_spec"]

Fail = Callable[[str, Feature, str], Exception]
_JSON_PATH = re.compile(r"^\{\.([\w.-]*)\}$")  # {.metadata.name}
_JQ_PATH = re.compile(r"^\.([\w.-]*)$")  # . or .metadata.name


def job_spec(wf: ir.Workflow, step: ir.Step, fail: Fail) -> dict[str, Any]:
    """The STEPS entry fields of a job step."""
    body = step.body
    assert isinstance(body, ir.JobSpec)
    fields = {}
    for out in step.outputs:
        m = _JSON_PATH.match(out.selector) if out.source is ir.OutputSource.JSON_PATH else \
            _JQ_PATH.match(out.selector) if out.source is ir.OutputSource.JQ else None
        if m is None:
            raise fail(step.name, Feature.JOB, f"output {out.name!r}: only plain field paths "
                       "of the resource ({.a.b} JSONPath, .a.b jq) are read on Airflow")
        fields[out.name] = m.group(1) or ""
    for what, value in (("a map", step.foreach), ("a loop", step.loop)):
        if value is not None:
            raise fail(step.name, Feature.JOB, f"{what} of a job step is not generated")
    manifest = body.manifest_dict
    name = manifest.get("metadata", {})
    named = isinstance(name, dict) and bool(name.get("name"))
    if body.action not in (ir.JobAction.CREATE, ir.JobAction.APPLY) and not named:
        raise fail(step.name, Feature.JOB, f"a {body.action.value} action needs the "
                   "resource's metadata.name")
    return {"kind": "job", "manifest": body.manifest, "action": body.action.value,
            "success": body.success_condition, "failure": body.failure_condition,
            "namespace": wf.tenant, "fields": fields}


# Written into DAG files with job steps, after the step runner (_RUNTIME).
JOB_RUNTIME = r'''

def _couler_field(obj: Any, path: str) -> Any:
    """The value at a dotted path of a resource's JSON (list indices as numbers)."""
    current = obj
    for part in path.split("."):
        if isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        elif isinstance(current, dict) and part in current:
            current = current[part]
        else:
            return None
    return current


def _couler_same(left: str, right: str, op: str) -> bool:
    try:
        a, b = float(left), float(right)
    except ValueError:
        a, b = left, right
    return {"=": a == b, "==": a == b, "!=": a != b, ">": a > b, "<": a < b}[op]


_REQUIREMENT = re.compile(r"^(!?)\s*([^\s!=<>]+)\s*(?:(==|!=|=|>|<|in\b|notin\b)\s*(.*))?$")


def _couler_k8s_holds(expr: str, obj: Any) -> bool:
    """Argo's success / failure condition over a resource: every requirement holds."""
    for requirement in re.split(r",(?![^()]*\))", expr):
        requirement = requirement.strip()
        if not requirement:
            continue
        m = _REQUIREMENT.match(requirement)
        if m is None:
            raise ValueError(f"cannot read the condition {requirement!r}")
        negate, path, op, value = m.groups()
        found = _couler_field(obj, path)
        if op is None:
            if (found is None) != bool(negate):
                return False
            continue
        if found is None:
            return False
        text = _couler_text(found)
        if op in ("in", "notin"):
            choices = [c.strip() for c in value.strip().strip("()").split(",")]
            if (text in choices) != (op == "in"):
                return False
        elif not _couler_same(text, value.strip(), op):
            return False
    return True


def _couler_job(step: str, spec: dict[str, Any], fill: Any) -> dict[str, Any]:
    """Perform a job step's action on its manifest and wait for its conditions."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from kubernetes.dynamic import DynamicClient

    manifest = json.loads(fill(spec["manifest"]))
    hook = KubernetesHook()
    api = DynamicClient(hook.api_client).resources.get(
        api_version=manifest["apiVersion"], kind=manifest["kind"])
    meta = manifest.setdefault("metadata", {})
    where: dict[str, Any] = {}
    if api.namespaced:
        meta["namespace"] = (meta.get("namespace") or spec["namespace"]
                             or hook.get_namespace() or "default")
        where["namespace"] = meta["namespace"]
    action, kind = spec["action"], manifest["kind"]
    if action == "delete":
        api.delete(name=meta["name"], **where)
        print(f"couler: deleted {kind} {meta['name']}", flush=True)
        return {}
    if action == "create" or (action == "apply" and not meta.get("name")):
        obj = api.create(body=manifest, **where)  # a generated name: nothing to apply over
    elif action == "apply":
        obj = api.server_side_apply(body=manifest, field_manager="couler",
                                    force_conflicts=True, **where)
    elif action == "replace":
        obj = api.replace(body=manifest, **where)
    else:
        obj = api.patch(body=manifest, name=meta["name"],
                        content_type="application/merge-patch+json", **where)
    name = obj.metadata.name
    print(f"couler: {action} {kind} {name}", flush=True)
    current = obj.to_dict()
    while spec["success"] or spec["failure"]:
        current = api.get(name=name, **where).to_dict()
        if spec["failure"] and _couler_k8s_holds(spec["failure"], current):
            raise RuntimeError(f"step {step}: {kind} {name} met its failure condition "
                               f"{spec['failure']!r}")
        if not spec["success"] or _couler_k8s_holds(spec["success"], current):
            break
        time.sleep(5)
    return _couler_job_outputs(spec, current)


def _couler_job_outputs(spec: dict[str, Any], obj: Any) -> dict[str, Any]:
    """A job step's outputs: fields of the resource ("" = the whole object as JSON)."""
    return {name: _couler_text(_couler_field(obj, path) if path else obj)
            for name, path in spec["fields"].items()}


_KINDS["job"] = _couler_job
'''
