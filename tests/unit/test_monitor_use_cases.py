"""The monitor's use cases (couler_monitor.service.Monitor) on SQLite, no sockets.

The monitor publishes each recommendation it makes through a port of its own (an async
callable, the bus in production); here it is :class:`FakeRecommendationPort`, a fake of
that port that records what was published and can fail the way an unreachable bus does.
The same service on a real nats-server, with its feedback read off the bus, is
tests/integration/test_monitor_service.py.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from couler import ir
from couler.engines.base import StepState
from couler.errors import NotFoundError, RetryableError, UserError
from couler_monitor.service import Monitor as UseCases
from couler_monitor.store import MonitorStore
from couler_runtime.rpc.records import Recommendation, Run, RunState, StepRecord, UtilizationSample
from tests.integration.test_monitor_service import MI, _mi, by_kind, expected_memory


class FakeRecommendationPort:
    """A fake of the monitor's publish port: appends to ``sent``; while ``fail`` holds
    items, pops one and raises as an unreachable bus does."""

    def __init__(self, sent: list[Recommendation], fail: list[bool] | None = None) -> None:
        self.sent = sent
        self.fail = fail

    async def __call__(self, rec: Recommendation) -> None:
        if self.fail:
            self.fail.pop()
            raise RetryableError("publish: NATS unavailable")
        self.sent.append(rec)


def _monitor_on(path: Path, sent: list[Recommendation], *, fail: list[bool] | None = None,
                history_runs: int = 10) -> tuple[Any, Any]:
    store = MonitorStore.open(f"sqlite:///{path / 'monitor.db'}")
    return UseCases(store, FakeRecommendationPort(sent, fail), history_runs=history_runs), store


def _record(name: str, state: str, *, peak: int | None = None,
            finished: float | None = None) -> Any:
    return StepRecord(name=name, state=StepState(state), attempts=1, peak_memory_bytes=peak,
                      finished_at=finished)


def test_retry_limits_and_back_off_are_learned_from_failures(tmp_path: Path) -> None:
    """Every failed attempt is kept (monitor_step_failures); a step that recovered from
    transient failures gets a limit covering them and a back-off from its recovery time,
    a step that never failed transiently in 5 runs gets limit 0, and OOM keeps its own."""
    sent: list[Recommendation] = []
    monitor, store = _monitor_on(tmp_path, sent)
    infra = ir.FailureClass.INFRA

    def rec(name: str, state: StepState, attempts: int, *, at: float,
            failure: ir.FailureClass | None = None, peak: int | None = None) -> StepRecord:
        return StepRecord(name=name, state=state, attempts=attempts, failure_class=failure,
                          failure_reason=f"{failure.value}: why" if failure else "",
                          finished_at=at if state.terminal else None, peak_memory_bytes=peak)

    async def scenario() -> None:
        for i in range(5):
            t = 1000.0 * (i + 1)
            await monitor.record_step(f"ok{i}", "wf", "local",
                                      rec("steady", StepState.SUCCEEDED, 1, at=t), t)
        # flaky: the network twice (retrying events), then success 40 s after the first
        for a in (1, 2):
            await monitor.record_step("f1", "wf", "local", rec(
                "flaky", StepState.RETRYING, a, at=0, failure=infra), 100.0 + 10 * a)
        await monitor.record_step("f1", "wf", "local",
                                  rec("flaky", StepState.SUCCEEDED, 3, at=150.0), 150.0)
        # redelivered: kept once
        await monitor.record_step("f1", "wf", "local", rec(
            "flaky", StepState.RETRYING, 1, at=0, failure=infra), 110.0)
        # oom: a step killed at its memory limit 5 times and never transient
        for i in range(5):
            t = 5000.0 + i
            await monitor.record_step(f"o{i}", "wf", "local", rec(
                "hog", StepState.FAILED, 1, at=t, failure=ir.FailureClass.OOM,
                peak=100 * MI), t)

    try:
        asyncio.run(scenario())
        recs = asyncio.run(monitor.recommendations("wf"))
        by = {(r.step, r.kind.value): r for r in recs}
        steady = by[("steady", "retry")]
        assert (steady.value, steady.based_on_samples) == ("0", 5)
        assert steady.failure_class is ir.FailureClass.TRANSIENT  # the platform's still are
        assert "no transient or infrastructure failure in 5 runs" in steady.reason
        flaky = by[("flaky", "retry")]
        # two retries needed: limit 3; 40 s over 2 retries: back-off 20 s
        assert (flaky.value, flaky.failure_class) == ("3", infra)
        assert by[("flaky", "retry_backoff")].value == "20"
        hog = by[("hog", "retry")]
        assert (hog.value, hog.failure_class) == ("2", ir.FailureClass.OOM)  # not lowered
        assert ("hog", "memory_limit") in by
        with store.transaction() as tx:
            failed = [(f.attempt, f.failure_class) for row, fs in
                      tx.step_history("wf", "flaky", 10) for f in fs]
        assert failed == [(1, "infra"), (2, "infra")]
    finally:
        store.close()


def test_a_failed_publish_is_sent_on_redelivery_with_the_same_id(tmp_path: Path) -> None:
    """The recommendation row is the outbox: committed first, published after, once."""

    sent: list[Recommendation] = []
    monitor, store = _monitor_on(tmp_path, sent, fail=[True])
    first = _record("train", "succeeded", peak=300 * MI, finished=99.0)
    record = _record("train", "succeeded", peak=300 * MI, finished=100.0)
    want = expected_memory([(99.0, 300 * MI), (100.0, 300 * MI)])

    async def scenario() -> None:
        await monitor.record_step("r0", "wf", "local", first, 99.0)  # one run: nothing
        with pytest.raises(RetryableError):
            await monitor.record_step("r1", "wf", "local", record, 100.0)
        assert sent == []
        stored = await monitor.recommendations("wf")
        assert [r.value for r in stored] == [want]  # committed before publishing
        await monitor.record_step("r1", "wf", "local", record, 100.0)  # the redelivery
        assert [(r.id, r.value) for r in sent] == [(f"wf/train/memory_request/{want}", want)]
        await monitor.record_step("r1", "wf", "local", record, 100.0)  # and once more
        assert len(sent) == 1
        assert [r.runs for r in await monitor.recommendations("wf")] == [2]  # not 3

    try:
        asyncio.run(scenario())
    finally:
        store.close()
    # A restart finds nothing left to publish.
    again: list[Recommendation] = []
    monitor, store = _monitor_on(tmp_path, again)
    try:
        assert asyncio.run(monitor.publish_pending()) == 0
    finally:
        store.close()


def test_old_runs_decay_away(tmp_path: Path) -> None:
    """Runs ten days apart (a 24 h half-life): the newest run all but decides the p95, and
    the request follows it down."""
    sent: list[Recommendation] = []
    monitor, store = _monitor_on(tmp_path, sent)
    day = 86400.0
    peaks = [(100.0 + i * 10 * day, peak * MI) for i, peak in enumerate([500, 200, 100])]

    async def scenario() -> list[str]:
        for i, (at, peak) in enumerate(peaks):
            await monitor.record_step(f"r{i}", "wf", "local",
                                      _record("s", "succeeded", peak=peak, finished=at), at)
        return [r.value for r in sent]

    try:
        got = asyncio.run(scenario())
    finally:
        store.close()
    assert got == [expected_memory(peaks[:2]), expected_memory(peaks)]
    assert _mi(got[0]) < 500 and _mi(got[1]) < 200


def test_requests_below_the_minimum_are_raised_to_it(tmp_path: Path) -> None:
    """A tiny step (a shell command) peaks at a few MiB and no CPU to speak of: the
    recommendation is the configured minimum, and its reason says so."""
    sent: list[Recommendation] = []
    store = MonitorStore.open(f"sqlite:///{tmp_path / 'monitor.db'}")
    monitor = UseCases(store, FakeRecommendationPort(sent), min_memory_bytes=32 * MI,
                       min_cpu=0.05)

    async def scenario() -> None:
        for i in range(2):
            at = 100.0 + i
            await monitor.record_sample(UtilizationSample(f"r{i}", "wf", "echo", at, 0.001,
                                                          3 * MI))
            await monitor.record_step(f"r{i}", "wf", "local", StepRecord(
                name="echo", state=StepState.SUCCEEDED, attempts=1, peak_memory_bytes=3 * MI,
                peak_cpu=0.001, finished_at=at), at)

    try:
        asyncio.run(scenario())
    finally:
        store.close()
    got = {r.kind.value: r for r in sent}
    assert got["memory_request"].value == "32Mi"
    assert "raised to the minimum 32Mi" in got["memory_request"].reason
    assert got["cpu_request"].value == "50m"
    assert "raised to the minimum 50m" in got["cpu_request"].reason
    assert got["cpu_request"].lower_bound == "50m"


def test_damaged_histograms_are_rebuilt_from_the_stored_samples(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Stored histograms that cannot be parsed never stop the service: they are rebuilt
    from the samples and steps it stored (logged), and the recommendation is the same."""
    sent: list[Recommendation] = []
    monitor, store = _monitor_on(tmp_path, sent)

    async def run(i: int) -> None:
        at = 1000.0 + 60 * i
        for k in range(5):
            await monitor.record_sample(UtilizationSample(
                f"r{i}", "wf", "fit", at + k, 0.2 + 0.1 * k, (100 + 10 * i) * MI))
        await monitor.record_step(f"r{i}", "wf", "local",
                                  _record("fit", "succeeded", peak=(100 + 10 * i) * MI,
                                          finished=at + 5), at + 5)

    async def before() -> tuple[Recommendation, ...]:
        for i in range(3):
            await run(i)
        return await monitor.recommendations("wf")

    try:
        healthy = asyncio.run(before())
    finally:
        store.close()
    assert {r.kind.value for r in healthy} == {"memory_request", "cpu_request"}

    con = sqlite3.connect(tmp_path / "monitor.db")
    with con:
        con.execute("UPDATE monitor_recommender_state SET state = '{not json'")
    con.close()
    caplog.set_level(logging.WARNING, logger="couler_monitor")
    monitor, store = _monitor_on(tmp_path, sent)
    try:
        asyncio.run(run(3))
        after = by_kind(asyncio.run(monitor.recommendations("wf")))
    finally:
        store.close()
    assert any("cannot be read" in r.getMessage() and "rebuilding" in r.getMessage()
               for r in caplog.records)
    # the same as if nothing had been damaged: four runs, 20 samples
    assert (after["fit:cpu_request"].runs, after["fit:cpu_request"].samples) == (4, 20)
    assert after["fit:memory_request"].runs == 4
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    monitor, store = _monitor_on(fresh, [])
    try:
        async def undamaged() -> dict[str, Recommendation]:
            for i in range(4):
                await run(i)
            return by_kind(await monitor.recommendations("wf"))

        clean = asyncio.run(undamaged())
    finally:
        store.close()
    assert {k: (r.value, r.target, r.lower_bound, r.upper_bound) for k, r in after.items()} \
        == {k: (r.value, r.target, r.lower_bound, r.upper_bound) for k, r in clean.items()}


