"""The submitter's NATS side: what it publishes, and its durable consumers.

Published (bodies in ``events.proto``; ``Nats-Msg-Id`` as given there)::

    couler.workflow.requested   WorkflowRequested  <run_id>.requested
    couler.workflow.submitted   WorkflowSubmitted  <run_id>.submitted[.<retries>]
    couler.step.<state>         StepEvent          <run_id>.<step>.<key>.<attempts>.<state>[.rN]
    couler.metrics.batch        UtilizationBatch   <run_id>.metrics.<digest of the samples>
    couler.workflow.finished    WorkflowFinished   <run_id>.finished.<retries>
    couler.workflow.refused     DocumentRefused    <run_id>.refused.<revision>

A run whose document the engine refused for its size is put back to PLANNING (at most
``service.MAX_SIZE_REPLANS`` times) and its ``DocumentRefused`` carries the run's request:
the optimizer lowers the engine's budget and plans it again.

(``couler.metrics.utilization``, one ``UtilizationSample`` per message with msg id
``<run_id>.<step>.<key>.<attempt>.<time in ns>``, is what submitters before the time
series published; an outbox row of one left by such a submitter is still sent.) A batch's
digest is the sha256 of its samples' ``(step, key, attempt, time in ns)``: the same batch
republished after a crash keeps its id, and the monitor stores a sample once anyway.

A retried run (``retries`` = N > 0) suffixes its step and submitted keys with the retry count:
the local engine counts attempts afresh in a retry, so without it a step failing again
would repeat the first failure's key and be dropped as a duplicate.

Every message carries its run id (``couler-run-id``).

Consumed (ack after the effect is committed; a UserError terminates the message and the
reason is stored in ``submitter_rejections`` and the dead-letter stream)::

    couler.workflow.optimized  durable submitter-optimized   start the run (ignored if started)
    couler.workflow.rejected   durable submitter-rejected    the run FAILS with the reason
    couler.launch.>            durable submitter-launch      submit the template, one run per key
    couler.event.>             durable submitter-events      launch the workflows it triggers
    couler.deadletter.>        durable submitter-deadletter  fail the run of a dead letter

The bus accepts a plan or a rejection only when the optimizer's (or the generator's)
signature checks; the handler accepts a plan only for a run that is waiting for one
(ACCEPTED or PLANNING, see ``Submitter.optimized``) and only for the engine the run asked
for. A dead letter fails its run when it is authenticated, names the run, comes from a
consumer on the run's planning path (:data:`PLANNING_CONSUMERS`) and the run is still being
planned: the message that would have moved it on is gone, so it would wait forever. Dead
letters of observers (the monitor, the cache) are kept and logged, and fail nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from couler.errors import UserError
from couler.v1 import common_pb2, events_pb2
from couler_runtime import codec, offload, telemetry
from couler_runtime.bus import HEADER_TENANT, Bus, Event, Rejection
from couler_runtime.bus_access import EVENT_SUBJECTS, event_publisher
from couler_runtime.rpc.records import (
    Run,
    StepRecord,
    UtilizationSample,
    objectives_to_proto,
    plan_from_proto,
    run_to_proto,
    step_record_to_proto,
    utilization_batch_to_proto,
    utilization_sample_to_proto,
)
from couler_submitter.model import RunRequest
from couler_submitter.service import Submitter
from couler_submitter.store import RunStore

__all__ = [
    "DEADLETTER",
    "EVENTS",
    "FINISHED",
    "LAUNCH",
    "OPTIMIZED",
    "PLANNING_CONSUMERS",
    "REFUSED",
    "REJECTED",
    "REQUESTED",
    "SUBMITTED",
    "UTILIZATION",
    "UTILIZATION_BATCH",
    "BusEvents",
    "batch_msg_id",
    "start_consumers",
]

log = logging.getLogger(__name__)

REQUESTED = "couler.workflow.requested"
OPTIMIZED = "couler.workflow.optimized"
REJECTED = "couler.workflow.rejected"
SUBMITTED = "couler.workflow.submitted"
FINISHED = "couler.workflow.finished"
REFUSED = "couler.workflow.refused"
STEP = "couler.step"
UTILIZATION = "couler.metrics.utilization"
UTILIZATION_BATCH = "couler.metrics.batch"
LAUNCH = "couler.launch.>"
EVENTS = EVENT_SUBJECTS
DEADLETTER = "couler.deadletter.>"
DURABLE_OPTIMIZED = "submitter-optimized"
DURABLE_REJECTED = "submitter-rejected"
DURABLE_LAUNCH = "submitter-launch"
DURABLE_EVENTS = "submitter-events"
DURABLE_DEADLETTER = "submitter-deadletter"
# The consumers a run's planning goes through: a message they gave up on strands the run.
PLANNING_CONSUMERS = frozenset({"generator", "optimizer-requested", "optimizer-generated",
                                "optimizer-refused", DURABLE_OPTIMIZED, DURABLE_REJECTED})


def _now() -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return ts


def _changed_at(rec: StepRecord) -> Timestamp:
    """When the step changed (its end, else its start), not when the event is published:
    under load a late publish must not look newer than the run's end."""
    at = rec.finished_at if rec.finished_at is not None else rec.started_at
    if at is None:
        return _now()
    ts = Timestamp()
    ts.FromNanoseconds(round(at * 1e9))
    return ts


