"""The cost of metrics: a unary gRPC call with and without the latency interceptor, and
one exposition of the registry (see bench/README.md, "Metrics").

Usage: ``python bench/bench_metrics.py`` (3 rounds, 3000 calls each, after 300 warm-up).
"""

import asyncio
import time

import grpc

from couler.v1 import cache_service_pb2
from couler_runtime.metrics import Metrics
from couler_runtime.rpc import start_server


class Svc:
    """A CacheService answering Stats with nothing."""

    async def Stats(self, request: object, context: object) -> object:  # noqa: N802
        return cache_service_pb2.StatsResponse()

async def run(meter: bool, n: int = 3000) -> tuple[float, float, int]:
    m = Metrics("bench")
    server = await start_server("127.0.0.1:0", {"couler.v1.CacheService": Svc()}, token="t",
                                meter_provider=m.provider if meter else None)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = ch.unary_unary("/couler.v1.CacheService/Stats",
                              request_serializer=cache_service_pb2.StatsRequest.SerializeToString,
                              response_deserializer=cache_service_pb2.StatsResponse.FromString)
        md = (("authorization", "Bearer t"),)
        for _ in range(300):
            await call(cache_service_pb2.StatsRequest(), metadata=md)
        t = time.perf_counter()
        for _ in range(n):
            await call(cache_service_pb2.StatsRequest(), metadata=md)
        el = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(50):
        body, _ = await m.exposition()
    scrape = (time.perf_counter() - t) / 50
    await server.stop(None)
    return el, scrape, len(body)

async def main() -> None:
    for rnd in range(3):
        for meter in (False, True):
            el, sc, size = await run(meter)
            print(f"round {rnd} meter={meter}: {el * 1e6:.0f} us/call; "
                  f"exposition {sc * 1e3:.2f} ms ({size} bytes)")
if __name__ == "__main__":
    asyncio.run(main())
