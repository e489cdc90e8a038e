"""Run conformance programs on Apache Airflow with ``DAG.test()``; runs inside ``.venv-airflow``.

Usage::

    .venv-airflow/bin/python tests/conformance/airflow_runner.py ROOT WORK TIMEOUT PROGRAM.py...

One Python process does everything: it points ``AIRFLOW_HOME`` at ``WORK/home``,
creates the SQLite metadata DB once (in process, no ``airflow db migrate``
subprocess), stores the conformance secrets as Airflow Variables, then for
every program compiles it with :mod:`couler.compilers.airflow`, writes the DAG
file and runs it with ``dag.test()`` -- Airflow's own test runner, the one
``airflow dags test`` calls, which runs each task in process. The runs happen
in a forked child, in order, each in its own working directory; a run still
going after ``TIMEOUT`` seconds is killed with the child's process group (the
steps' subprocesses too) and a new child goes on with the next program: a hang
or a crash costs one program, not the suite. Only the first run of a child
pays Airflow's start-up of its in-process execution API (a few seconds); the
others take well under a second. SIGTERM (the test's overall timeout) kills
the running child as well.

It prints one line, ``COULER-JSON {program: summary}``, each summary shaped
like ``tests.conformance.harness.summarize`` (run state; per step state,
attempts and outputs) or ``{"state": "unsupported", "feature": ...}`` when the
compiler rejects the program, ``{"state": "timeout"}`` / ``{"state":
"error", ...}`` otherwise.

Why the earlier ``airflow dags test`` loop took minutes: each CLI call starts
Airflow anew (seconds each), and ``retry_timeout`` retried without a back-off,
for which Airflow waited its default ``retry_delay`` of 300 s -- ``dag.test()``
sleeps through it. The compiler now emits ``retry_delay=0`` for a retry without
a back-off (as the local engine and Argo behave); a back-off's own delays are
kept (``retry_backoff``: 0.1 s, which Airflow rounds up to 1 s).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# Airflow reads its configuration when first imported: set it before any airflow import.
ROOT, WORK, TIMEOUT = Path(sys.argv[1]), Path(sys.argv[2]).resolve(), float(sys.argv[3])
os.environ.update(
    AIRFLOW_HOME=str(WORK / "home"),
    AIRFLOW__CORE__DAGS_FOLDER=str(WORK / "dags"),
    AIRFLOW__CORE__LOAD_EXAMPLES="False",
    AIRFLOW__LOGGING__LOGGING_LEVEL="WARNING",
)
sys.path.insert(0, str(ROOT))
# this checkout's couler, not the one .venv-airflow may have installed (editable, elsewhere)
sys.path[:0] = sorted(str(p) for p in (ROOT / "libs").glob("*/src"))

from couler import ir  # noqa: E402
from couler.compilers import airflow as compiler  # noqa: E402
from couler.errors import UnsupportedFeatureError  # noqa: E402
from tests.conformance.harness import LOCAL_SECRETS  # noqa: E402
from tests.conformance.loader import load_program  # noqa: E402

# Airflow task states -> couler StepState values. upstream_failed: a dependency's edge
# condition was not met, which the local engine reports as skipped.
STATES = {"success": "succeeded", "failed": "failed", "skipped": "skipped",
          "upstream_failed": "skipped", "removed": "skipped", "up_for_retry": "retrying",
          "running": "running", "queued": "pending", "scheduled": "pending", "None": "pending"}
RUN_STATES = {"success": "succeeded", "failed": "failed", "running": "running",
              "queued": "pending"}


def _text(value: Any) -> str:
    """An output as the local engine reports it (text; a decoded list back as JSON)."""
    return value if isinstance(value, str) else json.dumps(value)


def summarize(wf: ir.Workflow, dag_run: Any) -> dict[str, Any]:
    """The run's state and, per step, its state, attempts (try number) and XCom outputs."""
    from airflow import settings
    from airflow.models.xcom import XComModel

    with settings.Session() as session:
        tis = list(dag_run.get_task_instances(session=session))
        rows = session.query(XComModel).filter(XComModel.dag_id == dag_run.dag_id,
                                               XComModel.run_id == dag_run.run_id).all()
        xcoms = {(x.task_id, x.map_index, x.key): XComModel.deserialize_value(x) for x in rows}
    by_task: dict[str, list[Any]] = {}
    for ti in tis:
        by_task.setdefault(ti.task_id, []).append(ti)
    steps: dict[str, Any] = {}
    for task_id, instances in by_task.items():
        instances.sort(key=lambda ti: ti.map_index)
        states = [STATES.get(str(ti.state), str(ti.state)) for ti in instances]
        if task_id == compiler.EXIT_STATUS_TASK or task_id.endswith(compiler.ITEMS_SUFFIX):
            continue  # compiler helpers, not workflow steps
        if len(set(states)) == 1:
            state = states[0]
        else:
            state = "failed" if "failed" in states else "succeeded"
        keys = sorted({k for (t, _, k) in xcoms  # the when-skip mark is not an output
                       if t == task_id and k not in ("return_value", compiler.WHEN_SKIP_KEY)})
        outputs: dict[str, str] = {}
        for key in keys:
            values = [xcoms.get((task_id, ti.map_index, key)) for ti in instances]
            if instances[0].map_index >= 0:  # mapped: the JSON list of per-item values
                outputs[key] = json.dumps([_text(v) for v in values])
            else:
                outputs[key] = _text(values[0])
        steps[task_id] = {"state": state, "outputs": outputs,
                          "attempts": max(ti.try_number for ti in instances)}
    state = str(dag_run.state)
    return {"state": RUN_STATES.get(state, state), "steps": dict(sorted(steps.items()))}


