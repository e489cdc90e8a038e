"""The cache service in-process against real NATS, SQLite / PostgreSQL and local / S3 blobs.

The service runs as in production -- ``serve(settings, build)`` with its gRPC server on
127.0.0.1:0 and its durable consumer ``cache`` on JetStream -- on an asyncio loop in a
thread; the tests call it with the blocking ``CoulerClient``, put artifact blobs in the
store as the submitter does, and publish step events with a bus of their own. Only one
cache instance runs at a time, because instances share the durable consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import nats
import nats.js.errors
import pytest
from google.protobuf.message import Message

from couler.errors import UserError
from couler.v1 import common_pb2, events_pb2
from couler_cache.events import DURABLE, SUCCEEDED, OutboxPublisher
from couler_cache.main import CacheSettings, DigestBlobs, build
from couler_cache.policy import EvictionPolicy
from couler_cache.service import COMMITTED, EVICTED
from couler_cache.service import Cache as CacheUseCases
from couler_cache.store import MIGRATIONS, CacheStore
from couler_runtime.blobs import LocalBlobStore, open_blob_store
from couler_runtime.bus import Bus
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import CacheEntry, CommitResult, StoredArtifact
from couler_runtime.service import READY_PREFIX
from couler_runtime.settings import SettingsError
from couler_runtime.store import make_engine, migrate
from tests.servers import NatsServer, SeaweedS3, scratch_database
from tests.service_thread import Builder
from tests.service_thread import ServiceThread as RunningService
from tests.unit.test_cache_outbox import FlakyBlobs
from tests.unit.test_cache_policy import Clock, SizeBlobs, populate_version_1

WAIT = 60.0  # a bound on waiting, never an assertion about speed


# ----------------------------------------------------------------------------- harness


def ServiceThread(settings: CacheSettings,
                  builder: Builder = build
                  ) -> RunningService[CacheSettings]:
    """The cache service running in a thread (tests/service_thread.py)."""
    return RunningService(settings, builder)


@dataclass
class Cache:
    """A running cache service, a client for it, and the artifact store it uses."""

    settings: CacheSettings
    service: ServiceThread
    client: CoulerClient
    blobs: DigestBlobs

    def put(self, data: bytes) -> StoredArtifact:
        """Store ``data`` as the submitter does; its content-addressed reference."""
        stored_key = self.blobs.store.put_bytes(data)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        assert stored_key == self.blobs.key(digest)
        return StoredArtifact(digest, len(data), f"{self.settings.artifacts}/{stored_key}")


Starter = Callable[..., Cache]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh empty database: a SQLite file, or a new database in the session's cluster."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state' / 'cache.db'}"
        return
    with scratch_database(request.getfixturevalue("postgres_url"), "cache") as url:
        yield url


@pytest.fixture(params=["local", "s3"])
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Artifact-store settings: a local directory, or a fresh prefix on SeaweedFS."""
    if request.param == "local":
        return {"artifacts": str(tmp_path / "artifacts")}
    s3: SeaweedS3 = request.getfixturevalue("s3_server")
    return {"artifacts": f"s3://couler-cache-test/{uuid.uuid4().hex[:12]}",
            "s3_endpoint": s3.endpoint, "s3_access_key": s3.access_key,
            "s3_secret_key": s3.secret_key}


@pytest.fixture
def start(nats_server: NatsServer, tmp_path: Path) -> Iterator[Starter]:
    """Start a cache service (stopped at teardown): ``start(database_url=..., ...)``."""
    running: list[Cache] = []
    # The session's NATS carries other modules' step events; this module's caches start
    # from an empty step stream so that only its own commits are counted.
    asyncio.run(_purge_steps(nats_server.url))

    def starter(**overrides: Any) -> Cache:
        values: dict[str, Any] = {
            "nats_url": nats_server.url, "grpc_address": "127.0.0.1:0",
            "state_dir": tmp_path / "state", "auth_token": None, "otel_endpoint": None,
            "bus_insecure": True,  # the logic on an open bus: see test_bus_security.py
            **overrides}
        settings = CacheSettings.load("cache", **values)
        service = ServiceThread(settings).start()
        cache = Cache(settings, service, CoulerClient({"cache": service.address}, timeout=WAIT),
                      DigestBlobs(open_blob_store(settings)))
        running.append(cache)
        return cache

    yield starter
    for cache in running:
        cache.client.close()
        cache.service.stop()


