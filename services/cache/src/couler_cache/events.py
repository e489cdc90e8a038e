"""The cache's NATS side: succeeded steps in, cache events out.

One durable consumer (``cache``) reads ``couler.step.succeeded`` (``StepEvent``): a step
in state SUCCEEDED with a ``cache_key`` is committed as an entry (its outputs and the
artifacts the submitter already put in the artifact store; its cost, the seconds from its
start to its end -- retries included, what running it again may take --; its lineage, the
cache keys of the steps it read from, as the engine reported them); any other step is acked
and ignored. The commit is idempotent -- the first commit for a key wins -- so a redelivered or
republished event adds nothing. A bad entry (an invalid digest, an artifact missing from
the store) is a UserError: the bus terminates the message and records why. The message is
acked only after the entry is in the index.

Events the cache announces (``couler.cache.committed`` / ``couler.cache.evicted``) come
from its outbox (:mod:`couler_cache.service`) through :class:`OutboxPublisher`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from couler.errors import UserError
from couler.v1 import common_pb2, events_pb2
from couler_cache.service import COMMITTED, EVICTED, Cache
from couler_runtime import telemetry
from couler_runtime.bus import Bus, Event, Subscription
from couler_runtime.rpc.records import CacheEntry, StoredArtifact

__all__ = ["DURABLE", "MAX_DELIVER", "SUCCEEDED", "OutboxPublisher", "StepSucceededHandler",
           "run_seconds", "start_consumer"]

log = logging.getLogger(__name__)

SUCCEEDED = "couler.step.succeeded"
DURABLE = "cache"
MAX_DELIVER = 10

_TYPES: dict[str, type[Message]] = {
    COMMITTED: events_pb2.CacheCommitted,
    EVICTED: events_pb2.CacheEvicted,
}


class OutboxPublisher:
    """Publishes the cache's queued events on the bus (``Publish`` of the service)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    async def __call__(self, subject: str, msg_id: str, payload: bytes) -> None:
        message_type = _TYPES.get(subject)
        if message_type is None:
            raise UserError(f"cache outbox: no message type for subject {subject!r}")
        message = message_type()
        message.ParseFromString(payload)
        await self._bus.publish(subject, message, msg_id=msg_id)


class StepSucceededHandler:
    """Commits succeeded steps (see the module docstring): called with the messages of one
    fetch, in order; most have no cache key and cost nothing."""

    def __init__(self, cache: Cache) -> None:
        self._cache = cache
        self._tracer = trace.get_tracer(__name__)

    async def __call__(self, events: Sequence[Event[events_pb2.StepEvent]]) -> None:
        for event in events:
            await self._one(event)

    async def _one(self, event: Event[events_pb2.StepEvent]) -> None:
        msg = event.message
        step = msg.step
        if step.state != common_pb2.STEP_STATE_SUCCEEDED or not step.cache_key:
            log.debug("run %s step %s: nothing to cache (state %s, key %r)", msg.run_id,
                      step.name, common_pb2.StepState.Name(step.state), step.cache_key)
            return
        with self._tracer.start_as_current_span(
            f"{SUCCEEDED} process", context=telemetry.extract(event.headers),
            kind=SpanKind.CONSUMER,
            attributes={"messaging.system": "nats", "messaging.destination.name": event.subject,
                        "couler.run_id": msg.run_id, "couler.step": step.name},
        ):
            entry = CacheEntry(
                key=step.cache_key, workflow=msg.workflow, step=step.name,
                outputs=dict(step.outputs),
                artifacts={name: StoredArtifact(a.digest, a.size_bytes, a.uri)
                           for name, a in step.artifacts.items()},
                cost_seconds=run_seconds(step), lineage=tuple(step.cache_lineage))
            try:
                result = await self._cache.commit(entry)
            except UserError as exc:
                raise UserError(f"run {msg.run_id}: {exc}") from exc
            log.info("run %s step %s: cache key %s %s", msg.run_id, step.name, step.cache_key,
                     "committed" if result.created else
                     ("refused (over the budget)" if step.cache_key in result.evicted
                      else "already cached"))


def run_seconds(step: common_pb2.StepRecord) -> float:
    """Seconds from the step's start to its end; 0 when either is unknown (or out of order)."""
    if not (step.HasField("started_at") and step.HasField("finished_at")):
        return 0.0
    seconds = (step.finished_at.ToNanoseconds() - step.started_at.ToNanoseconds()) / 1e9
    return max(seconds, 0.0)


async def start_consumer(bus: Bus, cache: Cache, *, max_deliver: int = MAX_DELIVER
                         ) -> Subscription[events_pb2.StepEvent]:
    """Start the durable consumer of ``couler.step.succeeded``; ``bus.close()`` stops it."""
    return await bus.subscribe(SUCCEEDED, DURABLE, events_pb2.StepEvent,
                               batch_handler=StepSucceededHandler(cache),
                               max_deliver=max_deliver, batch=100, linger=0.02)
