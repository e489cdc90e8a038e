"""The monitor's utilization time series: the two storage tiers, read and kept.

It owns the retention of utilization samples -- raw samples folded into one rollup per
step execution and minute once older than the sample retention, rollups (and raw samples)
deleted past the rollup retention, one transaction per batch (:func:`compact`) -- and the
query over both tiers: the newest points, raw where kept, rollups for older time, with each
step's peaks over samples, rollups and step records (:func:`read_utilization`). The rules
are in :mod:`couler_monitor.service`'s docstring; :class:`~couler_monitor.service.Monitor`
calls these under its writer lock and validates the filters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from couler_monitor.rows import _INT32, _rollup, _time
from couler_monitor.store import MonitorStore, Tx
from couler_runtime.rpc.records import StepPeak, Utilization, UtilizationSample

__all__ = ["Maintenance", "compact", "read_utilization"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Maintenance:
    """What one :meth:`~couler_monitor.service.Monitor.maintain` did."""

    compacted: int = 0  # raw samples folded into rollups (and deleted)
    expired_samples: int = 0  # raw samples deleted past the rollup retention
    expired_rollups: int = 0  # rollups deleted past the rollup retention
    transactions: int = 0


async def compact(store: MonitorStore, lock: asyncio.Lock, *, now: float,
                  sample_retention: float, rollup_retention: float,
                  batch: int) -> Maintenance:
    """Compact and expire utilization samples as of ``now`` (see the module docstring);
    idempotent.

    Raw samples measured before the start of the minute ``sample_retention`` ago are
    folded into their minutes' rollups, ``batch`` at a time, each batch in one
    transaction; rollups (and raw samples) older than ``rollup_retention`` are deleted.
    Consumers go on between the transactions (``lock`` is the monitor's writer lock,
    taken per transaction).
    """
    raw_before = int((now - sample_retention) // 60) * 60  # a whole minute
    rollup_before = int((now - rollup_retention) // 60) * 60
    done = Maintenance()

    async def step(fn: Callable[[Tx], int]) -> int:
        def txn() -> int:
            with store.transaction() as tx:
                return fn(tx)

        async with lock:  # one writer at a time, between the consumers' batches
            return await asyncio.to_thread(txn)

    expired = await step(lambda tx: tx.expire_samples(rollup_before * 10**9))
    compacted, transactions = 0, 1
    while True:
        n = await step(lambda tx: tx.compact_samples(raw_before * 10**9, batch))
        transactions += 1
        compacted += n
        if n < batch:
            break
    rollups = await step(lambda tx: tx.expire_rollups(rollup_before))
    done = Maintenance(compacted, expired, rollups, transactions + 1)
    if compacted or expired or rollups:
        log.info("utilization: %d raw sample(s) compacted into 1-minute rollups, %d "
                 "sample(s) and %d rollup(s) past the retention deleted", compacted,
                 expired, rollups)
    return done


def read_utilization(tx: Tx, *, run_id: str, workflow: str, step: str,
                     limit: int) -> Utilization:
    """The newest ``limit`` points matching the filter, oldest first -- raw samples where
    they are kept, 1-minute rollups for older time -- and per-step peaks over both tiers
    and the step records (:meth:`~couler_monitor.service.Monitor.utilization`)."""
    raw = tx.samples(run_id=run_id, workflow=workflow, step=step, limit=limit)
    rolled = tx.rollups(run_id=run_id, workflow=workflow, step=step, limit=limit)
    # the newest ``limit`` of both, by time (a rollup's: the end of its minute)
    times = sorted([*(s.at_ns / 1e9 for s in raw),
                    *(float(r.minute + 60) for r in rolled)])
    floor = times[-limit] if len(times) > limit else float("-inf")
    samples = [s for s in raw if s.at_ns / 1e9 >= floor]
    rollups = [r for r in rolled if r.minute + 60 >= floor]
    while len(samples) + len(rollups) > limit:  # ties at the floor: drop oldest
        if rollups and (not samples
                        or rollups[0].minute + 60 <= samples[0].at_ns / 1e9):
            rollups.pop(0)
        else:
            samples.pop(0)
    peaks: dict[tuple[str, str, str], list[object]] = {}
    for r, wf, name, key, cpu, mem, n, _last in tx.sample_peaks(
            run_id=run_id, workflow=workflow, step=step):
        peaks[(r, name, key)] = [wf, cpu, mem, n]
    for r, wf, name, key, cpu, mem, n in tx.rollup_peaks(
            run_id=run_id, workflow=workflow, step=step):
        p = peaks.setdefault((r, name, key), [wf, 0.0, 0, 0])
        p[1] = max(float(p[1]), float(cpu or 0.0))  # type: ignore[arg-type]
        p[2] = max(int(p[2]), int(mem or 0))  # type: ignore[call-overload]
        p[3] = int(p[3]) + int(n or 0)  # type: ignore[call-overload]
    for s in tx.steps_matching(run_id=run_id, workflow=workflow, step=step):
        if s.max_peak_memory_bytes is None and s.max_peak_cpu is None:
            continue
        p = peaks.setdefault((s.run_id, s.name, s.key), [s.workflow, 0.0, 0, 0])
        p[1] = max(float(p[1]), s.max_peak_cpu or 0.0)  # type: ignore[arg-type]
        p[2] = max(int(p[2]),  # type: ignore[call-overload]
                   s.max_peak_memory_bytes or 0)
    return Utilization(
        tuple(UtilizationSample(s.run_id, s.workflow, s.step, s.at_ns / 1e9, s.cpu,
                                s.memory_bytes, s.key, s.attempt,
                                s.interval_seconds or 0.0) for s in samples),
        tuple(StepPeak(r, str(p[0]), name, float(p[1]),  # type: ignore[arg-type]
                       int(p[2]),  # type: ignore[call-overload]
                       min(int(p[3]), _INT32), key)  # type: ignore[call-overload]
              for (r, name, key), p in sorted(peaks.items())),
        tuple(_rollup(r) for r in rollups
              if _time(float(r.minute)) is not None),  # a damaged one left out
    )