async def _purge_steps(url: str) -> None:
    nc = await nats.connect(url)
    try:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream().purge_stream("COULER_STEP")
    finally:
        await nc.close()


def stop(cache: Cache) -> None:
    cache.client.close()
    cache.service.stop()


def key() -> str:
    return "sha256:" + uuid.uuid4().hex * 2


def entry(k: str, *, step: str = "train", outputs: dict[str, str] | None = None,
          **artifacts: StoredArtifact) -> CacheEntry:
    return CacheEntry(key=k, workflow="wf", step=step, outputs=outputs or {},
                      artifacts=artifacts)


# ----------------------------------------------------------------------------- event taps


@dataclass
class Tap:
    """Cache events seen on core NATS while a block ran."""

    events: list[tuple[str, Any, dict[str, str]]] = field(default_factory=list)

    def of(self, subject: str) -> list[tuple[Any, dict[str, str]]]:
        return [(body, headers) for s, body, headers in self.events if s == subject]


class Publisher:
    """Publishes step events and collects cache events, on a loop in a thread of its own."""

    TERMINATED = f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.COULER_STEP.{DURABLE}"

    def __init__(self, nats: NatsServer) -> None:
        self.terminated: set[int] = set()  # stream sequences the cache's consumer terminated
        self.sequences: list[int] = []  # of the step events published, in order
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tap", daemon=True)
        self._thread.start()
        self.tap = Tap()
        self._bus: Bus = self._call(Bus.connect(nats.url, name="cache-test"))
        self._subs = [self._call(self._bus.client.subscribe(s, cb=self._collect))
                      for s in (COMMITTED, EVICTED)]
        self._subs.append(self._call(self._bus.client.subscribe(self.TERMINATED,
                                                                cb=self._terminated)))

    async def _terminated(self, msg: Any) -> None:
        self.terminated.add(json.loads(msg.data)["stream_seq"])

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(WAIT)

    async def _collect(self, msg: Any) -> None:
        types: dict[str, type[Message]] = {COMMITTED: events_pb2.CacheCommitted,
                                           EVICTED: events_pb2.CacheEvicted}
        body = types[msg.subject]()
        body.ParseFromString(msg.data)
        self.tap.events.append((msg.subject, body,
                                dict(msg.headers or {})))

    def publish(self, events: Sequence[tuple[events_pb2.StepEvent, str]]) -> None:
        """Publish ``(event, msg_id)`` in order and wait until the consumer handled them all."""
        self._call(self._publish(events))

    async def _publish(self, events: Sequence[tuple[events_pb2.StepEvent, str]]) -> None:
        await self._bus.ensure_streams()
        last = 0
        for event, msg_id in events:
            seq = (await self._bus.publish(SUCCEEDED, event, msg_id=msg_id)).sequence
            self.sequences.append(seq)
            last = max(last, seq)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:  # the ack follows the commit: wait for it (a bound, not a timing)
            info = await self._bus.jetstream.consumer_info("COULER_STEP", DURABLE)
            if info.ack_floor is not None and info.ack_floor.stream_seq >= last:
                break
            assert loop.time() < deadline, "step events never acked"
            await asyncio.sleep(0.02)
        await self._bus.client.flush()

    def wait_for(self, what: Callable[[Tap], bool]) -> None:
        """Wait until the tap satisfies ``what`` (bounded)."""
        async def waiting() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT
            while not what(self.tap):
                assert loop.time() < deadline, f"cache events never arrived: {self.tap.events}"
                await asyncio.sleep(0.02)
            await self._bus.client.flush()
        self._call(waiting())

    def close(self) -> None:
        for sub in self._subs:
            self._call(sub.unsubscribe())
        self._call(self._bus.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT)
        self._loop.close()


@pytest.fixture
def publisher(nats_server: NatsServer) -> Iterator[Publisher]:
    pub = Publisher(nats_server)
    yield pub
    pub.close()


