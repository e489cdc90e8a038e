"""Eviction policies of the cache: the order they evict in, pins, lineage, start-up pricing.

The real :class:`couler_cache.service.Cache` on a real :class:`CacheStore` (an SQLite file),
with an artifact store that only keeps sizes and a clock the tests move.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from couler.errors import NotFoundError, UserError
from couler.v1 import common_pb2
from couler_cache.events import run_seconds
from couler_cache.policy import (
    EvictionPolicy,
    Node,
    Pricing,
    Standing,
    cached_below,
    lost_cost,
)
from couler_cache.service import Cache
from couler_cache.store import MIGRATIONS, SERVICE, CacheStore
from couler_runtime.rpc.records import CacheEntry, StoredArtifact
from couler_runtime.store import make_engine, migrate

T = TypeVar("T")
HOUR = 3600.0
DAY = 24 * HOUR


def run(coro: Awaitable[T]) -> T:
    """``coro`` on the test's event loop (one per test: the cache's locks and background
    task belong to it)."""
    async def wrapped() -> T:
        return await coro
    return asyncio.get_event_loop_policy().get_event_loop().run_until_complete(wrapped())


@pytest.fixture(autouse=True)
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    new = asyncio.new_event_loop()
    asyncio.set_event_loop(new)
    yield new
    new.close()
    asyncio.set_event_loop(None)


class SizeBlobs:
    """An artifact store that keeps only sizes (the policies never read bytes)."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}

    def put(self, name: str, size: int) -> StoredArtifact:
        digest = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
        self.sizes[digest] = size
        return StoredArtifact(digest, size)

    def exists(self, digest: str) -> bool:
        return digest in self.sizes

    def size(self, digest: str) -> int:
        if digest not in self.sizes:
            raise NotFoundError(f"no blob {digest}")
        return self.sizes[digest]

    def delete(self, digest: str) -> None:
        self.sizes.pop(digest, None)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A cache on an SQLite file; ``reopen`` starts another process's view of it."""

    def __init__(self, path: Path) -> None:
        self.url = f"sqlite:///{path / 'cache.db'}"
        self.blobs = SizeBlobs()
        self.clock = Clock()
        self.store = CacheStore.open(self.url)
        self.cache: Cache | None = None

    def start(self, **kw: Any) -> Cache:
        if self.cache is not None:
            run(self.cache.close())
        kw.setdefault("budget_bytes", 1000)
        self.cache = Cache(self.store, self.blobs, clock=self.clock, retry_interval=3600, **kw)
        run(self.cache.start())
        return self.cache

    def commit(self, key: str, size: int, cost: float = 0.0,
               lineage: Sequence[str] = ()) -> tuple[bool, tuple[str, ...]]:
        assert self.cache is not None
        entry = CacheEntry(key=key, workflow="wf", step=key,
                           artifacts={"out": self.blobs.put(key, size)},
                           cost_seconds=cost, lineage=tuple(lineage))
        result = run(self.cache.commit(entry))
        return result.created, result.evicted

    def hit(self, *keys: str) -> None:
        assert self.cache is not None
        assert set(run(self.cache.lookup(list(keys))).entries) == set(keys)

    def cached(self) -> set[str]:
        engine = make_engine(self.url)
        try:
            with engine.connect() as conn:
                return {r[0] for r in conn.execute(sa.text("SELECT key FROM cache_entries"))}
        finally:
            engine.dispose()

    def close(self) -> None:
        if self.cache is not None:
            run(self.cache.close())
        self.store.close()


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.close()


# ----------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["value", "lru", "fifo", "gdsf", " LRU "])
def test_every_policy_name_is_accepted(h: Harness, name: str) -> None:
    cache = h.start(policy=name)
    assert cache.policy is EvictionPolicy(name.strip().lower())
    assert h.commit("a", 10)[0]


def test_an_unknown_policy_is_refused_naming_the_choices(h: Harness) -> None:
    with pytest.raises(UserError, match=r"unknown cache eviction policy 'lfu': choose one of "
                                        r"value, lru, fifo, gdsf"):
        h.start(policy="lfu")
    with pytest.raises(UserError, match="half-life"):
        h.start(half_life_seconds=0)


# ----------------------------------------------------------------------------- value


def test_a_cheap_big_entry_goes_before_an_expensive_small_one(h: Harness) -> None:
    h.start()
    assert h.commit("dear-small", 200, cost=3600) == (True, ())
    assert h.commit("cheap-big", 600, cost=60) == (True, ())
    h.clock.now += 1  # the cheap one is the more recent: LRU would keep it
    assert h.commit("new", 300, cost=600) == (True, ("cheap-big",))
    assert h.cached() == {"dear-small", "new"}


