"""The monitor's NATS side: step events, samples and run events in; recommendations out.

Durable consumers (each acks after the effect is committed; redelivery is harmless because
:class:`~couler_monitor.service.Monitor` records idempotently; the messages of one fetch
commit in one transaction):

* ``monitor-steps`` on ``couler.step.>`` (``StepEvent``);
* ``monitor-metrics-batch`` on ``couler.metrics.batch`` (``UtilizationBatch``: the time
  series of running steps, what submitters publish);
* ``monitor-metrics`` on ``couler.metrics.utilization`` (one ``UtilizationSample`` per
  message: what submitters before the time series published; still stored);
* ``monitor-workflows-<event>`` on ``couler.workflow.<event>``, one per message type, because
  a consumer decodes one type (the bus terminates a body whose ``couler-event-type`` header
  names another): requested, generated, optimized, submitted, finished, rejected. An
  optimized plan also tells the resources its steps are planned with
  (:func:`planned_requests`): the current requests ``couler recommend`` shows.

A message missing what identifies it (no run id, no step name) is a UserError: the bus
terminates it and logs why; the service carries on. Recommendations are published on
``couler.feedback.<workflow>`` with Nats-Msg-Id = the recommendation's deterministic id.
"""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from couler import ir
from couler.errors import UserError
from couler.v1 import common_pb2, events_pb2, workflow_pb2
from couler_monitor.service import Monitor
from couler_runtime import telemetry
from couler_runtime.bus import HEADER_TIME, HEADER_TRACEPARENT, Bus, Event, Subscription
from couler_runtime.rpc.records import (
    Recommendation,
    recommendation_to_proto,
    run_from_proto,
    step_record_from_proto,
    utilization_batch_from_proto,
    utilization_sample_from_proto,
)

__all__ = [
    "FEEDBACK",
    "METRICS",
    "METRICS_BATCH",
    "METRICS_BATCH_DURABLE",
    "METRICS_DURABLE",
    "STEPS",
    "STEPS_DURABLE",
    "WORKFLOW_DURABLE_PREFIX",
    "feedback_subject",
    "make_publisher",
    "planned_requests",
    "start_consumers",
]

log = logging.getLogger(__name__)

STEPS = "couler.step.>"
METRICS = "couler.metrics.utilization"
METRICS_BATCH = "couler.metrics.batch"
FEEDBACK = "couler.feedback"
STEPS_DURABLE = "monitor-steps"
METRICS_DURABLE = "monitor-metrics"
METRICS_BATCH_DURABLE = "monitor-metrics-batch"
WORKFLOW_DURABLE_PREFIX = "monitor-workflows"

# Nobody waits on the monitor's records: its consumers take up to 100 messages at once,
# lingering 20 ms for more, so that a busy stack costs one transaction per batch.
BATCHING: dict[str, Any] = {"batch": 100, "linger": 0.02}
_SUBJECT_TOKEN = re.compile(r"[^A-Za-z0-9_-]")
M = TypeVar("M", bound=Message)
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


def _span(events: Sequence[Event[Any]], **attributes: str) -> Any:
    """The consumer span of processing ``events``: a child of the one event's trace; for a
    batch, a span linked to each event's trace (OpenTelemetry's batch processing), and a
    child of the first event's span when every event is of one trace (one run's events:
    the run stays one trace)."""
    first = events[0]
    attrs = {"messaging.system": "nats", "messaging.destination.name": first.subject,
             **attributes}
    if len(events) == 1:
        return _tracer.start_as_current_span(
            f"{first.subject} process", context=telemetry.extract(first.headers),
            kind=SpanKind.CONSUMER, attributes=attrs)
    links = []
    for event in events:
        if HEADER_TRACEPARENT in event.headers:
            linked = trace.get_current_span(telemetry.extract(event.headers)).get_span_context()
            if linked.is_valid:
                links.append(trace.Link(linked))
    attrs["messaging.batch.message_count"] = str(len(events))
    one_trace = len(links) == len(events) and len({
        link.context.trace_id for link in links}) == 1
    parent = telemetry.extract(first.headers) if one_trace else None
    return _tracer.start_as_current_span(f"{first.subject} process", context=parent,
                                         kind=SpanKind.CONSUMER, attributes=attrs, links=links)


