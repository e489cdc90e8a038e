"""The bus no one else can drive: nkey identities, permissions, signatures, payload refs.

Against a real nats-server configured as every deployment is (``SecureNatsServer``: the
configuration ``BusFiles`` writes from ``couler_runtime.bus_access``), and -- for the checks
a consumer makes on its own, whatever the server lets through -- against an open server.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from google.protobuf.wrappers_pb2 import StringValue

from couler.errors import UserError
from couler.v1 import events_pb2
from couler_runtime.blobs import LocalBlobStore
from couler_runtime.bus import HEADER_PAYLOAD, Bus, Event
from couler_runtime.bus_access import GRANTS, SERVICES, deadletter_subject, owners
from couler_runtime.bus_keys import HEADER_SIGNATURE, HEADER_SIGNER, BusFiles
from tests.servers import NatsServer, SecureNatsServer
from tests.waiting import aeventually, nkey_client

pytestmark = pytest.mark.anyio

# One concrete subject per event the services exchange (and one per dead-letter subject).
EVENT_SUBJECTS = (
    "couler.workflow.requested", "couler.workflow.generated", "couler.workflow.optimized",
    "couler.workflow.rejected", "couler.workflow.submitted", "couler.workflow.finished",
    "couler.step.succeeded", "couler.step.failed", "couler.metrics.utilization",
    "couler.feedback.some-workflow", "couler.cache.committed", "couler.cache.evicted",
    "couler.launch.some-template", *(deadletter_subject(s) for s in SERVICES),
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def raw(server: SecureNatsServer, identity: str, errors: list[str]) -> Any:
    """A plain nats-py client connected as ``identity``, collecting async errors."""
    return await nkey_client(server.url, server.files.seed_file(identity), identity, errors,
                             tls=server.files.client_tls())


async def stream_counts(server: SecureNatsServer) -> dict[str, int]:
    bus = await server.bus("admin")
    try:
        return {s.config.name or "": s.state.messages
                for s in await bus.jetstream.streams_info()}
    finally:
        await bus.close()


# ------------------------------------------------------------------- the server's side


async def test_anonymous_clients_are_refused(secure_nats: SecureNatsServer) -> None:
    from nats.aio.client import Client as NatsClient

    nc = NatsClient()
    try:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nc.connect(secure_nats.url, allow_reconnect=False, connect_timeout=2)
    finally:
        await nc.close()  # nats-py leaves the refused socket open otherwise
    with pytest.raises(UserError, match="refused an anonymous client"):
        await Bus.connect(secure_nats.url, name="anonymous", connect_timeout=3)


async def test_a_key_the_server_does_not_know_is_refused(secure_nats: SecureNatsServer,
                                                         tmp_path: Path) -> None:
    stranger = BusFiles.create(tmp_path / "other")  # a key pair of another deployment
    with pytest.raises(UserError, match="refused identity 'submitter'"):
        await Bus.connect(secure_nats.url, name="stranger", connect_timeout=3,
                          identity=stranger.identity("submitter"))


@pytest.mark.parametrize("identity", SERVICES)
async def test_each_identity_publishes_only_what_it_owns(secure_nats: SecureNatsServer,
                                                         identity: str) -> None:
    before = await stream_counts(secure_nats)
    errors: list[str] = []
    nc = await raw(secure_nats, identity, errors)
    try:
        foreign = [s for s in EVENT_SUBJECTS if identity not in owners(s)]
        assert foreign, identity
        for subject in foreign:
            await nc.publish(subject, b"forged")
        await nc.flush()
        await aeventually(lambda: len(errors) >= len(foreign), f"{identity}: every violation")
        for subject in foreign:
            assert any(f'permissions violation for publish to "{subject}"' in e
                       for e in errors), (identity, subject, errors)
        # and the subjects it owns it may publish (the server stores them)
        js = nc.jetstream()
        for subject in (s for s in EVENT_SUBJECTS if identity in owners(s)):
            ack = await js.publish(subject, b"owned", timeout=5)
            assert ack.seq > 0
    finally:
        await nc.close()
    after = await stream_counts(secure_nats)
    owned = sum(1 for s in EVENT_SUBJECTS if identity in owners(s))
    assert sum(after.values()) - sum(before.values()) == owned  # nothing foreign was stored


@pytest.mark.parametrize("identity", SERVICES)
async def test_no_identity_may_administer_or_eavesdrop(secure_nats: SecureNatsServer,
                                                       identity: str) -> None:
    from nats.js.api import ConsumerConfig

    admin = await secure_nats.bus("admin")
    await admin.jetstream.add_consumer("COULER_LAUNCH", ConsumerConfig(
        durable_name="submitter-launch", name="submitter-launch",
        filter_subject="couler.launch.>"))
    errors: list[str] = []
    nc = await raw(secure_nats, identity, errors)
    js = nc.jetstream(timeout=1.0)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_stream("COULER_LAUNCH")
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_consumer("COULER_LAUNCH", "submitter-launch")
        with pytest.raises(nats.errors.TimeoutError):
            await js.purge_stream("COULER_WORKFLOW")
        # a consumer of its own invention over everything
        with pytest.raises(nats.errors.TimeoutError):
            await js.add_consumer("COULER_WORKFLOW", ConsumerConfig(
                durable_name="spy", name="spy", filter_subject="couler.workflow.>"))
        await nc.subscribe("couler.>")
        await nc.subscribe("_INBOX.>")
        await nc.flush()
        await aeventually(lambda: sum("permissions violation" in e for e in errors) >= 6,
                         f"{identity}: six violations")
        text = "\n".join(errors).lower()
        for what in ("publish to \"$js.api.stream.delete.couler_launch\"",
                     "publish to \"$js.api.consumer.delete.couler_launch.submitter-launch\"",
                     "publish to \"$js.api.stream.purge.couler_workflow\"",
                     "publish to \"$js.api.consumer.create.couler_workflow.spy",
                     "subscription to \"couler.>\"", "subscription to \"_inbox.>\""):
            assert what in text, (identity, what, errors)
        # the stream and the launch consumer are still there
        info = await admin.jetstream.consumer_info("COULER_LAUNCH", "submitter-launch")
        assert info.name == "submitter-launch"
    finally:
        await nc.close()
        await admin.close()


async def test_each_service_can_run_all_its_consumers(secure_nats: SecureNatsServer,
                                                      tmp_path: Path) -> None:
    """What the table grants is enough: every consumer of every service starts and gets
    a message signed by the subject's owner."""
    got: dict[str, Event[StringValue]] = {}
    payloads = LocalBlobStore(tmp_path / "payloads")
    buses = {name: await secure_nats.bus(name, payloads=payloads) for name in SERVICES}
    try:
        for name in SERVICES:
            for c in GRANTS[name].consumers:
                async def handle(event: Event[StringValue], durable: str = c.durable) -> None:
                    got[durable] = event
                await buses[name].subscribe(c.filter, c.durable, StringValue, handle,
                                            stream=c.stream)
        wanted = {}
        for name in SERVICES:
            for c in GRANTS[name].consumers:
                subject = c.filter.replace(">", "x").replace("*", "x")
                owner = sorted(owners(subject))[0] if owners(subject) else None
                if owner is None:  # launches come from outside launchers
                    continue
                wanted[c.durable] = owner
                await buses[owner].publish(subject, StringValue(value=c.durable),
                                           msg_id=uuid.uuid4().hex)
        await aeventually(lambda: set(wanted) <= set(got), "every consumer got its message")
        for durable, owner in wanted.items():
            assert got[durable].signer == owner
    finally:
        for bus in buses.values():
            await bus.close()


