"""The Airflow adapter against a real Apache Airflow 3 deployment.

The module fixture starts ``airflow api-server``, ``scheduler`` and ``dag-processor`` from
``.venv-airflow`` (see :mod:`tests.airflow_server`); the adapter itself runs here, in the
main environment, and talks to the deployment over HTTP only. Every workflow has a unique
name, so tests do not see each other's DAGs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from couler import ir
from couler.api.handles import SecretMaterial
from couler.compilers.airflow import compile_workflow
from couler.engines.base import EngineAdapter, RunState, RunStatus, StepState, StepStatus
from couler.errors import (
    DocumentTooLargeError,
    NotFoundError,
    OperationTimeoutError,
    RetryableError,
    UserError,
)
from couler.optimize.passes import document_size, optimize
from couler.optimize.split import budget_for, learned_limit
from couler_runtime.airflow import CANCEL_NOTE, AirflowAdapter, run_status, urllib_transport
from tests.airflow_server import AIRFLOW, TOKEN_SECONDS, VENV, AirflowServer, airflow_server
from tests.servers import free_port

S = ir.Step
L = ir.Literal.of
WATCH_TIMEOUT = 180.0  # a bound on waiting, not a performance assertion


def _name(purpose: str) -> str:
    return f"couler-adapter-{purpose}-{uuid.uuid4().hex[:6]}"


def _sh(script: str, *args: str) -> ir.ContainerSpec:
    return ir.ContainerSpec("alpine:3.20", ("sh", "-c", script, "sh"), args)


# The deployment's import-time policy (a cluster policy in airflow_local_settings.py, as
# operators set per-file DAG import timeouts): DAG files of workflows named *slowimport*
# get SLOW_IMPORT_TIMEOUT seconds, every other file Airflow's default 30.
SLOW = "slowimport"
SLOW_IMPORT_TIMEOUT = 0.5
LOCAL_SETTINGS = f"""
def get_dagbag_import_timeout(dag_file_path):
    return {SLOW_IMPORT_TIMEOUT} if "{SLOW}" in dag_file_path else 30.0
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    if not AIRFLOW.exists():
        pytest.fail(f"{VENV.name} is missing: run scripts/setup-engine-venv.sh airflow",
                    pytrace=False)
    with airflow_server(tmp_path_factory.mktemp("airflow-adapter"),
                        local_settings=LOCAL_SETTINGS) as srv:
        print(f"\nAirflow deployment started in {srv.start_seconds:.1f} s")
        yield srv
    assert srv.alive() == []  # teardown left no process behind


@pytest.fixture(scope="module")
def adapter(server: AirflowServer) -> AirflowAdapter:
    return AirflowAdapter(server.url, server.dags, username=server.username,
                          password=server.password, poll_interval=0.3, parse_timeout=90)


def _final(adapter: AirflowAdapter, run_id: str) -> tuple[RunStatus, list[RunStatus]]:
    seen = list(adapter.watch(run_id, timeout=WATCH_TIMEOUT))
    return seen[-1], seen


def _steps(status: RunStatus) -> dict[tuple[str, str], StepStatus]:
    return {(s.step, s.key): s for s in status.steps}