async def start_consumers(bus: Bus, monitor: Monitor) -> list[Subscription[Any]]:
    """Start every consumer of the monitor; ``bus.close()`` stops them.

    Each takes the messages of a fetch as a batch: their changes commit in one transaction
    (:meth:`Monitor.apply`); a batch that fails is handled again one message at a time.
    """

    async def on_steps(events: Sequence[Event[events_pb2.StepEvent]]) -> None:
        changes = [monitor.step_change(e.message.run_id, e.message.workflow, e.message.engine,
                                       step_record_from_proto(e.message.step),
                                       _at(e, e.message)) for e in events]
        with _span(events, **_run_attribute(events, lambda m: m.run_id)):
            await monitor.apply(changes)

    async def on_samples(events: Sequence[Event[common_pb2.UtilizationSample]]) -> None:
        changes = [monitor.sample_change(utilization_sample_from_proto(e.message))
                   for e in events]
        with _span(events, **_run_attribute(events, lambda m: m.run_id)):
            await monitor.apply(changes)

    async def on_batches(events: Sequence[Event[events_pb2.UtilizationBatch]]) -> None:
        changes = []
        for e in events:
            if not e.message.run_id:
                raise UserError(f"{e.subject} seq {e.stream_sequence}: a utilization batch "
                                "needs a run_id (field 'run_id' is empty)")
            for sample in utilization_batch_from_proto(e.message):
                try:
                    changes.append(monitor.sample_change(sample))
                except UserError as exc:  # one bad sample: the others of the batch count
                    log.warning("%s seq %d: a sample left out: %s", e.subject,
                                e.stream_sequence, exc)
        if changes:
            with _span(events, **_run_attribute(events, lambda m: m.run_id)):
                await monitor.apply(changes)

    async def on_requested(events: Sequence[Event[events_pb2.WorkflowRequested]]) -> None:
        changes = []
        for e in events:
            m = e.message
            workflow = m.workflow.name if m.WhichOneof("source") == "workflow" else ""
            changes.append(monitor.requested_change(m.run_id, workflow=workflow,
                                                    engine=m.options.engine, at=_at(e)))
        await monitor.apply(changes)

    async def on_generated(events: Sequence[Event[events_pb2.WorkflowGenerated]]) -> None:
        await monitor.apply([monitor.planned_change(e.message.run_id,
                                                    workflow=e.message.workflow.name,
                                                    engine=e.message.options.engine)
                             for e in events])

    async def on_optimized(events: Sequence[Event[events_pb2.WorkflowOptimized]]) -> None:
        await monitor.apply([monitor.planned_change(
            e.message.run_id, workflow=e.message.plan.workflow.name,
            engine=e.message.plan.engine or e.message.options.engine,
            requests=planned_requests(e.message.plan.workflow), at=_at(e),
            plan=e.message.plan.workflow.SerializeToString()) for e in events])

    async def on_submitted(events: Sequence[Event[events_pb2.WorkflowSubmitted]]) -> None:
        changes = [monitor.submitted_change(e.message.run_id, workflow=e.message.workflow,
                                            engine=e.message.engine, at=_at(e, e.message))
                   for e in events]
        with _span(events, **_run_attribute(events, lambda m: m.run_id)):
            await monitor.apply(changes)

    async def on_finished(events: Sequence[Event[events_pb2.WorkflowFinished]]) -> None:
        changes = [monitor.finished_change(run_from_proto(e.message.run)) for e in events]
        with _span(events, **_run_attribute(events, lambda m: m.run.run_id)):
            await monitor.apply(changes)

    async def on_rejected(events: Sequence[Event[events_pb2.WorkflowRejected]]) -> None:
        await monitor.apply([monitor.rejected_change(e.message.run_id, stage=e.message.stage,
                                                     reason=e.message.reason, at=_at(e))
                             for e in events])

    subs: list[Subscription[Any]] = [
        await bus.subscribe(STEPS, STEPS_DURABLE, events_pb2.StepEvent, batch_handler=on_steps,
                            **BATCHING),
        await bus.subscribe(METRICS, METRICS_DURABLE, common_pb2.UtilizationSample,
                            batch_handler=on_samples, **BATCHING),
        await bus.subscribe(METRICS_BATCH, METRICS_BATCH_DURABLE, events_pb2.UtilizationBatch,
                            batch_handler=on_batches, **BATCHING),
    ]
    workflow_events: list[tuple[str, type[Message],
                                Callable[[Sequence[Event[Any]]], Awaitable[None]]]] = [
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
                                        batch_handler=handler, **BATCHING))
    return subs


def _resources(m: workflow_pb2.Resources) -> ir.Resources:
    return ir.Resources(cpu_request=m.cpu_request, cpu_limit=m.cpu_limit,
                        memory_request=m.memory_request, memory_limit=m.memory_limit)


def planned_requests(workflow: workflow_pb2.Workflow) -> dict[str, ir.Resources]:
    """The resources a plan gives its top-level steps: ``""`` for the workflow's defaults,
    and each step that sets its own (the others get the defaults)."""
    out = {"": _resources(workflow.defaults.resources)}
    for step in workflow.steps:
        if step.HasField("resources"):
            out[step.name] = _resources(step.resources)
    return out


def _run_attribute(events: Sequence[Event[M]], run_id: Callable[[M], str]) -> dict[str, str]:
    """``couler.run_id`` for a span over events of one run (a batch may span several)."""
    runs = {run_id(e.message) for e in events}
    return {"couler.run_id": runs.pop()} if len(runs) == 1 else {}
