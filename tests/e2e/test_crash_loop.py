"""A service that cannot start: ``couler up`` says which and why, the supervisor keeps
starting it again with a growing back-off, and the rest of the stack runs and serves.

The generator gets an invalid setting (``COULER_LLM_MAX_ROUNDS=99``; at most 10), passed
to the services like any of the user's ``COULER_*`` settings; the others ignore it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from couler import ir
from couler_runtime import stack
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState
from couler_runtime.supervisor import backoff_delay

from .conftest import (
    DEADLINE,
    couler_status,
    leftovers,
    recorded_pids,
    script,
    unique,
    wait_until,
)

pytestmark = [pytest.mark.slow]


@dataclass
class Looping:
    home: Path
    error: str  # what `up` said


@pytest.fixture(scope="module")
def looping(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Looping]:
    home = tmp_path_factory.mktemp("couler-loop")
    try:
        with pytest.raises(stack.StackStartError) as failed:
            stack.up(home, token=secrets.token_urlsafe(16),
                     extra_env={"COULER_LLM_MAX_ROUNDS": "99"})
        yield Looping(home, str(failed.value))
    finally:
        if (home / "stack.json").exists():
            pids = recorded_pids(home)
            stack.down(home)
            assert leftovers(home, pids) == []


def test_up_says_which_service_failed_and_why(looping: Looping) -> None:
    assert "the generator service failed to start (exit status 2)" in looping.error
    assert "COULER_LLM_MAX_ROUNDS" in looping.error  # the last lines of its log
    assert "`couler down`" in looping.error


def test_it_is_started_again_with_a_growing_back_off_while_the_others_serve(
        looping: Looping) -> None:
    def others_running() -> bool:
        procs = stack.status(looping.home)[0].processes
        return all(procs[n].state == "running" for n in stack.PROCESSES if n != "generator")

    wait_until(others_running, "the other processes running", deadline=DEADLINE)
    info, _ = stack.status(looping.home)
    others = {n: info.processes[n].pid for n in stack.PROCESSES if n != "generator"}
    wait_until(lambda: stack.status(looping.home)[0].processes["generator"].failures >= 3,
               "three failed starts of the generator", deadline=60)
    info, alive = stack.status(looping.home)
    rec = info.processes["generator"]
    assert rec.state == "restarting" and rec.last_exit == "exit status 2", rec
    assert rec.restarts >= 2 and rec.backoff == backoff_delay(rec.failures) >= 2.0, rec
    # the supervisor's log has each delay, in order
    said = re.findall(r"generator: exit status 2; starting it again in ([0-9.]+) s",
                      (looping.home / "logs" / "supervisor.log").read_text())
    assert said[:3] == ["0.5", "1.0", "2.0"], said
    # the others run on, never restarted
    for name, pid in others.items():
        assert alive[name] and info.processes[name].pid == pid, (name, info.processes[name])
        assert info.processes[name].restarts == 0
    code, shown = couler_status(looping.home)
    assert code == 1, shown  # not everything runs
    assert re.search(r"^  generator\s+restarting\s.*restarts \d+, last exit: exit status 2",
                     shown, re.M), shown
    assert re.search(r"^  submitter\s+running\s", shown, re.M), shown

    with CoulerClient(info.addresses, token=info.token) as client:  # a program: no generator
        out = (ir.OutputParameter("said", source=ir.OutputSource.STDOUT),)
        wf = ir.Workflow(name=unique("no-generator"),
                         steps=(script("hello", "print('hello')", outputs=out),))
        run = client.submitter.wait(client.submitter.submit(wf).run_id, timeout=DEADLINE)
    assert run.state is RunState.SUCCEEDED, run.message


def test_down_stops_the_loop_and_everything_else(looping: Looping) -> None:
    pids = recorded_pids(looping.home)
    stack.down(looping.home)
    assert not (looping.home / "stack.json").exists()
    assert leftovers(looping.home, pids) == []
