"""couler.optimize.freshness: a step's max_age decides whether a cached entry is reused."""

from __future__ import annotations

import pytest

from couler import ir
from couler.api.options import Cache, to_cache
from couler.optimize.freshness import fresh

NOW = 1_800_000_000.0


def test_no_age_limit_reuses_any_entry() -> None:
    assert fresh(NOW - 10 * 365 * 86400, ir.CachePolicy(), NOW)
    assert fresh(None, ir.CachePolicy(), NOW)  # the age does not matter without a limit
    assert fresh(NOW - 10**6, ir.CachePolicy(max_age_seconds=0), NOW)


@pytest.mark.parametrize(("age", "expected"), [
    (0.0, True), (3599.0, True), (3600.0, True), (3600.001, False), (86400.0, False),
])
def test_an_entry_older_than_max_age_is_stale(age: float, expected: bool) -> None:
    policy = ir.CachePolicy(max_age_seconds=3600)
    assert fresh(NOW - age, policy, NOW) is expected


def test_unknown_age_under_a_limit_is_not_reused() -> None:
    assert not fresh(None, ir.CachePolicy(max_age_seconds=60), NOW)


def test_an_entry_from_the_future_counts_as_new() -> None:
    assert fresh(NOW + 500, ir.CachePolicy(max_age_seconds=60), NOW)


def test_the_api_max_age_reaches_the_policy() -> None:
    policy = to_cache(Cache("c", "k", max_age="15m"))
    assert policy is not None
    assert policy.max_age_seconds == 900
    assert fresh(NOW - 899, policy, NOW) and not fresh(NOW - 901, policy, NOW)
