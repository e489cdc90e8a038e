"""Job steps on Tekton: a kubectl step that creates the resource and waits on its conditions.

Tekton Pipelines has no resource step (Argo's ``resource`` template), so a job step runs
``kubectl`` (image :data:`JOB_IMAGE`) under the PipelineRun's service account, which
needs the rights on the resource (create / get, or the job's action). Its script writes
the manifest (with an ``ownerReference`` to the TaskRun when ``set_owner_reference``, so
deleting the run deletes the resource, as Argo's owner reference to the Workflow does),
runs the action (``kubectl create|apply|replace -o name``, ``patch --type merge``,
``delete``), then, when the job has conditions, polls the object every
:data:`POLL_SECONDS`: the failure condition fails the step, the success condition ends it.
Without conditions the step succeeds once the action did, as in Argo.

Conditions use Argo's syntax, a comma-separated list of requirements on the object's
fields, all of which must hold: ``PATH OP VALUE`` with ``==`` / ``=`` / ``!=`` (text),
``>`` / ``<`` (integers), ``in (a, b)`` / ``notin (a, b)``, a bare ``PATH`` (the field is
set) and ``!PATH`` (it is not). Each field is read with ``kubectl get -o jsonpath``.
Outputs read with a JSONPath are read the same way once the step succeeded, the jq
filter ``.`` (the whole object) with ``kubectl get -o json``; other jq filters are
refused (the image has no jq). Pure: builds text.
"""

from __future__ import annotations

import json
import re
import shlex

from couler import ir

__all__ = ["JOB_IMAGE", "POLL_SECONDS", "WHOLE_OBJECT", "condition_test", "script"]

JOB_IMAGE = "bitnami/kubectl:1.31"
POLL_SECONDS = 5
WHOLE_OBJECT = "."  # the jq filter of the whole object: kubectl get -o json

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<path>[A-Za-z_][\w.\-/]*)\s*"
    r"(?:(?P<op>==|=|!=|>|<|\bin\b|\bnotin\b)\s*(?P<value>.*?))?\s*$")
_ACTIONS = {
    ir.JobAction.CREATE: "kubectl create -f {m} -o name",
    ir.JobAction.APPLY: "kubectl apply -f {m} -o name",
    ir.JobAction.REPLACE: "kubectl replace -f {m} -o name",
    ir.JobAction.PATCH: 'kubectl patch -f {m} --type merge -p "$(cat {m})" -o name',
    ir.JobAction.DELETE: "kubectl delete -f {m} -o name",
}


def _split(condition: str) -> list[str]:
    """Requirements separated by commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in condition:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in (*parts, cur) if p.strip()]


def _field(path: str) -> str:
    return f'$(kubectl get "$couler_obj" -o jsonpath={shlex.quote("{." + path + "}")})'


def condition_test(condition: str) -> str:
    """An sh test that holds when every requirement of ``condition`` holds.

    Raises:
        ValueError: a requirement this translation does not know.
    """
    tests = []
    for req in _split(condition):
        m = _REQUIREMENT.match(req)
        if m is None or (m["neg"] and m["op"]):
            raise ValueError(f"cannot read the requirement {req.strip()!r}")
        value = f'"{_field(m["path"])}"'
        op, raw = m["op"], (m["value"] or "").strip()
        if op is None:
            tests.append(f"[ -{'z' if m['neg'] else 'n'} {value} ]")
        elif op in ("=", "==", "!="):
            tests.append(f"[ {value} {'!=' if op == '!=' else '='} {shlex.quote(raw)} ]")
        elif op in (">", "<"):
            if not re.fullmatch(r"-?\d+", raw):
                raise ValueError(f"{op} needs an integer: {req.strip()!r}")
            flag = "-gt" if op == ">" else "-lt"
            tests.append(f"{{ couler_v={value}; [ -n \"$couler_v\" ] && "
                         f"[ \"$couler_v\" {flag} {raw} ]; }}")
        else:
            if not (raw.startswith("(") and raw.endswith(")")):
                raise ValueError(f"{op} needs a list in parentheses: {req.strip()!r}")
            values = [v.strip() for v in raw[1:-1].split(",") if v.strip()]
            alts = "|".join(shlex.quote(v) for v in values) or "''"
            hit, miss = ("true", "false") if op == "in" else ("false", "true")
            tests.append(f"{{ case {value} in {alts}) {hit};; *) {miss};; esac; }}")
    if not tests:
        raise ValueError("an empty condition")
    return " && ".join(tests)


def _manifest(job: ir.JobSpec) -> str:
    doc = job.manifest_dict
    if job.set_owner_reference and job.action in (ir.JobAction.CREATE, ir.JobAction.APPLY):
        meta = doc.setdefault("metadata", {})
        if isinstance(meta, dict):
            refs = meta.setdefault("ownerReferences", [])
            if isinstance(refs, list):
                refs.append({"apiVersion": "tekton.dev/v1", "kind": "TaskRun",
                             "name": "$(context.taskRun.name)",
                             "uid": "$(context.taskRun.uid)", "blockOwnerDeletion": True})
    return json.dumps(doc, indent=1, sort_keys=True)


def script(job: ir.JobSpec, outputs: list[tuple[str, str]]) -> str:
    """The kubectl step's script; ``outputs`` are (result name, JSONPath or
    :data:`WHOLE_OBJECT`) pairs.

    Raises:
        ValueError: a condition or JSONPath this translation does not know.
    """
    meta = job.manifest_dict.get("metadata")
    if job.action is not ir.JobAction.CREATE and not (isinstance(meta, dict)
                                                      and meta.get("name")):
        raise ValueError(f"kubectl {job.action.value} needs metadata.name; the manifest has "
                         "none (generateName works with create only)")
    m = "/tmp/couler-manifest.json"
    text = _manifest(job)
    marker = "COULER_MANIFEST_EOF"
    while marker in text.splitlines():
        marker += "_"
    lines = ["#!/bin/sh", f"cat > {m} <<'{marker}'", text, marker,
             f"couler_obj=$({_ACTIONS[job.action].format(m=m)}) || exit 1",
             'echo "couler: $couler_obj"']
    if job.success_condition or job.failure_condition:
        success = condition_test(job.success_condition) if job.success_condition else "false"
        failure = condition_test(job.failure_condition) if job.failure_condition else "false"
        lines += ["while :; do",
                  f"  if {failure}; then echo \"couler: $couler_obj met the failure condition: "
                  f"{job.failure_condition}\" >&2; exit 1; fi",
                  f"  if {success}; then break; fi",
                  f"  sleep {POLL_SECONDS}",
                  "done"]
    for name, path in outputs:
        fmt = "json" if path == WHOLE_OBJECT else "jsonpath=" + shlex.quote(
            path if path.startswith("{") else "{" + path + "}")
        lines.append(f'kubectl get "$couler_obj" -o {fmt} > "$(results.{name}.path)" || exit 1')
    return "\n".join(lines) + "\n"
