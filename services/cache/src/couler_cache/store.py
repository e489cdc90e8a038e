"""The cache index in SQL: entries, their artifacts, counters, orphaned blobs and an outbox.

Tables (created by ``couler_cache/migrations``, version table ``alembic_version_cache``):

* ``cache_entries`` -- one row per key: workflow, step, outputs (JSON), size, times, hits,
  ``used_seq`` / ``created_seq`` (a logical clock stamped on every commit and hit: wall-clock
  times can tie), its cost and lineage, ``pinned``, and what eviction reads: ``freq_log``,
  ``lost_cost_seconds`` and ``priority`` (:mod:`couler_cache.policy`; the unpinned entry
  with the lowest priority goes first, found through an index);
* ``cache_artifacts`` -- the entry's output artifacts (digest, size, uri), deleted with it;
* ``cache_lineage`` / ``cache_edges`` -- every key committed, cached or not (its cost and
  parents), and the parent → child edges, so that the cost of rebuilding an entry's evicted
  ancestors is known; nodes of evicted keys that nothing cached descends from are pruned
  beyond a limit;
* ``cache_counters`` -- hits, misses, evictions, evicted bytes and the clock, persisted;
* ``cache_meta`` -- the policy and half-life the priorities were computed with, and GDSF's
  inflation;
* ``cache_orphans`` -- digests no entry references any more, whose blobs are still to be
  deleted (written in the eviction's transaction, so a crash never loses one);
* ``cache_outbox`` -- events committed with the change they announce, published after it.

:class:`CacheStore` hands out :class:`Tx` objects, one per transaction, with the primitive
operations; the use cases (:mod:`couler_cache.service`) compose them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from couler_cache.policy import Node, Pricing, Standing
from couler_runtime.rpc.records import CacheEntry, StoredArtifact
from couler_runtime.store import (
    connection_scope,
    is_local,
    make_engine,
    make_session_factory,
    migrate,
    session_scope,
)

__all__ = ["COUNTERS", "ORDERS", "CacheStore", "OutboxMessage", "Removed", "Tx"]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SERVICE = "cache"
COUNTERS = ("hits", "misses", "evictions", "evicted_bytes")


_IN_CHUNK = 500  # keys per IN (...) list


class Base(DeclarativeBase):
    """The cache's tables."""


class EntryRow(Base):
    __tablename__ = "cache_entries"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    workflow: Mapped[str] = mapped_column(String(255))
    step: Mapped[str] = mapped_column(String(255))
    outputs: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)
    last_used_at: Mapped[float] = mapped_column(Float)
    used_seq: Mapped[int] = mapped_column(BigInteger, index=True)
    hits: Mapped[int] = mapped_column(BigInteger)
    cost_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    lineage: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of keys
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    created_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    freq_log: Mapped[float] = mapped_column(Float, default=0.0)
    lost_cost_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    priority: Mapped[float] = mapped_column(Float, default=0.0)
    artifacts: Mapped[list[ArtifactRow]] = relationship(
        back_populates="entry", cascade="all, delete-orphan", passive_deletes=True,
        lazy="selectin")

    __table_args__ = (
        # The eviction order: the first unpinned row is the victim.
        sa.Index("ix_cache_entries_victim", "pinned", "priority", "used_seq", "key"),
    )


class ArtifactRow(Base):
    __tablename__ = "cache_artifacts"

    key: Mapped[str] = mapped_column(
        String(255), ForeignKey("cache_entries.key", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)
    entry: Mapped[EntryRow] = relationship(back_populates="artifacts")


class LineageRow(Base):
    __tablename__ = "cache_lineage"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    cost_seconds: Mapped[float] = mapped_column(Float)
    parents: Mapped[str] = mapped_column(Text)  # JSON list of keys
    evicted_at: Mapped[float | None] = mapped_column(Float, index=True)  # None: cached
    # the entry's metadata when it was evicted or refused (JSON; see _record)
    record: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)


