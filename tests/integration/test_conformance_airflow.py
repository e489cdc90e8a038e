"""Conformance programs run on Apache Airflow (``DAG.test()``), compared with the expected answers.

The answers are written by hand from docs/semantics.md (tests/conformance/expected.py).
Every program goes through
tests/conformance/airflow_runner.py in ONE ``.venv-airflow`` process: compiled
with :mod:`couler.compilers.airflow` (a rejection is reported as
``unsupported``), then run with ``dag.test()`` -- what ``airflow dags test``
does, without a CLI start-up per program -- under a per-program timeout. Its
summary per program (run state; per step state, try number and XCom outputs)
is compared with :func:`tests.conformance.harness.matches`. Known differences
are listed in ``AIRFLOW_DIFFERENCES`` (Airflow's task naming, or the semantics
exception they come from) and asserted, so a fix shows up as a failure to update
them.

The whole run takes 13-25 s on a busy 2-core machine (the first program pays
Airflow's in-process start-up, a few seconds; the others take well under 1 s
each).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import Any

import pytest

from couler.compilers import airflow
from couler.engines.base import Feature, Support
from tests.conformance import harness
from tests.conformance.expected import EXPECTED
from tests.conformance.loader import load_program, program_paths

PATHS = {p.stem: p for p in program_paths()}
PYTHON = harness.ROOT / ".venv-airflow" / "bin" / "python"
RUNNER = harness.HERE / "airflow_runner.py"
PROGRAM_TIMEOUT = 60  # seconds per program inside the runner (a hang costs one program)
RUN_TIMEOUT = 240  # seconds for the whole runner: the suite never waits longer


def _task_ids(answer: dict[str, Any], groups: tuple[str, ...]) -> dict[str, Any]:
    """``answer`` with Airflow's task ids: a sub-workflow is a TaskGroup (no task of its own)
    whose tasks are named GROUP.STEP -- naming, not semantics."""
    steps = {name.replace("/", "."): step for name, step in answer["steps"].items()
             if name not in groups}
    return {**answer, "steps": steps}


# Where Airflow's summary differs from the expected answers: how it names things (not a
# semantic difference), then the semantics exceptions, each named.
AIRFLOW_DIFFERENCES: dict[str, dict[str, Any]] = {
    # naming: the sub-workflows are TaskGroups (concurrent(subtasks=True) names the groups)
    "subworkflows": _task_ids(EXPECTED["subworkflows"], ("concurrent-task", "concurrent-task-2")),
    # naming: a static engine runs the study as rounds of ask / mapped trials / tell tasks,
    # then the best task under the tune step's name (couler.optimize.tune.expand_tune); the
    # tune step's and its dependent's answers are the expected ones.
    "tune": {**EXPECTED["tune"], "steps": {
        **EXPECTED["tune"]["steps"],
        **{f"trial-{kind}{i}": {"state": "succeeded"}
           for i in (0, 1) for kind in ("ask-", "", "tell-")}}},
    # E4 (docs/semantics.md): an errored edge is all_failed, so `on-error` runs after an
    # ordinary failure -- which then counts as handled (rule S7), so the run succeeds.
    # (`after-fan`, after the map `fan` that was not run, is not run: the runner reads the
    # mapped task's instances and the when-skip marks.)
    "unusual_edges": {**EXPECTED["unusual_edges"], "state": "succeeded", "steps": {
        **EXPECTED["unusual_edges"]["steps"], "on-error": {"state": "succeeded"}}},
}


@pytest.fixture(scope="module")
def airflow_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every program, compiled and run by the runner in one .venv-airflow process."""
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: run scripts/setup-engine-venv.sh airflow",
                    pytrace=False)
    work = tmp_path_factory.mktemp("airflow-conformance")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
           and not k.startswith("AIRFLOW")}
    proc = subprocess.Popen(
        [str(PYTHON), str(RUNNER), str(harness.ROOT), str(work), str(PROGRAM_TIMEOUT),
         *map(str, PATHS.values())],
        cwd=work, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the runner takes its running child down too
        stdout, stderr = proc.communicate()
        pytest.fail(f"the Airflow runner took over {RUN_TIMEOUT} s:\n{stderr[-4000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    line = next(ln for ln in stdout.splitlines() if ln.startswith("COULER-JSON "))
    runs: dict[str, Any] = json.loads(line.removeprefix("COULER-JSON "))
    return runs


def test_every_compiled_program_ran(airflow_runs: dict[str, Any]) -> None:
    assert sorted(airflow_runs) == sorted(PATHS)
    broken = {n: r for n, r in airflow_runs.items() if r["state"] in ("timeout", "error")}
    assert broken == {}
    ran = sorted(n for n, r in airflow_runs.items() if r["state"] != "unsupported")
    compiled = sorted(n for n, p in PATHS.items() if harness.compile_one(
        "airflow", "couler.compilers.airflow", load_program(p)).status == "compiled")
    assert ran == compiled and len(ran) >= 14, ran
    needs_cluster = sorted(n for n, r in airflow_runs.items() if r["state"] == "needs-cluster")
    assert needs_cluster == sorted(POD_PROGRAMS)


@pytest.mark.parametrize("program", sorted(PATHS))
def test_airflow_run_matches_expected(airflow_runs: dict[str, Any], program: str) -> None:
    actual = airflow_runs[program]
    if actual["state"] == "unsupported":
        # Rejected by the compiler for a feature its capability matrix declares unsupported,
        # the same way as in the main environment.
        cap = airflow.CAPABILITIES[Feature(actual["feature"])]
        assert cap.support is Support.UNSUPPORTED, actual
        outcome = harness.compile_one("airflow", "couler.compilers.airflow",
                                      load_program(PATHS[program]))
        assert (outcome.status, outcome.feature) == ("unsupported", actual["feature"])
        return
    if actual["state"] == "needs-cluster":
        # Kubernetes pod steps: loaded by DagBag, their operator fields checked below
        assert program in POD_PROGRAMS, actual
        return
    expected = AIRFLOW_DIFFERENCES.get(program, EXPECTED[program])
    assert harness.matches(expected, actual) == [], json.dumps(actual, indent=1)


# Programs whose steps ask for resources or placement (KubernetesPodOperator tasks, which
# dag.test() cannot run without a cluster) or run another workflow (a TriggerDagRunOperator
# task: the triggered run needs a scheduler). The runner loads them with Airflow's DagBag;
# these are the operator fields each must carry (a subset of what the runner reports).
POD_PROGRAMS: dict[str, dict[str, dict[str, Any]]] = {
    "job_step": {},  # a worker task creating the Job through the Kubernetes API
    "subworkflow_ref": {"child": {
        "trigger_dag_id": "conf-basic-steps", "wait_for_completion": True,
        "allowed_states": ["success"], "failed_states": ["failed"]}},
    "gpu": {"train": {
        "image": "python:3.12-alpine", "cmds": ["python3"],
        "arguments": ["-c", "print('gpu')"],
        "container_resources": {"limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                                "requests": {"cpu": "1", "memory": "1Gi"}}}},
    "oom_policies": {"train": {
        "retries": 2,
        "container_resources": {"limits": {"cpu": "1", "memory": "1Gi"},
                                "requests": {"cpu": "1", "memory": "1Gi"}}}},
    "resources_cache": {"compute": {
        "container_resources": {"requests": {"cpu": "500m", "memory": "256Mi"},
                                "limits": {"cpu": "500m", "memory": "256Mi"}},
        "do_xcom_push": True}},
    "placement": {"write": {
        "node_selector": {"pool": "cpu"},
        "tolerations": [{"effect": "NoSchedule", "key": "dedicated", "operator": "Equal",
                         "value": "ml"}],
        # the claim template, mounted by this step only, is the pod's ephemeral volume
        "volumes": [{"name": "workdir", "ephemeral": {"volume_claim_template": {"spec": {
            "access_modes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}}}}}],
        "volume_mounts": [{"mount_path": "/mnt/work", "name": "workdir"}],
        "do_xcom_push": True}},  # its output comes back through return.json
}


@pytest.mark.parametrize("program", sorted(POD_PROGRAMS))
def test_pod_steps_load_with_their_kubernetes_fields(airflow_runs: dict[str, Any],
                                                     program: str) -> None:
    actual = airflow_runs[program]
    assert actual["state"] == "needs-cluster", actual
    for task_id, fields in POD_PROGRAMS[program].items():
        pod = actual["pods"][task_id]
        assert {k: pod[k] for k in fields} == fields
    if program == "job_step":
        assert actual["tasks"] == ["k8s-job"] and actual["pods"] == {}


def test_pod_requests_are_built_by_the_provider(airflow_runs: dict[str, Any]) -> None:
    """The provider's own build_pod_request_obj turns the operator fields into a pod (a
    stub kube config, no cluster call): the placement reaches the pod spec."""
    gpu = airflow_runs["gpu"]["pods"]["train"]["built"]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["command"] == ["python3", "-c", "print('gpu')"]
    write = airflow_runs["placement"]["pods"]["write"]["built"]
    assert write["node_selector"] == {"pool": "cpu"}
    assert [t["key"] for t in write["tolerations"]] == ["dedicated"]
    assert write["volumes"] == ["workdir", "xcom"]  # xcom: the provider's sidecar volume
    assert write["mounts"] == ["/airflow/xcom", "/mnt/work"]


@pytest.mark.parametrize("program", sorted(AIRFLOW_DIFFERENCES))
def test_listed_differences_still_differ(airflow_runs: dict[str, Any], program: str) -> None:
    assert harness.matches(EXPECTED[program], airflow_runs[program]) != []


def test_a_handled_failure_does_not_fail_the_run(airflow_runs: dict[str, Any]) -> None:
    # Rule S7: edge_conditions: `broken` fails, its `failed` and `any` edges run handlers
    # that succeed, so no failure reaches a leaf and the run succeeds (the watcher decides).
    run = airflow_runs["edge_conditions"]
    assert run["state"] == "succeeded"
    assert run["steps"]["broken"]["state"] == "failed"
    assert run["steps"]["on-failure"] == {"state": "succeeded", "attempts": 1,
                                          "outputs": {"out": "recovering"}}
    assert airflow.EXIT_STATUS_TASK not in run["steps"]


def test_outputs_have_no_trailing_newline(airflow_runs: dict[str, Any]) -> None:
    # stdout (print) and path outputs (echo > FILE) both end in "\n"; XComs are stripped.
    outputs = [v for r in airflow_runs.values() for s in r.get("steps", {}).values()
               for v in s["outputs"].values()]
    assert len(outputs) >= 10
    assert not [v for v in outputs if v != v.strip()]
    assert airflow_runs["basic_steps"]["steps"]["produce"]["outputs"] == {"result": "hello"}
    assert airflow_runs["basic_steps"]["steps"]["shout"]["outputs"] == {"said": "hello world"}


def test_retries_are_counted(airflow_runs: dict[str, Any]) -> None:
    # `flaky` fails its first try; a retry without back-off would wait Airflow's default
    # 300 s (the runner sets default_task_retry_delay to 0, else it would time out).
    for program in ("retry_backoff", "retry_timeout"):
        run = airflow_runs[program]
        assert run["state"] == "succeeded", run
        assert run["steps"]["flaky"]["attempts"] == 2, run

