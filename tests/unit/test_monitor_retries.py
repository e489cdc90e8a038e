"""Learned retry limits and back-off (couler_monitor.retries): pure functions over a history."""

from __future__ import annotations

import pytest

from couler import ir
from couler_monitor.retries import (
    MAX_RETRY_LIMIT,
    AttemptFailure,
    StepRun,
    learn,
    percentile,
)

T, INF, U = ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA, ir.FailureClass.USER


def ok(i: int) -> StepRun:
    return StepRun(f"r{i}", succeeded=True, attempts=1, finished_at=100.0 + i)


def recovered(i: int, attempts: int, *, cls: ir.FailureClass = T, start: float = 1000.0,
              span: float = 20.0) -> StepRun:
    """Failed ``attempts - 1`` times with ``cls``, then succeeded ``span`` s after the first."""
    fails = tuple(AttemptFailure(a, cls, start + a) for a in range(1, attempts))
    return StepRun(f"t{i}", succeeded=True, attempts=attempts,
                   finished_at=start + 1 + span, failures=fails)


def test_percentile_nearest_rank() -> None:
    assert percentile([1, 2, 3, 4], 95) == 4
    assert percentile(list(range(1, 101)), 95) == 95
    assert percentile([2.0], 50) == 2.0
    with pytest.raises(ValueError):
        percentile([], 95)


def test_too_short_a_history_says_nothing() -> None:
    assert learn([ok(i) for i in range(4)]) is None
    assert learn([]) is None


def test_five_runs_without_a_transient_failure_drop_the_default() -> None:
    advice = learn([ok(i) for i in range(5)])
    assert advice is not None
    assert (advice.limit, advice.based_on, advice.backoff_seconds) == (0, 5, None)
    # for the step's own (transient) failures: the platform's are still retried
    assert advice.failure_class is ir.FailureClass.TRANSIENT
    assert "no transient or infrastructure failure in 5 runs" in advice.reason


def test_user_errors_are_not_transient() -> None:
    bug = StepRun("u", succeeded=False, attempts=1, failures=(AttemptFailure(1, U, 5.0),))
    advice = learn([ok(i) for i in range(4)] + [bug])
    assert advice is not None and advice.limit == 0


def test_limit_covers_the_observed_retries_plus_one() -> None:
    history = [ok(i) for i in range(6)] + [recovered(1, 2), recovered(2, 3)]
    advice = learn(history)
    assert advice is not None
    # retries needed: 1 and 2; the 95th percentile is 2; + 1
    assert advice.limit == 3 and advice.failure_class is T and advice.based_on == 8
    assert "the 95th percentile of retries needed is 2: limit 2 + 1" in advice.reason


def test_a_run_that_gave_up_needed_more_than_it_had() -> None:
    gave_up = StepRun("g", succeeded=False, attempts=3,
                      failures=tuple(AttemptFailure(a, INF, float(a)) for a in (1, 2, 3)))
    advice = learn([gave_up])
    assert advice is not None and advice.limit == 4 and advice.failure_class is INF
    assert advice.backoff_seconds is None  # it never recovered: nothing to learn it from


def test_the_limit_is_capped() -> None:
    advice = learn([recovered(1, 9)])
    assert advice is not None and advice.limit == MAX_RETRY_LIMIT
    assert f"capped at {MAX_RETRY_LIMIT}" in advice.reason


def test_backoff_is_the_median_recovery_per_retry() -> None:
    # spans per retry: 20/1, 30/1, 60/2 = [20, 30, 30]: the median is 30
    history = [recovered(1, 2, span=20.0), recovered(2, 2, span=30.0),
               recovered(3, 3, span=60.0)]
    advice = learn(history)
    assert advice is not None and advice.backoff_seconds == 30
    assert "median 30.0 s per retry over 3 runs" in advice.backoff_reason


def test_backoff_is_kept_within_bounds() -> None:
    fast = learn([recovered(1, 2, span=0.2)])
    slow = learn([recovered(1, 2, span=10_000.0)])
    assert fast is not None and fast.backoff_seconds == 1
    assert slow is not None and slow.backoff_seconds == 300


def test_a_retry_that_worked_counts_even_unclassified() -> None:
    # attempts 2 and succeeded, the failed attempt's record was never seen: transient
    advice = learn([StepRun("x", succeeded=True, attempts=2)])
    assert advice is not None and advice.limit == 2