class EdgeRow(Base):
    __tablename__ = "cache_edges"

    parent: Mapped[str] = mapped_column(String(255), primary_key=True)
    child: Mapped[str] = mapped_column(String(255), primary_key=True, index=True)


class MetaRow(Base):
    __tablename__ = "cache_meta"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class CounterRow(Base):
    __tablename__ = "cache_counters"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class OrphanRow(Base):
    __tablename__ = "cache_orphans"

    digest: Mapped[str] = mapped_column(String(80), primary_key=True)


class OutboxRow(Base):
    __tablename__ = "cache_outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    subject: Mapped[str] = mapped_column(String(255))
    msg_id: Mapped[str] = mapped_column(Text)
    payload: Mapped[bytes] = mapped_column(LargeBinary)


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """An event waiting to be published."""

    id: int
    subject: str
    msg_id: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Removed:
    """An entry deleted from the index."""

    key: str
    size_bytes: int
    digests: tuple[str, ...]
    priority: float = 0.0


class DamagedEntryError(Exception):
    """A stored entry that cannot be read (its outputs are not a JSON object of strings)."""


def _keys(text: str | None) -> tuple[str, ...]:
    """A stored JSON list of keys; () when it is damaged (it only prices entries)."""
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return ()
    return tuple(value) if isinstance(value, list) and all(
        isinstance(k, str) for k in value) else ()


def _entry(row: EntryRow) -> CacheEntry:
    """The entry of ``row``; raises DamagedEntryError when its outputs cannot be read (stored
    data never passes a wrong output on, nor stops the service)."""
    try:
        outputs = json.loads(row.outputs)
    except (ValueError, TypeError):
        outputs = None
    if not isinstance(outputs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in outputs.items()):
        raise DamagedEntryError(row.key)
    return CacheEntry(
        key=row.key, workflow=row.workflow, step=row.step, outputs=outputs,
        artifacts={a.name: StoredArtifact(a.digest, a.size_bytes, a.uri)
                   for a in sorted(row.artifacts, key=lambda a: a.name)},
        size_bytes=row.size_bytes, created_at=row.created_at, last_used_at=row.last_used_at,
        hits=row.hits, cost_seconds=row.cost_seconds, lineage=_keys(row.lineage),
        pinned=row.pinned)


def _readable(rows: Iterable[EntryRow]) -> Iterator[tuple[EntryRow, CacheEntry]]:
    """The rows whose entries can be read, each with its entry (damaged ones left out)."""
    for row in rows:
        try:
            yield row, _entry(row)
        except DamagedEntryError:
            continue


def _record(entry: CacheEntry) -> str:
    """An entry's metadata, kept after its bytes are evicted (JSON)."""
    return json.dumps({
        "workflow": entry.workflow, "step": entry.step, "outputs": dict(entry.outputs),
        "artifacts": {n: [a.digest, a.size_bytes, a.uri] for n, a in entry.artifacts.items()},
        "size_bytes": entry.size_bytes, "cost_seconds": entry.cost_seconds,
        "lineage": list(entry.lineage), "hits": entry.hits, "created_at": entry.created_at,
        "last_used_at": entry.last_used_at}, sort_keys=True)


def _from_record(key: str, text: str) -> CacheEntry | None:
    """The kept metadata of an evicted entry; None when it is damaged."""
    try:
        return _read_record(key, text)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _read_record(key: str, text: str) -> CacheEntry:
    data = json.loads(text)
    return CacheEntry(
        key=key, workflow=data["workflow"], step=data["step"], outputs=data["outputs"],
        artifacts={n: StoredArtifact(d, size, uri)
                   for n, (d, size, uri) in data["artifacts"].items()},
        size_bytes=data["size_bytes"], cost_seconds=data["cost_seconds"],
        lineage=tuple(data["lineage"]), hits=data["hits"], created_at=data["created_at"],
        last_used_at=data["last_used_at"])


