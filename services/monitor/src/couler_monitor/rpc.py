"""``couler.v1.MonitorService`` over gRPC: protobuf in, :class:`Monitor` call, protobuf out.

Errors are not handled here: the server's interceptor maps the :mod:`couler.errors`
hierarchy to statuses (a request without a run or workflow is INVALID_ARGUMENT).
"""

from __future__ import annotations

from typing import Any

import grpc

from couler.v1 import monitor_service_pb2 as pb
from couler_monitor.service import Monitor
from couler_runtime.rpc.records import recommendation_report_to_proto, utilization_to_proto

__all__ = ["MonitorService"]


class MonitorService:
    """The servicer (methods named like the RPCs, see ``couler_runtime.rpc.server``)."""

    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor

    async def Utilization(  # noqa: N802 (the RPC's name)
        self, request: pb.UtilizationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UtilizationResponse:
        """Samples and per-step peaks of a run, or of a workflow (and step)."""
        got = await self._monitor.utilization(run_id=request.run_id, workflow=request.workflow,
                                              step=request.step, limit=request.limit)
        return utilization_to_proto(got)

    async def Recommendations(  # noqa: N802 (the RPC's name)
        self, request: pb.RecommendationsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RecommendationsResponse:
        """The current recommendations for a workflow (one step's, when given), with their
        evidence and the requests of the workflow's latest plan."""
        got = await self._monitor.recommendation_report(request.workflow, request.step)
        return recommendation_report_to_proto(got)
