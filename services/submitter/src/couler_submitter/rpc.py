"""``couler.v1.SubmitterService`` over gRPC: protobuf in, :class:`Submitter` call, protobuf out.

Errors are mapped by the server's interceptor (:mod:`couler.errors` → status), except
:class:`~couler_submitter.service.NotRetryableError`, which the contract answers with
FAILED_PRECONDITION.

No answer depends on the size of a workflow: records carry one page of steps (Get, Cancel,
Retry), the changed steps (Watch) or counts (List); a template whose workflow encodes to
more than :data:`INLINE_WORKFLOW_BYTES` is answered with a reference to it in the blob
store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from couler.v1 import common_pb2
from couler.v1 import submitter_service_pb2 as pb
from couler_runtime import offload
from couler_runtime.rpc.records import (
    Template,
    blob_ref_from_proto,
    blob_ref_to_proto,
    objectives_from_proto,
    run_states_from_proto,
    run_to_proto,
    template_to_proto,
)
from couler_submitter.model import RunOptions
from couler_submitter.service import (
    NotRetryableError,
    ScheduleView,
    Submitter,
    workflow_from_message,
)

__all__ = ["INLINE_WORKFLOW_BYTES", "SubmitterService", "schedule_to_proto"]

Context = grpc.aio.ServicerContext[Any, Any]

#: A template's workflow larger than this (encoded) is answered by reference.
INLINE_WORKFLOW_BYTES = 256 * 1024


def schedule_to_proto(view: ScheduleView) -> pb.Schedule:
    """The ``couler.v1.Schedule`` of ``view``."""
    s, st = view.schedule, view.state
    return pb.Schedule(
        name=st.name, cron=s.schedule, timezone=s.timezone,
        concurrency_policy=s.concurrency_policy.value,
        starting_deadline_seconds=s.starting_deadline_seconds or 0, suspended=s.suspend,
        paused=st.paused, next_tick_at=view.next_tick or 0.0, last_tick_at=st.last_tick,
        last_outcome=st.last_outcome, last_run_id=st.last_run_id, last_reason=st.last_reason,
        engine=view.engine)


class SubmitterService:
    """The servicer (methods named like the RPCs, see ``couler_runtime.rpc.server``)."""

    def __init__(self, submitter: Submitter) -> None:
        self._submitter = submitter

    async def Submit(self, request: pb.SubmitRequest, context: Context  # noqa: N802
                     ) -> pb.SubmitResponse:
        """Record a run and start planning it."""
        source = request.WhichOneof("source")
        options = RunOptions(
            engine=request.engine, parameters=dict(request.parameters),
            dry_run=request.dry_run, no_cache=request.no_cache,
            constraints=tuple(request.constraints),
            objectives=objectives_from_proto(request.objectives), tenant=request.tenant)
        workflow = None
        encoded = None
        if source == "workflow":
            encoded = request.workflow.SerializeToString()
            workflow = await offload.run(len(encoded), workflow_from_message,
                                         request.workflow, "submit: field 'workflow'")
        run_id, created, schedule = await self._submitter.submit_request(
            workflow=workflow, encoded=encoded,
            workflow_ref=blob_ref_from_proto(request.workflow_ref)
            if source == "workflow_ref" else None,
            text=request.text if source == "text" else None,
            template=request.template if source == "template" else "",
            options=options, idempotency_key=request.idempotency_key)
        return pb.SubmitResponse(run_id=run_id, created=created, schedule=schedule)

    async def UploadWorkflow(self, requests: AsyncIterator[pb.UploadWorkflowRequest],  # noqa: N802
                             context: Context) -> common_pb2.BlobRef:
        """Store a workflow sent in chunks; its reference."""

        async def chunks() -> AsyncIterator[tuple[bytes, int, str]]:
            async for message in requests:
                yield message.data, message.size_bytes, message.digest

        return blob_ref_to_proto(await self._submitter.upload_workflow(chunks()))

    async def Get(self, request: pb.GetRunRequest, context: Context  # noqa: N802
                  ) -> common_pb2.Run:
        """The run's record with one page of its steps."""
        run = await self._submitter.get(request.run_id, page_size=request.step_page_size,
                                        page_token=request.step_page_token)
        return run_to_proto(run)

    async def Watch(self, request: pb.WatchRunRequest, context: Context  # noqa: N802
                    ) -> AsyncIterator[pb.WatchRunResponse]:
        """The record, then every change, until a terminal state."""
        async for run, more in self._submitter.watch(request.run_id,
                                                     page_size=request.step_page_size):
            yield pb.WatchRunResponse(run=run_to_proto(run), more=more)

    async def Cancel(self, request: pb.CancelRunRequest, context: Context  # noqa: N802
                     ) -> common_pb2.Run:
        """Stop the run."""
        await self._submitter.cancel(request.run_id, request.reason)
        return run_to_proto(await self._submitter.get(request.run_id))

    async def Retry(self, request: pb.RetryRunRequest, context: Context  # noqa: N802
                    ) -> common_pb2.Run:
        """Re-run a failed or cancelled run from its failure point."""
        try:
            await self._submitter.retry(request.run_id)
        except NotRetryableError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise  # not reached: abort raises
        return run_to_proto(await self._submitter.get(request.run_id))

    async def List(self, request: pb.ListRunsRequest, context: Context  # noqa: N802
                   ) -> pb.ListRunsResponse:
        """Runs, newest first, without their steps."""
        page = await self._submitter.list(
            workflow=request.workflow, states=run_states_from_proto(request.states),
            page_size=request.page_size, page_token=request.page_token)
        return pb.ListRunsResponse(runs=[run_to_proto(r) for r in page.runs],
                                   next_page_token=page.next_page_token)

    async def RegisterTemplate(self, request: pb.RegisterTemplateRequest,  # noqa: N802
                               context: Context) -> common_pb2.Template:
        """Register (or replace) a template."""
        source = request.WhichOneof("source")
        workflow = None
        encoded = None
        what = f"template {request.name[:80]!r}: field 'workflow'"
        if source == "workflow":
            encoded = request.workflow.SerializeToString()
            workflow = await asyncio.to_thread(workflow_from_message, request.workflow, what)
        template = await self._submitter.register_template(
            request.name, workflow, request.engine, encoded=encoded,
            workflow_ref=blob_ref_from_proto(request.workflow_ref)
            if source == "workflow_ref" else None)
        return await self._template(template)

    async def ListTemplates(self, request: pb.ListTemplatesRequest,  # noqa: N802
                            context: Context) -> pb.ListTemplatesResponse:
        """The registered templates."""
        templates = await self._submitter.templates()
        return pb.ListTemplatesResponse(templates=[await self._template(t) for t in templates])

    async def Logs(self, request: pb.StepLogsRequest, context: Context  # noqa: N802
                   ) -> pb.StepLogsResponse:
        """What one step execution wrote."""
        text, truncated = await self._submitter.logs(request.run_id, request.step, request.key,
                                                     request.max_bytes)
        return pb.StepLogsResponse(text=text, truncated=truncated)

    async def DownloadBlob(self, request: pb.DownloadBlobRequest,  # noqa: N802
                           context: Context) -> AsyncIterator[pb.BlobChunk]:
        """The bytes of a blob, in chunks."""
        async for data in self._submitter.blob_chunks(blob_ref_from_proto(request.ref)):
            yield pb.BlobChunk(data=data)

    async def ListSchedules(self, request: pb.ListSchedulesRequest,  # noqa: N802
                            context: Context) -> pb.ListSchedulesResponse:
        """The cron schedules, by name."""
        return pb.ListSchedulesResponse(
            schedules=[schedule_to_proto(v) for v in await self._submitter.schedules()])

    async def PauseSchedule(self, request: pb.ScheduleRequest,  # noqa: N802
                            context: Context) -> pb.Schedule:
        """Stop launching the schedule's runs."""
        return schedule_to_proto(await self._submitter.pause_schedule(request.name, True))

    async def ResumeSchedule(self, request: pb.ScheduleRequest,  # noqa: N802
                             context: Context) -> pb.Schedule:
        """Launch the schedule's runs again from its next tick."""
        return schedule_to_proto(await self._submitter.pause_schedule(request.name, False))

    async def _template(self, template: Template) -> common_pb2.Template:
        """``template`` as the contract answers it: its workflow inline when small."""
        message = await asyncio.to_thread(template_to_proto, template)
        if message.workflow.ByteSize() <= INLINE_WORKFLOW_BYTES:
            return message
        ref = await self._submitter.store_blob(message.workflow.SerializeToString())
        message.ClearField("workflow")
        message.workflow_ref.CopyFrom(blob_ref_to_proto(ref))
        return message
