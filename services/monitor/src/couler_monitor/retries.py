"""Retry limits and back-off learned from a step's history of failures.

The optimizer's default policy retries every step twice with the same back-off. A step's
history says better: one whose runs failed transiently (a timeout, the network, the
platform) and then succeeded needs as many retries as it took, and a back-off about as
long as it took to recover; one that ran many times without such a failure needs no
blanket retry at all. :func:`learn` turns the history of one step identity (workflow,
step) into that advice:

* **Limit, when transient or infrastructure failures were seen**: the 95th percentile of
  the retries the runs needed (a run that succeeded after ``n`` attempts needed ``n - 1``;
  one that gave up after ``n`` transient attempts needed at least ``n``), plus one, capped
  at :data:`MAX_RETRY_LIMIT`.
* **Back-off**: the median time from a run's first transient failure to its success,
  divided by the retries it took (so with a factor of 2 the retries span about that
  long), in whole seconds within [:data:`MIN_BACKOFF_SECONDS`, :data:`MAX_BACKOFF_SECONDS`].
  The span includes the successful attempt's own run time, so it errs long.
* **Limit 0 for transient failures**: at least :data:`MIN_RUNS` finished runs and none with
  a transient or infrastructure failure -- the default's retries of the step's own
  failures only delay a failure that is its own ("lose the blanket default"). Failures of
  the platform (an eviction, a lost node) strike any step however clean its history, so
  the optimizer keeps retrying those, and out-of-memory kills (measured in
  ``bench/feedback_sim.py``: dropping every retry of clean steps lost 4 points of
  completion to 2 % evictions).

User errors (:attr:`couler.ir.FailureClass.USER`) are never retried by the default policy
and do not count here; out-of-memory failures keep their own advice (a memory limit and a
retry with memory escalation, made by the monitor), which a learned limit never lowers.

Pure: no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from couler import ir

__all__ = [
    "MAX_BACKOFF_SECONDS",
    "MAX_RETRY_LIMIT",
    "MIN_BACKOFF_SECONDS",
    "MIN_RUNS",
    "AttemptFailure",
    "RetryAdvice",
    "StepRun",
    "learn",
    "percentile",
]

MAX_RETRY_LIMIT = 5
MIN_RUNS = 5  # finished runs without a transient failure before the default is dropped
MIN_BACKOFF_SECONDS = 1
MAX_BACKOFF_SECONDS = 300

_RETRYABLE = (ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA)


@dataclass(frozen=True, slots=True)
class AttemptFailure:
    """One failed attempt of the step in one run."""

    attempt: int  # 1 for the first
    failure_class: ir.FailureClass | None  # None: the engine did not classify it
    at: float | None = None  # when it was seen (seconds since the epoch)


@dataclass(frozen=True, slots=True)
class StepRun:
    """The step in one finished run: how it ended, after how many attempts, and which
    attempts failed how."""

    run_id: str
    succeeded: bool
    attempts: int
    finished_at: float | None = None
    failures: tuple[AttemptFailure, ...] = ()

    @property
    def transient(self) -> bool:
        """Whether an attempt failed transiently (or on the platform). A run that succeeded
        after more than one attempt counts even when its failed attempts were not recorded
        (a retry that worked is what a transient failure is)."""
        if any(f.failure_class in _RETRYABLE for f in self.failures):
            return True
        return self.succeeded and self.attempts > 1 and not any(
            f.failure_class is not None for f in self.failures)


@dataclass(frozen=True, slots=True)
class RetryAdvice:
    """What :func:`learn` advises; ``backoff_seconds`` None keeps the policy's back-off."""

    limit: int
    reason: str
    based_on: int  # the runs it is based on
    failure_class: ir.FailureClass | None  # the class the retries are for (None: none)
    backoff_seconds: int | None = None
    backoff_reason: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by the nearest-rank method."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def learn(history: Sequence[StepRun], *, min_runs: int = MIN_RUNS,
          max_limit: int = MAX_RETRY_LIMIT) -> RetryAdvice | None:
    """The retry limit (and back-off) the history of one step supports, or None when it is
    too short to say anything (fewer than ``min_runs`` runs and no transient failure).

    Args:
        history: The step's finished runs (any order).
        min_runs: Runs without a transient failure needed to advise limit 0.
        max_limit: The highest limit advised.
    """
    transient = [r for r in history if r.transient]
    if not transient:
        if len(history) < min_runs:
            return None
        return RetryAdvice(
            0, f"no transient or infrastructure failure in {_runs(len(history))}: its "
            "own failures are not retried (the platform's and out-of-memory kills still "
            "are)", len(history), ir.FailureClass.TRANSIENT)
    needed: list[float] = []
    for r in transient:
        # succeeded after n attempts: n - 1 retries; gave up after n: at least n
        needed.append(r.attempts - 1 if r.succeeded else r.attempts)
    p95 = int(percentile(needed, 95))
    limit = min(max_limit, p95 + 1)
    recovered = [r for r in transient if r.succeeded]
    classes = {f.failure_class for r in transient for f in r.failures
               if f.failure_class in _RETRYABLE}
    kind = ir.FailureClass.INFRA if classes == {ir.FailureClass.INFRA} else \
        ir.FailureClass.TRANSIENT
    words = ("infrastructure" if kind is ir.FailureClass.INFRA
             else "transient or infrastructure")
    reason = (f"{words} failures in {len(transient)} of {_runs(len(history))}; "
              f"{len(recovered)} recovered; the 95th percentile of retries needed is "
              f"{p95}: limit {p95} + 1" + (f", capped at {max_limit}" if p95 + 1 > max_limit
                                           else ""))
    spans: list[float] = []
    for r in recovered:
        first = min((f.at for f in r.failures
                     if f.at is not None and f.failure_class in _RETRYABLE), default=None)
        if first is not None and r.finished_at is not None and r.finished_at > first:
            spans.append((r.finished_at - first) / max(1, r.attempts - 1))
    backoff = None
    backoff_reason = ""
    if spans:
        median = statistics.median(spans)
        backoff = min(MAX_BACKOFF_SECONDS, max(MIN_BACKOFF_SECONDS, math.ceil(median)))
        backoff_reason = (f"recovered from a transient failure in a median {median:.1f} s per "
                          f"retry over {_runs(len(spans))}: back-off {backoff} s")
    return RetryAdvice(limit, reason, len(history), kind, backoff, backoff_reason)
