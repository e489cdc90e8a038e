"""SQL stores and per-service migrations on SQLite and a real PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from couler.errors import ConflictError, RetryableError, UserError
from couler_runtime.store import (
    current_revisions,
    make_engine,
    make_session_factory,
    migrate,
    normalize_url,
    session_scope,
    version_table,
)
from tests.servers import PostgresServer, free_port, scratch_database

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "migrations_sample"
ALPHA, BETA = SAMPLES / "alpha", SAMPLES / "beta"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh empty database: a SQLite file, or a new database in the session's cluster."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state' / 'test.db'}"
        return
    with scratch_database(request.getfixturevalue("postgres_url"), "t") as url:
        yield url


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrate_to_head_is_idempotent(db_url: str) -> None:
    assert current_revisions(db_url, "alpha") == ()
    assert migrate(db_url, "alpha", ALPHA) == ("alpha_0002",)
    assert tables(db_url) == {"alpha_runs", "alpha_steps", "alembic_version_alpha"}
    assert migrate(db_url, "alpha", ALPHA) == ("alpha_0002",)  # again: nothing to do
    assert current_revisions(db_url, "alpha") == ("alpha_0002",)


def test_upgrade_step_by_step_keeps_data(db_url: str) -> None:
    assert migrate(db_url, "alpha", ALPHA, target="alpha_0001") == ("alpha_0001",)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO alpha_runs (id, state) VALUES ('r1', 'done')"))
        assert migrate(engine, "alpha", ALPHA) == ("alpha_0002",)
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT id, state, created FROM alpha_runs")).all()
        assert [tuple(r) for r in rows] == [("r1", "done", 0.0)]
    finally:
        engine.dispose()


def test_two_services_keep_their_own_version_tables(db_url: str) -> None:
    migrate(db_url, "alpha", ALPHA)
    migrate(db_url, "beta", BETA)
    assert tables(db_url) == {"alpha_runs", "alpha_steps", "alembic_version_alpha",
                              "beta_cache", "alembic_version_beta"}
    assert current_revisions(db_url, "alpha") == ("alpha_0002",)
    assert current_revisions(db_url, "beta") == ("beta_0001",)
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            for service, head in (("alpha", "alpha_0002"), ("beta", "beta_0001")):
                rows = conn.execute(sa.text(f"SELECT version_num FROM {version_table(service)}"))
                assert [r[0] for r in rows] == [head]
    finally:
        engine.dispose()


def test_constraint_violation_is_a_conflict_and_rolls_back(db_url: str) -> None:
    migrate(db_url, "alpha", ALPHA)
    engine = make_engine(db_url)
    factory = make_session_factory(engine)
    try:
        with session_scope(factory) as s:
            s.execute(sa.text("INSERT INTO alpha_runs (id, state) VALUES ('r1', 'running')"))
        # a step of a run that does not exist: foreign keys are enforced (also on SQLite)
        with pytest.raises(ConflictError, match="database constraint violated"), \
                session_scope(factory) as s:
            s.execute(sa.text("INSERT INTO alpha_runs (id, state) VALUES ('r2', 'running')"))
            s.execute(sa.text("INSERT INTO alpha_steps (run_id, name) VALUES ('nope', 'a')"))
        with pytest.raises(ValueError, match="boom"), session_scope(factory) as s:
            s.execute(sa.text("INSERT INTO alpha_runs (id, state) VALUES ('r3', 'running')"))
            raise ValueError("boom")
        with session_scope(factory) as s:
            ids = s.execute(sa.text("SELECT id FROM alpha_runs ORDER BY id")).scalars().all()
        assert ids == ["r1"]  # r2 and r3 were rolled back
    finally:
        engine.dispose()


def test_replicas_starting_together_migrate_once(db_url: str) -> None:
    code = ("import sys; from couler_runtime.store import migrate; "
            "print(migrate(sys.argv[1], 'alpha', sys.argv[2]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url, str(ALPHA)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert [out.strip() for out, _ in outputs] == ["('alpha_0002',)"] * 3
    assert current_revisions(db_url, "alpha") == ("alpha_0002",)


def test_sqlite_engine_uses_wal_foreign_keys_and_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "svc.db"
    engine = make_engine(f"sqlite:///{path}", busy_timeout=7.5)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 7500
        assert path.exists()
    finally:
        engine.dispose()


def test_postgres_urls_get_the_psycopg_driver() -> None:
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    with pytest.raises(UserError, match="only sqlite and postgresql"):
        normalize_url("mysql://u:secret@h/db")
    with pytest.raises(UserError, match=r"'mysql://u:\*\*\*@h/db'"):
        normalize_url("mysql://u:secret@h/db")


def test_unreachable_database_is_retryable() -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(RetryableError, match="migrations of 'alpha': database unavailable"):
        migrate(url, "alpha", ALPHA)


def test_bad_script_location_or_service_name_is_a_user_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(UserError, match="migrations of 'alpha'"):
        migrate(url, "alpha", tmp_path / "missing")
    with pytest.raises(UserError, match="must be a lowercase identifier"):
        migrate(url, "Alpha; DROP", ALPHA)


def test_postgres_listens_on_loopback_only(postgres_server: PostgresServer) -> None:
    assert postgres_server.listen_addresses() == {"127.0.0.1"}
