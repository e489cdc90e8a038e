"""The optimizer's NATS side: workflows in, plans (or refusals) out; feedback kept.

Three durable consumers:

* ``optimizer-requested`` on ``couler.workflow.requested`` and ``optimizer-generated`` on
  ``couler.workflow.generated``: the run's workflow is planned for ``options.engine``
  ("" = local) with ``options.no_cache`` and ``options.parameters``, and a
  ``WorkflowOptimized`` is published on ``couler.workflow.optimized`` (Nats-Msg-Id
  ``<run_id>.optimized``) with the options and tenant carried through and the
  ``traceparent`` continued; then the message is acked.

  - a request carrying ``text`` is the generator's: acked, nothing published;
  - a workflow that cannot be planned (a UserError: invalid, a feature the engine cannot
    express, a split that cannot fit, an unknown engine) is answered with a
    ``WorkflowRejected`` on ``couler.workflow.rejected`` (stage ``optimizer``, the reason
    naming workflow, step and field, and the validation issues) and acked;
  - a RetryableError (store or NATS unavailable) propagates, so the bus naks with
    back-off; at the last allowed delivery the run is rejected instead, so that it never
    waits forever;
  - a message without a run id cannot be answered: a UserError, so the bus terminates it.

  Redelivery is harmless: the plan for a run is recorded once and a redelivery answers
  with the recorded plan (the cache is not asked again, nothing is recorded twice), and
  the answer's deterministic Nats-Msg-Id makes a second publish a no-op.

* ``optimizer-feedback`` on ``couler.feedback.>``: one ``Recommendation`` per message,
  kept as the latest for its (workflow, step, kind); every later plan of that workflow
  applies it. An undecodable one or one without a kind is terminated (a UserError).
"""

from __future__ import annotations

import logging
from typing import TypeVar

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from couler.errors import UserError, ValidationError
from couler.v1 import common_pb2, events_pb2
from couler_optimizer.service import Optimizer
from couler_runtime import codec, telemetry
from couler_runtime.bus import HEADER_TENANT, Bus, Event
from couler_runtime.engines import DEFAULT_ENGINE
from couler_runtime.rpc.records import (
    objectives_from_proto,
    plan_to_proto,
    recommendation_from_proto,
)

__all__ = [
    "FEEDBACK",
    "FEEDBACK_DURABLE",
    "GENERATED",
    "GENERATED_DURABLE",
    "MAX_DELIVER",
    "OPTIMIZED",
    "REJECTED",
    "REQUESTED",
    "REQUESTED_DURABLE",
    "STAGE",
    "FeedbackHandler",
    "PlanHandler",
    "start_consumers",
]

log = logging.getLogger(__name__)

REQUESTED = "couler.workflow.requested"
GENERATED = "couler.workflow.generated"
OPTIMIZED = "couler.workflow.optimized"
REJECTED = "couler.workflow.rejected"
FEEDBACK = "couler.feedback.>"
REQUESTED_DURABLE = "optimizer-requested"
GENERATED_DURABLE = "optimizer-generated"
FEEDBACK_DURABLE = "optimizer-feedback"
STAGE = "optimizer"
MAX_DELIVER = 5


P = TypeVar("P", events_pb2.WorkflowRequested, events_pb2.WorkflowGenerated)


class PlanHandler:
    """Handles one ``WorkflowRequested`` or ``WorkflowGenerated`` (see the module docstring).

    Args:
        bus: Where answers are published.
        optimizer: The use case.
        max_deliver: The consumer's delivery limit; the last delivery rejects instead of
            failing again.
    """

    def __init__(self, bus: Bus, optimizer: Optimizer, *, max_deliver: int = MAX_DELIVER) -> None:
        self._bus = bus
        self._optimizer = optimizer
        self._max_deliver = max_deliver
        self._tracer = trace.get_tracer(__name__)

    async def __call__(self, event: Event[P]) -> None:
        message = event.message
        if isinstance(message, events_pb2.WorkflowRequested):
            source = message.WhichOneof("source")
            if source != "workflow":
                log.debug("run %s: a %s request is not the optimizer's", message.run_id,
                          source)
                return
        elif not message.HasField("workflow"):
            raise UserError(f"{event.subject} seq {event.stream_sequence}: run "
                            f"{message.run_id!r}: field 'workflow' is not set")
        run_id = message.run_id
        if not run_id:
            raise UserError(f"{event.subject} seq {event.stream_sequence}: a workflow "
                            "without a run_id cannot be answered")
        with self._tracer.start_as_current_span(
            f"{event.subject} process", context=telemetry.extract(event.headers),
            kind=SpanKind.CONSUMER,
            attributes={"messaging.system": "nats", "messaging.destination.name": event.subject,
                        "couler.run_id": run_id},
        ):
            headers = telemetry.inject({})
            tenant = event.headers.get(HEADER_TENANT)
            options = message.options
            try:
                wf = codec.workflow_from_proto(message.workflow)
                plan = await self._optimizer.plan_run(
                    run_id, wf, options.engine or DEFAULT_ENGINE,
                    objectives=objectives_from_proto(options.objectives),
                    no_cache=options.no_cache, parameters=dict(options.parameters))
            except UserError as exc:
                await self._reject(run_id, exc, str(exc), headers, tenant)
                return
            except Exception as exc:
                if event.delivery_count < self._max_deliver:
                    raise  # the bus naks with back-off (and logs it)
                log.error("run %s: giving up after %d deliveries: %s", run_id,
                          event.delivery_count, exc, exc_info=True)
                await self._reject(run_id, exc, f"gave up after {event.delivery_count} "
                                   f"attempts: {exc}", headers, tenant)
                return
            optimized = events_pb2.WorkflowOptimized(run_id=run_id, plan=plan_to_proto(plan),
                                                     options=options)
            await self._bus.publish(OPTIMIZED, optimized, msg_id=f"{run_id}.optimized",
                                    headers=headers, tenant=tenant)
            log.info("run %s: planned %r for %s (%d cached, %d chunks)", run_id,
                     plan.workflow.name, plan.engine, len(plan.cached), len(plan.chunks))

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


class FeedbackHandler:
    """Keeps one ``Recommendation`` from ``couler.feedback.<workflow>``."""

    def __init__(self, optimizer: Optimizer) -> None:
        self._optimizer = optimizer

    async def __call__(self, event: Event[common_pb2.Recommendation]) -> None:
        message = event.message
        if not message.workflow:
            # The subject names the workflow when the body does not.
            message.workflow = event.subject.removeprefix("couler.feedback.")
        rec = recommendation_from_proto(message)  # UserError without a kind: terminated
        kept = await self._optimizer.record_recommendation(rec)
        log.info("recommendation for %r step %r: %s = %s%s", rec.workflow, rec.step,
                 rec.kind.value, rec.value, "" if kept else " (older than the one kept)")


async def start_consumers(bus: Bus, optimizer: Optimizer, *,
                          max_deliver: int = MAX_DELIVER) -> None:
    """Start the three durable consumers; ``bus.close()`` stops them."""
    plans = PlanHandler(bus, optimizer, max_deliver=max_deliver)
    await bus.subscribe(FEEDBACK, FEEDBACK_DURABLE, common_pb2.Recommendation,
                        FeedbackHandler(optimizer), max_deliver=max_deliver)
    await bus.subscribe(REQUESTED, REQUESTED_DURABLE, events_pb2.WorkflowRequested, plans,
                        max_deliver=max_deliver)
    await bus.subscribe(GENERATED, GENERATED_DURABLE, events_pb2.WorkflowGenerated, plans,
                        max_deliver=max_deliver)
