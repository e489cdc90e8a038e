"""The cache hits a local run reuses instead of running steps.

It owns :class:`Reuse` (a result to reuse: outputs, artifacts, the compute it saves) and
which of the hits given to :meth:`~couler_runtime.local.engine.LocalEngine.start` a run
can use: those of top-level steps whose artifacts are at hand (or that nothing reads),
with the steps they make unneeded, and those of map items, loop iterations and tuning
trials (``step[N]``), matched by key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from couler import ir
from couler.optimize.cache_key import unneeded_steps

__all__ = ["Reuse", "part_hits", "usable_hits"]


@dataclass(frozen=True, slots=True)
class Reuse:
    """A step result to reuse instead of running the step (a cache hit).

    ``artifacts`` maps the step's output artifact names to local files or
    directories holding them (fetched from the cache's store by the caller).
    """

    key: str
    outputs: Mapping[str, str] = field(default_factory=dict)
    artifacts: Mapping[str, Path] = field(default_factory=dict)
    saved_seconds: float = 0.0  # the compute reusing it saves (the entry's cost)


def usable_hits(wf: ir.Workflow, cached: Mapping[str, Reuse]
                 ) -> tuple[dict[str, Reuse], set[str]]:
    """The cache hits of top-level plain steps that can be used, and the unneeded steps
    (:func:`~couler.optimize.cache_key.unneeded_steps`) they make.

    A hit is used when its every output artifact is at hand, or when it is unneeded itself
    (nothing reads its artifacts: it is reported reused without them). A hit that can be
    neither is run instead, so the steps it would have spared are decided again: a fixed
    point, reached after at most one round per dropped hit.
    """
    by_name = {s.name: s for s in wf.steps}
    usable = {name: hit for name, hit in cached.items()
              if (step := by_name.get(name)) is not None
              and step.foreach is None and step.loop is None}
    while True:
        unneeded = unneeded_steps(wf, usable) if usable else set()
        missing = [name for name, hit in usable.items() if name not in unneeded and not all(
            (src := hit.artifacts.get(a.name)) is not None and Path(src).exists()
            for a in by_name[name].output_artifacts)]
        if not missing:
            return usable, unneeded
        for name in missing:
            del usable[name]


def part_hits(wf: ir.Workflow, cached: Mapping[str, Reuse]) -> dict[str, dict[str, Reuse]]:
    """The cache hits of map items and loop iterations (entries named ``step[N]``), by
    step name and then by key (an item is matched by its key, not its position), those
    whose every output artifact is at hand."""
    by_name = {s.name: s for s in wf.steps}
    hits: dict[str, dict[str, Reuse]] = {}
    for name, hit in cached.items():
        base, bracket, _ = name.partition("[")
        step = by_name.get(base)
        if not bracket or step is None or (step.foreach is None and step.loop is None
                                           and step.tune is None):
            continue
        if all((src := hit.artifacts.get(a.name)) is not None and Path(src).exists()
               for a in step.output_artifacts):
            hits.setdefault(base, {})[hit.key] = hit
    return hits
