"""The cache's use cases: look up, commit, evict and count content-addressed step results.

An entry is what a later run needs to reuse a step instead of running it: its output
parameters and the digests of its output artifacts, whose bytes the submitter already put
in the shared artifact store. The index lives in SQL (:mod:`couler_cache.store`); the cache
deletes a blob only when it evicts the last entry that references its digest.

Eviction keeps the entries within a byte budget (0: unlimited) by a policy
(:mod:`couler_cache.policy`): ``value`` by default -- the compute a reuse saves (the entry's
own cost plus its evicted ancestors'), per byte, times a decayed frequency of use --, or
``lru``, ``fifo`` or ``gdsf``. After a commit, the entries with the lowest priority go until
the total fits again -- never the one just committed, never a pinned one. A commit is refused
instead (``created`` false, its own key in ``evicted``; nothing else is touched) only when
the entry alone exceeds the budget or the pinned entries leave it too little room: a new
entry always gets its place and competes from the next commit on (refusing one worth less
per byte than what it would displace measured worse: ``bench/README.md``). A refused or
evicted key's cost and lineage are remembered, so its cached descendants count it. A lookup
that finds an entry whose blob is gone drops the entry and counts a miss.

Every change and the events announcing it (``couler.cache.committed``,
``couler.cache.evicted``) commit in one transaction (an outbox), and blobs to delete are
queued in the same transaction, so a crash between the index change and its side effects
loses neither: both are finished at the next start. Operations are serialised inside the
process; the synchronous database and artifact-store calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Protocol

from couler.errors import ConflictError, NotFoundError, UserError
from couler.v1 import events_pb2
from couler_cache.policy import (
    DEFAULT_HALF_LIFE_SECONDS,
    EvictionPolicy,
    MemoGraph,
    Pricing,
    cached_below,
    lost_cost,
)
from couler_cache.store import ORDERS, CacheStore, OutboxMessage, Removed, Tx
from couler_runtime import metrics
from couler_runtime.rpc.records import (
    CacheEntry,
    CacheOrder,
    CachePage,
    CacheStats,
    CommitResult,
    EvictResult,
    ListedEntry,
    LookupResult,
    PinResult,
)

__all__ = [
    "COMMITTED",
    "DEFAULT_LINEAGE_LIMIT",
    "EVICTED",
    "MIN_KEY_PREFIX",
    "Blobs",
    "Cache",
    "Publish",
    "entry_size",
]

log = logging.getLogger(__name__)

COMMITTED = "couler.cache.committed"
EVICTED = "couler.cache.evicted"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_KEY = 255
_MAX_LINEAGE = 1000  # parents an entry may name
_QUICK_KEYS = 100  # keys a lookup may look for on the event loop (a quick store)
_RESCORE_BATCH = 500  # entries priced again per transaction at start
DEFAULT_LINEAGE_LIMIT = 100_000  # evicted keys whose cost and lineage are remembered


class Blobs(Protocol):
    """The part of the artifact store the cache uses (blocking calls)."""

    def exists(self, digest: str) -> bool:
        """Whether the blob with ``digest`` is stored."""

    def size(self, digest: str) -> int:
        """The stored blob's size in bytes; raises NotFoundError when it is not stored."""

    def delete(self, digest: str) -> None:
        """Remove the blob with ``digest`` (no error when it is already gone)."""


Publish = Callable[[str, str, bytes], Awaitable[None]]
"""``await publish(subject, msg_id, payload)``: put one serialized event on the bus."""


def entry_size(entry: CacheEntry) -> int:
    """Bytes ``entry`` occupies: its output values (UTF-8) plus its artifacts."""
    outputs = sum(len(name.encode()) + len(value.encode())
                  for name, value in entry.outputs.items())
    return outputs + sum(a.size_bytes for a in entry.artifacts.values())


def _where(entry: CacheEntry, field: str) -> str:
    return f"workflow {entry.workflow!r}, step {entry.step!r}, field {field!r}"