def _token(server: AirflowServer) -> str:
    body = json.dumps({"username": server.username, "password": server.password}).encode()
    req = urllib.request.Request(f"{server.url}/auth/token", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(json.loads(r.read())["access_token"])


def _get(server: AirflowServer, path: str) -> dict[str, Any]:
    req = urllib.request.Request(f"{server.url}/api/v2{path}",
                                 headers={"Authorization": f"Bearer {_token(server)}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


# --------------------------------------------------------------------------- a good run


@dataclass(frozen=True)
class Submitted:
    wf: ir.Workflow
    run_id: str
    final: RunStatus
    seen: list[RunStatus]


@pytest.fixture(scope="module")
def good_run(adapter: AirflowAdapter) -> Submitted:
    """Two steps and a map over static items, submitted once and watched to the end."""
    produce = S("produce", ir.ScriptSpec("python:3.12", "print('hello from couler')\n"
                                                        "print(6 * 7)\n"),
                outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),))
    consume = S("consume", _sh('echo "got: $1"', "{{inputs.text}}"),
                inputs=(ir.InputParameter("text", ir.StepOutputRef("produce", "result")),),
                outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
                dependencies=(ir.Dependency("produce"),))
    fan = S("fan", _sh('echo "item $1"', "{{inputs.x}}"),
            inputs=(ir.InputParameter("x", ir.ItemRef()),),
            outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
            foreach=ir.ForEach(items=(L("a"), L("b"), L("c"))),
            dependencies=(ir.Dependency("produce"),))
    wf = ir.Workflow(_name("good"), (produce, consume, fan))
    run_id = adapter.submit(wf, idempotency_key="first-submit")
    final, seen = _final(adapter, run_id)
    return Submitted(wf, run_id, final, seen)


def test_adapter_satisfies_the_protocol() -> None:
    adapter = AirflowAdapter("http://127.0.0.1:9", "/nonexistent", token="t")
    assert isinstance(adapter, EngineAdapter)
    with pytest.raises(UserError, match="token or a username and password"):
        AirflowAdapter("http://127.0.0.1:9", "/nonexistent", username="only-me")


def test_a_busy_server_is_asked_again_only_for_requests_that_can_repeat(
        server: AirflowServer, good_run: Submitted) -> None:
    """Airflow answers 500 while its metadata database is locked; the adapter sends a GET
    or PATCH again (twice here, then it passes through to the real server), never a POST."""
    failures: dict[str, int] = {"GET": 2, "POST": 1}
    sent: list[tuple[str, int]] = []

    def busy(method: str, url: str, headers: Mapping[str, str], body: bytes | None,
             timeout: float) -> tuple[int, bytes]:
        if "/api/v2/" in url and failures.get(method, 0) > 0:
            failures[method] -= 1
            sent.append((method, 500))
            return 500, b'{"reason": "Database error"}'
        status, raw = urllib_transport(method, url, headers, body, timeout)
        sent.append((method, status))
        return status, raw

    adapter = AirflowAdapter(server.url, server.dags, username=server.username,
                             password=server.password, transport=busy)
    status = adapter.status(good_run.run_id)
    assert status.state is good_run.final.state
    assert [c for c in sent if c[0] == "GET"][:3] == [("GET", 500), ("GET", 500), ("GET", 200)]
    with pytest.raises(RetryableError, match="answered 500"):
        adapter.submit(ir.Workflow(_name("busy"), (S("a", _sh("true")),)))
    assert ("POST", 500) in sent and failures["POST"] == 0


def test_unreachable_server_is_retryable(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    adapter = AirflowAdapter(f"http://127.0.0.1:{port}", tmp_path, username="u", password="p")
    with pytest.raises(RetryableError, match="cannot reach the Airflow API"):
        adapter.status("wf/run")


def test_run_succeeds_with_step_states_and_outputs(good_run: Submitted) -> None:
    final, seen = good_run.final, good_run.seen
    dag_id = good_run.wf.name
    assert good_run.run_id == f"{dag_id}/couler-k-first-submit"
    assert final.state is RunState.SUCCEEDED and final.workflow == dag_id
    assert final.run_id == good_run.run_id and final.message == ""
    assert [s.state.terminal for s in seen] == [False] * (len(seen) - 1) + [True]
    assert all(a != b for a, b in itertools.pairwise(seen))  # only changes
    steps = _steps(final)
    assert set(steps) == {("produce", ""), ("consume", ""), ("fan", "0"), ("fan", "1"),
                          ("fan", "2")}
    for s in final.steps:
        assert s.state is StepState.SUCCEEDED and s.attempts == 1
        assert s.started_at is not None and s.finished_at is not None
        assert s.started_at <= s.finished_at
    assert steps["produce", ""].outputs == {"result": "hello from couler\n42"}
    assert steps["consume", ""].outputs == {"result": "got: hello from couler\n42"}
    assert {k: steps["fan", k].outputs["result"] for k in "012"} == \
        {"0": "item a", "1": "item b", "2": "item c"}
    # produce ran before both of its dependents
    produced = steps["produce", ""].finished_at
    later = [s.started_at for k, s in steps.items() if k[0] != "produce"]
    assert produced is not None and all(t is not None and produced <= t for t in later)


def test_resubmit_with_the_same_key_returns_the_first_run(
        server: AirflowServer, adapter: AirflowAdapter, good_run: Submitted) -> None:
    dag_id = good_run.wf.name
    path = adapter.dag_file(dag_id)
    mtime = path.stat().st_mtime_ns
    again = adapter.submit(good_run.wf, idempotency_key="first-submit")
    assert again == good_run.run_id
    runs = _get(server, f"/dags/{dag_id}/dagRuns")
    assert runs["total_entries"] == 1
    assert [r["dag_run_id"] for r in runs["dag_runs"]] == ["couler-k-first-submit"]
    assert path.stat().st_mtime_ns == mtime  # the file was not even rewritten
    assert adapter.status(again).state is RunState.SUCCEEDED


def test_logs_contain_what_the_step_printed(adapter: AirflowAdapter,
                                            good_run: Submitted) -> None:
    text = adapter.logs(good_run.run_id, "produce")
    assert "hello from couler" in text and "\n" in text
    assert "item b" in adapter.logs(good_run.run_id, "fan", "1")
    assert "item b" not in adapter.logs(good_run.run_id, "fan", "2")
    with pytest.raises(NotFoundError):
        adapter.logs(good_run.run_id, "no-such-step")
    with pytest.raises(NotFoundError):
        adapter.logs(good_run.run_id, "fan", "7")


def test_cancel_of_a_finished_run_is_a_no_op(adapter: AirflowAdapter,
                                             good_run: Submitted) -> None:
    adapter.cancel(good_run.run_id)
    assert adapter.status(good_run.run_id).state is RunState.SUCCEEDED


def test_changed_workflow_is_redeployed_and_secrets_become_variables(
        adapter: AirflowAdapter) -> None:
    name = _name("redeploy")
    secret = SecretMaterial("db", "default", {"password": "s3cr3t-value"}, dry_run=False,
                            use_existing=False)

    def version(text: str) -> ir.Workflow:
        show = S("show", _sh(f'echo "{text} $PW"'),
                 env=(ir.EnvVar("PW", secret=ir.SecretRef("db", "password")),),
                 outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),))
        return ir.Workflow(name, (show,))

    first = adapter.submit(version("one"), [secret])
    second = adapter.submit(version("two"), [secret])  # same DAG, new code: a new run
    assert first != second and first.split("/")[0] == second.split("/")[0] == name
    outputs = {}
    for run_id in (first, second):
        final, _ = _final(adapter, run_id)
        assert final.state is RunState.SUCCEEDED, final
        outputs[run_id] = _steps(final)["show", ""].outputs["result"]
    # the first run may already use the new DAG version (Airflow runs the latest code)
    assert outputs[second] == "two s3cr3t-value"
    assert outputs[first] in ("one s3cr3t-value", "two s3cr3t-value")


