"""The life of a service process: settings → telemetry → bus → component → gRPC → metrics
→ signals.

Every service's ``main.py`` is a composition root that loads its settings and calls
:func:`run_service` with a ``build`` coroutine. ``build`` gets the settings and a
connected :class:`~couler_runtime.bus.Bus` (streams ensured) and returns a
:class:`Component`: the gRPC servicers by full service name and a ``close`` coroutine.
:func:`run_service` then starts the gRPC server (health, reflection, token, tracing,
error mapping, latency metrics), serves ``/metrics`` when ``COULER_METRICS_ADDRESS`` is
set (:mod:`couler_runtime.metrics`; the component creates its instruments in ``build``,
where the service's :class:`~couler_runtime.metrics.Metrics` is the current one), prints
one ``COULER-READY <service> <host:port> [name=url ...]`` line on standard output (what
``couler up`` waits for: it starts services on port 0 and learns the bound addresses from
this line, see :func:`parse_ready`), and runs until SIGTERM or SIGINT, when it reports
NOT_SERVING, lets calls in flight finish, stops the consumers (running
handlers finish, nothing unacked is lost: JetStream redelivers) and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from opentelemetry.metrics import Observation

from couler.errors import UserError
from couler_runtime.blobs import open_payload_store
from couler_runtime.bus import Bus, ConsumerState
from couler_runtime.bus_access import grant_for, streams_used
from couler_runtime.bus_keys import BusIdentity, Trust
from couler_runtime.metrics import Metrics, MetricsServer, using
from couler_runtime.rpc.server import RpcServer, start_server
from couler_runtime.settings import CommonSettings, SettingsError
from couler_runtime.telemetry import setup_tracing

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["READY_PREFIX", "Component", "Ready", "bus_security", "connect_bus",
           "observe_consumers", "parse_ready", "ready_line", "run_service", "serve",
           "service_main"]

log = logging.getLogger(__name__)

READY_PREFIX = "COULER-READY"

S = TypeVar("S", bound=CommonSettings)


async def _nothing() -> None:
    return None


@dataclass
class Component:
    """What a service's ``build`` returns.

    ``endpoints`` names other addresses the service serves (the monitor's ``dashboard``
    URL); they go on the READY line, so a supervisor that bound them to port 0 learns them.
    """

    servicers: Mapping[str, object]
    close: Callable[[], Awaitable[None]] = field(default=_nothing)
    endpoints: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Ready:
    """A parsed READY line: the service, its bound gRPC ``host:port`` and other endpoints."""

    service: str
    address: str
    endpoints: Mapping[str, str]


def ready_line(service: str, address: str, endpoints: Mapping[str, str]) -> str:
    """The line a service prints once it serves (no spaces inside a field)."""
    extra = "".join(f" {k}={v}" for k, v in endpoints.items())
    return f"{READY_PREFIX} {service} {address}{extra}"


def parse_ready(line: str) -> Ready | None:
    """The READY line's fields, or None when ``line`` is not a READY line."""
    fields = line.split()
    if len(fields) < 3 or fields[0] != READY_PREFIX:
        return None
    endpoints = dict(f.split("=", 1) for f in fields[3:] if "=" in f)
    return Ready(fields[1], fields[2], endpoints)


def bus_security(settings: CommonSettings
                 ) -> tuple[BusIdentity | None, Trust | None, ssl.SSLContext | None]:
    """The bus identity, trust and TLS context the settings name (None: not configured).

    Raises:
        SettingsError: A seed, trust or CA file that cannot be used, naming the variable.
    """
    identity: BusIdentity | None = None
    trust: Trust | None = None
    tls: ssl.SSLContext | None = None
    try:
        if settings.nats_seed is not None:
            identity = BusIdentity(settings.nats_identity,
                                   settings.nats_seed.get_secret_value().strip().encode())
        elif settings.nats_seed_file is not None:
            identity = BusIdentity.from_file(settings.nats_identity, settings.nats_seed_file)
        if settings.nats_trust_file is not None:
            trust = Trust.load(settings.nats_trust_file)
    except KeyError as exc:
        raise SettingsError(f"COULER_NATS_IDENTITY: {exc.args[0]}") from None
    except UserError as exc:
        raise SettingsError(f"COULER_NATS_SEED_FILE / COULER_NATS_TRUST_FILE: {exc}") from None
    if settings.nats_tls_ca is not None:
        try:
            tls = ssl.create_default_context(cafile=str(settings.nats_tls_ca))
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(f"COULER_NATS_TLS_CA: cannot load {settings.nats_tls_ca}: "
                                f"{exc}") from None
    return identity, trust, tls


async def connect_bus(settings: CommonSettings) -> Bus:
    """Connect the service's bus as the settings say (identity, trust, TLS, payloads) and
    make sure the streams it uses exist: created on an open bus, awaited (the admin makes
    them) on an authenticated one."""
    identity, trust, tls = bus_security(settings)
    if identity is None:
        log.warning("%s: the bus is OPEN (COULER_BUS_INSECURE): no identity, no signatures; "
                    "anyone who reaches NATS can drive this service", settings.service)
    payloads = await asyncio.to_thread(open_payload_store, settings)
    bus = await Bus.connect(settings.nats_url, name=f"couler-{settings.service}",
                            identity=identity, trust=trust, tls=tls, payloads=payloads,
                            inline_limit=settings.inline_payload_bytes)
    try:
        if identity is None:
            await bus.ensure_streams()
        else:
            await bus.wait_for_streams(streams_used(grant_for(identity.name)))
    except BaseException:
        await bus.close()
        raise
    return bus