def test_lru_evicts_the_least_recently_used_instead(h: Harness) -> None:
    h.start(policy="lru")
    h.commit("dear-small", 200, cost=3600)
    h.commit("cheap-big", 600, cost=60)
    assert h.commit("new", 300, cost=600) == (True, ("dear-small",))


def test_fifo_ignores_hits_and_lru_does_not(h: Harness) -> None:
    h.start(policy="fifo")
    h.commit("first", 400)
    h.commit("second", 400)
    h.hit("first")
    assert h.commit("third", 400)[1] == ("first",)
    h.start(policy="lru")  # priced again at start: now by recency
    h.hit("second")
    assert h.commit("fourth", 400)[1] == ("third",)


def test_gdsf_weighs_cost_size_and_hits(h: Harness) -> None:
    h.start(policy="gdsf")
    h.commit("dear", 400, cost=1000)
    h.commit("cheap", 400, cost=10)
    assert h.commit("x", 400, cost=10)[1] == ("cheap",)
    # Hits multiply an entry's worth: 'x' with 200 hits outweighs 'dear'.
    for _ in range(200):
        h.hit("x")
    assert h.commit("y", 400, cost=500)[1] == ("dear",)


@pytest.mark.parametrize(("gap_half_lives", "evicted"), [(3.0, "often-long-ago"),
                                                          (1.0, "once-recently")])
def test_decayed_frequency_decides_between_equal_entries(h: Harness, gap_half_lives: float,
                                                         evicted: str) -> None:
    """Four uses count 4/8 after three half-lives (less than one use now) but 4/2 after
    one (more): how often and how recently both matter."""
    h.start(half_life_seconds=DAY)
    h.commit("often-long-ago", 400, cost=100)
    h.hit("often-long-ago")
    h.hit("often-long-ago")
    h.hit("often-long-ago")
    h.clock.now += gap_half_lives * DAY
    h.commit("once-recently", 400, cost=100)
    assert h.commit("dear", 400, cost=10_000)[1] == (evicted,)


def test_without_reuse_recency_decides(h: Harness) -> None:
    h.start()
    h.commit("old", 400, cost=100)
    h.clock.now += HOUR
    h.commit("newer", 400, cost=100)
    h.clock.now += HOUR
    assert h.commit("third", 400, cost=100)[1] == ("old",)


def test_a_pinned_entry_is_never_evicted(h: Harness) -> None:
    cache = h.start()
    h.commit("worthless", 400, cost=1)
    h.commit("worthy", 400, cost=1000)
    assert run(cache.pin(["worthless", "unknown"])).keys == ("worthless",)
    assert run(cache.pin(["unknown"])).missing == ("unknown",)
    assert h.commit("new", 400, cost=5000)[1] == ("worthy",)  # the next lowest
    # By bytes, a pinned entry stays too; named, it goes (naming it is explicit).
    assert run(cache.evict(free_bytes=10_000)).evicted == ("new",)
    assert h.cached() == {"worthless"}
    assert run(cache.lookup(["worthless"])).entries["worthless"].pinned
    # Pinned entries leave no room: a commit that would need it is refused, nothing moves.
    h.commit("filler", 500, cost=1)
    assert run(cache.pin(["filler"])).keys == ("filler",)
    assert h.commit("no-room", 200, cost=10_000) == (False, ("no-room",))
    assert h.cached() == {"worthless", "filler"}
    run(cache.pin(["filler"], pinned=False))
    assert h.commit("room", 200, cost=10_000) == (True, ("filler",))
    assert run(cache.evict(["worthless"])).evicted == ("worthless",)


@pytest.mark.parametrize(("gap_days", "evicted"), [(20.0, "dear"), (0.0, "cheap")])
def test_a_decayed_entry_gives_way(h: Harness, gap_days: float, evicted: str) -> None:
    """Unused for 20 half-lives, 10,000 s of compute count less than 1 s used now."""
    h.start()
    h.commit("dear", 400, cost=10_000)
    h.clock.now += gap_days * DAY
    h.commit("cheap", 400, cost=1)
    assert h.commit("new", 400, cost=1) == (True, (evicted,))


def test_one_over_the_budget_is_refused_and_nothing_moves(h: Harness) -> None:
    h.start()
    h.commit("small", 600, cost=1)
    assert h.commit("huge", 1001, cost=10_000) == (False, ("huge",))
    assert h.cached() == {"small"}


def test_a_new_entry_is_admitted_and_is_the_first_to_go_when_worth_least(h: Harness) -> None:
    """No admission test: a commit always gets its place, then competes like any entry."""
    h.start()
    h.commit("dear", 500, cost=100_000)
    h.commit("mid", 400, cost=1000)
    assert h.commit("cheap", 400, cost=1) == (True, ("mid",))  # the lesser of the two
    assert h.commit("next", 200, cost=50) == (True, ("cheap",))
    assert h.cached() == {"dear", "next"}


