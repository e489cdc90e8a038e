"""Split a workflow that is too large for its engine into an acyclic graph of chunks.

The paper's Algorithm 3 walks the DAG depth-first and cuts whenever the budget is
reached; a plain DFS can produce chunks that depend on each other both ways, and
it says nothing about the edges it cuts (couler-paper.md §4.4). This version:

1. **Budget** — a vector, not a sum: at most ``max_steps`` steps and at most
   ``margin * max_bytes`` bytes of compiled document per chunk. :func:`budget_for`
   takes the smallest document-size limit from the engine's limits table (Argo and
   Tekton: 1 MiB in practice, KFP: 1.5 MiB) with a 25 % safety margin.
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
   upstream chunk's results. Each chunk is checked against the budget by
   compiling it; the capacity shrinks until every chunk fits (or a single unit is
   too large, which is reported).

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

__all__ = ["Budget", "Chunk", "SplitResult", "budget_for", "handoff_parameter",
           "split_workflow"]

_SIZE_LIMIT_HINTS = ("object size", "message size")
_MAX_SHRINKS = 12


@dataclass(frozen=True, slots=True)
class Budget:
    """How much one chunk may hold; None = no limit of that kind."""

    max_steps: int | None = None
    max_bytes: int | None = None
    margin: float = 0.75

    @property
    def bytes_allowed(self) -> int | None:
        return None if self.max_bytes is None else int(self.max_bytes * self.margin)


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


def budget_for(engine: str, max_steps: int | None = None) -> Budget:
    """The budget for ``engine``: its smallest document-size limit, 25 % margin."""
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
    """Union-find over step names."""

    def __init__(self, names: Iterable[str]) -> None:
        self.parent = {n: n for n in names}

    def find(self, n: str) -> str:
        while self.parent[n] != n:
            self.parent[n] = self.parent[self.parent[n]]
            n = self.parent[n]
        return n

    def union(self, a: str, b: str) -> None:
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


def _sccs(nodes: Sequence[str], edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (iterative Tarjan), in reverse topological order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
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


def _unit_order(wf: ir.Workflow) -> list[list[str]]:
    """Units (lists of step names, original order) in level order."""
    names = [s.name for s in wf.steps]
    uf = _Units(names)
    for step in wf.steps:
        for up in _glued(step):
            uf.union(step.name, up)
    # contract, then merge cycles between units
    succ: dict[str, set[str]] = {uf.find(n): set() for n in names}
    for step in wf.steps:
        for d in step.dependencies:
            a, b = uf.find(d.step), uf.find(step.name)
            if a != b:
                succ[a].add(b)
    roots = sorted(succ)
    for comp in _sccs(roots, succ):
        for other in comp[1:]:
            uf.union(comp[0], other)
    members: dict[str, list[str]] = {}
    for n in names:
        members.setdefault(uf.find(n), []).append(n)
    edges: dict[str, set[str]] = {u: set() for u in members}
    indeg = {u: 0 for u in members}
    for step in wf.steps:
        for d in step.dependencies:
            a, b = uf.find(d.step), uf.find(step.name)
            if a != b and b not in edges[a]:
                edges[a].add(b)
                indeg[b] += 1
    first = {u: names.index(ms[0]) for u, ms in members.items()}
    level = dict.fromkeys(members, 0)
    ready = sorted((u for u, k in indeg.items() if k == 0), key=first.__getitem__)
    order: list[str] = []
    while ready:
        u = ready.pop(0)
        order.append(u)
        for v in edges[u]:
            level[v] = max(level[v], level[u] + 1)
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    order.sort(key=lambda u: (level[u], first[u]))
    return [members[u] for u in order]


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
        inputs = tuple(dataclasses.replace(i, value=_rewrite(i.value, inside, needed, types))
                       for i in s.inputs)
        when = s.when
        if when is not None:
            cond = when.condition
            cond = dataclasses.replace(cond, left=_rewrite(cond.left, inside, needed, types),
                                       right=_rewrite(cond.right, inside, needed, types))
            when = dataclasses.replace(when, condition=cond)
        foreach = s.foreach
        if foreach is not None and isinstance(foreach.source, ir.StepOutputRef):
            src = _rewrite(foreach.source, inside, needed, types)
            assert isinstance(src, (ir.StepOutputRef, ir.WorkflowParamRef))
            foreach = dataclasses.replace(foreach, source=src)
        deps = tuple(d for d in s.dependencies if d.step in inside)
        new_steps.append(dataclasses.replace(s, inputs=inputs, when=when, foreach=foreach,
                                             dependencies=deps))
    params = tuple(wf.parameters) + tuple(
        ir.Parameter(name=n, type=t) for n, t in sorted(needed.items()))
    return dataclasses.replace(wf, name=name, steps=tuple(new_steps), parameters=params,
                               exit_hooks=(), schedule=None, triggers=())


def _assign(units: Sequence[Sequence[str]], cap: int) -> list[list[int]]:
    chunks: list[list[int]] = [[]]
    count = 0
    for i, unit in enumerate(units):
        if chunks[-1] and count + len(unit) > cap:
            chunks.append([])
            count = 0
        chunks[-1].append(i)
        count += len(unit)
    return chunks


def _critical_path(nodes: Sequence[str], preds: Mapping[str, Iterable[str]],
                   weight: Callable[[str], int]) -> int:
    """Longest weighted path; ``nodes`` in topological order."""
    best: dict[str, int] = {}
    for n in nodes:
        best[n] = weight(n) + max((best[p] for p in preds.get(n, ()) if p in best), default=0)
    return max(best.values(), default=0)


def split_workflow(wf: ir.Workflow, budget: Budget,
                   measure: Callable[[ir.Workflow], int]) -> SplitResult:
    """Split ``wf`` into chunks within ``budget``; ``measure`` gives a document's size.

    A workflow within budget comes back as one chunk (itself). Raises UserError when
    the workflow must be split but cannot be (exit hooks, or one unit over budget).
    """
    n = len(wf.steps)
    allowed = budget.bytes_allowed
    size = measure(wf) if allowed is not None else 0
    over_steps = budget.max_steps is not None and n > budget.max_steps
    over_bytes = allowed is not None and size > allowed
    if not (over_steps or over_bytes):
        why = f"{n} steps" + (f", {size} of {allowed} bytes" if allowed is not None else "")
        return SplitResult((Chunk(wf.name, tuple(s.name for s in wf.steps), (), wf, size),),
                           (f"within budget ({why}): not split",))
    if wf.exit_hooks:
        raise UserError(f"workflow {wf.name!r} is over the engine's budget ({n} steps, "
                        f"{size} bytes) and has exit hooks, which splitting does not support")
    units = _unit_order(wf)
    by_name = {s.name: s for s in wf.steps}
    position = {s.name: i for i, s in enumerate(wf.steps)}
    types = {(s.name, o.name): o.type for s in wf.steps for o in s.outputs}
    cap = budget.max_steps or n
    if allowed is not None and size > 0:
        cap = min(cap, max(1, math.floor(allowed / (size / n))))
    notes: list[str] = []
    for _ in range(_MAX_SHRINKS):
        groups = _assign(units, cap)
        built = []
        for i, group in enumerate(groups):
            names = [name for u in group for name in units[u]]
            names.sort(key=position.__getitem__)
            cw = _chunk_workflow(wf, f"{wf.name}-{i + 1}", [by_name[x] for x in names], types)
            built.append((group, names, cw, measure(cw)))
        too_big = [b for b in built if allowed is not None and b[3] > allowed]
        if not too_big:
            break
        if all(len(b[0]) == 1 for b in too_big):
            step_list = ", ".join(too_big[0][1][:5])
            raise UserError(f"workflow {wf.name!r}: steps that must stay together ({step_list}"
                            f") compile to {too_big[0][3]} bytes, over the budget of {allowed}")
        cap = max(1, int(cap * 0.7))
    else:
        raise UserError(f"workflow {wf.name!r}: no split within {_MAX_SHRINKS} attempts fits "
                        f"the budget of {allowed} bytes")
    chunk_of = {name: i for i, (_, names, _, _) in enumerate(built) for name in names}
    chunks = []
    cut = 0
    for i, (_, names, cw, csize) in enumerate(built):
        ups = set()
        for name in names:
            for d in by_name[name].dependencies:
                if chunk_of[d.step] != i:
                    ups.add(chunk_of[d.step])
                    cut += 1
        assert all(u < i for u in ups), "chunk graph must be acyclic"
        chunks.append(Chunk(cw.name, tuple(names), tuple(built[u][2].name for u in sorted(ups)),
                            cw, csize))
    # critical paths, in steps: the original DAG vs the chunk DAG run chunk after chunk
    preds = {s.name: [d.step for d in s.dependencies] for s in wf.steps}
    topo = [name for unit in units for name in unit]
    original = _critical_path(_topo_within(topo, preds), preds, lambda _: 1)
    inner = {c.name: _critical_path(_topo_within(list(c.steps), preds), preds, lambda _: 1)
             for c in chunks}
    chunk_preds = {c.name: list(c.depends_on) for c in chunks}
    chunked = _critical_path([c.name for c in chunks], chunk_preds, inner.__getitem__)
    notes.append(f"{n} steps, {size} bytes over budget "
                 f"({budget.max_steps or '-'} steps, {allowed or '-'} bytes): "
                 f"{len(chunks)} chunks of at most {max(len(c.steps) for c in chunks)} steps, "
                 f"largest {max(c.size_bytes for c in chunks)} bytes, {cut} edges cut")
    notes.append(f"critical path {original} steps; through the chunk graph {chunked} steps")
    return SplitResult(tuple(chunks), tuple(notes))


def _topo_within(names: Sequence[str], preds: Mapping[str, Sequence[str]]) -> list[str]:
    """``names`` in a topological order of the dependency graph restricted to them."""
    inside = set(names)
    indeg = {n: sum(1 for p in preds.get(n, ()) if p in inside) for n in names}
    succ: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for p in preds.get(n, ()):
            if p in inside:
                succ[p].append(n)
    ready = [n for n in names if indeg[n] == 0]
    out: list[str] = []
    while ready:
        n = ready.pop()
        out.append(n)
        for c in succ[n]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    if len(out) != len(names):
        raise AssertionError("cycle in a validated workflow")
    return out

