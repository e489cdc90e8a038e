"""Cron schedules on the embedded stack: the submitter launches a template's runs on time.

A workflow with a cron schedule (``ir.CronSchedule``) submitted to the submitter is not run
and not refused: it is registered as the template of its name (the same as
``RegisterTemplate`` with such a workflow) and kept as a schedule. Each tick launches one
run of the template through the ordinary path -- a ``requested`` event, the optimizer's
plan, the cache, the engine, the monitor's events -- without the schedule (a run is one
run; the schedule is the submitter's).

**Ticks.** The cron expression (5 fields, or 6 with the seconds last) is read by
`croniter`, in the schedule's time zone (an IANA name; empty: UTC). A new schedule's first
tick is the first after its registration.

**Missed ticks (the submitter was down), the policy.** Every tick is handled once. When
several ticks fell due since the last handled one (no submitter ran at the time), only the
**latest** may still launch a run; each earlier one is recorded as skipped, "missed: no
submitter was running at the time". The latest launches when it is at most
``starting_deadline_seconds`` late (plus :data:`POLL_SECONDS`, the loop's own delay; no
deadline: it always does), and is otherwise recorded as skipped, "missed its starting
deadline". A tick handled on time is late by a fraction of a second, so the deadline
matters after downtime (or a store that was away).

**Concurrency policy.** ``allow``: the tick's run starts whatever else runs; ``forbid``:
the tick is skipped while a run of the schedule is not finished (its id in the reason);
``replace``: those runs are cancelled ("replaced by the run of tick ...") and the tick's
run starts.

**Suspend and pause.** A workflow's ``suspend`` or ``couler schedule pause NAME`` stops
launches; ticks meanwhile pass unrecorded, and ``couler schedule resume NAME`` starts from
the first tick after it (nothing is caught up).

**History limits.** After each tick, the schedule's finished runs beyond
``successful_history_limit`` (succeeded) and ``failed_history_limit`` (failed or
cancelled), the oldest first, are deleted from the run records.

**Two submitters never launch one tick twice.** Every replica runs this loop over the same
store; a tick is *claimed* by inserting its row, primary key ``(schedule, tick)``, in the
transaction that creates its run (idempotency key ``schedule.<name>.<tick>``) or records
its skip. Of two replicas handling a tick, the database lets one insert; the other gets the
winner's run (or finds the tick skipped) and launches nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from couler import ir
from couler.errors import ConflictError, CoulerError, NotFoundError, UserError
from couler_runtime.rpc.records import RunState, Template
from couler_submitter.model import RunOptions
from couler_submitter.store import RunStore, ScheduleState

__all__ = ["MAX_CATCH_UP", "POLL_SECONDS", "SPEC_SECONDS", "Launcher", "Scheduler",
           "check_schedule", "due_ticks", "next_tick", "tick_key"]

log = logging.getLogger(__name__)

#: Seconds between two looks at the schedules when no tick is due sooner (other replicas
#: register, pause and resume schedules too).
POLL_SECONDS = 1.0
#: Missed ticks of one schedule recorded one by one after downtime, at most (older ones
#: are passed over, logged).
MAX_CATCH_UP = 1000
_NOT_FINISHED = (RunState.ACCEPTED, RunState.PLANNING, RunState.PENDING, RunState.RUNNING)
_SUCCEEDED = (RunState.SUCCEEDED,)
_FAILED = (RunState.FAILED, RunState.CANCELLED)


def _zone(schedule: ir.CronSchedule) -> ZoneInfo:
    try:
        return ZoneInfo(schedule.timezone or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise UserError(f"schedule.timezone: {schedule.timezone[:80]!r} is not an IANA time "
                        "zone (e.g. 'Europe/Berlin'; empty for UTC)") from None


def check_schedule(wf: ir.Workflow) -> None:
    """Refuse a schedule the submitter cannot keep (UserError naming the field)."""
    s = wf.schedule
    if s is None:
        return
    if not croniter.is_valid(s.schedule):
        raise UserError(f"workflow {wf.name!r}: field 'schedule.schedule': {s.schedule!r} is "
                        "not a cron expression (5 fields, or 6 with the seconds last)")
    _zone(s)
    for field_name in ("starting_deadline_seconds", "successful_history_limit",
                       "failed_history_limit"):
        value = getattr(s, field_name)
        if value is not None and value < 0:
            raise UserError(f"workflow {wf.name!r}: field 'schedule.{field_name}' must not be "
                            f"negative (got {value})")


def next_tick(schedule: ir.CronSchedule, after: float) -> float:
    """The first tick of ``schedule`` after ``after`` (seconds since the epoch)."""
    start = datetime.fromtimestamp(after, _zone(schedule))
    return float(croniter(schedule.schedule, start).get_next(float))


def due_ticks(schedule: ir.CronSchedule, after: float, now: float,
              limit: int = MAX_CATCH_UP) -> tuple[list[float], int]:
    """The ticks in ``(after, now]``, oldest first, the latest ``limit`` of them; and how
    many older ones were left out."""
    start = datetime.fromtimestamp(after, _zone(schedule))
    it = croniter(schedule.schedule, start)
    ticks: list[float] = []
    dropped = 0
    while (t := float(it.get_next(float))) <= now:
        ticks.append(t)
        if len(ticks) > limit:
            ticks.pop(0)
            dropped += 1
    return ticks, dropped


def tick_key(name: str, tick: float) -> str:
    """The idempotency key of the run of ``name``'s tick ``tick``."""
    return f"schedule.{name}.{tick:.0f}"