def _standing(row: EntryRow) -> Standing:
    return Standing(size_bytes=row.size_bytes, cost_seconds=row.cost_seconds,
                    lost_cost_seconds=row.lost_cost_seconds, freq_log=row.freq_log,
                    hits=row.hits, used_seq=row.used_seq, created_seq=row.created_seq)


def _victims() -> sa.Select[str, int, float]:
    """Unpinned entries in eviction order (``ix_cache_entries_victim``): key, size, priority."""
    return sa.select(EntryRow.key, EntryRow.size_bytes, EntryRow.priority).where(
        EntryRow.pinned == sa.false()).order_by(EntryRow.priority, EntryRow.used_seq,
                                                EntryRow.key)


class Tx:
    """The primitive operations inside one transaction."""

    def __init__(self, session: Session) -> None:
        self._s = session

    # ------------------------------------------------------------------ entries

    def get(self, key: str) -> CacheEntry | None:
        """The entry for ``key``, or None; a damaged one is removed (its blobs orphaned)
        and counts as none."""
        row = self._s.get(EntryRow, key)
        if row is None:
            return None
        try:
            return _entry(row)
        except DamagedEntryError:
            removed = self.delete(key, float(row.created_at or 0.0))
            if removed is not None:
                self.orphan(removed.digests)
            return None

    def get_many(self, keys: Sequence[str]) -> dict[str, CacheEntry]:
        """The entries for those of ``keys`` that have one, by key (a few queries for
        thousands of keys, not one per key)."""
        found: dict[str, CacheEntry] = {}
        for at in range(0, len(keys), _IN_CHUNK):
            rows = self._s.scalars(sa.select(EntryRow).where(
                EntryRow.key.in_(keys[at:at + _IN_CHUNK])))
            found.update((row.key, entry) for row, entry in _readable(rows))
        return found

    def insert(self, entry: CacheEntry, now: float, pricing: Pricing, *, lost: float = 0.0,
               inflation: float = 0.0) -> bool:
        """Add ``entry`` (sized by the caller; its lineage as :meth:`parents` gives it),
        priced by ``pricing``; False when ``key`` is already present. The key's lineage node
        is created, or marked cached again (its parents stay as first recorded)."""
        if self._s.get(EntryRow, entry.key) is not None:
            return False
        node = self._s.get(LineageRow, entry.key)
        parents = tuple(entry.lineage)
        if node is None:
            self._s.add(LineageRow(key=entry.key, cost_seconds=entry.cost_seconds,
                                   parents=json.dumps(list(parents)), evicted_at=None))
            self._s.add_all(EdgeRow(parent=p, child=entry.key) for p in parents)
        else:
            node.evicted_at = None
            if entry.cost_seconds > 0:  # the latest measurement
                node.cost_seconds = entry.cost_seconds
        seq = self._tick()
        row = EntryRow(
            key=entry.key, workflow=entry.workflow, step=entry.step,
            outputs=json.dumps(dict(entry.outputs), sort_keys=True),
            size_bytes=entry.size_bytes, created_at=now, last_used_at=now,
            used_seq=seq, hits=0, cost_seconds=node.cost_seconds if node else entry.cost_seconds,
            lineage=json.dumps(list(parents)), pinned=entry.pinned, created_seq=seq,
            freq_log=pricing.first_use(now), lost_cost_seconds=lost, priority=0.0,
            artifacts=[ArtifactRow(name=name, digest=a.digest, size_bytes=a.size_bytes,
                                   uri=a.uri) for name, a in entry.artifacts.items()])
        row.priority = pricing.priority(_standing(row), inflation)
        self._s.add(row)
        self._s.flush()  # a concurrent replica's insert fails here, inside the transaction
        return True

    def touch(self, key: str, now: float, pricing: Pricing, *, inflation: float = 0.0
              ) -> CacheEntry:
        """Mark ``key`` used now (one more hit, priced again); its entry after the change."""
        row = self._s.get_one(EntryRow, key)
        row.last_used_at = now
        row.used_seq = self._tick()
        row.hits += 1
        row.freq_log = pricing.used(row.freq_log, now)
        row.priority = pricing.priority(_standing(row), inflation)
        self._s.flush()
        return _entry(row)

    def reprice(self, key: str, pricing: Pricing, *, lost: float | None = None,
                freq_log: float | None = None, inflation: float = 0.0) -> None:
        """Price ``key``'s entry again, with a new lost cost or ``freq_log`` if given."""
        row = self._s.get(EntryRow, key)
        if row is None:
            return
        if lost is not None:
            row.lost_cost_seconds = lost
        if freq_log is not None:
            row.freq_log = freq_log
        row.priority = pricing.priority(_standing(row), inflation)

    def delete(self, key: str, now: float) -> Removed | None:
        """Remove ``key``'s entry and its artifact rows, and mark its lineage node evicted
        at ``now``; None when it was not there."""
        row = self._s.get(EntryRow, key)
        if row is None:
            return None
        removed = Removed(row.key, row.size_bytes,
                          tuple(sorted({a.digest for a in row.artifacts})), row.priority)
        node = self._s.get(LineageRow, key)
        try:
            record: str | None = _record(_entry(row))
        except DamagedEntryError:
            record = None
        if node is None:  # not expected (every entry has one); kept consistent anyway
            self._s.add(LineageRow(key=key, cost_seconds=row.cost_seconds,
                                   parents=row.lineage, evicted_at=now, record=record))
        else:
            node.evicted_at = now
            node.record = record
        self._s.delete(row)
        self._s.flush()
        return removed

    def victim(self, exclude: Iterable[str] = ()) -> str | None:
        """The unpinned key with the lowest priority (ties: used longest ago), other than
        ``exclude``; None when there is none."""
        query = _victims()
        skip = list(exclude)
        if skip:
            query = query.where(EntryRow.key.not_in(skip))
        first = self._s.execute(query.limit(1)).first()
        return first[0] if first is not None else None

    def pinned_bytes(self) -> int:
        """Bytes the pinned entries occupy."""
        return int(self._s.execute(
            sa.select(sa.func.coalesce(sa.func.sum(EntryRow.size_bytes), 0))
            .where(EntryRow.pinned == sa.true())).scalar_one())

    def pin(self, keys: Sequence[str], pinned: bool) -> list[str]:
        """Set ``pinned`` on the entries of ``keys``; the keys that have one."""
        found: list[str] = []
        for key in keys:
            row = self._s.get(EntryRow, key)
            if row is not None:
                row.pinned = pinned
                found.append(key)
        self._s.flush()
        return found

    def rescore(self, after: str, limit: int, pricing: Pricing, *, inflation: float,
                lost: Callable[[tuple[str, ...]], float] | None, refreq: bool) -> list[str]:
        """Price up to ``limit`` entries with keys after ``after`` again (their lost cost from
        ``lost`` when given; ``freq_log`` estimated again when ``refreq``); their keys, in
        order."""
        rows = list(self._s.scalars(sa.select(EntryRow).where(EntryRow.key > after)
                                    .order_by(EntryRow.key).limit(limit)))
        for row in rows:
            if lost is not None:
                row.lost_cost_seconds = lost(_keys(row.lineage))
            if refreq:
                row.freq_log = pricing.estimated_freq_log(row.created_at, row.last_used_at,
                                                          row.hits)
            row.priority = pricing.priority(_standing(row), inflation)
        self._s.flush()
        return [row.key for row in rows]

    def totals(self) -> tuple[int, int]:
        """Entries and their bytes."""
        count, total = self._s.execute(
            sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(EntryRow.size_bytes), 0))
        ).one()
        return int(count), int(total)

    # ------------------------------------------------------------------ lineage

    def nodes(self, keys: Sequence[str]) -> Mapping[str, Node]:
        """The lineage nodes of those of ``keys`` the cache knows (``LineageGraph``)."""
        found: dict[str, Node] = {}
        for at in range(0, len(keys), _IN_CHUNK):
            for row in self._s.scalars(sa.select(LineageRow).where(
                    LineageRow.key.in_(keys[at:at + _IN_CHUNK]))):
                found[row.key] = Node(row.cost_seconds, _keys(row.parents),
                                      row.evicted_at is None)
        return found

    def children(self, keys: Sequence[str]) -> Mapping[str, Sequence[str]]:
        """The keys whose lineage names each of ``keys`` (``LineageGraph``)."""
        found: dict[str, list[str]] = {}
        for at in range(0, len(keys), _IN_CHUNK):
            for parent, child in self._s.execute(
                    sa.select(EdgeRow.parent, EdgeRow.child)
                    .where(EdgeRow.parent.in_(keys[at:at + _IN_CHUNK]))
                    .order_by(EdgeRow.parent, EdgeRow.child)):
                found.setdefault(parent, []).append(child)
        return found

    def parents(self, key: str) -> tuple[str, ...] | None:
        """The lineage recorded for ``key``, None when the cache never saw it."""
        row = self._s.get(LineageRow, key)
        return _keys(row.parents) if row is not None else None

    def remember(self, key: str, cost_seconds: float, parents: Sequence[str],
                 now: float, entry: CacheEntry | None = None) -> None:
        """Record ``key`` as evicted at ``now`` without an entry (a refused commit), unless the
        cache knows it already, so its descendants count its cost (``entry``: its
        metadata, kept)."""
        if self._s.get(LineageRow, key) is None:
            self._s.add(LineageRow(key=key, cost_seconds=cost_seconds,
                                   parents=json.dumps(list(parents)), evicted_at=now,
                                   record=None if entry is None else _record(entry)))
            self._s.add_all(EdgeRow(parent=p, child=key) for p in parents)
            self._s.flush()

    def prune_lineage(self, limit: int, batch: int = 500) -> int:
        """Forget evicted keys beyond ``limit`` of them, oldest first, and only those no
        remembered key descends from (a chain goes leaf first); how many went."""
        ghosts = int(self._s.execute(sa.select(sa.func.count()).select_from(LineageRow)
                                     .where(LineageRow.evicted_at.is_not(None))).scalar_one())
        pruned = 0
        while ghosts - pruned > limit:
            has_child = sa.exists().where(EdgeRow.parent == LineageRow.key)
            leaves = list(self._s.scalars(
                sa.select(LineageRow.key)
                .where(LineageRow.evicted_at.is_not(None), ~has_child)
                .order_by(LineageRow.evicted_at, LineageRow.key)
                .limit(min(batch, ghosts - pruned - limit))))
            if not leaves:
                break
            self._s.execute(sa.delete(EdgeRow).where(EdgeRow.child.in_(leaves)))
            self._s.execute(sa.delete(LineageRow).where(LineageRow.key.in_(leaves)))
            pruned += len(leaves)
        return pruned

    # ------------------------------------------------------------------ meta

    def meta(self, name: str) -> str | None:
        """The stored value of ``name``, None when unset."""
        row = self._s.get(MetaRow, name)
        return row.value if row is not None else None

    def set_meta(self, name: str, value: str) -> None:
        """Store ``value`` under ``name``."""
        row = self._s.get(MetaRow, name)
        if row is None:
            self._s.add(MetaRow(name=name, value=value))
        else:
            row.value = value

    # ------------------------------------------------------------------ counters

    def bump(self, name: str, by: int = 1) -> None:
        """Add ``by`` to counter ``name``."""
        if by:
            self._s.execute(sa.update(CounterRow).where(CounterRow.name == name)
                            .values(value=CounterRow.value + by))

    def counters(self) -> dict[str, int]:
        """Every counter by name."""
        return {r.name: r.value for r in self._s.scalars(sa.select(CounterRow))}

    def _tick(self) -> int:
        return int(self._s.execute(
            sa.update(CounterRow).where(CounterRow.name == "clock")
            .values(value=CounterRow.value + 1).returning(CounterRow.value)).scalar_one())

    # ------------------------------------------------------------------ blobs

    def referenced(self, digest: str) -> bool:
        """Whether any entry still lists an artifact with ``digest``."""
        return self._s.scalars(
            sa.select(ArtifactRow.key).where(ArtifactRow.digest == digest).limit(1)
        ).first() is not None

    def orphan(self, digests: Iterable[str]) -> None:
        """Queue the blobs of ``digests`` that no entry references for deletion."""
        for digest in digests:
            if not self.referenced(digest) and self._s.get(OrphanRow, digest) is None:
                self._s.add(OrphanRow(digest=digest))
        self._s.flush()

    def adopt(self, digests: Iterable[str]) -> None:
        """Take ``digests`` off the deletion queue (a new entry references them)."""
        wanted = list(digests)
        if wanted:
            self._s.execute(sa.delete(OrphanRow).where(OrphanRow.digest.in_(wanted)))

    def orphans(self) -> list[str]:
        """Digests queued for deletion."""
        return list(self._s.scalars(sa.select(OrphanRow.digest).order_by(OrphanRow.digest)))

    def forget_orphan(self, digest: str) -> None:
        """Drop ``digest`` from the deletion queue."""
        self._s.execute(sa.delete(OrphanRow).where(OrphanRow.digest == digest))

    # ------------------------------------------------------------------ outbox

    def enqueue(self, subject: str, msg_id: str, payload: bytes) -> None:
        """Add an event to publish once this transaction commits."""
        self._s.add(OutboxRow(subject=subject, msg_id=msg_id, payload=payload))

    def pending(self, limit: int = 100) -> list[OutboxMessage]:
        """Events not yet published, oldest first."""
        rows = self._s.scalars(sa.select(OutboxRow).order_by(OutboxRow.id).limit(limit))
        return [OutboxMessage(r.id, r.subject, r.msg_id, r.payload) for r in rows]

    def published(self, ids: Sequence[int]) -> None:
        """Remove published events."""
        if ids:
            self._s.execute(sa.delete(OutboxRow).where(OutboxRow.id.in_(list(ids))))

    # ------------------------------------------------------------------ listing (read only)

    def listing(self, order: str, *, workflow: str = "", step: str = "",
                after: Sequence[object] | None = None, limit: int = 100
                ) -> list[tuple[CacheEntry, float, list[object]]]:
        """Up to ``limit`` entries in ``order`` (a key of :data:`ORDERS`), of ``workflow`` and
        ``step`` when given, after the row whose sort values are ``after``: each with its
        priority and its own sort values (the next page's ``after``). Changes nothing."""
        columns = [(getattr(EntryRow, name), descending) for name, descending in ORDERS[order]]
        query = sa.select(EntryRow)
        if workflow:
            query = query.where(EntryRow.workflow == workflow)
        if step:
            query = query.where(EntryRow.step == step)
        if after is not None:
            query = query.where(_after(columns, after))
        query = query.order_by(*(c.desc() if d else c.asc() for c, d in columns)).limit(limit)
        return [(entry, row.priority, [getattr(row, name) for name, _ in ORDERS[order]])
                for row, entry in _readable(self._s.scalars(query))]

    def evicted(self, key: str, *, prefix: str = "", limit: int = 2
                ) -> list[tuple[CacheEntry, float]]:
        """The kept metadata of the evicted entry ``key`` (or of those whose key starts
        with ``prefix``, ``limit`` at most), each with when it was evicted."""
        query = sa.select(LineageRow).where(LineageRow.evicted_at.is_not(None),
                                            LineageRow.record.is_not(None))
        rows = ([r] if (r := self._s.get(LineageRow, key)) is not None else []) \
            if not prefix else self._s.scalars(
                query.where(LineageRow.key.like(prefix + "%")).order_by(LineageRow.key)
                .limit(limit))
        kept = [(_from_record(r.key, r.record), r.evicted_at) for r in rows
                if r.record is not None and r.evicted_at is not None]
        return [(e, at) for e, at in kept if e is not None]

    def with_prefix(self, key: str, *, prefix: str = "", limit: int = 2
                    ) -> list[tuple[CacheEntry, float]]:
        """The entry of ``key``; else, when ``prefix`` is given (hex digits: no LIKE
        wildcard), the entries whose key starts with it (``limit`` at most); each with its
        priority."""
        row = self._s.get(EntryRow, key)
        if row is not None:
            return [(e, r.priority) for r, e in _readable([row])]
        if not prefix:
            return []
        rows = self._s.scalars(sa.select(EntryRow).where(EntryRow.key.like(prefix + "%"))
                               .order_by(EntryRow.key).limit(limit))
        return [(e, r.priority) for r, e in _readable(rows)]


