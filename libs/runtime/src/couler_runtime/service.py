"""The life of a service process: settings → telemetry → bus → component → gRPC → signals.

Every service's ``main.py`` is a composition root that loads its settings and calls
:func:`run_service` with a ``build`` coroutine. ``build`` gets the settings and a
connected :class:`~couler_runtime.bus.Bus` (streams ensured) and returns a
:class:`Component`: the gRPC servicers by full service name and a ``close`` coroutine.
:func:`run_service` then starts the gRPC server (health, reflection, token, tracing,
error mapping), prints one ``COULER-READY <service> <host:port>`` line on standard
output (what ``couler up`` waits for), and runs until SIGTERM or SIGINT, when it
reports NOT_SERVING, lets calls in flight finish, stops the consumers (running
handlers finish, nothing unacked is lost: JetStream redelivers) and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from couler_runtime.bus import Bus
from couler_runtime.rpc.server import RpcServer, start_server
from couler_runtime.settings import CommonSettings
from couler_runtime.telemetry import setup_tracing

__all__ = ["READY_PREFIX", "Component", "run_service", "serve"]

log = logging.getLogger(__name__)

READY_PREFIX = "COULER-READY"

S = TypeVar("S", bound=CommonSettings)


async def _nothing() -> None:
    return None


@dataclass
class Component:
    """What a service's ``build`` returns."""

    servicers: Mapping[str, object]
    close: Callable[[], Awaitable[None]] = field(default=_nothing)


async def serve(settings: S, build: Callable[[S, Bus], Awaitable[Component]], *,
                stop: asyncio.Event | None = None,
                on_ready: Callable[[int], None] | None = None) -> None:
    """Run one service until ``stop`` is set (or SIGTERM / SIGINT when it is None).

    ``on_ready`` is called with the bound gRPC port once the service serves (tests and
    in-process stacks use it with port 0).
    """
    # A process owns the global tracer provider; services run in-process (tests, one-process
    # stacks) keep theirs local.
    provider = setup_tracing(settings.service, otlp_endpoint=settings.otel_endpoint,
                             set_global=stop is None)
    bus = await Bus.connect(settings.nats_url, name=f"couler-{settings.service}")
    server: RpcServer | None = None
    component: Component | None = None
    stopping = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
    try:
        await bus.ensure_streams()
        component = await build(settings, bus)
        token = settings.auth_token.get_secret_value() if settings.auth_token else None
        server = await start_server(settings.grpc_address, component.servicers, token=token,
                                    tracer_provider=provider)
        host = settings.grpc_address.rsplit(":", 1)[0]
        print(f"{READY_PREFIX} {settings.service} {host}:{server.port}", flush=True)
        if on_ready is not None:
            on_ready(server.port)
        log.info("%s serving on %s:%d", settings.service, host, server.port)
        await stopping.wait()
    finally:
        log.info("%s stopping", settings.service)
        if server is not None:
            await server.stop(5.0)
        await bus.close()
        if component is not None:
            await component.close()
        with contextlib.suppress(Exception):
            provider.shutdown()
        if stop is None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


def run_service(settings: S, build: Callable[[S, Bus], Awaitable[Component]]) -> int:
    """Configure logging and run :func:`serve` to the end; the process exit status."""
    logging.basicConfig(
        level=settings.log_level, stream=sys.stderr,
        format=f"%(asctime)s {settings.service} %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(settings, build))
    except Exception as exc:  # the process reports and exits non-zero
        log.error("%s failed: %s", settings.service, exc, exc_info=True)
        return 1
    return 0
