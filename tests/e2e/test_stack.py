"""The acceptance path, as a new user takes it, and all five services through gRPC.

``python -m couler up`` in a temporary ``COULER_HOME``; ``couler submit`` of an example
program and of a text request, both waited for; the dashboard; a second submit of the
same text, which runs nothing; ``couler status``; then the five services driven one by one
through the typed client; and ``couler down``, after which no process of the stack is
left. The tests of this module run in file order on one stack (``couler down`` is last).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from couler import ir
from couler.cli import _capture
from couler.engines.base import StepState
from couler_runtime import stack
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState

from .conftest import (
    execution_dirs,
    gone,
    journal,
    leftovers,
    marked_workflow,
    marks,
    ml_env,
    recorded_pids,
    release,
    started,
    unique,
    wait_until,
    write_table,
)

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TEXT = "train an XGBoost and a LightGBM model on {table}, evaluate both, keep the better one"


@dataclass
class CliStack:
    """A stack started with ``python -m couler up`` and what the tests learnt about it."""

    home: Path
    env: dict[str, str]
    up: subprocess.CompletedProcess[str]
    text: str = ""  # the plain-English request the tests submit (over a real table)
    runs: dict[str, str] = field(default_factory=dict)  # what -> run id
    pids: list[int] = field(default_factory=list)

    def couler(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "couler", *args], env=self.env,
                              cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              check=False)

    @property
    def info(self) -> stack.StackInfo:
        return stack.status(self.home)[0]

    def dashboard(self, path: str, *, token: str | None = "", **params: str) -> httpx.Response:
        info = self.info
        headers = {} if token is None else {"Authorization": f"Bearer {token or info.token}"}
        return httpx.get(info.dashboard.rstrip("/") + path, headers=headers, params=params,
                         timeout=10, follow_redirects=False)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliStack]:
    home = tmp_path_factory.mktemp("couler-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    env["COULER_HOME"] = str(home)
    env.update(ml_env())
    up = subprocess.run([sys.executable, "-m", "couler", "up"], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=120, check=False)
    table = write_table(tmp_path_factory.mktemp("data") / "churn.csv")
    s = CliStack(home, env, up, text=TEXT.format(table=table))
    try:
        yield s
    finally:
        if (home / "stack.json").exists():  # a test before `couler down` failed
            pids = recorded_pids(home)
            stack.down(home)
            assert leftovers(home, pids) == []


def _run_id(stderr: str) -> str:
    found = re.findall(r"as run (run-[0-9a-f]+)", stderr)
    assert len(found) == 1, stderr
    return str(found[0])


def test_up_prints_the_grpc_address_and_the_dashboard(cli: CliStack) -> None:
    assert cli.up.returncode == 0, cli.up.stderr
    info, alive = stack.status(cli.home)
    assert alive == {name: True for name in ("nats", *stack.SERVICES)}
    assert f"gRPC (submitter): {info.grpc_address}" in cli.up.stdout
    assert f"dashboard:        {info.dashboard}" in cli.up.stdout
    assert info.token  # `up` protects the endpoints with a token by default
    # every process bound a port of its own choosing and reported it; later services (and a
    # restart) get those bound addresses
    assert all(int(a.rsplit(":", 1)[1]) > 0 for a in info.addresses.values()), info.addresses
    assert info.env["COULER_CACHE_ADDRESS"] == info.addresses["cache"]
    assert info.env["COULER_DASHBOARD_ADDRESS"] in info.dashboard
    assert int(info.nats_url.rsplit(":", 1)[1]) > 0
    cli.pids[:] = [info.supervisor, *info.pids.values()]


def test_every_service_serves_its_metrics_with_the_token(cli: CliStack) -> None:
    info = cli.info
    assert set(info.metrics) == set(stack.SERVICES)
    for name, url in info.metrics.items():
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
        assert f"metrics ({name}):" in cli.up.stdout and url in cli.up.stdout
        assert httpx.get(url, timeout=10).status_code == 401
        got = httpx.get(url, headers={"Authorization": f"Bearer {info.token}"}, timeout=10)
        assert got.status_code == 200
        assert f'service_name="couler-{name}"' in got.text
        if name != "generator":  # the others consume from the bus
            assert "couler_bus_consumer_pending{" in got.text, name


def test_submit_an_example_program_and_wait(cli: CliStack) -> None:
    done = cli.couler("submit", "examples/map_batches.py", "--wait", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert (record["workflow"], record["state"], record["engine"]) == (
        "map-batches", "succeeded", "local")
    steps = {(s["name"], s["key"]): s for s in record["steps"]}
    assert {k for k in steps if k[1]} == {("train", str(i)) for i in range(4)} | {
        ("score", str(i)) for i in range(3)}
    assert all(s["state"] == "succeeded" and not s["cached"] for s in record["steps"])
    assert json.loads(steps["shards", ""]["outputs"]["result"]) == ["shard-0", "shard-1",
                                                                   "shard-2"]
    assert record["passes"][0]["name"] == "validate"
    cli.runs["example"] = record["run_id"]



def test_resubmitting_the_map_example_reuses_every_item(cli: CliStack) -> None:
    """The README's map example again: every item of both maps comes from the cache -- the
    literal sweep's items by their values, the items of the map over ``shards``' output
    because ``shards`` is reused and its recorded output gives them -- and nothing runs."""
    with CoulerClient(cli.info.addresses, token=cli.info.token) as client:
        first = client.submitter.get(cli.runs["example"])
        keys = {(s.name, s.key): s.cache_key for s in first.steps if s.cache_key}
        assert set(keys) == {("shards", "")} | {("train", str(i)) for i in range(4)} | {
            ("score", str(i)) for i in range(3)}
        wait_until(lambda: not client.cache.lookup(keys.values()).missing,
                   "the cache committed every item")
    done = cli.couler("submit", "examples/map_batches.py", "--wait", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["state"] == "succeeded" and record["run_id"] != cli.runs["example"]
    steps = {(s["name"], s["key"]): s for s in record["steps"]}
    assert len(steps) == 10
    assert all((s["state"], s["cached"], s["attempts"]) == ("cached", True, 0)
               for s in record["steps"]), record["steps"]
    assert record["cached_steps"] == ["score", "shards", "train"]
    with CoulerClient(cli.info.addresses, token=cli.info.token) as client:
        second = client.submitter.get(record["run_id"])
    assert {(s.name, s.key): s.cache_key for s in second.steps if s.cache_key} == keys
    prune = next(p for p in record["passes"] if p["name"] == "prune_cached")
    assert any("step 'score[2]': cached" in n for n in prune["notes"]), prune["notes"]
    assert execution_dirs(cli.home / "state" / "runs" / record["run_id"]) == []


def test_a_plan_for_argo_leaves_out_the_steps_the_cache_holds(cli: CliStack) -> None:
    """The map example again, planned for Argo through the stack: ``shards`` is reused, so
    it is not in the Argo document, and the map over its output gets the recorded list."""
    dry = cli.couler("submit", "examples/map_batches.py", "--engine", "argo", "--dry-run",
                     "--wait", "--json")
    assert dry.returncode == 0, dry.stderr
    passes = {p["name"]: p for p in json.loads(dry.stdout)["passes"]}
    assert passes["substitute_cached"]["changed"], passes["substitute_cached"]
    assert any("step 'shards': taken out" in n for n in passes["substitute_cached"]["notes"])
    [wf] = _capture(str(REPO / "examples" / "map_batches.py"), [])
    with CoulerClient(cli.info.addresses, token=cli.info.token) as client:
        plan = client.optimizer.optimize(wf, "argo")
    assert [s.name for s in plan.workflow.steps] == ["train", "score"]
    assert "shards" in plan.cached and "list_shards" not in plan.compiled
    assert "shard-0" in plan.compiled  # the map's items, written in from the cache
    uncached = json.loads(cli.couler("submit", "examples/map_batches.py", "--engine", "argo",
                                     "--dry-run", "--no-cache", "--wait", "--json").stdout)
    assert not next(p for p in uncached["passes"] if p["name"] == "substitute_cached")["changed"]


def test_submit_a_text_request_and_wait(cli: CliStack) -> None:
    done = cli.couler("submit", "--text", cli.text, "--wait")
    assert done.returncode == 0, done.stderr
    run_id = _run_id(done.stderr)
    assert f"run {run_id} succeeded" in done.stdout
    assert "keep-better-one" in done.stderr  # the live progress named the steps
    # what the optimizer changed in a workflow the user did not write is said
    assert re.search(r"^  optimizer default_retry: default retry policy \(limit 2\) on: ",
                     done.stdout, re.M), done.stdout
    cli.runs["text"] = run_id


def test_the_dashboard_lists_both_runs_and_wants_the_token(cli: CliStack) -> None:
    wanted = {cli.runs["example"], cli.runs["text"]}

    def listed() -> bool:
        got = cli.dashboard("/api/runs")
        assert got.status_code == 200, got.text
        return wanted <= {r["run_id"] for r in got.json()}

    wait_until(listed, "the dashboard lists both runs")
    page = cli.dashboard("/")
    assert page.status_code == 200 and all(r in page.text for r in wanted)
    assert cli.dashboard("/api/runs", token=None).status_code == 401
    assert cli.dashboard("/", token=None).status_code == 401
    assert cli.dashboard("/api/runs", token="not-the-token").status_code == 401
    # ?token= works too (it redirects, keeping the token in a cookie)
    # ?token= works too: it redirects to the page, remembering the token in a cookie
    with httpx.Client(follow_redirects=True, timeout=10) as browser:
        got = browser.get(cli.info.dashboard, params={"token": cli.info.token})
        assert got.status_code == 200 and all(r in got.text for r in wanted)
        assert "token" not in str(got.url)


def test_the_dashboard_shows_concurrent_runs_in_their_final_state(cli: CliStack) -> None:
    """The monitor's record of each finished run ends in the state the submitter reports,
    with several runs at once (their step events then queue up behind each other)."""
    compiled = cli.couler("compile", "examples/map_batches.py", "--engine", "ir")
    assert compiled.returncode == 0, compiled.stderr
    wf = ir.from_dict(ir.Workflow, json.loads(compiled.stdout))
    with CoulerClient(cli.info.addresses, token=cli.info.token) as client:
        ids = [client.submitter.submit(wf, no_cache=True).run_id for _ in range(4)]
        truth = {r: client.submitter.wait(r, timeout=120).state.value for r in ids}
    assert set(truth.values()) == {"succeeded"}

    def shown() -> dict[str, str]:
        return {r["run_id"]: r["state"] for r in cli.dashboard("/api/runs").json()
                if r["run_id"] in truth}

    end = time.monotonic() + 20
    while shown() != truth and time.monotonic() < end:
        time.sleep(0.2)
    assert shown() == truth, "the monitor's state of each run (the submitter says succeeded)"


def test_a_second_submit_of_the_same_text_runs_no_step(cli: CliStack) -> None:
    done = cli.couler("submit", "--text", cli.text, "--wait", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    run_id = record["run_id"]
    assert run_id != cli.runs["text"] and record["state"] == "succeeded"
    names = {s["name"] for s in record["steps"]}
    assert len(names) == 7 and sorted(names) == record["cached_steps"]
    assert all((s["state"], s["cached"], s["attempts"]) == ("cached", True, 0)
               for s in record["steps"])
    prune = next(p for p in record["passes"] if p["name"] == "prune_cached")
    assert prune["changed"] and len([n for n in prune["notes"] if ": cached (" in n]) == 7
    # the steps only reused steps read are reused without their artifacts being fetched
    assert any("reused without restoring its artifacts" in n for n in prune["notes"])
    # nothing ran for it: no execution directory, no attempt in the engine's journal
    run_dir = cli.home / "state" / "runs" / run_id
    assert run_dir.is_dir()
    assert execution_dirs(run_dir) == []
    assert all(j.starts == 0 for j in journal(run_dir).values())
    # while the first run's steps did run, once each
    first = cli.home / "state" / "runs" / cli.runs["text"]
    assert sorted(execution_dirs(first)) == sorted(f"{n}/main" for n in names)
    cli.runs["cached"] = run_id

    def counted() -> bool:
        row = next((r for r in cli.dashboard("/api/runs").json() if r["run_id"] == run_id),
                   None)
        return row is not None and row["cached_steps"] == 7

    wait_until(counted, "the dashboard counts 7 cached steps")


def test_status_lists_the_runs(cli: CliStack) -> None:
    done = cli.couler("status")
    assert done.returncode == 0, done.stderr
    for name in ("nats", *stack.SERVICES):
        assert re.search(rf"^\s+{name}\s+running\b", done.stdout, re.M), done.stdout
    for run_id in cli.runs.values():
        assert run_id in done.stdout
    assert re.search(rf"{cli.runs['cached']}\s.*succeeded\s+steps 7, cached 7", done.stdout)


def test_a_failed_step_says_why(cli: CliStack, tmp_path: Path) -> None:
    """`couler submit --wait` names the failed step and its reason (not only the run's
    "steps failed"); `--json` carries the exit code and message of each step."""
    program = tmp_path / "boom.py"
    program.write_text(
        "import couler.argo as couler\n\n"
        "couler.run_container(image='alpine', command=['sh', '-c', 'echo broken >&2; exit 3'],\n"
        "                     step_name='boom', retry=0)\n")
    done = cli.couler("submit", str(program), "--wait")
    assert done.returncode == 1, done.stderr
    # the failure's class and why (couler.failures): an unknown exit seen once is transient
    assert re.search(r"^  step boom failed \(transient: exit code 3, not a known error, seen "
                     r"once.*\): .*exit code 3: broken$", done.stdout, re.M), done.stdout
    assert re.search(r"boom\s+failed \(transient: .*\): .*exit code 3", done.stderr), \
        done.stderr  # live line
    done = cli.couler("submit", str(program), "--wait", "--json")
    assert done.returncode == 1, done.stderr
    (step,) = json.loads(done.stdout)["steps"]
    assert (step["name"], step["state"], step["exit_code"]) == ("boom", "failed", 3)
    assert "exit code 3: broken" in step["message"]
    assert step["failure_class"] == "transient"
    assert step["failure_reason"].startswith("transient: exit code 3, not a known error")

    run_id = json.loads(done.stdout)["run_id"]
    shown = cli.couler("status", run_id)
    assert shown.returncode == 0, shown.stderr
    assert re.search(rf"^run {run_id} \(boom, engine local\): failed", shown.stdout, re.M)
    assert re.search(r"^  boom\s+failed \(transient: .*\): .*exit code 3: broken$",
                     shown.stdout, re.M), shown.stdout
    logs = cli.couler("logs", run_id, "boom")
    assert (logs.returncode, logs.stdout) == (0, "broken\n"), logs.stderr
    missing = cli.couler("logs", run_id, "nope")
    assert missing.returncode == 2 and "has no step 'nope' (its steps: boom)" in missing.stderr


def test_all_five_services_through_grpc(cli: CliStack) -> None:
    info = cli.info
    with CoulerClient(info.addresses, token=info.token) as client:
        before = client.cache.stats()
        table = write_table(cli.home / f"grpc-{uuid.uuid4().hex[:6]}.csv")  # nothing cached
        text = TEXT.format(table=table)
        generated = client.generator.generate(text)
        wf = generated.workflow
        ir.validate(wf)
        assert len(wf.steps) == 7 and generated.report.planner
        plan = client.optimizer.optimize(wf, "local")
        assert [p.name for p in plan.passes] == [
            "validate", "prune_cached", "substitute_cached", "right_size", "default_retry",
    "split", "compile"]
        assert plan.cached == {}  # a new table: nothing of it is cached yet
        assert plan.engine == "local" and plan.workflow.name == wf.name

        first = client.submitter.submit(wf, engine="local")
        run = client.submitter.wait(first.run_id, timeout=120)
        assert run.state is RunState.SUCCEEDED, run.message
        steps = {s.name for s in run.steps}
        assert all(s.state is StepState.SUCCEEDED and s.attempts == 1 for s in run.steps)
        assert [p.name for p in run.passes][:2] == ["validate", "prune_cached"]

        def measured() -> bool:
            u = client.monitor.utilization(run_id=first.run_id)
            return {p.step for p in u.peaks} >= steps

        wait_until(measured, "the monitor has peaks for every step")
        u = client.monitor.utilization(run_id=first.run_id)
        assert u.samples and all(s.run_id == first.run_id for s in u.samples)
        # A step that ends within one sampling interval may have no sample (its peak then
        # comes from its record, and may be 0); the longer ones were sampled.
        assert any(p.samples >= 1 and p.peak_memory_bytes > 0 for p in u.peaks), u.peaks
        assert {s.step for s in u.samples} <= steps

        keys = {s.name: s.cache_key for s in run.steps}
        assert all(keys.values()), keys  # every step of it is cacheable

        def committed() -> bool:
            return not client.cache.lookup(keys.values()).missing

        wait_until(committed, "the cache committed every step")
        entries = client.cache.lookup(keys.values()).entries
        assert {entries[k].step for k in keys.values()} == steps
        stats = client.cache.stats()
        assert stats.entries >= before.entries + 1 and stats.bytes > before.bytes
        hits_before = stats.hits

        again = client.optimizer.optimize(wf, "local")
        assert set(again.cached) == steps
        second = client.submitter.submit(wf, engine="local")
        assert second.created and second.run_id != first.run_id
        run2 = client.submitter.wait(second.run_id, timeout=120)
        assert run2.state is RunState.SUCCEEDED, run2.message
        assert all(s.cached and s.state is StepState.CACHED for s in run2.steps)
        # each of the two plans counts the hits it uses: at least the last step's (the
        # steps only reused steps read are reused without being fetched, not counted)
        assert client.cache.stats().hits >= hits_before + 2
        assert execution_dirs(cli.home / "state" / "runs" / second.run_id) == []
        cli.runs["grpc"], cli.runs["grpc-cached"] = first.run_id, second.run_id


def test_restart_the_submitter_while_a_run_is_in_flight(cli: CliStack, tmp_path: Path) -> None:
    """`couler restart submitter` stops it (SIGTERM) and the supervisor starts it again on
    its address at once; the run in flight finishes, every step ending exactly once."""
    before = cli.info.processes["submitter"]
    name = unique("restarted")
    with CoulerClient(cli.info.addresses, token=cli.info.token) as client:
        sub = client.submitter.submit(marked_workflow(name, tmp_path / name))
        # prepare holds at its gate: running at the restart, released after it
        wait_until(lambda: started(tmp_path / name, "prepare"), "prepare started")
        done = cli.couler("restart", "submitter")
        assert done.returncode == 0, done.stderr
        after = cli.info.processes["submitter"]
        assert f"submitter restarted: pid {after.pid} on {cli.info.grpc_address}" in done.stdout
        assert after.pid != before.pid and after.restarts == before.restarts + 1
        assert after.last_exit == "exit status 0"  # it stopped cleanly on SIGTERM
        release(tmp_path / name)
        run = client.submitter.wait(sub.run_id, timeout=120)
    assert run.state is RunState.SUCCEEDED, run.message
    ended = {step: sum(1 for line in lines if line.startswith("end"))
             for step, lines in marks(tmp_path / name).items()}
    assert ended == {"prepare": 1, "train-a": 1, "train-b": 1, "pick": 1}, ended
    shown = cli.couler("status")
    assert re.search(rf"^  submitter\s+running\s+pid {after.pid}\s.*restarts "
                     rf"{after.restarts}, last exit: exit status 0", shown.stdout, re.M), \
        shown.stdout


def test_down_leaves_no_process(cli: CliStack) -> None:
    pids = recorded_pids(cli.home)
    done = cli.couler("down")
    assert done.returncode == 0, done.stderr
    assert "nothing left running" in done.stdout
    assert not (cli.home / "stack.json").exists()
    assert leftovers(cli.home, pids) == []
    assert all(gone(p) for p in (*pids, *cli.pids))
