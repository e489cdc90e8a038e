"""One planning stage of a run (the generator, the optimizer): answer an event or reject.

A stage consumes an event about run ``run_id``, does its work, and publishes either its
answer (``couler.workflow.<what>``, msg id ``<run_id>.<what>``) or a
``couler.workflow.rejected`` (msg id ``<run_id>.rejected``) naming why, so the submitter
can fail the run. A UserError (bad input) rejects at once; any other error is left to the
bus (nak with back-off) until the consumer's last delivery, which rejects instead of
failing again — otherwise the run would wait in planning forever. The same holds when the
answer itself cannot be published (a UserError from the bus rejects at once; a retryable
failure rejects at the last delivery). The work runs inside a consumer span continuing the
event's trace; the answer carries the trace on. Every message carries the run id
(``couler-run-id``), so a dead letter of it can fail the run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from couler.errors import UserError, ValidationError
from couler.v1 import common_pb2, events_pb2
from couler_runtime import telemetry
from couler_runtime.bus import HEADER_TENANT, Bus, Event

__all__ = ["REJECTED", "PlanningStage"]

log = logging.getLogger(__name__)

REJECTED = "couler.workflow.rejected"

M = TypeVar("M", bound=Message)

# The work of a stage: the subject and body of its answer, and a line for the log.
Work = Callable[[], Awaitable[tuple[str, Message, str]]]


class PlanningStage:
    """Answers events for one stage (``name``: "generator", "optimizer")."""

    def __init__(self, bus: Bus, name: str, *, max_deliver: int) -> None:
        self._bus = bus
        self.name = name
        self._max_deliver = max_deliver
        self._tracer = trace.get_tracer(__name__)

    async def answer(self, event: Event[M], run_id: str, work: Work, *,
                     suffix: str = "") -> None:
        """Run ``work`` for ``run_id`` and publish its answer, or a rejection; ``suffix``
        ends both msg ids (a second answer for the same run, e.g. ``.r<revision>``)."""
        with self._tracer.start_as_current_span(
            f"{event.subject} process", context=telemetry.extract(event.headers),
            kind=SpanKind.CONSUMER,
            attributes={"messaging.system": "nats", "messaging.destination.name": event.subject,
                        "couler.run_id": run_id, "couler.stage": self.name},
        ):
            headers = telemetry.inject({})
            tenant = event.headers.get(HEADER_TENANT)
            try:
                subject, message, done = await work()
                what = subject.rsplit(".", 1)[-1]
                await self._bus.publish(subject, message, msg_id=f"{run_id}.{what}{suffix}",
                                        headers=headers, tenant=tenant, run_id=run_id)
            except UserError as exc:
                await self._reject(run_id, exc, str(exc), headers, tenant, suffix=suffix)
                return
            except Exception as exc:
                if event.delivery_count < self._max_deliver:
                    raise  # the bus naks with back-off (and logs it)
                log.error("run %s: %s gives up after %d deliveries: %s", run_id, self.name,
                          event.delivery_count, exc, exc_info=True)
                await self._reject(run_id, exc, f"gave up after {event.delivery_count} "
                                   f"attempts: {exc}", headers, tenant, suffix=suffix)
                return
            log.info("run %s: %s", run_id, done)

    async def _reject(self, run_id: str, exc: Exception, reason: str, headers: dict[str, str],
                      tenant: str | None, *, suffix: str = "") -> None:
        issues = exc.issues if isinstance(exc, ValidationError) else ()
        rejected = events_pb2.WorkflowRejected(
            run_id=run_id, stage=self.name, reason=reason,
            issues=[common_pb2.Issue(workflow=i.workflow, step=i.step, field=i.field,
                                     message=i.message) for i in issues])
        await self._bus.publish(REJECTED, rejected, msg_id=f"{run_id}.rejected{suffix}",
                                headers=headers, tenant=tenant, run_id=run_id)
        log.info("run %s: rejected by the %s: %s", run_id, self.name, reason)
