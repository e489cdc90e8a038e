"""``couler.v1.OptimizerService`` over gRPC: protobuf in, :class:`Optimizer` call, protobuf out.

Errors are not handled here: the server's interceptor maps the :mod:`couler.errors`
hierarchy to statuses (an invalid workflow is INVALID_ARGUMENT with the issues, a feature
the engine cannot express FAILED_PRECONDITION, an unavailable store UNAVAILABLE). An
unreachable cache is not an error: the plan is made without it (see the pass report).

No message depends on the size of the workflow: a large one comes by reference
(``workflow_ref``, read from the shared blob store and checked against its digest and
size), and a plan that encodes to more than :data:`INLINE_PLAN_BYTES` is put in the blob
store and answered by reference (``Plan.stored``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from couler.errors import CoulerError, UserError
from couler.ir.limits import DEFAULT_LIMITS, check_sizes
from couler.v1 import common_pb2, workflow_pb2
from couler.v1 import optimizer_service_pb2 as pb
from couler_optimizer.service import Optimizer
from couler_runtime import codec
from couler_runtime.blobs import BlobStore, digest_of, key_for_digest
from couler_runtime.rpc.records import objectives_from_proto, plan_to_proto

__all__ = ["INLINE_PLAN_BYTES", "OptimizerService"]

#: A plan larger than this (encoded) is answered by reference.
INLINE_PLAN_BYTES = 1 << 20
_MAX_REF_BYTES = DEFAULT_LIMITS.max_workflow_bytes


class OptimizerService:
    """The servicer (methods named like the RPCs, see ``couler_runtime.rpc.server``).

    Args:
        optimizer: The use case.
        blobs: The blob store the services share (None: workflows cannot come by
            reference, and plans are always answered inline).
    """

    def __init__(self, optimizer: Optimizer, blobs: BlobStore | None = None) -> None:
        self._optimizer = optimizer
        self._blobs = blobs

    async def Optimize(  # noqa: N802 (the RPC's name)
        self, request: pb.OptimizeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.Plan:
        """The plan for ``request.workflow`` on ``request.engine`` ("" = local)."""
        source = request.WhichOneof("source")
        if source == "workflow_ref":
            message = await asyncio.to_thread(self._read_workflow, request.workflow_ref)
        elif source == "workflow":
            message = request.workflow
        else:
            raise UserError("optimize: field 'workflow': give a workflow or a workflow_ref")
        wf = await asyncio.to_thread(_decode, message)
        # What Submit checks, checked here too: nothing a caller sends is an internal error.
        await asyncio.to_thread(check_sizes, wf, DEFAULT_LIMITS,
                                encoded_bytes=message.ByteSize())
        plan = await self._optimizer.optimize(
            wf, request.engine, objectives=objectives_from_proto(request.objectives),
            no_cache=request.no_cache, parameters=dict(request.parameters),
            run_id=request.run_id)
        answer = await asyncio.to_thread(plan_to_proto, plan)
        if answer.ByteSize() <= INLINE_PLAN_BYTES or self._blobs is None:
            return answer
        data = answer.SerializeToString()
        key = await asyncio.to_thread(self._blobs.put_bytes, data)
        stored = common_pb2.Plan(engine=answer.engine, passes=answer.passes,
                                 workflow_digest=answer.workflow_digest)
        stored.stored.digest = "sha256:" + digest_of(key)
        stored.stored.size_bytes = len(data)
        return stored

    def _read_workflow(self, ref: common_pb2.BlobRef) -> workflow_pb2.Workflow:
        what = "optimize: field 'workflow_ref'"
        if self._blobs is None:
            raise UserError(f"{what}: no blob store is configured here (COULER_ARTIFACTS)")
        if not ref.digest.startswith("sha256:"):
            raise UserError(f"{what}: digest {ref.digest[:80]!r} is not 'sha256:<hex>'")
        if not 0 < ref.size_bytes <= _MAX_REF_BYTES:
            raise UserError(f"{what}: field 'size_bytes': {ref.size_bytes} is not in "
                            f"1..{_MAX_REF_BYTES}")
        key = key_for_digest(ref.digest.removeprefix("sha256:"))
        digest_of(key)  # UserError for a malformed digest
        data = self._blobs.get_bytes(key)  # checked against the digest
        if len(data) != ref.size_bytes:
            raise UserError(f"{what}: field 'size_bytes': blob {ref.digest} is {len(data)} "
                            f"bytes, not {ref.size_bytes}")
        try:
            return workflow_pb2.Workflow.FromString(data)
        except DecodeError as exc:
            raise UserError(f"{what}: blob {ref.digest} is not a couler.v1.Workflow: "
                            f"{exc}") from None


def _decode(message: workflow_pb2.Workflow) -> Any:
    try:
        return codec.workflow_from_proto(message)
    except CoulerError:
        raise
    except (ValueError, TypeError, KeyError, RecursionError, UnicodeError) as exc:
        raise UserError(f"optimize: workflow {message.name[:80]!r} cannot be read: "
                        f"{type(exc).__name__}: {exc}") from None
