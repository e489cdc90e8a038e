"""The generator's NATS side: text requests in, generated (or rejected) workflows out.

One durable consumer (``generator``) reads ``couler.workflow.requested``:

* a request carrying ``text`` is planned, and a ``WorkflowGenerated`` is published on
  ``couler.workflow.generated`` (Nats-Msg-Id ``<run_id>.generated``) with the request's
  options and tenant carried through and its ``traceparent`` continued; then it is acked;
* a text that cannot be planned (a UserError: unplannable, invalid, unsupported by the
  engine) is answered with a ``WorkflowRejected`` on ``couler.workflow.rejected``
  (stage ``generator``, the reason and any validation issues) and acked: the request was
  handled, the submitter records the run as failed;
* a request carrying a workflow goes straight to the optimizer: acked, nothing published;
* a RetryableError (LLM endpoint or NATS unavailable) propagates, so the bus naks with
  back-off; at the last allowed delivery the run is rejected instead, so that it never
  waits forever;
* a request without a run id cannot be answered: a UserError, so the bus terminates it.

Redelivery is harmless: the answer's Nats-Msg-Id is deterministic, so a second publish
inside the duplicate window is dropped.
"""

from __future__ import annotations

import logging

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from couler.errors import UserError, ValidationError
from couler.v1 import common_pb2, events_pb2
from couler_generator.service import Generator
from couler_runtime import codec, telemetry
from couler_runtime.bus import HEADER_TENANT, Bus, Event, Subscription
from couler_runtime.rpc.records import generation_report_to_proto

__all__ = [
    "DURABLE",
    "GENERATED",
    "MAX_DELIVER",
    "REJECTED",
    "REQUESTED",
    "STAGE",
    "RequestHandler",
    "start_consumer",
]

log = logging.getLogger(__name__)

REQUESTED = "couler.workflow.requested"
GENERATED = "couler.workflow.generated"
REJECTED = "couler.workflow.rejected"
DURABLE = "generator"
STAGE = "generator"
MAX_DELIVER = 5


class RequestHandler:
    """Handles one ``WorkflowRequested`` (see the module docstring).

    Args:
        bus: Where answers are published.
        generator: The use case.
        max_deliver: The consumer's delivery limit; the last delivery rejects instead of
            failing again.
    """

    def __init__(self, bus: Bus, generator: Generator, *, max_deliver: int = MAX_DELIVER) -> None:
        self._bus = bus
        self._generator = generator
        self._max_deliver = max_deliver
        self._tracer = trace.get_tracer(__name__)

    async def __call__(self, event: Event[events_pb2.WorkflowRequested]) -> None:
        request = event.message
        source = request.WhichOneof("source")
        if source != "text":
            log.debug("run %s: no text to plan (source: %s): not the generator's",
                      request.run_id, source)
            return
        if not request.run_id:
            raise UserError(f"{event.subject} seq {event.stream_sequence}: a text request "
                            "without a run_id cannot be answered")
        with self._tracer.start_as_current_span(
            f"{REQUESTED} process", context=telemetry.extract(event.headers),
            kind=SpanKind.CONSUMER,
            attributes={"messaging.system": "nats", "messaging.destination.name": event.subject,
                        "couler.run_id": request.run_id},
        ):
            headers = telemetry.inject({})
            tenant = event.headers.get(HEADER_TENANT)
            options = request.options
            try:
                wf, report = await self._generator.generate(
                    request.text, constraints=tuple(options.constraints), engine=options.engine)
            except UserError as exc:
                await self._reject(request.run_id, exc, str(exc), headers, tenant)
                return
            except Exception as exc:
                if event.delivery_count < self._max_deliver:
                    raise  # the bus naks with back-off (and logs it)
                log.error("run %s: giving up after %d deliveries: %s", request.run_id,
                          event.delivery_count, exc, exc_info=True)
                await self._reject(request.run_id, exc, f"gave up after "
                                   f"{event.delivery_count} attempts: {exc}", headers, tenant)
                return
            generated = events_pb2.WorkflowGenerated(
                run_id=request.run_id, workflow=codec.workflow_to_proto(wf),
                report=generation_report_to_proto(report), options=options)
            await self._bus.publish(GENERATED, generated, msg_id=f"{request.run_id}.generated",
                                    headers=headers, tenant=tenant)
            log.info("run %s: generated workflow %r (%d steps, %s planner)", request.run_id,
                     wf.name, len(wf.steps), report.planner)

    async def _reject(self, run_id: str, exc: Exception, reason: str, headers: dict[str, str],
                      tenant: str | None) -> None:
        issues = exc.issues if isinstance(exc, ValidationError) else ()
        rejected = events_pb2.WorkflowRejected(
            run_id=run_id, stage=STAGE, reason=reason,
            issues=[common_pb2.Issue(workflow=i.workflow, step=i.step, field=i.field,
                                     message=i.message) for i in issues])
        await self._bus.publish(REJECTED, rejected, msg_id=f"{run_id}.rejected",
                                headers=headers, tenant=tenant)
        log.info("run %s: rejected: %s", run_id, reason)


async def start_consumer(
    bus: Bus, generator: Generator, *, max_deliver: int = MAX_DELIVER
) -> Subscription[events_pb2.WorkflowRequested]:
    """Start the durable consumer of ``couler.workflow.requested``; ``bus.close()`` stops it."""
    return await bus.subscribe(
        REQUESTED, DURABLE, events_pb2.WorkflowRequested,
        RequestHandler(bus, generator, max_deliver=max_deliver), max_deliver=max_deliver)