# ------------------------------------------------------------------- the consumer's side


@pytest.fixture
def open_nats() -> Iterator[NatsServer]:
    """A fresh open server: here only the consumers' own checks stand between a forger
    and the handler."""
    from tests.conftest import _running

    yield from _running(NatsServer, "couler-open-nats-")


async def _consumer(server_url: str, files: BusFiles, subject: str, got: list[Any],
                    payloads: Any = None) -> Bus:
    bus = await Bus.connect(server_url, name="couler-submitter", trust=files.trust(),
                            payloads=payloads)
    await bus.ensure_streams()
    durable = "t" + uuid.uuid4().hex[:10]

    async def handle(event: Event[StringValue]) -> None:
        got.append(event)

    await bus.subscribe(subject, durable, StringValue, handle)
    return bus


async def _letters(bus: Bus, subject: str) -> list[events_pb2.DeadLetter]:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    sub = await bus.jetstream.pull_subscribe("couler.deadletter.>", config=ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE))
    pending = (await sub.consumer_info()).num_pending or 0
    found = []
    while len(found) < pending:
        found += [events_pb2.DeadLetter.FromString(m.data)
                  for m in await sub.fetch(pending - len(found), timeout=10)]
    await sub.unsubscribe()
    return [d for d in found if d.subject == subject]


