"""``couler.v1.SubmitterService`` over gRPC: protobuf in, :class:`Submitter` call, protobuf out.

Errors are mapped by the server's interceptor (:mod:`couler.errors` → status), except
:class:`~couler_submitter.service.NotRetryableError`, which the contract answers with
FAILED_PRECONDITION.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from couler.v1 import common_pb2
from couler.v1 import submitter_service_pb2 as pb
from couler_runtime import codec
from couler_runtime.rpc.records import (
    objectives_from_proto,
    run_states_from_proto,
    run_to_proto,
    template_to_proto,
)
from couler_submitter.model import RunOptions
from couler_submitter.service import NotRetryableError, Submitter

__all__ = ["SubmitterService"]

Context = grpc.aio.ServicerContext[Any, Any]


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
        run_id, created = await self._submitter.submit(
            workflow=codec.workflow_from_proto(request.workflow)
            if source == "workflow" else None,
            text=request.text if source == "text" else None,
            template=request.template if source == "template" else "",
            options=options, idempotency_key=request.idempotency_key)
        return pb.SubmitResponse(run_id=run_id, created=created)

    async def Get(self, request: pb.GetRunRequest, context: Context  # noqa: N802
                  ) -> common_pb2.Run:
        """The run's record."""
        return run_to_proto(await self._submitter.get(request.run_id))

    async def Watch(self, request: pb.WatchRunRequest, context: Context  # noqa: N802
                    ) -> AsyncIterator[common_pb2.Run]:
        """The record, then every change, until a terminal state."""
        async for run in self._submitter.watch(request.run_id):
            yield run_to_proto(run)

    async def Cancel(self, request: pb.CancelRunRequest, context: Context  # noqa: N802
                     ) -> common_pb2.Run:
        """Stop the run."""
        return run_to_proto(await self._submitter.cancel(request.run_id, request.reason))

    async def Retry(self, request: pb.RetryRunRequest, context: Context  # noqa: N802
                    ) -> common_pb2.Run:
        """Re-run a failed or cancelled run from its failure point."""
        try:
            run = await self._submitter.retry(request.run_id)
        except NotRetryableError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise  # not reached: abort raises
        return run_to_proto(run)

    async def List(self, request: pb.ListRunsRequest, context: Context  # noqa: N802
                   ) -> pb.ListRunsResponse:
        """Runs, newest first."""
        page = await self._submitter.list(
            workflow=request.workflow, states=run_states_from_proto(request.states),
            page_size=request.page_size, page_token=request.page_token)
        return pb.ListRunsResponse(runs=[run_to_proto(r) for r in page.runs],
                                   next_page_token=page.next_page_token)

    async def RegisterTemplate(self, request: pb.RegisterTemplateRequest,  # noqa: N802
                               context: Context) -> common_pb2.Template:
        """Register (or replace) a template."""
        template = await self._submitter.register_template(
            request.name, codec.workflow_from_proto(request.workflow), request.engine)
        return template_to_proto(template)

    async def ListTemplates(self, request: pb.ListTemplatesRequest,  # noqa: N802
                            context: Context) -> pb.ListTemplatesResponse:
        """The registered templates."""
        templates = await self._submitter.templates()
        return pb.ListTemplatesResponse(templates=[template_to_proto(t) for t in templates])

    async def Logs(self, request: pb.StepLogsRequest, context: Context  # noqa: N802
                   ) -> pb.StepLogsResponse:
        """What one step execution wrote."""
        text, truncated = await self._submitter.logs(request.run_id, request.step, request.key,
                                                     request.max_bytes)
        return pb.StepLogsResponse(text=text, truncated=truncated)
