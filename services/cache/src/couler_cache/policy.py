"""Which entries go first when the cache is over its budget: the eviction policies.

Every entry carries a *priority*, stored with it and indexed; eviction takes the unpinned
entry with the lowest priority (ties: least recently used first). A priority changes only
when something it depends on changes (a commit, a hit, an ancestor evicted or cached
again), so choosing a victim is one index read, not a sort of the index.

``value`` (the default) is the paper's cache score (its Alg. 2) made sound. An entry is
worth keeping in proportion to the compute a reuse saves, per byte it occupies, times how
likely it is to be reused::

    value = R / size * f(now)

* ``R``, the regeneration cost: the entry's own cost (the compute-seconds its step ran)
  plus the costs of the ancestors that are no longer cached -- walking its lineage (the
  keys of the entries whose outputs it read) up through evicted entries, each counted once
  however many paths lead to it. Rebuilding the entry means rebuilding those too.
* ``size``: the bytes it occupies (at least 1).
* ``f``, the decayed frequency of use: every commit and hit at time ``t`` adds
  ``2 ** (-(now - t) / half_life)``, so a use counts 1 now, 1/2 one half-life later.

The paper's printed formula is not monotone in size (``-e^(-V)`` rises towards 0 with the
size), ignores direct successors and mixes units; this one is a ratio of like quantities
(seconds saved per byte, per unit of expected reuse) with no weights to tune but the
half-life. Because ``f(now) = 2 ** (-now / half_life) * F`` with ``F = sum 2 ** (t /
half_life)`` fixed between uses, comparing entries at any moment compares ``log2 R -
log2 size + log2 F``: that is the stored priority, exact without rescoring everything
whenever time passes.

Every commit is admitted (unless it alone, or with the pinned entries, exceeds the budget)
and competes from then on; pinned entries are never evicted. Variants measured on
``bench/cache_sim.py`` and dropped, each saving less compute at one budget or more (see
``bench/README.md``): refusing a commit worth less than what it would displace (Alg. 2's
admission test), GreedyDual aging (``L + f * R / size``, recency counted in evictions), and
``(1 + hits)`` in place of the decayed frequency.

The others, for comparison: ``lru`` (least recently committed or hit first), ``fifo``
(oldest commit first) and ``gdsf`` (GreedyDual-Size-Frequency: ``L + (1 + hits) * cost /
size``, where the inflation ``L`` rises to each victim's priority, so entries age without
a clock; own cost only, no lineage). Pinned entries are never chosen by any policy.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from couler.errors import UserError

__all__ = [
    "DEFAULT_HALF_LIFE_SECONDS",
    "MIN_COST_SECONDS",
    "EvictionPolicy",
    "LineageGraph",
    "MemoGraph",
    "Node",
    "Pricing",
    "Standing",
    "add_log2",
    "cached_below",
    "lost_cost",
]

DEFAULT_HALF_LIFE_SECONDS = 24 * 3600.0
# A cost of 0 means "not measured" (an entry committed without run times): it still
# ranks by size and use, as if it took a millisecond.
MIN_COST_SECONDS = 0.001


class EvictionPolicy(enum.StrEnum):
    """How the cache chooses what to evict (see the module docstring)."""

    VALUE = "value"
    LRU = "lru"
    FIFO = "fifo"
    GDSF = "gdsf"

    @classmethod
    def parse(cls, name: str) -> EvictionPolicy:
        """The policy called ``name`` (case-insensitive).

        Raises:
            UserError: No policy has that name; the message lists the choices.
        """
        try:
            return cls(name.strip().lower())
        except ValueError:
            choices = ", ".join(p.value for p in cls)
            raise UserError(f"unknown cache eviction policy {name!r}: choose one of "
                            f"{choices}") from None


@dataclass(frozen=True, slots=True)
class Standing:
    """What an entry's priority is computed from."""

    size_bytes: int
    cost_seconds: float  # its own compute
    lost_cost_seconds: float  # its evicted ancestors' compute (see lost_cost)
    freq_log: float  # log2 of the sum of 2 ** (t / half_life) over its uses
    hits: int
    used_seq: int  # logical clock of its last commit or hit
    created_seq: int  # logical clock of its commit


def add_log2(a: float, b: float) -> float:
    """``log2(2**a + 2**b)`` without overflow."""
    hi, lo = (a, b) if a >= b else (b, a)
    return hi + math.log2(1.0 + 2.0 ** (lo - hi))


