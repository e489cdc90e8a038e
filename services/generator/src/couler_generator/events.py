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

from couler.errors import UserError
from couler.v1 import events_pb2
from couler_generator.service import Generator
from couler_runtime import codec
from couler_runtime.bus import Bus, Event, Subscription
from couler_runtime.rpc.records import generation_report_to_proto
from couler_runtime.stage import REJECTED, PlanningStage

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
        self._generator = generator
        self._stage = PlanningStage(bus, STAGE, max_deliver=max_deliver)

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
        options = request.options

        async def work() -> tuple[str, events_pb2.WorkflowGenerated, str]:
            wf, report = await self._generator.generate(
                request.text, constraints=tuple(options.constraints), engine=options.engine)
            generated = events_pb2.WorkflowGenerated(
                run_id=request.run_id, workflow=codec.workflow_to_proto(wf),
                report=generation_report_to_proto(report), options=options)
            return (GENERATED, generated, f"generated workflow {wf.name!r} "
                    f"({len(wf.steps)} steps, {report.planner} planner)")

        await self._stage.answer(event, request.run_id, work)


async def start_consumer(
    bus: Bus, generator: Generator, *, max_deliver: int = MAX_DELIVER
) -> Subscription[events_pb2.WorkflowRequested]:
    """Start the durable consumer of ``couler.workflow.requested``; ``bus.close()`` stops it."""
    return await bus.subscribe(
        REQUESTED, DURABLE, events_pb2.WorkflowRequested,
        RequestHandler(bus, generator, max_deliver=max_deliver), max_deliver=max_deliver)
