"""The monitor's utilization tiers: raw samples, compacted into 1-minute rollups after the
raw retention, deleted after the rollup retention -- with a pinned clock, on SQLite and
PostgreSQL.

Compaction is idempotent and crash-safe: a batch is one transaction (rollups merged, raw
samples deleted), so a crash in the middle of one changes nothing, and running it again
counts nothing twice. Queries read both tiers, bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from couler.errors import UserError
from couler_monitor.service import Monitor
from couler_monitor.store import MonitorStore, RollupRow, SampleRow, Tx
from couler_runtime.rpc.records import Recommendation, UtilizationSample
from tests.servers import scratch_database

DAY = 86400.0
MI = 1024 * 1024
NOW = 1_800_000_000.0  # the pinned clock: a whole minute (30_000_000 minutes)


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'monitor.db'}"
        return
    with scratch_database(request.getfixturevalue("postgres_url"), "retention") as url:
        yield url


@pytest.fixture
def store(database: str) -> Iterator[MonitorStore]:
    opened = MonitorStore.open(database)
    yield opened
    opened.close()


def monitor(store: MonitorStore, clock: Clock, **kw: Any) -> Monitor:
    async def publish(rec: Recommendation) -> None:
        raise AssertionError(f"nothing is recommended here, got {rec}")

    return Monitor(store, publish, clock=clock, **kw)


def sample(at: float, cpu: float, memory: int, *, step: str = "train", run: str = "r1",
           attempt: int = 1) -> UtilizationSample:
    return UtilizationSample(run_id=run, workflow="wf", step=step, at=at, cpu=cpu,
                             memory_bytes=memory, attempt=attempt, interval_seconds=1.0)


def record(m: Monitor, *samples: UtilizationSample) -> list[bool]:
    """Store ``samples`` (one transaction); whether each was new."""
    async def go() -> list[bool]:
        news: list[bool] = []

        def watch(change: Any) -> Any:
            def write(tx: Tx) -> bool:
                new = change(tx)
                news.append(new)
                return new
            return write

        await m.apply([watch(m.sample_change(s)) for s in samples])
        return news

    return asyncio.run(go())


def rows(store: MonitorStore) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(raw samples as (step, at, cpu), rollups as (step, minute, count, mean, max cpu,
    max memory)), sorted."""
    with store.transaction() as tx:
        raw = sorted((r.step, r.at_ns / 1e9, r.cpu)
                     for r in tx.session.scalars(sa.select(SampleRow)))
        rolled = sorted((r.step, r.minute, r.count, round(r.cpu_sum / r.count, 6), r.cpu_max,
                         r.memory_max) for r in tx.session.scalars(sa.select(RollupRow)))
    return raw, rolled


def old_and_new(m: Monitor) -> None:
    """Two minutes of samples of ``train`` a day and 2 minutes ago (past the raw retention),
    one of ``eval`` then too, and three recent samples of ``train``."""
    old = NOW - DAY - 120  # the minute starting there, and the next
    record(m, sample(old + 1, 1.0, 100 * MI), sample(old + 2, 0.5, 300 * MI),
           sample(old + 59, 1.5, 200 * MI), sample(old + 61, 0.25, 50 * MI),
           sample(old + 5, 2.0, 10 * MI, step="eval"),
           *(sample(NOW - 30 + i, 0.75, 120 * MI) for i in range(3)))


