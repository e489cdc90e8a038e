"""The KFP adapter against a stand-in KFP API server (tests/kfp_fake.py).

No KFP server can run here (it needs Kubernetes, Argo Workflows and MySQL): the fake
speaks the REST v2beta1 endpoints that the real ``kfp.Client`` calls, and the tests play
the KFP backend by changing the stored runs. Pod logs come from the stand-in Kubernetes
API server (tests/k8s_fake.py) through the real ``kubernetes`` client.

kfp pins protobuf < 7, so it lives in ``.venv-kfp``: the scenarios that use the SDK run
there in one subprocess (``SCENARIOS`` below) and report what they saw as JSON, which the
tests here assert on. The state mapping (:func:`couler_runtime.kfp.run_status`) needs no
SDK and is tested directly. A missing ``.venv-kfp`` is a failure, never a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from couler.engines.base import RunState, StepState, StepStatus
from couler_runtime.kfp import run_status

ROOT = Path(__file__).resolve().parents[2]
KFP_PYTHON = ROOT / ".venv-kfp" / "bin" / "python"

# Runs inside .venv-kfp with the repository root as working directory.
SCENARIOS = r'''
import dataclasses, json, sys, traceback
sys.path.insert(0, ".")
from kubernetes import client as k8s_client
from couler import ir
from couler.api.handles import SecretMaterial
from couler.compilers.kfp import compile_workflow
from couler.engines.base import EngineAdapter
from couler_runtime.kfp import KfpAdapter
import couler_runtime.kfp.adapter as kfp_adapter
from tests.k8s_fake import FakeKube
from tests.kfp_fake import FakeKfp

def workflow():
    extract = ir.Step(name="extract", body=ir.ContainerSpec(image="alpine", command=("echo", "42")))
    load = ir.Step(name="load", body=ir.ContainerSpec(image="alpine", command=("true",)),
                   dependencies=(ir.Dependency("extract"),), retry=ir.RetryPolicy(limit=2))
    return ir.Workflow(name="etl", steps=(extract, load))

def status_doc(st):
    doc = dataclasses.asdict(st)
    doc["state"] = st.state.value
    doc["steps"] = [{**dataclasses.asdict(s), "state": s.state.value} for s in st.steps]
    return doc

def error(fn):
    try:
        fn()
    except Exception as e:
        return {"type": type(e).__name__, "bases": [c.__name__ for c in type(e).__mro__],
                "message": str(e)}
    return None

def requests(fake):
    return [{"method": r.method, "path": r.path, "query": r.query} for r in fake.requests]

T = "2024-05-01T10:00:%02dZ"

def task(name, state, sec, *, pod="", history=(), error=None, end=None):
    t = {"run_id": "r", "task_id": f"{name}-{sec}", "display_name": name, "state": state,
         "create_time": T % sec, "start_time": T % sec}
    if pod:
        t["pod_name"] = pod
    if end is not None:
        t["end_time"] = T % end
    if history:
        t["state_history"] = [{"update_time": T % sec, "state": s} for s in history]
    if error:
        t["error"] = {"code": 2, "message": error}
    return t

out = {}
with FakeKfp(token="T") as kfp, FakeKube(token="K") as kube:
    adapter = KfpAdapter(kfp.url, existing_token="T")
    out["protocol"] = isinstance(adapter, EngineAdapter)
    out["healthz_asked"] = any(r.path == "/apis/v2beta1/healthz" for r in kfp.requests)

    # submit
    wf = workflow()
    run_id = adapter.submit(wf)
    stored = kfp.get(run_id)
    out["submit"] = {"run_id": run_id, "display_name": stored["display_name"],
                     "description": stored.get("description"),
                     "experiment_id": stored["experiment_id"],
                     "spec_is_compiled": stored["pipeline_spec"] == compile_workflow(wf),
                     "status": status_doc(adapter.status(run_id))}

    # idempotency
    before = len(kfp.requests)
    first = adapter.submit(wf, idempotency_key="order-1234")
    again = adapter.submit(wf, idempotency_key="order-1234")
    other = adapter.submit(wf, idempotency_key="order-5678")
    out["idempotency"] = {"first": first, "again": again, "other": other,
                          "description": kfp.get(first)["description"],
                          "requests": requests(kfp)[before:], "runs": len(kfp.runs)}

    # an experiment
    in_exp = KfpAdapter(kfp.url, existing_token="T", experiment_id="exp-1")
    before = len(kfp.requests)
    exp_run = in_exp.submit(wf, idempotency_key="order-1234")  # another experiment: new run
    out["experiment"] = {"run": exp_run, "experiment_id": kfp.get(exp_run)["experiment_id"],
                         "requests": requests(kfp)[before:],
                         "again": in_exp.submit(wf, idempotency_key="order-1234")}

    # status of a realistic run
    spec = kfp.get(run_id)["pipeline_spec"]
    def finished(run):
        run["state"] = "FAILED"
        run["finished_at"] = T % 50
        run["error"] = {"code": 2, "message": "task 'load' failed"}
        run["run_details"] = {"task_details": [
            task("root", "FAILED", 1), task("root-driver", "SUCCEEDED", 1),
            task("extract-driver", "SUCCEEDED", 2),
            task("extract", "SUCCEEDED", 3, pod="etl-abc-extract-pod", end=10,
                 history=("PENDING", "RUNNING", "SUCCEEDED")),
            task("load", "FAILED", 11, pod="etl-abc-load-pod", end=40,
                 history=("PENDING", "RUNNING", "FAILED", "RUNNING", "FAILED", "RUNNING",
                          "FAILED"), error="exit status 2"),
        ]}
    kfp.update(run_id, finished)
    out["realistic"] = status_doc(adapter.status(run_id))

    # watch: the backend moves the run on just before the poller's 2nd and 3rd reads
    # (FakeKfp.before: deterministic, no sleeps)
    watched = adapter.submit(wf)
    poller = KfpAdapter(kfp.url, existing_token="T", poll_interval=0.05)
    def finish():
        kfp.update(watched, lambda r: r.update(state="SUCCEEDED", finished_at=T % 59))
    def start():
        kfp.update(watched, lambda r: r.update(state="RUNNING"))
        kfp.before("GET", watched, finish)
    kfp.before("GET", watched, start, skip=1)
    before = len(kfp.requests)
    out["watch"] = [s.state.value for s in poller.watch(watched, timeout=10)]
    out["watch_polls"] = len(kfp.requests) - before
    out["watch_finished"] = [s.state.value for s in poller.watch(watched)]
    stuck = adapter.submit(wf)
    kfp.update(stuck, lambda r: r.update(state="RUNNING"))
    seen = poller.watch(stuck, timeout=0.3)
    next(seen)
    out["watch_timeout"] = error(lambda: next(seen))

    # cancel
    cancelled = adapter.submit(wf)
    kfp.update(cancelled, lambda r: r.update(state="RUNNING"))
    adapter.cancel(cancelled)
    out["cancel_request"] = requests(kfp)[-1]
    out["cancel_canceling"] = adapter.status(cancelled).state.value
    def canceled(run):
        run["state"] = "CANCELED"
        run["run_details"] = {"task_details": [
            task("extract", "FAILED", 3, pod="p", error="pod deleted")]}
    def terminates():
        return len([r for r in kfp.requests if r.path.endswith(":terminate")])
    before = terminates()
    out["cancel_while_canceling"] = error(lambda: adapter.cancel(cancelled))
    out["cancel_while_canceling_terminates"] = terminates() - before
    kfp.update(cancelled, canceled)
    out["cancel_done"] = status_doc(adapter.status(cancelled))
    before = terminates()
    adapter.cancel(cancelled)
    out["cancel_again_terminates"] = terminates() - before
    # the run finishes between the adapter's read and its terminate: the server refuses
    raced = adapter.submit(wf)
    kfp.update(raced, lambda r: r.update(state="RUNNING"))
    kfp.before("POST", raced + ":terminate",
               lambda: kfp.update(raced, lambda r: r.update(state="SUCCEEDED")))
    before = terminates()
    out["cancel_raced"] = {"error": error(lambda: adapter.cancel(raced)),
                           "terminates": terminates() - before,
                           "state": adapter.status(raced).state.value}
    # what the server answers to terminating a finished run, and what the backend refuses
    import urllib.request, urllib.error
    refused = urllib.request.Request(f"{kfp.url}/apis/v2beta1/runs/{raced}:terminate",
                                     data=b"{}", method="POST",
                                     headers={"Authorization": "Bearer T"})
    try:
        urllib.request.urlopen(refused)
        out["terminate_finished"] = None
    except urllib.error.HTTPError as e:
        out["terminate_finished"] = {"status": e.code, "body": json.loads(e.read())}
    out["backwards"] = error(lambda: kfp.update(raced, lambda r: r.update(state="RUNNING")))

    # logs, through the Kubernetes API
    cfg = k8s_client.Configuration(host=kube.url)
    cfg.api_key = {"authorization": "Bearer K"}
    cfg.retries = 0
    logs = KfpAdapter(kfp.url, existing_token="T", pod_namespace="kubeflow",
                      kube_api_client=k8s_client.ApiClient(cfg))
    kube.set_log("kubeflow", "etl-abc-extract-pod", "42\n")
    out["logs"] = logs.logs(run_id, "extract")
    out["logs_request"] = {"path": kube.requests[-1].path, "query": kube.requests[-1].query}
    out["logs_no_step"] = error(lambda: logs.logs(run_id, "nope"))
    out["logs_pod_gone"] = error(lambda: logs.logs(run_id, "load"))
    kfp.update(watched, lambda r: r.update(run_details={"task_details": [
        task("extract", "PENDING", 3)]}))
    out["logs_no_pod"] = error(lambda: logs.logs(watched, "extract"))

    # errors
    out["not_found"] = {
        "status": error(lambda: adapter.status("ghost")),
        "cancel": error(lambda: adapter.cancel("ghost")),
        "logs": error(lambda: adapter.logs("ghost", "extract")),
    }
    out["wrong_token"] = error(lambda: KfpAdapter(kfp.url, existing_token="wrong",
                                                  namespace="team-a").status(run_id))
    out["unreachable"] = error(lambda: KfpAdapter("http://127.0.0.1:1", existing_token="T",
                                                  namespace="team-a").status("x"))
    real_compile = kfp_adapter.compile_workflow
    def broken(wf):
        spec = real_compile(wf)
        del spec["root"]
        return spec
    kfp_adapter.compile_workflow = broken
    out["invalid_spec"] = error(lambda: adapter.submit(wf))
    def misspelt(wf):
        spec = real_compile(wf)
        spec["root"]["dag"]["tasks"]["load"]["retryPolicy"]["maxRetryCount"] = "two"
        spec["root"]["dag"]["tasks"]["extract"]["cachingOption"] = {}
        return spec
    kfp_adapter.compile_workflow = misspelt
    out["misspelt_spec"] = error(lambda: adapter.submit(wf))
    def dangling(wf):
        spec = real_compile(wf)
        spec["root"]["dag"]["tasks"]["load"]["componentRef"]["name"] = "comp-nowhere"
        spec["root"]["dag"]["tasks"]["load"]["dependentTasks"] = ["extrakt"]
        return spec
    kfp_adapter.compile_workflow = dangling
    out["dangling_spec"] = error(lambda: adapter.submit(wf))
    kfp_adapter.compile_workflow = real_compile
    out["invalid_spec_runs"] = len(kfp.runs) - len(
        [r for r in kfp.runs.values() if "pipeline_spec" in r])  # none were stored
    secret = SecretMaterial("creds", "kubeflow", {"k": "v"}, dry_run=False, use_existing=False)
    runs = len(kfp.runs)
    out["secrets"] = error(lambda: adapter.submit(wf, [secret]))
    out["secrets_created_runs"] = len(kfp.runs) - runs

    # Kubernetes settings (an existing secret as env, a timeout): the PlatformSpec goes
    # along, in kfp.Client's {"pipeline_spec", "platform_spec"} form
    env = (ir.EnvVar("TOKEN", secret=ir.SecretRef("creds", "token")),)
    k8s_wf = ir.Workflow(name="k8s", steps=(ir.Step(
        name="use", body=ir.ContainerSpec(image="alpine", command=("true",)), env=env,
        timeout_seconds=90),))
    # a cron schedule: a recurring run of the compiled spec
    cron_wf = ir.Workflow(name="nightly", steps=workflow().steps, schedule=ir.CronSchedule(
        "*/30 * * * *", concurrency_policy=ir.ConcurrencyPolicy.FORBID))
    runs_before = len(kfp.runs)
    rec_id = adapter.submit(cron_wf)
    again = adapter.submit(cron_wf, idempotency_key="nightly-1")
    same = adapter.submit(cron_wf, idempotency_key="nightly-1")
    rec = kfp.recurring_runs[rec_id]
    replace = ir.Workflow(name="nightly", steps=workflow().steps, schedule=ir.CronSchedule(
        "0 2 * * *", concurrency_policy=ir.ConcurrencyPolicy.REPLACE))
    out["recurring"] = {
        "id": rec_id, "again": again, "same": same, "count": len(kfp.recurring_runs),
        "runs_created": len(kfp.runs) - runs_before,
        "cron": rec["trigger"]["cron_schedule"]["cron"],
        "max_concurrency": rec["max_concurrency"], "mode": rec["mode"],
        "status": rec["status"], "display_name": rec["display_name"],
        "spec_is_compiled": rec["pipeline_spec"] == compile_workflow(cron_wf),
        "replace": error(lambda: adapter.submit(replace))}

    sent = kfp.get(adapter.submit(k8s_wf))["pipeline_spec"]
    compiled = compile_workflow(k8s_wf)
    out["platform_run"] = {
        "keys": sorted(sent),
        "spec_is_compiled": sent["pipeline_spec"] == {k: v for k, v in compiled.items()
                                                      if k != "platforms"},
        "executor": sent["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"][
            "executors"]["exec-use"]}

print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not KFP_PYTHON.exists():
        pytest.fail(f"{KFP_PYTHON} is missing: run scripts/setup-engine-venv.sh kfp "
                    "(kfp needs its own environment, it pins protobuf < 7)")
    tmp = tmp_path_factory.mktemp("kfp-adapter")
    script = tmp / "scenarios.py"
    script.write_text(SCENARIOS)
    # kfp.Client reads (and may write) ~/.config/kfp/context.json: keep it out of HOME.
    env = {**os.environ, "HOME": str(tmp)}
    proc = subprocess.run([str(KFP_PYTHON), str(script)], capture_output=True, text=True,
                          check=False, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# --------------------------------------------------------------------------- with kfp.Client


def test_constructed_adapter_is_an_engine_adapter(seen: dict[str, Any]) -> None:
    assert seen["protocol"] is True
    assert seen["healthz_asked"] is True  # kfp.Client() checked the server first


def test_submit_creates_a_run_of_the_compiled_spec(seen: dict[str, Any]) -> None:
    sub = seen["submit"]
    assert sub["spec_is_compiled"] is True
    assert sub["display_name"] == "etl"
    assert sub["description"] is None  # no idempotency key
    assert sub["experiment_id"] == "0b8e7d3a-0000-4000-8000-000000000001"  # the default
    assert sub["status"]["state"] == "pending"
    assert (sub["status"]["run_id"], sub["status"]["workflow"]) == (sub["run_id"], "etl")


def test_idempotent_resubmit_returns_the_same_run(seen: dict[str, Any]) -> None:
    idem = seen["idempotency"]
    assert idem["again"] == idem["first"]
    assert idem["other"] != idem["first"]
    assert idem["description"] == "couler.io/idempotency-key=order-1234"
    assert idem["runs"] == 3  # the plain submit, order-1234, order-5678
    calls = [(r["method"], r["path"]) for r in idem["requests"]]
    runs = "/apis/v2beta1/runs"
    assert calls == [("GET", runs), ("POST", runs),  # first: lookup, create
                     ("GET", runs),  # again: lookup only
                     ("GET", runs), ("POST", runs)]  # other key
    lookup = idem["requests"][0]["query"]
    assert json.loads(lookup["filter"]) == {"predicates": [{
        "operation": "EQUALS", "key": "description",
        "stringValue": "couler.io/idempotency-key=order-1234"}]}


def test_runs_go_to_the_adapters_experiment(seen: dict[str, Any]) -> None:
    exp = seen["experiment"]
    assert exp["experiment_id"] == "exp-1"
    assert exp["again"] == exp["run"]
    assert exp["run"] != seen["idempotency"]["first"]  # the lookup is per experiment
    assert exp["requests"][0]["query"]["experiment_id"] == "exp-1"


def test_status_of_a_realistic_run(seen: dict[str, Any]) -> None:
    st = seen["realistic"]
    assert (st["state"], st["message"]) == ("failed", "task 'load' failed")
    assert st["finished_at"] is not None
    # Drivers and the root DAG are not steps.
    steps = {s["step"]: s for s in st["steps"]}
    assert list(steps) == ["extract", "load"]
    assert (steps["extract"]["state"], steps["extract"]["attempts"]) == ("succeeded", 1)
    assert steps["extract"]["finished_at"] - steps["extract"]["started_at"] == 7
    load = steps["load"]
    assert (load["state"], load["attempts"], load["message"]) == ("failed", 3, "exit status 2")


def test_watch_polls_until_the_run_ends(seen: dict[str, Any]) -> None:
    assert seen["watch"] == ["pending", "running", "succeeded"]
    assert seen["watch_polls"] >= 3
    assert seen["watch_finished"] == ["succeeded"]
    timeout = seen["watch_timeout"]
    assert timeout["type"] == "OperationTimeoutError"
    assert "RetryableError" in timeout["bases"]
    assert "not finished after 0.3 s (last state running)" in timeout["message"]


def test_cancel_terminates_the_run(seen: dict[str, Any]) -> None:
    req = seen["cancel_request"]
    assert req["method"] == "POST"
    assert req["path"].startswith("/apis/v2beta1/runs/") and req["path"].endswith(":terminate")
    assert seen["cancel_canceling"] == "running"  # CANCELING: not over yet
    done = seen["cancel_done"]
    assert done["state"] == "cancelled"
    assert done["steps"][0]["state"] == "cancelled"  # failed because the run was cancelled
    assert seen["cancel_again_terminates"] == 0  # a finished run is left alone
    # cancelling twice: the second finds it CANCELING and sends nothing (the server would
    # refuse: only a pending or running run can be terminated)
    assert seen["cancel_while_canceling"] is None
    assert seen["cancel_while_canceling_terminates"] == 0


def test_cancel_of_a_run_that_finished_meanwhile_is_no_error(seen: dict[str, Any]) -> None:
    """The backend finished the run between the adapter's read and its terminate: the API
    server refuses the terminate (400), and the adapter, reading the run again, leaves it
    finished instead of failing the cancel."""
    assert seen["cancel_raced"] == {"error": None, "terminates": 1, "state": "succeeded"}


def test_the_fake_refuses_what_the_kfp_api_refuses(seen: dict[str, Any]) -> None:
    refused = seen["terminate_finished"]
    assert refused["status"] == 400
    assert refused["body"]["code"] == 3  # INVALID_ARGUMENT
    assert "Failed to terminate a run" in refused["body"]["message"]
    backwards = seen["backwards"]
    assert backwards["type"] == "ValueError"
    assert "never changes a run from SUCCEEDED to RUNNING" in backwards["message"]


def test_logs_come_from_the_pod(seen: dict[str, Any]) -> None:
    assert seen["logs"] == "42\n"
    assert seen["logs_request"] == {
        "path": "/api/v1/namespaces/kubeflow/pods/etl-abc-extract-pod/log",
        "query": {"container": "main"}}
    assert seen["logs_no_step"]["type"] == "NotFoundError"
    assert "no step 'nope'" in seen["logs_no_step"]["message"]
    gone = seen["logs_pod_gone"]
    assert gone["type"] == "NotFoundError"
    assert "etl-abc-load-pod" in gone["message"]
    assert seen["logs_no_pod"]["type"] == "NotFoundError"
    assert "has no pod (state PENDING)" in seen["logs_no_pod"]["message"]


def test_errors_are_translated(seen: dict[str, Any]) -> None:
    for op, err in seen["not_found"].items():
        assert err["type"] == "NotFoundError", op
        assert "run 'ghost'" in err["message"], op
    assert seen["wrong_token"]["type"] == "UserError"
    assert "401" in seen["wrong_token"]["message"]
    unreachable = seen["unreachable"]
    assert unreachable["type"] == "RetryableError"
    assert "cannot reach the KFP API server" in unreachable["message"]
    invalid = seen["invalid_spec"]
    assert invalid["type"] == "UserError"
    assert "workflow 'etl'" in invalid["message"]
    assert "400" in invalid["message"] and "no root DAG" in invalid["message"]
    misspelt = seen["misspelt_spec"]  # parsed with the kfp SDK's PipelineSpec proto
    assert misspelt["type"] == "UserError"
    assert "workflow 'etl'" in misspelt["message"] and "400" in misspelt["message"]
    assert "maxRetryCount" in misspelt["message"] or "cachingOption" in misspelt["message"]
    dangling = seen["dangling_spec"]
    assert dangling["type"] == "UserError"
    assert "no component 'comp-nowhere'" in dangling["message"]
    assert "no task 'extrakt'" in dangling["message"]
    assert seen["invalid_spec_runs"] == 0
    assert seen["secrets"]["type"] == "UserError"
    assert "creates no secrets (creds)" in seen["secrets"]["message"]
    assert seen["secrets_created_runs"] == 0


# --------------------------------------------------------------------------- state mapping


SPEC = {  # the shape compile_workflow gives: container tasks, one inside a ParallelFor
    "components": {
        "comp-extract": {"executorLabel": "exec-extract"},
        "comp-fan": {"executorLabel": "exec-fan"},
        "comp-for-loop-2": {"dag": {"tasks": {"fan": {
            "componentRef": {"name": "comp-fan"}, "taskInfo": {"name": "fan"}}}}},
    },
    "root": {"dag": {"tasks": {
        "extract": {"componentRef": {"name": "comp-extract"}, "taskInfo": {"name": "extract"}},
        "for-loop-2": {"componentRef": {"name": "comp-for-loop-2"},
                       "taskInfo": {"name": "for-loop-2"}},
    }}},
}


def detail(name: str, state: str, second: int, **extra: Any) -> dict[str, Any]:
    return {"display_name": name, "state": state, "task_id": f"{name}-{second}",
            "create_time": f"2024-05-01T10:00:{second:02d}Z",
            "start_time": f"2024-05-01T10:00:{second:02d}Z", **extra}


def by_step(steps: tuple[StepStatus, ...], step: str, key: str = "") -> StepStatus:
    return next(s for s in steps if s.step == step and s.key == key)


@pytest.mark.parametrize(("state", "expected"), [
    (None, RunState.PENDING), ("RUNTIME_STATE_UNSPECIFIED", RunState.PENDING),
    ("PENDING", RunState.PENDING), ("RUNNING", RunState.RUNNING),
    ("PAUSED", RunState.RUNNING), ("CANCELING", RunState.RUNNING),
    ("SUCCEEDED", RunState.SUCCEEDED), ("SKIPPED", RunState.SUCCEEDED),
    ("FAILED", RunState.FAILED), ("CANCELED", RunState.CANCELLED),
])
def test_run_states(state: str | None, expected: RunState) -> None:
    st = run_status({"run_id": "r1", "display_name": "etl", "state": state})
    assert (st.run_id, st.workflow, st.state) == ("r1", "etl", expected)


@pytest.mark.parametrize(("state", "expected"), [
    ("PENDING", StepState.PENDING), ("RUNNING", StepState.RUNNING),
    ("CANCELING", StepState.RUNNING), ("SUCCEEDED", StepState.SUCCEEDED),
    ("SKIPPED", StepState.SKIPPED), ("FAILED", StepState.FAILED),
    ("CANCELED", StepState.CANCELLED),
])
def test_task_states(state: str, expected: StepState) -> None:
    run = {"state": "RUNNING", "pipeline_spec": SPEC,
           "run_details": {"task_details": [detail("extract", state, 1)]}}
    (step,) = run_status(run).steps
    assert (step.step, step.state) == ("extract", expected)


def test_map_items_are_keyed_in_creation_order_and_structure_is_hidden() -> None:
    details = [detail("root", "RUNNING", 0), detail("root-driver", "SUCCEEDED", 0),
               detail("for-loop-2", "RUNNING", 1), detail("fan-driver", "SUCCEEDED", 1),
               detail("fan", "RUNNING", 3), detail("fan", "SUCCEEDED", 2),
               detail("extract", "SKIPPED", 4)]
    run = {"state": "RUNNING", "pipeline_spec": SPEC, "run_details": {"task_details": details}}
    st = run_status(run)
    assert [(s.step, s.key) for s in st.steps] == [("fan", "0"), ("fan", "1"), ("extract", "")]
    assert by_step(st.steps, "fan", "0").state is StepState.SUCCEEDED  # created first
    assert by_step(st.steps, "fan", "1").state is StepState.RUNNING
    assert by_step(st.steps, "extract").attempts == 0  # skipped: never ran
    # Without the spec in the answer, KFP's own executions are recognised by name.
    del run["pipeline_spec"]
    assert [(s.step, s.key) for s in run_status(run).steps] == [
        ("fan", "0"), ("fan", "1"), ("extract", "")]


def test_kubernetes_settings_are_sent_as_the_platform_spec(seen: dict[str, Any]) -> None:
    run = seen["platform_run"]
    assert run["keys"] == ["pipeline_spec", "platform_spec"]
    assert run["spec_is_compiled"]
    assert run["executor"]["activeDeadlineSeconds"] == "90"
    (env,) = run["executor"]["secretAsEnv"]
    assert env["secretName"] == "creds"
    assert env["keyToEnv"] == [{"secretKey": "token", "envVar": "TOKEN"}]


def test_a_cron_workflow_becomes_a_recurring_run(seen: dict[str, Any]) -> None:
    rec = seen["recurring"]
    assert rec["cron"] == "0 */30 * * * *"  # KFP's cron has a seconds field first
    assert rec["max_concurrency"] == "1"  # Forbid
    assert (rec["mode"], rec["status"]) == ("ENABLE", "ENABLED")
    assert rec["display_name"] == "nightly" and rec["spec_is_compiled"]
    assert rec["runs_created"] == 0  # no one-off run
    assert rec["again"] != rec["id"] and rec["same"] == rec["again"]  # idempotency key
    assert rec["count"] == 2
    assert rec["replace"]["type"] == "UnsupportedFeatureError"
    assert "Replace" in rec["replace"]["message"]
