"""``couler.v1.OptimizerService`` over gRPC: protobuf in, :class:`Optimizer` call, protobuf out.

Errors are not handled here: the server's interceptor maps the :mod:`couler.errors`
hierarchy to statuses (an invalid workflow is INVALID_ARGUMENT with the issues, a feature
the engine cannot express FAILED_PRECONDITION, an unavailable store UNAVAILABLE). An
unreachable cache is not an error: the plan is made without it (see the pass report).
"""

from __future__ import annotations

from typing import Any

import grpc

from couler.v1 import common_pb2
from couler.v1 import optimizer_service_pb2 as pb
from couler_optimizer.service import Optimizer
from couler_runtime import codec
from couler_runtime.rpc.records import objectives_from_proto, plan_to_proto

__all__ = ["OptimizerService"]


class OptimizerService:
    """The servicer (methods named like the RPCs, see ``couler_runtime.rpc.server``)."""

    def __init__(self, optimizer: Optimizer) -> None:
        self._optimizer = optimizer

    async def Optimize(  # noqa: N802 (the RPC's name)
        self, request: pb.OptimizeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.Plan:
        """The plan for ``request.workflow`` on ``request.engine`` ("" = local)."""
        wf = codec.workflow_from_proto(request.workflow)
        plan = await self._optimizer.optimize(
            wf, request.engine, objectives=objectives_from_proto(request.objectives),
            no_cache=request.no_cache, parameters=dict(request.parameters),
            run_id=request.run_id)
        return plan_to_proto(plan)