def _when(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


class Launcher(Protocol):
    """What the scheduler needs of the submitter (``service.Submitter``)."""

    async def launch_tick(self, name: str, tick: float, options: RunOptions
                          ) -> tuple[str, bool]:
        """Submit template ``name``'s run of ``tick``: ``(run_id, created)``; ConflictError
        when the tick was skipped by another replica."""

    async def cancel(self, run_id: str, reason: str = "") -> object:
        """Cancel a run."""

    async def template(self, name: str) -> Template:
        """A registered template."""


#: Seconds a replica keeps the schedules' specs it read (a template registered again
#: through another replica is seen within this; through this one at once).
SPEC_SECONDS = 30.0


@dataclass
class _Spec:
    registered_at: float | None
    schedule: ir.CronSchedule
    engine: str
    tenant: str


class Scheduler:
    """The loop that launches the schedules' runs (see the module docstring).

    Args:
        store: The submitter's store (schedules, ticks, runs).
        launcher: Submits a tick's run, cancels runs, reads templates.
        poll: Seconds between looks when no tick is due sooner.
        clock: The time, seconds since the epoch.
    """

    def __init__(self, store: RunStore, launcher: Launcher, *, poll: float = POLL_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._launcher = launcher
        self._poll = poll
        self._clock = clock
        self._specs: dict[str, _Spec] = {}  # name -> the template's schedule, as last read
        self._specs_at = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        """Start the loop (on the running event loop)."""
        self._task = asyncio.create_task(self._loop(), name="submitter-schedules")

    async def close(self) -> None:
        """Stop the loop once the round going on is done (no store call is left running in
        a thread when the store closes)."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def changed(self) -> None:
        """A schedule was registered, paused or resumed here: look again now."""
        self._specs.clear()
        self._wake.set()

    async def _loop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                soonest = await self.run_due()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store away, say: try again at the next look
                log.error("schedules: %s", exc, exc_info=not isinstance(exc, CoulerError))
                soonest = None
            delay = self._poll
            if soonest is not None:
                delay = min(delay, max(0.0, soonest - self._clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def _spec(self, name: str) -> _Spec | None:
        spec = self._specs.get(name)
        if spec is not None:
            return spec
        try:
            tpl = await self._launcher.template(name)
        except NotFoundError:
            return None
        if tpl.workflow.schedule is None:
            return None
        spec = _Spec(tpl.registered_at, tpl.workflow.schedule, tpl.engine, tpl.workflow.tenant)
        self._specs[name] = spec
        return spec

    async def run_due(self) -> float | None:
        """Handle every due tick of every schedule; the soonest next tick (None: none)."""
        if self._clock() - self._specs_at > SPEC_SECONDS:
            self._specs.clear()
            self._specs_at = self._clock()
        states = await asyncio.to_thread(self._store.schedules)
        soonest: float | None = None
        for state in states:
            spec = await self._spec(state.name)
            if spec is None:
                continue
            try:
                upcoming = await self._handle(state, spec)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one schedule must not stop the others
                log.error("schedule %r: %s", state.name, exc,
                          exc_info=not isinstance(exc, CoulerError))
                self._specs.pop(state.name, None)  # read it again next time
                continue
            if upcoming is not None and (soonest is None or upcoming < soonest):
                soonest = upcoming
        return soonest

    async def _handle(self, state: ScheduleState, spec: _Spec) -> float | None:
        """Handle ``state``'s due ticks; its next tick (None while paused or suspended)."""
        now = self._clock()
        name, sched = state.name, spec.schedule
        if state.paused or sched.suspend:
            ticks, _ = await asyncio.to_thread(due_ticks, sched, state.last_tick, now, 1)
            if ticks:  # passed unrecorded: resuming starts from the next tick
                await asyncio.to_thread(self._store.advance, name, ticks[-1])
            return None
        ticks, dropped = await asyncio.to_thread(due_ticks, sched, state.last_tick, now)
        if dropped:
            log.warning("schedule %r: %d older missed tick(s) passed over", name, dropped)
        for tick in ticks[:-1]:
            await self._skip(name, tick, "missed: no submitter was running at the time "
                             "(after downtime only the latest missed tick may run)")
        if ticks:
            latest = ticks[-1]
            late = now - latest
            deadline = sched.starting_deadline_seconds
            if deadline is not None and late > deadline + self._poll:
                await self._skip(name, latest, f"missed its starting deadline: {late:.0f} s "
                                 f"late, the deadline is {deadline} s")
            else:
                await self._launch(name, latest, spec)
            await asyncio.to_thread(self._store.advance, name, latest)
            await self._prune(name, sched)
        return next_tick(sched, ticks[-1] if ticks else max(state.last_tick, now))

    async def _skip(self, name: str, tick: float, reason: str) -> None:
        if await asyncio.to_thread(self._store.skip_tick, name, tick, reason, self._clock()):
            log.warning("schedule %r: tick %s skipped: %s", name, _when(tick), reason)

    async def _launch(self, name: str, tick: float, spec: _Spec) -> None:
        running = await asyncio.to_thread(self._store.template_runs, name, _NOT_FINISHED)
        key = tick_key(name, tick)
        running = [r for r in running if r.idempotency_key != key]
        policy = spec.schedule.concurrency_policy
        if running and policy is ir.ConcurrencyPolicy.FORBID:
            await self._skip(name, tick, f"concurrency policy forbid: run "
                             f"{running[0].run_id} is still {running[0].state.value}")
            return
        if running and policy is ir.ConcurrencyPolicy.REPLACE:
            for run in running:
                await self._launcher.cancel(run.run_id, f"replaced by the run of schedule "
                                            f"{name!r}'s tick {_when(tick)}")
        options = RunOptions(engine=spec.engine, tenant=spec.tenant)
        try:
            run_id, created = await self._launcher.launch_tick(name, tick, options)
        except ConflictError:
            log.info("schedule %r: tick %s was handled by another submitter", name, _when(tick))
            return
        if created:
            log.info("schedule %r: tick %s launched run %s", name, _when(tick), run_id)
        else:
            log.info("schedule %r: tick %s: run %s was launched by another submitter",
                     name, _when(tick), run_id)

    async def _prune(self, name: str, sched: ir.CronSchedule) -> None:
        for limit, states in ((sched.successful_history_limit, _SUCCEEDED),
                              (sched.failed_history_limit, _FAILED)):
            if limit is None:
                continue
            runs = await asyncio.to_thread(self._store.template_runs, name, states)
            extra = [r.run_id for r in runs[limit:]]
            if extra:
                await asyncio.to_thread(self._store.delete_runs, extra)
                log.info("schedule %r: %d finished run(s) beyond its history limit deleted",
                         name, len(extra))