def step_event(k: str, *, run_id: str = "run-1", step: str = "train",
               state: common_pb2.StepState = common_pb2.STEP_STATE_SUCCEEDED,
               outputs: dict[str, str] | None = None,
               artifacts: dict[str, StoredArtifact] | None = None,
               ran: tuple[int, int] | None = None,
               lineage: Sequence[str] = ()) -> events_pb2.StepEvent:
    event = events_pb2.StepEvent(
        run_id=run_id, workflow="wf", engine="local",
        step=common_pb2.StepRecord(
            name=step, state=state, attempts=1, cache_key=k, outputs=outputs or {},
            artifacts={n: common_pb2.StoredArtifact(digest=a.digest, size_bytes=a.size_bytes,
                                                    uri=a.uri)
                       for n, a in (artifacts or {}).items()},
            cache_lineage=list(lineage)))
    if ran is not None:  # start and end, in milliseconds
        event.step.started_at.FromMilliseconds(ran[0])
        event.step.finished_at.FromMilliseconds(ran[1])
    return event


# ----------------------------------------------------------------------------- gRPC


def test_commit_lookup_stats_evict(start: Starter, db_url: str,
                                   artifacts: dict[str, Any]) -> None:
    cache = start(database_url=db_url, **artifacts)
    c = cache.client.cache
    model = cache.put(b"model weights " * 100)
    report = cache.put(b"a report")
    a, b, unknown = key(), key(), key()

    got = c.commit(entry(a, outputs={"accuracy": "0.93"}, model=model))
    assert got.created and got.evicted == ()
    # A declared size is checked against the store: the store's size counts.
    assert c.commit(entry(b, step="evaluate",
                          report=StoredArtifact(report.digest, 1, report.uri))).created

    found = c.lookup([unknown, a, b])
    assert list(found.entries) == [a, b]
    assert found.missing == (unknown,)
    ea = found.entries[a]
    assert (ea.workflow, ea.step, dict(ea.outputs)) == ("wf", "train", {"accuracy": "0.93"})
    assert ea.artifacts == {"model": model}
    assert ea.size_bytes == len("accuracy") + len("0.93") + model.size_bytes
    assert ea.hits == 1 and ea.created_at is not None and ea.last_used_at is not None
    assert ea.last_used_at >= ea.created_at
    assert found.entries[b].size_bytes == report.size_bytes

    stats = c.stats()
    assert (stats.entries, stats.bytes) == (2, ea.size_bytes + report.size_bytes)
    assert (stats.hits, stats.misses, stats.evictions) == (2, 1, 0)
    assert stats.budget_bytes == 10 * 1024**3

    gone = c.evict([a, unknown])
    assert gone.evicted == (a,) and gone.freed_bytes == ea.size_bytes
    assert not cache.blobs.exists(model.digest)  # no other entry referenced it
    assert cache.blobs.exists(report.digest)
    assert c.lookup([a]).missing == (a,)

    # By bytes: LRU until at least free_bytes are freed.
    gone = c.evict(free_bytes=1)
    assert gone.evicted == (b,) and gone.freed_bytes == report.size_bytes
    assert not cache.blobs.exists(report.digest)
    stats = c.stats()
    assert (stats.entries, stats.bytes, stats.evictions) == (0, 0, 2)
    assert (stats.hits, stats.misses) == (2, 2)


def test_bad_entries_are_refused_by_name(start: Starter, tmp_path: Path) -> None:
    cache = start(artifacts=str(tmp_path / "blobs"))
    c = cache.client.cache
    with pytest.raises(UserError, match=r"step 'train', field 'artifacts\[model\].digest'") \
            as caught:
        c.commit(entry(key(), model=StoredArtifact("md5:abc", 3)))
    cause = caught.value.__cause__
    assert isinstance(cause, grpc.RpcError)
    assert cause.code() is grpc.StatusCode.INVALID_ARGUMENT
    absent = "sha256:" + hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(UserError, match=r"field 'artifacts\[model\]'.*not in the artifact"):
        c.commit(entry(key(), model=StoredArtifact(absent, 12)))
    with pytest.raises(UserError, match="field 'key'"):
        c.commit(entry(""))
    with pytest.raises(UserError, match="free_bytes"):
        c.evict(free_bytes=-1)
    # The service stays up and nothing was stored.
    assert c.stats().entries == 0


def test_commit_is_idempotent(start: Starter, tmp_path: Path) -> None:
    cache = start(artifacts=str(tmp_path / "blobs"))
    c = cache.client.cache
    k = key()
    first = cache.put(b"first")
    assert c.commit(entry(k, outputs={"v": "1"}, out=first)).created
    second = cache.put(b"second result")
    again = c.commit(entry(k, outputs={"v": "2"}, out=second))
    assert not again.created and again.evicted == ()
    got = c.lookup([k]).entries[k]
    assert dict(got.outputs) == {"v": "1"} and got.artifacts == {"out": first}
    assert c.stats().entries == 1


