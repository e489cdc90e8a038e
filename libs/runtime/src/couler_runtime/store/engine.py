"""Engines and transactions for SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from couler.errors import ConflictError, RetryableError, UserError
from couler_runtime.settings import redact_url

__all__ = ["connection_scope", "is_local", "make_engine", "make_session_factory",
           "normalize_url", "session_scope"]

_PG_ALIASES = ("postgres://", "postgresql://", "postgresql+psycopg2://")


def normalize_url(url: str) -> URL:
    """Parse ``url``; plain ``postgres(ql)://`` URLs get the psycopg 3 driver.

    Raises:
        UserError: Not a URL SQLAlchemy understands, or not SQLite/PostgreSQL.
    """
    for alias in _PG_ALIASES:
        if url.startswith(alias):
            url = "postgresql+psycopg://" + url.removeprefix(alias)
            break
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise UserError(f"database URL {redact_url(url)!r}: {e}") from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise UserError(f"database URL {redact_url(url)!r}: only sqlite and postgresql "
                        "are supported")
    return parsed


def make_engine(url: str | URL, *, busy_timeout: float = 10.0, echo: bool = False) -> Engine:
    """An engine for ``url`` configured for services.

    SQLite: the file's directory is created; every connection uses WAL (readers do not block
    the writer), enforces foreign keys and waits up to ``busy_timeout`` seconds for a lock.
    PostgreSQL: psycopg 3, connections checked before use (they survive a server restart).

    Args:
        url: A SQLAlchemy URL, e.g. ``sqlite:////var/lib/couler/cache.db`` or
            ``postgresql+psycopg://user:pass@host:5432/couler``.
        busy_timeout: Seconds to wait for a locked SQLite database.
        echo: Log every statement.
    """
    parsed = normalize_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        in_memory = database in ("", ":memory:") or database.startswith("file:")
        if not in_memory:
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, echo=echo, connect_args={"timeout": busy_timeout})
        timeout_ms = int(busy_timeout * 1000)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                if not in_memory:
                    cursor.execute("PRAGMA journal_mode=WAL")
                    cursor.execute("PRAGMA synchronous=NORMAL")  # durable enough with WAL
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.execute(f"PRAGMA busy_timeout={timeout_ms}")
            finally:
                cursor.close()

        return engine
    return create_engine(parsed, echo=echo, pool_pre_ping=True)


def is_local(engine: Engine) -> bool:
    """Whether ``engine`` is SQLite: a file on this machine, reached without a network round
    trip, committed without an fsync (WAL, ``synchronous=NORMAL``). A short transaction
    there costs a fraction of a millisecond of CPU -- less than handing it to a worker
    thread and back -- so a service may run its short transactions on its event loop
    (PostgreSQL's go to a worker thread: a round trip would stall the loop)."""
    return engine.dialect.name == "sqlite"


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One transaction: committed when the block ends, rolled back if it raises.

    Raises:
        ConflictError: A constraint was violated (unique key, foreign key, ...).
        RetryableError: The database was unreachable, restarted or locked.
    """
    session = factory()
    try:
        yield session
        session.commit()
    except IntegrityError as e:
        session.rollback()
        raise ConflictError(f"database constraint violated: {e.orig}") from e
    except OperationalError as e:
        session.rollback()
        raise RetryableError(f"database unavailable: {e.orig}") from e
    except SQLAlchemyError as e:
        session.rollback()
        if getattr(e, "connection_invalidated", False):
            raise RetryableError(f"database connection lost: {e}") from e
        raise
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@contextmanager
def connection_scope(engine: Engine) -> Iterator[Connection]:
    """One transaction on a Core connection (no ORM unit of work: for hot paths), with
    :func:`session_scope`'s errors: committed when the block ends, rolled back if it raises.

    Raises:
        ConflictError: A constraint was violated (unique key, foreign key, ...).
        RetryableError: The database was unreachable, restarted or locked.
    """
    try:
        with engine.begin() as conn:
            yield conn
    except IntegrityError as e:
        raise ConflictError(f"database constraint violated: {e.orig}") from e
    except OperationalError as e:
        raise RetryableError(f"database unavailable: {e.orig}") from e
    except SQLAlchemyError as e:
        if getattr(e, "connection_invalidated", False):
            raise RetryableError(f"database connection lost: {e}") from e
        raise
