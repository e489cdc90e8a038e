"""The monitor service's composition root: settings, store, consumers, gRPC, dashboard.

Settings (environment, ``COULER_`` prefix): the common ones (:class:`CommonSettings`) plus

* ``COULER_DASHBOARD_ADDRESS`` -- ``host:port`` of the ops dashboard (default
  ``127.0.0.1:8080``; port 0 picks a free one; the URL is logged at start);
* ``COULER_SUBMITTER_ADDRESS`` -- ``host:port`` of the submitter's gRPC server: the
  console's actions (cancel, retry, resubmit) and the step logs in its run pages go there
  (with ``COULER_AUTH_TOKEN``); empty (the default): no actions and no logs, the pages say so;
* ``COULER_MIN_RUNS`` -- runs of a step needed before its requests are recommended
  (default 2: one run, noisy or not, never sets a request);
* ``COULER_SAFETY_MARGIN`` -- added to the percentiles the requests come from (default
  0.15, +15%; widened further while few runs were seen);
* ``COULER_HALF_LIFE_HOURS`` -- after how long a sample weighs half as much in the
  recommender's histograms (default 24);
* ``COULER_HISTORY_RUNS`` -- how many of a step's latest runs out-of-memory failures are
  looked for in (memory limit and retry proposals; default 10);
* ``COULER_MIN_MEMORY_REQUEST`` / ``COULER_MIN_CPU_REQUEST`` -- the smallest requests
  recommended, as Kubernetes quantities (default ``16Mi`` and ``10m``);
* ``COULER_SAMPLE_RETENTION`` -- seconds raw utilization samples are kept (default 86400,
  24 h) before they are compacted into 1-minute rollups (count, mean and highest CPU,
  highest memory);
* ``COULER_ROLLUP_RETENTION`` -- seconds the rollups are kept (default 2592000, 30 days;
  at least the sample retention), then deleted;
* ``COULER_MAINTENANCE_INTERVAL`` -- seconds between two compaction / retention passes
  (default 300; the first runs at start).

``COULER_AUTH_TOKEN`` guards the dashboard as well as the gRPC server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from typing import Self

from pydantic import Field, field_validator, model_validator

from couler import ir
from couler_monitor.dashboard import DashboardServer, create_app
from couler_monitor.events import make_publisher, start_consumers
from couler_monitor.recommender import RecommenderConfig
from couler_monitor.rpc import MonitorService
from couler_monitor.service import DEFAULT_ROLLUP_RETENTION, DEFAULT_SAMPLE_RETENTION, Monitor
from couler_monitor.store import MonitorStore
from couler_runtime.bus import Bus
from couler_runtime.client import CoulerClient
from couler_runtime.rpc import MONITOR
from couler_runtime.service import Component, service_main
from couler_runtime.settings import CommonSettings

__all__ = ["MonitorSettings", "build", "main"]

log = logging.getLogger(__name__)


class MonitorSettings(CommonSettings):
    """Settings of the monitor service.

    Attributes:
        dashboard_address: ``host:port`` the dashboard listens on.
        submitter_address: ``host:port`` of the submitter (the console's actions and logs).
        min_runs: Runs of a step needed before its requests are recommended.
        safety_margin: Added to the percentiles (0.15: +15%).
        half_life_hours: Hours after which a sample weighs half in the histograms.
        history_runs: How many of a step's latest runs OOM failures are looked for in.
        min_memory_request: The smallest memory request recommended (a quantity).
        min_cpu_request: The smallest CPU request recommended (a quantity).
        sample_retention: Seconds raw utilization samples are kept.
        rollup_retention: Seconds their 1-minute rollups are kept.
        maintenance_interval: Seconds between compaction / retention passes.
    """

    dashboard_address: str = "127.0.0.1:8080"
    submitter_address: str = ""
    min_runs: int = Field(default=2, ge=1, le=1000)
    safety_margin: float = Field(default=0.15, ge=0.0, le=10.0)
    half_life_hours: float = Field(default=24.0, gt=0.0, le=24.0 * 365)
    history_runs: int = Field(default=10, ge=1, le=1000)
    min_memory_request: str = "16Mi"
    min_cpu_request: str = "10m"
    sample_retention: float = Field(default=DEFAULT_SAMPLE_RETENTION, ge=60)
    rollup_retention: float = Field(default=DEFAULT_ROLLUP_RETENTION, ge=60)
    maintenance_interval: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _retentions(self) -> Self:
        if self.rollup_retention < self.sample_retention:
            raise ValueError(f"rollup_retention ({self.rollup_retention:g} s) must be at least "
                             f"sample_retention ({self.sample_retention:g} s)")
        return self

    @field_validator("min_memory_request", "min_cpu_request")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if ir.parse_quantity(value) <= 0:  # raises ValueError naming the text when malformed
            raise ValueError(f"must be more than 0 (got {value!r})")
        return value

    @field_validator("dashboard_address")
    @classmethod
    def _dashboard_address(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"must be host:port with a port 0-65535 (got {value!r})")
        return value


async def build(settings: MonitorSettings, bus: Bus) -> Component:
    """Wire the monitor: store (migrated), use cases, consumers, servicer and dashboard."""
    store = await asyncio.to_thread(MonitorStore.open, settings.database_url)
    config = RecommenderConfig(
        min_runs=settings.min_runs, safety_margin=settings.safety_margin,
        half_life=settings.half_life_hours * 3600.0,
        min_memory=float(ir.parse_quantity(settings.min_memory_request)),
        min_cpu=float(ir.parse_quantity(settings.min_cpu_request)))
    monitor = Monitor(store, make_publisher(bus), config=config,
                      history_runs=settings.history_runs,
                      sample_retention=settings.sample_retention,
                      rollup_retention=settings.rollup_retention)
    token = settings.auth_token.get_secret_value() if settings.auth_token else None
    address = settings.submitter_address.strip()
    client = CoulerClient({"submitter": address}, token=token) if address else None
    dashboard = DashboardServer(
        create_app(monitor, token=token,
                   submitter=client.submitter if client is not None else None),
        settings.dashboard_address)
    try:
        sent = await monitor.publish_pending()  # left unpublished by a crash
        if sent:
            log.info("published %d recommendation(s) left from the last run", sent)
        url = await dashboard.start()
        await start_consumers(bus, monitor)
    except BaseException:
        await dashboard.stop()
        store.close()
        if client is not None:
            client.close()
        raise
    log.info("dashboard at %s%s", url, " (token required)" if token else "")
    maintenance = asyncio.create_task(_maintain(monitor, settings.maintenance_interval),
                                      name="monitor-maintenance")

    async def close() -> None:
        # Runs after the bus stopped its consumers: no handler uses the store any more.
        maintenance.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await maintenance
        await dashboard.stop()
        store.close()
        if client is not None:
            client.close()

    return Component({MONITOR: MonitorService(monitor)}, close, endpoints={"dashboard": url})


async def _maintain(monitor: Monitor, interval: float) -> None:
    """Compact and expire utilization samples every ``interval`` seconds, forever (a
    failed pass is logged and tried again at the next)."""
    while True:
        try:
            await monitor.maintain()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the store is away, a replica raced us: next time
            log.warning("utilization maintenance failed (tried again in %g s): %s: %s",
                        interval, type(exc).__name__, exc)
        await asyncio.sleep(interval)


def main() -> int:
    """The ``couler-monitor`` console script; the process exit status."""
    return service_main("monitor", MonitorSettings, build)


if __name__ == "__main__":
    sys.exit(main())