def test_evicted_ancestors_raise_the_worth_of_their_cached_descendants(h: Harness) -> None:
    cache = h.start()
    h.commit("prep", 300, cost=5000)
    h.commit("train", 300, cost=100, lineage=["prep"])
    h.commit("other", 300, cost=200)
    with h.store.transaction() as tx:
        entry = tx.get("train")
        assert entry is not None and (entry.cost_seconds, entry.lineage) == (100, ("prep",))
    # While 'prep' is cached, rebuilding 'train' costs its own 100 s: it would go first.
    assert run(cache.evict(["prep"])).evicted == ("prep",)
    h.commit("spacer", 300, cost=1_000_000)
    # Now rebuilding it needs 'prep' again (5100 s): 'other' goes instead.
    assert h.commit("next", 300, cost=250)[1] == ("other",)
    # Cached again, 'prep' takes back its share: 'train' is the cheapest to rebuild again.
    run(cache.evict(["next"]))
    assert h.commit("prep", 300, cost=5000) == (True, ())
    assert h.commit("last", 300, cost=150)[1] == ("train",)


def test_a_refused_entry_still_counts_for_its_descendants(h: Harness) -> None:
    h.start(budget_bytes=1000)
    assert h.commit("prep", 1200, cost=50) == (False, ("prep",))  # over the budget alone
    assert h.commit("train", 50, cost=10, lineage=["prep"]) == (True, ())
    with h.store.transaction() as tx:
        assert tx.parents("prep") == ()  # remembered without an entry
        entry = tx.get("train")
        assert entry is not None and entry.lineage == ("prep",)
    # 'train' alone is worth 10 s for its 50 bytes; with 'prep' to rebuild, 60 s: it
    # outlives an entry worth 40 s.
    h.commit("rival", 50, cost=40)
    assert h.commit("push", 950, cost=100_000)[1] == ("rival",)


def test_a_long_lineage_counts_each_evicted_ancestor_once() -> None:
    """prep → (a, b) → join; with prep, a and b evicted, rebuilding join needs all three,
    prep once."""
    graph = FakeGraph({
        "prep": Node(100.0, (), False),
        "a": Node(10.0, ("prep",), False),
        "b": Node(20.0, ("prep",), False),
        "join": Node(1.0, ("a", "b"), True),
        "cached-parent": Node(1000.0, (), True),
    })
    assert lost_cost(("a", "b"), graph) == 130.0
    assert lost_cost(("cached-parent", "unknown"), graph) == 0.0
    assert cached_below("prep", graph) == ["join"]
    assert cached_below("join", graph) == []


class FakeGraph:
    def __init__(self, nodes: Mapping[str, Node]) -> None:
        self._nodes = dict(nodes)

    def nodes(self, keys: Sequence[str]) -> Mapping[str, Node]:
        return {k: self._nodes[k] for k in keys if k in self._nodes}

    def children(self, keys: Sequence[str]) -> Mapping[str, Sequence[str]]:
        out: dict[str, list[str]] = {}
        for child, node in sorted(self._nodes.items()):
            for parent in node.parents:
                if parent in keys:
                    out.setdefault(parent, []).append(child)
        return out


def test_priorities_are_fixed_between_uses_so_comparisons_do_not_drift() -> None:
    """log2 R - log2 size + log2 F orders entries as R / size * f(now) does, at any now."""
    pricing = Pricing(EvictionPolicy.VALUE, half_life_seconds=HOUR)
    t0 = 1_800_000_000.0
    a = Standing(100, 50.0, 0.0, pricing.used(pricing.first_use(t0), t0 + 60), 1, 0, 0)
    b = Standing(100, 80.0, 0.0, pricing.first_use(t0 + 2 * HOUR), 0, 0, 0)

    def decayed(s: Standing, now: float) -> float:
        return (s.cost_seconds / s.size_bytes
                * 2 ** (s.freq_log - now / pricing.half_life_seconds))

    for now in (t0 + 2 * HOUR, t0 + 30 * HOUR):
        assert (decayed(a, now) < decayed(b, now)) == \
            (pricing.priority(a) < pricing.priority(b))
    assert pricing.priority(a) < pricing.priority(b)  # 2 uses 2 h ago < 1 use now, 50 < 80


# ----------------------------------------------------------------------------- start-up


def test_switching_the_policy_prices_every_entry_again(h: Harness) -> None:
    h.start(policy="lru")
    h.commit("dear", 400, cost=10_000)
    h.commit("cheap", 400, cost=1)
    h.start(policy="value")  # as a restart with COULER_CACHE_POLICY=value
    assert h.commit("new", 400, cost=500)[1] == ("cheap",)
    with h.store.transaction() as tx:
        assert (tx.meta("policy"), tx.meta("half_life")) == ("value", repr(DAY))


