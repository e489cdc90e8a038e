"""What the console's pages show, computed from the monitor's records (no HTML here).

* :func:`graph` -- a run's DAG laid out in layers by dependency depth (a step's layer is
  one more than its deepest upstream step's), from the workflow of the run's latest plan,
  each node coloured by the state of its record, with its map items / chunks (records with
  a key) as small marks; exit-hook steps in a last column. Without a plan the nodes are the
  recorded steps, in one column, with no edges (the graph is unknown).
* :func:`plots` -- per step execution, CPU and memory over time (raw samples, and 1-minute
  rollups for older time) against the planned request and limit, with the peaks.
* :func:`cache_panel` -- per run: steps reused from the cache, hit ratio, artifact bytes
  reused, compute saved.
* :func:`shown_state` -- the state a step is shown in: a step of a finished run with no
  terminal record is not "pending" (nothing will run it any more; the engine never
  reported its end): it shows as "not reported", saying so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from couler import ir
from couler.v1 import workflow_pb2
from couler_monitor.service import StepDetail
from couler_runtime.rpc.records import Run, StepRecord, Utilization

__all__ = ["CachePanel", "Graph", "Node", "Plot", "cache_panel", "graph", "plots",
           "shown_state"]

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 190, 46, 70, 22, 12
MARKS_PER_ROW, MARK = 20, 7
MAX_MARKS = 60
PLOT_W, PLOT_H, PLOT_PAD = 360, 110, 4
_FAILED = {"failed"}
_ACTIVE = {"running", "retrying"}


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    name: str
    state: str
    x: int
    y: int
    hook: str  # "" for a main step; the status an exit hook runs on
    marks: tuple[tuple[int, int, str, str], ...]  # x, y, state, key
    more: int  # keyed records not drawn
    items: int  # keyed records in all

    @property
    def label(self) -> str:
        return self.name if len(self.name) <= 24 else self.name[:23] + "…"


@dataclasses.dataclass(frozen=True, slots=True)
class Graph:
    nodes: tuple[Node, ...]
    edges: tuple[str, ...]  # SVG path data
    width: int
    height: int
    planned: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Plot:
    step: str
    key: str
    attempt: int
    cpu: str  # polyline points
    memory: str
    points: int
    cpu_max: float
    memory_max: int
    cpu_scale: float
    memory_scale: int
    cpu_lines: tuple[tuple[str, float, float], ...]  # (label, value, y)
    memory_lines: tuple[tuple[str, int, float], ...]
    start: float
    end: float
    running: bool


@dataclasses.dataclass(frozen=True, slots=True)
class CachePanel:
    steps: int
    cached: int
    bytes: int
    saved_seconds: float

    @property
    def ratio(self) -> float:
        return self.cached / self.steps if self.steps else 0.0


def shown_state(run: Run, state: str) -> tuple[str, str]:
    """(the state shown, why) for a step whose record says ``state`` ("" for none)."""
    if run.state.terminal and state in ("", "pending", "running", "retrying"):
        said = f"not reported: the run {run.state.value} before the engine reported this step"
        if state:
            said += f" (its last record said {state})"
        return "unreported", said
    return (state or "pending"), ""


def _dependencies(step: workflow_pb2.Step) -> set[str]:
    out = {d.step for d in step.dependencies if d.step}
    if step.HasField("depends"):
        out |= set(_terms(step.depends))
    return out


def _terms(message: Any) -> Iterable[str]:
    """The step names a depends expression mentions (its DependsTerm leaves)."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        values = value if field.label == field.LABEL_REPEATED else [value]
        for v in values:
            if v.DESCRIPTOR.name == "DependsTerm":
                if v.step:
                    yield v.step
            else:
                yield from _terms(v)


def _aggregate(states: Sequence[str]) -> str:
    if not states:
        return ""
    if any(s in _FAILED for s in states):
        return "failed"
    if any(s in _ACTIVE for s in states):
        return "running"
    if all(s == "cached" for s in states):
        return "cached"
    if all(s in ("succeeded", "cached", "skipped", "pruned") for s in states):
        return "succeeded"
    if any(s == "cancelled" for s in states):
        return "cancelled"
    return "pending" if all(s == "pending" for s in states) else "running"


