"""Whether a cached result is still fresh enough for a step: its cache policy's ``max_age``.

A step's :class:`couler.ir.CachePolicy` may bound how old a reused result can be
(``couler.Cache(max_age="1h")`` → ``max_age_seconds``). The cache's Lookup takes one age
limit per request and a workflow's steps may each have their own, so the planner looks the
keys up without one and drops, per step, the entries that are too old: such an entry counts
as missing (it is kept in the cache; another step, or a later lookup without the limit, may
still reuse it). The boundary is the cache service's: an entry exactly ``max_age`` old is
still fresh.

Pure: no clock is read here; the caller passes ``now``.
"""

from __future__ import annotations

from couler import ir

__all__ = ["fresh"]


def fresh(entry_created_at: float | None, policy: ir.CachePolicy, now: float) -> bool:
    """Whether an entry created at ``entry_created_at`` may be reused under ``policy``.

    Args:
        entry_created_at: When the cache entry was committed (seconds since the epoch);
            None when the cache did not say.
        policy: The step's cache policy (see :func:`couler.optimize.cache_key.cache_policy`).
        now: The current time (seconds since the epoch).

    Returns:
        True when the policy sets no age limit (``max_age_seconds`` None or not positive),
        or the entry is at most ``max_age_seconds`` old. False when it is older, or when
        there is a limit and the entry's age is unknown (freshness cannot be shown). An
        entry dated after ``now`` (clocks that disagree) counts as new.
    """
    limit = policy.max_age_seconds
    if limit is None or limit <= 0:
        return True
    if entry_created_at is None:
        return False
    return max(0.0, now - entry_created_at) <= limit
