"""Job steps on engines without a resource step: a kubectl script that acts and waits.

Tekton Pipelines and KFP v2 have no resource step (Argo's ``resource`` template), so
their compilers run a job step as a container of :data:`JOB_IMAGE` (``kubectl``) under
the run's service account, which needs the rights on the resource (create / get, or the
job's action). :func:`script` builds its shell script: it writes the manifest (with the
engine's ``ownerReference`` when ``set_owner_reference``, so deleting the run deletes the
resource, as Argo's owner reference to the Workflow does), runs the action (``kubectl
create|apply|replace -o name``, ``patch --type merge``, ``delete``), then, when the job has
conditions, polls the object every :data:`POLL_SECONDS`: the failure condition fails the
step, the success condition ends it. Without conditions the step succeeds once the
action did, as in Argo.

Conditions use Argo's syntax, a comma-separated list of requirements on the object's
fields, all of which must hold: ``PATH OP VALUE`` (``PATH`` dotted, with list indexes
``[N]``) with ``==`` / ``=`` / ``!=`` (text),
``>`` / ``<`` (integers), ``in (a, b)`` / ``notin (a, b)``, a bare ``PATH`` (the field is
set) and ``!PATH`` (it is not). Each field is read with ``kubectl get -o jsonpath``.
Outputs read with a JSONPath are read the same way once the step succeeded, the jq
filter ``.`` (the whole object) with ``kubectl get -o json``; other jq filters are
refused (the image has no jq). Engine-neutral and pure: builds text; each engine says
where an output goes and which object owns the resource.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping

from couler import ir

__all__ = ["JOB_IMAGE", "MANIFEST_PATH", "POLL_SECONDS", "WHOLE_OBJECT", "condition_test",
           "script"]

JOB_IMAGE = "bitnami/kubectl:1.31"
POLL_SECONDS = 5
WHOLE_OBJECT = "."  # the jq filter of the whole object: kubectl get -o json
MANIFEST_PATH = "/tmp/couler-manifest.json"  # where the script writes the manifest

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<path>[A-Za-z_][\w.\-/]*(?:\[\d+\][\w.\-/]*)*)\s*"
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


def _manifest(job: ir.JobSpec, owner: Mapping[str, object] | None) -> str:
    doc = job.manifest_dict
    if owner is not None and job.set_owner_reference and job.action in (ir.JobAction.CREATE,
                                                                         ir.JobAction.APPLY):
        meta = doc.setdefault("metadata", {})
        if isinstance(meta, dict):
            refs = meta.setdefault("ownerReferences", [])
            if isinstance(refs, list):
                refs.append(dict(owner))
    return json.dumps(doc, indent=1, sort_keys=True)


def script(job: ir.JobSpec, outputs: list[tuple[str, str]], *,
           result_file: Callable[[str], str], owner: Mapping[str, object] | None = None,
           substitutions: Mapping[str, str] | None = None) -> str:
    """The kubectl step's script; ``outputs`` are (result name, JSONPath or
    :data:`WHOLE_OBJECT`) pairs, ``result_file(name)`` the shell word of the file a
    result is written to. ``owner`` is the ``ownerReferences`` entry added when the job
    sets an owner reference (None: the engine has no owner to give). ``substitutions``
    maps marks in the manifest (in ``owner``, say) to shell expressions replaced in the
    written manifest at run time (``sed``), for values only the running pod knows.

    Raises:
        ValueError: a condition or JSONPath this translation does not know.
    """
    meta = job.manifest_dict.get("metadata")
    if job.action is not ir.JobAction.CREATE and not (isinstance(meta, dict)
                                                      and meta.get("name")):
        raise ValueError(f"kubectl {job.action.value} needs metadata.name; the manifest has "
                         "none (generateName works with create only)")
    m = MANIFEST_PATH
    text = _manifest(job, owner)
    marker = "COULER_MANIFEST_EOF"
    while marker in text.splitlines():
        marker += "_"
    lines = ["#!/bin/sh", f"cat > {m} <<'{marker}'", text, marker]
    used = {mark: value for mark, value in (substitutions or {}).items() if mark in text}
    if used:
        edits = "; ".join(f"s|{mark}|{value}|g" for mark, value in used.items())
        lines.append(f'sed -i "{edits}" {m} || exit 1')
    lines += [f"couler_obj=$({_ACTIONS[job.action].format(m=m)}) || exit 1",
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
        lines.append(f'kubectl get "$couler_obj" -o {fmt} > {result_file(name)} || exit 1')
    return "\n".join(lines) + "\n"