@dataclass(frozen=True, slots=True)
class Pricing:
    """A policy with its parameters: the priorities of entries.

    Args:
        policy: The eviction policy.
        half_life_seconds: How fast a use stops counting (``value``).
    """

    policy: EvictionPolicy
    half_life_seconds: float = DEFAULT_HALF_LIFE_SECONDS

    def __post_init__(self) -> None:
        if not (self.half_life_seconds > 0 and math.isfinite(self.half_life_seconds)):
            raise UserError(f"cache half-life must be > 0 seconds (got "
                            f"{self.half_life_seconds})")

    @property
    def uses_lineage(self) -> bool:
        """Whether priorities depend on which ancestors are cached."""
        return self.policy is EvictionPolicy.VALUE

    def first_use(self, now: float) -> float:
        """``freq_log`` of an entry committed at ``now``."""
        return now / self.half_life_seconds

    def used(self, freq_log: float, now: float) -> float:
        """``freq_log`` after one more use at ``now``."""
        return add_log2(freq_log, now / self.half_life_seconds)

    def estimated_freq_log(self, created_at: float, last_used_at: float, hits: int) -> float:
        """``freq_log`` of an entry whose uses were not recorded one by one (an index from
        before this policy, or a changed half-life): the commit, and every hit at the last
        use (which overrates old hits)."""
        at = self.first_use(created_at)
        if hits > 0:
            at = add_log2(at, math.log2(hits) + self.first_use(last_used_at))
        return at

    def priority(self, s: Standing, inflation: float = 0.0) -> float:
        """The entry's priority (lowest evicted first); ``inflation``: GDSF's ``L``."""
        if self.policy is EvictionPolicy.LRU:
            return float(s.used_seq)
        if self.policy is EvictionPolicy.FIFO:
            return float(s.created_seq)
        size = max(s.size_bytes, 1)
        if self.policy is EvictionPolicy.GDSF:
            return inflation + (1 + s.hits) * max(s.cost_seconds, MIN_COST_SECONDS) / size
        regenerate = max(s.cost_seconds + s.lost_cost_seconds, MIN_COST_SECONDS)
        return math.log2(regenerate) - math.log2(size) + s.freq_log


@dataclass(frozen=True, slots=True)
class Node:
    """What the cache remembers of a key it committed, cached or not."""

    cost_seconds: float
    parents: tuple[str, ...]
    cached: bool


class LineageGraph(Protocol):
    """Read access to the lineage the cache keeps (one transaction's view)."""

    def nodes(self, keys: Sequence[str]) -> Mapping[str, Node]:
        """The nodes of those of ``keys`` the cache knows."""

    def children(self, keys: Sequence[str]) -> Mapping[str, Sequence[str]]:
        """The keys whose lineage names each of ``keys`` (only those that have some)."""


class MemoGraph:
    """A :class:`LineageGraph` that reads each node once (for one operation)."""

    def __init__(self, graph: LineageGraph) -> None:
        self._graph = graph
        self._nodes: dict[str, Node | None] = {}

    def nodes(self, keys: Sequence[str]) -> Mapping[str, Node]:
        """As :meth:`LineageGraph.nodes`."""
        wanted = [k for k in dict.fromkeys(keys) if k not in self._nodes]
        if wanted:
            found = self._graph.nodes(wanted)
            for k in wanted:
                self._nodes[k] = found.get(k)
        return {k: n for k in keys if (n := self._nodes.get(k)) is not None}

    def children(self, keys: Sequence[str]) -> Mapping[str, Sequence[str]]:
        """As :meth:`LineageGraph.children`."""
        return self._graph.children(keys)

    def forget(self, keys: Iterable[str]) -> None:
        """Read ``keys`` again next time (they changed)."""
        for k in keys:
            self._nodes.pop(k, None)


def lost_cost(parents: Iterable[str], graph: LineageGraph) -> float:
    """The compute of the ancestors reached from ``parents`` through uncached entries.

    A cached parent stops the walk (its outputs are there); an uncached one counts its cost
    and leads on to its own parents. Each ancestor counts once; a key the cache never saw
    counts nothing (its cost is unknown). One read per generation.
    """
    seen: set[str] = set()
    total = 0.0
    frontier = [k for k in dict.fromkeys(parents)]
    while frontier:
        nodes = graph.nodes([k for k in frontier if k not in seen])
        following: list[str] = []
        for key in frontier:
            if key in seen:
                continue
            seen.add(key)
            node = nodes.get(key)
            if node is None or node.cached:
                continue
            total += node.cost_seconds
            following.extend(p for p in node.parents if p not in seen)
        frontier = following
    return total


def cached_below(key: str, graph: LineageGraph) -> list[str]:
    """The cached entries whose lost cost changes when ``key`` is evicted or cached again:
    its descendants reached through uncached ones (a cached descendant stops the walk)."""
    seen = {key}
    found: list[str] = []
    frontier = [key]
    while frontier:
        below = graph.children(frontier)
        following = [c for k in frontier for c in below.get(k, ()) if c not in seen]
        following = list(dict.fromkeys(following))
        seen.update(following)
        nodes = graph.nodes(following)
        frontier = []
        for child in following:
            node = nodes.get(child)
            if node is None:
                continue
            if node.cached:
                found.append(child)
            else:
                frontier.append(child)
    return found