async def test_unsigned_and_foreign_messages_are_refused(open_nats: NatsServer,
                                                         tmp_path: Path) -> None:
    files = BusFiles.create(tmp_path / "bus")
    subject = "couler.workflow.optimized"
    got: list[Event[StringValue]] = []
    consumer = await _consumer(open_nats.url, files, subject, got)
    anonymous = await Bus.connect(open_nats.url, name="anonymous")
    generator = await Bus.connect(open_nats.url, name="g", identity=files.identity("generator"))
    optimizer = await Bus.connect(open_nats.url, name="o", identity=files.identity("optimizer"))
    stranger = BusFiles.create(tmp_path / "other").identity("optimizer")
    forger = await Bus.connect(open_nats.url, name="f", identity=stranger)
    try:
        await anonymous.publish(subject, StringValue(value="unsigned"), msg_id="a",
                                run_id="r1")
        await generator.publish(subject, StringValue(value="not the owner"), msg_id="b",
                                run_id="r1")
        await forger.publish(subject, StringValue(value="wrong key"), msg_id="c",
                             run_id="r1")
        await optimizer.publish(subject, StringValue(value="the owner"), msg_id="d",
                                run_id="r1")
        await aeventually(lambda: len(got) == 1, "the owner's message")
        assert got[0].message.value == "the owner" and got[0].signer == "optimizer"
        letters: list[events_pb2.DeadLetter] = []

        async def three() -> None:
            nonlocal letters
            while len(letters) < 3:
                letters = await _letters(consumer, subject)
                await asyncio.sleep(0.1)

        await asyncio.wait_for(three(), 20)
        reasons = sorted(d.reason for d in letters)
        assert any("unsigned message" in r for r in reasons), reasons
        assert any("signed by 'generator', which does not own" in r for r in reasons), reasons
        assert any("does not match its content" in r for r in reasons), reasons
        # an unauthenticated dead letter never names a run (it could fail someone's run)
        assert all(not d.authenticated and d.run_id == "" for d in letters)
        assert len(got) == 1
    finally:
        for bus in (consumer, anonymous, generator, optimizer, forger):
            await bus.close()


