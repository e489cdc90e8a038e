"""A workflow too large for its engine, through a stack started as a user would: the
user's settings reach the services, NATS runs TLS, and the home is private.

``couler up`` runs with ``COULER_MAX_STEPS_PER_CHUNK=2`` in its environment: the stack's
optimizer gets a budget of two steps per chunk (the same pass that fits a workflow to
Argo's object size limit), so a five-step chain is split into an acyclic graph of chunks.
The submitter runs them in order on the local engine, passing each hand-off output to the
next chunk; a second submit of the same workflow finds every step in the cache and runs
nothing. The same environment has ``COULER_NATS_TLS=true`` (NATS with TLS),
``COULER_BUS_INSECURE=true`` and a ``COULER_NATS_URL`` (which must not reach the services:
the stack decides those), and ``--secrets-file`` names a 0600 file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import psutil  # type: ignore[import-untyped]
import pytest
from nats.aio.client import Client as NatsClient

from couler import ir
from couler.engines.base import StepState
from couler.v1 import events_pb2
from couler_runtime import stack
from couler_runtime.bus_keys import BusFiles
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState
from tests.e2e.conftest import (
    DEADLINE,
    Stack,
    couler_cli,
    leftovers,
    loose_modes,
    recorded_pids,
    script,
    stop_stack,
    stored_events,
    unique,
    wait_until,
)

STEPS = 5
SECRET = f"pw-{uuid.uuid4().hex}"
USER_ENV = {"COULER_MAX_STEPS_PER_CHUNK": "2", "COULER_NATS_TLS": "true",
            "COULER_BUS_INSECURE": "true", "COULER_NATS_URL": "nats://127.0.0.1:1"}


@pytest.fixture(scope="module")
def secrets_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secrets") / "secrets.json"
    path.write_text(json.dumps({"db": {"password": SECRET}}))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, secrets_file: Path) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("couler-split")
    home.chmod(0o755)  # `couler up` makes it private
    try:
        up = couler_cli(home, "up", "--secrets-file", str(secrets_file), env=USER_ENV)
        assert up.returncode == 0, up.stderr
        info = stack.status(home)[0]
        s = Stack(home, info, CoulerClient(info.addresses, token=info.token))
    except BaseException:
        if (home / "stack.json").exists():
            pids = recorded_pids(home)
            stack.down(home)
            assert leftovers(home, pids) == []
        raise
    try:
        yield s
    finally:
        stop_stack(s)


def counting_chain(name: str) -> ir.Workflow:
    """s0 prints 1; each next step prints its input + 1 (so s4 prints 5)."""
    out = (ir.OutputParameter("n", source=ir.OutputSource.STDOUT),)
    steps = [script("s0", "print(1)", outputs=out)]
    for i in range(1, STEPS):
        steps.append(script(
            f"s{i}", "import os\nprint(int(os.environ['N']) + 1)", outputs=out,
            env=(ir.EnvVar("N", "{{inputs.n}}"),),
            inputs=(ir.InputParameter("n", ir.StepOutputRef(f"s{i - 1}", "n")),),
            dependencies=(ir.Dependency(f"s{i - 1}"),)))
    return ir.Workflow(name=name, steps=tuple(steps))


def test_a_split_workflow_runs_chunk_by_chunk_and_is_cached_the_second_time(
        small: Stack) -> None:
    wf = counting_chain(unique("split"))
    first = small.client.submitter.submit(wf)
    run = small.client.submitter.wait(first.run_id, timeout=DEADLINE)
    assert run.state is RunState.SUCCEEDED, run.message
    assert run.step(f"s{STEPS - 1}").outputs == {"n": str(STEPS)}
    split = next(p for p in run.passes if p.name == "split")
    assert split.changed, split
    chunk_dirs = sorted(p.name for p in small.runs_dir.iterdir()
                        if p.name.startswith(first.run_id + "-"))
    assert len(chunk_dirs) == 3  # 5 steps, at most 2 per chunk
    assert not (small.runs_dir / first.run_id).exists()  # never run in one piece
    assert {s.name: (s.state, s.attempts, s.message) for s in run.steps} == {
        f"s{i}": (StepState.SUCCEEDED, 1, "") for i in range(STEPS)}
    # the cache commits a step when it consumes the step's event: after the run may end
    keys = [s.cache_key for s in run.steps]
    assert all(keys), keys
    wait_until(lambda: not small.client.cache.lookup(keys).missing,
               "the cache committed every step")

    again = small.client.submitter.submit(wf)
    run = small.client.submitter.wait(again.run_id, timeout=DEADLINE)
    assert run.state is RunState.SUCCEEDED, run.message
    assert {s.name: (s.state, s.attempts) for s in run.steps} == {
        f"s{i}": (StepState.CACHED, 0) for i in range(STEPS)}
    assert run.step(f"s{STEPS - 1}").outputs == {"n": str(STEPS)}



def test_a_step_gets_its_secret_from_the_secrets_file_and_it_is_written_nowhere(
        small: Stack) -> None:
    source = ("import hashlib, os\n"
              "print(hashlib.sha256(os.environ['PW'].encode()).hexdigest())")
    wf = ir.Workflow(name=unique("secret"), steps=(script(
        "use", source, outputs=(ir.OutputParameter("h", source=ir.OutputSource.STDOUT),),
        env=(ir.EnvVar("PW", secret=ir.SecretRef("db", "password")),)),))
    sub = small.client.submitter.submit(wf)
    run = small.client.submitter.wait(sub.run_id, timeout=DEADLINE)
    assert run.state is RunState.SUCCEEDED, run.message
    assert run.step("use").outputs == {"h": hashlib.sha256(SECRET.encode()).hexdigest()}
    # not in the record, nor in any file of the stack: JetStream's store (every event),
    # the databases, the logs, the run directories
    assert SECRET not in repr(run)
    assert any((small.home / "jetstream").rglob("*.blk"))
    for path in small.home.rglob("*"):
        if path.is_file() and path.stat().st_size < 50 * 1024 * 1024:
            assert SECRET.encode() not in path.read_bytes(), path


def test_the_users_settings_reach_the_services_and_the_stacks_own_win(
        small: Stack, secrets_file: Path) -> None:
    info = small.info
    assert info.passed == ["COULER_MAX_STEPS_PER_CHUNK", "COULER_SECRETS_FILE"]
    files = BusFiles(small.home / "bus")
    assert files.tls is not None
    for name in stack.SERVICES:
        env = psutil.Process(info.pids[name]).environ()
        assert env["COULER_MAX_STEPS_PER_CHUNK"] == "2", name
        assert env["COULER_SECRETS_FILE"] == str(secrets_file.resolve()), name
        assert env["COULER_BUS_INSECURE"] == "false", name
        assert env["COULER_NATS_URL"] == info.nats_url, name
        assert env["COULER_NATS_SEED_FILE"] == str(files.seed_file(name)), name
        assert env["COULER_NATS_TRUST_FILE"] == str(files.trust_file), name
        assert env["COULER_NATS_TLS_CA"] == str(files.tls.ca), name
        assert "COULER_NATS_TLS" not in env, name
    # the secret values the user passes are not written down (only their names)
    assert str(secrets_file) not in (small.home / "stack.json").read_text()


def test_nats_runs_tls_and_refuses_who_has_no_identity(small: Stack) -> None:
    url = small.info.nats_url
    assert url.startswith("tls://127.0.0.1:")
    ca = BusFiles(small.home / "bus").client_tls()

    async def anonymous(**kw: object) -> str:
        nc = NatsClient()
        try:
            with pytest.raises((nats.errors.Error, OSError)) as refused:
                await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0,
                                 connect_timeout=2, **kw)
        finally:
            await nc.close()
        return str(refused.value)

    assert "authorization violation" in asyncio.run(anonymous(tls=ca)).lower()
    # the admin's identity over TLS reads what the services stored
    assert stored_events(small.home, "couler.workflow.submitted",
                         events_pb2.WorkflowSubmitted)


def test_a_secrets_file_others_can_read_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "secrets.json"
    loose.write_text("{}")
    loose.chmod(0o644)
    home = tmp_path / "home"
    done = couler_cli(home, "up", "--secrets-file", str(loose))
    assert done.returncode == 2, done.stderr
    assert f"secrets file {loose} is readable by others (mode 644); chmod 600" in done.stderr
    assert not (home / "stack.json").exists()


def test_every_directory_of_the_home_is_0700_and_every_file_0600(small: Stack) -> None:
    assert loose_modes(small.home) == []