def _plain(value: Any) -> Any:
    """A Kubernetes model (or a list of them) as plain JSON data, None fields left out."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        value = to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    return value


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: stub, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: stub, user: {token: stub}}]
contexts: [{name: stub, context: {cluster: stub, user: stub}}]
current-context: stub
"""
POD_FIELDS = ("image", "cmds", "arguments", "container_resources", "node_selector",
              "tolerations", "volumes", "volume_mounts", "retries", "do_xcom_push")
TRIGGER_FIELDS = ("trigger_dag_id", "wait_for_completion", "allowed_states", "failed_states")


def _built(task: Any) -> dict[str, Any]:
    """The pod the operator would create, built by the provider itself (no cluster call:
    KUBECONFIG points at a stub): its placement and its base container."""
    pod = task.build_pod_request_obj()
    (base,) = [c for c in pod.spec.containers if c.name == "base"]
    return {"node_selector": pod.spec.node_selector or {},
            "tolerations": _plain(pod.spec.tolerations or []),
            "volumes": sorted(v.name for v in pod.spec.volumes or []),
            "image": base.image, "command": [*(base.command or []), *(base.args or [])],
            "resources": _plain(base.resources) if base.resources else {},
            "mounts": sorted(m.mount_path for m in base.volume_mounts or [])}


def pod_summary(dag_file: Path) -> dict[str, Any]:
    """A DAG with Kubernetes pod or job steps or sub-workflow references, loaded by
    Airflow's DagBag (dag.test() cannot start pods or create resources without a cluster,
    nor run a triggered DAG without a scheduler): its import errors and each pod or
    trigger task's operator fields."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dag_file))
    if bag.import_errors:
        return {"state": "error", "error": json.dumps({str(k): str(v) for k, v in
                                                       bag.import_errors.items()})[-2000:]}
    (dag,) = bag.dags.values()
    pods = {t.task_id: {**{f: _plain(getattr(t, f)) for f in POD_FIELDS},
                        "built": _built(t)}
            for t in dag.tasks if type(t).__name__ == "_CoulerPod"}
    pods.update({t.task_id: {f: _plain(getattr(t, f)) for f in TRIGGER_FIELDS}
                 for t in dag.tasks if type(t).__name__ == "_CoulerTrigger"})
    return {"state": "needs-cluster", "pods": pods,
            "tasks": sorted(t.task_id for t in dag.tasks)}


def run_one(name: str, wf: ir.Workflow, source: str) -> dict[str, Any]:
    """Run one compiled program with ``dag.test()`` in a fresh directory: its summary."""
    dag_file = WORK / "dags" / f"{name}.py"
    dag_file.write_text(source, encoding="utf-8")
    if any(mark in source for mark in ("= _CoulerPod(", "= _CoulerTrigger(",
                                        '_KINDS["job"] = _couler_job')):
        try:
            return pod_summary(dag_file)
        finally:
            dag_file.unlink()
    cwd = WORK / "runs" / name
    cwd.mkdir(parents=True)
    os.chdir(cwd)  # programs write relative files (retry markers)
    try:
        spec = importlib.util.spec_from_file_location(f"couler_dag_{name}", dag_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return summarize(wf, module.dag.test())
    except Exception as exc:  # reported in the summary
        return {"state": "error", "error": f"{type(exc).__name__}: {exc}"[-2000:],
                "trace": traceback.format_exc()[-4000:]}
    finally:
        dag_file.unlink()  # dag.test() re-parses the whole DAG folder: keep it to one file


_PR_SET_PDEATHSIG = 1


def _terminate(child_pid: int, signum: int, frame: object) -> None:
    """SIGTERM (the test's overall timeout): take the running child's group down too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child_pid, signal.SIGKILL)
    os._exit(128 + signum)


