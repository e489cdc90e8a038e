"""Attacks on the real stack's bus, as a process on the same machine would try them.

Each attack was measured to work on the stack before the bus was authenticated (remote
code execution by a forged plan, cache poisoning, feedback injection, launches, consumer
deletion, fake runs on the dashboard). Here every one is refused and leaves no effect:
anonymous clients cannot connect; a stolen service credential publishes only that
service's subjects; a message the server lets through but that its subject's owner did
not sign is refused by the consumer (dead-lettered as unauthenticated, failing nothing);
what even the owner signs is checked against the state it claims to change.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client as NatsClient

from couler import ir
from couler.v1 import common_pb2, events_pb2
from couler_runtime import codec, stack
from couler_runtime.bus_access import SERVICES, deadletter_subject, owners
from couler_runtime.bus_keys import BusFiles, BusIdentity, new_seed, signing_input
from couler_runtime.rpc.records import (
    Plan,
    Recommendation,
    RecommendationKind,
    RunState,
    plan_to_proto,
    recommendation_to_proto,
    run_to_proto,
)
from tests.waiting import aeventually, eventually

from .conftest import Stack

pytestmark = [pytest.mark.slow]

PY = "python:3.12-alpine"
EVENT_SUBJECTS = (
    "couler.workflow.requested", "couler.workflow.generated", "couler.workflow.optimized",
    "couler.workflow.rejected", "couler.workflow.submitted", "couler.workflow.finished",
    "couler.step.succeeded", "couler.metrics.utilization", "couler.feedback.any",
    "couler.cache.committed", "couler.launch.any", *(deadletter_subject(s) for s in SERVICES),
)


def workflow(name: str, marker: Path | None = None) -> ir.Workflow:
    source = "print('ok')" if marker is None else f"open({str(marker)!r}, 'w').write('ran')"
    return ir.Workflow(name=name, steps=(
        ir.Step(name="only", body=ir.ScriptSpec(image=PY, source=source)),))


def headers_for(subject: str, message: Any, signer: BusIdentity | None, *,
                run_id: str = "", msg_id: str = "") -> dict[str, str]:
    """The headers a forger would write; signed with ``signer`` when given."""
    import hashlib

    body = message.SerializeToString() if hasattr(message, "SerializeToString") else message
    hdrs = {"Nats-Msg-Id": msg_id or uuid.uuid4().hex, "couler-event-id": uuid.uuid4().hex,
            "couler-event-type": (message.DESCRIPTOR.full_name
                                  if hasattr(message, "DESCRIPTOR") else "x"),
            "couler-source": "forger", "couler-time": "2026-12-01T00:00:00.000+00:00",
            "couler-tenant": ""}
    if run_id:
        hdrs["couler-run-id"] = run_id
    if signer is not None:
        hdrs["couler-signer"] = signer.name
        hdrs["couler-signature"] = signer.sign(signing_input(
            subject, hdrs, hashlib.sha256(body).hexdigest()))
    return hdrs


async def publish_raw(live: Stack, identity: str, subject: str, body: bytes,
                      headers: dict[str, str], *, refused: bool = False) -> list[str]:
    """Publish with ``identity``'s server credential; the server's complaints -- with
    ``refused``, once its permissions violation has arrived (asynchronously). A publish
    the server accepts is shown by what its consumers do with it (the callers check)."""
    errors: list[str] = []
    nc = await live.raw(identity, errors)
    try:
        await nc.publish(subject, body, headers=headers)
        await nc.flush()
        if refused:
            await aeventually(lambda: any("permissions violation" in e for e in errors),
                              f"the server refusing {identity} on {subject}")
    finally:
        await nc.close()
    return errors


async def letters(live: Stack) -> list[events_pb2.DeadLetter]:
    """The dead letters the services recorded (what a fuzzer sent there itself is not one)."""
    found = []
    for m in await live.stored("couler.deadletter.>"):
        if (m.headers or {}).get("couler-source", "").startswith("couler-"):
            found.append(events_pb2.DeadLetter.FromString(m.data))
    return found


def quiet(live: Stack) -> dict[str, int]:
    """Stream counts once nothing has changed for a second (earlier runs have finished)."""
    last = asyncio.run(live.stream_counts())
    for _ in range(30):
        time.sleep(1.0)
        now = asyncio.run(live.stream_counts())
        if now == last:
            return now
        last = now
    return last


# ----------------------------------------------------------------------------- access


def test_anonymous_clients_are_refused(live: Stack) -> None:
    async def attempt() -> None:
        nc = NatsClient()
        try:
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await nc.connect(live.nats_url, allow_reconnect=False, connect_timeout=3)
        finally:
            await nc.close()

    asyncio.run(attempt())


def test_a_key_of_another_deployment_is_refused(live: Stack, tmp_path: Path) -> None:
    stranger = BusFiles.create(tmp_path / "stranger")

    async def attempt() -> None:
        nc = NatsClient()
        try:
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await nc.connect(live.nats_url, allow_reconnect=False, connect_timeout=3,
                                 nkeys_seed=str(stranger.seed_file("optimizer")),
                                 tls=live.files.client_tls())
        finally:
            await nc.close()

    asyncio.run(attempt())


@pytest.mark.parametrize("identity", SERVICES)
def test_a_stolen_service_credential_publishes_only_that_services_subjects(
        live: Stack, identity: str) -> None:
    before = quiet(live)
    foreign = [s for s in EVENT_SUBJECTS if identity not in owners(s)]

    async def attack() -> list[str]:
        errors: list[str] = []
        nc = await live.raw(identity, errors)
        try:
            for subject in foreign:
                await nc.publish(subject, b"forged")
            await nc.flush()
            await aeventually(lambda: len(errors) >= len(foreign), "every refusal")
        finally:
            await nc.close()
        return errors

    errors = asyncio.run(attack())
    for subject in foreign:
        assert any(f'permissions violation for publish to "{subject}"' in e for e in errors)
    assert asyncio.run(live.stream_counts()) == before  # nothing was stored


@pytest.mark.parametrize("identity", SERVICES)
def test_no_service_credential_can_stop_launches(live: Stack, identity: str) -> None:
    """Deleting the consumer ``submitter-launch`` once stopped every launch silently."""
    async def attack() -> list[str]:
        errors: list[str] = []
        nc = await live.raw(identity, errors)
        js = nc.jetstream(timeout=1.0)
        try:
            for call in (lambda: js.delete_consumer("COULER_LAUNCH", "submitter-launch"),
                         lambda: js.delete_stream("COULER_LAUNCH"),
                         lambda: js.purge_stream("COULER_WORKFLOW")):
                with pytest.raises(nats.errors.TimeoutError):
                    await call()
        finally:
            await nc.close()
        return errors

    errors = asyncio.run(attack())
    assert sum("permissions violation" in e for e in errors) == 3, errors

    async def still_there() -> str:
        async with live.admin() as bus:
            info = await bus.jetstream.consumer_info("COULER_LAUNCH", "submitter-launch")
            return info.name or ""

    assert asyncio.run(still_there()) == "submitter-launch"


# ----------------------------------------------------------------------------- forgeries


def _forged_plan(run_id: str, marker: Path) -> events_pb2.WorkflowOptimized:
    evil = ir.Workflow(name="evil", steps=(ir.Step(
        name="pwn", body=ir.ContainerSpec(image="alpine", command=(
            "sh", "-c", f"id > {marker}"))),))
    plan = Plan(workflow=evil, engine="local")
    return events_pb2.WorkflowOptimized(run_id=run_id, plan=plan_to_proto(plan),
                                        options=events_pb2.RunOptions(engine="local"))


def test_a_forged_plan_never_runs(live: Stack, tmp_path: Path) -> None:
    """The remote-code-execution attack: a plan for a real run, published first, with the
    predictable msg id of the real one, by every way a thief could try."""
    marker = tmp_path / "pwned"
    stranger = BusIdentity("optimizer", new_seed())  # signs as "optimizer", wrong key
    generator = live.files.identity("generator")
    sub = live.client.submitter.submit(workflow("victim"), engine="local")
    forged = _forged_plan(sub.run_id, marker)
    body = forged.SerializeToString()
    subject = "couler.workflow.optimized"

    async def attack() -> tuple[list[str], list[str], list[str]]:
        predictable = f"{sub.run_id}.optimized"
        unsigned = await publish_raw(live, "optimizer", subject, body, headers_for(
            subject, forged, None, run_id=sub.run_id, msg_id=predictable))
        wrong_key = await publish_raw(live, "optimizer", subject, body, headers_for(
            subject, forged, stranger, run_id=sub.run_id, msg_id=predictable + "2"))
        not_owner = await publish_raw(live, "generator", subject, body, headers_for(
            subject, forged, generator, run_id=sub.run_id), refused=True)
        return unsigned, wrong_key, not_owner

    unsigned, wrong_key, not_owner = asyncio.run(attack())
    assert unsigned == [] and wrong_key == []  # the server lets the optimizer's seed publish
    assert any("permissions violation" in e for e in not_owner)
    run = live.wait_run(sub.run_id)
    assert run.state is RunState.SUCCEEDED, run.message
    assert [s.name for s in run.steps] == ["only"]
    assert not marker.exists()
    refused = [d for d in asyncio.run(letters(live))
               if d.durable == "submitter-optimized" and not d.authenticated]
    reasons = " | ".join(d.reason for d in refused)
    assert "unsigned message" in reasons and "does not match its content" in reasons
    assert all(d.run_id == "" for d in refused)  # a forgery cannot fail someone's run


def test_a_forged_step_event_poisons_neither_cache_nor_dashboard(live: Stack) -> None:
    key = "f" * 64
    fake_run = f"fake-{uuid.uuid4().hex[:8]}"
    event = events_pb2.StepEvent(run_id=fake_run, workflow="victim", engine="local",
                                 step=common_pb2.StepRecord(
                                     name="only", state=common_pb2.STEP_STATE_SUCCEEDED,
                                     attempts=1, cache_key=key, outputs={"result": "evil"}))
    subject = "couler.step.succeeded"
    stranger = BusIdentity("submitter", new_seed())
    asyncio.run(publish_raw(live, "submitter", subject, event.SerializeToString(),
                            headers_for(subject, event, None, run_id=fake_run)))
    asyncio.run(publish_raw(live, "submitter", subject, event.SerializeToString(),
                            headers_for(subject, event, stranger, run_id=fake_run)))

    def refused_by(durable: str) -> bool:
        return sum(1 for d in asyncio.run(letters(live))
                   if d.durable == durable and fake_run in d.headers.get(
                       "couler-run-id", "")) >= 2

    eventually(lambda: refused_by("cache") and refused_by("monitor-steps"),
               "cache and monitor refused both")
    assert key not in live.client.cache.lookup([key]).entries
    dashboard = live.info.dashboard.rstrip("/")
    answer = httpx.get(f"{dashboard}/api/runs/{fake_run}",
                       headers={"Authorization": f"Bearer {live.info.token}"}, timeout=10)
    assert answer.status_code == 404


@pytest.mark.parametrize("how", ["unsigned", "signed by a compromised monitor"])
def test_injected_feedback_is_refused(live: Stack, how: str) -> None:
    """A memory limit of 1Ki once OOM-killed every later run of the workflow."""
    name = f"feedback-{uuid.uuid4().hex[:6]}"
    rec = Recommendation(workflow=name, step="only", kind=RecommendationKind.MEMORY_LIMIT,
                         value="1Ki", reason="forged", id=uuid.uuid4().hex)
    message = recommendation_to_proto(rec)
    subject = f"couler.feedback.{name}"
    if how == "unsigned":
        asyncio.run(publish_raw(live, "monitor", subject, message.SerializeToString(),
                                headers_for(subject, message, None)))
    else:
        async def compromised() -> None:
            bus = await live.bus("monitor")
            try:
                await bus.publish(subject, message, msg_id=rec.id)
            finally:
                await bus.close()

        asyncio.run(compromised())

    def refused() -> bool:
        return any(d.durable == "optimizer-feedback" and d.subject == subject
                   for d in asyncio.run(letters(live)))

    eventually(refused, "the optimizer refused the recommendation")
    reasons = [d.reason for d in asyncio.run(letters(live)) if d.subject == subject]
    assert ("unsigned" in reasons[0]) if how == "unsigned" else ("outside 4Mi" in reasons[0])
    sub = live.client.submitter.submit(workflow(name), engine="local")
    run = live.wait_run(sub.run_id)
    assert run.state is RunState.SUCCEEDED, run.message
    notes = [n for p in run.passes for n in p.notes]
    assert not any("1Ki" in n for n in notes), notes


def test_launches_need_a_launch_credential(live: Stack) -> None:
    name = f"tpl-{uuid.uuid4().hex[:6]}"
    live.client.submitter.register_template(name, workflow(name))
    before = {r.run_id for r in live.client.submitter.list(page_size=200).runs}
    launch = events_pb2.LaunchRequest(template=name, idempotency_key="k1")
    subject = f"couler.launch.{name}"
    for identity in SERVICES:  # no service may launch
        errors = asyncio.run(publish_raw(live, identity, subject, launch.SerializeToString(),
                                         headers_for(subject, launch, None), refused=True))
        assert any("permissions violation" in e for e in errors), identity
    # (none of them created a run: the last check counts one new run, the launcher's)
    # a launch credential can, and can do nothing else
    seed = live.files.add_launcher(f"bot-{uuid.uuid4().hex[:4]}")
    os.kill(live.info.pids["nats"], signal.SIGHUP)  # reload the configuration

    async def as_launcher() -> list[str]:
        errors: list[str] = []

        async def on_error(e: Exception) -> None:
            errors.append(str(e))

        async def connect() -> Any:
            # the server knows the new key once it has reloaded: until then it refuses
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                nc = NatsClient()
                try:
                    await nc.connect(
                        live.nats_url, nkeys_seed=str(seed), error_cb=on_error,
                        inbox_prefix=f"_INBOX.{seed.stem}", allow_reconnect=False,
                        max_reconnect_attempts=0, tls=live.files.client_tls())
                    return nc
                except (nats.errors.Error, OSError):
                    # without reconnects nats-py raises with its socket still open: close
                    # it here, not in a later test's garbage collection (ResourceWarning)
                    await nc.close()
                    if asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.1)

        nc = await connect()
        errors.clear()  # the refusals before the reload
        try:
            ack = await nc.jetstream().publish(subject, launch.SerializeToString(),
                                               headers={"Nats-Msg-Id": "launch-1"})
            assert ack.seq > 0
            await nc.publish("couler.workflow.optimized", b"x")
            await nc.flush()
            await aeventually(lambda: bool(errors), "a violation")
        finally:
            await nc.close()
        return errors

    errors = asyncio.run(as_launcher())
    assert any('publish to "couler.workflow.optimized"' in e for e in errors)
    eventually(lambda: len({r.run_id for r in live.client.submitter.list(
        page_size=200).runs} - before) == 1, "one launched run")


# ----------------------------------------------------------------------------- poison


def test_a_poison_plan_fails_its_run_with_the_reason(live: Stack) -> None:
    """A plan its consumer cannot use (here: signed by the optimizer, but naming an engine
    the run did not ask for) is dead-lettered and fails the run instead of stranding it."""
    optimizer_pid = live.info.pids["optimizer"]
    os.kill(optimizer_pid, signal.SIGSTOP)  # the run waits in PLANNING
    try:
        sub = live.client.submitter.submit(workflow("poisoned"), engine="local")
        eventually(lambda: live.client.submitter.get(sub.run_id).state in (
            RunState.PLANNING, RunState.ACCEPTED), "planning")
        poison = events_pb2.WorkflowOptimized(run_id=sub.run_id, plan=plan_to_proto(Plan(
            workflow=workflow("poisoned"), engine="dryrun")))

        async def send() -> None:
            bus = await live.bus("optimizer")
            try:
                await bus.publish("couler.workflow.optimized", poison,
                                  msg_id=f"{sub.run_id}.poison", run_id=sub.run_id)
            finally:
                await bus.close()

        asyncio.run(send())
        run = live.wait_run(sub.run_id)
    finally:
        os.kill(optimizer_pid, signal.SIGCONT)
    assert run.state is RunState.FAILED
    assert "submitter-optimized" in run.message and "engine 'dryrun'" in run.message
    later = live.client.submitter.submit(workflow("after-poison"), engine="local")
    assert live.wait_run(later.run_id).state is RunState.SUCCEEDED


# ----------------------------------------------------------------------------- fuzzing


def _consumed_subjects() -> list[tuple[str, str, type[Any]]]:
    """(subject, owner, message type) for every subject a service consumes."""
    from couler.v1 import events_pb2 as ev

    return [
        ("couler.workflow.requested", "submitter", ev.WorkflowRequested),
        ("couler.workflow.generated", "generator", ev.WorkflowGenerated),
        ("couler.workflow.optimized", "optimizer", ev.WorkflowOptimized),
        ("couler.workflow.rejected", "optimizer", ev.WorkflowRejected),
        ("couler.workflow.submitted", "submitter", ev.WorkflowSubmitted),
        ("couler.workflow.finished", "submitter", ev.WorkflowFinished),
        ("couler.step.succeeded", "submitter", ev.StepEvent),
        ("couler.metrics.utilization", "submitter", common_pb2.UtilizationSample),
        ("couler.feedback.fuzz", "monitor", common_pb2.Recommendation),
        ("couler.deadletter.cache", "cache", ev.DeadLetter),
    ]


def _mutations(seed: bytes, data: Any) -> list[bytes]:
    """Random bodies and damaged copies of a valid one (bit flips, cuts, splices)."""
    from hypothesis import strategies as st

    out = data.draw(st.lists(st.binary(max_size=512), min_size=1, max_size=6))
    for _ in range(data.draw(st.integers(0, 6))):
        if not seed:
            break
        i = data.draw(st.integers(0, len(seed) - 1))
        how = data.draw(st.sampled_from(["flip", "cut", "splice"]))
        if how == "flip":
            out.append(seed[:i] + bytes([seed[i] ^ data.draw(st.integers(1, 255))])
                       + seed[i + 1:])
        elif how == "cut":
            out.append(seed[:i])
        else:
            out.append(seed[:i] + data.draw(st.binary(max_size=64)) + seed[i:])
    return out


def test_fuzzed_payloads_on_every_consumed_subject(live: Stack) -> None:
    """Hypothesis-made bodies on every subject a service consumes: unsigned, signed by a
    stranger, and signed by the owner (a buggy or compromised service). The services stay
    up, nothing unauthenticated is applied, and the stack still runs work afterwards."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    runs_before = {r.run_id for r in live.client.submitter.list(page_size=500).runs}
    valid = live.client.submitter.submit(workflow("fuzz-seed"), engine="local")
    live.wait_run(valid.run_id)
    seed_bytes = {
        "couler.workflow.finished": events_pb2.WorkflowFinished(
            run=run_to_proto(live.client.submitter.get(valid.run_id))).SerializeToString(),
        "couler.workflow.requested": events_pb2.WorkflowRequested(
            run_id="fuzz", workflow=codec.workflow_to_proto(workflow("fuzz"))
        ).SerializeToString(),
    }
    stranger = {name: BusIdentity(name, new_seed()) for name in SERVICES}
    subjects = _consumed_subjects()

    @settings(max_examples=12, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        subject, owner, message_type = data.draw(st.sampled_from(subjects))
        bodies = _mutations(seed_bytes.get(subject, message_type().SerializeToString()),
                            data)

        async def send() -> None:
            errors: list[str] = []
            nc = await live.raw(owner, errors)
            js = nc.jetstream()
            try:
                for body in bodies:
                    stub = message_type()
                    for signer in (None, stranger[owner], live.files.identity(owner)):
                        hdrs = headers_for(subject, stub, signer, run_id="fuzz")
                        import hashlib

                        if signer is not None:  # sign the actual body
                            hdrs.pop("couler-signature")
                            hdrs["couler-signature"] = signer.sign(signing_input(
                                subject, hdrs, hashlib.sha256(body).hexdigest()))
                        await js.publish(subject, body, headers=hdrs, timeout=10)
            finally:
                await nc.close()

        asyncio.run(send())

    fuzz()
    # every service is still up and serving; the stack still runs work
    _, alive = stack.status(live.home)
    assert all(alive.values()), alive
    assert live.client.cache.stats() is not None
    assert live.client.monitor.recommendations("fuzz") == ()
    assert live.client.optimizer.optimize(workflow("fuzz-check")).workflow.name == "fuzz-check"
    after = live.client.submitter.submit(workflow("after-fuzz"), engine="local")
    assert live.wait_run(after.run_id).state is RunState.SUCCEEDED
    new = {r.run_id for r in live.client.submitter.list(page_size=500).runs} - runs_before
    assert new == {valid.run_id, after.run_id}  # the fuzz created no run
    unauthenticated = [d for d in asyncio.run(letters(live))
                       if not d.authenticated and d.headers.get("couler-run-id") == "fuzz"]
    assert unauthenticated, "the unsigned and stranger-signed bodies were dead-lettered"