async def serve(settings: S, build: Callable[[S, Bus], Awaitable[Component]], *,
                stop: asyncio.Event | None = None,
                on_ready: Callable[[int], None] | None = None,
                on_endpoints: Callable[[Mapping[str, str]], None] | None = None) -> None:
    """Run one service until ``stop`` is set (or SIGTERM / SIGINT when it is None).

    ``on_ready`` is called with the bound gRPC port once the service serves (tests and
    in-process stacks use it with port 0), after ``on_endpoints`` with the other
    addresses it serves (those of the READY line: ``metrics``, the monitor's
    ``dashboard``).
    """
    # A process owns the global tracer provider; services run in-process (tests, one-process
    # stacks) keep theirs local.
    provider = setup_tracing(settings.service, otlp_endpoint=settings.otel_endpoint,
                             set_global=stop is None)
    meters = Metrics(f"couler-{settings.service}")
    with using(meters):  # the component's instruments are created in build()
        await _serve(settings, build, provider, meters, stop=stop, on_ready=on_ready,
                     on_endpoints=on_endpoints)


async def _serve(settings: S, build: Callable[[S, Bus], Awaitable[Component]],
                 provider: TracerProvider, meters: Metrics, *, stop: asyncio.Event | None,
                 on_ready: Callable[[int], None] | None,
                 on_endpoints: Callable[[Mapping[str, str]], None] | None) -> None:
    bus = await connect_bus(settings)
    server: RpcServer | None = None
    scrapes: MetricsServer | None = None
    component: Component | None = None
    stopping = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
    try:
        component = await build(settings, bus)
        token = settings.auth_token.get_secret_value() if settings.auth_token else None
        server = await start_server(settings.grpc_address, component.servicers, token=token,
                                    tracer_provider=provider, meter_provider=meters.provider,
                                    max_message_bytes=settings.grpc_max_message_bytes)
        endpoints = dict(component.endpoints)
        if settings.metrics_address:
            observe_consumers(meters, bus)
            scrapes = MetricsServer(meters, settings.metrics_address,
                                    token=None if settings.metrics_anonymous else token)
            endpoints["metrics"] = await scrapes.start()
            log.info("%s metrics at %s%s", settings.service, endpoints["metrics"],
                     " (anonymous scrapes)" if settings.metrics_anonymous else
                     " (token required)")
        host = settings.grpc_address.rsplit(":", 1)[0]
        print(ready_line(settings.service, f"{host}:{server.port}", endpoints), flush=True)
        if on_endpoints is not None:
            on_endpoints(endpoints)
        if on_ready is not None:
            on_ready(server.port)
        log.info("%s serving on %s:%d", settings.service, host, server.port)
        if stop is None:
            # A service process: what start-up made (modules, the ORM's and protobuf's
            # tables) lives as long as it does. Out of the collector's sight from now on,
            # full collections scan only what serving allocates (they took 40-100 ms,
            # stalling every call and consumer, a few times a minute under load).
            gc.collect()
            gc.freeze()
        await stopping.wait()
    finally:
        log.info("%s stopping", settings.service)
        if scrapes is not None:
            await scrapes.stop()
        if server is not None:
            await server.stop(5.0)
        await bus.close()
        if component is not None:
            await component.close()
        with contextlib.suppress(Exception):
            provider.shutdown()
        meters.shutdown()
        if stop is None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


def observe_consumers(meters: Metrics, bus: Bus) -> None:
    """Gauges of the bus's consumers (queue depth and lag per stream, consumer and
    subject), read from JetStream before each scrape."""
    states: list[ConsumerState] = []

    async def refresh() -> None:
        states[:] = await bus.consumer_states()

    def gauge(field: str) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(options: CallbackOptions) -> list[Observation]:
            return [Observation(getattr(s, field), {"stream": s.stream, "consumer": s.durable,
                                                    "subject": s.subject}) for s in states]
        return observe

    meter = meters.meter("couler.bus")
    meter.create_observable_gauge(
        "couler.bus.consumer.pending", callbacks=[gauge("pending")], unit="{message}",
        description="Messages in the stream not yet delivered to the consumer (queue depth)")
    meter.create_observable_gauge(
        "couler.bus.consumer.ack_pending", callbacks=[gauge("ack_pending")], unit="{message}",
        description="Messages delivered to the consumer and not yet acknowledged")
    meter.create_observable_gauge(
        "couler.bus.consumer.redelivered", callbacks=[gauge("redelivered")], unit="{message}",
        description="Messages delivered more than once and not yet acknowledged")
    meters.add_refresher("bus consumers", refresh)


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


def service_main(service: str, settings_type: type[S],
                 build: Callable[[S, Bus], Awaitable[Component]]) -> int:
    """A service's console script (``couler-<service>``, ``python -m couler_<service>.main``):
    load its settings -- exit status 2 and the problem on stderr when they are invalid --
    then :func:`run_service`."""
    os.umask(0o077)  # what the service writes (databases, state, runs) is its own
    try:
        settings = settings_type.load(service)
    except SettingsError as exc:
        sys.stderr.write(f"couler-{service}: {exc}\n")
        return 2
    return run_service(settings, build)