def _write(path: Path, text: str) -> None:
    """Write atomically: the parent polls these files and must never read half of one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.rename(path)


def child(jobs: list[tuple[str, ir.Workflow, str]]) -> None:
    """In a forked child: run the jobs in order, leaving a start stamp and a summary each."""
    from airflow import settings

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler
    os.setpgid(0, 0)  # the parent kills the whole group (steps' subprocesses too) on timeout
    with contextlib.suppress(OSError, AttributeError):  # Linux: die with the parent
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    settings.engine.dispose(close=False)  # never share the parent's DB connections
    for name, wf, source in jobs:
        started = time.time()
        _write(WORK / "results" / f"{name}.started", str(started))
        summary = run_one(name, wf, source)
        summary["seconds"] = round(time.time() - started, 2)
        _write(WORK / "results" / f"{name}.json", json.dumps(summary))


def run_all(jobs: list[tuple[str, ir.Workflow, str]]) -> dict[str, Any]:
    """Run the jobs in one forked child; a job over TIMEOUT is killed, a new child goes on.

    The child pays Airflow's first-run warm-up (the in-process execution API, a few
    seconds) once for all programs; forking keeps the parent free of the threads
    ``dag.test()`` starts, so it can fork again after a kill.
    """
    results: dict[str, Any] = {}
    pending = list(jobs)
    while pending:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                child(pending)
            except BaseException:  # the parent reports the missing summary
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        with contextlib.suppress(OSError):  # also here: no window where the group is missing
            os.setpgid(pid, pid)
        signal.signal(signal.SIGTERM, functools.partial(_terminate, pid))
        progress = time.time()  # the current job started at its stamp, or at the latest here
        while pending:
            exited = os.waitpid(pid, os.WNOHANG)[0] != 0
            while pending and (WORK / "results" / f"{pending[0][0]}.json").exists():
                name = pending.pop(0)[0]
                results[name] = json.loads((WORK / "results" / f"{name}.json").read_text())
                progress = time.time()
            if not pending:
                if not exited:
                    os.waitpid(pid, 0)
                break
            name = pending[0][0]
            stamp = WORK / "results" / f"{name}.started"
            started = float(stamp.read_text()) if stamp.exists() else progress
            if exited:
                results[name] = {"state": "error", "error": "the runner died without a summary"}
            elif time.time() - started > TIMEOUT:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                results[name] = {"state": "timeout", "error": f"no result after {TIMEOUT:g} s"}
            else:
                time.sleep(0.05)
                continue
            pending.pop(0)
            break  # fork a new child for the rest
    return results


def main(paths: list[Path]) -> dict[str, Any]:
    from airflow.models.variable import Variable
    from airflow.utils import db

    for sub in ("home", "dags", "runs", "results"):
        (WORK / sub).mkdir(parents=True, exist_ok=True)
    db.initdb()
    for (secret, key), value in LOCAL_SECRETS.items():
        Variable.set(f"{secret}/{key}", value)  # what the compiled Variable.get reads
    # programs/tune.py: its ask/tell/best tasks find the study's database in this secret
    # and run `python -m couler_runtime.tune`, which the main environment has (optuna)
    Variable.set("couler-tune/url", f"sqlite:///{WORK / 'tune.db'}")
    # programs/artifacts.py: the artifact store, a local directory of this run
    Variable.set(compiler.ARTIFACT_ROOT_VARIABLE, f"file://{WORK / 'artifacts'}")
    # pod steps: the provider builds each pod request from a stub cluster (never contacted)
    (WORK / "kubeconfig").write_text(KUBECONFIG, encoding="utf-8")
    os.environ["KUBECONFIG"] = str(WORK / "kubeconfig")
    main_bin = ROOT / ".venv" / "bin"
    if main_bin.is_dir():
        os.environ["PATH"] = f"{main_bin}{os.pathsep}{os.environ.get('PATH', '')}"
    out: dict[str, Any] = {}
    jobs: list[tuple[str, ir.Workflow, str]] = []
    for path in paths:
        name, wf = path.stem, load_program(path)
        try:
            jobs.append((name, wf, compiler.compile_workflow(wf)))
        except UnsupportedFeatureError as exc:
            out[name] = {"state": "unsupported", "feature": exc.feature}
    out.update(run_all(jobs))
    return dict(sorted(out.items()))

if __name__ == "__main__":
    print("COULER-JSON " + json.dumps(main([Path(p) for p in sys.argv[4:]])), flush=True)
