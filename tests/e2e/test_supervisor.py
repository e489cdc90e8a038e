"""The stack heals and guards itself: its supervisor, its bus's identities, its files.

One stack for the module (``couler_runtime.stack.up``), tests in file order:

* NATS refuses an anonymous client, and refuses a service's identity a subject it does not
  own (a permissions violation, nothing stored) -- a smoke test; ``tests/security`` attacks
  the bus in earnest;
* a service killed with SIGKILL comes back on its address (restarts 1) and serves;
* ``couler credentials launch ci-bot``: that seed launches a registered template and may
  publish nothing else; after ``couler credentials revoke ci-bot`` NATS refuses it;
* every directory under the home is 0700 and every file 0600;
* the supervisor killed with SIGKILL: ``couler up`` starts one that adopts the processes
  still running and starts the missing one; killed again, ``couler down`` stops everything
  itself and nothing is left.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from couler import ir
from couler.errors import ConflictError
from couler.v1 import events_pb2
from couler_runtime import stack
from couler_runtime.bus_keys import new_seed
from couler_runtime.rpc.records import RunState

from .conftest import (
    DEADLINE,
    Stack,
    connect_as,
    couler_cli,
    couler_status,
    crash,
    gone,
    leftovers,
    loose_modes,
    recorded_pids,
    script,
    stored_events,
    unique,
    wait_until,
)

pytestmark = [pytest.mark.slow]


def _hello(name: str) -> ir.Workflow:
    out = (ir.OutputParameter("said", source=ir.OutputSource.STDOUT),)
    return ir.Workflow(name=name, steps=(script("hello", "print('hello')", outputs=out),))


def _serves(live: Stack) -> None:
    """A new run goes through the whole stack and succeeds."""
    sub = live.client.submitter.submit(_hello(unique("serves")))
    run = live.client.submitter.wait(sub.run_id, timeout=DEADLINE)
    assert run.state is RunState.SUCCEEDED, run.message


def _errors() -> tuple[list[str], Callable[[Exception], Any]]:
    seen: list[str] = []

    async def error_cb(exc: Exception) -> None:
        seen.append(str(exc))

    return seen, error_cb


async def _refused(url: str, **kw: Any) -> str:
    """The error NATS answers a connection with (fails the test when it accepts it)."""
    _, quiet = _errors()
    nc = NatsClient()
    try:
        with pytest.raises(nats.errors.Error) as refused:
            await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0,
                             connect_timeout=2, error_cb=quiet, **kw)
    finally:
        await nc.close()  # a refused client still holds its socket
    return str(refused.value)


async def _violation(nc: Any, seen: list[str], subject: str) -> None:
    """Publish on ``subject`` and wait for the server's permissions violation."""
    await nc.publish(subject, b"forged")
    await nc.flush()
    for _ in range(100):
        if any("permissions violation" in e.lower() and subject in e for e in seen):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no permissions violation for {subject}: {seen}")


def test_nats_refuses_anonymous_clients_and_strangers(live: Stack) -> None:
    url = live.info.nats_url
    assert "authorization violation" in asyncio.run(_refused(url)).lower()
    # a well-formed nkey the server does not know
    stranger = asyncio.run(_refused(url, nkeys_seed_str=new_seed().decode(),
                                    inbox_prefix="_INBOX.stranger"))
    assert "authorization violation" in stranger.lower()


def test_an_identity_may_not_publish_a_subject_it_does_not_own(live: Stack) -> None:
    """The monitor publishes feedback only: its credential on couler.workflow.optimized
    (what makes the submitter run a plan) is refused by the server and nothing is stored."""
    subject = "couler.workflow.optimized"
    before = len(stored_events(live.home, subject, events_pb2.WorkflowOptimized))

    async def forge() -> None:
        seen, error_cb = _errors()
        nc = await connect_as(live.home, "monitor", error_cb=error_cb)
        try:
            await _violation(nc, seen, subject)
        finally:
            await nc.close()

    asyncio.run(forge())
    assert len(stored_events(live.home, subject, events_pb2.WorkflowOptimized)) == before


def test_a_killed_service_comes_back_on_its_address_and_serves(live: Stack) -> None:
    rec = crash(live, "optimizer")  # same address: asserted by crash()
    assert (rec.restarts, rec.last_exit, rec.failures) == (1, "killed by SIGKILL", 1)
    assert rec.backoff == 0.5  # the first restart's back-off
    _serves(live)


