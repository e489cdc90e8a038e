"""Benchmark: cache eviction policies replayed on iterative ML workflow traces.

The traces go through the cache service's real code -- :class:`couler_cache.service.Cache` on
a real :class:`couler_cache.store.CacheStore` (an SQLite file) -- and the optimizer's: each
submission is planned by ``couler.optimize.optimize`` (validation on) on its IR, with the
lookups it makes, and every step it runs is committed as the step events do. Only the
artifact store is a stand-in that keeps sizes (the policies never read bytes), and the steps
do not run: their compute times and sizes come from the trace.

A trace: ``--workflows`` submissions of 20 templates chosen by Zipf popularity. A template is
an ML pipeline -- ingest a dataset (shared by the templates on it), validate, preprocess (a
recipe shared by some templates), features, 3-6 training branches (hyperparameter variants),
an evaluation per branch, a report -- whose steps have lognormal compute times and output
sizes (per kind, per template, per key). Each submission is the next iteration of its
template: new hyperparameters for some branches (sometimes back to an earlier value), a
feature or preprocessing change, a new data snapshot, or a report change. Submissions arrive
about every two hours.

Two planners:

* ``lineage`` -- the optimizer (issue 10's item 1, keys by lineage): every step's key is
  known before running; a step is skipped when its entry is cached, and a step that is not
  cached is skipped too when every step that reads it is skipped (nobody needs it). It
  peeks at every key, then looks up the keys the plan uses -- the hits it reuses, the steps
  it runs -- so the cache counts a hit only for an entry that is used;
* ``prefix`` -- the optimizer before keys by lineage (simulated): a step is looked up only
  when every step it reads from was a hit, so reuse stops at the first evicted ancestor. Run
  with LRU only: the "LRU of today" that issue 10's target compares with.

Reported per planner, budget and policy (means over ``--seeds`` seeds): the cache's hit
ratio (hits / lookups), the compute saved (seconds of the steps not run, and their share of
all steps' compute) and the bytes written (entries the cache admitted); ``unlimited`` is the
lineage planner without a budget (the most any policy can save). Replays run side by side
in ``--jobs`` worker processes. ``--scale`` times commits that each evict, against indexes
of growing size.

Usage:  .venv/bin/python bench/cache_sim.py [--workflows 300] [--seeds 3] [--json FILE]
            [--budgets 10,20,40] [--policies value,gdsf,lru,fifo] [--jobs N]
        .venv/bin/python bench/cache_sim.py --scale 1000,10000,100000
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import hashlib
import json
import logging
import math
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from couler import ir
from couler.errors import NotFoundError
from couler.optimize import CachedStep, optimize
from couler.optimize.cache_key import unneeded_steps
from couler_cache.service import Cache
from couler_cache.store import CacheStore
from couler_runtime.rpc.records import CacheEntry, StoredArtifact

GB = 10**9
MB = 10**6
HOUR = 3600.0
POLICIES = ("value", "gdsf", "lru", "fifo")
BUDGETS_GB = (10, 20, 40)

# Per step kind: median compute seconds, median output bytes, and the spread (sigma of the
# log) between templates; each key varies around its template's medians by SIGMA_KEY.
KINDS: dict[str, tuple[float, float, float]] = {
    "ingest": (900.0, 6 * GB, 0.5),
    "validate": (120.0, 1 * MB, 0.5),
    "preprocess": (1800.0, 3 * GB, 0.6),
    "features": (1200.0, 1.5 * GB, 0.7),
    "train": (5400.0, 400 * MB, 0.9),
    "evaluate": (300.0, 20 * MB, 0.5),
    "report": (60.0, 1 * MB, 0.5),
}
SIGMA_KEY = 0.3
TEMPLATES = 20
DATASETS = 4
RECIPES_PER_DATASET = 2
ZIPF_S = 1.1
ARRIVAL_MEAN_SECONDS = 2 * HOUR


# ----------------------------------------------------------------------------- traces


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a submitted workflow, as the cache sees it."""

    name: str
    key: str
    parents: tuple[str, ...]  # step names it reads from
    cost: float
    size: int
    spec: str = ""  # what the step runs (its kind and version), canonical JSON


@dataclass(frozen=True, slots=True)
class Submission:
    at: float
    template: int
    steps: tuple[Step, ...]  # topological order


