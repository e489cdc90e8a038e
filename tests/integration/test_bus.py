"""The JetStream bus against a real nats-server: ack, nak, term, idempotency, restarts."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import Awaitable, Callable, Sequence

import pytest
from google.protobuf.wrappers_pb2 import StringValue
from nats.js.api import StorageType

from couler.errors import RetryableError, UserError
from couler_runtime.bus import (
    HEADER_EVENT_TYPE,
    HEADER_SOURCE,
    HEADER_TENANT,
    HEADER_TIME,
    STREAMS,
    Bus,
    Event,
    Rejection,
)
from tests.servers import NatsServer, free_port
from tests.waiting import aeventually

pytestmark = pytest.mark.anyio

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def connect(server: NatsServer, name: str = "test") -> Bus:
    bus = await Bus.connect(server.url, name=name, tenant="acme", reconnect_wait=0.1)
    await bus.ensure_streams(duplicate_window=60.0)
    return bus


def unique(kind: str = "step") -> tuple[str, str]:
    """A subject inside one of the streams and a durable name, both unique to the test."""
    tag = uuid.uuid4().hex[:10]
    return f"couler.{kind}.t{tag}", f"d{tag}"


async def publish_retrying(bus: Bus, subject: str, text: str, msg_id: str) -> None:
    """Publish, retrying while the client reconnects after a server restart."""
    for _ in range(100):
        try:
            await bus.publish(subject, StringValue(value=text), msg_id=msg_id, timeout=1.0)
            return
        except RetryableError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"could not publish {text!r}")


async def settled(bus: Bus, stream: str, durable: str) -> None:
    """Wait until the consumer has nothing undelivered and nothing awaiting an ack."""
    for _ in range(200):
        info = await bus.jetstream.consumer_info(stream, durable)
        if (info.num_pending, info.num_ack_pending) == (0, 0):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{durable}: {info.num_pending} pending, "
                         f"{info.num_ack_pending} awaiting an ack")


def recorder() -> tuple[list[Event[StringValue]], Callable[[Event[StringValue]],
                                                           Awaitable[None]]]:
    seen: list[Event[StringValue]] = []

    async def handle(event: Event[StringValue]) -> None:
        seen.append(event)

    return seen, handle


async def test_streams_are_file_backed_and_ensured_idempotently(nats_server: NatsServer) -> None:
    bus = await connect(nats_server)
    try:
        await bus.ensure_streams(duplicate_window=60.0)  # second time: no error, same config
        for spec in STREAMS:
            info = await bus.jetstream.stream_info(spec.name)
            assert info.config.storage == StorageType.FILE
            assert info.config.subjects == list(spec.subjects)
            assert info.config.duplicate_window == 60.0
        assert {s.name: s.subjects[0] for s in STREAMS}.items() >= {
            "COULER_WORKFLOW": "couler.workflow.>", "COULER_STEP": "couler.step.>",
            "COULER_METRICS": "couler.metrics.>", "COULER_FEEDBACK": "couler.feedback.>",
            "COULER_LAUNCH": "couler.launch.>"}.items()
    finally:
        await bus.close()


async def test_publish_consume_ack_with_standard_headers(nats_server: NatsServer) -> None:
    subject, durable = unique("workflow")
    bus = await connect(nats_server, name="optimizer")
    try:
        for i in range(3):
            result = await bus.publish(subject, StringValue(value=f"m{i}"), msg_id=f"k{i}",
                                       headers={"traceparent": TRACEPARENT})
            assert result.stream == "COULER_WORKFLOW" and not result.duplicate
        seen, handle = recorder()
        await bus.subscribe(subject, durable, StringValue, handle)
        await aeventually(lambda: len(seen) == 3, "three messages handled")
        assert [e.message.value for e in seen] == ["m0", "m1", "m2"]
        first = seen[0]
        assert first.subject == subject
        assert first.event_id == "k0"
        assert first.traceparent == TRACEPARENT
        assert first.headers[HEADER_EVENT_TYPE] == "google.protobuf.StringValue"
        assert first.headers[HEADER_SOURCE] == "optimizer"
        assert first.headers[HEADER_TENANT] == "acme"
        assert datetime.datetime.fromisoformat(first.headers[HEADER_TIME]).tzinfo is not None
        assert first.delivery_count == 1
        # acked after the handler returned: nothing pending, nothing awaiting an ack
        await settled(bus, "COULER_WORKFLOW", durable)
    finally:
        await bus.close()


async def test_publish_carries_the_current_span_and_the_consumer_continues_it(
        nats_server: NatsServer) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    subject, durable = unique("workflow")
    bus = await connect(nats_server)
    try:
        with tracer.start_as_current_span("publisher") as span:
            await bus.publish(subject, StringValue(value="traced"), msg_id="k-traced")
            sent = span.get_span_context()
        await bus.publish(subject, StringValue(value="untraced"), msg_id="k-untraced")
        seen, handle = recorder()
        await bus.subscribe(subject, durable, StringValue, handle)
        await aeventually(lambda: len(seen) == 2, "both messages handled")
        traced, untraced = seen
        parent = trace.get_current_span(traced.trace_context()).get_span_context()
        assert (parent.trace_id, parent.span_id) == (sent.trace_id, sent.span_id)
        wire = f"00-{sent.trace_id:032x}-{sent.span_id:016x}-"
        assert (traced.traceparent or "").startswith(wire)
        assert untraced.traceparent is None  # no span: nothing invented
        assert not trace.get_current_span(untraced.trace_context()).get_span_context().is_valid
    finally:
        await bus.close()


async def test_failed_handler_is_redelivered_then_acked(nats_server: NatsServer) -> None:
    subject, durable = unique()
    bus = await connect(nats_server)
    attempts: list[tuple[str, int]] = []

    async def flaky(event: Event[StringValue]) -> None:
        attempts.append((event.message.value, event.delivery_count))
        if event.message.value == "retryable" and event.delivery_count == 1:
            raise RetryableError("database busy")
        if event.message.value == "crash" and event.delivery_count < 3:
            raise RuntimeError("bug")

    try:
        await bus.subscribe(subject, durable, StringValue, flaky, retry_delay=0.05)
        await bus.publish(subject, StringValue(value="retryable"), msg_id="r")
        await bus.publish(subject, StringValue(value="crash"), msg_id="c")
        await aeventually(lambda: ("retryable", 2) in attempts and ("crash", 3) in attempts,
                         "both redelivered until they succeed")
        await aeventually(lambda: len(attempts) == 5, "five deliveries")
        assert sorted(attempts) == [("crash", 1), ("crash", 2), ("crash", 3),
                                    ("retryable", 1), ("retryable", 2)]
        await settled(bus, "COULER_STEP", durable)
    finally:
        await bus.close()


async def test_bad_bytes_and_user_errors_are_terminated_and_recorded(
        nats_server: NatsServer) -> None:
    subject, durable = unique()
    rejections: list[Rejection] = []

    async def record(rejection: Rejection) -> None:
        rejections.append(rejection)

    bus = await connect(nats_server)
    handled: list[str] = []

    async def handle(event: Event[StringValue]) -> None:
        handled.append(event.message.value)
        if event.message.value == "invalid":
            raise UserError("workflow 'w', step 's', field 'image': empty")

    try:
        await bus.subscribe(subject, durable, StringValue, handle, on_reject=record,
                            ack_wait=1.0)
        # not protobuf: field 1, length 255, but only one byte follows
        await bus.jetstream.publish(subject, b"\x0a\xff\x01")
        await bus.publish(subject, StringValue(value="invalid"), msg_id="inv")
        await bus.jetstream.publish(subject, StringValue(value="x").SerializeToString(),
                                    headers={HEADER_EVENT_TYPE: "couler.v1.Other"})
        await bus.publish(subject, StringValue(value="fine"), msg_id="fine")
        await aeventually(lambda: "fine" in handled and len(rejections) == 3, "all answered")
        reasons = [r.reason for r in rejections]
        assert reasons[0].startswith("undecodable google.protobuf.StringValue body (3 bytes)")
        assert rejections[0].payload == b"\x0a\xff\x01"
        assert reasons[1] == "UserError: workflow 'w', step 's', field 'image': empty"
        assert reasons[2] == ("event type 'couler.v1.Other', this consumer expects "
                              "'google.protobuf.StringValue'")
        assert all(r.durable == durable and r.delivery_count == 1 for r in rejections)
        # terminated, not left for redelivery: nothing pending and nothing awaiting an ack
        await settled(bus, "COULER_STEP", durable)
        assert handled == ["invalid", "fine"]
    finally:
        await bus.close()


async def test_giving_up_after_max_deliver_records_why(nats_server: NatsServer) -> None:
    subject, durable = unique()
    rejections: list[Rejection] = []

    async def record(rejection: Rejection) -> None:
        rejections.append(rejection)

    async def always_busy(event: Event[StringValue]) -> None:
        raise RetryableError("still busy")

    bus = await connect(nats_server)
    bus.on_reject = record  # the bus-wide default hook
    try:
        await bus.subscribe(subject, durable, StringValue, always_busy, max_deliver=3,
                            retry_delay=0.02)
        await bus.publish(subject, StringValue(value="doomed"), msg_id="doomed")
        await aeventually(lambda: len(rejections) == 1, "given up")
        assert rejections[0].reason == "gave up after 3 deliveries: RetryableError: still busy"
        assert rejections[0].delivery_count == 3
        await settled(bus, "COULER_STEP", durable)
    finally:
        await bus.close()


async def test_same_msg_id_is_stored_and_delivered_once(nats_server: NatsServer) -> None:
    subject, durable = unique("launch")
    bus = await connect(nats_server)
    try:
        first = await bus.publish(subject, StringValue(value="submit"), msg_id="run-1/submit")
        again = await bus.publish(subject, StringValue(value="submit"), msg_id="run-1/submit")
        assert not first.duplicate
        assert again.duplicate and again.sequence == first.sequence
        await bus.publish(subject, StringValue(value="end"), msg_id="run-1/end")
        seen, handle = recorder()
        await bus.subscribe(subject, durable, StringValue, handle)
        await aeventually(lambda: any(e.message.value == "end" for e in seen), "sentinel seen")
        assert [e.message.value for e in seen] == ["submit", "end"]
    finally:
        await bus.close()


async def test_durable_consumer_resumes_after_client_reconnects(nats_server: NatsServer) -> None:
    subject, durable = unique("metrics")
    bus = await connect(nats_server)
    seen, handle = recorder()
    await bus.subscribe(subject, durable, StringValue, handle)
    for i in range(2):
        await bus.publish(subject, StringValue(value=f"a{i}"), msg_id=f"a{i}")
    await aeventually(lambda: len(seen) == 2, "first two handled")
    await bus.close()

    producer = await connect(nats_server, name="producer")
    for i in range(2):
        await producer.publish(subject, StringValue(value=f"b{i}"), msg_id=f"b{i}")
    await producer.close()

    bus2 = await connect(nats_server)
    try:
        await bus2.subscribe(subject, durable, StringValue, handle)
        await aeventually(lambda: len(seen) == 4, "the two published while away")
        assert [e.message.value for e in seen] == ["a0", "a1", "b0", "b1"]
        assert all(e.delivery_count == 1 for e in seen)
    finally:
        await bus2.close()


async def test_consumer_survives_nats_server_restart(nats_server: NatsServer) -> None:
    subject, durable = unique("feedback")
    bus = await connect(nats_server)
    seen, handle = recorder()
    try:
        await bus.subscribe(subject, durable, StringValue, handle)
        for i in range(3):
            await bus.publish(subject, StringValue(value=f"before{i}"), msg_id=f"before{i}")
        await aeventually(lambda: len(seen) == 3, "handled before the restart")
        # the handler has seen the third message before the bus acks it: wait for the acks to
        # reach the server, or a restart in between redelivers that message
        await settled(bus, "COULER_FEEDBACK", durable)

        nats_server.restart()  # same port, same store directory

        for i in range(3):
            await publish_retrying(bus, subject, f"after{i}", f"after{i}")
        await aeventually(lambda: len(seen) == 6, "handled after the restart")
        values = [e.message.value for e in seen]
        assert values == [f"before{i}" for i in range(3)] + [f"after{i}" for i in range(3)]
        assert all(e.delivery_count == 1 for e in seen)  # acked ones never came back
        await settled(bus, "COULER_FEEDBACK", durable)
    finally:
        await bus.close()


async def test_messages_published_before_a_restart_are_not_lost(nats_server: NatsServer) -> None:
    subject, durable = unique("workflow")
    bus = await connect(nats_server)
    seen, handle = recorder()
    await bus.subscribe(subject, durable, StringValue, handle)
    await bus.publish(subject, StringValue(value="handled"), msg_id="h")
    await aeventually(lambda: len(seen) == 1, "first handled")
    await bus.close()  # the service goes away ...
    producer = await connect(nats_server, name="producer")
    for i in range(3):
        await producer.publish(subject, StringValue(value=f"queued{i}"), msg_id=f"q{i}")
    await producer.close()

    nats_server.restart()  # ... and NATS restarts while the messages wait on disk

    bus2 = await connect(nats_server)
    try:
        await bus2.subscribe(subject, durable, StringValue, handle)
        await aeventually(lambda: len(seen) == 4, "queued messages handled")
        assert [e.message.value for e in seen] == ["handled", "queued0", "queued1", "queued2"]
    finally:
        await bus2.close()


async def test_publish_rejects_missing_key_and_bus_owned_headers(nats_server: NatsServer) -> None:
    bus = await connect(nats_server)
    try:
        with pytest.raises(UserError, match="msg_id must be a non-empty key"):
            await bus.publish("couler.step.x", StringValue(), msg_id="")
        with pytest.raises(UserError, match="header 'Nats-Msg-Id' is set by the bus"):
            await bus.publish("couler.step.x", StringValue(), msg_id="k",
                              headers={"Nats-Msg-Id": "other"})
        with pytest.raises(RetryableError, match="no stream answered"):
            await bus.publish("elsewhere.x", StringValue(), msg_id="k")
    finally:
        await bus.close()


async def test_connect_to_nothing_is_a_retryable_error_naming_the_setting() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(RetryableError, match=f"NATS at {url} did not answer.*COULER_NATS_URL"):
        await Bus.connect(url, name="test", connect_timeout=0.5)


def test_nats_listens_on_loopback_only(nats_server: NatsServer) -> None:
    assert nats_server.listen_addresses() == {"127.0.0.1"}


async def test_restart_mid_stream_loses_nothing_and_repeats_only_unconfirmed_acks(
        nats_server: NatsServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="couler_runtime.bus")
    subject, durable = unique("step")
    total = 100
    bus = await connect(nats_server)
    handled: list[tuple[str, int, int]] = []  # (value, delivery count, stream sequence)

    async def slow(event: Event[StringValue]) -> None:
        handled.append((event.message.value, event.delivery_count, event.stream_sequence))
        await asyncio.sleep(0.005)

    async def produce() -> None:
        for i in range(total):
            # the same msg id on a retry: a publish stored before its PubAck was lost is
            # not stored twice
            await publish_retrying(bus, subject, f"m{i:03}", f"m{i:03}")

    try:
        # ack_wait 2 s: a delivery whose ack was lost in the restart comes back soon
        await bus.subscribe(subject, durable, StringValue, slow, batch=5, ack_wait=2.0)
        producer = asyncio.create_task(produce())
        await aeventually(lambda: len(handled) >= 30, "a third handled")
        nats_server.restart()
        await producer
        await aeventually(lambda: len({v for v, _, _ in handled}) == total, "all handled",
                         deadline=60)
        await settled(bus, "COULER_STEP", durable)
        values = [v for v, _, _ in handled]
        assert sorted(set(values)) == [f"m{i:03}" for i in range(total)]
        assert len({s for _, _, s in handled}) == total  # each stored exactly once
        first_deliveries = [v for v, n, _ in handled if n == 1]
        assert len(first_deliveries) == len(set(first_deliveries))
        # a message is handled again only if its ack was not confirmed by the server
        unconfirmed = {int(r.getMessage().split("seq ")[1].split()[0]) for r in caplog.records
                       if "not confirmed" in r.getMessage()}
        repeated = {s for _, n, s in handled if n > 1}
        assert repeated <= unconfirmed
    finally:
        await bus.close()


async def test_a_batch_handler_takes_what_arrived_together_and_it_is_acked(
        nats_server: NatsServer) -> None:
    subject, durable = unique("step")
    bus = await connect(nats_server)
    batches: list[list[str]] = []
    release = asyncio.Event()

    async def handle(events: Sequence[Event[StringValue]]) -> None:
        batches.append([e.message.value for e in events])
        if len(batches) == 1:
            await release.wait()  # more arrive meanwhile

    try:
        await bus.subscribe(subject, durable, StringValue, batch_handler=handle, batch=10)
        await bus.publish(subject, StringValue(value="m0"), msg_id=f"{durable}.m0")
        await aeventually(lambda: batches == [["m0"]], "the first handled alone")
        for i in range(1, 6):  # msg ids unique in the stream (other tests share it)
            await bus.publish(subject, StringValue(value=f"m{i}"), msg_id=f"{durable}.m{i}")

        async def delivered() -> int:
            return int((await bus.jetstream.consumer_info("COULER_STEP", durable))
                       .num_ack_pending)

        for _ in range(500):  # the open pull request brought them all (a bound, not timing)
            if await delivered() == 6:
                break
            await asyncio.sleep(0.01)
        release.set()
        await aeventually(lambda: sum(map(len, batches)) == 6, "all handled")
        assert batches == [["m0"], ["m1", "m2", "m3", "m4", "m5"]]  # in order, together
        await settled(bus, "COULER_STEP", durable)  # every one acked
    finally:
        await bus.close()


async def test_a_failing_batch_is_handled_again_one_by_one(nats_server: NatsServer) -> None:
    subject, durable = unique("step")
    rejections: list[Rejection] = []

    async def record(rejection: Rejection) -> None:
        rejections.append(rejection)

    bus = await connect(nats_server)
    calls: list[list[tuple[str, int]]] = []
    committed: list[str] = []

    async def handle(events: Sequence[Event[StringValue]]) -> None:
        calls.append([(e.message.value, e.delivery_count) for e in events])
        for e in events:  # all or nothing, as one transaction would
            if e.message.value == "bad":
                raise UserError("workflow 'w', step 'bad': field 'image' is empty")
            if e.message.value == "busy" and e.delivery_count == 1:
                raise RetryableError("database locked")
        committed.extend(e.message.value for e in events)

    try:
        for value in ("a", "bad", "busy", "b"):  # waiting before the consumer starts
            await bus.publish(subject, StringValue(value=value), msg_id=f"{durable}.{value}")
        await bus.subscribe(subject, durable, StringValue, batch_handler=handle, batch=10,
                            on_reject=record, retry_delay=0.05)
        await aeventually(lambda: "busy" in committed and len(rejections) == 1,
                         "each answered by its own outcome")
        assert calls[0] == [("a", 1), ("bad", 1), ("busy", 1), ("b", 1)]
        # then alone: only the bad one terminated, only the busy one retried
        assert calls[1:4] == [[("a", 1)], [("bad", 1)], [("busy", 1)]]
        assert calls[4] == [("b", 1)] and [("busy", 2)] in calls[5:]
        assert sorted(committed) == ["a", "b", "busy"]
        assert [r.reason for r in rejections] == [
            "UserError: workflow 'w', step 'bad': field 'image' is empty"]
        await settled(bus, "COULER_STEP", durable)
    finally:
        await bus.close()


async def test_a_graceful_close_waits_for_the_acks_to_be_confirmed(
        nats_server: NatsServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="couler_runtime.bus")
    subject, durable = unique("step")
    bus, publisher = await connect(nats_server), await connect(nats_server)
    seen: list[str] = []
    last = asyncio.Event()

    async def handle(event: Event[StringValue]) -> None:
        seen.append(event.message.value)
        if len(seen) == 20:
            last.set()

    try:
        await bus.subscribe(subject, durable, StringValue, handle)
        for i in range(20):  # one at a time: each acked on its own
            await publisher.publish(subject, StringValue(value=f"m{i}"),
                                    msg_id=f"{durable}.m{i}")
            await asyncio.sleep(0.002)
        await asyncio.wait_for(last.wait(), 60)
    finally:
        await bus.close()  # right after the last handler: its ack is still on its way
    try:
        assert not [r for r in caplog.records if "not confirmed" in r.getMessage()]
        await settled(publisher, "COULER_STEP", durable)  # nothing left awaiting an ack
    finally:
        await publisher.close()
