"""gRPC plumbing shared by the services: server, channels and error translation.

Named ``rpc`` (not ``grpc``) so that it never shadows the ``grpc`` package.

* :func:`start_server` / :class:`RpcServer` — a ``grpc.aio`` server with health,
  reflection, tracing, an optional bearer token and error mapping (:mod:`.server`).
* :func:`connect` / :func:`aio_connect` — channels that send the token and
  ``traceparent``; :func:`translated_errors` maps failures back (:mod:`.client`).
* :mod:`.errors` — the :mod:`couler.errors` ⇄ gRPC status table.
* :mod:`.records` — frozen dataclasses for the contract's non-IR messages (runs,
  plans, cache entries, ...) and their protobuf conversions.
"""

from couler_runtime.rpc.client import aio_connect, connect, translated_errors
from couler_runtime.rpc.errors import error_from_rpc, error_from_status, status_for
from couler_runtime.rpc.server import RpcServer, start_server

__all__ = [
    "CACHE",
    "GENERATOR",
    "MONITOR",
    "OPTIMIZER",
    "SERVICES",
    "SUBMITTER",
    "RpcServer",
    "aio_connect",
    "connect",
    "error_from_rpc",
    "error_from_status",
    "start_server",
    "status_for",
    "translated_errors",
]

GENERATOR = "couler.v1.GeneratorService"
OPTIMIZER = "couler.v1.OptimizerService"
CACHE = "couler.v1.CacheService"
SUBMITTER = "couler.v1.SubmitterService"
MONITOR = "couler.v1.MonitorService"
# Short name (as in settings and CoulerClient addresses) to full service name.
SERVICES = {
    "generator": GENERATOR,
    "optimizer": OPTIMIZER,
    "cache": CACHE,
    "submitter": SUBMITTER,
    "monitor": MONITOR,
}