@dataclass
class Template:
    dataset: int
    recipe: int
    branches: int
    medians: dict[str, tuple[float, float]]  # kind -> (cost, size)
    features_version: int = 0
    report_version: int = 0
    hyper: list[int] = field(default_factory=list)  # current value per branch
    tried: list[list[int]] = field(default_factory=list)  # values tried per branch


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


class Trace:
    """The submissions of one seeded trace."""

    def __init__(self, seed: int, workflows: int) -> None:
        self.seed = seed
        rng = random.Random(seed)
        self._rng = rng
        self.templates = []
        for t in range(TEMPLATES):
            medians = {kind: (_lognormal(rng, cost, sigma), _lognormal(rng, size, sigma))
                       for kind, (cost, size, sigma) in KINDS.items()}
            branches = rng.randint(3, 6)
            self.templates.append(Template(
                dataset=t % DATASETS, recipe=rng.randrange(RECIPES_PER_DATASET),
                branches=branches, medians=medians, hyper=[0] * branches,
                tried=[[0] for _ in range(branches)]))
        self.snapshot = [0] * DATASETS
        self.recipe_version = [[0] * RECIPES_PER_DATASET for _ in range(DATASETS)]
        ranks = list(range(TEMPLATES))
        rng.shuffle(ranks)
        weights = [1.0 / (rank + 1) ** ZIPF_S for rank in ranks]
        total = sum(weights)
        self._cumulative = [sum(weights[:i + 1]) / total for i in range(TEMPLATES)]
        self.submissions = list(self._generate(workflows))

    def _pick_template(self) -> int:
        return min(bisect.bisect_left(self._cumulative, self._rng.random()), TEMPLATES - 1)

    def _iterate(self, tpl: Template) -> None:
        """The change a data scientist makes before resubmitting."""
        rng = self._rng
        roll = rng.random()
        if roll < 0.05:
            self.snapshot[tpl.dataset] += 1  # new data: every template on it changes
        elif roll < 0.15:
            self.recipe_version[tpl.dataset][tpl.recipe] += 1  # shared preprocessing
        elif roll < 0.30:
            tpl.features_version += 1
        elif roll < 0.85:
            for b in rng.sample(range(tpl.branches), rng.randint(1, tpl.branches)):
                if rng.random() < 0.25 and len(tpl.tried[b]) > 1:
                    tpl.hyper[b] = rng.choice(tpl.tried[b][:-1])  # back to an earlier value
                else:
                    tpl.hyper[b] = max(tpl.tried[b]) + 1
                    tpl.tried[b].append(tpl.hyper[b])
        else:
            tpl.report_version += 1

    def _generate(self, workflows: int) -> Iterator[Submission]:
        at = 0.0
        first = True
        for _ in range(workflows):
            at += self._rng.expovariate(1.0 / ARRIVAL_MEAN_SECONDS)
            t = self._pick_template()
            tpl = self.templates[t]
            if not first:
                self._iterate(tpl)
            first = False
            yield Submission(at, t, tuple(self._steps(t, tpl)))

    def _steps(self, t: int, tpl: Template) -> Iterator[Step]:
        keys: dict[str, str] = {}

        def step(name: str, kind: str, spec: object, parents: Sequence[str],
                 template: int | None = t) -> Step:
            key = _digest(kind, spec, [keys[p] for p in parents])
            keys[name] = key
            rng = random.Random(_digest(self.seed, key))
            cost, size = self.templates[template if template is not None else t].medians[kind]
            return Step(name, key, tuple(parents), _lognormal(rng, cost, SIGMA_KEY),
                        max(1, int(_lognormal(rng, size, SIGMA_KEY))),
                        json.dumps([kind, spec], sort_keys=True))

        d = tpl.dataset
        # Shared across templates: ingestion by dataset, preprocessing by recipe.
        yield step("ingest", "ingest", ["dataset", d, self.snapshot[d]], [], template=d)
        yield step("validate", "validate", ["dataset", d], ["ingest"], template=d)
        recipe = ["recipe", d, tpl.recipe, self.recipe_version[d][tpl.recipe]]
        yield step("preprocess", "preprocess", recipe, ["ingest", "validate"],
                   template=d * RECIPES_PER_DATASET + tpl.recipe)
        yield step("features", "features", ["features", t, tpl.features_version],
                   ["preprocess"])
        for b in range(tpl.branches):
            yield step(f"train-{b}", "train", ["train", t, b, tpl.hyper[b]], ["features"])
            yield step(f"evaluate-{b}", "evaluate", ["evaluate", t, b],
                       [f"train-{b}", "preprocess"])
        yield step("report", "report", ["report", t, tpl.report_version],
                   [f"evaluate-{b}" for b in range(tpl.branches)])