def _validate(entry: CacheEntry) -> None:
    if not entry.key.strip():
        raise UserError(f"cache entry of {_where(entry, 'key')}: the key is empty")
    if len(entry.key) > _MAX_KEY:
        raise UserError(f"cache entry of {_where(entry, 'key')}: the key is longer than "
                        f"{_MAX_KEY} characters")
    if not (math.isfinite(entry.cost_seconds) and entry.cost_seconds >= 0):
        raise UserError(f"cache entry {entry.key!r} of {_where(entry, 'cost_seconds')}: "
                        f"must be a finite number >= 0 (got {entry.cost_seconds})")
    if len(entry.lineage) > _MAX_LINEAGE:
        raise UserError(f"cache entry {entry.key!r} of {_where(entry, 'lineage')}: "
                        f"{len(entry.lineage)} parents (at most {_MAX_LINEAGE})")
    for parent in entry.lineage:
        if not parent.strip() or len(parent) > _MAX_KEY:
            raise UserError(f"cache entry {entry.key!r} of {_where(entry, 'lineage')}: "
                            f"{parent[:80]!r} is not a cache key")
    for name, art in entry.artifacts.items():
        field = f"artifacts[{name}]"
        if not name:
            raise UserError(f"cache entry {entry.key!r} of {_where(entry, 'artifacts')}: "
                            "an artifact has no name")
        if not _DIGEST.fullmatch(art.digest):
            raise UserError(f"cache entry {entry.key!r} of {_where(entry, field + '.digest')}: "
                            f"{art.digest!r} is not a 'sha256:<64 hex digits>' digest")
        if art.size_bytes < 0:
            raise UserError(f"cache entry {entry.key!r} of {_where(entry, field + '.size_bytes')}: "
                            f"negative size {art.size_bytes}")


def _parents(entry: CacheEntry) -> tuple[str, ...]:
    return tuple(sorted(set(entry.lineage) - {entry.key}))