def test_concurrent_commits(start: Starter, db_url: str, tmp_path: Path) -> None:
    """Many callers at once: one entry per key, and the budget holds afterwards."""
    cache = start(database_url=db_url, artifacts=str(tmp_path / "blobs"),
                  cache_budget_bytes=500)
    c = cache.client.cache
    same = key()
    arts = [cache.put(f"result {i}".encode() * 10) for i in range(12)]

    def commit_new(art: StoredArtifact) -> tuple[str, CommitResult]:
        k = key()
        return k, c.commit(entry(k, out=art))

    with ThreadPoolExecutor(max_workers=8) as pool:
        created = list(pool.map(lambda a: c.commit(entry(same, out=a)).created, arts[:8]))
        assert created.count(True) == 1
        others = list(pool.map(commit_new, arts))
    # Each fits the budget alone and nothing is pinned: every one is admitted.
    assert all(r.created and k not in r.evicted for k, r in others)
    stats = c.stats()
    assert stats.bytes <= 500
    assert stats.entries + stats.evictions == 13


def test_lru_eviction_under_a_small_budget(start: Starter, tmp_path: Path) -> None:
    cache = start(artifacts=str(tmp_path / "blobs"), cache_budget_bytes=350,
                  cache_policy="lru")
    c = cache.client.cache
    keys = [key() for _ in range(4)]
    arts = [cache.put(bytes([i]) * 100) for i in range(4)]
    for k, art in zip(keys[:3], arts[:3], strict=True):
        assert c.commit(entry(k, out=art)) .evicted == ()
    # Touch the oldest: the second is now the least recently used.
    assert list(c.lookup([keys[0]]).entries) == [keys[0]]
    got = c.commit(entry(keys[3], out=arts[3]))
    assert got.created and got.evicted == (keys[1],)
    assert not cache.blobs.exists(arts[1].digest)
    found = c.lookup(keys)
    assert set(found.entries) == {keys[0], keys[2], keys[3]}
    assert found.missing == (keys[1],)
    stats = c.stats()
    assert (stats.entries, stats.bytes, stats.evictions, stats.budget_bytes) == (3, 300, 1, 350)

    # An entry that alone exceeds the budget is refused; nothing else is evicted for it.
    huge = cache.put(b"x" * 400)
    big = key()
    refused = c.commit(entry(big, out=huge))
    assert not refused.created and refused.evicted == (big,)
    assert c.lookup([big]).missing == (big,)
    assert c.stats().entries == 3
    assert cache.blobs.exists(huge.digest)  # never indexed: not the cache's to delete


def test_shared_blob_is_deleted_with_its_last_entry(start: Starter,
                                                    artifacts: dict[str, Any]) -> None:
    cache = start(**artifacts)
    c = cache.client.cache
    shared = cache.put(b"the same preprocessed table")
    one, two = key(), key()
    assert c.commit(entry(one, step="prep-a", table=shared)).created
    assert c.commit(entry(two, step="prep-b", data=shared)).created
    assert c.evict([one]).evicted == (one,)
    assert cache.blobs.exists(shared.digest)  # still referenced by `two`
    assert list(c.lookup([two]).entries) == [two]
    assert c.evict([two]).evicted == (two,)
    assert not cache.blobs.exists(shared.digest)


def test_entry_whose_blob_is_gone_is_dropped(start: Starter, tmp_path: Path) -> None:
    cache = start(artifacts=str(tmp_path / "blobs"))
    c = cache.client.cache
    art, other = cache.put(b"will vanish"), cache.put(b"stays with the entry")
    k = key()
    assert c.commit(entry(k, out=art, log=other)).created
    cache.blobs.delete(art.digest)  # someone emptied the store behind the cache's back
    found = c.lookup([k])
    assert found.entries == {} and found.missing == (k,)
    stats = c.stats()
    assert (stats.entries, stats.hits, stats.misses) == (0, 0, 1)
    assert not cache.blobs.exists(other.digest)  # the dropped entry's other blob went too
    # The key can be committed again.
    assert c.commit(entry(k, out=cache.put(b"will vanish"), log=cache.put(b"again"))).created