# ----------------------------------------------------------------------------- replay


class SizeBlobs:
    """The artifact store, keeping sizes only (stand-in: policies never read bytes)."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}

    def put(self, key: str, size: int) -> StoredArtifact:
        digest = "sha256:" + key
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

    def copy(self) -> SizeBlobs:
        other = SizeBlobs()
        other.sizes = dict(self.sizes)
        return other


class SimClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def at(self, t: float) -> None:
        self.now = max(self.now, 1_800_000_000.0 + t)


@dataclass
class Outcome:
    total_compute: float = 0.0
    saved_compute: float = 0.0
    steps: int = 0
    steps_skipped: int = 0
    bytes_written: int = 0
    refused: int = 0
    hits: int = 0
    misses: int = 0
    commits: int = 0
    seconds: float = 0.0


def _levels(steps: Sequence[Step]) -> list[list[Step]]:
    depth: dict[str, int] = {}
    for s in steps:
        depth[s.name] = 1 + max((depth[p] for p in s.parents), default=-1)
    levels: list[list[Step]] = [[] for _ in range(max(depth.values()) + 1)]
    for s in steps:
        levels[depth[s.name]].append(s)
    return levels


def workflow_of(sub: Submission) -> ir.Workflow:
    """The submission as the IR a user would submit: each step runs its spec and reads its
    parents' outputs (so the optimizer keys it by lineage)."""
    steps = []
    for s in sub.steps:
        inputs = tuple(ir.InputParameter(f"in{i}", ir.StepOutputRef(p, "out"))
                       for i, p in enumerate(s.parents))
        steps.append(ir.Step(
            name=s.name, body=ir.ContainerSpec(image="bench/step:1", command=("run", s.spec)),
            inputs=inputs, dependencies=tuple(ir.Dependency(p) for p in s.parents),
            outputs=(ir.OutputParameter("out", source=ir.OutputSource.STDOUT),)))
    return ir.Workflow(name=f"template-{sub.template}", steps=tuple(steps))


async def _plan(cache: Cache, sub: Submission, planner: str
                ) -> tuple[set[str], dict[str, str]]:
    """The names of the steps not run (reused, or not needed) and each step's key -- with
    the lookups the planner makes."""
    if planner == "prefix":
        return await _prefix_plan(cache, sub), {s.name: s.key for s in sub.steps}
    # The optimizer itself (couler.optimize.optimize, validation on): it peeks at every
    # key, then looks up the keys the plan uses (the cache counts those).
    loop = asyncio.get_running_loop()

    def peek(keys: Sequence[str]) -> dict[str, CachedStep]:
        found = asyncio.run_coroutine_threadsafe(cache.lookup(keys, peek=True), loop).result()
        return {k: CachedStep(k, dict(e.outputs), {n: a.digest for n, a in e.artifacts.items()},
                              created_at=e.created_at or 0.0)
                for k, e in found.entries.items()}

    def use(keys: Sequence[str]) -> None:
        asyncio.run_coroutine_threadsafe(cache.lookup(keys), loop).result()

    wf = workflow_of(sub)
    plan = await asyncio.to_thread(optimize, wf, "local", lookup=peek, record_use=use)
    return set(plan.cached) | unneeded_steps(wf, plan.cached), dict(plan.keys)


async def _prefix_plan(cache: Cache, sub: Submission) -> set[str]:
    """Today's optimizer before keys by lineage: a step is looked up only when every step
    it reads from was a hit."""
    hit: set[str] = set()
    for level in _levels(sub.steps):
        ask = [s for s in level if all(p in hit for p in s.parents)]
        if ask:
            found = (await cache.lookup([s.key for s in ask])).entries
            hit.update(s.name for s in ask if s.key in found)
    return hit


