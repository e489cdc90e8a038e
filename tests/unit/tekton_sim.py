"""A small stand-in for the Tekton controller: runs a compiled Pipeline's scripts locally.

It does what the Tekton controller and entrypoint do with the parts of a Pipeline the
Couler compiler emits, so a test can check what a compiled workflow *does*, not only its
shape: tasks start in ``runAfter`` order; params are substituted (``$(params.X)``,
``$(params.X[*])`` spread over arguments, ``$(tasks.T.results.R)`` and ``[*]`` of a
matrixed task's results gathered into an array); a matrix fans out (``include`` or an
array param); a ``when`` (``in`` / ``notin``) false, or a result reference to a task that
did not produce it, skips the task; each step's ``script`` runs with /bin/sh and its
``args`` (``/tmp/`` is redirected to a directory per task); a non-zero exit fails the task
unless ``onError: continue``; a failed task stops new tasks from starting and fails the
run; ``finally`` tasks run last with ``$(tasks.status)``; secret env values come from
``secrets``; ``$(context.pipelineRun.name|uid)`` are the run's (a new uid per run);
``$(context.taskRun.name)`` is RUN-TASK, with -INDEX for a matrix combination.
Images are ignored: the commands run on this machine, so programs whose commands exist
here (sh, python3) are runnable; ``python`` and ``python3`` are this test's interpreter,
with couler-runtime on its path (the tune steps' image has it). Not modelled: Tekton's own
``retries`` (a new pod), volumes mounted at fixed paths, tasks running at the same time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TASK_REF = re.compile(r"\$\(tasks\.([-a-z0-9]+)\.results\.([-a-zA-Z0-9_]+)(\[\*\])?\)")
_PARAM = re.compile(r"\$\(params\.([-a-zA-Z0-9_.]+)\)")
_WORKSPACE = re.compile(r"\$\(workspaces\.([-a-zA-Z0-9_]+)\.path\)")
_WS = "<workspaces>"  # the params key holding the run's workspace root
_SHARED = "<shared>"  # the params key holding a directory every task sees as it is
_SECRETS = "<secrets>"  # the params key holding {(secret, key): value}
_CONTEXT = re.compile(r"\$\((context\.pipelineRun\.(?:name|uid))\)")


class _MissingResultError(Exception):
    """A result reference to a task that did not produce the result: the task is skipped."""


@dataclass
class TaskRun:
    """What one pipeline task did."""

    state: str  # "succeeded", "failed" or "skipped" (Tekton's view)
    results: dict[str, Any] = field(default_factory=dict)  # str, or list for a matrix
    exit_codes: list[int] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)  # per run of the step (matrix: each)
    stderr: list[str] = field(default_factory=list)


@dataclass
class PipelineRun:
    """The run: its status (``Succeeded`` / ``Failed``) and every task's TaskRun."""

    status: str
    tasks: dict[str, TaskRun]
    uid: str = ""  # $(context.pipelineRun.uid)


def _value(text: str, done: dict[str, TaskRun]) -> Any:
    m = _TASK_REF.fullmatch(text)
    if m and m.group(3):
        run = done.get(m.group(1))
        if run is None or m.group(2) not in run.results:
            raise _MissingResultError(text)
        value = run.results[m.group(2)]
        return value if isinstance(value, list) else json.loads(value)

    def sub(m: re.Match[str]) -> str:
        run = done.get(m.group(1))
        if run is None or m.group(2) not in run.results:
            raise _MissingResultError(m.group(0))
        return str(run.results[m.group(2)])

    return _TASK_REF.sub(sub, text)


def _subst(text: str, params: dict[str, Any], tmp: str) -> str:
    def sub(m: re.Match[str]) -> str:
        v = params.get(m.group(1))
        return m.group(0) if v is None or isinstance(v, list) else str(v)

    # /tmp/ of each pod is its own; a path under params[_SHARED] is the test's, left alone
    shared = params.get(_SHARED, "")
    keep = f"(?!{re.escape(shared.removeprefix('/tmp/'))})" if shared.startswith("/tmp/") else ""
    text = re.sub("/tmp/" + keep, tmp + "/", _PARAM.sub(sub, text))
    if "context.taskRun.name" in params:
        text = text.replace("$(context.taskRun.name)", str(params["context.taskRun.name"]))
    # every workspace of the run is one directory (Tekton mounts the bound volume)
    return _WORKSPACE.sub(lambda m: f"{params[_WS]}/{m.group(1)}", text)


def _run_one(spec: dict[str, Any], params: dict[str, Any], work: Path,
             ) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    work.mkdir(parents=True)
    tmp = str(work / "tmp")
    Path(tmp).mkdir()
    res_dir = work / "results"
    res_dir.mkdir()
    (step,) = spec["steps"]
    script = _subst(step.get("script", '#!/bin/sh\nexec "$@"\n'), params, tmp)
    for r in spec.get("results", []):
        script = script.replace(f"$(results.{r['name']}.path)", str(res_dir / r["name"]))
    args: list[str] = [_subst(c, params, tmp) for c in step.get("command", [])]
    for a in step.get("args", []):
        m = re.fullmatch(r"\$\(params\.([-a-zA-Z0-9_.]+)\[\*\]\)", a)
        args += [str(x) for x in params[m.group(1)]] if m else [_subst(a, params, tmp)]
    bin_dir = work / "bin"  # python is this test's, with couler-runtime
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(sys.executable)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.update({e["name"]: _subst(e["value"], params, tmp) for e in step.get("env", [])
                if "value" in e})
    secrets = params.get(_SECRETS, {})
    for e in step.get("env", []):
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref and (ref["name"], ref["key"]) in secrets:
            env[e["name"]] = secrets[(ref["name"], ref["key"])]
    path = work / "script.sh"
    path.write_text(script)
    proc = subprocess.run(["/bin/sh", str(path), *args], cwd=work, env=env,
                          capture_output=True, text=True, check=False)
    results = {f.name: f.read_text() for f in res_dir.iterdir()}
    return proc, results