def _depths(upstream: Mapping[str, set[str]]) -> dict[str, int]:
    """Each step's layer: 0 without upstream steps, else one more than its deepest upstream
    step's (iteratively: a chain of 100k steps is no recursion; steps on a cycle, which a
    valid plan has none of, end up in layer 0)."""
    downstream: dict[str, list[str]] = {name: [] for name in upstream}
    waiting = {name: 0 for name in upstream}
    for name, ups in upstream.items():
        for u in ups:
            if u in downstream and u != name:
                downstream[u].append(name)
                waiting[name] += 1
    depth = {name: 0 for name in upstream}
    ready = [name for name, n in waiting.items() if n == 0]
    while ready:
        name = ready.pop()
        for d in downstream[name]:
            depth[d] = max(depth[d], depth[name] + 1)
            waiting[d] -= 1
            if waiting[d] == 0:
                ready.append(d)
    return depth


def graph(run: Run, plan: bytes | None) -> Graph:
    """The run's DAG (see the module docstring)."""
    records: dict[str, list[StepRecord]] = {}
    for s in run.steps:
        records.setdefault(s.name, []).append(s)
    order: list[tuple[str, str, set[str]]] = []  # name, hook, upstream
    planned = False
    if plan:
        wf = workflow_pb2.Workflow()
        try:
            wf.ParseFromString(plan)
            planned = True
        except Exception:  # a damaged row: drawn from the records
            wf = workflow_pb2.Workflow()
        names = {s.name for s in wf.steps}
        order = [(s.name, "", _dependencies(s) & names) for s in wf.steps]
        for exit_hook in wf.exit_hooks:
            on = workflow_pb2.RunStatus.Name(exit_hook.on).removeprefix("RUN_STATUS_").lower()
            hook_names = {s.name for s in exit_hook.steps}
            order += [(s.name, on, _dependencies(s) & hook_names) for s in exit_hook.steps]
    known = {name for name, _, _ in order}
    order += [(name, "", set()) for name in records if name not in known]

    upstream = {name: up for name, _, up in order}
    depth = _depths(upstream)

    def layer(name: str) -> int:
        return depth.get(name, 0)

    main_layers = 0
    for name, hook, _ in order:
        if not hook:
            main_layers = max(main_layers, layer(name) + 1)
    columns: dict[int, list[tuple[str, str]]] = {}
    for name, hook, _ in order:
        col = layer(name) + (main_layers if hook else 0)
        columns.setdefault(col, []).append((name, hook))

    nodes: list[Node] = []
    where: dict[str, tuple[int, int, int]] = {}
    height = 0
    for col in sorted(columns):
        y = PAD
        for name, hook in columns[col]:
            recs = records.get(name, [])
            top = [r for r in recs if not r.key]
            keyed = [r for r in recs if r.key]
            raw = top[0].state.value if top else _aggregate([r.state.value for r in keyed])
            state, _ = shown_state(run, raw)
            x = PAD + col * (NODE_W + GAP_X)
            marks = []
            for i, r in enumerate(keyed[:MAX_MARKS]):
                mx = x + 6 + (i % MARKS_PER_ROW) * (MARK + 2)
                my = y + NODE_H + 3 + (i // MARKS_PER_ROW) * (MARK + 2)
                marks.append((mx, my, shown_state(run, r.state.value)[0], r.key))
            rows = math.ceil(min(len(keyed), MAX_MARKS) / MARKS_PER_ROW)
            h = NODE_H + (rows * (MARK + 2) + 4 if rows else 0)
            nodes.append(Node(name, state, x, y, hook, tuple(marks),
                              max(0, len(keyed) - MAX_MARKS), len(keyed)))
            where[name] = (x, y, h)
            y += h + GAP_Y
        height = max(height, y)
    edges = []
    for name, _, ups in order:
        if name not in where:
            continue
        tx, ty, _ = where[name]
        for u in sorted(ups):
            if u not in where:
                continue
            sx, sy, _ = where[u]
            x1, y1, x2, y2 = sx + NODE_W, sy + NODE_H / 2, tx, ty + NODE_H / 2
            mid = (x1 + x2) / 2
            edges.append(f"M{x1:g},{y1:g} C{mid:g},{y1:g} {mid:g},{y2:g} {x2:g},{y2:g}")
    width = PAD * 2 + (max(columns, default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    return Graph(tuple(nodes), tuple(edges), width, max(height, NODE_H + 2 * PAD), planned)


def step_resources(plan: bytes | None) -> dict[str, ir.Resources]:
    """The planned resources per step name (the defaults under "")."""
    if not plan:
        return {}
    wf = workflow_pb2.Workflow()
    try:
        wf.ParseFromString(plan)
    except Exception:
        return {}

    def res(m: workflow_pb2.Resources) -> ir.Resources:
        return ir.Resources(cpu_request=m.cpu_request, cpu_limit=m.cpu_limit,
                            memory_request=m.memory_request, memory_limit=m.memory_limit)

    out = {"": res(wf.defaults.resources)}
    for s in [*wf.steps, *(h for hook in wf.exit_hooks for h in hook.steps)]:
        if s.HasField("resources"):
            out[s.name] = res(s.resources)
    return out


def _quantity(text: str) -> float | None:
    if not text:
        return None
    try:
        value = float(ir.parse_quantity(text))
    except ValueError:
        return None
    return value if value > 0 else None


def plots(run: Run, usage: Utilization, resources: Mapping[str, ir.Resources]) -> list[Plot]:
    """Per step execution (step, key, attempt) with samples: its CPU and memory plots."""
    series: dict[tuple[str, str, int], list[tuple[float, float, int]]] = {}
    for r in usage.rollups:
        if r.start is None:
            continue
        series.setdefault((r.step, r.key, r.attempt), []).append(
            (r.start + 30.0, r.cpu_mean, r.memory_max_bytes))
    for s in usage.samples:
        if s.at is None:
            continue
        series.setdefault((s.step, s.key, s.attempt), []).append(
            (s.at, s.cpu, s.memory_bytes))
    states = {(s.name, s.key): s.state for s in run.steps}
    out = []
    for (step, key, attempt), points in sorted(series.items()):
        points.sort()
        want = resources.get(step) or resources.get("") or ir.Resources()
        cpu_lines = [(label, v) for label, v in (
            ("request", _quantity(want.cpu_request)), ("limit", _quantity(want.cpu_limit)))
            if v is not None]
        mem_lines = [(label, v) for label, v in (
            ("request", _quantity(want.memory_request)),
            ("limit", _quantity(want.memory_limit))) if v is not None]
        cpu_max = max(p[1] for p in points)
        mem_max = max(p[2] for p in points)
        cpu_scale = max([cpu_max, *(v for _, v in cpu_lines)]) * 1.1 or 1.0
        mem_scale = max([float(mem_max), *(v for _, v in mem_lines)]) * 1.1 or 1.0
        t0, t1 = points[0][0], points[-1][0]
        span = (t1 - t0) or 1.0
        drawn = points if len(points) > 1 else [points[0],
                                                 (t0 + span, points[0][1], points[0][2])]

        def xy(t: float, v: float, scale: float, t0: float = t0, span: float = span) -> str:
            x = PLOT_PAD + (t - t0) / span * (PLOT_W - 2 * PLOT_PAD)
            y = PLOT_H - PLOT_PAD - v / scale * (PLOT_H - 2 * PLOT_PAD)
            return f"{x:.1f},{y:.1f}"

        def level(v: float, scale: float) -> float:
            return round(PLOT_H - PLOT_PAD - v / scale * (PLOT_H - 2 * PLOT_PAD), 1)

        state = states.get((step, key))
        out.append(Plot(
            step, key, attempt,
            " ".join(xy(t, c, cpu_scale) for t, c, _ in drawn),
            " ".join(xy(t, m, mem_scale) for t, _, m in drawn),
            len(points), cpu_max, mem_max, cpu_scale, int(mem_scale),
            tuple((label, v, level(v, cpu_scale)) for label, v in cpu_lines),
            tuple((label, int(v), level(v, mem_scale)) for label, v in mem_lines),
            t0, t1, state is not None and state.value in _ACTIVE))
    return out


def artifact_size(artifact: object) -> int:
    """A stored artifact's ``size_bytes``; 0 when it has none (or a damaged one)."""
    size = artifact.get("size_bytes") if isinstance(artifact, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


def cache_panel(run: Run, details: Mapping[tuple[str, str], StepDetail],
                computed: Mapping[str, float]) -> CachePanel:
    """The run's cache reuse: steps reused, bytes of their stored outputs, compute saved
    (the reuse's own figure when the engine gave one, else the step's latest computed
    duration in this workflow)."""
    cached = [s for s in run.steps if s.cached or s.state.value == "cached"]
    size = saved = 0.0
    for s in cached:
        d = details.get((s.name, s.key))
        if d is not None:
            size += sum(artifact_size(a) for a in d.artifacts.values())
            if d.cache_saved_seconds:
                saved += d.cache_saved_seconds
                continue
        saved += computed.get(s.name, 0.0)
    return CachePanel(len(run.steps), len(cached), int(size), saved)
