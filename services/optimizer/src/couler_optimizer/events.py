"""The optimizer's NATS side: workflows in, plans (or refusals) out; feedback kept.

Four durable consumers:

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

* ``optimizer-refused`` on ``couler.workflow.refused``: an engine refused a run's document
  for its size. The refusal lowers that engine's learned budget (every later plan for it
  splits below 0.8 x the smallest refused size); when the message carries the run's
  request (the submitter put the run back to PLANNING), the run is planned again with the
  new budget and answered like a first plan, with msg ids suffixed ``.r<revision>``
  (``couler.workflow.optimized``, or ``couler.workflow.rejected`` when it cannot be split
  small enough). A refusal without an engine or a positive size is terminated.

* ``optimizer-feedback`` on ``couler.feedback.>``: one ``Recommendation`` per message,
  kept as the latest for its (workflow, step, kind); every later plan of that workflow
  applies it. An undecodable one, one without a kind, or one whose value is outside what
  any step could sensibly be given (:func:`check_recommendation`: a memory below 4 MiB,
  a CPU below a millicore, more than 20 retries, ...) is terminated (a UserError): the
  bus already admits only the monitor's signature, and a bad value must not reach every
  later plan of the workflow.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from couler import ir
from couler.errors import UserError
from couler.v1 import common_pb2, events_pb2
from couler_optimizer.service import Optimizer
from couler_runtime import codec, offload
from couler_runtime.bus import Bus, Event
from couler_runtime.engines import DEFAULT_ENGINE
from couler_runtime.rpc.records import (
    Recommendation,
    RecommendationKind,
    objectives_from_proto,
    recommendation_from_proto,
)
from couler_runtime.stage import REJECTED, PlanningStage

__all__ = [
    "FEEDBACK",
    "FEEDBACK_DURABLE",
    "GENERATED",
    "GENERATED_DURABLE",
    "MAX_DELIVER",
    "OPTIMIZED",
    "REFUSED",
    "REFUSED_DURABLE",
    "REJECTED",
    "REQUESTED",
    "REQUESTED_DURABLE",
    "STAGE",
    "FeedbackHandler",
    "PlanHandler",
    "RefusedHandler",
    "check_recommendation",
    "start_consumers",
]

log = logging.getLogger(__name__)

REQUESTED = "couler.workflow.requested"
GENERATED = "couler.workflow.generated"
OPTIMIZED = "couler.workflow.optimized"
FEEDBACK = "couler.feedback.>"
REFUSED = "couler.workflow.refused"
REQUESTED_DURABLE = "optimizer-requested"
REFUSED_DURABLE = "optimizer-refused"
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
        self._optimizer = optimizer
        self._stage = PlanningStage(bus, STAGE, max_deliver=max_deliver)

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
        options = message.options

        async def work() -> tuple[str, events_pb2.WorkflowOptimized, str]:
            steps = len(message.workflow.steps)
            wf = await offload.convert(steps, codec.workflow_from_proto, message.workflow)
            # encoded once: the same message is recorded and sent
            plan = await self._optimizer.plan_event(
                run_id, wf, options.engine or DEFAULT_ENGINE,
                objectives=objectives_from_proto(options.objectives),
                no_cache=options.no_cache, parameters=dict(options.parameters))
            optimized = events_pb2.WorkflowOptimized(run_id=run_id, plan=plan, options=options)
            return (OPTIMIZED, optimized, f"planned {plan.workflow.name!r} for {plan.engine} "
                    f"({len(plan.cached)} cached, {len(plan.chunks)} chunks)")

        await self._stage.answer(event, run_id, work)


class RefusedHandler:
    """Handles one ``DocumentRefused`` (see the module docstring)."""

    def __init__(self, bus: Bus, optimizer: Optimizer, *, max_deliver: int = MAX_DELIVER) -> None:
        self._optimizer = optimizer
        self._stage = PlanningStage(bus, STAGE, max_deliver=max_deliver)

    async def __call__(self, event: Event[events_pb2.DocumentRefused]) -> None:
        message = event.message
        if message.size_bytes <= 0 or not message.engine:
            raise UserError(f"{event.subject} seq {event.stream_sequence}: run "
                            f"{message.run_id!r}: a refusal needs an engine and a positive "
                            "size_bytes")
        at = message.at.ToNanoseconds() / 1e9 if message.HasField("at") else None
        kept = await self._optimizer.record_refusal(
            message.engine, message.size_bytes, reason=message.reason, run_id=message.run_id,
            workflow=message.workflow, at=at)
        log.info("engine %r refused a %d-byte document of run %s: its budget is now %d bytes",
                 message.engine, message.size_bytes, message.run_id, kept.max_bytes)
        request = message.request
        if not message.HasField("request") or not message.run_id:
            return
        if not request.HasField("workflow"):
            raise UserError(f"{event.subject} seq {event.stream_sequence}: run "
                            f"{message.run_id!r}: the request to plan again has no workflow")
        run_id = message.run_id
        options = request.options

        async def work() -> tuple[str, events_pb2.WorkflowOptimized, str]:
            wf = await offload.convert(len(request.workflow.steps), codec.workflow_from_proto,
                                       request.workflow)
            plan = await self._optimizer.replan_event(
                run_id, wf, options.engine or DEFAULT_ENGINE,
                objectives=objectives_from_proto(options.objectives),
                no_cache=options.no_cache, parameters=dict(options.parameters))
            optimized = events_pb2.WorkflowOptimized(run_id=run_id, plan=plan, options=options)
            return (OPTIMIZED, optimized, f"planned {plan.workflow.name!r} again for "
                    f"{plan.engine} after a size refusal ({len(plan.chunks)} chunks)")

        await self._stage.answer(event, run_id, work, suffix=f".r{message.revision}")


# What a recommendation may say at all: far outside any real step's needs means a bug or
# an attack (a memory limit of 1Ki OOM-kills every later run).
_MIN_MEMORY = 4 * 1024**2
_MAX_MEMORY = 64 * 1024**4
_MIN_CPU = 0.001
_MAX_CPU = 1024.0
_MAX_RETRIES = 20
_MAX_TIMEOUT = 30 * 24 * 3600
_MAX_RETRY_BACKOFF = 3600


def check_recommendation(rec: Recommendation) -> None:
    """Refuse a recommendation whose value no step could sensibly be given.

    Raises:
        UserError: Naming the workflow, step, kind and the bounds.
    """
    where = f"recommendation for workflow {rec.workflow!r}, step {rec.step!r}: {rec.kind.value}"
    kind = rec.kind
    try:
        if kind in (RecommendationKind.MEMORY_REQUEST, RecommendationKind.MEMORY_LIMIT):
            value = float(ir.parse_quantity(rec.value))
            if not _MIN_MEMORY <= value <= _MAX_MEMORY:
                raise UserError(f"{where} = {rec.value!r} is outside 4Mi..64Ti; refused")
        elif kind is RecommendationKind.CPU_REQUEST:
            value = float(ir.parse_quantity(rec.value))
            if not _MIN_CPU <= value <= _MAX_CPU:
                raise UserError(f"{where} = {rec.value!r} is outside 1m..1024; refused")
        elif kind is RecommendationKind.RETRY:
            if not 0 <= int(rec.value) <= _MAX_RETRIES:
                raise UserError(f"{where} = {rec.value!r} is outside 0..{_MAX_RETRIES}; "
                                "refused")
        elif (kind is RecommendationKind.RETRY_BACKOFF
              and not 0 <= int(rec.value) <= _MAX_RETRY_BACKOFF):
            raise UserError(f"{where} = {rec.value!r} seconds is outside "
                            f"0..{_MAX_RETRY_BACKOFF}; refused")
        elif kind is RecommendationKind.TIMEOUT and not 1 <= int(rec.value) <= _MAX_TIMEOUT:
            raise UserError(f"{where} = {rec.value!r} seconds is outside 1..{_MAX_TIMEOUT}; "
                            "refused")
    except ValueError:
        raise UserError(f"{where} = {rec.value!r} is not a valid value; refused") from None


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
        check_recommendation(rec)
        kept = await self._optimizer.record_recommendation(rec)
        log.info("recommendation for %r step %r: %s = %s%s", rec.workflow, rec.step,
                 rec.kind.value, rec.value, "" if kept else " (older than the one kept)")


async def start_consumers(bus: Bus, optimizer: Optimizer, *,
                          max_deliver: int = MAX_DELIVER) -> None:
    """Start the four durable consumers; ``bus.close()`` stops them."""
    plans = PlanHandler(bus, optimizer, max_deliver=max_deliver)
    await bus.subscribe(REFUSED, REFUSED_DURABLE, events_pb2.DocumentRefused,
                        RefusedHandler(bus, optimizer, max_deliver=max_deliver),
                        max_deliver=max_deliver)
    await bus.subscribe(FEEDBACK, FEEDBACK_DURABLE, common_pb2.Recommendation,
                        FeedbackHandler(optimizer), max_deliver=max_deliver)
    await bus.subscribe(REQUESTED, REQUESTED_DURABLE, events_pb2.WorkflowRequested, plans,
                        max_deliver=max_deliver)
    await bus.subscribe(GENERATED, GENERATED_DURABLE, events_pb2.WorkflowGenerated, plans,
                        max_deliver=max_deliver)
