"""Split a workflow that is too large for its engine into an acyclic graph of chunks.

The paper's Algorithm 3 walks the DAG depth-first and cuts whenever the budget is
reached; a plain DFS can produce chunks that depend on each other both ways, and
it says nothing about the edges it cuts (couler-paper.md §4.4). This version:

1. **Budget** — a vector, not a sum: at most ``max_steps`` steps and at most
   ``margin * max_bytes`` bytes of compiled document per chunk, measured as the engine's
   API takes it: compact JSON for the engines behind the Kubernetes API, whose object
   size limits are on the stored JSON (:func:`couler.optimize.passes.document_size`),
   not the YAML ``couler compile`` prints. :func:`budget_for` takes the smallest
   document-size limit from the engine's limits table (Argo and Tekton: 1 MiB in
   practice, KFP: 1.5 MiB) with a 3 % safety margin (chunk sizes are measured exactly,
   the margin covers what the engine's server adds to a stored object). A size the
   engine refused lowers it (:attr:`Budget.learned_bytes`), in the same unit.
2. **Units** — steps that must stay together are contracted first: an edge with a
   condition other than "succeeded", a ``depends`` expression, and an artifact
   hand-off keep both ends in one unit (a cut edge can only say "ran and
   succeeded", and only parameters cross chunks). Contracting can create cycles
   between units; strongly connected units are merged, so the unit graph is a DAG.
3. **Order** — units are laid out level by level (longest path from a root), and
   chunks are contiguous runs of that topological order. Every cut edge therefore
   goes from an earlier chunk to a later one: the chunk graph is acyclic by
   construction. Independent units of one level can land in different chunks that
   run side by side.
4. **Hand-off** — a step reading an output of a step in another chunk reads a
   chunk parameter ``x--STEP--OUTPUT`` instead; the submitter fills it from the
   upstream chunk's results.
5. **Filling, in linear time** — chunks are cut greedily from a size model
   ``base + steps * bytes_per_step`` fitted to the documents compiled so far (a sample
   of the first steps, then every chunk), and every chunk's document is compiled once
   and checked against the budget: a chunk over it is cut smaller, one far under it
   (below 90 %) grows, each with the model corrected by the real size (a few more
   compiles per chunk at most). So every step is compiled about once, chunks fill the
   budget, and no chunk is over it (a single unit too large is reported).

Workflows with exit hooks are not split (where the hooks run would change); they
raise a UserError when over budget.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from couler import ir
from couler.engines.base import Limit
from couler.errors import UserError

__all__ = ["DEFAULT_MARGIN", "LEARNED_FACTOR", "Budget", "Chunk", "SplitResult", "budget_for",
           "handoff_parameter", "learned_limit", "split_workflow"]

_SIZE_LIMIT_HINTS = ("object size", "message size")
#: The share of the engine's size limit a chunk may fill (sizes are exact; the rest covers
#: what the engine's server adds to the stored object: status, managed fields).
DEFAULT_MARGIN = 0.97
#: A chunk under this share of the budget grows (when more units follow).
_FILL = 0.9
#: Cut to this share of the budget by the model, so a small misprediction still fits.
_AIM = 0.985
#: Compiles per chunk at most (the first cut, then corrections).
_MAX_TRIES = 6
#: Steps compiled to learn the size per step before deciding whether to compile everything.
_SAMPLE_STEPS = 64


@dataclass(frozen=True, slots=True)
class Budget:
    """How much one chunk may hold; None = no limit of that kind. Bytes are of the
    compiled document in the unit of the engine's limit (compact JSON for Kubernetes
    objects: see :func:`couler.optimize.passes.document_size`)."""

    max_steps: int | None = None
    max_bytes: int | None = None
    margin: float = DEFAULT_MARGIN
    #: A smaller limit learned from an engine that refused a document for its size
    #: (used as is, no margin), and why -- for the split pass's notes.
    learned_bytes: int | None = None
    learned_reason: str = ""

    @property
    def bytes_allowed(self) -> int | None:
        static = None if self.max_bytes is None else int(self.max_bytes * self.margin)
        if self.learned_bytes is None:
            return static
        return self.learned_bytes if static is None else min(static, self.learned_bytes)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One part of a split workflow: its steps, the chunks it waits for, its workflow."""

    name: str
    steps: tuple[str, ...]
    depends_on: tuple[str, ...]
    workflow: ir.Workflow
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class SplitResult:
    chunks: tuple[Chunk, ...]
    notes: tuple[str, ...]