ORDERS: dict[str, tuple[tuple[str, bool], ...]] = {
    # name -> the columns a listing sorts by, each (column, descending); the key last, so
    # that every row has its own place (keyset paging)
    "victim": (("pinned", False), ("priority", False), ("used_seq", False), ("key", False)),
    "recent": (("used_seq", True), ("key", False)),
    "size": (("size_bytes", True), ("key", False)),
    "cost": (("cost_seconds", True), ("key", False)),
}


def _after(columns: Sequence[tuple[Any, bool]],
           values: Sequence[object]) -> sa.ColumnElement[bool]:
    """The rows after the one with sort ``values`` in the order of ``columns``."""
    alternatives = []
    for i, (column, descending) in enumerate(columns):
        equal = [c == v for (c, _), v in zip(columns[:i], values[:i], strict=True)]
        beyond = column < values[i] if descending else column > values[i]
        alternatives.append(sa.and_(*equal, beyond))
    return sa.or_(*alternatives)


class CacheStore:
    """The cache's database: migrated on :meth:`open`, one :class:`Tx` per transaction.

    Args:
        url: A SQLAlchemy URL (SQLite or PostgreSQL).

    Attributes:
        quick: Short transactions may run on the caller's event loop (SQLite:
            :func:`couler_runtime.store.is_local`).
    """

    def __init__(self, url: str) -> None:
        self._engine = make_engine(url)
        self._factory = make_session_factory(self._engine)
        self.quick = is_local(self._engine)

    def count_misses(self, keys: Sequence[str]) -> bool:
        """When none of ``keys`` has an entry, count them all as misses (True); otherwise
        change nothing (False). Core statements: a new workflow's lookups end here."""
        entries: sa.Table = EntryRow.__table__  # type: ignore[assignment]
        counters: sa.Table = CounterRow.__table__  # type: ignore[assignment]
        with connection_scope(self._engine) as conn:
            for at in range(0, len(keys), _IN_CHUNK):
                if conn.execute(sa.select(entries.c.key).where(
                        entries.c.key.in_(keys[at:at + _IN_CHUNK])).limit(1)).first():
                    return False
            conn.execute(sa.update(counters).where(counters.c.name == "misses")
                         .values(value=counters.c.value + len(keys)))
        return True

    @classmethod
    def open(cls, url: str) -> CacheStore:
        """Upgrade the schema to the newest revision and return the store."""
        store = cls(url)
        try:
            migrate(store._engine, SERVICE, MIGRATIONS)
        except BaseException:
            store.close()
            raise
        return store

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        """One transaction (see ``couler_runtime.store.session_scope`` for its errors)."""
        with session_scope(self._factory) as session:
            yield Tx(session)

    def close(self) -> None:
        """Release the connections."""
        self._engine.dispose()