# --------------------------------------------------------------------------- cancel


def _processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in (p.info.get("cmdline") or ()):
            found.append(p)
    return found


def test_cancel_stops_a_running_step(adapter: AirflowAdapter) -> None:
    marker = f"{300 + uuid.uuid4().int % 600}.{uuid.uuid4().int % 10**6:06d}"
    nap = S("nap", ir.ContainerSpec("alpine:3.20", ("sleep", marker)))
    after = S("after", _sh("echo never"), dependencies=(ir.Dependency("nap"),))
    wf = ir.Workflow(_name("cancel"), (nap, after))
    run_id = adapter.submit(wf)
    deadline = time.monotonic() + WATCH_TIMEOUT  # a bound on waiting for the sleep
    while not _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _processes_with(marker), adapter.status(run_id)
    running = adapter.status(run_id)
    assert running.state is RunState.RUNNING
    assert _steps(running)["nap", ""].state is StepState.RUNNING
    assert _steps(running)["after", ""].state is StepState.PENDING
    adapter.cancel(run_id)
    final, _ = _final(adapter, run_id)
    assert final.state is RunState.CANCELLED
    assert "cancelled" in final.message
    steps = _steps(final)
    assert steps["nap", ""].state is StepState.CANCELLED and steps["nap", ""].attempts == 1
    assert steps["after", ""].state is StepState.CANCELLED
    assert steps["after", ""].attempts == 0
    assert adapter.get(run_id)["note"] == CANCEL_NOTE
    deadline = time.monotonic() + 60  # the kill is asynchronous: wait for it, bounded
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _processes_with(marker) == []
    adapter.cancel(run_id)  # again: a no-op
    assert adapter.status(run_id).state is RunState.CANCELLED


