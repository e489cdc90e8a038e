"""The event bus: NATS JetStream with protobuf bodies, durable pull consumers and idempotency.

Publishing (:meth:`Bus.publish`) sets ``Nats-Msg-Id`` to the caller's deterministic idempotency
key, so a republish inside the streams' duplicate window is stored once, and the standard
headers (:data:`HEADER_EVENT_ID` ... ``traceparent``). Consuming (:meth:`Bus.subscribe`) runs a
durable pull-consumer loop that maps a handler's outcome to JetStream's answer -- this is one
of the two places where Couler's error hierarchy is translated (the other is the gRPC
interceptor)::

    handler returns             -> ack (after the effect is committed, confirmed by the server)
    RetryableError              -> nak with exponential back-off
    UserError / undecodable     -> term, logged and passed to the ``on_reject`` hook
    any other exception         -> nak with back-off, logged with its traceback
    the last allowed delivery   -> term (as above) instead of nak: the reason is recorded

Consumers are durable and JetStream keeps their state on disk, so a consumer resumes where it
stopped after the client reconnects or the server restarts. Handlers must still be idempotent:
delivery is at-least-once (an ack lost with the connection means a redelivery).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import nats.errors
import nats.js.errors
from google.protobuf.message import DecodeError, Message
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

from couler.errors import RetryableError, UserError
from couler_runtime.settings import redact_url

__all__ = [
    "HEADER_EVENT_ID",
    "HEADER_EVENT_TYPE",
    "HEADER_SOURCE",
    "HEADER_TENANT",
    "HEADER_TIME",
    "HEADER_TRACEPARENT",
    "STREAMS",
    "Bus",
    "Event",
    "Handler",
    "PublishResult",
    "RejectHook",
    "Rejection",
    "StreamSpec",
    "Subscription",
]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

HEADER_MSG_ID = "Nats-Msg-Id"
HEADER_EVENT_ID = "couler-event-id"
HEADER_EVENT_TYPE = "couler-event-type"
HEADER_SOURCE = "couler-source"
HEADER_TIME = "couler-time"
HEADER_TENANT = "couler-tenant"
HEADER_TRACEPARENT = "traceparent"
_BUS_HEADERS = frozenset(
    h.lower() for h in (HEADER_MSG_ID, HEADER_EVENT_ID, HEADER_EVENT_TYPE, HEADER_SOURCE,
                        HEADER_TIME)
)


@dataclass(frozen=True)
class StreamSpec:
    """One JetStream stream: its name and the subjects it captures."""

    name: str
    subjects: tuple[str, ...]


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("COULER_WORKFLOW", ("couler.workflow.>",)),
    StreamSpec("COULER_STEP", ("couler.step.>",)),
    StreamSpec("COULER_METRICS", ("couler.metrics.>",)),
    StreamSpec("COULER_FEEDBACK", ("couler.feedback.>",)),
    StreamSpec("COULER_LAUNCH", ("couler.launch.>",)),
    StreamSpec("COULER_CACHE", ("couler.cache.>",)),
)


@dataclass(frozen=True)
class Event(Generic[M]):
    """A decoded message as a handler sees it.

    Attributes:
        subject: The subject it was published on.
        message: The decoded protobuf body.
        headers: All headers (standard ones under the ``HEADER_*`` names).
        delivery_count: 1 on the first delivery, 2 on the first redelivery, ...
        stream_sequence: Its sequence number in the stream (stable across redeliveries).
    """

    subject: str
    message: M
    headers: Mapping[str, str]
    delivery_count: int
    stream_sequence: int

    @property
    def event_id(self) -> str:
        """The event's id (equal to its idempotency key)."""
        return self.headers.get(HEADER_EVENT_ID, "")

    @property
    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` the publisher propagated, if any."""
        return self.headers.get(HEADER_TRACEPARENT)


@dataclass(frozen=True)
class Rejection:
    """Why a message was terminated (``term``): passed to the ``on_reject`` hook.

    Attributes:
        durable: The consumer that rejected it.
        subject: The message's subject.
        reason: Why, in words (the UserError's message, the decode error, ...).
        payload: The raw body, for a dead-letter record.
        headers: The raw headers.
        delivery_count: How many times it was delivered.
        stream_sequence: Its sequence number in the stream.
    """

    durable: str
    subject: str
    reason: str
    payload: bytes
    headers: Mapping[str, str]
    delivery_count: int
    stream_sequence: int


@dataclass(frozen=True)
class PublishResult:
    """JetStream's answer to a publish: ``duplicate`` is True when the msg id was seen."""

    stream: str
    sequence: int
    duplicate: bool


Handler = Callable[[Event[M]], Awaitable[None]]
RejectHook = Callable[[Rejection], Awaitable[None]]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class Bus:
    """A connection to NATS JetStream; create it with :meth:`connect`.

    Args:
        nc: A connected NATS client.
        source: The ``couler-source`` header of every message published (the service name).
        tenant: The default ``couler-tenant`` header.
        on_reject: Default hook called with every terminated message (a service stores it).
    """

    def __init__(self, nc: NatsClient, *, source: str, tenant: str = "",
                 on_reject: RejectHook | None = None) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self.source = source
        self.tenant = tenant
        self.on_reject = on_reject
        self._subscriptions: list[Subscription[Any]] = []
        self._closing = False

    @classmethod
    async def connect(cls, url: str, *, name: str, tenant: str = "",
                      on_reject: RejectHook | None = None, connect_timeout: float = 10.0,
                      reconnect_wait: float = 0.5) -> Bus:
        """Connect to NATS, waiting up to ``connect_timeout`` seconds for the server.

        Once connected the client reconnects forever (every ``reconnect_wait`` seconds), so
        consumers survive a server restart.

        Args:
            url: NATS URL(s), comma-separated.
            name: The client's name, also the ``couler-source`` header.
            tenant: The default ``couler-tenant`` header.
            on_reject: Default hook for terminated messages.
            connect_timeout: How long to wait for the server to answer.
            reconnect_wait: Seconds between reconnect attempts.

        Raises:
            RetryableError: The server did not answer in time.
        """
        servers = [u.strip() for u in url.split(",")]

        async def on_error(e: Exception) -> None:
            # nats-py's default callback logs a full traceback for every failed reconnect.
            log.warning("NATS %s: %s: %s", redact_url(url), type(e).__name__, e)

        made: list[Bus] = []  # the callbacks exist before the Bus they report on

        async def on_disconnected() -> None:
            if not (made and made[0]._closing):
                log.warning("NATS %s: disconnected", redact_url(url))

        async def on_reconnected() -> None:
            log.info("NATS %s: reconnected", redact_url(url))

        loop = asyncio.get_running_loop()
        deadline = loop.time() + connect_timeout
        delay = 0.05
        while True:
            nc = NatsClient()
            try:
                # With unlimited reconnects nats-py would retry the first connect forever too.
                await asyncio.wait_for(nc.connect(
                    servers, name=name, error_cb=on_error, disconnected_cb=on_disconnected,
                    reconnected_cb=on_reconnected, allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    # annotated int, used as float seconds (asyncio.sleep)
                    reconnect_time_wait=reconnect_wait,  # type: ignore[arg-type]
                    connect_timeout=max(1, round(min(2.0, connect_timeout))),
                ), timeout=max(0.1, deadline - loop.time()))
                made.append(cls(nc, source=name, tenant=tenant, on_reject=on_reject))
                return made[0]
            except (OSError, TimeoutError, nats.errors.Error) as e:
                with contextlib.suppress(nats.errors.Error):
                    await nc.close()
                if loop.time() + delay > deadline:
                    raise RetryableError(
                        f"NATS at {redact_url(url)} did not answer within {connect_timeout:g} s "
                        f"(COULER_NATS_URL): {type(e).__name__}: {e}"
                    ) from e
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    @property
    def client(self) -> NatsClient:
        """The underlying NATS client (for tests and diagnostics)."""
        return self._nc

    @property
    def jetstream(self) -> JetStreamContext:
        """The underlying JetStream context."""
        return self._js

    async def ensure_streams(self, streams: tuple[StreamSpec, ...] = STREAMS, *,
                             duplicate_window: float = 120.0,
                             max_bytes: int | None = None) -> None:
        """Create the streams (file storage), or update them to this configuration.

        Idempotent: run it at every service start.

        Args:
            streams: The streams to ensure (all of Couler's by default).
            duplicate_window: Seconds within which a repeated ``Nats-Msg-Id`` is dropped.
            max_bytes: Optional size limit per stream (JetStream's default is machine-sized).
        """
        for spec in streams:
            config = StreamConfig(
                name=spec.name, subjects=list(spec.subjects), storage=StorageType.FILE,
                duplicate_window=duplicate_window, max_bytes=max_bytes,
            )
            try:
                try:
                    await self._js.stream_info(spec.name)
                except nats.js.errors.NotFoundError:
                    await self._js.add_stream(config)
                else:
                    await self._js.update_stream(config)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                    nats.errors.ConnectionClosedError) as e:
                raise RetryableError(f"ensuring stream {spec.name}: JetStream unavailable: "
                                     f"{type(e).__name__}") from e

    async def publish(self, subject: str, message: Message, *, msg_id: str,
                      headers: Mapping[str, str] | None = None, tenant: str | None = None,
                      timeout: float = 5.0) -> PublishResult:
        """Publish ``message`` on ``subject`` and wait until JetStream stored it.

        Args:
            subject: The subject (it must fall in one of the streams).
            message: The protobuf body.
            msg_id: A deterministic idempotency key (e.g. ``run-id/step/attempt/state``):
                a republish with the same key inside the duplicate window is dropped.
            headers: Extra headers, e.g. ``traceparent``/``tracestate`` from telemetry.
            tenant: The ``couler-tenant`` header (the bus's default when None).
            timeout: Seconds to wait for JetStream's acknowledgement.

        Returns:
            Where it was stored, and whether it was a duplicate.

        Raises:
            UserError: An empty ``msg_id`` or a header the bus owns.
            RetryableError: JetStream did not acknowledge (no stream or server unavailable).
        """
        if not msg_id:
            raise UserError(f"publish to {subject!r}: msg_id must be a non-empty key")
        hdrs: dict[str, str] = {}
        for key, value in (headers or {}).items():
            if key.lower() in _BUS_HEADERS:
                raise UserError(f"publish to {subject!r}: header {key!r} is set by the bus")
            hdrs[key] = value
        hdrs.update({
            HEADER_MSG_ID: msg_id,
            HEADER_EVENT_ID: msg_id,
            HEADER_EVENT_TYPE: message.DESCRIPTOR.full_name,
            HEADER_SOURCE: self.source,
            HEADER_TIME: _now(),
        })
        hdrs[HEADER_TENANT] = tenant if tenant is not None else hdrs.get(HEADER_TENANT,
                                                                         self.tenant)
        try:
            ack = await self._js.publish(subject, message.SerializeToString(), timeout=timeout,
                                         headers=hdrs)
        except nats.js.errors.NoStreamResponseError as e:
            raise RetryableError(f"publish to {subject!r}: no stream answered (is the subject "
                                 "in a stream, and JetStream up?)") from e
        except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError,
                nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError,
                nats.js.errors.ServiceUnavailableError) as e:
            raise RetryableError(f"publish to {subject!r}: {type(e).__name__}") from e
        return PublishResult(ack.stream, ack.seq, bool(ack.duplicate))

    async def subscribe(self, subject: str, durable: str, message_type: type[M],
                        handler: Handler[M], *, max_deliver: int = 5, ack_wait: float = 30.0,
                        retry_delay: float = 1.0, max_retry_delay: float = 60.0,
                        batch: int = 10, on_reject: RejectHook | None = None,
                        stream: str | None = None) -> Subscription[M]:
        """Start a durable pull consumer that feeds ``handler``; returns its running loop.

        Args:
            subject: The filter subject (wildcards allowed).
            durable: The durable consumer's name; it keeps its position across restarts.
            message_type: The protobuf class of the body.
            handler: ``async def handler(event)``; the message is acked when it returns.
            max_deliver: Deliveries before the message is given up (terminated, recorded).
            ack_wait: Seconds before an unacknowledged delivery is redelivered; a running
                handler keeps extending it.
            retry_delay: The first nak delay; doubles per delivery up to ``max_retry_delay``.
            max_retry_delay: The longest nak delay.
            batch: Messages fetched per request.
            on_reject: Hook for terminated messages (the bus's default when None).
            stream: The stream (found from the subject when None).

        Raises:
            RetryableError: JetStream unavailable while creating the consumer.
        """
        try:
            if stream is None:
                stream = _stream_of(subject) or await self._js.find_stream_name_by_subject(
                    subject)
            config = ConsumerConfig(
                durable_name=durable, name=durable, filter_subject=subject,
                ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait, max_deliver=max_deliver,
            )
            # Create-or-update: a changed max_deliver/ack_wait takes effect at the next start.
            await self._js.add_consumer(stream, config)
            psub = await self._js.pull_subscribe_bind(durable=durable, stream=stream)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                nats.errors.ConnectionClosedError, nats.js.errors.NotFoundError) as e:
            raise RetryableError(f"consumer {durable!r} on {subject!r}: {type(e).__name__}: "
                                 f"{e}") from e
        sub: Subscription[M] = Subscription(
            psub=psub, durable=durable, message_type=message_type, handler=handler,
            max_deliver=max_deliver, ack_wait=ack_wait, retry_delay=retry_delay,
            max_retry_delay=max_retry_delay, batch=batch,
            on_reject=on_reject if on_reject is not None else self.on_reject,
        )
        sub.start()
        self._subscriptions.append(sub)
        return sub

    async def close(self) -> None:
        """Stop every consumer loop (letting running handlers finish), then drain and close."""
        self._closing = True
        for sub in self._subscriptions:
            await sub.stop()
        self._subscriptions.clear()
        if not self._nc.is_closed:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                await self._nc.drain()
            if not self._nc.is_closed:
                await self._nc.close()


def _stream_of(subject: str) -> str | None:
    for spec in STREAMS:
        for pattern in spec.subjects:
            if subject.startswith(pattern.removesuffix(">")):
                return spec.name
    return None


@dataclass(eq=False)
class Subscription(Generic[M]):
    """A running durable consumer loop; :meth:`stop` ends it after the current message."""

    psub: JetStreamContext.PullSubscription
    durable: str
    message_type: type[M]
    handler: Handler[M]
    max_deliver: int
    ack_wait: float
    retry_delay: float
    max_retry_delay: float
    batch: int
    on_reject: RejectHook | None
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _stopping: bool = field(default=False, init=False)
    _busy: bool = field(default=False, init=False)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"consumer:{self.durable}")

    async def stop(self) -> None:
        """End the loop; a handler already running finishes and its message is answered."""
        self._stopping = True
        if self._task is not None:
            if not self._busy:
                # Waiting in a fetch: messages it might have pulled are unacked, so JetStream
                # redelivers them after ack_wait; nothing is lost.
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(nats.errors.Error):
            await self.psub.unsubscribe()

    async def _run(self) -> None:
        idle_backoff = 0.05
        while not self._stopping:
            try:
                msgs = await self.psub.fetch(self.batch, timeout=1.0)
            except (nats.errors.TimeoutError, TimeoutError):
                # nothing to do (nats-py raises its own or asyncio's timeout, by code path)
                continue
            except (nats.errors.Error, OSError) as e:
                # Disconnected, reconnecting or JetStream restarting: the client reconnects
                # by itself and the durable consumer keeps its position on the server.
                log.info("consumer %s: fetch failed (%s: %s); retrying", self.durable,
                         type(e).__name__, e)
                await asyncio.sleep(idle_backoff)
                idle_backoff = min(idle_backoff * 2, 2.0)
                continue
            idle_backoff = 0.05
            self._busy = True
            try:
                for msg in msgs:
                    if self._stopping:  # hand the rest of the batch back at once
                        with contextlib.suppress(nats.errors.Error):
                            await msg.nak()
                        continue
                    await self._handle(msg)
            finally:
                self._busy = False

    async def _handle(self, msg: Msg) -> None:
        meta = msg.metadata
        delivered, seq = meta.num_delivered, meta.sequence.stream
        headers = dict(msg.headers or {})
        expected = self.message_type.DESCRIPTOR.full_name
        declared = headers.get(HEADER_EVENT_TYPE)
        if declared is not None and declared != expected:
            await self._term(msg, f"event type {declared!r}, this consumer expects {expected!r}")
            return
        try:
            message = self.message_type.FromString(msg.data)
        except DecodeError as e:
            await self._term(msg, f"undecodable {expected} body ({len(msg.data)} bytes): {e}")
            return
        event = Event(msg.subject, message, headers, delivered, seq)
        keepalive = asyncio.create_task(self._keep_alive(msg))
        try:
            await self.handler(event)
        except UserError as e:
            await self._term(msg, f"{type(e).__name__}: {e}")
        except RetryableError as e:
            await self._retry(msg, delivered, f"{type(e).__name__}: {e}", exc_info=False)
        except Exception as e:
            await self._retry(msg, delivered, f"{type(e).__name__}: {e}", exc_info=True)
        else:
            await self._ack(msg, seq)
        finally:
            keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keepalive

    async def _keep_alive(self, msg: Msg) -> None:
        # A handler that runs longer than ack_wait would otherwise be redelivered while running.
        while True:
            await asyncio.sleep(self.ack_wait / 2)
            with contextlib.suppress(nats.errors.Error):
                await msg.in_progress()

    async def _ack(self, msg: Msg, seq: int) -> None:
        try:
            await msg.ack_sync(timeout=5.0)
        except (TimeoutError, nats.errors.Error) as e:
            # The effect is committed; JetStream will redeliver and the idempotent handler
            # will see it again. Nothing else can be done here.
            log.warning("consumer %s: ack of seq %d not confirmed (%s); it may be redelivered",
                        self.durable, seq, type(e).__name__)

    async def _retry(self, msg: Msg, delivered: int, reason: str, *, exc_info: bool) -> None:
        if delivered >= self.max_deliver:
            await self._term(msg, f"gave up after {delivered} deliveries: {reason}")
            return
        delay = min(self.retry_delay * 2 ** (delivered - 1), self.max_retry_delay)
        delay *= random.uniform(0.9, 1.1)  # de-synchronise replicas retrying the same failure
        log.warning("consumer %s: %s on %s (delivery %d); redelivering in %.1f s", self.durable,
                    reason, msg.subject, delivered, delay, exc_info=exc_info)
        with contextlib.suppress(nats.errors.Error):
            await msg.nak(delay=delay)

    async def _term(self, msg: Msg, reason: str) -> None:
        meta = msg.metadata
        log.error("consumer %s: terminating seq %d on %s: %s", self.durable,
                  meta.sequence.stream, msg.subject, reason)
        if self.on_reject is not None:
            rejection = Rejection(self.durable, msg.subject, reason, msg.data,
                                  dict(msg.headers or {}), meta.num_delivered,
                                  meta.sequence.stream)
            try:
                await self.on_reject(rejection)
            except Exception:
                # Recording failed: leave the message for redelivery rather than lose the why.
                log.exception("consumer %s: on_reject hook failed; redelivering seq %d",
                              self.durable, meta.sequence.stream)
                with contextlib.suppress(nats.errors.Error):
                    await msg.nak(delay=self.retry_delay)
                return
        with contextlib.suppress(nats.errors.Error):
            await msg.term()