def test_the_lineage_of_evicted_keys_is_bounded(h: Harness) -> None:
    cache = h.start(budget_bytes=0, lineage_limit=2)
    h.commit("root", 10, cost=1)
    h.commit("mid", 10, cost=1, lineage=["root"])
    h.commit("leaf", 10, cost=1, lineage=["mid"])
    for i in range(4):
        h.commit(f"loose-{i}", 10, cost=1)
    run(cache.evict(["root", "mid", "loose-0", "loose-1", "loose-2", "loose-3"]))
    with h.store.transaction() as tx:
        remembered = set(tx.nodes(["root", "mid", "leaf"] +
                                  [f"loose-{i}" for i in range(4)]))
    # Over the limit, the loose ones went (oldest first); 'root' and 'mid' stay, because
    # 'leaf' (cached) descends from them.
    assert remembered == {"root", "mid", "leaf"}


# ----------------------------------------------------------------------------- the event


def test_a_step_event_gives_the_entry_its_run_time() -> None:
    step = common_pb2.StepRecord(name="fit")
    assert run_seconds(step) == 0.0
    step.started_at.FromNanoseconds(1_000_000_000_000)
    step.finished_at.FromNanoseconds(1_000_000_000_000 + 90_500_000_000)
    assert run_seconds(step) == 90.5
    step.finished_at.FromNanoseconds(1)
    assert run_seconds(step) == 0.0


# ----------------------------------------------------------------------------- migration


def test_the_migration_keeps_an_existing_index(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    migrate(engine, SERVICE, MIGRATIONS, target="cache_0001")
    populate_version_1(engine)
    engine.dispose()

    store = CacheStore.open(url)
    blobs = SizeBlobs()
    for name in ("old", "older"):
        blobs.put(name, 100)
    cache = Cache(store, blobs, budget_bytes=250, clock=Clock(), retry_interval=3600)
    try:
        run(cache.start())
        found = run(cache.lookup(["old", "older"])).entries
        assert set(found) == {"old", "older"}
        old = found["old"]
        assert (old.cost_seconds, old.lineage, old.pinned, old.hits) == (0.0, (), False, 4)
        assert dict(old.outputs) == {"acc": "0.9"}
        # Both are priced: the one with fewer uses goes first.
        blob = blobs.put("fresh", 100)
        got = run(cache.commit(CacheEntry("fresh", artifacts={"out": blob}, cost_seconds=5)))
        assert got.created and got.evicted == ("older",)
        with store.transaction() as tx:
            assert tx.meta("policy") == "value"
            assert tx.parents("old") == ()
    finally:
        run(cache.close())
        store.close()


def populate_version_1(engine: sa.Engine) -> None:
    """Rows as revision cache_0001 wrote them."""
    with engine.begin() as conn:
        for key, seq, hits in (("older", 1, 0), ("old", 2, 3)):
            conn.execute(sa.text(
                "INSERT INTO cache_entries (key, workflow, step, outputs, size_bytes, "
                "created_at, last_used_at, used_seq, hits) VALUES "
                "(:key, 'wf', 'train', :outputs, 100, :at, :at, :seq, :hits)"),
                {"key": key, "outputs": json.dumps({"acc": "0.9"}), "at": 1_799_000_000.0 + seq,
                 "seq": seq, "hits": hits})
            digest = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
            conn.execute(sa.text(
                "INSERT INTO cache_artifacts (key, name, digest, size_bytes, uri) VALUES "
                "(:key, 'out', :digest, 100, '')"), {"key": key, "digest": digest})
        conn.execute(sa.text("UPDATE cache_counters SET value = 2 WHERE name = 'clock'"))


def test_damaged_rows_never_stop_the_cache_nor_pass_a_wrong_output(h: Harness) -> None:
    """Garbage where JSON was stored: the cache starts (pricing reads lineage at start), a
    damaged entry is a miss, and the step's next commit replaces it."""
    h.start(policy="value")
    h.commit("parent", 100, cost=10)
    h.commit("child", 100, cost=10, lineage=["parent"])
    engine = make_engine(h.url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE cache_entries SET outputs = '{not json', "
                                 "lineage = '[1, 2' WHERE key = 'child'"))
            conn.execute(sa.text("UPDATE cache_entries SET lineage = 'null'"))
            conn.execute(sa.text("UPDATE cache_lineage SET parents = :v"),
                         {"v": "\x00 garbage"})
            conn.execute(sa.text("UPDATE cache_meta SET value = 'ALIEN'"))
    finally:
        engine.dispose()
    cache = h.start(policy="gdsf")  # a new policy: every entry priced again at start
    found = run(cache.lookup(["parent", "child"]))
    assert list(found.entries) == ["parent"] and found.missing == ("child",)
    assert h.commit("child", 100, cost=10)[0]  # the damaged entry made way
    assert set(run(cache.lookup(["child"])).entries) == {"child"}
