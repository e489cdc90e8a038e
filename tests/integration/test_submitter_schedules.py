"""Cron schedules on the embedded stack: the submitter launches a template's runs on time.

Real services: a nats-server of each test's own, PostgreSQL, the optimizer service (it
plans every tick's run, as in production) and one or two submitter services, in threads as
the service tests run them (``tests/service_thread.py``); ``couler schedule`` runs as a
process. Ticks are real time: the schedules tick every second or at seconds chosen from
the clock, and the tests wait for what the ticks leave in the store (never for a time).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from couler import ir
from couler.errors import NotFoundError, UserError
from couler_optimizer.main import OptimizerSettings
from couler_optimizer.main import build as build_optimizer
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState
from couler_submitter.main import SubmitterSettings
from couler_submitter.schedules import tick_key
from couler_submitter.store import RunStore
from tests.integration.test_submitter_service import (
    ServiceThread,
    fresh_database,
    script,
    unique,
    wait_for,
)
from tests.servers import NatsServer, SecureNatsServer, make_root
from tests.service_thread import ServiceThread as RunningService

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "schedule-test-token"


# ----------------------------------------------------------------------------- harness


@pytest.fixture
def nats() -> Iterator[NatsServer]:
    """A NATS of each test's own: no other test's runs still being planned reach it."""
    server = NatsServer(make_root("sched-nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def optimizer(nats: NatsServer, postgres_url: str,
              tmp_path: Path) -> Iterator[None]:
    settings = OptimizerSettings.load(
        "optimizer", nats_url=nats.url, grpc_address="127.0.0.1:0",
        state_dir=tmp_path / "optimizer",
        database_url=fresh_database(postgres_url), cache_address="", auth_token=None,
        otel_endpoint=None, bus_insecure=True)
    service = RunningService(settings, build_optimizer).start()
    try:
        yield None
    finally:
        service.stop()


class Stack:
    """Submitters over one database and bus (start and stop them at will)."""

    def __init__(self, nats: NatsServer, database_url: str, state: Path) -> None:
        self.nats = nats
        self.database_url = database_url
        self.state = state
        self.running: list[Any] = []

    def start(self, token: str | None = None) -> Any:
        settings = SubmitterSettings.load(
            "submitter", nats_url=self.nats.url, grpc_address="127.0.0.1:0",
            state_dir=self.state, database_url=self.database_url,
            artifacts=str(self.state / "blobs"), auth_token=token, otel_endpoint=None,
            runs_dir=str(self.state / "runs"), engines="local,dryrun", outbox_interval=1.0,
            bus_insecure=True)  # the logic on an open bus: see test_bus_security.py
        service = ServiceThread(settings).start()
        self.running.append(service)
        return service

    def stop(self, service: Any) -> None:
        service.stop()
        self.running.remove(service)

    def store(self) -> RunStore:
        return RunStore(self.database_url)


@pytest.fixture
def stack(nats: NatsServer, optimizer: None, postgres_url: str,
          tmp_path: Path) -> Iterator[Stack]:
    s = Stack(nats, fresh_database(postgres_url), tmp_path)
    try:
        yield s
    finally:
        for service in list(s.running):
            s.stop(service)


def cron_workflow(name: str, cron: str, *, sleep: float = 0, **schedule: Any) -> ir.Workflow:
    body = f"import time\ntime.sleep({sleep})\nprint('tick')"
    return ir.Workflow(name=name, steps=(script("tick", body),),
                       schedule=ir.CronSchedule(cron, **schedule))


def ticks_of(store: RunStore, name: str) -> list[tuple[float, str, str, str]]:
    return store.ticks(name)


def launched(store: RunStore, name: str) -> list[tuple[float, str]]:
    return [(t, run_id) for t, outcome, run_id, _ in store.ticks(name) if outcome == "launched"]


def whole_minute_margin() -> None:
    """Wait, if need be, until at least 20 s are left in the current minute (a schedule of
    chosen seconds then ticks within one minute)."""
    while datetime.now(UTC).second > 40:
        time.sleep(0.2)


def seconds_cron(*ticks: float) -> str:
    """A 6-field cron (seconds last) firing at exactly ``ticks`` (UTC, one minute)."""
    moments = [datetime.fromtimestamp(t, UTC) for t in ticks]
    assert len({(m.hour, m.minute) for m in moments}) == 1
    m = moments[0]
    return f"{m.minute} {m.hour} * * * {','.join(str(x.second) for x in moments)}"


# ----------------------------------------------------------------------------- the claim


def test_a_tick_is_claimed_once(stack: Stack) -> None:
    """The claim: of concurrent launches and skips of one tick, exactly one lands."""
    from concurrent.futures import ThreadPoolExecutor

    from couler.errors import ConflictError
    from couler_submitter.model import RunOptions, RunRequest

    store = stack.store()
    try:
        wf = cron_workflow("claimed", "* * * * *")
        request = RunRequest(wf, None, RunOptions(), template="claimed")

        def attempt(i: int) -> str:
            if i % 4 == 3:
                return "skipped" if store.skip_tick("claimed", 60.0, "a skip") else "lost"
            try:
                _, created = store.create_run(f"run-claim-{i}", request,
                                                idempotency_key=tick_key("claimed", 60.0),
                                                tick=("claimed", 60.0))
            except ConflictError:
                return "lost"
            return "launched" if created else "lost"

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(attempt, range(16)))
        assert sorted(outcomes).count("lost") == 15
        rows = store.ticks("claimed")
        assert len(rows) == 1 and rows[0][1] in ("launched", "skipped")
        assert (rows[0][1] == "launched") == ("launched" in outcomes)
    finally:
        store.close()


# ----------------------------------------------------------------------------- on time


def test_runs_launch_on_time_through_the_normal_path_and_pause_resume(stack: Stack) -> None:
    submitter = stack.start()
    name = unique("every-second")
    wf = cron_workflow(name, "* * * * * *", timezone="Europe/Berlin")
    store = stack.store()
    with CoulerClient({"submitter": submitter.address}, timeout=60) as client:
        sub = client.submitter.submit(wf)
        assert (sub.run_id, sub.created, sub.schedule) == ("", True, name)
        suspended = unique("suspended")
        client.submitter.submit(cron_workflow(suspended, "* * * * * *", suspend=True))
        registered = store.schedule(suspended).last_tick
        # Two ticks' runs planned by the optimizer and run by the local engine.
        def succeeded() -> list[Any] | None:
            runs = [r for r in client.submitter.list(workflow=name).runs
                    if r.state is RunState.SUCCEEDED]
            return runs[:2] if len(runs) >= 2 else None

        for run in wait_for("two scheduled runs succeeded", succeeded):
            full = client.submitter.get(run.run_id)
            assert [(s.name, s.state.value) for s in full.steps] == [("tick", "succeeded")]
            assert full.passes and full.template == name  # planned by the optimizer
            tick = float(run.idempotency_key.rsplit(".", 1)[1])
            assert run.idempotency_key == tick_key(name, tick)
            assert tick == int(tick) and run.created_at >= tick  # on its tick, not before
        listed = {s.name: s for s in client.submitter.list_schedules()}
        assert listed[name].cron == "* * * * * *" and listed[name].timezone == "Europe/Berlin"
        assert listed[name].last_outcome == "launched" and not listed[name].paused
        assert listed[name].next_tick_at > listed[name].last_tick_at

        paused = client.submitter.pause_schedule(name)
        assert paused.paused and paused.next_tick_at == 0
        at_pause = time.time()
        # Ticks go on while paused, unrecorded: wait until the loop passed two of them.
        wait_for("two ticks passed while paused",
                 lambda: store.schedule(name).last_tick >= at_pause + 2)
        assert all(t <= at_pause for t, _ in launched(store, name))
        # The suspended schedule's ticks passed the same way: looked at, none launched.
        assert store.schedule(suspended).last_tick >= registered + 2
        assert store.ticks(suspended) == [] and client.submitter.list(
            workflow=suspended).runs == ()
        assert {s.name: s.suspended for s in client.submitter.list_schedules()}[suspended]
        count = len(launched(store, name))
        resumed = client.submitter.resume_schedule(name)
        assert not resumed.paused and resumed.next_tick_at > at_pause + 2
        wait_for("a run after resume", lambda: len(launched(store, name)) > count)
        with pytest.raises(NotFoundError, match="schedule 'nope'"):
            client.submitter.pause_schedule("nope")
        # A bad schedule is refused at submit, naming the field.
        with pytest.raises(UserError, match=r"schedule\.timezone"):
            client.submitter.submit(cron_workflow(unique("badtz"), "* * * * *",
                                                  timezone="Mars/Olympus"))
    store.close()


def test_forbid_replace_and_history_limits(stack: Stack) -> None:
    stack.start()
    forbid, replace = unique("forbid"), unique("replace")
    store = stack.store()
    try:
        with CoulerClient({"submitter": stack.running[0].address}, timeout=60) as client:
            client.submitter.submit(cron_workflow(
                forbid, "* * * * * */2", sleep=5,
                concurrency_policy=ir.ConcurrencyPolicy.FORBID, successful_history_limit=1))
            client.submitter.submit(cron_workflow(
                replace, "* * * * * */2", sleep=30,
                concurrency_policy=ir.ConcurrencyPolicy.REPLACE))

            def forbidden() -> list[str] | None:
                reasons = [r for _, o, _, r in store.ticks(forbid) if o == "skipped"]
                return reasons or None

            reason = wait_for("a tick skipped by forbid", forbidden)[0]
            assert reason.startswith("concurrency policy forbid: run run-")
            # Two runs of 'forbid' succeed; history keeps the newest one only.
            # Two runs of 'forbid' succeed; its history keeps the newest only.
            wait_for("a succeeded forbid run deleted by the history limit", lambda: any(
                _missing(store, run_id) for _, run_id in launched(store, forbid)))
            assert len(store.template_runs(forbid, (RunState.SUCCEEDED,))) <= 1

            def replaced() -> Any:
                runs = store.template_runs(replace, (RunState.CANCELLED,))
                return runs[0] if runs else None

            cancelled = wait_for("a run replaced by the next tick's", replaced)
            assert "replaced by the run of schedule" in cancelled.message
            client.submitter.pause_schedule(replace)
    finally:
        store.close()


def _missing(store: RunStore, run_id: str) -> bool:
    try:
        store.header(run_id)
    except NotFoundError:
        return True
    return False


# ----------------------------------------------------------------------------- downtime


def test_missed_ticks_after_downtime_follow_the_policy(stack: Stack) -> None:
    whole_minute_margin()
    submitter = stack.start()
    now = time.time()
    first, second = float(int(now) + 8), float(int(now) + 10)
    cron = seconds_cron(first, second)
    generous, strict = unique("catch-up"), unique("deadline")
    with CoulerClient({"submitter": submitter.address}, timeout=60) as client:
        client.submitter.submit(cron_workflow(generous, cron, starting_deadline_seconds=3600))
        client.submitter.submit(cron_workflow(strict, cron, starting_deadline_seconds=1))
    stack.stop(submitter)  # down across both ticks
    while time.time() < second + 5:  # the clock passes both ticks (no submitter runs)
        time.sleep(0.2)
    store = stack.store()
    try:
        assert store.ticks(generous) == [] and store.ticks(strict) == []
        stack.start()
        rows = wait_for("the missed ticks handled",
                        lambda: store.ticks(generous) if len(store.ticks(generous)) == 2
                        and len(store.ticks(strict)) == 2 else None)
        (t1, o1, _, r1), (t2, o2, run_id, _) = rows
        assert (t1, o1, t2, o2) == (first, "skipped", second, "launched")
        assert r1.startswith("missed: no submitter was running")
        (s1, so1, _, sr1), (s2, so2, _, sr2) = store.ticks(strict)
        assert (s1, so1, s2, so2) == (first, "skipped", second, "skipped")
        assert sr1.startswith("missed: no submitter") and \
            sr2.startswith("missed its starting deadline") and "the deadline is 1 s" in sr2
        # The catch-up run goes through planning and runs like any other.
        wait_for("the catch-up run succeeded",
                 lambda: store.header(run_id).state is RunState.SUCCEEDED)
        assert store.template_runs(strict, list(RunState)) == []
    finally:
        store.close()


# ----------------------------------------------------------------------------- two submitters


def test_two_submitters_never_launch_a_tick_twice(stack: Stack,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="couler_submitter.schedules")
    a, b = stack.start(), stack.start()
    name = unique("shared")
    store = stack.store()
    try:
        with CoulerClient({"submitter": a.address}, timeout=60) as client:
            client.submitter.submit(cron_workflow(name, "* * * * * *"))
            wait_for("six ticks launched", lambda: len(launched(store, name)) >= 6)
            client.submitter.pause_schedule(name)
        with CoulerClient({"submitter": b.address}, timeout=60) as other:  # the same store
            assert {s.name: s.paused for s in other.submitter.list_schedules()}[name]
        ticks = launched(store, name)
        runs = store.template_runs(name, list(RunState))
        # one run per launched tick, each the tick's own (its key), none without a tick
        assert sorted(r.run_id for r in runs) == sorted(run_id for _, run_id in ticks)
        assert {r.idempotency_key for r in runs} == {tick_key(name, t) for t, _ in ticks}
        assert len({t for t, _ in ticks}) == len(ticks)
        # consecutive seconds: neither submitter skipped or lost a tick to the other
        seconds = sorted(t for t, *_ in store.ticks(name))
        assert seconds == [seconds[0] + i for i in range(len(seconds))]
        # Both woke for the same ticks: the claim, not luck, kept them apart (the loser of a
        # tick gets the winner's run back).
        assert any("was launched by another submitter" in r.getMessage()
                   for r in caplog.records)
    finally:
        store.close()


# ----------------------------------------------------------------------------- the CLI


def _cli(address: str, *argv: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "couler", "schedule", *argv, "--address", address,
         "--token", token],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)


def test_couler_schedule_ls_pause_resume_as_a_process(stack: Stack, tmp_path: Path) -> None:
    submitter = stack.start(token=TOKEN)
    name = unique("nightly")
    program = tmp_path / "nightly.py"
    program.write_text(
        "import couler.argo as couler\n"
        f"couler.config_workflow(name={name!r}, cron_config={{'schedule': '0 2 * * *', "
        "'timezone': 'Europe/Paris', 'concurrency_policy': 'Forbid'})\n"
        "couler.run_container(image='alpine', command=['echo', 'nightly'], step_name='n')\n")
    submitted = subprocess.run(
        [sys.executable, "-m", "couler", "submit", str(program), "--address",
         submitter.address, "--token", TOKEN],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == name
    assert f"registered as schedule {name!r}" in submitted.stderr
    ls = _cli(submitter.address, "ls")
    assert ls.returncode == 0, ls.stderr
    header, row = ls.stdout.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "CRON", "TIMEZONE", "POLICY"]
    assert row.split()[:2] == [name, "0"] and "Europe/Paris" in row and "forbid" in row
    assert "active" in row
    paused = _cli(submitter.address, "pause", name)
    assert paused.returncode == 0, paused.stderr
    assert f"schedule {name!r} paused" in paused.stdout
    assert "paused" in _cli(submitter.address, "ls").stdout.splitlines()[1]
    resumed = _cli(submitter.address, "resume", name)
    assert resumed.returncode == 0 and f"schedule {name!r} resumed" in resumed.stdout
    assert "next tick" in resumed.stdout
    missing = _cli(submitter.address, "pause", "no-such-schedule")
    assert missing.returncode != 0 and "schedule 'no-such-schedule' does not exist" in \
        missing.stderr
    refused = _cli(submitter.address, "ls", token="wrong")
    assert refused.returncode != 0 and "token" in refused.stderr.lower()


# ----------------------------------------------------------------------------- event triggers


@pytest.fixture
def secure_stack(postgres_url: str, tmp_path: Path) -> Iterator[tuple[SecureNatsServer, Any]]:
    """A NATS with the deployment's identities and two launchers, ``etl`` and ``other``;
    the optimizer and a submitter connected as themselves."""
    server = SecureNatsServer(make_root("sched-secure"))
    server.files.add_launcher("etl")
    server.files.add_launcher("other")
    server.start()
    services: list[Any] = []
    try:
        services.append(RunningService(OptimizerSettings.load(
            "optimizer", grpc_address="127.0.0.1:0", state_dir=tmp_path / "optimizer",
            database_url=fresh_database(postgres_url), cache_address="", auth_token=None,
            otel_endpoint=None, **server.settings("optimizer")), build_optimizer).start())
        services.append(ServiceThread(SubmitterSettings.load(
            "submitter", grpc_address="127.0.0.1:0", state_dir=tmp_path,
            database_url=fresh_database(postgres_url), artifacts=str(tmp_path / "blobs"),
            auth_token=None, otel_endpoint=None, runs_dir=str(tmp_path / "runs"),
            engines="local,dryrun", outbox_interval=1.0,
            **server.settings("submitter"))).start())
        yield server, services[-1]
    finally:
        for service in reversed(services):
            service.stop()
        server.stop()


async def _as_launcher(server: SecureNatsServer, name: str, subject: str,
                       parameters: dict[str, str], key: str) -> None:
    """Publish an event as outside launcher ``name`` (plain nats-py, as its docs show)."""
    import nats as nats_py

    from couler.v1 import events_pb2

    identity = f"launch-{name}"
    nc = await nats_py.connect(server.url, nkeys_seed=str(server.files.seed_file(identity)),
                               inbox_prefix=f"_INBOX.{identity}")
    try:
        await nc.jetstream().publish(subject, events_pb2.LaunchRequest(
            parameters=parameters, idempotency_key=key).SerializeToString())
    finally:
        await nc.close()


def as_launcher(server: SecureNatsServer, name: str, subject: str,
                parameters: dict[str, str], key: str) -> None:
    asyncio.run(_as_launcher(server, name, subject, parameters, key))


def triggered_workflow(name: str, **annotations: str) -> ir.Workflow:
    return ir.Workflow(
        name=name, steps=(ir.Step(
            name="react", body=ir.ContainerSpec(image="alpine", command=(
                "echo", "{{inputs.rows}}")),
            inputs=(ir.InputParameter("rows", ir.WorkflowParamRef("rows")),)),),
        parameters=(ir.Parameter("rows", default=ir.Literal.of("0")),),
        triggers=(ir.EventTrigger("datasets.ready", "body.rows > 0 and body.kind == 'csv'"),),
        annotations=tuple(annotations.items()))


def test_event_triggers_launch_only_for_allowed_launchers_and_matching_events(
        secure_stack: tuple[SecureNatsServer, Any], caplog: pytest.LogCaptureFixture) -> None:
    server, submitter = secure_stack
    caplog.set_level(logging.INFO, logger="couler_submitter.service")
    name = unique("on-data")
    wf = triggered_workflow(name, **{"couler.io/launchers": "etl"})
    with CoulerClient({"submitter": submitter.address}, timeout=60) as client:
        sub = client.submitter.submit(wf)
        assert (sub.run_id, sub.schedule) == ("", name)  # registered, nothing run
        with pytest.raises(UserError, match=r"triggers\[0\]\.filter"):
            client.submitter.submit(dataclasses.replace(
                triggered_workflow(unique("bad")),
                triggers=(ir.EventTrigger("x", "__import__('os')"),)))

        def runs() -> list[Any]:
            return list(client.submitter.list(workflow=name).runs)

        # 1. a launcher not allowed to launch the workflow: logged, nothing launched
        as_launcher(server, "other", "couler.event.other.datasets.ready",
                    {"rows": "5", "kind": "csv"}, "o-1")
        wait_for("the refusal logged", lambda: any(
            "from launcher 'other': not allowed to launch workflow" in r.getMessage()
            for r in caplog.records))
        # 2. the allowed launcher, an event the filter does not take: nothing launched
        as_launcher(server, "etl", "couler.event.etl.datasets.ready",
                    {"rows": "0", "kind": "csv"}, "e-1")
        wait_for("the non-matching event seen", lambda: any(
            "no filter of workflow" in r.getMessage() for r in caplog.records))
        # 3. the allowed launcher, a matching event: one run, with the event's parameter
        as_launcher(server, "etl", "couler.event.etl.datasets.ready",
                    {"rows": "12", "kind": "csv", "undeclared": "x"}, "e-2")
        run = wait_for("the triggered run succeeded", lambda: next(
            (r for r in runs() if r.state is RunState.SUCCEEDED), None))
        assert run.parameters == {"rows": "12"} and run.template == name
        assert run.idempotency_key == f"event.{name}.etl.e-2"
        full = client.submitter.get(run.run_id)
        assert full.steps[0].state.value == "succeeded"
        assert client.submitter.logs(run.run_id, "react").strip().startswith("12")
        # the same event again (a redelivery, a retrying publisher): still one run
        as_launcher(server, "etl", "couler.event.etl.datasets.ready",
                    {"rows": "12", "kind": "csv"}, "e-2")
        wait_for("the repeat seen", lambda: sum(
            "(launched already)" in r.getMessage() for r in caplog.records) >= 1)
        assert len(runs()) == 1
    # 4. a launcher cannot publish under another's name: the server refuses it
    with pytest.raises(Exception, match=r"(?i)permission|timeout|no response"):
        as_launcher(server, "other", "couler.event.etl.datasets.ready",
                    {"rows": "5", "kind": "csv"}, "forged")
