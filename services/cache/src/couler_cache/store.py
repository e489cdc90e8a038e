"""The cache index in SQL: entries, their artifacts, counters, orphaned blobs and an outbox.

Tables (created by ``couler_cache/migrations``, version table ``alembic_version_cache``):

* ``cache_entries`` -- one row per key: workflow, step, outputs (JSON), size, times, hits
  and ``used_seq``, a logical clock stamped on every commit and hit that orders LRU
  eviction exactly (wall-clock times can tie);
* ``cache_artifacts`` -- the entry's output artifacts (digest, size, uri), deleted with it;
* ``cache_counters`` -- hits, misses, evictions, evicted bytes and the clock, persisted;
* ``cache_orphans`` -- digests no entry references any more, whose blobs are still to be
  deleted (written in the eviction's transaction, so a crash never loses one);
* ``cache_outbox`` -- events committed with the change they announce, published after it.

:class:`CacheStore` hands out :class:`Tx` objects, one per transaction, with the primitive
operations; the use cases (:mod:`couler_cache.service`) compose them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import BigInteger, Float, ForeignKey, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from couler_runtime.rpc.records import CacheEntry, StoredArtifact
from couler_runtime.store import (
    connection_scope,
    is_local,
    make_engine,
    make_session_factory,
    migrate,
    session_scope,
)

__all__ = ["COUNTERS", "CacheStore", "OutboxMessage", "Tx"]

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
    artifacts: Mapped[list[ArtifactRow]] = relationship(
        back_populates="entry", cascade="all, delete-orphan", passive_deletes=True,
        lazy="selectin")


class ArtifactRow(Base):
    __tablename__ = "cache_artifacts"

    key: Mapped[str] = mapped_column(
        String(255), ForeignKey("cache_entries.key", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)
    entry: Mapped[EntryRow] = relationship(back_populates="artifacts")


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


def _entry(row: EntryRow) -> CacheEntry:
    return CacheEntry(
        key=row.key, workflow=row.workflow, step=row.step, outputs=json.loads(row.outputs),
        artifacts={a.name: StoredArtifact(a.digest, a.size_bytes, a.uri)
                   for a in sorted(row.artifacts, key=lambda a: a.name)},
        size_bytes=row.size_bytes, created_at=row.created_at, last_used_at=row.last_used_at,
        hits=row.hits)


class Tx:
    """The primitive operations inside one transaction."""

    def __init__(self, session: Session) -> None:
        self._s = session

    # ------------------------------------------------------------------ entries

    def get(self, key: str) -> CacheEntry | None:
        """The entry for ``key``, or None."""
        row = self._s.get(EntryRow, key)
        return _entry(row) if row is not None else None

    def get_many(self, keys: Sequence[str]) -> dict[str, CacheEntry]:
        """The entries for those of ``keys`` that have one, by key (a few queries for
        thousands of keys, not one per key)."""
        found: dict[str, CacheEntry] = {}
        for at in range(0, len(keys), _IN_CHUNK):
            rows = self._s.scalars(sa.select(EntryRow).where(
                EntryRow.key.in_(keys[at:at + _IN_CHUNK])))
            found.update((row.key, _entry(row)) for row in rows)
        return found

    def insert(self, entry: CacheEntry, now: float) -> bool:
        """Add ``entry`` (sized by the caller); False when ``key`` is already present."""
        if self._s.get(EntryRow, entry.key) is not None:
            return False
        row = EntryRow(
            key=entry.key, workflow=entry.workflow, step=entry.step,
            outputs=json.dumps(dict(entry.outputs), sort_keys=True),
            size_bytes=entry.size_bytes, created_at=now, last_used_at=now,
            used_seq=self._tick(), hits=0,
            artifacts=[ArtifactRow(name=name, digest=a.digest, size_bytes=a.size_bytes,
                                   uri=a.uri) for name, a in entry.artifacts.items()])
        self._s.add(row)
        self._s.flush()  # a concurrent replica's insert fails here, inside the transaction
        return True

    def touch(self, key: str, now: float) -> CacheEntry:
        """Mark ``key`` used now (one more hit); its entry after the change."""
        row = self._s.get_one(EntryRow, key)
        row.last_used_at = now
        row.used_seq = self._tick()
        row.hits += 1
        self._s.flush()
        return _entry(row)

    def delete(self, key: str) -> Removed | None:
        """Remove ``key``'s entry and its artifact rows; None when it was not there."""
        row = self._s.get(EntryRow, key)
        if row is None:
            return None
        removed = Removed(row.key, row.size_bytes,
                          tuple(sorted({a.digest for a in row.artifacts})))
        self._s.delete(row)
        self._s.flush()
        return removed

    def least_recently_used(self, exclude: Iterable[str] = ()) -> str | None:
        """The key used longest ago, other than ``exclude``; None when there is none."""
        query = sa.select(EntryRow.key).order_by(EntryRow.used_seq, EntryRow.key).limit(1)
        skip = list(exclude)
        if skip:
            query = query.where(EntryRow.key.not_in(skip))
        return self._s.scalars(query).first()

    def totals(self) -> tuple[int, int]:
        """Entries and their bytes."""
        count, total = self._s.execute(
            sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(EntryRow.size_bytes), 0))
        ).one()
        return int(count), int(total)

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