def test_a_peek_counts_nothing_and_changes_no_entry(start: Starter, db_url: str,
                                                   tmp_path: Path) -> None:
    """The planner peeks to find entries, then looks up only those it uses."""
    cache = start(database_url=db_url, artifacts=str(tmp_path / "blobs"))
    c = cache.client.cache
    k, unknown = key(), key()
    assert c.commit(entry(k, outputs={"v": "1"})).created
    before = c.show(k)
    peeked = c.lookup([k, unknown], peek=True)
    assert list(peeked.entries) == [k] and peeked.missing == (unknown,)
    assert peeked.entries[k].hits == 0
    after = c.show(k)
    assert (after.entry.hits, after.entry.last_used_at) == (
        before.entry.hits, before.entry.last_used_at)
    assert (c.stats().hits, c.stats().misses) == (0, 0)
    assert c.lookup([k, unknown]).entries[k].hits == 1  # the use is counted
    assert (c.stats().hits, c.stats().misses) == (1, 1)


def test_max_age_reports_old_entries_missing(start: Starter, tmp_path: Path) -> None:
    cache = start(artifacts=str(tmp_path / "blobs"))
    c = cache.client.cache
    k = key()
    assert c.commit(entry(k, outputs={"v": "1"})).created
    assert list(c.lookup([k], max_age_seconds=3600).entries) == [k]
    with pytest.raises(UserError, match="max_age_seconds"):
        c.lookup([k], max_age_seconds=-1)


# ----------------------------------------------------------------------------- events


def test_step_succeeded_event_commits_once(start: Starter, publisher: Publisher,
                                           db_url: str, tmp_path: Path) -> None:
    cache = start(database_url=db_url, artifacts=str(tmp_path / "blobs"))
    c = cache.client.cache
    art = cache.put(b"trained model")
    k, failed, plain, marker = key(), key(), "", key()
    run = f"run-{uuid.uuid4().hex[:8]}"  # msg ids unique per test (one NATS per session)
    ok = step_event(k, run_id=run, outputs={"acc": "0.9"}, artifacts={"model": art})
    publisher.publish([
        (ok, f"{run}.train..1.succeeded"),
        (ok, f"{run}.train..1.succeeded"),        # a republish: dropped by JetStream
        (ok, f"{run}.train..1.succeeded.again"),  # a redelivery under another id
        (step_event(k, run_id=f"{run}-b", outputs={"acc": "0.1"}),
         f"{run}-b.train..1.succeeded"),          # another run, same key: the first wins
        (step_event(failed, state=common_pb2.STEP_STATE_FAILED), f"{run}-c.train..1.failed"),
        (step_event(plain, run_id=f"{run}-d"), f"{run}-d.train..1.succeeded"),
        (step_event(marker, run_id=f"{run}-e", step="eval"), f"{run}-e.eval..1.succeeded"),
    ])
    found = c.lookup([k, failed, marker])
    assert list(found.entries) == [k, marker]
    assert found.missing == (failed,)
    got = found.entries[k]
    assert (got.workflow, got.step, dict(got.outputs)) == ("wf", "train", {"acc": "0.9"})
    assert got.artifacts == {"model": art}
    assert c.stats().entries == 2
    publisher.wait_for(lambda tap: {b.key for b, _ in tap.of(COMMITTED)} >= {k, marker})
    committed = [(b, h) for b, h in publisher.tap.of(COMMITTED) if b.key == k]
    assert len(committed) == 1
    body, headers = committed[0]
    assert headers["Nats-Msg-Id"] == f"{k}.committed"
    assert (body.workflow, body.step, body.size_bytes) == ("wf", "train", got.size_bytes)


def test_step_event_gives_the_entry_its_cost_and_lineage(
        start: Starter, publisher: Publisher, db_url: str, tmp_path: Path) -> None:
    cache = start(database_url=db_url, artifacts=str(tmp_path / "blobs"))
    prep, train = key(), key()
    run = f"run-{uuid.uuid4().hex[:8]}"
    publisher.publish([
        (step_event(prep, run_id=run, step="prep",
                    ran=(1_800_000_000_000, 1_800_000_600_250)), f"{run}.prep..1.succeeded"),
        (step_event(train, run_id=run, ran=(1_800_000_601_000, 1_800_004_201_000),
                    lineage=[prep]), f"{run}.train..1.succeeded"),
    ])
    found = cache.client.cache.lookup([prep, train]).entries
    assert (found[prep].cost_seconds, found[prep].lineage) == (600.25, ())
    assert (found[train].cost_seconds, found[train].lineage) == (3600.0, (prep,))
    assert not found[train].pinned


