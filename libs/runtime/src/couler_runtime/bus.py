"""The event bus: NATS JetStream with protobuf bodies, durable pull consumers and idempotency.

Publishing (:meth:`Bus.publish`) sets ``Nats-Msg-Id`` from the caller's deterministic idempotency
key, so a republish inside the streams' duplicate window is stored once, and the standard
headers (:data:`HEADER_EVENT_ID` ... ``traceparent``). Consuming (:meth:`Bus.subscribe`) runs a
durable pull-consumer loop that maps a handler's outcome to JetStream's answer -- this is one
of the two places where Couler's error hierarchy is translated (the other is the gRPC
interceptor)::

    handler returns             -> ack (after the effect is committed; see below)
    RetryableError              -> nak with exponential back-off
    UserError / undecodable     -> term, logged, passed to the ``on_reject`` hook and recorded
    unauthenticated             -> as a UserError
    any other exception         -> nak with back-off, logged with its traceback
    the last allowed delivery   -> term (as above) instead of nak: the reason is recorded

**Identity** (``identity``, :class:`~couler_runtime.bus_keys.BusIdentity`): the connection
authenticates with the identity's nkey and reads replies on its own inbox prefix; every
message it publishes is signed and its msg id is ``<key>.<tag>``, unguessable by other
publishers (:meth:`~couler_runtime.bus_keys.BusIdentity.msg_id`). **Trust** (``trust``): a
consumer accepts a message only when it is signed by an owner of its subject
(:func:`couler_runtime.bus_access.owners`; launches, published by outside launchers whom
only the server's permissions admit, are the exception); anything else is terminated.

**Payloads by reference**: a body over ``inline_limit`` bytes is stored in the payload
store (content-addressed) and the message carries ``couler-payload: sha256:<hex>`` and
``couler-payload-size`` instead; the consumer loads it, checks digest and size, and
decodes it -- handlers never see the difference, and no message depends on the size of a
workflow.

**Dead letters**: a terminated message is published on ``couler.deadletter.<identity>``
(``events.DeadLetter``: subject, headers, body, reason, and -- for an authenticated message
-- its ``couler-run-id``), kept in the COULER_DEADLETTER stream.

**Pulling**: a consumer keeps one pull request open at a time (up to ``batch`` messages,
waiting up to :data:`PULL_EXPIRES` seconds on the server) and handles the messages it
brings as they arrive, asking again once it brought ``batch`` or ended: a message that
arrives alone costs its delivery, not a round of requests.

**Batches**: a consumer may take a *batch handler* (:meth:`Bus.subscribe` with
``batch_handler``): the messages of one fetch that pass the checks above go to it together
(one transaction for all of them, say) and are acked when it returns; when it raises, each
of them is handled again alone, so that only the one that fails is naked or terminated.

**Acknowledgements** are sent without waiting: the loop goes on to the next message while
the server's confirmation travels back (to one inbox per connection, :class:`_Acks`). An
ack not confirmed within 5 s, or still unconfirmed when the connection drops, is logged
("not confirmed"): JetStream redelivers that message after ``ack_wait`` and the idempotent
handler sees it again. A handler running longer than ``ack_wait`` / 2 keeps its messages
from being redelivered (one timer per fetch sends "in progress").

Consumers are durable and JetStream keeps their state on disk, so a consumer resumes where it
stopped after the client reconnects or the server restarts. Handlers must still be idempotent:
delivery is at-least-once (an ack lost with the connection means a redelivery).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import hashlib
import json
import logging
import random
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import nats.errors
import nats.js.errors
from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

from couler.errors import NotFoundError, RetryableError, UserError
from couler.v1 import events_pb2
from couler_runtime import telemetry
from couler_runtime.bus_access import (
    DEADLETTER_PREFIX,
    EVENT_SUBJECTS,
    LAUNCH_SUBJECTS,
    STREAMS,
    StreamSpec,
    deadletter_subject,
    grant_for,
    owners,
    stream_of,
    subject_matches,
)
from couler_runtime.bus_keys import (
    HEADER_SIGNATURE,
    HEADER_SIGNER,
    BusIdentity,
    SignatureError,
    Trust,
    signing_input,
)
from couler_runtime.settings import redact_url

__all__ = [
    "DEFAULT_INLINE_LIMIT",
    "HEADER_EVENT_ID",
    "HEADER_EVENT_TYPE",
    "HEADER_PAYLOAD",
    "HEADER_PAYLOAD_SIZE",
    "HEADER_RUN_ID",
    "HEADER_SOURCE",
    "HEADER_TENANT",
    "HEADER_TIME",
    "HEADER_TRACEPARENT",
    "PULL_EXPIRES",
    "STREAMS",
    "BatchHandler",
    "Bus",
    "ConsumerState",
    "Event",
    "Handler",
    "Payloads",
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
HEADER_RUN_ID = "couler-run-id"
HEADER_PAYLOAD = "couler-payload"
HEADER_PAYLOAD_SIZE = "couler-payload-size"
HEADER_TRACEPARENT = "traceparent"
_BUS_HEADERS = frozenset(
    h.lower() for h in (HEADER_MSG_ID, HEADER_EVENT_ID, HEADER_EVENT_TYPE, HEADER_SOURCE,
                        HEADER_TIME, HEADER_RUN_ID, HEADER_PAYLOAD, HEADER_PAYLOAD_SIZE,
                        HEADER_SIGNER, HEADER_SIGNATURE)
)
# Bodies above this many bytes travel by reference (NATS's own limit is 1 MiB by default).
DEFAULT_INLINE_LIMIT = 64 * 1024


class Payloads(Protocol):
    """A content-addressed store for bodies that travel by reference (keys ``sha256/<hex>``;
    ``couler_runtime.blobs`` stores are such). Blocking calls."""

    def put_bytes(self, data: bytes) -> str:
        """Store ``data``; its key."""

    def get_bytes(self, key: str) -> bytes:
        """The bytes under ``key``, verified against it."""


@dataclass(frozen=True)
class Event(Generic[M]):
    """A decoded message as a handler sees it.

    Attributes:
        subject: The subject it was published on.
        message: The decoded protobuf body.
        headers: All headers (standard ones under the ``HEADER_*`` names).
        delivery_count: 1 on the first delivery, 2 on the first redelivery, ...
        stream_sequence: Its sequence number in the stream (stable across redeliveries).
        signer: The identity whose signature was verified ("" when the bus has no trust
            configured, or for an unsigned launch).
    """

    subject: str
    message: M
    headers: Mapping[str, str]
    delivery_count: int
    stream_sequence: int
    signer: str = ""

    @property
    def event_id(self) -> str:
        """The event's id (equal to its msg id)."""
        return self.headers.get(HEADER_EVENT_ID, "")

    @property
    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` the publisher propagated, if any."""
        return self.headers.get(HEADER_TRACEPARENT)

    def trace_context(self) -> Any:
        """The OpenTelemetry context the publisher propagated (a root one when none):
        the parent of the span that consumes this event."""
        return telemetry.extract(self.headers)


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
        authenticated: Whether it was signed by an owner of its subject (True when the
            bus checks no signatures).
    """

    durable: str
    subject: str
    reason: str
    payload: bytes
    headers: Mapping[str, str]
    delivery_count: int
    stream_sequence: int
    authenticated: bool = True

    @property
    def run_id(self) -> str:
        """The run it belongs to, when the message is authenticated and says so."""
        return self.headers.get(HEADER_RUN_ID, "") if self.authenticated else ""


@dataclass(frozen=True)
class ConsumerState:
    """One durable consumer as JetStream reports it (:meth:`Bus.consumer_states`)."""

    stream: str
    durable: str
    subject: str
    pending: int
    ack_pending: int
    redelivered: int


@dataclass(frozen=True)
class PublishResult:
    """JetStream's answer to a publish: ``duplicate`` is True when the msg id was seen."""

    stream: str
    sequence: int
    duplicate: bool
    msg_id: str = ""


Handler = Callable[[Event[M]], Awaitable[None]]
BatchHandler = Callable[[Sequence[Event[M]]], Awaitable[None]]
RejectHook = Callable[[Rejection], Awaitable[None]]

PULL_EXPIRES = 1.0  # seconds a pull request waits on the server for messages
_PULL_GRACE = 0.5  # more seconds without an answer, and the request is taken as lost
_STATUS = "Status"
_HEARTBEAT = "100"
_ACK = b"+ACK"
_ACK_TIMEOUT = 5.0  # seconds for the server to confirm an ack before it is said unconfirmed
_OWNERS_KEPT = 1024  # subjects whose owners a bus remembers


class _Acks:
    """Acknowledgements sent without waiting for the server's confirmation.

    Each ack is published with a reply subject under one inbox of this connection; the
    server's confirmation removes it from :attr:`pending`. An ack still unconfirmed after
    ``timeout`` seconds, or when the connection drops (:meth:`lost`), is logged as not
    confirmed: its message may be redelivered (handlers are idempotent).
    """

    def __init__(self, nc: NatsClient, timeout: float = _ACK_TIMEOUT) -> None:
        self._nc = nc
        self._timeout = timeout
        self._inbox = ""
        self._next = 0
        # token -> (durable, stream sequence, when sent); in the order sent
        self.pending: dict[str, tuple[str, int, float]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._starting: asyncio.Lock | None = None

    async def send(self, msg: Msg, durable: str, seq: int) -> None:
        """Acknowledge ``msg``; returns once the ack is in the connection's buffer.

        Raises:
            nats.errors.Error: The connection is closed (the message will be redelivered).
        """
        if not self._inbox:
            await self._start()
        self._next += 1
        token = str(self._next)
        loop = asyncio.get_running_loop()
        self.pending[token] = (durable, seq, loop.time())
        if self._sweep is None:
            self._sweep = loop.call_later(self._timeout, self._expire)
        await self._nc.publish(msg.reply, _ACK, reply=f"{self._inbox}.{token}")

    async def _start(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if not self._inbox:
                inbox = self._nc.new_inbox()
                await self._nc.subscribe(f"{inbox}.*", cb=self._confirmed)
                self._inbox = inbox

    async def _confirmed(self, msg: Msg) -> None:
        self.pending.pop(msg.subject.rpartition(".")[2], None)

    def _expire(self) -> None:
        self._sweep = None
        loop = asyncio.get_running_loop()
        oldest = loop.time() - self._timeout
        for token, (durable, seq, sent) in list(self.pending.items()):
            if sent > oldest:
                break
            del self.pending[token]
            self.unconfirmed(durable, seq, "TimeoutError")
        if self.pending:
            first = next(iter(self.pending.values()))[2]
            self._sweep = loop.call_later(max(0.0, first - oldest), self._expire)

    def lost(self, reason: str) -> None:
        """The connection dropped: no confirmation in flight will arrive."""
        for durable, seq, _ in self.pending.values():
            self.unconfirmed(durable, seq, reason)
        self.pending.clear()

    @staticmethod
    def unconfirmed(durable: str, seq: int, reason: str) -> None:
        # The effect is committed; JetStream will redeliver and the idempotent handler
        # will see it again. Nothing else can be done here.
        log.warning("consumer %s: ack of seq %d not confirmed (%s); it may be redelivered",
                    durable, seq, reason)

    async def settled(self, timeout: float) -> None:
        """Wait until every ack sent was confirmed (or lost), at most ``timeout`` s."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self.pending and loop.time() < end and not self._nc.is_closed:
            await asyncio.sleep(0.005)

    def close(self) -> None:
        """Stop the timer (pending confirmations are dropped silently)."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None


class _Inbox:
    """Where JetStream delivers one consumer's pulled messages: a subscription to
    ``<inbox>.*``, each pull request answered on ``<inbox>.<n>``. Messages wait here, in
    order, until the consumer takes them."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self.prefix = nc.new_inbox()
        self._sub: Any = None
        self._msgs: collections.deque[Msg] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._request = 0

    @property
    def opened(self) -> bool:
        return self._sub is not None

    async def open(self) -> None:
        self._sub = await self._nc.subscribe(f"{self.prefix}.*", cb=self._deliver)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None

    def next_reply(self) -> str:
        """The reply subject of a new pull request (statuses of older ones are ignored)."""
        self._request += 1
        return f"{self.prefix}.{self._request}"

    async def _deliver(self, msg: Msg) -> None:
        self._msgs.append(msg)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, timeout: float) -> bool:
        """Wait until something was delivered (at most ``timeout`` s); whether it was."""
        if self._msgs:
            return True
        if timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()

        def expire() -> None:
            if not waiter.done():
                waiter.set_result(None)

        timer = loop.call_later(timeout, expire)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return bool(self._msgs)

    def take(self, limit: int) -> tuple[list[Msg], bool]:
        """Up to ``limit`` delivered messages, in order, and whether the current pull
        request ended (its status came: expired, or refused). Heartbeats and the statuses
        of earlier requests are dropped."""
        taken: list[Msg] = []
        current = f"{self.prefix}.{self._request}"
        while self._msgs and len(taken) < limit:
            msg = self._msgs.popleft()
            if msg.reply:  # a stream message (its reply is the ack subject)
                taken.append(msg)
                continue
            status = (msg.headers or {}).get(_STATUS, "")
            if status == _HEARTBEAT or msg.subject != current:
                continue
            if status not in ("404", "408"):
                log.info("pull request answered %s %s", status,
                         (msg.headers or {}).get("Description", ""))
            return taken, True
        return taken, False


class _KeepAlive:
    """Tells JetStream that ``msgs`` are being worked on every ``interval`` seconds until
    each is answered (:meth:`done`) or the whole is :meth:`stop`-ped: a handler that runs
    longer than ack_wait would otherwise be redelivered while running."""

    def __init__(self, msgs: Iterable[Msg], interval: float) -> None:
        self._open = {id(m): m for m in msgs}
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(interval, self._tick)
        self._sending: set[asyncio.Task[None]] = set()

    def done(self, msg: Msg) -> None:
        self._open.pop(id(msg), None)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._open.clear()

    def _tick(self) -> None:
        if not self._open:
            self._timer = None
            return
        task = self._loop.create_task(self._progress(list(self._open.values())))
        self._sending.add(task)  # a reference until it is done
        task.add_done_callback(self._sending.discard)
        self._timer = self._loop.call_later(self._interval, self._tick)

    @staticmethod
    async def _progress(msgs: list[Msg]) -> None:
        for msg in msgs:
            with contextlib.suppress(nats.errors.Error):
                await msg.in_progress()


class _TlsEofNoise(logging.Filter):
    """Drops asyncio's "returning true from eof_received() has no effect when using ssl",
    logged for every TLS connection nats-py closes: noise, not a problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


def _quiet_tls_eof() -> None:
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _TlsEofNoise) for f in asyncio_log.filters):
        asyncio_log.addFilter(_TlsEofNoise())


async def _until(task: asyncio.Future[Any], stop: Callable[[], bool], timeout: float) -> None:
    """Wait for ``task`` up to ``timeout`` seconds, or until ``stop()`` holds (checked every
    50 ms); cancel it (TimeoutError) when it did not finish."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not task.done() and not stop() and loop.time() < end:
        await asyncio.wait({task}, timeout=min(0.05, max(0.0, end - loop.time())))
    if task.done():
        task.result()
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise TimeoutError("connect did not finish")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class Bus:
    """A connection to NATS JetStream; create it with :meth:`connect`.

    Args:
        nc: A connected NATS client.
        source: The ``couler-source`` header of every message published (the service name).
        tenant: The default ``couler-tenant`` header.
        on_reject: Default hook called with every terminated message (a service stores it).
        identity: Who publishes (signs, tags msg ids); None for an unauthenticated bus.
        trust: The keys signatures are checked with; None to accept unsigned messages.
        payloads: Where bodies over ``inline_limit`` go; None to send every body inline.
        inline_limit: The largest body sent inline, in bytes.
        deadletters: Record terminated messages on ``couler.deadletter.<identity>``
            (``couler.deadletter.<source>`` without an identity).
    """

    def __init__(self, nc: NatsClient, *, source: str, tenant: str = "",
                 on_reject: RejectHook | None = None, identity: BusIdentity | None = None,
                 trust: Trust | None = None, payloads: Payloads | None = None,
                 inline_limit: int = DEFAULT_INLINE_LIMIT, deadletters: bool = True) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self.source = source
        self.tenant = tenant
        self.on_reject = on_reject
        self.identity = identity
        self.trust = trust
        self.payloads = payloads
        self.inline_limit = inline_limit
        name = identity.name if identity is not None else source.removeprefix("couler-")
        self._deadletter_subject = deadletter_subject(name) if deadletters else None
        self._subscriptions: list[Subscription[Any]] = []
        self._closing = False
        self._acks = _Acks(nc)
        self._owners: dict[str, frozenset[str]] = {}

    @classmethod
    async def connect(cls, url: str, *, name: str, tenant: str = "",
                      on_reject: RejectHook | None = None, connect_timeout: float = 10.0,
                      reconnect_wait: float = 0.5, identity: BusIdentity | None = None,
                      trust: Trust | None = None, tls: ssl.SSLContext | None = None,
                      payloads: Payloads | None = None,
                      inline_limit: int = DEFAULT_INLINE_LIMIT,
                      deadletters: bool = True) -> Bus:
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
            identity: Authenticate (nkey) and sign as this identity.
            trust: Verify what consumers receive with these keys.
            tls: A TLS context (for ``tls://`` URLs or a server that requires TLS).
            payloads: The store for bodies over ``inline_limit``.
            inline_limit: The largest body sent inline.
            deadletters: Record terminated messages in the dead-letter stream.

        Raises:
            RetryableError: The server did not answer in time.
            UserError: The server refused the identity (or anonymous clients).
        """
        servers = [u.strip() for u in url.split(",")]

        refused: list[Exception] = []  # the server's "Authorization Violation", if any

        async def on_error(e: Exception) -> None:
            # nats-py's default callback logs a full traceback for every failed reconnect.
            log.warning("NATS %s: %s: %s", redact_url(url), type(e).__name__, e)
            # nats-py reports the server's -ERR as a plain Error: the text is all there is
            if ("authorization violation" in str(e).lower()
                    or isinstance(e, ssl.SSLCertVerificationError)):
                refused.append(e)

        made: list[Bus] = []  # the callbacks exist before the Bus they report on

        async def on_disconnected() -> None:
            if made:
                made[0]._acks.lost("disconnected")
            if not (made and made[0]._closing):
                log.warning("NATS %s: disconnected", redact_url(url))

        async def on_reconnected() -> None:
            log.info("NATS %s: reconnected", redact_url(url))

        auth: dict[str, Any] = {}
        if identity is not None:
            auth = {"nkeys_seed_str": identity.seed.decode(),
                    "inbox_prefix": identity.inbox_prefix}
        if tls is not None:
            auth["tls"] = tls
            _quiet_tls_eof()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + connect_timeout
        delay = 0.05
        who = f"identity {identity.name!r}" if identity is not None else "an anonymous client"
        while True:
            nc = NatsClient()
            # With unlimited reconnects nats-py would retry the first connect forever too,
            # and a refused identity along with it: a refusal ends the wait at once.
            connecting = asyncio.ensure_future(nc.connect(
                servers, name=name, error_cb=on_error, disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected, allow_reconnect=True,
                max_reconnect_attempts=-1,
                # annotated int, used as float seconds (asyncio.sleep)
                reconnect_time_wait=reconnect_wait,  # type: ignore[arg-type]
                connect_timeout=max(1, round(min(2.0, connect_timeout))), **auth,
            ))
            try:
                await _until(connecting, lambda: bool(refused),
                             max(0.1, deadline - loop.time()))
                made.append(cls(nc, source=name, tenant=tenant, on_reject=on_reject,
                                identity=identity, trust=trust, payloads=payloads,
                                inline_limit=inline_limit, deadletters=deadletters))
                return made[0]
            except (OSError, TimeoutError, nats.errors.Error, ssl.SSLError) as e:
                with contextlib.suppress(nats.errors.Error):
                    await nc.close()
                if refused and isinstance(refused[0], ssl.SSLCertVerificationError):
                    raise UserError(f"NATS at {redact_url(url)}: its TLS certificate is not "
                                    f"trusted ({refused[0].verify_message}); give the "
                                    "deployment's CA in COULER_NATS_TLS_CA") from refused[0]
                if refused or "authorization violation" in str(e).lower():
                    raise UserError(f"NATS at {redact_url(url)} refused {who} (Authorization "
                                    "Violation): check COULER_NATS_SEED_FILE / the server's "
                                    "configuration") from e
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

        Idempotent. Needs the admin identity on an authenticated bus (services only
        :meth:`wait_for_streams`).

        Args:
            streams: The streams to ensure (all of Couler's by default).
            duplicate_window: Seconds within which a repeated ``Nats-Msg-Id`` is dropped.
            max_bytes: Optional size limit per stream (JetStream's default is machine-sized).
        """
        if self.identity is not None and not grant_for(self.identity.name).admin:
            raise UserError(f"identity {self.identity.name!r} may not create or change streams "
                            "(only 'admin' may: `couler bus setup`, or `couler up`)")
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

    async def wait_for_streams(self, names: Iterable[str], *, timeout: float = 60.0) -> None:
        """Wait until the streams ``names`` exist (the admin creates them: ``couler up`` or
        ``couler bus setup``).

        Raises:
            RetryableError: Not all of them within ``timeout`` seconds, naming the missing.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        missing = sorted(set(names))
        said = False
        while missing:
            for name in list(missing):
                with contextlib.suppress(nats.js.errors.NotFoundError, nats.errors.Error):
                    await self._js.stream_info(name)
                    missing.remove(name)
            if not missing:
                return
            if loop.time() > deadline:
                raise RetryableError(f"streams {', '.join(missing)} do not exist after "
                                     f"{timeout:g} s: create them with `couler bus setup` "
                                     "(the admin identity); `couler up` does it")
            if not said:
                log.info("waiting for streams %s (created by the bus admin)", ", ".join(missing))
                said = True
            await asyncio.sleep(0.5)

    def msg_id(self, subject: str, key: str) -> str:
        """The ``Nats-Msg-Id`` this bus gives idempotency key ``key`` on ``subject``."""
        return self.identity.msg_id(subject, key) if self.identity is not None else key

    async def publish(self, subject: str, message: Message, *, msg_id: str,
                      headers: Mapping[str, str] | None = None, tenant: str | None = None,
                      run_id: str = "", timeout: float = 5.0) -> PublishResult:
        """Publish ``message`` on ``subject`` and wait until JetStream stored it.

        Args:
            subject: The subject (it must fall in one of the streams).
            message: The protobuf body.
            msg_id: A deterministic idempotency key (e.g. ``run-id/step/attempt/state``):
                a republish with the same key inside the duplicate window is dropped.
                With an identity, the id sent is ``<key>.<tag>`` (see :meth:`msg_id`).
            headers: Extra headers. ``traceparent``/``tracestate`` given here are sent as
                they are (e.g. a context recorded with an outbox row); without them the
                current span's context is injected, so a consumer continues the trace.
            tenant: The ``couler-tenant`` header (the bus's default when None).
            run_id: The run the message belongs to (``couler-run-id``; a dead letter of it
                fails that run while it is being planned).
            timeout: Seconds to wait for JetStream's acknowledgement.

        Returns:
            Where it was stored, and whether it was a duplicate.

        Raises:
            UserError: An empty ``msg_id``, a header the bus owns, or a body larger than
                the server accepts with no payload store to send it by reference.
            RetryableError: JetStream did not acknowledge (no stream or server unavailable),
                or the payload store is unavailable.
        """
        if not msg_id:
            raise UserError(f"publish to {subject!r}: msg_id must be a non-empty key")
        hdrs: dict[str, str] = {}
        for key, value in (headers or {}).items():
            if key.lower() in _BUS_HEADERS:
                raise UserError(f"publish to {subject!r}: header {key!r} is set by the bus")
            hdrs[key] = value
        if HEADER_TRACEPARENT not in hdrs:  # the publisher's current span, when it has one
            telemetry.inject(hdrs)
        wire_id = self.msg_id(subject, msg_id)
        hdrs.update({
            HEADER_MSG_ID: wire_id,
            HEADER_EVENT_ID: wire_id,
            HEADER_EVENT_TYPE: message.DESCRIPTOR.full_name,
            HEADER_SOURCE: self.source,
            HEADER_TIME: _now(),
        })
        hdrs[HEADER_TENANT] = tenant if tenant is not None else hdrs.get(HEADER_TENANT,
                                                                         self.tenant)
        if run_id:
            hdrs[HEADER_RUN_ID] = run_id
        body = message.SerializeToString()
        digest = hashlib.sha256(body).hexdigest()
        if len(body) > self.inline_limit and self.payloads is not None:
            key = await self._store(subject, body)
            hdrs[HEADER_PAYLOAD] = "sha256:" + key.removeprefix("sha256/")
            hdrs[HEADER_PAYLOAD_SIZE] = str(len(body))
            body = b""
        if self.identity is not None and self.identity.signs:
            hdrs[HEADER_SIGNER] = self.identity.name
            hdrs[HEADER_SIGNATURE] = self.identity.sign(signing_input(subject, hdrs, digest))
        try:
            ack = await self._js.publish(subject, body, timeout=timeout, headers=hdrs)
        except nats.errors.MaxPayloadError as e:
            raise UserError(f"publish to {subject!r}: a {len(body)}-byte body is over the "
                            "server's max_payload and no payload store is configured "
                            "(COULER_ARTIFACTS)") from e
        except nats.js.errors.NoStreamResponseError as e:
            raise RetryableError(f"publish to {subject!r}: no stream answered (is the subject "
                                 "in a stream, and JetStream up?)") from e
        except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError,
                nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError,
                nats.js.errors.ServiceUnavailableError) as e:
            raise RetryableError(f"publish to {subject!r}: {type(e).__name__}") from e
        return PublishResult(ack.stream, ack.seq, bool(ack.duplicate), wire_id)

    async def _store(self, subject: str, body: bytes) -> str:
        assert self.payloads is not None
        try:
            return await asyncio.to_thread(self.payloads.put_bytes, body)
        except RetryableError:
            raise
        except Exception as e:
            raise RetryableError(f"publish to {subject!r}: storing a {len(body)}-byte body "
                                 f"failed: {type(e).__name__}: {e}") from e

    async def subscribe(self, subject: str, durable: str, message_type: type[M],
                        handler: Handler[M] | None = None, *, max_deliver: int = 5,
                        ack_wait: float = 30.0, retry_delay: float = 1.0,
                        max_retry_delay: float = 60.0, batch: int = 10,
                        on_reject: RejectHook | None = None, stream: str | None = None,
                        batch_handler: BatchHandler[M] | None = None,
                        linger: float = 0.0) -> Subscription[M]:
        """Start a durable pull consumer that feeds ``handler``; returns its running loop.

        Args:
            subject: The filter subject (wildcards allowed).
            durable: The durable consumer's name; it keeps its position across restarts.
            message_type: The protobuf class of the body.
            handler: ``async def handler(event)``; the message is acked when it returns.
            batch_handler: Instead of ``handler``: ``async def handler(events)`` gets the
                valid messages of one fetch (in stream order) at once; they are acked when
                it returns. When it raises, each is passed again alone (a list of one) and
                answered by its own outcome.
            linger: Seconds to wait, once a message arrived, for more to handle with it
                (up to ``batch``): for batch consumers whose latency nobody waits on.
            max_deliver: Deliveries before the message is given up (terminated, recorded).
            ack_wait: Seconds before an unacknowledged delivery is redelivered; a running
                handler keeps extending it.
            retry_delay: The first nak delay; doubles per delivery up to ``max_retry_delay``.
            max_retry_delay: The longest nak delay.
            batch: Messages fetched per request.
            on_reject: Hook for terminated messages (the bus's default when None).
            stream: The stream (found from the subject when None).

        Raises:
            UserError: The identity has no grant for this consumer (it would be refused).
            RetryableError: JetStream unavailable while creating the consumer.
        """
        if (handler is None) == (batch_handler is None):
            raise UserError(f"consumer {durable!r}: give exactly one of handler and "
                            "batch_handler")
        if stream is None:
            stream = stream_of(subject)
        if self.identity is not None:
            grant = grant_for(self.identity.name)
            if not grant.admin and not any(
                    c.durable == durable and c.filter == subject and c.stream == stream
                    for c in grant.consumers):
                raise UserError(f"identity {self.identity.name!r} has no grant for consumer "
                                f"{durable!r} on {subject!r} (couler_runtime.bus_access)")
        try:
            if stream is None:
                stream = await self._js.find_stream_name_by_subject(subject)
            config = ConsumerConfig(
                durable_name=durable, name=durable, filter_subject=subject,
                ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait, max_deliver=max_deliver,
            )
            # Create-or-update: a changed max_deliver/ack_wait takes effect at the next start.
            await self._js.add_consumer(stream, config)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                nats.errors.ConnectionClosedError, nats.js.errors.NotFoundError) as e:
            raise RetryableError(f"consumer {durable!r} on {subject!r}: {type(e).__name__}: "
                                 f"{e}") from e
        sub: Subscription[M] = Subscription(
            nc=self._nc, stream=stream, durable=durable, message_type=message_type,
            handler=handler,
            max_deliver=max_deliver, ack_wait=ack_wait, retry_delay=retry_delay,
            max_retry_delay=max_retry_delay, batch=batch,
            on_reject=on_reject if on_reject is not None else self.on_reject, bus=self,
            batch_handler=batch_handler, linger=linger, subject=subject,
        )
        sub.start()
        self._subscriptions.append(sub)
        return sub

    async def consumer_states(self) -> list[ConsumerState]:
        """What JetStream says of this bus's consumers: messages waiting for each
        (``num_pending``), delivered but not yet acknowledged (``num_ack_pending``) and
        redelivered (``num_redelivered``).

        Raises:
            nats.errors.Error: JetStream did not answer.
        """
        out = []
        for sub in list(self._subscriptions):
            info = await self._js.consumer_info(sub.stream, sub.durable, timeout=2.0)
            out.append(ConsumerState(stream=sub.stream, durable=sub.durable,
                                     subject=sub.subject, pending=info.num_pending or 0,
                                     ack_pending=info.num_ack_pending or 0,
                                     redelivered=info.num_redelivered or 0))
        return out

    # ---------------------------------------------------------------- consuming side

    def authenticate(self, subject: str, headers: Mapping[str, str], body_sha256: str) -> str:
        """The identity that signed the message; "" when no trust is configured or for an
        unsigned launch.

        Raises:
            SignatureError: Unsigned, signed by a non-owner of ``subject``, or forged.
        """
        if self.trust is None:
            return ""
        signer = headers.get(HEADER_SIGNER, "")
        signature = headers.get(HEADER_SIGNATURE, "")
        if not signer and (subject_matches(LAUNCH_SUBJECTS, subject)
                           or subject_matches(EVENT_SUBJECTS, subject)):
            return ""  # outside launchers: the server's permissions admit only them
        allowed = self._owners.get(subject)
        if allowed is None:
            if len(self._owners) >= _OWNERS_KEPT:
                self._owners.clear()
            allowed = self._owners[subject] = owners(subject)
        if not signer or not signature:
            raise SignatureError(f"unsigned message on {subject!r}: only "
                                 f"{', '.join(sorted(allowed)) or 'nobody'} may publish it")
        if signer not in allowed:
            raise SignatureError(f"message on {subject!r} signed by {signer!r}, which does "
                                 f"not own the subject (owners: "
                                 f"{', '.join(sorted(allowed)) or 'none'})")
        if not self.trust.verify(signer, signing_input(subject, headers, body_sha256),
                                 signature):
            raise SignatureError(f"message on {subject!r}: the signature of {signer!r} does "
                                 "not match its content")
        return signer

    async def load_body(self, subject: str, data: bytes, headers: Mapping[str, str]) -> bytes:
        """The message's body: ``data``, or the stored body it refers to (digest and size
        checked).

        Raises:
            UserError: A malformed reference, or a body that is not (or no longer) stored.
            RetryableError: The payload store is unavailable.
        """
        ref = headers.get(HEADER_PAYLOAD)
        if ref is None:
            return data
        algorithm, _, hex_digest = ref.partition(":")
        size_text = headers.get(HEADER_PAYLOAD_SIZE, "")
        if algorithm != "sha256" or len(hex_digest) != 64 or not size_text.isdigit():
            raise UserError(f"message on {subject!r}: malformed payload reference {ref!r} "
                            f"(size {size_text!r})")
        if self.payloads is None:
            raise UserError(f"message on {subject!r} refers to a stored body ({ref}) and this "
                            "service has no payload store (COULER_ARTIFACTS)")
        try:
            body = await asyncio.to_thread(self.payloads.get_bytes, f"sha256/{hex_digest}")
        except NotFoundError as e:
            raise UserError(f"message on {subject!r}: its body {ref} is not in the payload "
                            "store") from e
        except (RetryableError, UserError):
            raise
        except Exception as e:  # integrity errors and the like: the reference cannot be used
            raise UserError(f"message on {subject!r}: its body {ref} cannot be read: "
                            f"{type(e).__name__}: {e}") from e
        if len(body) != int(size_text):
            raise UserError(f"message on {subject!r}: its body {ref} has {len(body)} bytes, "
                            f"the message says {size_text}")
        return body

    async def record_deadletter(self, rejection: Rejection) -> None:
        """Publish ``rejection`` on this bus's dead-letter subject (no-op when off, and for
        dead letters themselves: a consumer of dead letters that fails must not loop)."""
        if self._deadletter_subject is None or rejection.subject.startswith(
                DEADLETTER_PREFIX + "."):
            return
        at = Timestamp()
        at.GetCurrentTime()
        letter = events_pb2.DeadLetter(
            durable=rejection.durable, subject=rejection.subject,
            stream_sequence=rejection.stream_sequence,
            delivery_count=rejection.delivery_count, reason=rejection.reason,
            headers=dict(rejection.headers), payload=rejection.payload,
            authenticated=rejection.authenticated, run_id=rejection.run_id, at=at)
        await self.publish(self._deadletter_subject, letter,
                           msg_id=f"{rejection.durable}.{rejection.stream_sequence}",
                           run_id=rejection.run_id)

    async def close(self) -> None:
        """Stop every consumer loop (letting running handlers finish), then drain and close."""
        self._closing = True
        for sub in self._subscriptions:
            await sub.stop()
        self._subscriptions.clear()
        # The last acks' confirmations are on their way: a graceful stop waits for them.
        await self._acks.settled(2.0)
        self._acks.close()
        if not self._nc.is_closed:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                await self._nc.drain()
            if not self._nc.is_closed:
                await self._nc.close()


@dataclass(eq=False)
class Subscription(Generic[M]):
    """A running durable consumer loop; :meth:`stop` ends it after the current message."""

    nc: NatsClient
    stream: str
    durable: str
    message_type: type[M]
    handler: Handler[M] | None
    max_deliver: int
    ack_wait: float
    retry_delay: float
    max_retry_delay: float
    batch: int
    on_reject: RejectHook | None
    bus: Bus
    batch_handler: BatchHandler[M] | None = None
    linger: float = 0.0
    subject: str = ""  # the filter subject
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _stopping: bool = field(default=False, init=False)
    _busy: bool = field(default=False, init=False)
    _inbox: _Inbox | None = field(default=None, init=False)

    def start(self) -> None:
        self._inbox = _Inbox(self.nc)
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
        if self._inbox is not None:
            await self._inbox.close()

    async def _run(self) -> None:
        inbox = self._inbox
        assert inbox is not None  # start() made it
        loop = asyncio.get_running_loop()
        next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}"
        request = json.dumps({"batch": self.batch,
                              "expires": int(PULL_EXPIRES * 1e9)}).encode()
        idle_backoff = 0.05
        while not self._stopping:
            try:
                if not inbox.opened:
                    await inbox.open()
                # One request at a time; it brings up to `batch` messages as they come.
                await self.nc.publish(next_subject, request, reply=inbox.next_reply())
            except (nats.errors.Error, OSError) as e:
                # Disconnected, reconnecting or JetStream restarting: the client reconnects
                # by itself and the durable consumer keeps its position on the server.
                log.info("consumer %s: pull request failed (%s: %s); retrying", self.durable,
                         type(e).__name__, e)
                await asyncio.sleep(idle_backoff)
                idle_backoff = min(idle_backoff * 2, 2.0)
                continue
            idle_backoff = 0.05
            credit = self.batch
            deadline = loop.time() + PULL_EXPIRES + _PULL_GRACE
            while credit > 0 and not self._stopping:
                # No answer by the deadline (the connection dropped, say): ask again.
                if not await inbox.wait(deadline - loop.time()):
                    break
                # Let what the same read woke run first (the publisher of these messages,
                # by its PubAck; more deliveries): a handler's effect is then not seen
                # before the ack that follows it can leave, and more come in one batch.
                # A batch consumer off the critical path may linger for more (one
                # transaction for many instead of one each).
                await asyncio.sleep(self.linger)
                msgs, ended = inbox.take(credit)
                if msgs:
                    credit -= len(msgs)
                    await self._handle_all(msgs)
                if ended:
                    break

    async def _handle_all(self, msgs: Sequence[Msg]) -> None:
        """Answer ``msgs`` (delivered together), in order."""
        self._busy = True
        keepalive = _KeepAlive(msgs, self.ack_wait / 2)
        try:
            if self.batch_handler is not None:
                await self._handle_batch(msgs, keepalive)
                return
            for msg in msgs:
                if self._stopping:  # hand the rest back at once
                    with contextlib.suppress(nats.errors.Error):
                        await msg.nak()
                    continue
                event = await self._decode(msg)
                if event is not None:
                    await self._dispatch(msg, event, self._single)
                keepalive.done(msg)
        finally:
            keepalive.stop()
            self._busy = False

    async def _single(self, event: Event[M]) -> None:
        assert self.handler is not None  # subscribe() gave one of the two
        await self.handler(event)

    async def _alone(self, event: Event[M]) -> None:
        assert self.batch_handler is not None
        await self.batch_handler((event,))

    async def _handle_batch(self, msgs: Sequence[Msg], keepalive: _KeepAlive) -> None:
        assert self.batch_handler is not None
        valid: list[tuple[Msg, Event[M]]] = []
        for msg in msgs:
            event = await self._decode(msg)
            if event is None:
                keepalive.done(msg)
            else:
                valid.append((msg, event))
        if not valid:
            return
        if len(valid) > 1:
            try:
                await self.batch_handler([event for _, event in valid])
            except Exception as e:  # handled again one by one: only the failing one fails
                log.info("consumer %s: a batch of %d failed (%s: %s); handling each alone",
                         self.durable, len(valid), type(e).__name__, e)
            else:
                for msg, event in valid:
                    await self._ack(msg, event.stream_sequence)
                return
        for msg, event in valid:
            await self._dispatch(msg, event, self._alone)
            keepalive.done(msg)

    async def _decode(self, msg: Msg) -> Event[M] | None:
        """The message as a handler sees it; None when it was answered already (terminated:
        unauthenticated, of another type, undecodable; or naked: its body is unavailable)."""
        meta = msg.metadata
        delivered, seq = meta.num_delivered, meta.sequence.stream
        headers = dict(msg.headers or {})
        expected = self.message_type.DESCRIPTOR.full_name
        declared = headers.get(HEADER_EVENT_TYPE)
        ref = headers.get(HEADER_PAYLOAD, "")
        digest = ref.removeprefix("sha256:") if ref else hashlib.sha256(msg.data).hexdigest()
        try:
            signer = self.bus.authenticate(msg.subject, headers, digest)
        except SignatureError as e:
            await self._term(msg, f"{type(e).__name__}: {e}", authenticated=False)
            return None
        if declared is not None and declared != expected:
            await self._term(msg, f"event type {declared!r}, this consumer expects {expected!r}")
            return None
        try:
            data = await self.bus.load_body(msg.subject, msg.data, headers)
        except UserError as e:
            await self._term(msg, f"{type(e).__name__}: {e}")
            return None
        except RetryableError as e:
            await self._retry(msg, delivered, f"{type(e).__name__}: {e}", exc_info=False)
            return None
        try:
            message = self.message_type.FromString(data)
        except DecodeError as e:
            await self._term(msg, f"undecodable {expected} body ({len(data)} bytes): {e}")
            return None
        return Event(msg.subject, message, headers, delivered, seq, signer)

    async def _dispatch(self, msg: Msg, event: Event[M],
                        call: Callable[[Event[M]], Awaitable[None]]) -> None:
        """Run ``call(event)`` and answer ``msg`` by its outcome."""
        delivered = event.delivery_count
        try:
            await call(event)
        except UserError as e:
            await self._term(msg, f"{type(e).__name__}: {e}")
        except RetryableError as e:
            await self._retry(msg, delivered, f"{type(e).__name__}: {e}", exc_info=False)
        except Exception as e:
            await self._retry(msg, delivered, f"{type(e).__name__}: {e}", exc_info=True)
        else:
            await self._ack(msg, event.stream_sequence)

    async def _ack(self, msg: Msg, seq: int) -> None:
        try:
            await self.bus._acks.send(msg, self.durable, seq)
        except nats.errors.Error as e:  # the connection is closed: it will be redelivered
            _Acks.unconfirmed(self.durable, seq, type(e).__name__)

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

    async def _term(self, msg: Msg, reason: str, *, authenticated: bool = True) -> None:
        meta = msg.metadata
        log.error("consumer %s: terminating seq %d on %s: %s", self.durable,
                  meta.sequence.stream, msg.subject, reason)
        rejection = Rejection(self.durable, msg.subject, reason, msg.data,
                              dict(msg.headers or {}), meta.num_delivered,
                              meta.sequence.stream, authenticated=authenticated)
        try:
            if self.on_reject is not None:
                await self.on_reject(rejection)
            await self.bus.record_deadletter(rejection)
        except Exception:
            # Recording failed: leave the message for redelivery rather than lose the why.
            log.exception("consumer %s: recording the rejection failed; redelivering seq %d",
                          self.durable, meta.sequence.stream)
            with contextlib.suppress(nats.errors.Error):
                await msg.nak(delay=self.retry_delay)
            return
        with contextlib.suppress(nats.errors.Error):
            await msg.term()
