"""The monitor's NATS side: step events, samples and run events in; recommendations out.

Durable consumers (each acks after the effect is committed; redelivery is harmless because
:class:`~couler_monitor.service.Monitor` records idempotently):

* ``monitor-steps`` on ``couler.step.>`` (``StepEvent``);
* ``monitor-metrics`` on ``couler.metrics.>`` (``UtilizationSample``);
* ``monitor-workflows-<event>`` on ``couler.workflow.<event>``, one per message type, because
  a consumer decodes one type (the bus terminates a body whose ``couler-event-type`` header
  names another): requested, generated, optimized, submitted, finished, rejected.

A message missing what identifies it (no run id, no step name) is a UserError: the bus
terminates it and logs why; the service carries on. Recommendations are published on
``couler.feedback.<workflow>`` with Nats-Msg-Id = the recommendation's deterministic id.
"""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from couler.v1 import common_pb2, events_pb2
from couler_monitor.service import Monitor
from couler_runtime import telemetry
from couler_runtime.bus import HEADER_TIME, Bus, Event, Subscription
from couler_runtime.rpc.records import (
    Recommendation,
    recommendation_to_proto,
    run_from_proto,
    step_record_from_proto,
    utilization_sample_from_proto,
)

__all__ = [
    "FEEDBACK",
    "METRICS",
    "METRICS_DURABLE",
    "STEPS",
    "STEPS_DURABLE",
    "WORKFLOW_DURABLE_PREFIX",
    "feedback_subject",
    "make_publisher",
    "start_consumers",
]

log = logging.getLogger(__name__)

STEPS = "couler.step.>"
METRICS = "couler.metrics.>"
FEEDBACK = "couler.feedback"
STEPS_DURABLE = "monitor-steps"
METRICS_DURABLE = "monitor-metrics"
WORKFLOW_DURABLE_PREFIX = "monitor-workflows"

_SUBJECT_TOKEN = re.compile(r"[^A-Za-z0-9_-]")
_tracer = trace.get_tracer(__name__)


def feedback_subject(workflow: str) -> str:
    """``couler.feedback.<workflow>``; characters a subject token cannot hold become ``_``."""
    return f"{FEEDBACK}.{_SUBJECT_TOKEN.sub('_', workflow) or '_'}"


def make_publisher(bus: Bus) -> Callable[[Recommendation], Awaitable[None]]:
    """The monitor's ``publish``: one Recommendation per message on the feedback subject."""
    async def publish(rec: Recommendation) -> None:
        await bus.publish(feedback_subject(rec.workflow), recommendation_to_proto(rec),
                          msg_id=rec.id, headers=telemetry.inject({}))
        log.info("recommended %s for workflow %r, step %r: %s (%s)", rec.kind.value,
                 rec.workflow, rec.step, rec.value, rec.reason)

    return publish


def _at(event: Event[Any], message: Message | None = None, field: str = "at") -> float | None:
    """The event's own timestamp, else the bus's ``couler-time`` header."""
    if message is not None and message.HasField(field):
        ts = getattr(message, field)
        return float(ts.seconds + ts.nanos / 1e9)
    raw = event.headers.get(HEADER_TIME)
    if raw:
        try:
            return datetime.datetime.fromisoformat(raw).timestamp()
        except ValueError:
            return None
    return None


def _span(event: Event[Any], **attributes: str) -> Any:
    return _tracer.start_as_current_span(
        f"{event.subject} process", context=telemetry.extract(event.headers),
        kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "nats", "messaging.destination.name": event.subject,
                    **attributes})


async def start_consumers(bus: Bus, monitor: Monitor) -> list[Subscription[Any]]:
    """Start every consumer of the monitor; ``bus.close()`` stops them."""

    async def on_step(event: Event[events_pb2.StepEvent]) -> None:
        m = event.message
        with _span(event, **{"couler.run_id": m.run_id}):
            record = step_record_from_proto(m.step)
            await monitor.record_step(m.run_id, m.workflow, m.engine, record, _at(event, m))

    async def on_sample(event: Event[common_pb2.UtilizationSample]) -> None:
        with _span(event, **{"couler.run_id": event.message.run_id}):
            await monitor.record_sample(utilization_sample_from_proto(event.message))

    async def on_requested(event: Event[events_pb2.WorkflowRequested]) -> None:
        m = event.message
        workflow = m.workflow.name if m.WhichOneof("source") == "workflow" else ""
        await monitor.record_requested(m.run_id, workflow=workflow,
                                       engine=m.options.engine, at=_at(event))

    async def on_generated(event: Event[events_pb2.WorkflowGenerated]) -> None:
        m = event.message
        await monitor.record_planned(m.run_id, workflow=m.workflow.name,
                                     engine=m.options.engine)

    async def on_optimized(event: Event[events_pb2.WorkflowOptimized]) -> None:
        m = event.message
        await monitor.record_planned(m.run_id, workflow=m.plan.workflow.name,
                                     engine=m.plan.engine or m.options.engine)

    async def on_submitted(event: Event[events_pb2.WorkflowSubmitted]) -> None:
        m = event.message
        with _span(event, **{"couler.run_id": m.run_id}):
            await monitor.record_submitted(m.run_id, workflow=m.workflow, engine=m.engine,
                                           at=_at(event, m))

    async def on_finished(event: Event[events_pb2.WorkflowFinished]) -> None:
        with _span(event, **{"couler.run_id": event.message.run.run_id}):
            await monitor.record_finished(run_from_proto(event.message.run))

    async def on_rejected(event: Event[events_pb2.WorkflowRejected]) -> None:
        m = event.message
        await monitor.record_rejected(m.run_id, stage=m.stage, reason=m.reason,
                                      at=_at(event))

    subs: list[Subscription[Any]] = [
        await bus.subscribe(STEPS, STEPS_DURABLE, events_pb2.StepEvent, on_step),
        await bus.subscribe(METRICS, METRICS_DURABLE, common_pb2.UtilizationSample, on_sample),
    ]
    workflow_events: list[tuple[str, type[Message], Callable[[Any], Awaitable[None]]]] = [
        ("requested", events_pb2.WorkflowRequested, on_requested),
        ("generated", events_pb2.WorkflowGenerated, on_generated),
        ("optimized", events_pb2.WorkflowOptimized, on_optimized),
        ("submitted", events_pb2.WorkflowSubmitted, on_submitted),
        ("finished", events_pb2.WorkflowFinished, on_finished),
        ("rejected", events_pb2.WorkflowRejected, on_rejected),
    ]
    for name, message_type, handler in workflow_events:
        subs.append(await bus.subscribe(f"couler.workflow.{name}",
                                        f"{WORKFLOW_DURABLE_PREFIX}-{name}", message_type,
                                        handler))
    return subs