async def replay(trace: Trace, planner: str, policy: str, budget: int,
                 directory: str) -> Outcome:
    """One trace through a fresh cache."""
    store = CacheStore.open(f"sqlite:///{directory}/cache-{planner}-{policy}-{budget}.db")
    blobs = SizeBlobs()
    clock = SimClock()
    cache = Cache(store, blobs, budget_bytes=budget, policy=policy, clock=clock,
                  retry_interval=10**6)
    out = Outcome()
    started = time.perf_counter()
    try:
        await cache.start()
        for sub in trace.submissions:
            clock.at(sub.at)
            reused, keys = await _plan(cache, sub, planner)
            done: dict[str, float] = {}
            for s in sub.steps:  # run in topological order; commit as each succeeds
                ready = max((done[p] for p in s.parents), default=sub.at)
                out.steps += 1
                out.total_compute += s.cost
                if s.name in reused:
                    out.saved_compute += s.cost
                    out.steps_skipped += 1
                    done[s.name] = ready
                    continue
                done[s.name] = ready + s.cost
                clock.at(done[s.name])
                entry = CacheEntry(
                    key=keys[s.name], workflow=f"template-{sub.template}", step=s.name,
                    outputs={"out": s.name}, artifacts={"out": blobs.put(keys[s.name], s.size)},
                    cost_seconds=s.cost, lineage=tuple(sorted(keys[p] for p in s.parents)))
                result = await cache.commit(entry)
                out.commits += 1
                if result.created:
                    out.bytes_written += s.size
                elif keys[s.name] in result.evicted:
                    out.refused += 1
        stats = await cache.stats()
        out.hits, out.misses = stats.hits, stats.misses
    finally:
        await cache.close()
        store.close()
    out.seconds = time.perf_counter() - started
    return out


# ----------------------------------------------------------------------------- report


def _row(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    def mean(values: Sequence[float]) -> float:
        return statistics.fmean(values)

    lookups = [o.hits + o.misses for o in outcomes]
    return {
        "hit_ratio": round(mean([o.hits / n if n else 0.0
                                 for o, n in zip(outcomes, lookups, strict=True)]), 4),
        "saved_compute_hours": round(mean([o.saved_compute / HOUR for o in outcomes]), 1),
        "saved_share": round(mean([o.saved_compute / o.total_compute for o in outcomes]), 4),
        "steps_skipped_share": round(mean([o.steps_skipped / o.steps for o in outcomes]), 4),
        "gb_written": round(mean([o.bytes_written / GB for o in outcomes]), 1),
        "refused": round(mean([o.refused for o in outcomes]), 1),
        "total_compute_hours": round(mean([o.total_compute / HOUR for o in outcomes]), 1),
        "ms_per_commit_and_lookups": round(mean([1000 * o.seconds / max(o.commits, 1)
                                                 for o in outcomes]), 2),
    }


def _replay_one(trace_args: tuple[int, int], planner: str, policy: str, budget: int,
                directory: str) -> Outcome:
    """One replay in a worker process (a trace is rebuilt there: it is deterministic)."""
    logging.disable(logging.WARNING)  # refusals are expected here, one line each
    return asyncio.run(replay(Trace(*trace_args), planner, policy, budget, directory))


def configurations(budgets: Sequence[int],
                   policies: Sequence[str]) -> list[tuple[str, int, str]]:
    """(planner, budget GB, policy) of each row: every policy with the lineage planner at
    each budget and without one; with the prefix planner (today's optimizer), LRU only --
    the LRU of today that issue 10's target is measured against."""
    rows = [("lineage", b, p) for b in budgets for p in policies]
    rows.append(("lineage", 0, "unlimited"))
    rows.extend(("prefix", b, "lru") for b in budgets)
    return rows


def simulate(workflows: int, seeds: int, budgets: Sequence[int], policies: Sequence[str],
             jobs: int) -> list[dict[str, Any]]:
    rows = configurations(budgets, policies)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=base) as directory, \
            ProcessPoolExecutor(max_workers=jobs) as pool:
        for seed in range(1, seeds + 1):
            os.makedirs(f"{directory}/{seed}", exist_ok=True)
        futures = {(row, seed): pool.submit(
            _replay_one, (seed, workflows), row[0], "lru" if row[2] == "unlimited" else row[2],
            row[1] * GB, f"{directory}/{seed}") for row in rows
            for seed in range(1, seeds + 1)}
        for row in rows:
            outcomes = [futures[row, seed].result() for seed in range(1, seeds + 1)]
            planner, budget_gb, policy = row
            result = {"planner": planner, "budget_gb": budget_gb, "policy": policy,
                      **_row(outcomes)}
            results.append(result)
            print(json.dumps(result), flush=True)
    return results