def _pipeline_params(value: Any, run_params: dict[str, Any]) -> Any:
    """``$(params.X)`` of the pipeline in a task's param value (``[*]``: the whole array)."""
    if not isinstance(value, str):
        return value
    m = re.fullmatch(r"\$\(params\.([-a-zA-Z0-9_.]+)\[\*\]\)", value)
    if m:
        return run_params[m.group(1)]
    value = _CONTEXT.sub(lambda m: str(run_params[m.group(1)]), value)
    return _PARAM.sub(lambda m: str(run_params.get(m.group(1), m.group(0))), value)


def _status_in(value: Any, status: str) -> Any:
    """``$(tasks.status)`` in a finally task's param value."""
    return value.replace("$(tasks.status)", status) if isinstance(value, str) and status \
        else value


def _when_holds(when: list[dict[str, Any]], done: dict[str, TaskRun], status: str,
                run_params: dict[str, Any]) -> bool:
    for w in when:
        value = status if w["input"] == "$(tasks.status)" else _value(
            _pipeline_params(w["input"], run_params), done)
        values = [_value(_pipeline_params(v, run_params), done) for v in w["values"]]
        flat = [x for v in values for x in (v if isinstance(v, list) else [v])]
        if (value in flat) != (w["operator"] == "in"):
            return False
    return True


def _run_task(task: dict[str, Any], done: dict[str, TaskRun], work: Path,
              extra: dict[str, Any], status: str = "") -> TaskRun:
    try:
        params = {p["name"]: _value(_pipeline_params(_status_in(p["value"], status), extra),
                                    done)
                  for p in task.get("params", [])}
        if not _when_holds(task.get("when", []), done, status, extra):
            return TaskRun("skipped")
        combos: list[dict[str, Any]] = [{}]
        matrix = task.get("matrix")
        if matrix and "include" in matrix:
            combos = [{p["name"]: p["value"] for p in inc.get("params", [])}
                      for inc in matrix["include"]]
        elif matrix:
            ((name, items),) = [(p["name"], _value(_pipeline_params(p["value"], extra), done))
                                for p in matrix["params"]]
            combos = [{name: str(i)} for i in items]
    except _MissingResultError:
        return TaskRun("skipped")
    spec = task["taskSpec"]
    on_error = spec["steps"][0].get("onError", "stopAndFail")
    codes, outs, procs = [], [], []
    for i, combo in enumerate(combos):
        # a TaskRun's name: the run's, the task's, and (a matrix) the combination's index
        run_name = f"{extra.get('context.pipelineRun.name', 'run')}-{task['name']}" + (
            f"-{i}" if matrix else "")
        proc, results = _run_one(spec, {**extra, **params, **combo,
                                        "context.taskRun.name": run_name},
                                 work / f"{task['name']}-{i}")
        codes.append(proc.returncode)
        procs.append(proc)
        outs.append(results)
    failed = any(codes) and on_error != "continue"
    if matrix:
        merged: dict[str, Any] = {n: [o.get(n, "") for o in outs] for n in outs[0]}
    else:
        merged = outs[0]
    return TaskRun("failed" if failed else "succeeded", merged, codes,
                   [p.stdout for p in procs], [p.stderr for p in procs])


def run_pipeline(docs: list[dict[str, Any]], work: Path, *, shared: Path | None = None,
                 secrets: Mapping[tuple[str, str], str] | None = None,
                 claims: Path | None = None) -> PipelineRun:
    """Run a compiled ``[Pipeline, PipelineRun]`` and report what every task did.

    ``shared`` is a directory the tasks' commands see as it is (state kept across tasks
    by a test, e.g. a marker of the first attempt); ``claims`` holds one directory per
    PersistentVolumeClaim, kept from run to run.
    """
    spec = docs[0]["spec"]
    run_params: dict[str, Any] = {p["name"]: p["value"]
                                  for p in docs[1]["spec"].get("params", [])}
    run_params[_WS] = str(work / "workspaces")
    run_params[_SHARED] = str(shared or "")
    run_params[_SECRETS] = dict(secrets or {})
    run_params["context.pipelineRun.uid"] = str(uuid.uuid4())
    run_params["context.pipelineRun.name"] = f"{docs[0]['metadata']['name']}-run"
    (work / "workspaces").mkdir(parents=True)
    for w in docs[1]["spec"].get("workspaces", []):
        claim = (w.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and claims is not None:
            (claims / claim).mkdir(parents=True, exist_ok=True)
            (work / "workspaces" / w["name"]).symlink_to(claims / claim)
        else:
            (work / "workspaces" / w["name"]).mkdir()
    pending = list(spec["tasks"])
    done: dict[str, TaskRun] = {}
    ended: set[str] = set()  # run, skipped or never started (after a failure)
    stopped = False
    while pending:
        ready = [t for t in pending if all(a in ended for a in t.get("runAfter", []))]
        assert ready, "a runAfter cycle"
        for task in ready:
            pending.remove(task)
            ended.add(task["name"])
            if stopped:
                continue  # a failed task stops new tasks from starting
            run = _run_task(task, done, work, run_params)
            done[task["name"]] = run
            stopped = stopped or run.state == "failed"
    status = "Failed" if stopped else "Succeeded"
    for task in spec.get("finally", []):
        run = _run_task(task, done, work, run_params, status)
        done[task["name"]] = run
    return PipelineRun(status, done, run_params["context.pipelineRun.uid"])
