"""``couler.v1.GeneratorService`` over gRPC: protobuf in, :class:`Generator` call, protobuf out.

Errors are not handled here: the server's interceptor maps the :mod:`couler.errors`
hierarchy to statuses (a plan that cannot be made is INVALID_ARGUMENT with the reason,
an engine that cannot run it FAILED_PRECONDITION, an unavailable LLM endpoint UNAVAILABLE).
"""

from __future__ import annotations

from typing import Any

import grpc

from couler.v1 import generator_service_pb2 as pb
from couler_generator.service import Generator
from couler_runtime import codec
from couler_runtime.rpc.records import generation_report_to_proto

__all__ = ["GeneratorService"]


class GeneratorService:
    """The servicer (methods named like the RPCs, see ``couler_runtime.rpc.server``)."""

    def __init__(self, generator: Generator) -> None:
        self._generator = generator

    async def Generate(  # noqa: N802 (the RPC's name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GenerateResponse:
        """Plan a workflow for ``request.text``; never returns an invalid one."""
        wf, report = await self._generator.generate(
            request.text, constraints=tuple(request.constraints), engine=request.engine,
            name=request.name)
        return pb.GenerateResponse(workflow=codec.workflow_to_proto(wf),
                                   report=generation_report_to_proto(report))
