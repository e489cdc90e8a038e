"""The monitor's recommendations: what a step needs, learned from what its runs used.

It owns the recommender's side of each transaction (:class:`Recommendations`): feeding the
step's histograms (:mod:`couler_monitor.recommender`) from newly stored samples and step
ends, rebuilding them from the stored samples and steps when they are missing or cannot be
read, and computing, at the end of the transaction, the step's proposals -- memory and CPU
requests from the histograms (with hysteresis), a memory limit and an OOM retry after an
out-of-memory failure, a retry limit and back-off learned from its failures
(:mod:`couler_monitor.retries`) -- stored only when their value changed, with their
evidence. The rules are in :mod:`couler_monitor.service`'s docstring.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from couler import ir
from couler.engines.base import StepState
from couler_monitor import retries
from couler_monitor.recommender import (
    RecommenderConfig,
    ResourceEstimate,
    StateError,
    StepHistory,
    estimate,
    oom_bump,
    should_update,
)
from couler_monitor.rows import _INT64, _bytes, _finite
from couler_monitor.store import (
    FailureRow,
    RecommendationRow,
    RecommenderRunRow,
    RecommenderStateRow,
    SampleRow,
    Tx,
)
from couler_runtime.rpc.records import RecommendationKind, StepRecord

__all__ = [
    "MI",
    "MIN_CPU",
    "MIN_MEMORY_BYTES",
    "OOM_RETRY_LIMIT",
    "Recommendations",
    "cpu_quantity",
    "memory_quantity",
    "recommendation_id",
]

log = logging.getLogger(__name__)

MI = 1024 * 1024
OOM_RETRY_LIMIT = 2
MIN_MEMORY_BYTES = 16 * 1024 * 1024  # 16Mi
MIN_CPU = 0.01  # 10m
_REBUILD_SAMPLES = 200_000  # the newest samples a damaged histogram is rebuilt from
_MEASURED = (StepState.SUCCEEDED, StepState.FAILED)  # step ends that make a run count
_MEASURED_STATES = tuple(s.value for s in _MEASURED)


def memory_quantity(peak_bytes: int, headroom: Fraction) -> str:
    """``peak_bytes`` * ``headroom`` as a Kubernetes quantity in whole Mi, rounded up."""
    return f"{max(1, math.ceil(Fraction(peak_bytes) * headroom / MI))}Mi"


def cpu_quantity(peak_cores: float, headroom: Fraction) -> str:
    """``peak_cores`` * ``headroom`` as a Kubernetes quantity in whole millicores, rounded up."""
    # The float's shortest decimal form: 1.8 cores is 1.8, not 1.8000000000000000444.
    return f"{max(1, math.ceil(Fraction(repr(float(peak_cores))) * headroom * 1000))}m"


def recommendation_id(workflow: str, step: str, kind: RecommendationKind, value: str) -> str:
    """The deterministic id (and feedback Nats-Msg-Id) of a recommendation."""
    return f"{workflow}/{step}/{kind.value}/{value}"


def _mi(n: int) -> str:
    return f"{n / MI:.0f}Mi" if n >= MI else f"{n}B"


@dataclass(frozen=True, slots=True)
class _Proposal:
    kind: RecommendationKind
    value: str
    reason: str
    based_on: int
    failure_class: ir.FailureClass | None = None
    evidence: _Evidence | None = None


@dataclass(frozen=True, slots=True)
class _Evidence:
    """What a resource recommendation stores beside its value."""

    target: str
    lower: str
    upper: str
    percentile: float
    runs: int
    samples: int
    span: float


@dataclass(slots=True)
class _Learned:
    """The recommender's work in one transaction: histograms read (or rebuilt), those
    changed (written back once, at the end) and the steps to recommend for."""

    histories: dict[tuple[str, str], StepHistory]
    dirty: set[tuple[str, str]]
    due: dict[tuple[str, str], None]  # ordered


class Recommendations:
    """The recommender's part of the monitor's transactions: learn and recommend.

    Inside a transaction, it feeds the step's decaying histograms (read once, rebuilt from
    the stored samples and steps when missing or damaged) with newly stored samples and
    step ends, notes the steps to recommend for, and at the end (:meth:`settle`) writes the
    histograms back and stores the recommendations that changed (unpublished: the monitor
    publishes them after the commit).

    Args:
        config: The resource recommender's knobs.
        history_runs: How many of a step's latest runs out-of-memory failures and retry
            history are looked for in.
        clock: Seconds since the epoch.
    """

    def __init__(self, config: RecommenderConfig, history_runs: int,
                 clock: Callable[[], float]) -> None:
        self._config = config
        self._history_runs = history_runs
        self._clock = clock

    def recommend_after(self, tx: Tx, workflow: str, r: StepRecord) -> bool:
        """Note the step for a recommendation at the end of the transaction
        (:meth:`settle`), when it ended with a measurement or ran out of memory."""
        oom = r.failure_class is ir.FailureClass.OOM
        measured = r.state.terminal and r.peak_memory_bytes is not None
        if not workflow:
            return False
        if measured or oom:
            self._learned(tx).due[(workflow, r.name)] = None
            return False
        if not r.key and r.state in (StepState.SUCCEEDED, StepState.FAILED):
            # finished, nothing measured: only its history of failures may say something
            return self._store_proposals(tx, workflow, r.name,
                                         self._learned_retries(tx, workflow, r.name, ()))
        return False

    def _recommend(self, tx: Tx, workflow: str, step: str) -> bool:
        peaks = tx.run_peaks(workflow, step, self._history_runs)
        proposals: list[_Proposal] = self._resource_proposals(tx, workflow, step)
        ooms = [p for p in peaks if p.oom]
        if ooms:
            killed_at = [m for p in ooms
                         if (m := p.oom_peak_memory_bytes or p.peak_memory_bytes)]
            if killed_at:
                top = max(killed_at)
                proposals.append(_Proposal(
                    RecommendationKind.MEMORY_LIMIT, memory_quantity(top, Fraction(2)),
                    f"out of memory at {_mi(top)} in {len(ooms)} of "
                    f"{_runs(len(peaks))}: 2x the memory it was killed at", len(ooms),
                    ir.FailureClass.OOM))
            proposals.append(_Proposal(
                RecommendationKind.RETRY, str(OOM_RETRY_LIMIT),
                f"out of memory in {len(ooms)} of {_runs(len(peaks))}: retry OOM "
                "failures (memory escalates per attempt)", len(ooms), ir.FailureClass.OOM))
        proposals = self._learned_retries(tx, workflow, step, proposals)
        return self._store_proposals(tx, workflow, step, proposals)

    def _learned_retries(self, tx: Tx, workflow: str, step: str,
                         proposals: Sequence[_Proposal]) -> list[_Proposal]:
        """``proposals`` with the retry limit and back-off learned from the step's history of
        failures (:func:`couler_monitor.retries.learn`). An OOM retry proposal is kept when
        it allows as many retries: a learned limit never takes memory escalation away."""
        history = [_step_run(row, failed)
                   for row, failed in tx.step_history(workflow, step, self._history_runs)]
        advice = retries.learn(history)
        if advice is None:
            return list(proposals)
        out = [p for p in proposals if p.kind is not RecommendationKind.RETRY]
        oom = next((p for p in proposals if p.kind is RecommendationKind.RETRY), None)
        kept = tx.recommendation(workflow, step, RecommendationKind.RETRY.value) \
            if oom is None else None
        if oom is not None and int(oom.value) >= advice.limit:
            out.append(oom)
        elif (kept is not None and kept.failure_class == ir.FailureClass.OOM.value
              and kept.value.isdigit() and int(kept.value) >= advice.limit):
            pass  # the stored OOM retries stay (this event measured nothing to renew them)
        else:
            out.append(_Proposal(RecommendationKind.RETRY, str(advice.limit), advice.reason,
                                 advice.based_on, advice.failure_class))
        if advice.backoff_seconds is not None:
            out.append(_Proposal(RecommendationKind.RETRY_BACKOFF, str(advice.backoff_seconds),
                                 advice.backoff_reason, advice.based_on, advice.failure_class))
        return out

    def _store_proposals(self, tx: Tx, workflow: str, step: str,
                         proposals: Iterable[_Proposal]) -> bool:
        changed = False
        for p in proposals:
            row = tx.recommendation(workflow, step, p.kind.value)
            fc = p.failure_class.value if p.failure_class else None
            if row is not None and row.value == p.value:
                row.reason, row.based_on, row.failure_class = p.reason, p.based_on, fc
                _keep_evidence(row, p.evidence)
                continue
            if row is None:
                row = RecommendationRow(workflow=workflow, step=step, kind=p.kind.value)
            row.value = p.value
            row.id = recommendation_id(workflow, step, p.kind, p.value)
            row.reason, row.based_on, row.failure_class = p.reason, p.based_on, fc
            _keep_evidence(row, p.evidence)
            row.created_at = self._clock()
            row.published = False
            tx.add(row)
            changed = True
        return changed

    def _learned(self, tx: Tx) -> _Learned:
        work = tx.scratch.get("recommender")
        if work is None:
            work = tx.scratch["recommender"] = _Learned({}, set(), {})
        assert isinstance(work, _Learned)
        return work

    def history(self, tx: Tx, workflow: str, step: str) -> StepHistory:
        """The step's histograms, read once per transaction. Stored ones that cannot be
        read, and none at all for a step with stored history (recorded before the
        recommender existed), are rebuilt from the stored samples and steps."""
        work = self._learned(tx)
        key = (workflow, step)
        history = work.histories.get(key)
        if history is not None:
            return history
        row = tx.recommender_state(workflow, step)
        if row is not None:
            try:
                history = StepHistory.from_json(row.state)
            except StateError as exc:
                log.warning("workflow %r, step %r: the stored resource histograms cannot be "
                            "read (%s); rebuilding them from the stored samples",
                            workflow, step, exc)
                history = self._rebuild(tx, workflow, step)
                work.dirty.add(key)
        else:
            history = self._rebuild(tx, workflow, step)
            if history.runs or history.samples:
                log.info("workflow %r, step %r: resource histograms built from %d stored "
                         "sample(s) of %d run(s)", workflow, step, history.samples,
                         history.runs)
                work.dirty.add(key)
        work.histories[key] = history
        return history

    def _rebuild(self, tx: Tx, workflow: str, step: str) -> StepHistory:
        """The step's histograms from what is stored (its samples and step records); the
        per-run rows are written anew to match."""
        history = StepHistory.new(self._config.half_life)
        tx.forget_recommender_runs(workflow, step)
        runs: dict[str, list[Any]] = {}  # run -> [peak, at, ended]
        for run_id, at_ns, cpu, memory, seconds in tx.sample_series(workflow, step,
                                                                    _REBUILD_SAMPLES):
            at = _finite(at_ns / 1e9 if isinstance(at_ns, int) else None)
            if at is None:
                continue
            if isinstance(cpu, float | int):
                history.add_cpu(at, float(cpu), _finite(seconds) or 0.0)
            got = runs.setdefault(run_id, [None, at, False])
            if isinstance(memory, int) and 0 <= memory <= _INT64:
                got[0] = max(got[0] or 0, memory)
        for s in tx.steps_matching(run_id="", workflow=workflow, step=step):
            at = _finite(s.finished_at) or _finite(s.event_at) or 0.0
            got = runs.setdefault(s.run_id, [None, at, False])
            peak: float | None = _bytes(s.max_peak_memory_bytes)
            if s.oom_seen and _bytes(s.oom_peak_memory_bytes):
                peak = max(peak or 0, oom_bump(float(_bytes(s.oom_peak_memory_bytes) or 0)))
            if peak:
                got[0] = max(got[0] or 0, peak)
            got[2] = got[2] or s.state in _MEASURED_STATES
        for run_id, (peak, at, ended) in runs.items():
            if peak:
                history.set_memory_peak(at, float(peak))
            counted = bool(ended and peak)
            if counted:
                history.count_run()
            tx.add(RecommenderRunRow(workflow=workflow, step=step, run_id=run_id,
                                     memory_bytes=float(peak) if peak else None,
                                     at=at if peak else None, ended=bool(ended),
                                     counted=counted))
        return history

    def learn_sample(self, tx: Tx, history: StepHistory, row: SampleRow) -> None:
        """A newly stored sample: its CPU into the CPU histogram, its memory into its
        run's peak. The step is recommended for again when its run has ended (a sample
        that came late); the samples of a running step wait for its end."""
        at = row.at_ns / 1e9
        history.add_cpu(at, row.cpu, row.interval_seconds or 0.0)
        ended = self._run_peak(tx, history, (row.workflow, row.step, row.run_id), at=at,
                               value=float(row.memory_bytes) if row.memory_bytes > 0
                               else None)[1]
        work = self._learned(tx)
        work.dirty.add((row.workflow, row.step))
        if ended:
            work.due[(row.workflow, row.step)] = None

    def learn_step(self, tx: Tx, run_id: str, workflow: str, r: StepRecord,
                    when: float) -> None:
        """A step record: its memory peak (bumped up when it ran out of memory) into its
        run's peak; a run counts once its step ended with a measurement."""
        oom = r.failure_class is ir.FailureClass.OOM
        ended = r.state in _MEASURED
        peak = r.peak_memory_bytes
        if not workflow:
            return
        if peak is None or peak <= 0:
            # Nothing measured here: only the end of a run whose samples came first counts
            # (one look-up; a step nobody measured costs no more).
            if not ended or tx.recommender_run(workflow, r.name, run_id) is None:
                return
            value = None
        else:
            value = oom_bump(float(peak)) if oom else float(peak)
        history = self.history(tx, workflow, r.name)
        at = _finite(r.finished_at) or when
        if self._run_peak(tx, history, (workflow, r.name, run_id), at=at, value=value,
                          ended=ended)[0]:
            self._learned(tx).dirty.add((workflow, r.name))

    def _run_peak(self, tx: Tx, history: StepHistory, run: tuple[str, str, str], *,
                  at: float, value: float | None, ended: bool = False) -> tuple[bool, bool]:
        """Raise the memory peak of one run of a step to ``value`` (the old one taken out of
        the histogram, the new one put at the same time); count the run once it ended with a
        peak. ``run`` is (workflow, step, run id). Whether the histograms changed, and
        whether the run has ended."""
        workflow, step, run_id = run
        row = tx.recommender_run(workflow, step, run_id)
        if row is None:
            # A sample after its step's end (another consumer) finds the end stored.
            ended = ended or any(s.state in _MEASURED_STATES for s in tx.steps_matching(
                run_id=run_id, workflow="", step=step))
            row = RecommenderRunRow(workflow=workflow, step=step, run_id=run_id,
                                    memory_bytes=None, at=None, ended=False, counted=False)
            tx.add(row)
        previous, put_at = _finite(row.memory_bytes), _finite(row.at)
        if previous is not None and (previous < 0 or put_at is None):
            previous = None  # a damaged row: start the run's peak anew
        changed = False
        if value is not None and value > (previous or 0.0):
            put_at = put_at if previous is not None and put_at is not None else at
            history.set_memory_peak(put_at, value, previous)
            row.memory_bytes, row.at = value, put_at
            changed = True
        if ended and not row.ended:
            row.ended = True
        if row.ended and row.memory_bytes is not None and not row.counted:
            row.counted = True
            history.count_run()
            changed = True
        return changed, bool(row.ended)

    def settle(self, tx: Tx) -> bool:
        """The end of a transaction: write back the histograms it changed, and recommend
        for each step it learned about. Whether a recommendation changed."""
        work = tx.scratch.get("recommender")
        if not isinstance(work, _Learned):
            return False
        changed = False
        for workflow, step in work.due:
            changed = self._recommend(tx, workflow, step) or changed
        now = self._clock()
        for workflow, step in sorted(work.dirty):  # after: recommending may rebuild one
            text = work.histories[(workflow, step)].to_json()
            row = tx.recommender_state(workflow, step)
            if row is None:
                tx.add(RecommenderStateRow(workflow=workflow, step=step, state=text,
                                           updated_at=now))
            else:
                row.state, row.updated_at = text, now
        tx.scratch.pop("recommender", None)
        return changed

    def _resource_proposals(self, tx: Tx, workflow: str, step: str) -> list[_Proposal]:
        """``memory_request`` and ``cpu_request`` from the step's histograms; the current
        value is kept unless the target moved enough (hysteresis)."""
        est = estimate(self.history(tx, workflow, step), self._config)
        out = []
        for kind, e in ((RecommendationKind.MEMORY_REQUEST, est.memory),
                        (RecommendationKind.CPU_REQUEST, est.cpu)):
            if e is None:
                continue
            row = tx.recommendation(workflow, step, kind.value)
            current = _quantity(row.value) if row is not None else None
            show = _memory if kind is RecommendationKind.MEMORY_REQUEST else _cores
            quantity = (_memory_value if kind is RecommendationKind.MEMORY_REQUEST
                        else _cpu_value)
            target = quantity(e.target)
            reason = _reason(e, show, self._config)
            if row is not None and current is not None and not should_update(
                    current, e, self._config.change_threshold):
                value = row.value
                if value != target:
                    reason += (f"; {value} kept: within "
                               f"{self._config.change_threshold:.0%} of the target and "
                               "inside the bounds")
            else:
                value = target
            out.append(_Proposal(kind, value, reason, e.runs, evidence=_Evidence(
                target, quantity(e.lower), quantity(e.upper), e.percentile, e.runs,
                e.samples, e.span)))
        return out


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _failure_class(value: str | None) -> ir.FailureClass | None:
    try:
        return ir.FailureClass(value) if value else None
    except ValueError:  # a damaged row: an unknown class
        return None