#: A document the engine refused for its size: later chunks stay below this share of it.
LEARNED_FACTOR = 0.8


def learned_limit(refused_bytes: int) -> int:
    """The byte budget learned from an engine that refused a ``refused_bytes`` document
    (the size in the budget's unit: ``DocumentTooLargeError.size_bytes``)."""
    return max(1, int(refused_bytes * LEARNED_FACTOR))


def budget_for(engine: str, max_steps: int | None = None) -> Budget:
    """The budget for ``engine``: its smallest document-size limit, a 3 % margin."""
    limits = _limits(engine)
    sizes = [lim.value for lim in limits if lim.unit == "bytes"
             and any(h in lim.name.lower() for h in _SIZE_LIMIT_HINTS)]
    return Budget(max_steps=max_steps, max_bytes=min(sizes) if sizes else None)


def _limits(engine: str) -> Sequence[Limit]:
    if engine == "argo":
        from couler.compilers import argo_capabilities

        return argo_capabilities.LIMITS
    if engine == "tekton":
        from couler.compilers import tekton

        return tekton.LIMITS
    if engine == "kfp":
        from couler.compilers import kfp

        return kfp.LIMITS
    if engine == "airflow":
        from couler.compilers import airflow

        return airflow.LIMITS
    return ()


def handoff_parameter(step: str, output: str) -> str:
    """The chunk parameter that carries ``step``'s ``output`` across a cut."""
    return f"x--{step}--{output}"


# ------------------------------------------------------------------------ graph


class _Units:
    """Union-find over step positions; a set's representative is its smallest position
    (its first step)."""

    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, n: int) -> int:
        parent = self.parent
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _glued(step: ir.Step) -> Iterable[str]:
    """Upstream steps that must share ``step``'s chunk."""
    for d in step.dependencies:
        if d.condition is not ir.EdgeCondition.SUCCEEDED or step.depends is not None:
            yield d.step
    for art in step.input_artifacts:
        if isinstance(art.source, ir.StepArtifactRef):
            yield art.source.step