def batch_msg_id(run_id: str, samples: Sequence[UtilizationSample]) -> str:
    """The idempotency key of a ``couler.metrics.batch`` message (see the module docstring)."""
    h = hashlib.sha256()
    for s in samples:
        h.update(f"{s.step}\0{s.key}\0{s.attempt}\0{round((s.at or 0.0) * 1e9)}\n".encode())
    return f"{run_id}.metrics.{h.hexdigest()[:32]}"


def _suffix(run: Run, sep: str = ".r") -> str:
    return f"{sep}{run.retries}" if run.retries else ""


async def _request_message(run: Run, request: RunRequest) -> events_pb2.WorkflowRequested:
    """The ``WorkflowRequested`` of ``run`` (its workflow as submitted, else its text)."""
    o = request.options
    msg = events_pb2.WorkflowRequested(
        run_id=run.run_id, template=request.template,
        options=events_pb2.RunOptions(
            engine=o.engine, parameters=dict(o.parameters), dry_run=o.dry_run,
            no_cache=o.no_cache, constraints=list(o.constraints),
            objectives=objectives_to_proto(o.objectives), tenant=o.tenant))
    if request.encoded is not None:
        msg.workflow.MergeFromString(request.encoded)  # as submitted: no encoding again
    elif request.workflow is not None:
        msg.workflow.CopyFrom(await offload.convert(len(request.workflow.steps),
                                                    codec.workflow_to_proto, request.workflow))
    else:
        msg.text = request.text or ""
    return msg