def test_pin_keeps_an_entry_through_budget_eviction(start: Starter, db_url: str,
                                                   tmp_path: Path) -> None:
    cache = start(database_url=db_url, artifacts=str(tmp_path / "blobs"),
                  cache_budget_bytes=250, cache_policy="lru")
    c = cache.client.cache
    oldest, other, newest, unknown = key(), key(), key(), key()
    assert c.commit(entry(oldest, out=cache.put(b"a" * 100))).created
    assert c.commit(entry(other, out=cache.put(b"b" * 100))).created
    pinned = c.pin([oldest, unknown])
    assert pinned.keys == (oldest,) and pinned.missing == (unknown,)
    assert c.commit(entry(newest, out=cache.put(b"c" * 100))).evicted == (other,)
    assert c.lookup([oldest]).entries[oldest].pinned
    assert c.pin([oldest], pinned=False).keys == (oldest,)
    assert not c.lookup([oldest]).entries[oldest].pinned
    with pytest.raises(UserError, match="field 'keys'"):
        c.pin([""])


def test_an_evicted_entrys_metadata_is_kept(start: Starter, db_url: str,
                                            tmp_path: Path) -> None:
    """Its bytes go; what it was -- outputs, digests, size, cost, lineage -- stays, so
    ``Show`` still answers and its descendants' value counts its cost."""
    cache = start(database_url=db_url, artifacts=str(tmp_path / "blobs"))
    c = cache.client.cache
    parent, child = key(), key()
    model = cache.put(b"weights" * 50)
    assert c.commit(replace(entry(parent, outputs={"auc": "0.9"}, model=model),
                            cost_seconds=120.0)).created
    assert c.commit(replace(entry(child, outputs={"n": "1"}), lineage=(parent,))).created
    assert c.evict([parent]).evicted == (parent,)
    assert not cache.blobs.exists(model.digest)  # the bytes are gone
    assert c.lookup([parent]).missing == (parent,)
    shown = c.show(parent[:20])  # a prefix names it too
    assert shown.evicted_at is not None and shown.entry.key == parent
    assert dict(shown.entry.outputs) == {"auc": "0.9"} and shown.entry.cost_seconds == 120.0
    assert shown.entry.artifacts["model"].digest == model.digest
    assert c.show(child).evicted_at is None  # still cached


def test_the_migration_keeps_an_existing_index(db_url: str) -> None:
    """Rows written by revision cache_0001 are read, priced and evicted after the upgrade
    (SQLite and PostgreSQL alter tables differently)."""
    engine = make_engine(db_url)
    try:
        migrate(engine, "cache", MIGRATIONS, target="cache_0001")
        populate_version_1(engine)
    finally:
        engine.dispose()
    store = CacheStore.open(db_url)
    blobs = SizeBlobs()
    for name in ("old", "older"):
        blobs.put(name, 100)

    async def use() -> None:
        cache = CacheUseCases(store, blobs, budget_bytes=250, retry_interval=3600,
                              clock=Clock())  # after the rows were written
        try:
            await cache.start()
            found = (await cache.lookup(["old", "older"])).entries
            assert (found["old"].hits, found["old"].cost_seconds, found["old"].pinned) == \
                (4, 0.0, False)
            fresh = blobs.put("fresh", 100)
            got = await cache.commit(CacheEntry("fresh", artifacts={"out": fresh},
                                                cost_seconds=5))
            assert got.created and got.evicted == ("older",)
        finally:
            await cache.close()

    try:
        asyncio.run(use())
    finally:
        store.close()


def test_bad_step_event_is_terminated_and_the_service_stays_up(
        start: Starter, publisher: Publisher, tmp_path: Path) -> None:
    cache = start(artifacts=str(tmp_path / "blobs"))
    bad = step_event(key(), artifacts={"model": StoredArtifact("sha256:nothex", 1)})
    good = key()
    publisher.publish([(bad, f"bad-{uuid.uuid4().hex}"),
                       (step_event(good), f"good-{uuid.uuid4().hex}")])
    assert list(cache.client.cache.lookup([good]).entries) == [good]
    assert cache.client.cache.stats().entries == 1
    bad_seq, good_seq = publisher.sequences[-2:]
    assert bad_seq in publisher.terminated  # bad input: terminated, not retried
    assert good_seq not in publisher.terminated