# --------------------------------------------------------------------------- failures


def test_failing_step_reports_failed_with_attempts(adapter: AirflowAdapter) -> None:
    bad = S("bad", _sh("echo about to fail; exit 3"), retry=ir.RetryPolicy(1, ir.Backoff(1)))
    never = S("never", _sh("echo never"), dependencies=(ir.Dependency("bad"),))
    wf = ir.Workflow(_name("fail"), (bad, never))
    run_id = adapter.submit(wf)
    final, _ = _final(adapter, run_id)
    assert final.state is RunState.FAILED
    assert final.message == "failed steps: bad"
    steps = _steps(final)
    assert steps["bad", ""].state is StepState.FAILED
    assert steps["bad", ""].attempts == 2  # the first try and one retry
    assert steps["never", ""].state is StepState.SKIPPED
    assert "upstream" in steps["never", ""].message
    assert "about to fail" in adapter.logs(run_id, "bad")


def test_workflow_that_fails_to_import_reports_the_error(adapter: AirflowAdapter) -> None:
    # IR validation accepts the cron text; Airflow's timetable rejects it while parsing.
    wf = ir.Workflow(_name("import"), (S("a", _sh("true")),),
                     schedule=ir.CronSchedule("99 * * * *"))
    with pytest.raises(UserError) as err:
        adapter.submit(wf)
    text = str(err.value)
    assert f"workflow {wf.name!r}: Airflow could not import the DAG file" in text
    assert adapter.dag_file(wf.name).name in text
    assert "99 * * * *" in text and "out of range" in text


def test_a_dag_file_too_slow_to_import_is_refused_for_its_size(adapter: AirflowAdapter
                                                               ) -> None:
    """Airflow's own DagBag import timeout, from the real DAG processor: a 4000-step chain
    imports in about 2 s here, 4x the policy's timeout for this file. The adapter reports
    it as a size refusal in the split budget's unit, so the optimizer learns Airflow's
    budget from it and the next plan's chunks are within it."""
    steps = tuple(S(f"s{i}", _sh("true"), dependencies=(ir.Dependency(f"s{i - 1}"),) if i
                    else ()) for i in range(4000))
    wf = ir.Workflow(_name(SLOW), steps)
    with pytest.raises(DocumentTooLargeError) as err:
        adapter.submit(wf)
    refusal = err.value
    source = compile_workflow(wf)
    assert (refusal.engine, refusal.workflow) == ("airflow", wf.name)
    assert refusal.size_bytes == document_size(source, "airflow") == len(source.encode())
    # Airflow's words, from its import error: the file and the timeout that was hit
    assert "DagBag import timeout for" in refusal.detail
    assert f"after {SLOW_IMPORT_TIMEOUT}s" in refusal.detail
    assert adapter.dag_file(wf.name).name in str(refusal)
    # the optimizer's next plan for Airflow: split, every chunk within the learned budget
    budget = dataclasses.replace(budget_for("airflow"),
                                 learned_bytes=learned_limit(refusal.size_bytes))
    plan = optimize(wf, "airflow", budget=budget, retry=None)
    assert len(plan.chunks) >= 2
    assert all(0 < c.size_bytes <= learned_limit(refusal.size_bytes) for c in plan.chunks)
    assert sorted(n for c in plan.chunks for n in c.steps) == sorted(s.name for s in steps)


def test_unknown_runs_raise_not_found(adapter: AirflowAdapter, good_run: Submitted) -> None:
    dag_id = good_run.wf.name
    for run_id in ("no-such-dag/some-run", f"{dag_id}/no-such-run", f"{dag_id}/"):
        with pytest.raises(NotFoundError):
            adapter.status(run_id)
        with pytest.raises(NotFoundError):
            adapter.cancel(run_id)
        with pytest.raises(NotFoundError):
            next(adapter.watch(run_id))
    with pytest.raises(NotFoundError):
        adapter.logs("no-such-dag/some-run", "produce")