def test_old_samples_are_compacted_into_minutes_and_both_tiers_are_read(
        store: MonitorStore) -> None:
    m = monitor(store, Clock())
    old_and_new(m)
    done = asyncio.run(m.maintain())
    assert (done.compacted, done.expired_samples, done.expired_rollups) == (5, 0, 0)
    raw, rolled = rows(store)
    assert [r[0] for r in raw] == ["train"] * 3  # the recent ones, as they were
    minute = int((NOW - DAY - 120) // 60) * 60
    assert rolled == [
        ("eval", minute, 1, 2.0, 2.0, 10 * MI),
        ("train", minute, 3, 1.0, 1.5, 300 * MI),  # mean of 1, 0.5, 1.5; max memory
        ("train", minute + 60, 1, 0.25, 0.25, 50 * MI),
    ]
    # The Utilization query: raw where kept, rollups for older time; peaks over both.
    usage = asyncio.run(m.utilization(run_id="r1"))
    assert [round(s.at - NOW) for s in usage.samples] == [-30, -29, -28]
    assert [(r.step, r.start, r.samples, r.cpu_mean, r.cpu_max, r.memory_max_bytes)
            for r in usage.rollups] == [
        ("eval", minute, 1, 2.0, 2.0, 10 * MI), ("train", minute, 3, 1.0, 1.5, 300 * MI),
        ("train", minute + 60, 1, 0.25, 0.25, 50 * MI)]
    peaks = {p.step: p for p in usage.peaks}
    assert (peaks["train"].peak_cpu, peaks["train"].peak_memory_bytes,
            peaks["train"].samples) == (1.5, 300 * MI, 7)
    assert (peaks["eval"].peak_cpu, peaks["eval"].samples) == (2.0, 1)
    # bounded: the newest points of both tiers together
    few = asyncio.run(m.utilization(run_id="r1", limit=4))
    assert len(few.samples) + len(few.rollups) == 4
    assert len(few.samples) == 3 and few.rollups[0].start == minute + 60
    one = asyncio.run(m.utilization(run_id="r1", limit=1))
    assert (len(one.samples), len(one.rollups)) == (1, 0)
    assert round(one.samples[0].at - NOW) == -28


def test_maintenance_is_idempotent_and_counts_late_samples_once(store: MonitorStore) -> None:
    m = monitor(store, Clock())
    old_and_new(m)
    asyncio.run(m.maintain())
    before = rows(store)
    again = asyncio.run(m.maintain())
    assert (again.compacted, again.expired_samples, again.expired_rollups) == (0, 0, 0)
    assert rows(store) == before
    # A sample of a compacted minute arriving late (its publisher was away) is stored,
    # then merged into its minute's rollup: counted once.
    minute = int((NOW - DAY - 120) // 60) * 60
    assert record(m, sample(minute + 30, 3.0, 400 * MI)) == [True]
    assert record(m, sample(minute + 30, 3.0, 400 * MI)) == [False]  # redelivered: once
    asyncio.run(m.maintain())
    _, rolled = rows(store)
    assert ("train", minute, 4, 1.5, 3.0, 400 * MI) in rolled


def test_a_crash_in_the_middle_of_a_batch_changes_nothing(store: MonitorStore,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    m = monitor(store, Clock())
    old_and_new(m)
    before = rows(store)
    merge = Tx._merge_rollups

    def merge_then_crash(self: Tx, batch: list[dict[str, Any]]) -> None:
        merge(self, batch)  # the rollups are written ...
        raise OSError("the process died here")  # ... and the samples not deleted yet

    monkeypatch.setattr(Tx, "_merge_rollups", merge_then_crash)
    with pytest.raises(OSError, match="died"):
        asyncio.run(m.maintain())
    assert rows(store) == before  # rolled back: no rollup, every sample kept
    monkeypatch.setattr(Tx, "_merge_rollups", merge)
    asyncio.run(m.maintain())
    _, rolled = rows(store)
    minute = int((NOW - DAY - 120) // 60) * 60
    assert ("train", minute, 3, 1.0, 1.5, 300 * MI) in rolled  # counted once


def test_batches_of_any_size_give_the_same_rollups(database: str, store: MonitorStore) -> None:
    clock = Clock()
    m = monitor(store, clock)
    old_and_new(m)
    done = asyncio.run(m.maintain(batch=2))  # a minute's samples across several batches
    assert done.compacted == 5 and done.transactions >= 5
    _, rolled = rows(store)
    minute = int((NOW - DAY - 120) // 60) * 60
    assert rolled == [("eval", minute, 1, 2.0, 2.0, 10 * MI),
                      ("train", minute, 3, 1.0, 1.5, 300 * MI),
                      ("train", minute + 60, 1, 0.25, 0.25, 50 * MI)]


def test_rollups_and_raw_samples_expire_after_the_rollup_retention(
        store: MonitorStore) -> None:
    clock = Clock()
    m = monitor(store, clock, sample_retention=3600, rollup_retention=2 * DAY)
    old_and_new(m)
    asyncio.run(m.maintain())  # everything older than an hour is compacted
    raw, rolled = rows(store)
    assert len(raw) == 3 and len(rolled) == 3
    # a sample older than the rollup retention is deleted, not compacted
    record(m, sample(NOW - 3 * DAY, 9.0, MI, step="ancient"))
    clock.now = NOW + DAY  # the old rollups are now 2 days and 2 minutes old
    done = asyncio.run(m.maintain())
    assert (done.compacted, done.expired_samples, done.expired_rollups) == (3, 1, 3)
    raw, rolled = rows(store)
    assert raw == []  # the recent ones were compacted in their turn
    assert [(r[0], r[2]) for r in rolled] == [("train", 3)]
    assert asyncio.run(m.utilization(workflow="wf", step="ancient")).peaks == ()


def test_retention_settings_are_checked(store: MonitorStore, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="rollup retention"):
        monitor(store, Clock(), sample_retention=2 * DAY, rollup_retention=DAY)
    from couler_monitor.main import MonitorSettings
    from couler_runtime.settings import SettingsError

    with pytest.raises(SettingsError, match="rollup_retention"):
        MonitorSettings.load("monitor", state_dir=tmp_path, sample_retention=7200,
                             rollup_retention=3600)
    defaults = MonitorSettings.load("monitor", state_dir=tmp_path)
    assert (defaults.sample_retention, defaults.rollup_retention,
            defaults.maintenance_interval) == (DAY, 30 * DAY, 300.0)