def test_budget_eviction_is_announced(start: Starter, publisher: Publisher,
                                      tmp_path: Path) -> None:
    cache = start(artifacts=str(tmp_path / "blobs"), cache_budget_bytes=150)
    c = cache.client.cache
    old, new = key(), key()
    assert c.commit(entry(old, out=cache.put(b"o" * 100))).created
    assert c.commit(entry(new, out=cache.put(b"n" * 100))).evicted == (old,)
    publisher.wait_for(lambda tap: any(old in b.keys for b, _ in tap.of(EVICTED)))
    [(body, headers)] = [(b, h) for b, h in publisher.tap.of(EVICTED) if old in b.keys]
    assert list(body.keys) == [old] and body.freed_bytes == 100 and body.reason == "budget"
    assert headers["Nats-Msg-Id"] == old
    assert c.evict([new]).freed_bytes == 100
    publisher.wait_for(lambda tap: any(new in b.keys for b, _ in tap.of(EVICTED)))
    [(body, _)] = [(b, h) for b, h in publisher.tap.of(EVICTED) if new in b.keys]
    assert body.reason == "request"


# ----------------------------------------------------------------------------- restart


def test_restart_keeps_index_and_counters(start: Starter, db_url: str,
                                          artifacts: dict[str, Any]) -> None:
    settings = {"database_url": db_url, **artifacts, "cache_budget_bytes": 1000}
    first = start(**settings)
    c = first.client.cache
    kept, evicted = key(), key()
    art = first.put(b"kept across restarts")
    assert c.commit(entry(kept, outputs={"v": "1"}, out=art)).created
    assert c.commit(entry(evicted, outputs={"v": "2"})).created
    c.lookup([kept, key()])
    c.evict([evicted])
    before = c.stats()
    assert (before.entries, before.hits, before.misses, before.evictions) == (1, 1, 1, 1)
    stop(first)

    second = start(**settings)
    c = second.client.cache
    assert c.stats() == before
    found = c.lookup([kept])
    assert found.entries[kept].artifacts == {"out": art}
    assert found.entries[kept].hits == 2
    assert not c.commit(entry(kept, outputs={"v": "other"})).created
    after = c.stats()
    assert (after.hits, after.misses, after.evictions) == (2, 1, 1)


# ----------------------------------------------------------------------------- durability