class BusEvents:
    """Publishes the submitter's events on the bus (implements ``service.Events``)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    async def requested(self, run: Run, request: RunRequest) -> None:
        msg = await _request_message(run, request)
        o = request.options
        await self._bus.publish(REQUESTED, msg, msg_id=f"{run.run_id}.requested",
                                headers=telemetry.inject({}), tenant=o.tenant or None,
                                run_id=run.run_id)

    async def refused(self, run: Run, refusal: events_pb2.DocumentRefused,
                      request: RunRequest | None) -> None:
        if request is not None:  # planned again: the optimizer needs the workflow
            refusal.request.CopyFrom(await _request_message(run, request))
        tenant = request.options.tenant if request is not None else ""
        await self._bus.publish(REFUSED, refusal,
                                msg_id=f"{run.run_id}.refused.{refusal.revision}",
                                headers=telemetry.inject({}), tenant=tenant or None,
                                run_id=run.run_id)

    async def submitted(self, run: Run) -> None:
        msg = events_pb2.WorkflowSubmitted(
            run_id=run.run_id, workflow=run.workflow, engine=run.engine,
            engine_run_id=run.engine_run_id, at=_now())
        await self._bus.publish(SUBMITTED, msg,
                                msg_id=f"{run.run_id}.submitted{_suffix(run, '.')}",
                                headers=telemetry.inject({}), run_id=run.run_id)

    async def step(self, run: Run, rec: StepRecord) -> None:
        msg = events_pb2.StepEvent(run_id=run.run_id, workflow=run.workflow, engine=run.engine,
                                   step=step_record_to_proto(rec), at=_changed_at(rec))
        state = rec.state.value
        await self._bus.publish(
            f"{STEP}.{state}", msg,
            msg_id=f"{run.run_id}.{rec.name}.{rec.key}.{rec.attempts}.{state}{_suffix(run)}",
            headers=telemetry.inject({}), run_id=run.run_id)

    async def utilization(self, sample: UtilizationSample) -> None:
        at_ns = round((sample.at or 0.0) * 1e9)
        await self._bus.publish(
            UTILIZATION, utilization_sample_to_proto(sample),
            msg_id=f"{sample.run_id}.{sample.step}.{sample.key}.{sample.attempt}.{at_ns}",
            headers=telemetry.inject({}), run_id=sample.run_id)

    async def utilization_batch(self, run: Run, samples: Sequence[UtilizationSample]) -> None:
        if not samples:
            return
        await self._bus.publish(
            UTILIZATION_BATCH, utilization_batch_to_proto(run.run_id, samples),
            msg_id=batch_msg_id(run.run_id, samples), headers=telemetry.inject({}),
            run_id=run.run_id)

    async def finished(self, run: Run) -> None:
        await self._bus.publish(FINISHED, events_pb2.WorkflowFinished(run=run_to_proto(run)),
                                msg_id=f"{run.run_id}.finished.{run.retries}",
                                headers=telemetry.inject({}), run_id=run.run_id)


class _Handlers:
    def __init__(self, submitter: Submitter) -> None:
        self._submitter = submitter
        self._tracer = trace.get_tracer(__name__)

    async def optimized(self, event: Event[events_pb2.WorkflowOptimized]) -> None:
        msg = event.message
        if not msg.run_id or not msg.HasField("plan"):
            raise UserError(f"{event.subject} seq {event.stream_sequence}: a plan needs a "
                            "run_id and a plan")
        # InvalidWorkflowError (a UserError) when corrupt; a large plan decodes in a thread,
        # not on the loop every consumer and call shares (2.6 s at 100k steps)
        plan = await offload.convert(len(msg.plan.workflow.steps), plan_from_proto, msg.plan)
        # The run's events (published by tasks started here) continue the plan's trace.
        with self._tracer.start_as_current_span(
            f"{OPTIMIZED} process", context=telemetry.extract(event.headers),
            kind=SpanKind.CONSUMER,
            attributes={"messaging.system": "nats", "messaging.destination.name": event.subject,
                        "couler.run_id": msg.run_id},
        ):
            # NotFoundError: no such run; UserError: a plan for another engine
            await self._submitter.optimized(msg.run_id, plan,
                                            encoded=msg.plan.SerializeToString())

    async def rejected(self, event: Event[events_pb2.WorkflowRejected]) -> None:
        msg = event.message
        if not msg.run_id:
            raise UserError(f"{event.subject} seq {event.stream_sequence}: no run_id")
        issues = [_issue(i) for i in msg.issues]
        await self._submitter.rejected(msg.run_id, msg.stage, msg.reason, issues)

    async def launch(self, event: Event[events_pb2.LaunchRequest]) -> None:
        msg = event.message
        template = msg.template or event.subject.rsplit(".", 1)[-1]
        key = msg.idempotency_key or event.event_id or f"seq-{event.stream_sequence}"
        tenant = msg.tenant or event.headers.get(HEADER_TENANT, "")
        run_id, created = await self._submitter.launch(
            template, parameters=dict(msg.parameters), key=key, engine=msg.engine,
            tenant=tenant)
        log.info("launch of %r (key %r): run %s%s", template, key, run_id,
                 "" if created else " (already launched)")


    async def triggered(self, event: Event[events_pb2.LaunchRequest]) -> None:
        """``couler.event.<launcher>.<subject>``: launch what it triggers (see
        :mod:`couler_submitter.triggers`)."""
        try:
            launcher, subject = event_publisher(event.subject)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        msg = event.message
        key = msg.idempotency_key or event.event_id or f"seq-{event.stream_sequence}"
        tenant = msg.tenant or event.headers.get(HEADER_TENANT, "")
        await self._submitter.event(launcher, subject, dict(msg.parameters), key, tenant)

    async def deadletter(self, event: Event[events_pb2.DeadLetter]) -> None:
        letter = event.message
        log.error("dead letter from %s: %s seq %d (%d deliveries): %s", letter.durable,
                  letter.subject, letter.stream_sequence, letter.delivery_count, letter.reason)
        if not (letter.authenticated and letter.run_id
                and letter.durable in PLANNING_CONSUMERS):
            return
        await self._submitter.rejected(
            letter.run_id, "bus", f"{letter.subject} (seq {letter.stream_sequence}) could not "
            f"be processed by consumer {letter.durable!r}: {letter.reason}")


def _issue(i: common_pb2.Issue) -> str:
    where = f"workflow {i.workflow!r}" + (f", step {i.step!r}" if i.step else "")
    return where + (f", field {i.field!r}" if i.field else "") + f": {i.message}"


async def start_consumers(bus: Bus, submitter: Submitter, store: RunStore) -> None:
    """Start the five durable consumers; ``bus.close()`` stops them."""

    async def record(rejection: Rejection) -> None:
        await asyncio.to_thread(store.record_rejection, rejection.durable, rejection.subject,
                                rejection.stream_sequence, rejection.reason)

    handlers = _Handlers(submitter)
    await bus.subscribe(OPTIMIZED, DURABLE_OPTIMIZED, events_pb2.WorkflowOptimized,
                        handlers.optimized, on_reject=record)
    await bus.subscribe(REJECTED, DURABLE_REJECTED, events_pb2.WorkflowRejected,
                        handlers.rejected, on_reject=record)
    await bus.subscribe(LAUNCH, DURABLE_LAUNCH, events_pb2.LaunchRequest, handlers.launch,
                        on_reject=record)
    await bus.subscribe(EVENTS, DURABLE_EVENTS, events_pb2.LaunchRequest, handlers.triggered,
                        on_reject=record)
    await bus.subscribe(DEADLETTER, DURABLE_DEADLETTER, events_pb2.DeadLetter,
                        handlers.deadletter, on_reject=record)