def test_the_changes_of_a_batch_commit_together(tmp_path: Path) -> None:
    """A consumer's batch of events is one transaction: all of it, or none of it."""

    sent: list[Recommendation] = []
    monitor, store = _monitor_on(tmp_path, sent)

    def broken(tx: Any) -> bool:
        raise RetryableError("database locked")

    async def scenario() -> None:
        await monitor.record_step("r0", "wf", "local",
                                  _record("train", "succeeded", peak=300 * MI, finished=0.5),
                                  0.5)
        await monitor.apply([
            monitor.requested_change("r1", workflow="wf", engine="local", at=1.0),
            monitor.step_change("r1", "wf", "local",
                                _record("train", "succeeded", peak=300 * MI, finished=2.0),
                                2.0),
            monitor.finished_change(Run(run_id="r1", state=RunState.SUCCEEDED, workflow="wf",
                                        engine="local", finished_at=3.0))])
        run = await monitor.run("r1")
        assert (run.state, run.created_at, run.finished_at) == (RunState.SUCCEEDED, 1.0, 3.0)
        assert [s.name for s in run.steps] == ["train"]
        assert [r.value for r in sent] == [expected_memory([(0.5, 300 * MI), (2.0, 300 * MI)])]
        with pytest.raises(RetryableError):
            await monitor.apply([
                monitor.requested_change("r2", workflow="wf", engine="local", at=4.0),
                broken])
        with pytest.raises(NotFoundError):
            await monitor.run("r2")  # the batch left nothing behind
        with pytest.raises(UserError, match="field 'run_id' is empty"):
            monitor.step_change("", "wf", "local", _record("train", "succeeded"), 5.0)

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_samples_after_the_step_end_count_the_run(tmp_path: Path) -> None:
    """Samples and step events come through different consumers: a run whose step ended
    (unmeasured) before its samples arrived counts once they do, and a step nobody
    measured recommends nothing."""
    sent: list[Recommendation] = []
    monitor, store = _monitor_on(tmp_path, sent)

    async def scenario() -> None:
        for i in range(2):
            at = 100.0 + i
            await monitor.record_step(f"r{i}", "wf", "local",
                                      _record("late", "succeeded", finished=at), at)
            await monitor.record_sample(UtilizationSample(f"r{i}", "wf", "late", at - 0.5,
                                                          0.5, 200 * MI))
            await monitor.record_step(f"r{i}", "wf", "local",
                                      _record("never", "succeeded", finished=at), at)

    try:
        asyncio.run(scenario())
        recs = by_kind(asyncio.run(monitor.recommendations("wf")))
    finally:
        store.close()
    assert recs["late:memory_request"].runs == 2
    assert recs["late:memory_request"].value == expected_memory(
        [(99.5, 200 * MI), (100.5, 200 * MI)])
    assert recs["late:cpu_request"].samples == 2
    assert not any(k.startswith("never:") for k in recs)