def test_a_launcher_starts_a_template_and_nothing_else_until_revoked(live: Stack) -> None:
    template = unique("nightly")
    live.client.submitter.register_template(template, _hello(template))
    made = couler_cli(live.home, "credentials", "launch", "ci-bot")
    assert made.returncode == 0, made.stderr
    seed_file = live.home / "bus" / "keys" / "launch-ci-bot.nk"
    for said in (f"NATS URL:     {live.info.nats_url}", f"seed file:    {seed_file}",
                 "inbox prefix: _INBOX.launch-ci-bot", "couler.launch.<template>",
                 "nkeys_seed=", "events_pb2.LaunchRequest("):
        assert said in made.stdout, made.stdout
    assert oct(seed_file.stat().st_mode & 0o777) == "0o600"
    listed = couler_cli(live.home, "credentials", "list")
    assert listed.stdout.split() == ["ci-bot"], listed
    seed = seed_file.read_bytes().strip()
    me = {"nkeys_seed_str": seed.decode(), "inbox_prefix": "_INBOX.launch-ci-bot"}

    async def launch() -> None:
        seen, error_cb = _errors()
        nc = await nats.connect(live.info.nats_url, error_cb=error_cb, **me)
        try:
            ack = await nc.jetstream().publish(
                f"couler.launch.{template}",
                events_pb2.LaunchRequest(idempotency_key="2026-12-01").SerializeToString(),
                headers={"Nats-Msg-Id": f"launch.{template}.2026-12-01"})
            assert ack.stream == "COULER_LAUNCH"
            await _violation(nc, seen, "couler.workflow.optimized")
        finally:
            await nc.close()

    asyncio.run(launch())
    wait_until(lambda: bool(live.client.submitter.list(workflow=template).runs),
               "the launched run", deadline=DEADLINE)
    (run,) = live.client.submitter.list(workflow=template).runs
    assert run.template == template
    assert live.client.submitter.wait(run.run_id, timeout=DEADLINE).state is RunState.SUCCEEDED

    revoked = couler_cli(live.home, "credentials", "revoke", "ci-bot")
    assert revoked.returncode == 0, revoked.stderr
    assert "the running nats-server refuses it" in revoked.stdout
    assert not seed_file.exists()
    refused = asyncio.run(_refused(live.info.nats_url, **me))
    assert "authorization violation" in refused.lower()
    assert couler_cli(live.home, "credentials", "list").stdout == ""


def test_every_directory_of_the_home_is_0700_and_every_file_0600(live: Stack) -> None:
    _serves(live)  # at least one run's directory in state/runs
    assert any((live.home / "state" / "runs").iterdir())
    assert loose_modes(live.home) == []


def test_a_dead_supervisor_is_replaced_by_up_and_down_works_without_one(live: Stack) -> None:
    info, alive = stack.status(live.home)
    assert all(alive.values()), alive
    before = {n: r.pid for n, r in info.processes.items()}
    os.kill(info.supervisor, signal.SIGKILL)
    wait_until(lambda: gone(info.supervisor), "the supervisor gone")
    os.kill(before["monitor"], signal.SIGKILL)  # and a service, while nobody supervises
    wait_until(lambda: gone(before["monitor"]), "the monitor gone")

    code, shown = couler_status(live.home)
    assert code == 1, shown
    assert "supervisor NOT RUNNING" in shown
    assert re.search(r"^  monitor\s+stopped\s", shown, re.M), shown
    assert re.search(r"^  submitter\s+running \(unsupervised\)\s", shown, re.M), shown

    adopted = stack.up(live.home)  # its token and addresses, as recorded
    assert adopted.supervisor not in (0, info.supervisor)
    assert adopted.token == info.token and adopted.addresses == info.addresses
    for name, pid in before.items():
        rec = adopted.processes[name]
        assert rec.state == "running", (name, rec)
        if name == "monitor":
            assert rec.pid != pid and rec.restarts == info.processes[name].restarts + 1
            assert rec.last_exit == "exited while no supervisor ran (status unknown)"
        else:
            assert rec.pid == pid, f"{name} was not adopted: {rec}"
    with pytest.raises(ConflictError, match="already running"):
        stack.up(live.home)
    live.refresh()
    _serves(live)

    # killed again: `couler down` stops what it recorded by itself
    pids = recorded_pids(live.home)
    os.kill(adopted.supervisor, signal.SIGKILL)
    wait_until(lambda: gone(adopted.supervisor), "the new supervisor gone")
    done = couler_cli(live.home, "down")
    assert done.returncode == 0, done.stderr
    assert not (live.home / "stack.json").exists()
    assert leftovers(live.home, pids) == []
    assert not Path(live.home / "supervisor.sock").exists()