def _sccs(nodes: Sequence[int], edges: Mapping[int, set[int]]) -> list[list[int]]:
    """Strongly connected components (iterative Tarjan), in reverse topological order."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                out.append(comp)
    return out


def _unit_order(wf: ir.Workflow) -> list[list[int]]:
    """Units -- the positions of their steps in ``wf.steps``, ascending -- by level (the
    longest path from a root of the unit graph), then by their first step.

    Positions, not names: at 100k steps the name-keyed version spent 20x the time of 10k
    steps in dictionaries that no longer fit the CPU's caches.
    """
    steps = wf.steps
    position = {s.name: i for i, s in enumerate(steps)}
    uf = _Units(len(steps))
    for i, step in enumerate(steps):
        for up in _glued(step):
            uf.union(i, position[up])
    preds = [[position[d.step] for d in s.dependencies] for s in steps]
    unit = [uf.find(i) for i in range(len(steps))]
    level = _levels(unit, preds)
    if level is None:  # contracting made cycles between units: merge them
        succ: dict[int, set[int]] = {u: set() for u in unit}
        for b, ps in enumerate(preds):
            for p in ps:
                if unit[p] != unit[b]:
                    succ[unit[p]].add(unit[b])
        for comp in _sccs(sorted(succ), succ):
            for other in comp[1:]:
                uf.union(comp[0], other)
        unit = [uf.find(i) for i in range(len(steps))]
        level = _levels(unit, preds)
        assert level is not None, "the graph of merged units is acyclic"
    members: dict[int, list[int]] = {}
    for i, u in enumerate(unit):
        members.setdefault(u, []).append(i)
    # a unit's representative is its first step's position
    return [members[u] for u in sorted(members, key=lambda u: (level[u], u))]


def _levels(unit: Sequence[int], preds: Sequence[Sequence[int]]) -> list[int] | None:
    """Per step position, the level of its unit (``unit[i]``: the representative of step
    ``i``'s unit) in the unit graph -- the longest path from a root; None when that graph
    has a cycle."""
    size = len(unit)
    succ: list[list[int]] = [[] for _ in range(size)]
    indeg = [0] * size
    for b, ps in enumerate(preds):
        ub = unit[b]
        for p in ps:
            up = unit[p]
            if up != ub:
                succ[up].append(ub)
                indeg[ub] += 1
    level = [0] * size
    ready = [u for u in range(size) if unit[u] == u and indeg[u] == 0]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for v in succ[u]:
            if level[v] <= level[u]:
                level[v] = level[u] + 1
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return level if done == sum(1 for i in range(size) if unit[i] == i) else None


# ---------------------------------------------------------------------- chunks


def _rewrite(source: ir.ValueSource, inside: set[str], needed: dict[str, ir.ValueType],
             types: Mapping[tuple[str, str], ir.ValueType]) -> ir.ValueSource:
    if isinstance(source, ir.StepOutputRef) and source.step not in inside:
        name = handoff_parameter(source.step, source.output)
        needed[name] = types.get((source.step, source.output), ir.ValueType.STRING)
        return ir.WorkflowParamRef(name)
    return source


def _chunk_workflow(wf: ir.Workflow, name: str, steps: Sequence[ir.Step],
                    types: Mapping[tuple[str, str], ir.ValueType]) -> ir.Workflow:
    inside = {s.name for s in steps}
    needed: dict[str, ir.ValueType] = {}
    new_steps = []
    for s in steps:
        # Most steps read only steps of their own chunk: kept as they are (a replace per
        # step was a tenth of a 100k-step plan).
        inputs = s.inputs
        if any(isinstance(i.value, ir.StepOutputRef) and i.value.step not in inside
               for i in inputs):
            inputs = tuple(i if not isinstance(i.value, ir.StepOutputRef)
                           or i.value.step in inside
                           else dataclasses.replace(i, value=_rewrite(i.value, inside, needed,
                                                                      types))
                           for i in inputs)
        when = s.when
        if when is not None:
            cond = when.condition
            left = _rewrite(cond.left, inside, needed, types)
            right = _rewrite(cond.right, inside, needed, types)
            if left is not cond.left or right is not cond.right:
                when = dataclasses.replace(when, condition=dataclasses.replace(
                    cond, left=left, right=right))
        foreach = s.foreach
        if foreach is not None and isinstance(foreach.source, ir.StepOutputRef) \
                and foreach.source.step not in inside:
            src = _rewrite(foreach.source, inside, needed, types)
            assert isinstance(src, (ir.StepOutputRef, ir.WorkflowParamRef))
            foreach = dataclasses.replace(foreach, source=src)
        deps = s.dependencies
        if any(d.step not in inside for d in deps):
            deps = tuple(d for d in deps if d.step in inside)
        if (inputs is s.inputs and when is s.when and foreach is s.foreach
                and deps is s.dependencies):
            new_steps.append(s)
        else:
            new_steps.append(dataclasses.replace(s, inputs=inputs, when=when, foreach=foreach,
                                                 dependencies=deps))
    params = tuple(wf.parameters) + tuple(
        ir.Parameter(name=n, type=t) for n, t in sorted(needed.items()))
    return dataclasses.replace(wf, name=name, steps=tuple(new_steps), parameters=params,
                               exit_hooks=(), schedule=None, triggers=())


def _critical_path(nodes: Sequence[str], preds: Mapping[str, Iterable[str]],
                   weight: Callable[[str], int]) -> int:
    """Longest weighted path; ``nodes`` in topological order."""
    best: dict[str, int] = {}
    for n in nodes:
        best[n] = weight(n) + max((best[p] for p in preds.get(n, ()) if p in best), default=0)
    return max(best.values(), default=0)


class _SizeModel:
    """Predicts a chunk's document size as ``base + steps * per_step``, fitted to sizes
    measured so far: ``base`` from two measurements of different step counts, and
    ``per_step`` from the latest (the density of the part of the workflow being cut)."""

    def __init__(self) -> None:
        self.base = 0.0
        self.per_step = 0.0
        self._point: tuple[int, int] | None = None

    def learn(self, steps: int, size: int) -> None:
        if self._point is not None and self._point[0] != steps and not self.base:
            s0, z0 = self._point
            per = (size - z0) / (steps - s0)
            if per > 0:
                self.base = min(max(0.0, z0 - s0 * per), size / 2)
        self._point = (steps, size)
        self.per_step = max((size - self.base) / steps, 1.0)

    def steps_within(self, size: float) -> float:
        return (size - self.base) / self.per_step if self.per_step else math.inf


def split_workflow(wf: ir.Workflow, budget: Budget,
                   measure: Callable[[ir.Workflow], int]) -> SplitResult:
    """Split ``wf`` into chunks within ``budget``; ``measure`` gives a document's size in
    the budget's unit (the optimizer's: :func:`couler.optimize.passes.document_size`).

    A workflow within budget comes back as one chunk (itself). Raises UserError when
    the workflow must be split but cannot be (exit hooks, or one unit over budget).
    Linear in the workflow: every step is compiled (measured) about twice at most.
    """
    n = len(wf.steps)
    allowed = budget.bytes_allowed
    model = _SizeModel()
    size: int | None = None  # the whole document's, when it was measured
    over_steps = budget.max_steps is not None and n > budget.max_steps
    units: list[list[int]] | None = None
    types = _output_types(wf)
    if allowed is not None and not over_steps:
        # Sample the first steps: a workflow clearly over the budget is not compiled whole.
        units = _unit_order(wf)
        sample = _prefix(units, _SAMPLE_STEPS)
        if sample < len(units) and sum(len(u) for u in units[:sample]) < n:
            sample_steps = [wf.steps[i] for i in sorted(i for u in units[:sample] for i in u)]
            model.learn(len(sample_steps), measure(_chunk_workflow(
                wf, f"{wf.name}-1", sample_steps, types)))
        if model.per_step == 0.0 or model.base + n * model.per_step < 2 * allowed:
            size = measure(wf)
            model.learn(n, size)
    over_bytes = allowed is not None and (size is None or size > allowed)
    if not (over_steps or over_bytes):
        why = f"{n} steps" + (f", {size} of {allowed} bytes" if allowed is not None else "")
        return SplitResult((Chunk(wf.name, tuple(s.name for s in wf.steps), (), wf,
                                  size or 0),),
                           (*_learned_note(budget), f"within budget ({why}): not split"))
    if wf.exit_hooks:
        what = f"{size} bytes" if size is not None else f"over {allowed} bytes"
        raise UserError(f"workflow {wf.name!r} is over the engine's budget ({n} steps, "
                        f"{what}) and has exit hooks, which splitting does not support")
    if units is None:
        units = _unit_order(wf)
    steps = wf.steps
    # chunks as positions in ``wf.steps``, ascending (the steps' order in the workflow)
    built: list[tuple[list[int], ir.Workflow, int]] = []
    compiles = 0
    start = 0
    while start < len(units):
        name = f"{wf.name}-{len(built) + 1}"
        end = _cut(units, start, budget.max_steps, model, allowed)
        tried: dict[int, tuple[list[int], ir.Workflow, int]] = {}
        fits: list[int] = []
        while True:
            members = sorted(x for u in units[start:end] for x in u)
            cw = _chunk_workflow(wf, name, [steps[i] for i in members], types)
            csize = measure(cw)
            compiles += 1
            tried[end] = (members, cw, csize)
            model.learn(len(members), csize)
            if allowed is not None and csize > allowed:
                if end - start == 1:
                    together = ", ".join(steps[i].name for i in members[:5])
                    raise UserError(
                        f"workflow {wf.name!r}: steps that must stay together "
                        f"({together}) compile to {csize} bytes, over the budget "
                        f"of {allowed}")
                below = max([e for e in fits if e < end], default=start + 1)
                nxt = min(_cut(units, start, budget.max_steps, model, allowed), end - 1)
                end = max(nxt, below)
            elif (allowed is not None and csize < _FILL * allowed and end < len(units)
                  and (budget.max_steps is None or len(members) < budget.max_steps)):
                fits.append(end)
                above = min([e for e in tried if e > end], default=len(units) + 1)
                nxt = min(_cut(units, start, budget.max_steps, model, allowed), above - 1)
                if nxt <= end:  # the model says nothing more fits
                    break
                end = nxt
            else:
                break
            if end in tried or len(tried) >= _MAX_TRIES:
                best = max((e for e in tried if allowed is None or tried[e][2] <= allowed),
                           default=None)
                if best is None:  # every try was over: halve the last
                    end = start + max(1, (min(tried) - start) // 2)
                    continue
                end = best
                break
        built.append(tried[end])
        start = end
    if len(built) == 1:  # it all fits in one document after all
        csize = built[0][2]
        return SplitResult((Chunk(wf.name, tuple(s.name for s in wf.steps), (), wf, csize),),
                           (*_learned_note(budget),
                            f"within budget ({n} steps, {csize} of {allowed} bytes): "
                            "not split"))
    position = {s.name: i for i, s in enumerate(steps)}
    preds = [[position[d.step] for d in s.dependencies] for s in steps]
    chunk_of = [0] * n
    for i, (members, _, _) in enumerate(built):
        for x in members:
            chunk_of[x] = i
    chunks = []
    cut = 0
    for i, (members, cw, csize) in enumerate(built):
        ups = set()
        for x in members:
            for p in preds[x]:
                if chunk_of[p] != i:
                    ups.add(chunk_of[p])
                    cut += 1
        assert all(u < i for u in ups), "chunk graph must be acyclic"
        chunks.append(Chunk(cw.name, tuple(steps[x].name for x in members),
                            tuple(built[u][1].name for u in sorted(ups)), cw, csize))
    # critical paths, in steps: the original DAG vs the chunk DAG run chunk after chunk
    original, inner_paths = _critical_paths(preds, chunk_of, len(chunks))
    inner = {c.name: inner_paths[i] for i, c in enumerate(chunks)}
    chunk_preds = {c.name: list(c.depends_on) for c in chunks}
    chunked = _critical_path([c.name for c in chunks], chunk_preds, inner.__getitem__)
    total = sum(c.size_bytes for c in chunks)
    whole = f"{size} bytes" if size is not None else f"about {total} bytes (sum of the chunks)"
    largest = max(c.size_bytes for c in chunks)
    fill = f" ({largest / allowed:.0%} of the budget)" if allowed else ""
    notes = [*_learned_note(budget),
             f"{n} steps, {whole} over budget "
             f"({budget.max_steps or '-'} steps, {allowed or '-'} bytes): "
             f"{len(chunks)} chunks of at most {max(len(c.steps) for c in chunks)} steps, "
             f"largest {largest} bytes{fill}, {cut} edges cut, {compiles} chunk documents "
             "compiled",
             f"critical path {original} steps; through the chunk graph {chunked} steps"]
    return SplitResult(tuple(chunks), tuple(notes))


def _output_types(wf: ir.Workflow) -> dict[tuple[str, str], ir.ValueType]:
    return {(s.name, o.name): o.type for s in wf.steps for o in s.outputs}


def _prefix(units: Sequence[Sequence[int]], steps: int) -> int:
    """How many of the first units hold at least ``steps`` steps (all when fewer)."""
    count = 0
    for i, unit in enumerate(units):
        count += len(unit)
        if count >= steps:
            return i + 1
    return len(units)


def _cut(units: Sequence[Sequence[int]], start: int, max_steps: int | None,
         model: _SizeModel, allowed: int | None) -> int:
    """The end (exclusive) of the chunk starting at unit ``start``: as many units as fit
    ``max_steps`` and, by ``model``, the byte budget; at least one."""
    room = math.inf if allowed is None else model.steps_within(_AIM * allowed)
    if max_steps is not None:
        room = min(room, max_steps)
    count = 0
    end = start
    while end < len(units):
        count += len(units[end])
        if end > start and count > room:
            break
        end += 1
    return end


def _learned_note(budget: Budget) -> tuple[str, ...]:
    if budget.learned_bytes is None or budget.bytes_allowed != budget.learned_bytes:
        return ()
    return (f"budget {budget.learned_bytes / 1024:.0f} KiB: {budget.learned_reason}",)


def _critical_paths(preds: Sequence[Sequence[int]], chunk_of: Sequence[int],
                    chunks: int) -> tuple[int, list[int]]:
    """The longest path, in steps, of the dependency graph (``preds``: the positions of
    each step's upstream steps), and of each chunk's part of it (``chunk_of``: each step's
    chunk). One pass in a topological order (a topological order of the whole graph is
    one of every part of it)."""
    size = len(preds)
    indeg = [len(ps) for ps in preds]
    succ: list[list[int]] = [[] for _ in range(size)]
    for i, ps in enumerate(preds):
        for p in ps:
            succ[p].append(i)
    whole = [0] * size
    inner = [0] * size
    ready = [i for i in range(size) if indeg[i] == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        chunk = chunk_of[i]
        longest = longest_inside = 0
        for p in preds[i]:
            longest = max(longest, whole[p])
            if chunk_of[p] == chunk:
                longest_inside = max(longest_inside, inner[p])
        whole[i] = longest + 1
        inner[i] = longest_inside + 1
        for c in succ[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    if done != size:
        raise AssertionError("cycle in a validated workflow")
    per_chunk = [0] * chunks
    for i in range(size):
        per_chunk[chunk_of[i]] = max(per_chunk[chunk_of[i]], inner[i])
    return max(whole, default=0), per_chunk
