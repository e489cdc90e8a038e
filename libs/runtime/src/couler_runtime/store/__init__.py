"""SQL storage shared by the services: engines, sessions and per-service migrations.

* :func:`make_engine` -- SQLite (WAL, foreign keys, busy timeout) or PostgreSQL (psycopg 3).
* :func:`session_scope` -- one transaction; database errors become Couler errors
  (connection trouble and lock timeouts -> RetryableError, constraint violations ->
  ConflictError). :func:`connection_scope` -- the same on a Core connection, for the
  statements a service runs per event (no ORM unit of work). :func:`is_local` -- whether
  short transactions may run on the event loop (SQLite) rather than in a worker thread.
* :func:`migrate` -- alembic upgrade at service start, one version table per service
  (``alembic_version_<service>``) so several services can share one database.

The API is synchronous (SQLAlchemy); asyncio services call it through
``asyncio.to_thread``, or run short transactions on the loop where :func:`is_local`.
"""

from couler_runtime.store.engine import (
    connection_scope,
    is_local,
    make_engine,
    make_session_factory,
    normalize_url,
    session_scope,
)
from couler_runtime.store.migrations import current_revisions, migrate, version_table

__all__ = [
    "connection_scope",
    "current_revisions",
    "is_local",
    "make_engine",
    "make_session_factory",
    "migrate",
    "normalize_url",
    "session_scope",
    "version_table",
]
