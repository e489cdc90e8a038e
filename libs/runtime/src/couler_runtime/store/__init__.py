"""SQL storage shared by the services: engines, sessions and per-service migrations.

* :func:`make_engine` -- SQLite (WAL, foreign keys, busy timeout) or PostgreSQL (psycopg 3).
* :func:`session_scope` -- one transaction; database errors become Couler errors
  (connection trouble and lock timeouts -> RetryableError, constraint violations ->
  ConflictError).
* :func:`migrate` -- alembic upgrade at service start, one version table per service
  (``alembic_version_<service>``) so several services can share one database.

The API is synchronous (SQLAlchemy's ORM); asyncio services call it through
``asyncio.to_thread`` or keep their transactions short.
"""

from couler_runtime.store.engine import (
    make_engine,
    make_session_factory,
    normalize_url,
    session_scope,
)
from couler_runtime.store.migrations import current_revisions, migrate, version_table

__all__ = [
    "current_revisions",
    "make_engine",
    "make_session_factory",
    "migrate",
    "normalize_url",
    "session_scope",
    "version_table",
]
