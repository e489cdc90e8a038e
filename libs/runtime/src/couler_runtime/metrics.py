"""OpenTelemetry metrics for the services, exposed for Prometheus at ``/metrics``.

:class:`Metrics` is one service's meter provider, read by OpenTelemetry's Prometheus
exporter into a registry of its own (services run in one process in tests and stacks:
each keeps its own series). :func:`~couler_runtime.service.serve` makes it, makes it the
*current* one while the service's ``build`` runs -- the service's components create
their instruments with :func:`meter` as they are constructed -- and serves it with
:class:`MetricsServer` when ``COULER_METRICS_ADDRESS`` is set. Outside a service
(unit tests constructing a component directly) :func:`meter` answers a no-op meter.

Before each scrape the *refreshers* run (:meth:`Metrics.add_refresher`): asynchronous
readings, such as the bus consumers' pending counts from JetStream, that observable
gauges then report. A refresher that fails or takes longer than :data:`REFRESH_TIMEOUT`
is logged and its gauges keep their last values.

The endpoint answers ``GET /metrics`` (and ``HEAD``) only. It requires
``Authorization: Bearer <COULER_AUTH_TOKEN>`` (Prometheus: ``authorization:`` in the
scrape config), compared in constant time; 401 with ``WWW-Authenticate: Bearer``
otherwise. ``COULER_METRICS_ANONYMOUS=true`` lets scrapes in without a token, and the
settings allow it on a loopback address only.

The metric names are listed in docs/metrics.md; :data:`METRIC_NAMES` holds the
Prometheus names the services register (the Grafana dashboard's test checks its panels
against them).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hmac
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter, NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from couler_runtime.http_server import AsgiServer

__all__ = ["DURATION_BUCKETS", "METRIC_NAMES", "REFRESH_TIMEOUT", "Metrics", "MetricsServer",
           "current", "meter", "metrics_app", "using"]

log = logging.getLogger(__name__)

REFRESH_TIMEOUT = 5.0
# Seconds, for step and call durations alike: from a quick RPC to a day-long step.
DURATION_BUCKETS: Sequence[float] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200,
                                     21600, 86400)

# The Prometheus names the services export (histograms as their base name).
METRIC_NAMES = frozenset({
    "couler_rpc_server_duration_seconds",
    "couler_bus_consumer_pending",
    "couler_bus_consumer_ack_pending",
    "couler_bus_consumer_redelivered",
    "couler_runs_total",
    "couler_step_duration_seconds",
    "couler_recommendations_total",
    "couler_cache_lookups_total",
    "couler_cache_saved_bytes_total",
    "couler_cache_compute_saved_seconds_total",
    "couler_cache_commits_total",
    "couler_submitter_submissions_total",
    "couler_optimizer_plans_total",
    "couler_optimizer_recommendations_applied_total",
    "couler_optimizer_cached_steps_total",
    "couler_generator_requests_total",
})

Refresher = Callable[[], Awaitable[None]]

_NOOP = NoOpMeterProvider()
_current: contextvars.ContextVar[Metrics | None] = contextvars.ContextVar(
    "couler_metrics", default=None)


class Metrics:
    """One service's meter provider and the Prometheus registry it is read into.

    Args:
        service_name: The ``service.name`` resource attribute (``target_info``).
    """

    def __init__(self, service_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._reader = PrometheusMetricReader(registry=self.registry)
        self.provider = MeterProvider(
            resource=Resource.create({SERVICE_NAME: service_name}),
            metric_readers=[self._reader])
        self._refreshers: list[tuple[str, Refresher]] = []

    def meter(self, name: str) -> Meter:
        """The meter named ``name`` (e.g. ``"couler.cache"``: the ``otel_scope_name`` label)."""
        return self.provider.get_meter(name)

    def add_refresher(self, name: str, refresh: Refresher) -> None:
        """Run ``refresh`` before each scrape (``name`` identifies it in the log)."""
        self._refreshers.append((name, refresh))

    async def refresh(self) -> None:
        """Run the refreshers, each at most :data:`REFRESH_TIMEOUT` seconds; a failure is
        logged and the others still run."""
        for name, refresh in self._refreshers:
            try:
                await asyncio.wait_for(refresh(), REFRESH_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the bus is away: the gauges keep their last values
                log.warning("metrics: %s not refreshed: %s: %s", name, type(exc).__name__, exc)

    async def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The scrape's body and content type (OpenMetrics when ``accept`` asks for it)."""
        await self.refresh()
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def shutdown(self) -> None:
        """Stop the provider (its instruments record nothing afterwards)."""
        with contextlib.suppress(Exception):
            self.provider.shutdown()


def current() -> Metrics | None:
    """The metrics of the service being built or served in this context, if any."""
    return _current.get()


def meter(name: str) -> Meter:
    """A meter of the current service (:func:`current`); a no-op one outside a service."""
    metrics = _current.get()
    return metrics.meter(name) if metrics is not None else _NOOP.get_meter(name)


@contextlib.contextmanager
def using(metrics: Metrics) -> Iterator[Metrics]:
    """Make ``metrics`` the current one inside the ``with`` block (and in the tasks
    created there, which copy the context)."""
    token = _current.set(metrics)
    try:
        yield metrics
    finally:
        _current.reset(token)


# =========================================================================== HTTP

_ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
_ASGISend = Callable[[dict[str, Any]], Awaitable[None]]


def metrics_app(metrics: Metrics, *, token: str | None
                ) -> Callable[[dict[str, Any], _ASGIReceive, _ASGISend], Awaitable[None]]:
    """The ``/metrics`` ASGI app: ``token`` required as a bearer token unless None."""
    expected = f"Bearer {token}".encode() if token else None

    async def reply(send: _ASGISend, status: int, body: bytes, content_type: str,
                    extra: Sequence[tuple[bytes, bytes]] = (), *, head: bool = False) -> None:
        headers = [(b"content-type", content_type.encode()),
                   (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store"),
                   (b"x-content-type-options", b"nosniff"), *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else body})

    async def app(scope: dict[str, Any], receive: _ASGIReceive, send: _ASGISend) -> None:
        if scope["type"] != "http":
            return
        text = "text/plain; charset=utf-8"
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        if expected is not None and not hmac.compare_digest(
                headers.get(b"authorization", b"").strip(), expected):
            await reply(send, 401, b"a valid token is required: "
                                   b"send 'Authorization: Bearer <token>'\n", text,
                        [(b"www-authenticate", b"Bearer")])
            return
        if scope.get("path") != "/metrics":
            await reply(send, 404, b"not found: the metrics are at /metrics\n", text)
            return
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            await reply(send, 405, b"method not allowed\n", text, [(b"allow", b"GET, HEAD")])
            return
        try:
            body, content_type = await metrics.exposition(
                headers.get(b"accept", b"").decode("latin-1"))
        except Exception:
            log.exception("metrics: the exposition failed")
            await reply(send, 500, b"internal error (logged by the service)\n", text)
            return
        await reply(send, 200, body, content_type, head=method == "HEAD")

    return app


class MetricsServer(AsgiServer):
    """The ``/metrics`` HTTP listener, a task on the service's event loop.

    Args:
        metrics: What it exposes.
        address: ``host:port`` to listen on (port 0 picks a free one).
        token: The bearer token scrapes must send; None lets anyone scrape (the settings
            allow that on a loopback address only).
    """

    def __init__(self, metrics: Metrics, address: str, *, token: str | None) -> None:
        super().__init__(metrics_app(metrics, token=token), address, what="metrics",
                         setting="COULER_METRICS_ADDRESS", path="/metrics", backlog=64,
                         grace=2)