def test_unparsed_file_times_out(server: AirflowServer, tmp_path: Path) -> None:
    elsewhere = AirflowAdapter(server.url, tmp_path, username=server.username,
                               password=server.password, parse_timeout=1.5,
                               poll_interval=0.3)
    wf = ir.Workflow(_name("lost"), (S("a", _sh("true")),))
    with pytest.raises(OperationTimeoutError, match="did not parse the DAG file"):
        elsewhere.submit(wf)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    unwritable = AirflowAdapter(server.url, blocked / "dags", username=server.username,
                                password=server.password)
    with pytest.raises(UserError, match=f"workflow '{wf.name}': cannot write the DAG file"):
        unwritable.submit(wf)


def test_credentials_and_tokens(server: AirflowServer, good_run: Submitted) -> None:
    wrong = AirflowAdapter(server.url, server.dags, username=server.username,
                           password="wrong")
    with pytest.raises(UserError, match="logging in") as err:
        wrong.status(good_run.run_id)
    assert not isinstance(err.value, NotFoundError)
    token = _token(server)
    with_token = AirflowAdapter(server.url, server.dags, token=token)
    assert with_token.status(good_run.run_id).state is RunState.SUCCEEDED
    bad_token = AirflowAdapter(server.url, server.dags, token="not-a-jwt")
    with pytest.raises(UserError, match="403: Invalid JWT token") as err:
        bad_token.status(good_run.run_id)
    assert "check the credentials" in str(err.value)


def test_expired_token_is_renewed(server: AirflowServer, good_run: Submitted) -> None:
    logins: list[str] = []

    def counting(method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                 timeout: float) -> tuple[int, bytes]:
        if url.endswith("/auth/token"):
            logins.append(url)
        return urllib_transport(method, url, headers, body, timeout)

    adapter = AirflowAdapter(server.url, server.dags, username=server.username,
                             password=server.password, transport=counting)
    assert adapter.status(good_run.run_id).state is RunState.SUCCEEDED
    assert len(logins) == 1
    time.sleep(TOKEN_SECONDS + 1)  # let the token expire: the API now answers 401
    assert adapter.status(good_run.run_id).state is RunState.SUCCEEDED
    assert len(logins) == 2


# --------------------------------------------------------------------------- mapping only


def test_mapping_of_a_cancelled_run_and_helper_tasks() -> None:
    run = {"dag_id": "wf", "dag_run_id": "r", "state": "failed", "note": CANCEL_NOTE}
    tis = [
        {"task_id": "a", "map_index": -1, "state": "failed", "try_number": 1},
        {"task_id": "b", "map_index": -1, "state": "skipped", "try_number": 0},
        {"task_id": "c", "map_index": -1, "state": "skipped", "try_number": 1},
        {"task_id": "m--items", "map_index": -1, "state": "success", "try_number": 1},
        {"task_id": "couler-exit-status", "map_index": -1, "state": "skipped"},
    ]
    status = run_status(run, tis)
    assert status.run_id == "wf/r" and status.state is RunState.CANCELLED
    assert {s.step: s.state for s in status.steps} == {
        "a": StepState.CANCELLED, "b": StepState.CANCELLED, "c": StepState.SKIPPED}

    failed = run_status({**run, "note": None}, [
        {"task_id": "m--items", "map_index": -1, "state": "failed", "try_number": 1},
        {"task_id": "m", "map_index": -1, "state": "upstream_failed", "try_number": 0},
        {"task_id": "n", "map_index": 2, "state": "up_for_retry", "try_number": 1},
    ])
    steps = {(s.step, s.key): s for s in failed.steps}
    assert failed.state is RunState.FAILED and failed.message == "failed steps: m"
    assert steps["m", ""].state is StepState.FAILED and "m--items" in steps["m", ""].message
    assert steps["n", "2"].state is StepState.RETRYING and steps["n", "2"].attempts == 1
