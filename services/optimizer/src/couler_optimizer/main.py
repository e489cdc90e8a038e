"""The optimizer service's composition root: settings, store, cache client, servicer, consumers.

Settings (environment, ``COULER_`` prefix): the common ones (:class:`CommonSettings`) plus

* ``COULER_CACHE_ADDRESS`` — the cache service's ``host:port``; empty means no cache
  lookups (no step is reused). An unreachable cache never fails a run: the plan is made
  without it and the ``prune_cached`` report says so;
* ``COULER_CACHE_TIMEOUT`` — seconds one Lookup may take (default 5);
* ``COULER_DEFAULT_RETRY`` — give steps without a retry policy the default one (default true);
* ``COULER_MAX_STEPS_PER_CHUNK`` — split workflows into chunks of at most this many steps,
  besides the engine's own size limit (unset: no step limit).

The store (``COULER_DATABASE_URL``, SQLite by default) is migrated at start.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from pydantic import Field, field_validator

from couler import ir
from couler.optimize.reuse import ArtifactStore
from couler_optimizer.events import start_consumers
from couler_optimizer.lookup import CacheLookup
from couler_optimizer.rpc import OptimizerService
from couler_optimizer.service import Optimizer
from couler_optimizer.store import OptimizerStore
from couler_runtime.blobs import open_blob_store
from couler_runtime.bus import Bus
from couler_runtime.rpc import OPTIMIZER
from couler_runtime.service import Component, service_main
from couler_runtime.settings import CommonSettings

__all__ = ["OptimizerSettings", "build", "main"]

log = logging.getLogger(__name__)


class OptimizerSettings(CommonSettings):
    """Settings of the optimizer service.

    Attributes:
        cache_address: The cache service's ``host:port``; "" for no cache lookups.
        cache_timeout: Seconds one cache Lookup may take.
        default_retry: Give steps without a retry policy the default one.
        max_steps_per_chunk: The most steps one chunk of a split workflow may hold;
            None for the engine's own limits only.
        artifacts_secret: The Kubernetes secret (keys ``accessKey`` and ``secretKey``)
            with which a remote engine's pods read cached artifacts from the S3 artifact
            store (``COULER_ARTIFACTS=s3://...``); a reference, never the keys.
    """

    cache_address: str = ""
    artifacts_secret: str = "couler-artifacts"
    cache_timeout: float = Field(default=5.0, gt=0)
    default_retry: bool = True
    max_steps_per_chunk: int | None = Field(default=None, ge=1)

    @field_validator("cache_address", mode="before")
    @classmethod
    def _cache_address(cls, value: Any) -> Any:
        if value is None:
            return ""
        if isinstance(value, str):
            value = value.strip()
            if value:
                host, sep, port = value.rpartition(":")
                if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
                    raise ValueError(f"must be host:port with a port 1-65535 (got {value!r})")
        return value

    @field_validator("max_steps_per_chunk", mode="before")
    @classmethod
    def _max_steps(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value


def remote_artifact_store(settings: OptimizerSettings) -> ArtifactStore | None:
    """The S3 artifact store as remote engines read cached artifacts from it; None when
    artifacts are kept in a local directory (no remote engine can read that)."""
    where = settings.s3_location
    if where is None or not settings.s3_endpoint:
        return None
    endpoint = settings.s3_endpoint
    scheme, sep, rest = endpoint.partition("://")
    secret = settings.artifacts_secret
    return ArtifactStore(
        endpoint=rest if sep else endpoint, bucket=where.bucket, prefix=where.prefix,
        insecure=sep != "" and scheme == "http",
        access_key=ir.SecretRef(secret, "accessKey") if secret else None,
        secret_key=ir.SecretRef(secret, "secretKey") if secret else None)


async def build(settings: OptimizerSettings, bus: Bus) -> Component:
    """Wire the optimizer: the store (migrated), the cache client, the servicer, consumers."""
    store = await asyncio.to_thread(OptimizerStore.open, settings.database_url)
    cache: CacheLookup | None = None
    if settings.cache_address:
        token = settings.auth_token.get_secret_value() if settings.auth_token else None
        cache = CacheLookup(settings.cache_address, token=token, timeout=settings.cache_timeout)
    optimizer = Optimizer(store, cache, cache_address=settings.cache_address,
                          default_retry=settings.default_retry,
                          max_steps_per_chunk=settings.max_steps_per_chunk,
                          artifact_store=remote_artifact_store(settings))
    log.info("planning with cache %s, default retry %s, max steps per chunk %s",
             settings.cache_address or "(none)", settings.default_retry,
             settings.max_steps_per_chunk)

    async def close() -> None:
        # Runs after the bus stopped its consumers, so no handler still uses these.
        if cache is not None:
            cache.close()
        store.close()

    try:
        blobs = await asyncio.to_thread(open_blob_store, settings)  # workflows, plans by ref
        await start_consumers(bus, optimizer)
    except BaseException:
        await close()
        raise
    return Component({OPTIMIZER: OptimizerService(optimizer, blobs)}, close)


def main() -> int:
    """The ``couler-optimizer`` console script."""
    return service_main("optimizer", OptimizerSettings, build)


if __name__ == "__main__":
    sys.exit(main())