def test_side_effects_survive_a_bus_down_and_a_restart(db_url: str, tmp_path: Path,
                                                       nats_server: NatsServer) -> None:
    """The events a process could not publish (its bus connection closed) and the blobs it
    could not delete are queued with the index change; the next process, on a real bus,
    publishes them to JetStream and deletes them. The use cases with a fake of the publish
    port, on SQLite, are tests/unit/test_cache_outbox.py."""
    blobs = DigestBlobs(LocalBlobStore(tmp_path / "blobs"))
    data = b"model bytes " + uuid.uuid4().hex.encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    art = StoredArtifact(digest, len(data), "file:///x")
    k = key()

    async def first_process() -> None:
        bus = await Bus.connect(nats_server.url, name="cache-first")
        await bus.close()  # the bus is gone: every publish fails (RetryableError)
        store = CacheStore.open(db_url)
        flaky = FlakyBlobs(blobs)
        cache = CacheUseCases(store, flaky, budget_bytes=0, publish=OutboxPublisher(bus),
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

    async def second_process() -> tuple[list[tuple[str, str]], list[str]]:
        bus = await Bus.connect(nats_server.url, name="cache-second")
        seen: list[tuple[str, str]] = []
        both = asyncio.Event()

        async def collect(msg: Any) -> None:
            body = (events_pb2.CacheCommitted if msg.subject == COMMITTED
                    else events_pb2.CacheEvicted).FromString(msg.data)
            if k in (getattr(body, "key", ""), *getattr(body, "keys", ())):
                seen.append((msg.subject, (msg.headers or {}).get("Nats-Msg-Id", "")))
            if len(seen) == 2:
                both.set()

        subs = [await bus.client.subscribe(s, cb=collect) for s in (COMMITTED, EVICTED)]
        await bus.ensure_streams()
        store = CacheStore.open(db_url)
        cache = CacheUseCases(store, blobs, budget_bytes=0, publish=OutboxPublisher(bus))
        try:
            await cache.start()
            stats = await cache.stats()
            assert (stats.entries, stats.evictions) == (0, 1)
            assert await cache.evicted_bytes() == len(data)
            await asyncio.wait_for(both.wait(), WAIT)
            return seen, [bus.msg_id(COMMITTED, f"{k}.committed"), bus.msg_id(EVICTED, k)]
        finally:
            await cache.close()
            store.close()
            for sub in subs:
                await sub.unsubscribe()
            await bus.close()

    asyncio.run(first_process())
    assert blobs.exists(digest)  # the delete failed: still queued
    seen, ids = asyncio.run(second_process())
    assert not blobs.exists(digest)
    assert seen == [(COMMITTED, ids[0]), (EVICTED, ids[1])]


# ----------------------------------------------------------------------------- process


def cache_env(nats: NatsServer, state: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    env.update({"COULER_NATS_URL": nats.url, "COULER_GRPC_ADDRESS": "127.0.0.1:0",
                "COULER_STATE_DIR": str(state), "COULER_BUS_INSECURE": "true", **extra})
    return env


def test_process_serves_until_sigterm(nats_server: NatsServer, tmp_path: Path) -> None:
    """``python -m couler_cache.main`` (how ``couler up`` starts it): READY, serves, stops."""
    proc = subprocess.Popen([sys.executable, "-m", "couler_cache.main"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env=cache_env(nats_server, tmp_path, COULER_CACHE_BUDGET_BYTES="1234"))
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True)
    reader.start()
    with proc:
        try:
            prefix, service, address = lines.get(timeout=WAIT).split()
            assert (prefix, service) == (READY_PREFIX, "cache")
            with CoulerClient({"cache": address}, timeout=WAIT) as client:
                assert client.cache.commit(entry(key(), outputs={"v": "1"})).created
                stats = client.cache.stats()
                assert (stats.entries, stats.budget_bytes) == (1, 1234)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(WAIT)
            reader.join(WAIT)
    assert code == 0
    assert (tmp_path / "cache.db").is_file()  # the default index: SQLite in the state dir


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("COULER_CACHE_BUDGET_BYTES", "lots", "COULER_CACHE_BUDGET_BYTES"),
    ("COULER_CACHE_POLICY", "lfu", "COULER_CACHE_POLICY: unknown cache eviction policy 'lfu': "
                                   "choose one of value, lru, fifo, gdsf"),
])
def test_bad_settings_exit_2_naming_the_variable(nats_server: NatsServer, tmp_path: Path,
                                                 variable: str, value: str, said: str) -> None:
    env = cache_env(nats_server, tmp_path, **{variable: value})
    done = subprocess.run([sys.executable, "-m", "couler_cache.main"], env=env,
                          capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 2
    assert said in done.stderr


# ----------------------------------------------------------------------------- settings


def test_budget_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COULER_CACHE_BUDGET_BYTES", "4096")
    assert CacheSettings.load("cache", state_dir=tmp_path).cache_budget_bytes == 4096
    monkeypatch.setenv("COULER_CACHE_BUDGET_BYTES", "-1")
    with pytest.raises(SettingsError, match="COULER_CACHE_BUDGET_BYTES"):
        CacheSettings.load("cache", state_dir=tmp_path)
    monkeypatch.delenv("COULER_CACHE_BUDGET_BYTES")
    assert CacheSettings.load("cache", state_dir=tmp_path).cache_budget_bytes == 10 * 1024**3


@pytest.mark.parametrize(("value", "policy"), [("", EvictionPolicy.VALUE),
                                               ("value", EvictionPolicy.VALUE),
                                               ("lru", EvictionPolicy.LRU),
                                               ("FIFO", EvictionPolicy.FIFO),
                                               ("gdsf", EvictionPolicy.GDSF)])
def test_policy_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str,
                        policy: EvictionPolicy) -> None:
    if value:
        monkeypatch.setenv("COULER_CACHE_POLICY", value)
    settings = CacheSettings.load("cache", state_dir=tmp_path)
    assert settings.cache_policy is policy
    assert settings.cache_half_life_seconds == 86400.0
    monkeypatch.setenv("COULER_CACHE_HALF_LIFE_SECONDS", "0")
    with pytest.raises(SettingsError, match="COULER_CACHE_HALF_LIFE_SECONDS"):
        CacheSettings.load("cache", state_dir=tmp_path)