async def test_a_tampered_body_is_refused(open_nats: NatsServer, tmp_path: Path) -> None:
    """A signed message whose body was swapped on the way (same headers)."""
    files = BusFiles.create(tmp_path / "bus")
    subject = "couler.workflow.optimized"
    got: list[Event[StringValue]] = []
    consumer = await _consumer(open_nats.url, files, subject, got)
    nc = await nats.connect(open_nats.url)
    optimizer = await Bus.connect(open_nats.url, name="o", identity=files.identity("optimizer"))
    try:
        captured: list[Any] = []
        async def keep(m: Any) -> None:
            captured.append(m)

        spy = await nc.subscribe(subject, cb=keep)
        await nc.flush()  # the server has the subscription before the publish
        await optimizer.publish(subject, StringValue(value="plan A"), msg_id="x")
        await aeventually(lambda: len(captured) == 1 and len(got) == 1, "delivered")
        await spy.unsubscribe()
        original = captured[0]
        headers = dict(original.headers)
        headers["Nats-Msg-Id"] = headers["Nats-Msg-Id"] + "-replay"  # not a duplicate
        js = nc.jetstream()
        await js.publish(subject, StringValue(value="plan B").SerializeToString(),
                         headers=headers)
        # the barrier: a genuine message stored after the forged one; the consumer takes
        # the stream in order, so once it has "plan C" it has decided on "plan B"
        await optimizer.publish(subject, StringValue(value="plan C"), msg_id="y")
        await aeventually(lambda: any(e.message.value == "plan C" for e in got), "plan C")
        assert [e.message.value for e in got] == ["plan A", "plan C"]
        assert HEADER_SIGNER in headers and HEADER_SIGNATURE in headers
    finally:
        for bus in (consumer, optimizer):
            await bus.close()
        await nc.close()


# ------------------------------------------------------------------- message ids


async def test_message_ids_are_deterministic_per_identity_and_unguessable(
        secure_nats: SecureNatsServer) -> None:
    optimizer = await secure_nats.bus("optimizer")
    generator = await secure_nats.bus("generator")
    try:
        run = uuid.uuid4().hex
        first = await optimizer.publish("couler.workflow.optimized", StringValue(value="p"),
                                        msg_id=f"{run}.optimized")
        again = await optimizer.publish("couler.workflow.optimized", StringValue(value="p"),
                                        msg_id=f"{run}.optimized")
        assert first.msg_id == again.msg_id and again.duplicate and not first.duplicate
        assert first.msg_id.startswith(f"{run}.optimized.") and len(first.msg_id) > len(run) + 20
        # another identity cannot pre-empt it: knowing the key is not knowing the id
        squat = await generator.publish("couler.workflow.generated", StringValue(value="s"),
                                        msg_id=f"{run}.optimized")
        assert squat.msg_id != first.msg_id and not squat.duplicate
        # ... and a guess of the old, predictable id is just another message
        errors: list[str] = []
        nc = await raw(secure_nats, "generator", errors)
        try:
            ack = await nc.jetstream().publish(
                "couler.workflow.generated", b"x", headers={"Nats-Msg-Id": f"{run}.optimized"})
            assert not ack.duplicate
        finally:
            await nc.close()
        fresh = await optimizer.publish("couler.workflow.optimized", StringValue(value="p"),
                                        msg_id=f"{run}.optimized2")
        assert not fresh.duplicate
    finally:
        await optimizer.close()
        await generator.close()


# ------------------------------------------------------------------- payloads by reference


async def test_large_bodies_travel_by_reference(secure_nats: SecureNatsServer,
                                                tmp_path: Path) -> None:
    payloads = LocalBlobStore(tmp_path / "payloads")
    consumer = await secure_nats.bus("optimizer", payloads=payloads)
    producer = await secure_nats.bus("submitter", payloads=payloads, inline_limit=64 * 1024)
    got: list[Event[StringValue]] = []

    async def handle(event: Event[StringValue]) -> None:
        got.append(event)

    try:
        await consumer.subscribe("couler.workflow.requested", "optimizer-requested",
                                 StringValue, handle)
        big = "x" * (3 * 1024 * 1024)  # three times NATS's 1 MiB max_payload
        result = await producer.publish("couler.workflow.requested", StringValue(value=big),
                                        msg_id=uuid.uuid4().hex, run_id="r-big")
        small = await producer.publish("couler.workflow.requested",
                                       StringValue(value="small"), msg_id=uuid.uuid4().hex)
        assert result.sequence and small.sequence
        await aeventually(lambda: len(got) >= 2, "both delivered")
        by_value = {len(e.message.value): e for e in got}
        assert by_value[len(big)].message.value == big
        assert by_value[len(big)].headers[HEADER_PAYLOAD].startswith("sha256:")
        assert HEADER_PAYLOAD not in by_value[5].headers
        assert by_value[len(big)].signer == "submitter"
    finally:
        await consumer.close()
        await producer.close()