# ----------------------------------------------------------------------------- scale


async def _fill(path: str, n: int, blobs: SizeBlobs, clock: SimClock) -> int:
    """``n`` entries (lognormal sizes and costs, two random parents each) committed without
    a budget; their total size."""
    rng = random.Random(n)
    store = CacheStore.open(f"sqlite:///{path}")
    cache = Cache(store, blobs, budget_bytes=0, policy="lru", clock=clock,
                  retry_interval=10**6)
    keys: list[str] = []
    total = 0
    try:
        await cache.start()
        for i in range(n):
            clock.now += 1
            key = _digest("fill", i)
            size = max(1, int(_lognormal(rng, 100 * MB, 1.0)))
            parents = tuple(rng.sample(keys, 2)) if len(keys) > 2 else ()
            await cache.commit(CacheEntry(key, artifacts={"out": blobs.put(key, size)},
                                          cost_seconds=_lognormal(rng, 600, 1.0),
                                          lineage=parents))
            keys.append(key)
            total += size
    finally:
        await cache.close()
        store.close()
    return total


async def _evicting_commits(path: str, n: int, total: int, policy: str, blobs: SizeBlobs,
                            clock: SimClock, commits: int = 300) -> dict[str, Any]:
    """Start a cache on the filled index (pricing every entry for ``policy``), then time
    commits that each evict."""
    rng = random.Random(-n)
    store = CacheStore.open(f"sqlite:///{path}")
    cache = Cache(store, blobs, budget_bytes=total, policy=policy, clock=clock,
                  retry_interval=10**6)
    timings: list[float] = []
    evicting: list[float] = []
    try:
        started = time.perf_counter()
        await cache.start()
        start_seconds = time.perf_counter() - started
        evicted = 0
        for i in range(commits):
            clock.now += 1
            key = _digest("new", policy, i)
            size = max(1, int(_lognormal(rng, 100 * MB, 0.5)))
            parents = tuple(_digest("fill", rng.randrange(n)) for _ in range(2))
            started = time.perf_counter()
            # Expensive for its size: every policy admits it, so every commit evicts.
            result = await cache.commit(CacheEntry(
                key, artifacts={"out": blobs.put(key, size)}, cost_seconds=10**6,
                lineage=parents))
            timings.append(time.perf_counter() - started)
            if not result.created:
                raise SystemExit(f"scale {n} {policy}: commit refused")
            if result.evicted:
                evicting.append(timings[-1])
            evicted += len(result.evicted)
    finally:
        await cache.close()
        store.close()
    def ms(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return round(1000 * ordered[min(int(len(ordered) * q), len(ordered) - 1)], 2)

    return {"entries": n, "policy": policy, "start_seconds": round(start_seconds, 2),
            "evicted_per_commit": round(evicted / commits, 2),
            "ms_per_commit_median": ms(timings, 0.5), "ms_per_commit_p95": ms(timings, 0.95),
            "evicting_commits": len(evicting),
            "ms_per_evicting_commit_median": ms(evicting, 0.5) if evicting else None}


def scale(sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Evicting commits against indexes of ``sizes`` entries, per policy."""
    results = []
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as directory:
        for n in sizes:
            blobs = SizeBlobs()
            clock = SimClock()
            filled = f"{directory}/filled-{n}.db"
            total = asyncio.run(_fill(filled, n, blobs, clock))
            for policy in POLICIES:
                path = f"{directory}/scale-{n}-{policy}.db"
                shutil.copyfile(filled, path)
                row = asyncio.run(_evicting_commits(path, n, total, policy, blobs.copy(),
                                                    clock))
                results.append(row)
                print(json.dumps(row), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS_GB)),
                        help="budgets in GB, comma-separated")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="policies to compare (lineage planner), comma-separated")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="replays run side by side in worker processes")
    parser.add_argument("--scale", help="instead: time evicting commits at these index sizes")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # refusals are expected here, one line each
    if args.scale:
        results: Mapping[str, Any] = {"scale": scale([int(n) for n in args.scale.split(",")])}
    else:
        results = {"workflows": args.workflows, "seeds": args.seeds,
                   "results": simulate(args.workflows, args.seeds,
                                       [int(b) for b in args.budgets.split(",")],
                                       args.policies.split(","), args.jobs)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
