"""``couler.v1.CacheService`` over gRPC: protobuf in, :class:`Cache` call, protobuf out.

Errors are not handled here: the server's interceptor maps :mod:`couler.errors` to
statuses (a bad key or digest is INVALID_ARGUMENT naming the workflow, step and field; an
unreachable database or artifact store is UNAVAILABLE).
"""

from __future__ import annotations

from typing import Any

import grpc

from couler.v1 import cache_service_pb2 as pb
from couler_cache.service import Cache
from couler_runtime.rpc.records import (
    cache_entry_from_proto,
    cache_entry_to_proto,
    cache_order_from_proto,
    listed_entry_to_proto,
)

__all__ = ["CacheService"]


class CacheService:
    """The servicer (methods named like the RPCs, see ``couler_runtime.rpc.server``)."""

    def __init__(self, cache: Cache) -> None:
        self._cache = cache

    async def Lookup(  # noqa: N802 (the RPC's name)
        self, request: pb.LookupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LookupResponse:
        """The entries for ``request.keys``, in request order, and the missing keys."""
        result = await self._cache.lookup(list(request.keys), peek=request.peek,
                                          max_age_seconds=request.max_age_seconds)
        return pb.LookupResponse(
            entries=[cache_entry_to_proto(result.entries[k]) for k in dict.fromkeys(request.keys)
                     if k in result.entries],
            missing=list(result.missing))

    async def Commit(  # noqa: N802
        self, request: pb.CommitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CommitResponse:
        """Store ``request.entry`` unless its key is present."""
        result = await self._cache.commit(cache_entry_from_proto(request.entry))
        return pb.CommitResponse(created=result.created, evicted=list(result.evicted))

    async def Stats(  # noqa: N802
        self, request: pb.StatsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.StatsResponse:
        """Sizes and counters."""
        s = await self._cache.stats()
        return pb.StatsResponse(entries=s.entries, bytes=s.bytes, hits=s.hits, misses=s.misses,
                                evictions=s.evictions, budget_bytes=s.budget_bytes)

    async def Evict(  # noqa: N802
        self, request: pb.EvictRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.EvictResponse:
        """Remove the named entries, then more by policy until ``free_bytes`` were freed."""
        result = await self._cache.evict(list(request.keys), free_bytes=request.free_bytes)
        return pb.EvictResponse(evicted=list(result.evicted), freed_bytes=result.freed_bytes)

    async def Pin(  # noqa: N802
        self, request: pb.PinRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PinResponse:
        """Pin (or unpin) the named entries."""
        result = await self._cache.pin(list(request.keys), pinned=request.pinned)
        return pb.PinResponse(keys=list(result.keys), missing=list(result.missing))

    async def List(  # noqa: N802
        self, request: pb.ListEntriesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListEntriesResponse:
        """A page of entries in the requested order; counts no hit or miss."""
        page = await self._cache.list_entries(
            order=cache_order_from_proto(request.order), workflow=request.workflow,
            step=request.step, page_size=request.page_size, page_token=request.page_token)
        return pb.ListEntriesResponse(entries=[listed_entry_to_proto(e) for e in page.entries],
                                      next_page_token=page.next_page_token, policy=page.policy)

    async def Show(  # noqa: N802
        self, request: pb.ShowEntryRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ShowEntryResponse:
        """One entry by key or unique key prefix; counts no hit or miss."""
        found = await self._cache.show(request.key)
        return pb.ShowEntryResponse(entry=listed_entry_to_proto(found),
                                    policy=self._cache.policy.value)