async def test_a_body_too_large_without_a_store_is_a_clear_user_error(
        secure_nats: SecureNatsServer) -> None:
    producer = await secure_nats.bus("submitter")
    try:
        with pytest.raises(UserError, match="max_payload and no payload store"):
            await producer.publish("couler.workflow.requested",
                                   StringValue(value="y" * (2 * 1024 * 1024)),
                                   msg_id=uuid.uuid4().hex)
    finally:
        await producer.close()


@pytest.mark.parametrize("damage", ["deleted", "altered"])
async def test_a_missing_or_altered_stored_body_is_refused(open_nats: NatsServer,
                                                           tmp_path: Path,
                                                           damage: str) -> None:
    files = BusFiles.create(tmp_path / "bus")
    payloads = LocalBlobStore(tmp_path / "payloads")
    subject = "couler.workflow.requested"
    got: list[Event[StringValue]] = []
    consumer = await _consumer(open_nats.url, files, subject, got, payloads=payloads)
    producer = await Bus.connect(open_nats.url, name="s", identity=files.identity("submitter"),
                                 payloads=payloads, inline_limit=1024)
    try:
        # hold the consumer back: damage the stored body before it is read
        stored: list[Path] = []
        original_put = payloads.put_bytes

        def put_and_damage(data: bytes) -> str:
            key = original_put(data)
            path = payloads.root / "sha256" / key[7:9] / key[7:]
            stored.append(path)
            if damage == "deleted":
                path.unlink()
            else:
                path.write_bytes(b"z" * len(data))
            return key

        payloads.put_bytes = put_and_damage  # type: ignore[method-assign]
        await producer.publish(subject, StringValue(value="w" * 5000), msg_id="m",
                               run_id="run-x")
        letters: list[events_pb2.DeadLetter] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(20):
                while not letters:
                    letters = await _letters(consumer, subject)
                    await asyncio.sleep(0.1)
        assert got == []
        assert letters, "the message was not dead-lettered"
        reason = letters[0].reason
        assert ("not in the payload store" in reason if damage == "deleted"
                else "cannot be read" in reason), reason
        assert letters[0].authenticated and letters[0].run_id == "run-x"
    finally:
        await consumer.close()
        await producer.close()


async def test_tls_bus(secure_nats_tls: SecureNatsServer, tmp_path: Path) -> None:
    """With TLS on, services verify the server with the deployment's CA; a client that does
    not trust that CA cannot connect, and the bus works as without TLS."""
    assert secure_nats_tls.url.startswith("tls://")
    with pytest.raises(UserError, match="TLS certificate is not trusted"):
        await Bus.connect(secure_nats_tls.url, name="no-ca", connect_timeout=5,
                          identity=secure_nats_tls.files.identity("submitter"))
    payloads = LocalBlobStore(tmp_path / "payloads")
    consumer = await secure_nats_tls.bus("optimizer", payloads=payloads)
    producer = await secure_nats_tls.bus("submitter", payloads=payloads)
    got: list[Event[StringValue]] = []

    async def handle(event: Event[StringValue]) -> None:
        got.append(event)

    try:
        await consumer.subscribe("couler.workflow.requested", "optimizer-requested",
                                 StringValue, handle)
        await producer.publish("couler.workflow.requested", StringValue(value="over tls"),
                               msg_id=uuid.uuid4().hex)
        await aeventually(lambda: any(e.message.value == "over tls" for e in got), "delivery")
    finally:
        await consumer.close()
        await producer.close()


async def test_only_admin_may_create_streams(secure_nats: SecureNatsServer) -> None:
    bus = await secure_nats.bus("optimizer")
    try:
        with pytest.raises(UserError, match="may not create or change streams"):
            await bus.ensure_streams()
    finally:
        await bus.close()