def _step_run(row: Any, failed: Sequence[FailureRow]) -> retries.StepRun:
    """One run of a step for :func:`couler_monitor.retries.learn`."""
    return retries.StepRun(
        run_id=row.run_id, succeeded=row.state == StepState.SUCCEEDED.value,
        attempts=max(0, row.attempts), finished_at=row.finished_at or row.event_at,
        failures=tuple(retries.AttemptFailure(f.attempt, _failure_class(f.failure_class), f.at)
                       for f in failed))


def _quantity(text: str) -> float | None:
    try:
        value = float(ir.parse_quantity(text))
    except (ValueError, TypeError, ArithmeticError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def _memory_value(n: float) -> str:
    """Bytes as whole Mi, rounded up."""
    return memory_quantity(max(0, math.ceil(n)), Fraction(1))


def _cpu_value(cores: float) -> str:
    """Cores as whole millicores, rounded up."""
    return cpu_quantity(cores, Fraction(1))


def _memory(n: float) -> str:
    """Bytes as the request they would be (whole Mi, rounded up)."""
    return _memory_value(n)


def _cores(c: float) -> str:
    """Cores as the request they would be (whole millicores, rounded up)."""
    return _cpu_value(c)


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def _reason(e: ResourceEstimate, show: Callable[[float], str],
            config: RecommenderConfig) -> str:
    """Why, in words: e.g. "p95 of 12 runs' peaks 612Mi, +15% margin x1.04 for thin
    evidence = 734Mi; range 520Mi..900Mi; 3d 4h of history"."""
    pct = f"p{e.percentile * 100:g}"
    what = (f"{pct} of {_runs(e.runs)}' peaks" if e.resource == "memory"
            else f"{pct} of {e.samples} sample{'s' if e.samples != 1 else ''} over "
                 f"{_runs(e.runs)}")
    confidence = e.factor / (1 + config.safety_margin)
    text = (f"{what} {show(e.observed)}, +{config.safety_margin:.0%} margin"
            + (f" x{confidence:.2f} for thin evidence" if confidence >= 1.005 else "")
            + f" = {show(e.observed * e.factor)}")
    if e.floored:
        text += f", raised to the minimum {show(e.target)}"
    return (text + f"; range {show(e.lower)}..{show(e.upper)}; "
            f"{_span(e.span)} of history")


def _keep_evidence(row: RecommendationRow, e: _Evidence | None) -> None:
    if e is None:
        return
    row.target, row.lower_bound, row.upper_bound = e.target, e.lower, e.upper
    row.percentile, row.runs, row.samples = e.percentile, e.runs, min(e.samples, _INT64)
    row.span_seconds = e.span
