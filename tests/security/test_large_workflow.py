"""A 100,000-step workflow through the whole stack, as a user submits it.

``couler up`` starts the embedded stack; ``couler submit --engine dryrun --wait PROGRAM``
runs as a process of its own: the program builds the chain with the Python API, the CLI
uploads it in chunks (it is about 4 MiB encoded, over one message) and submits it by
reference; it travels as ``couler.workflow.requested`` (by reference through the payload
store) to the optimizer, comes back planned as ``couler.workflow.optimized``, is dry-run by
the submitter (every step recorded and published through the outbox, for the monitor and
the cache) and followed by the CLI until it finishes. No gRPC message and no NATS message
depends on the size of the workflow, so none may fail, no service may restart, and none
may log a traceback. Figures (time, memory) are in ``bench/README.md``
(``bench/bench_large.py``); nothing here is timed.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from couler.engines.base import StepState
from couler_runtime import stack
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState
from tests.e2e.conftest import leftovers

STEPS = 100_000
DEADLINE = 900.0  # seconds: a bound on a hung process, not an expectation

PROGRAM = '''\
import sys

import couler.argo as couler

with couler.workflow("hundred-thousand"):
    for k in range(int(sys.argv[1])):
        couler.run_container(image="alpine", command=["echo", str(k)], step_name=f"s{k}")
'''


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "couler"
    info = stack.up(home, token=secrets.token_urlsafe(16))
    try:
        yield home
    finally:
        latest = stack._read(home / "stack.json")
        pids = list((latest or info).pids.values())
        stack.down(home)
        assert leftovers(home, pids) == []


@pytest.mark.slow
def test_a_hundred_thousand_step_dry_run_through_the_cli(home: Path, tmp_path: Path) -> None:
    program = tmp_path / "chain.py"
    program.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    done = subprocess.run(
        [sys.executable, "-m", "couler", "submit", "--engine", "dryrun", "--wait",
         "--home", str(home), str(program), "--", str(STEPS)],
        env=env, capture_output=True, text=True, timeout=DEADLINE, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    words = done.stdout.split()
    assert words[0] == "run" and words[2] == "succeeded", done.stdout
    run_id = words[1]
    # The CLI followed every step: one line per step change (the dry run: one each).
    followed = [line for line in done.stderr.splitlines() if line.endswith(" succeeded")
                and "]   s" in line]
    assert len(followed) == STEPS

    info, alive = stack.status(home)
    assert all(alive.values()), alive
    with CoulerClient(info.addresses, token=info.token or None) as client:
        first = client.submitter.get_page(run_id, page_size=10)
        assert first.state is RunState.SUCCEEDED and first.workflow == "hundred-thousand"
        assert first.step_count == STEPS and first.next_step_page_token
        run = client.submitter.get(run_id)  # every step, a page at a time
        assert len(run.steps) == STEPS
        assert [s.name for s in run.steps[:2]] + [run.steps[-1].name] == ["s0", "s1", "s99999"]
        assert {s.state for s in run.steps} == {StepState.SUCCEEDED}
        listed = {r.run_id: r for r in client.submitter.list().runs}
        assert listed[run_id].steps == () and listed[run_id].step_count == STEPS

    latest, alive = stack.status(home)
    assert all(alive.values()), alive
    restarts = {name: p.restarts for name, p in latest.processes.items()}
    assert set(restarts.values()) == {0}, restarts
    assert latest.pids == info.pids  # the very processes that started
    tracebacks = {log.name for log in (home / "logs").glob("*.log")
                  if "Traceback" in log.read_text(errors="replace")}
    assert tracebacks == set()
