"""Alembic migrations run programmatically at service start, one version table per service.

Each service owns a script directory with the usual ``versions/`` folder of alembic revision
files (``revision``, ``down_revision``, ``upgrade()``, ``downgrade()``); it needs no
``env.py`` or ``alembic.ini``: :func:`migrate` is the migration environment. The version table
is ``alembic_version_<service>``, so the services' histories stay apart in a shared database.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError

from couler.errors import RetryableError, UserError
from couler_runtime.store.engine import make_engine

__all__ = ["current_revisions", "migrate", "version_table"]

_SERVICE = re.compile(r"[a-z][a-z0-9_]{0,39}")
# alembic's ``op`` and ``context`` are module-level proxies bound to the running migration, so
# two migrations in one process must not overlap (processes are serialised by the locks below).
_IN_PROCESS = threading.Lock()


def version_table(service: str) -> str:
    """The name of ``service``'s alembic version table."""
    if not _SERVICE.fullmatch(service):
        raise UserError(f"service name {service!r} must be a lowercase identifier")
    return f"alembic_version_{service}"


def migrate(engine_url: str | URL | Engine, service: str, script_location: str | Path, *,
            target: str = "head") -> tuple[str, ...]:
    """Upgrade ``service``'s tables to ``target`` (idempotent; run at every start).

    On PostgreSQL an advisory lock per service serialises replicas starting together.

    Args:
        engine_url: The database (a URL or an engine).
        service: The service's name; the version table is ``alembic_version_<service>``.
        script_location: The service's alembic script directory (with ``versions/``).
        target: The revision to upgrade to.

    Returns:
        The revisions current after the upgrade.

    Raises:
        UserError: The script directory or a revision is invalid.
        RetryableError: The database is unreachable.
    """
    table = version_table(service)
    config = Config()
    config.set_main_option("script_location", str(script_location))
    try:
        script = ScriptDirectory.from_config(config)
    except CommandError as e:
        raise UserError(f"migrations of {service!r}: {e}") from None

    def upgrade(rev: Any, _context: Any) -> Any:
        return script._upgrade_revs(target, rev)

    engine = engine_url if isinstance(engine_url, Engine) else make_engine(engine_url)
    try:
        with engine.connect() as conn:
            with _lock(conn, table):
                env = EnvironmentContext(config, script, fn=upgrade, destination_rev=target)
                with env:
                    env.configure(
                        connection=conn, version_table=table,
                        # SQLite cannot ALTER most things: alembic copies the table instead.
                        render_as_batch=conn.dialect.name == "sqlite",
                        transaction_per_migration=True,
                    )
                    with env.begin_transaction():
                        env.run_migrations()
                conn.commit()
            return _heads(conn, table)
    except CommandError as e:
        raise UserError(f"migrations of {service!r}: {e}") from None
    except OperationalError as e:
        raise RetryableError(f"migrations of {service!r}: database unavailable: {e.orig}") from e
    finally:
        if engine is not engine_url:
            engine.dispose()


def current_revisions(engine_url: str | URL | Engine, service: str) -> tuple[str, ...]:
    """The revisions recorded in ``service``'s version table (empty before the first run)."""
    engine = engine_url if isinstance(engine_url, Engine) else make_engine(engine_url)
    try:
        with engine.connect() as conn:
            return _heads(conn, version_table(service))
    finally:
        if engine is not engine_url:
            engine.dispose()


def _heads(conn: Connection, table: str) -> tuple[str, ...]:
    context = MigrationContext.configure(conn, opts={"version_table": table})
    return tuple(sorted(context.get_current_heads()))


@contextmanager
def _lock(conn: Connection, table: str) -> Iterator[None]:
    """Serialise migrations of one service: a PostgreSQL advisory lock keyed by the version
    table, or an exclusive ``flock`` on a file beside a SQLite database."""
    with _IN_PROCESS:
        if conn.dialect.name == "postgresql":
            with _pg_lock(conn, table):
                yield
            return
        database = conn.engine.url.database or ""
        if database in ("", ":memory:") or database.startswith("file:"):
            yield
            return
        with open(f"{database}.{table}.lock", "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)


@contextmanager
def _pg_lock(conn: Connection, table: str) -> Iterator[None]:
    key = int.from_bytes(hashlib.sha256(table.encode()).digest()[:8], "big", signed=True)
    conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
    conn.commit()
    try:
        yield
    finally:
        if not conn.closed and not conn.invalidated:
            if conn.in_transaction():
                conn.rollback()
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()
