"""The cache's control RPCs -- List and Show -- against the real service (issue 10, item 6).

The service runs as in test_cache_service.py (its fixtures: real NATS, SQLite and
PostgreSQL); the tests check the orders a listing offers (the next victim first: the
one Evict takes), keyset paging, the filters, Show by key and by unique prefix, and that
neither counts a hit or a miss nor changes an entry.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import grpc
import pytest

from couler.errors import NotFoundError, UserError
from couler_runtime.client import CacheClient
from couler_runtime.rpc.records import CacheEntry, CacheOrder, ListedEntry
from tests.integration import test_cache_service as cache_service
from tests.integration.test_cache_service import Starter

# The cache service's fixtures (a service started on real NATS; SQLite and PostgreSQL).
start = cache_service.start
db_url = cache_service.db_url


def hexkey(prefix: str = "") -> str:
    return (prefix + uuid.uuid4().hex * 2)[:64]


def commit(c: CacheClient, k: str, *, workflow: str = "wf", step: str = "train",
           size: int = 10, cost: float = 1.0) -> None:
    # An entry's size is its outputs' bytes (no artifact): "v" + value of size - 1 bytes.
    got = c.commit(CacheEntry(key=k, workflow=workflow, step=step,
                              outputs={"v": "x" * (size - 1)}, cost_seconds=cost))
    assert got.created


def keys(listed: Iterable[ListedEntry]) -> list[str]:
    return [e.entry.key for e in listed]


def test_list_orders_filters_and_pages_without_counting(start: Starter, db_url: str
                                                        ) -> None:
    cache = start(database_url=db_url, cache_policy="lru")
    c = cache.client.cache
    k = {name: hexkey() for name in ("small", "big", "slow", "old", "pinned")}
    commit(c, k["old"], size=20, cost=2.0)
    commit(c, k["small"], size=5, cost=3.0)
    commit(c, k["big"], size=500, cost=1.0, step="evaluate")
    commit(c, k["slow"], size=50, cost=900.0)
    commit(c, k["pinned"], size=60, cost=4.0, workflow="other")
    assert c.pin([k["pinned"]]).keys == (k["pinned"],)
    c.lookup([k["small"]])  # now the most recently used
    before = c.stats()

    by_size = list(c.list(order=CacheOrder.SIZE))
    assert keys(by_size) == [k["big"], k["pinned"], k["slow"], k["old"], k["small"]]
    assert [e.entry.size_bytes for e in by_size] == [500, 60, 50, 20, 5]
    by_cost = list(c.list(order=CacheOrder.COST))
    assert keys(by_cost)[:2] == [k["slow"], k["pinned"]]
    assert [e.entry.cost_seconds for e in by_cost] == [900.0, 4.0, 3.0, 2.0, 1.0]
    recent = list(c.list(order=CacheOrder.RECENT))
    assert keys(recent)[0] == k["small"]
    small = recent[0].entry
    assert small.hits == 1 and (small.workflow, small.step) == ("wf", "train")

    # Eviction order under LRU: least recently used first, pinned last.
    victims = list(c.list())
    assert keys(victims) == [k["old"], k["big"], k["slow"], k["small"], k["pinned"]]
    assert victims[-1].entry.pinned and not victims[0].entry.pinned
    assert [v.priority for v in victims[:4]] == sorted(v.priority for v in victims[:4])

    # Listing counted nothing and touched no entry.
    after = c.stats()
    assert (after.hits, after.misses, after.entries) == (before.hits, before.misses, 5)
    assert list(c.list(order=CacheOrder.RECENT)) == recent

    # Pages of two: the same entries, in the same order, each once.
    first = c.list_page(order=CacheOrder.SIZE, page_size=2)
    assert keys(first.entries) == [k["big"], k["pinned"]] and first.next_page_token
    assert first.policy == "lru"
    second = c.list_page(order=CacheOrder.SIZE, page_size=2, page_token=first.next_page_token)
    third = c.list_page(order=CacheOrder.SIZE, page_size=2, page_token=second.next_page_token)
    assert keys(second.entries) + keys(third.entries) == [k["slow"], k["old"], k["small"]]
    assert third.next_page_token == ""
    assert keys(c.list(order=CacheOrder.SIZE, page_size=1)) == keys(by_size)
    assert keys(c.list(order=CacheOrder.SIZE, limit=3)) == keys(by_size)[:3]

    # Filters: by workflow, by step.
    assert keys(c.list(workflow="other")) == [k["pinned"]]
    assert keys(c.list(step="evaluate")) == [k["big"]]
    assert keys(c.list(workflow="wf", step="train", order=CacheOrder.SIZE)) == \
        [k["slow"], k["old"], k["small"]]
    assert list(c.list(workflow="nope")) == []

    # A token is bound to its listing.
    with pytest.raises(UserError, match="field 'page_token'") as caught:
        c.list_page(order=CacheOrder.COST, page_size=2, page_token=first.next_page_token)
    cause = caught.value.__cause__
    assert isinstance(cause, grpc.RpcError)
    assert cause.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(UserError, match="field 'page_token'"):
        c.list_page(page_token="not-a-token")
    with pytest.raises(UserError, match="field 'page_size'"):
        c.list_page(page_size=5000)

    # The first victim listed is the one eviction takes.
    assert c.evict(free_bytes=1).evicted == (k["old"],)
    assert keys(c.list())[0] == k["big"]


def test_show_by_key_and_by_unique_prefix_counts_nothing(start: Starter, db_url: str
                                                         ) -> None:
    cache = start(database_url=db_url)
    c = cache.client.cache
    twin_a, twin_b, lone = hexkey("abcdef01"), hexkey("abcdef01"), hexkey("0123456")
    for k in (twin_a, twin_b, lone):
        commit(c, k, cost=42.5)
    c.lookup([lone])
    before = c.stats()
    used = c.show(lone).entry.last_used_at

    shown = c.show(lone)
    assert shown.entry.key == lone and shown.entry.cost_seconds == 42.5
    assert shown.entry.hits == 1 and shown.entry.last_used_at == used
    assert c.show(lone[:8]).entry.key == lone
    assert c.show(lone[:12].upper()).entry.key == lone
    assert c.show(twin_b[:20]).entry == c.show(twin_b).entry
    assert c.show(lone).priority == shown.priority

    with pytest.raises(UserError, match=r"field 'key': 'abcdef01' is the prefix of several"):
        c.show("abcdef01")
    with pytest.raises(NotFoundError, match=r"field 'key': .*'0123456'.*at least 8 hex"):
        c.show(lone[:7])
    with pytest.raises(NotFoundError, match=r"field 'key': no cache entry .*'ffffffffff'"):
        c.show("ffffffffff")
    with pytest.raises(NotFoundError):
        c.show("%%%%%%%%%%")  # no LIKE wildcard reaches the database

    after = c.stats()
    assert (after.hits, after.misses) == (before.hits, before.misses)
    assert c.show(lone).entry.last_used_at == used


def test_list_and_show_need_the_token(start: Starter, tmp_path: Any) -> None:
    cache = start(artifacts=str(tmp_path / "blobs"), auth_token="s3cret")
    k = hexkey()
    from couler_runtime.client import CoulerClient

    with CoulerClient({"cache": cache.service.address}, token="s3cret") as ok:
        commit(ok.cache, k)
        assert keys(ok.cache.list()) == [k]
        assert ok.cache.show(k[:8]).entry.key == k
    for call in (lambda: list(cache.client.cache.list()), lambda: cache.client.cache.show(k)):
        with pytest.raises(Exception) as caught:
            call()
        cause = caught.value.__cause__
        assert isinstance(cause, grpc.RpcError)
        assert cause.code() is grpc.StatusCode.UNAUTHENTICATED
