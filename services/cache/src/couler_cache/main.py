"""The cache service's composition root: settings, index, artifact store, servicer, consumer.

Settings (environment, ``COULER_`` prefix): the common ones (:class:`CommonSettings` --
``COULER_DATABASE_URL`` for the index, ``COULER_ARTIFACTS`` and ``COULER_S3_*`` for the
artifact store) plus ``COULER_CACHE_BUDGET_BYTES``, the byte budget eviction keeps the
entries within (default 10 GiB; 0 means unlimited), ``COULER_CACHE_POLICY``, how it chooses
what to evict (``value`` -- the default --, ``lru``, ``fifo`` or ``gdsf``; see
:mod:`couler_cache.policy`), and ``COULER_CACHE_HALF_LIFE_SECONDS``, how fast a use stops
counting under ``value`` (default one day). Every replica of the service must use the same
policy.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from pydantic import Field, field_validator

from couler.errors import UserError
from couler_cache.events import OutboxPublisher, start_consumer
from couler_cache.policy import DEFAULT_HALF_LIFE_SECONDS, EvictionPolicy
from couler_cache.rpc import CacheService
from couler_cache.service import Blobs, Cache
from couler_cache.store import CacheStore
from couler_runtime.blobs import BlobStore, key_for_digest, open_blob_store
from couler_runtime.bus import Bus
from couler_runtime.rpc import CACHE
from couler_runtime.service import Component, service_main
from couler_runtime.settings import CommonSettings

__all__ = ["DEFAULT_BUDGET_BYTES", "CacheSettings", "DigestBlobs", "build", "main", "open_blobs"]

log = logging.getLogger(__name__)

DEFAULT_BUDGET_BYTES = 10 * 1024**3


class CacheSettings(CommonSettings):
    """Settings of the cache service.

    Attributes:
        cache_budget_bytes: Bytes the cached entries (outputs plus artifacts) may occupy;
            entries are evicted by ``cache_policy`` beyond it; 0 means unlimited.
        cache_policy: How entries are chosen for eviction: ``value``, ``lru``, ``fifo`` or
            ``gdsf``.
        cache_half_life_seconds: After how long a use of an entry counts half (``value``).
    """

    cache_budget_bytes: int = Field(default=DEFAULT_BUDGET_BYTES, ge=0)
    cache_policy: EvictionPolicy = EvictionPolicy.VALUE
    cache_half_life_seconds: float = Field(default=DEFAULT_HALF_LIFE_SECONDS, gt=0,
                                           allow_inf_nan=False)

    @field_validator("cache_policy", mode="before")
    @classmethod
    def _policy(cls, value: object) -> EvictionPolicy:
        if isinstance(value, EvictionPolicy):
            return value
        try:
            return EvictionPolicy.parse(str(value))
        except UserError as exc:
            raise ValueError(str(exc)) from None


class DigestBlobs:
    """The shared artifact store addressed by digest (``sha256:<hex>``), as the cache needs.

    Args:
        store: The artifact store (keys ``sha256/<hex>``).
    """

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"DigestBlobs({self.store!r})"

    @staticmethod
    def key(digest: str) -> str:
        """The store's key of the blob with ``digest``."""
        algorithm, _, hex_digest = digest.partition(":")
        if algorithm != "sha256" or not hex_digest:
            raise UserError(f"not a content digest: {digest!r} (expected 'sha256:<hex>')")
        return key_for_digest(hex_digest)

    def exists(self, digest: str) -> bool:
        """Whether the blob with ``digest`` is stored."""
        return self.store.exists(self.key(digest))

    def size(self, digest: str) -> int:
        """The stored blob's size in bytes; raises NotFoundError when it is not stored."""
        return self.store.size(self.key(digest))

    def delete(self, digest: str) -> None:
        """Remove the blob with ``digest`` (no error when it is already gone)."""
        self.store.delete(self.key(digest))


def open_blobs(settings: CacheSettings) -> Blobs:
    """The artifact store named by the settings (a local directory or S3), by digest."""
    return DigestBlobs(open_blob_store(settings))


async def build(settings: CacheSettings, bus: Bus) -> Component:
    """Wire the cache: migrate and open the index, the artifact store, servicer, consumer."""
    store = await asyncio.to_thread(CacheStore.open, settings.database_url)
    try:
        blobs = await asyncio.to_thread(open_blobs, settings)
        cache = Cache(store, blobs, budget_bytes=settings.cache_budget_bytes,
                      policy=settings.cache_policy,
                      half_life_seconds=settings.cache_half_life_seconds,
                      publish=OutboxPublisher(bus))
        await cache.start()
    except BaseException:
        store.close()
        raise
    log.info("cache budget: %s, eviction policy %s",
             f"{settings.cache_budget_bytes} bytes" if settings.cache_budget_bytes
             else "unlimited", settings.cache_policy.value)
    try:
        await start_consumer(bus, cache)
    except BaseException:
        await cache.close()
        store.close()
        raise

    async def close() -> None:
        # Runs after the bus stopped its consumers, so no handler still uses the store.
        await cache.close()
        store.close()

    return Component({CACHE: CacheService(cache)}, close)


def main() -> int:
    """The ``couler-cache`` console script; the process exit status."""
    return service_main("cache", CacheSettings, build)


if __name__ == "__main__":
    sys.exit(main())