class Cache:
    """The cache service's use cases.

    Args:
        store: The index.
        blobs: The shared artifact store.
        budget_bytes: Bytes the entries may occupy; 0 means unlimited.
        policy: How entries are chosen for eviction (a name or an :class:`EvictionPolicy`).
        half_life_seconds: How fast a use stops counting in the ``value`` policy.
        lineage_limit: Evicted keys whose cost and lineage are remembered (beyond it, the
            oldest that no remembered key descends from are forgotten).
        publish: Publishes outbox events; None keeps them queued (tests, tools).
        clock: Wall-clock seconds (``created_at`` / ``last_used_at``, decay of use).
        retry_interval: Seconds between attempts to publish queued events and delete
            queued blobs after a failure.

    Raises:
        UserError: A negative budget or limit, an unknown policy, a half-life <= 0.
    """

    def __init__(self, store: CacheStore, blobs: Blobs, *, budget_bytes: int,
                 policy: EvictionPolicy | str = EvictionPolicy.VALUE,
                 half_life_seconds: float = DEFAULT_HALF_LIFE_SECONDS,
                 lineage_limit: int = DEFAULT_LINEAGE_LIMIT,
                 publish: Publish | None = None, clock: Callable[[], float] = time.time,
                 retry_interval: float = 5.0) -> None:
        if budget_bytes < 0:
            raise UserError(f"cache budget must be >= 0 bytes (got {budget_bytes})")
        if lineage_limit < 0:
            raise UserError(f"cache lineage limit must be >= 0 (got {lineage_limit})")
        self._store = store
        self._blobs = blobs
        self._budget = budget_bytes
        self._pricing = Pricing(EvictionPolicy.parse(policy), half_life_seconds)
        self._lineage_limit = lineage_limit
        self._publish = publish
        self._clock = clock
        self._retry_interval = retry_interval
        self._lock = asyncio.Lock()
        self._outbox_lock = asyncio.Lock()
        self._closing = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        meter = metrics.meter("couler.cache")
        self._lookups = meter.create_counter(
            "couler.cache.lookups", unit="{key}",
            description="Keys looked up (not peeked): result=hit or miss")
        self._saved_bytes = meter.create_counter(
            "couler.cache.saved", unit="By",
            description="Bytes of the artifacts of the entries found (not produced again)")
        self._saved_compute = meter.create_counter(
            "couler.cache.compute_saved", unit="s",
            description="Compute the entries found took to produce (not spent again)")
        self._commits = meter.create_counter(
            "couler.cache.commits", unit="{entry}",
            description="Entries committed: result=created, present (the first commit "
                        "won) or refused")

    @property
    def budget_bytes(self) -> int:
        """The byte budget (0: unlimited)."""
        return self._budget

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy."""
        return self._pricing.policy

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Price the entries again if the policy or half-life changed since the last start,
        finish what a previous process left (queued events and blobs), keep retrying."""
        self._closing.clear()
        async with self._lock:
            await asyncio.to_thread(self._prepare)
        await self._sweep()
        await self._flush()
        self._worker = asyncio.create_task(self._background(), name="cache-retries")

    async def close(self) -> None:
        """Stop the background work after its current round (the index is durable)."""
        self._closing.set()
        if self._worker is not None:
            await self._worker  # not cancelled: its worker threads must finish with the store
            self._worker = None

    async def _background(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self._retry_interval)
            if self._closing.is_set():
                return
            try:
                await self._sweep()
                await self._flush()
            except Exception as exc:  # logged; the next round tries again
                log.warning("cache background work failed: %s", exc)

    # ------------------------------------------------------------------ use cases

    async def lookup(self, keys: Sequence[str], *, max_age_seconds: int = 0,
                     peek: bool = False) -> LookupResult:
        """The entries for ``keys``; each found key counts a hit, each other one a miss.

        A hit updates the entry's ``last_used_at`` and ``hits`` -- unless ``peek``: a
        planner finding which entries exist before it knows which it will use counts
        nothing and changes no entry (it looks the used ones up again). An entry older than
        ``max_age_seconds`` (when > 0) is reported missing (and kept); one whose artifact
        blob is gone from the store is dropped and reported missing.
        """
        if max_age_seconds < 0:
            raise UserError(f"lookup: field 'max_age_seconds' must be >= 0 "
                            f"(got {max_age_seconds})")
        wanted = list(dict.fromkeys(k for k in keys))
        async with self._lock:
            # A new workflow's keys are all missing: counted on the loop when the store is
            # quick (one short transaction); found entries need the artifact store.
            if wanted and not peek and self._store.quick and len(wanted) <= _QUICK_KEYS and \
                    self._store.count_misses(wanted):
                self._lookups.add(len(wanted), {"result": "miss"})
                return LookupResult({}, tuple(wanted))
            result, dropped = await asyncio.to_thread(self._lookup, wanted, max_age_seconds,
                                                      peek)
        if not peek:
            self._count(result)
        if dropped:
            await self._sweep()
        return result

    def _count(self, result: LookupResult) -> None:
        """Hits and misses of a (not peeked) lookup, and what the hits saved."""
        if result.entries:
            self._lookups.add(len(result.entries), {"result": "hit"})
            self._saved_bytes.add(sum(e.size_bytes for e in result.entries.values()))
            self._saved_compute.add(sum(e.cost_seconds for e in result.entries.values()))
        if result.missing:
            self._lookups.add(len(result.missing), {"result": "miss"})

    async def commit(self, entry: CacheEntry) -> CommitResult:
        """Add ``entry`` unless its key is present (the first commit wins), then keep the budget.

        Artifact sizes are taken from the artifact store and ``entry.size_bytes`` is
        recomputed (:func:`entry_size`).

        Raises:
            UserError: A bad key or artifact digest, or an artifact not in the store
                (the message names the workflow, step and field).
        """
        _validate(entry)
        async with self._lock:
            result = await asyncio.to_thread(self._commit, entry)
        self._commits.add(1, {"result": "created" if result.created else
                              "refused" if result.evicted == (entry.key,) else "present"})
        if result.evicted:
            await self._sweep()
        await self._flush()
        return result

    async def evict(self, keys: Iterable[str] = (), *, free_bytes: int = 0) -> EvictResult:
        """Remove ``keys`` (unknown ones are ignored; pinned ones too: naming a key is
        explicit), then unpinned entries by policy until ``free_bytes`` were freed in
        total."""
        if free_bytes < 0:
            raise UserError(f"evict: field 'free_bytes' must be >= 0 (got {free_bytes})")
        named = list(dict.fromkeys(keys))
        async with self._lock:
            result = await asyncio.to_thread(self._evict, named, free_bytes)
        if result.evicted:
            await self._sweep()
        await self._flush()
        return result

    async def pin(self, keys: Iterable[str], *, pinned: bool = True) -> PinResult:
        """Pin the entries of ``keys`` -- the budget never evicts them -- or unpin them.

        A pinned entry still counts against the budget; while pinned entries leave a new
        entry too little room, its commit is refused. An unpinned entry is evicted by policy
        again (at the next commit that needs room).

        Returns:
            The keys that have an entry, and those that do not.
        """
        named = list(dict.fromkeys(keys))
        for k in named:
            if not k.strip() or len(k) > _MAX_KEY:
                raise UserError(f"pin: field 'keys': {k[:80]!r} is not a cache key")

        def change() -> PinResult:
            with self._store.transaction() as tx:
                found = tx.pin(named, pinned)
            done = set(found)
            return PinResult(tuple(found), tuple(k for k in named if k not in done))

        async with self._lock:
            result = await asyncio.to_thread(change)
        log.info("%s %d cache entries (%d not found)", "pinned" if pinned else "unpinned",
                 len(result.keys), len(result.missing))
        return result

    async def stats(self) -> CacheStats:
        """Entries, bytes and the persisted counters."""
        def read() -> CacheStats:
            with self._store.transaction() as tx:
                entries, total = tx.totals()
                c = tx.counters()
            return CacheStats(entries=entries, bytes=total, hits=c["hits"], misses=c["misses"],
                              evictions=c["evictions"], budget_bytes=self._budget)
        return await asyncio.to_thread(read)

    async def evicted_bytes(self) -> int:
        """Bytes freed by evictions so far (persisted)."""
        def read() -> int:
            with self._store.transaction() as tx:
                return tx.counters()["evicted_bytes"]
        return await asyncio.to_thread(read)

    # ------------------------------------------------------------------ blocking parts

    def _lookup(self, keys: list[str], max_age: int, peek: bool = False
                ) -> tuple[LookupResult, bool]:
        with self._store.transaction() as tx:
            candidates = tx.get_many(keys)
            if not candidates:  # all missing (a new workflow's steps): counted at once
                if not peek:
                    tx.bump("misses", len(keys))
                return LookupResult({}, tuple(keys)), False
        # Outside the transaction: one existence check per artifact blob.
        broken = {key for key, e in candidates.items()
                  if any(not self._blobs.exists(a.digest) for a in e.artifacts.values())}
        now = self._clock()
        found: dict[str, CacheEntry] = {}
        missing: list[str] = []
        dropped: list[Removed] = []
        with self._store.transaction() as tx:
            inflation = self._inflation(tx)
            for key in keys:
                entry = candidates.get(key)
                if entry is None:
                    missing.append(key)
                elif key in broken:
                    removed = tx.delete(key, now)
                    if removed is not None:
                        dropped.append(removed)
                    missing.append(key)
                elif max_age and entry.created_at is not None and \
                        now - entry.created_at > max_age:
                    missing.append(key)
                elif peek:
                    found[key] = entry
                else:
                    found[key] = tx.touch(key, now, self._pricing, inflation=inflation)
            if dropped and self._pricing.uses_lineage:
                memo = MemoGraph(tx)
                for r in dropped:
                    self._reprice_below(tx, memo, r.key, inflation)
            tx.orphan(d for r in dropped for d in r.digests)
            if not peek:
                tx.bump("hits", len(found))
                tx.bump("misses", len(missing))
        for r in dropped:
            log.warning("cache entry %s dropped: an artifact blob is gone from the store", r.key)
        return LookupResult(found, tuple(missing)), bool(dropped)

    def _commit(self, entry: CacheEntry) -> CommitResult:
        with self._store.transaction() as tx:
            if tx.get(entry.key) is not None:
                return CommitResult(created=False)
        entry = self._measured(entry)
        if self._budget and entry.size_bytes > self._budget:
            return self._refuse(entry, f"its {entry.size_bytes} bytes alone exceed the "
                                       f"budget of {self._budget} bytes")
        try:
            return self._insert(entry)
        except ConflictError:
            # Another replica committed the same key in the meantime: the first one wins.
            with self._store.transaction() as tx:
                if tx.get(entry.key) is None:
                    raise
            return CommitResult(created=False)

    def _refuse(self, entry: CacheEntry, why: str) -> CommitResult:
        """Refuse ``entry``, remembering its cost and lineage for its descendants."""
        with self._store.transaction() as tx:
            known = tx.parents(entry.key)
            tx.remember(entry.key, entry.cost_seconds,
                        known if known is not None else _parents(entry), self._clock(), entry)
        log.warning("cache entry %s (workflow %r, step %r) refused: %s", entry.key,
                    entry.workflow, entry.step, why)
        return CommitResult(created=False, evicted=(entry.key,))

    def _insert(self, entry: CacheEntry) -> CommitResult:
        now = self._clock()
        with self._store.transaction() as tx:
            if tx.get(entry.key) is not None:
                return CommitResult(created=False)
            memo = MemoGraph(tx)
            known = tx.parents(entry.key)  # remembered: evicted or refused before
            entry = replace(entry, lineage=known if known is not None else _parents(entry))
            lost = lost_cost(entry.lineage, memo) if self._pricing.uses_lineage else 0.0
            total = entry.size_bytes + (tx.totals()[1] if self._budget else 0)
            refusal = self._room(tx, entry) if self._budget and total > self._budget else ""
            evicted = [] if refusal else self._place(tx, memo, entry, now, lost=lost,
                                                     total=total, again=known is not None)
        if refusal:
            return self._refuse(entry, refusal)
        log.info("cache entry %s committed (workflow %r, step %r, %d bytes)%s", entry.key,
                 entry.workflow, entry.step, entry.size_bytes,
                 f"; evicted {len(evicted)} to keep the budget" if evicted else "")
        return CommitResult(created=True, evicted=tuple(r.key for r in evicted))

    def _place(self, tx: Tx, memo: MemoGraph, entry: CacheEntry, now: float, *, lost: float,
               total: int, again: bool) -> list[Removed]:
        """Insert ``entry`` (admitted; ``total``: the bytes with it), evict to keep the
        budget, queue the events; what was evicted. ``again``: the key was cached before."""
        inflation = start_inflation = self._inflation(tx)
        tx.insert(entry, now, self._pricing, lost=lost, inflation=inflation)
        tx.adopt(a.digest for a in entry.artifacts.values())
        if again and self._pricing.uses_lineage:
            memo.forget([entry.key])  # cached again: its descendants lost less
            self._reprice_below(tx, memo, entry.key, inflation)
        evicted: list[Removed] = []
        while self._budget and total > self._budget:
            victim = tx.victim(exclude=(entry.key,))
            removed = tx.delete(victim, now) if victim is not None else None
            if removed is None:
                break
            evicted.append(removed)
            total -= removed.size_bytes
            inflation = self._evicted(tx, memo, removed, inflation)
        if inflation != start_inflation:
            tx.set_meta("inflation", repr(inflation))
        tx.enqueue(COMMITTED, f"{entry.key}.committed", events_pb2.CacheCommitted(
            key=entry.key, workflow=entry.workflow, step=entry.step,
            size_bytes=entry.size_bytes).SerializeToString())
        self._record_eviction(tx, evicted, "budget")
        return evicted

    def _measured(self, entry: CacheEntry) -> CacheEntry:
        """``entry`` with its artifacts' sizes as the artifact store has them."""
        artifacts = {}
        for name, art in entry.artifacts.items():
            try:
                size = self._blobs.size(art.digest)
            except NotFoundError:
                raise UserError(
                    f"cache entry {entry.key!r} of {_where(entry, f'artifacts[{name}]')}: "
                    f"blob {art.digest} is not in the artifact store") from None
            if art.size_bytes and art.size_bytes != size:
                log.warning("cache entry %s, %s: declared %d bytes, the store has %d; "
                            "counting %d", entry.key, _where(entry, f"artifacts[{name}]"),
                            art.size_bytes, size, size)
            artifacts[name] = replace(art, size_bytes=size)
        measured = replace(entry, artifacts=artifacts)
        return replace(measured, size_bytes=entry_size(measured))

    def _room(self, tx: Tx, entry: CacheEntry) -> str:
        """Why the budget cannot make room for ``entry`` ("": it can)."""
        if entry.size_bytes + tx.pinned_bytes() > self._budget:
            return (f"the pinned entries leave too little room for its {entry.size_bytes} "
                    f"bytes within the budget of {self._budget} bytes")
        return ""

    def _evicted(self, tx: Tx, memo: MemoGraph, removed: Removed, inflation: float) -> float:
        """After ``removed`` left: its descendants' priorities, GDSF's inflation."""
        if self._pricing.uses_lineage:
            memo.forget([removed.key])
            self._reprice_below(tx, memo, removed.key, inflation)
        if self._pricing.policy is EvictionPolicy.GDSF:
            return max(inflation, removed.priority)
        return inflation

    def _reprice_below(self, tx: Tx, memo: MemoGraph, key: str, inflation: float) -> None:
        """Price again the cached entries whose lost cost changed because ``key`` was
        evicted or cached again."""
        for child in cached_below(key, memo):
            node = memo.nodes([child]).get(child)
            if node is not None:
                tx.reprice(child, self._pricing, lost=lost_cost(node.parents, memo),
                           inflation=inflation)

    def _inflation(self, tx: Tx) -> float:
        if self._pricing.policy is not EvictionPolicy.GDSF:
            return 0.0
        try:
            inflation = float(tx.meta("inflation") or 0.0)
        except ValueError:  # damaged: start the aging again
            return 0.0
        return inflation if math.isfinite(inflation) else 0.0

    def _prepare(self) -> None:
        """Price every entry again when the stored priorities were computed under another
        policy or half-life (or before priorities existed). Resumable: the policy is
        recorded only when all are done."""
        pricing = self._pricing
        half_life = repr(pricing.half_life_seconds)
        with self._store.transaction() as tx:
            same_policy = tx.meta("policy") == pricing.policy.value
            refreq = tx.meta("half_life") != half_life
        if same_policy and not refreq:
            return
        log.info("pricing the cache entries for eviction policy %r (half-life %s s)",
                 pricing.policy.value, half_life)
        done = [""]
        count = 0
        while done:
            with self._store.transaction() as tx:
                lost = partial(lost_cost, graph=MemoGraph(tx)) if pricing.uses_lineage else None
                done = tx.rescore(done[-1], _RESCORE_BATCH, pricing, inflation=0.0,
                                  refreq=refreq, lost=lost)
            count += len(done)
        with self._store.transaction() as tx:
            tx.set_meta("policy", pricing.policy.value)
            tx.set_meta("half_life", half_life)
            tx.set_meta("inflation", "0.0")
        log.info("priced %d cache entries", count)

    def _evict(self, keys: list[str], free_bytes: int) -> EvictResult:
        evicted: list[Removed] = []
        now = self._clock()
        with self._store.transaction() as tx:
            memo = MemoGraph(tx)
            inflation = start_inflation = self._inflation(tx)
            for key in keys:
                removed = tx.delete(key, now)
                if removed is not None:
                    evicted.append(removed)
                    inflation = self._evicted(tx, memo, removed, inflation)
            freed = sum(r.size_bytes for r in evicted)
            while freed < free_bytes:
                victim = tx.victim()
                removed = tx.delete(victim, now) if victim is not None else None
                if removed is None:
                    break
                evicted.append(removed)
                freed += removed.size_bytes
                inflation = self._evicted(tx, memo, removed, inflation)
            if inflation != start_inflation:
                tx.set_meta("inflation", repr(inflation))
            self._record_eviction(tx, evicted, "request")
        if evicted:
            log.info("evicted %d cache entries on request (%d bytes)", len(evicted), freed)
        return EvictResult(tuple(r.key for r in evicted), freed)

    @staticmethod
    def _record_eviction(tx: Tx, evicted: list[Removed], reason: str) -> None:
        if not evicted:
            return
        freed = sum(r.size_bytes for r in evicted)
        tx.orphan(d for r in evicted for d in r.digests)
        tx.bump("evictions", len(evicted))
        tx.bump("evicted_bytes", freed)
        keys = [r.key for r in evicted]
        tx.enqueue(EVICTED, ",".join(keys), events_pb2.CacheEvicted(
            keys=keys, freed_bytes=freed, reason=reason).SerializeToString())

    # ------------------------------------------------------------------ side effects

    async def _sweep(self) -> None:
        """Delete the queued blobs that no entry references (again)."""
        async with self._lock:
            await asyncio.to_thread(self._sweep_blocking)

    def _sweep_blocking(self) -> None:
        with self._store.transaction() as tx:
            forgotten = tx.prune_lineage(self._lineage_limit)
        if forgotten:
            log.info("forgot the lineage of %d evicted cache keys (over the limit of %d)",
                     forgotten, self._lineage_limit)
        with self._store.transaction() as tx:
            digests = tx.orphans()
        for digest in digests:
            with self._store.transaction() as tx:
                if tx.referenced(digest):
                    tx.forget_orphan(digest)
                    continue
            try:
                self._blobs.delete(digest)
            except Exception as exc:  # stays queued; the background work retries
                log.warning("deleting blob %s failed (will retry): %s", digest, exc)
                continue
            with self._store.transaction() as tx:
                tx.forget_orphan(digest)
            log.info("deleted blob %s (no cache entry references it)", digest)

    async def _flush(self) -> None:
        """Publish the queued events, oldest first; stop at the first failure."""
        if self._publish is None:
            return
        async with self._outbox_lock:
            while True:
                batch = await asyncio.to_thread(self._pending)
                if not batch:
                    return
                done: list[int] = []
                try:
                    for msg in batch:
                        await self._publish(msg.subject, msg.msg_id, msg.payload)
                        done.append(msg.id)
                except Exception as exc:  # the events stay queued; the change is committed
                    log.warning("publishing cache events failed (will retry): %s", exc)
                    return
                finally:
                    await asyncio.to_thread(self._published, done)

    def _pending(self) -> list[OutboxMessage]:
        with self._store.transaction() as tx:
            return tx.pending()

    def _published(self, ids: list[int]) -> None:
        with self._store.transaction() as tx:
            tx.published(ids)

    # ------------------------------------------------------------------ control (read only)

    async def list_entries(self, *, order: CacheOrder = CacheOrder.VICTIM, workflow: str = "",
                           step: str = "", page_size: int = 0, page_token: str = ""
                           ) -> CachePage:
        """A page of entries in ``order`` (of ``workflow`` and ``step`` when given), each
        with its eviction priority. Counts no hit or miss and changes no entry.

        Raises:
            UserError: A page size out of range, or a token that is not one of this
                listing's (the message names the field).
        """
        if not 0 <= page_size <= MAX_LIST_PAGE:
            raise UserError(f"list: field 'page_size' must be 0..{MAX_LIST_PAGE} "
                            f"(got {page_size})")
        limit = page_size or DEFAULT_LIST_PAGE
        scope = [order.value, workflow, step]
        after = _page_position(page_token, scope, len(ORDERS[order.value]))

        def read() -> CachePage:
            with self._store.transaction() as tx:
                rows = tx.listing(order.value, workflow=workflow, step=step, after=after,
                                  limit=limit + 1)
            token = _page_token(scope, rows[limit - 1][2]) if len(rows) > limit else ""
            return CachePage(tuple(ListedEntry(e, p) for e, p, _ in rows[:limit]), token,
                             self._pricing.policy.value)

        return await asyncio.to_thread(read)

    async def show(self, key: str) -> ListedEntry:
        """The entry of ``key`` -- a whole key, or a prefix of at least
        :data:`MIN_KEY_PREFIX` hex digits that names one entry -- with its eviction
        priority; or, when its bytes were evicted, its kept metadata and when it was evicted.
        Counts no hit or miss and changes no entry (unlike :meth:`lookup`).

        Raises:
            NotFoundError: No entry has that key or prefix.
            UserError: The prefix is too short, not hex, or names several entries.
        """
        wanted = key.strip()
        if not wanted or len(wanted) > _MAX_KEY:
            raise UserError(f"show: field 'key': {key[:80]!r} is not a cache key")
        prefix = _KEY_PREFIX.fullmatch(wanted.lower()) is not None

        def read() -> list[ListedEntry]:
            with self._store.transaction() as tx:
                found = tx.with_prefix(wanted, prefix=wanted.lower() if prefix else "")
                if found:
                    return [ListedEntry(e, p) for e, p in found]
                return [ListedEntry(e, evicted_at=at) for e, at in tx.evicted(
                    wanted, prefix=wanted.lower() if prefix else "")]

        found = await asyncio.to_thread(read)
        if not found:
            why = ("" if prefix else
                   f" (a key prefix needs at least {MIN_KEY_PREFIX} hex digits)")
            raise NotFoundError(f"show: field 'key': no cache entry has the key or key prefix "
                                f"{wanted!r}{why}")
        if len(found) > 1:
            raise UserError(f"show: field 'key': {wanted!r} is the prefix of several cache "
                            f"entries ({found[0].entry.key[:16]}..., "
                            f"{found[1].entry.key[:16]}...); give more digits")
        return found[0]


MIN_KEY_PREFIX = 8  # hex digits a key prefix must have to name an entry
DEFAULT_LIST_PAGE = 100
MAX_LIST_PAGE = 1000
# a key prefix: hex digits (after "sha256:" when the keys have it); no LIKE wildcard
_KEY_PREFIX = re.compile(rf"(?:sha256:)?[0-9a-f]{{{MIN_KEY_PREFIX},}}")


def _page_token(scope: list[str], values: list[object]) -> str:
    """The token of the page after the row with sort ``values``, in a listing ``scope``
    (order, workflow, step)."""
    data = json.dumps({"scope": scope, "after": values}, separators=(",", ":"))
    return base64.urlsafe_b64encode(data.encode()).decode().rstrip("=")


def _page_position(token: str, scope: list[str], width: int) -> list[object] | None:
    """The sort values a page ``token`` continues after (None for the first page)."""
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        after = data["after"]
        ok = data["scope"] == scope and isinstance(after, list) and len(after) == width
    except (ValueError, TypeError, KeyError):
        ok = False
    if not ok:
        raise UserError("list: field 'page_token' is not a token of this listing (the same "
                        "order, workflow and step) -- start again without it")
    values: list[object] = after
    return values
