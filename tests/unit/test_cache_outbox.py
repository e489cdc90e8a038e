"""The cache's use cases (couler_cache.service.Cache): side effects that outlive a process.

The cache publishes its events (committed, evicted) through a port of its own -- an async
``publish(subject, msg_id, payload)``, the bus in production -- and deletes blobs through
the artifact store. Here the port is :class:`FakeEventPort`, a fake of it that records what
was published or fails as an unreachable bus does; the artifact store is a real local one,
wrapped to fail its deletes (:class:`FlakyBlobs`). The index is SQLite and PostgreSQL. The
service with its events on a real nats-server is tests/integration/test_cache_service.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from pathlib import Path

from couler.errors import RetryableError
from couler_cache.main import DigestBlobs
from couler_cache.service import COMMITTED, EVICTED
from couler_cache.service import Cache as CacheUseCases
from couler_cache.store import CacheStore
from couler_runtime.blobs import LocalBlobStore
from couler_runtime.rpc.records import CacheEntry, StoredArtifact


def key() -> str:
    return "sha256:" + uuid.uuid4().hex * 2


def entry(k: str, **artifacts: StoredArtifact) -> CacheEntry:
    return CacheEntry(key=k, workflow="wf", step="train", artifacts=artifacts)


class FakeEventPort:
    """A fake of the cache's publish port: records (subject, msg_id) in ``sent``, or
    raises as an unreachable bus does while ``down``."""

    def __init__(self, sent: list[tuple[str, str]], *, down: bool = False) -> None:
        self.sent = sent
        self.down = down

    async def __call__(self, subject: str, msg_id: str, payload: bytes) -> None:
        if self.down:
            raise RetryableError("nats unavailable")
        self.sent.append((subject, msg_id))


class FlakyBlobs:
    """The artifact store, with deletes failing while ``failing`` is set."""

    def __init__(self, blobs: DigestBlobs) -> None:
        self.blobs = blobs
        self.failing = False

    def exists(self, digest: str) -> bool:
        return self.blobs.exists(digest)

    def size(self, digest: str) -> int:
        return self.blobs.size(digest)

    def delete(self, digest: str) -> None:
        if self.failing:
            raise RetryableError("artifact store unavailable")
        self.blobs.delete(digest)


def test_side_effects_survive_failures_and_restarts(tmp_path: Path) -> None:
    """Events that could not be published and blobs that could not be deleted are queued
    with the index change and finished by the next process."""
    db_url = f"sqlite:///{tmp_path / 'cache.db'}"
    blobs = DigestBlobs(LocalBlobStore(tmp_path / "blobs"))
    data = b"model bytes"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    art = StoredArtifact(digest, len(data), "file:///x")
    k = key()
    sent: list[tuple[str, str]] = []
    unreachable, reachable = FakeEventPort(sent, down=True), FakeEventPort(sent)

    async def first_process() -> None:
        store = CacheStore.open(db_url)
        flaky = FlakyBlobs(blobs)
        cache = CacheUseCases(store, flaky, budget_bytes=0, publish=unreachable,
                              retry_interval=3600)
        try:
            await cache.start()
            blobs.store.put_bytes(data)
            assert (await cache.commit(entry(k, out=art))).created
            flaky.failing = True
            assert (await cache.evict([k])).evicted == (k,)
        finally:
            await cache.close()
            store.close()

    async def second_process() -> None:
        store = CacheStore.open(db_url)
        cache = CacheUseCases(store, blobs, budget_bytes=0, publish=reachable)
        try:
            await cache.start()
            stats = await cache.stats()
            assert (stats.entries, stats.evictions) == (0, 1)
            assert await cache.evicted_bytes() == len(data)
        finally:
            await cache.close()
            store.close()

    asyncio.run(first_process())
    assert blobs.exists(digest)  # the delete failed: still queued
    assert sent == []
    asyncio.run(second_process())
    assert not blobs.exists(digest)
    assert sent == [(COMMITTED, f"{k}.committed"), (EVICTED, k)]
