"""Stored data never stops a service from starting.

The stack runs some work (a local run, a dry run, a failing run, a template, cached steps),
goes down, and then every row of every service's database is damaged: text and JSON
columns become garbage, blobs become random bytes, numbers become absurd, enum values
unknown. ``couler up`` must bring every service up again, ``couler status`` must answer,
new work must run, and what cannot be read is reported, not fatal.
"""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from couler import ir
from couler.errors import CoulerError
from couler_runtime import stack
from couler_runtime.rpc.records import RunState
from tests.e2e.conftest import (
    Stack,
    couler_status,
    outbox_rows,
    start_stack,
    stop_stack,
    wait_until,
)

pytestmark = [pytest.mark.slow]

PY = "python:3.12-alpine"
DEADLINE = 90.0
GARBAGE_TEXT = ("{not json", "\x00\xff garbage", "", "[1, 2", "null", "ALIEN_STATE",
                "9" * 400, "🦀" * 50)
GARBAGE_NUMBERS = (-1, 2**62, 0)


def wait(s: Stack, run_id: str) -> RunState:
    end = time.monotonic() + DEADLINE
    while True:
        run = s.client.submitter.get(run_id)
        if run.state.terminal or time.monotonic() > end:
            return run.state
        time.sleep(0.2)


def good_workflow() -> ir.Workflow:
    out = (ir.OutputParameter("said", source=ir.OutputSource.STDOUT),)
    return ir.Workflow(name="corrupt-good", steps=(
        ir.Step(name="a", body=ir.ScriptSpec(image=PY, source="print('x' * 10)"), outputs=out),
        ir.Step(name="b", body=ir.ScriptSpec(image=PY, source="print('y')"), outputs=out,
                dependencies=(ir.Dependency("a"),))))


def work(s: Stack) -> None:
    """Rows in every table: runs (succeeded, failed, dry), steps, plans, cache entries,
    recommendations and utilization, a template, outbox rows."""
    good = good_workflow()
    bad = ir.Workflow(name="corrupt-bad", steps=(
        ir.Step(name="boom", body=ir.ScriptSpec(image=PY, source="raise SystemExit(3)"),
                retry=ir.RetryPolicy(limit=0)),))
    s.client.submitter.register_template("corrupt-tpl", good)
    runs = [s.client.submitter.submit(good).run_id, s.client.submitter.submit(bad).run_id,
            s.client.submitter.submit(good, engine="dryrun").run_id]
    for run_id in runs:
        assert wait(s, run_id) is not RunState.PENDING
    again = s.client.submitter.submit(good).run_id  # cached steps this time
    assert wait(s, again) is RunState.SUCCEEDED

    def consumed() -> bool:  # the submitter's events are out, the monitor has the last run
        shown = httpx.get(s.info.dashboard.rstrip("/") + "/api/runs", timeout=10,
                          headers={"Authorization": f"Bearer {s.info.token}"})
        return (outbox_rows(s.home) == 0 and shown.status_code == 200
                and {r["run_id"]: r["state"] for r in shown.json()}.get(again) == "succeeded")

    wait_until(consumed, "the last events consumed", deadline=DEADLINE)


def damage(db: Path, rng: random.Random) -> int:
    """Overwrite every non-key column of every row with garbage; the cells changed."""
    changed = 0
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' "
            "AND name NOT LIKE 'alembic%'")]
        for table in tables:
            columns = con.execute(f'PRAGMA table_info("{table}")').fetchall()
            keys = {c[1] for c in columns if c[5]}
            rowids = [r[0] for r in con.execute(f'SELECT rowid FROM "{table}"')]
            for rowid in rowids:
                for _, name, declared, *_ in columns:
                    if name in keys:
                        continue
                    kind = (declared or "").upper()
                    if "INT" in kind or "FLOAT" in kind or "REAL" in kind or "NUM" in kind:
                        value: object = rng.choice(GARBAGE_NUMBERS)
                    elif "BLOB" in kind or "BINARY" in kind:
                        value = rng.randbytes(rng.randint(0, 64))
                    elif "BOOL" in kind:
                        value = rng.choice((0, 1, 7))
                    else:
                        value = rng.choice(GARBAGE_TEXT)
                    try:
                        con.execute(f'UPDATE "{table}" SET "{name}" = ? WHERE rowid = ?',
                                    (value, rowid))
                        changed += 1
                    except sqlite3.IntegrityError:
                        pass  # a NOT NULL or UNIQUE the garbage would break: keep the value
        con.commit()
    finally:
        con.close()
    return changed


def test_every_service_starts_whatever_its_database_holds(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("couler-corrupt")
    s = start_stack(home)
    try:
        work(s)
    finally:
        stop_stack(s)
    rng = random.Random(8)
    databases = sorted((home / "state").glob("*.db"))
    assert {p.stem for p in databases} >= {"cache", "monitor", "optimizer", "submitter"}
    assert all(damage(db, rng) > 0 for db in databases)

    s = start_stack(home)  # every service must come up
    try:
        code, text = couler_status(home)
        assert code == 0, text
        for name in ("cache", "monitor", "generator", "optimizer", "submitter"):
            assert name in text
        # new work runs as before (the cache's damaged entries are not reused as hits)
        out = (ir.OutputParameter("said", source=ir.OutputSource.STDOUT),)
        fresh = ir.Workflow(name="after-damage", steps=(ir.Step(
            name="a", body=ir.ScriptSpec(image=PY, source="print('fine')"), outputs=out),))
        run_id = s.client.submitter.submit(fresh).run_id
        assert wait(s, run_id) is RunState.SUCCEEDED
        assert s.client.submitter.get(run_id).step("a").outputs == {"said": "fine"}
        # the damaged runs are listed or refused with a clear error, never a crash
        page = s.client.submitter.list(page_size=100)
        assert run_id in {r.run_id for r in page.runs}
        for run in page.runs:
            try:
                s.client.submitter.get(run.run_id)
            except CoulerError as exc:
                assert "internal" not in str(exc).lower(), exc
        assert s.client.cache.stats() is not None
        # the workflow whose cache entries, plans and recommendations were damaged runs
        # again: what cannot be read is not reused, and it succeeds
        again = s.client.submitter.submit(good_workflow()).run_id
        assert wait(s, again) is RunState.SUCCEEDED, s.client.submitter.get(again).message
        assert s.client.submitter.get(again).step("b").outputs == {"said": "y"}
        s.client.monitor.recommendations("corrupt-good")
        s.client.monitor.utilization(workflow="corrupt-good")
        s.client.submitter.list_templates()
        with pytest.raises(CoulerError, match="damaged"):
            s.client.submitter.submit(template="corrupt-tpl")
        auth = {"Authorization": f"Bearer {s.info.token}"}
        dashboard = s.info.dashboard.rstrip("/")
        answer = httpx.get(f"{dashboard}/api/runs", headers=auth, timeout=10)
        assert answer.status_code == 200, answer.text
        for listed in answer.json():
            for path in (f"/api/runs/{listed['run_id']}", f"/runs/{listed['run_id']}"):
                page = httpx.get(dashboard + path, headers=auth, timeout=10)
                assert page.status_code == 200, (path, page.text[:300])
        assert httpx.get(f"{dashboard}/", headers=auth, timeout=10).status_code == 200
        info, _ = stack.status(home)
        assert all(p.restarts == 0 for p in info.processes.values()), info.processes
    finally:
        stop_stack(s)
