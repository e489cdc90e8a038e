"""Expectation oracle for plain-English -> workflow cases, over ``couler.ir`` objects.

The case format and the meaning of every expectation key are given in the header of
``tests/nl/dev-cases.yaml``. :func:`check` evaluates one case's ``expect`` mapping on a
generated :class:`couler.ir.Workflow` and returns the failed expectations as messages
(empty: the case passes). Unknown keys and malformed values fail; nothing passes silently.

The workflow is read as a graph of *leaf* steps: inline sub-workflows are flattened (their
inner steps are the leaves; the sub-workflow is an entry and an exit node around them) and
exit-hook steps come after every main step. A word that a step fanned out over static items
mentions only in its items stands for one copy of the step per matching item; copies of one
fan-out run concurrently unless its parallelism is 1.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from couler import ir

__all__ = ["KEYS", "check", "cron_fields", "seconds"]

_PLACEHOLDER = re.compile(r"\{\{\s*inputs\.([A-Za-z0-9_.-]+?)\s*\}\}")
_GIB = Decimal(2) ** 30
WHOLE = -1  # a candidate that is a step as a whole, not one copy of its fan-out

Node = tuple[str, ...]  # a step's path of names from the workflow (or exit hook) down

# --------------------------------------------------------------------------- the graph


@dataclass
class _Leaf:
    """A leaf step with its text and the text of its static map items."""

    path: Node
    step: ir.Step
    text: str  # lower-case text shared by every copy
    items: tuple[str, ...] = ()  # lower-case text of each copy's own map item
    hook: ir.RunStatus | None = None


@dataclass
class _Graph:
    wf: ir.Workflow
    leaves: list[_Leaf] = field(default_factory=list)
    nodes: dict[Node, ir.Step] = field(default_factory=dict)  # every step, leaf or not
    scope_of: dict[Node, dict[str, ir.Step]] = field(default_factory=dict)
    succ: dict[Node, set[Node]] = field(default_factory=dict)  # entry/exit nodes
    _reach: dict[Node, frozenset[Node]] = field(default_factory=dict)

    def edge(self, a: Node, b: Node) -> None:
        self.succ.setdefault(a, set()).add(b)
        self.succ.setdefault(b, set())

    def reach(self, start: Node) -> frozenset[Node]:
        """Every node reachable from ``start`` by one or more edges."""
        got = self._reach.get(start)
        if got is None:
            seen: set[Node] = set()
            todo = list(self.succ.get(start, ()))
            while todo:
                n = todo.pop()
                if n not in seen:
                    seen.add(n)
                    todo.extend(self.succ.get(n, ()))
            got = self._reach[start] = frozenset(seen)
        return got

    def before(self, a: _Leaf, b: _Leaf) -> bool:
        """Whether leaf ``a`` is a (transitive) ancestor of leaf ``b``."""
        return _entry(b.path) in self.reach(_exit(a.path))

    def related(self, a: _Leaf, b: _Leaf) -> bool:
        return self.before(a, b) or self.before(b, a)


def _entry(path: Node) -> Node:
    return (*path, "<entry>")


def _exit(path: Node) -> Node:
    return (*path, "<exit>")


def _build(wf: ir.Workflow) -> _Graph:
    g = _Graph(wf)
    main_leaves = _add_scope(g, (), wf.steps, hook=None)
    hook_mark: Node = ("<hooks>",)
    for leaf in main_leaves:
        g.edge(_exit(leaf), hook_mark)
    for i, hook in enumerate(wf.exit_hooks):
        base: Node = (f"<hook {i}>",)
        _add_scope(g, base, hook.steps, hook=hook.on)
        for s in hook.steps:
            g.edge(hook_mark, _entry((*base, s.name)))
    return g


def _add_scope(g: _Graph, base: Node, steps: Sequence[ir.Step],
               hook: ir.RunStatus | None) -> list[Node]:
    """Add one scope's steps; return the paths of its leaves (nested ones included)."""
    scope = {s.name: s for s in steps}
    leaves: list[Node] = []
    for s in steps:
        path = (*base, s.name)
        g.nodes[path] = s
        g.scope_of[path] = scope
        g.edge(_entry(path), _exit(path))
        for up in sorted(_upstreams(s)):
            if up in scope and up != s.name:
                g.edge(_exit((*base, up)), _entry(path))
        body = s.body
        if isinstance(body, ir.SubWorkflowSpec) and body.steps:
            inner = _add_scope(g, path, body.steps, hook)
            for child in body.steps:
                g.edge(_entry(path), _entry((*path, child.name)))
                g.edge(_exit((*path, child.name)), _exit(path))
            leaves.extend(inner)
            continue
        items = tuple(i.lower() for i in _fan(g.wf, s, scope)[0])
        g.leaves.append(_Leaf(path, s, _text(g.wf, s), items=items, hook=hook))
        leaves.append(path)
    return leaves


def _upstreams(s: ir.Step) -> set[str]:
    """Steps ``s`` waits for: its dependencies, depends terms and the steps it reads."""
    ups = {d.step for d in s.dependencies}
    if s.depends is not None:
        ups |= {t.step for t, _ in _terms(s.depends)}
    if s.when is not None:
        ups |= _refs(s.when.condition.left, s.when.condition.right)
    if s.foreach is not None and s.foreach.source is not None:
        ups |= _refs(s.foreach.source)
    ups |= _refs(*(i.value for i in s.inputs))
    ups |= {a.source.step for a in s.input_artifacts
            if isinstance(a.source, ir.StepArtifactRef)}
    return ups


def _refs(*sources: ir.ValueSource) -> set[str]:
    return {v.step for v in sources if isinstance(v, ir.StepOutputRef)}


def _terms(expr: ir.DependsExpr, negated: bool = False) -> Iterator[tuple[ir.DependsTerm, bool]]:
    if isinstance(expr, ir.DependsTerm):
        yield expr, negated
    elif isinstance(expr, ir.DependsNot):
        yield from _terms(expr.term, not negated)
    else:
        for t in expr.terms:
            yield from _terms(t, negated)


def _fan(wf: ir.Workflow, s: ir.Step,
         scope: dict[str, ir.Step]) -> tuple[tuple[str, ...], int]:
    """A fanned-out step's item texts (static or a list parameter's default) and its count
    of items (a runtime list: 0, not known before it runs)."""
    fe = s.foreach
    if fe is None:
        return (), 1
    if fe.items:
        return tuple(_item_text(i) for i in fe.items), len(fe.items)
    if isinstance(fe.source, ir.WorkflowParamRef):
        p = wf.parameter(fe.source.name)
        if p is not None and p.default is not None and isinstance(p.default.value, list):
            items = tuple(_item_text(ir.Literal.of(v)) for v in p.default.value)
            return items, len(items)
    return (), 0


def _item_text(lit: ir.Literal) -> str:
    return lit.text


# --------------------------------------------------------------------------- step text


def _text(wf: ir.Workflow, s: ir.Step) -> str:
    """Lower-case text of a step: name, template, image, command, args and env values with
    ``{{inputs.X}}`` resolved, artifact locations, job manifest, script source."""
    parts = [s.name, s.template]
    b = s.body
    strings: list[str] = []
    if isinstance(b, (ir.ContainerSpec, ir.ScriptSpec)):
        parts.append(b.image)
        strings += [*b.command, *b.args]
    if isinstance(b, ir.ScriptSpec):
        parts.append(b.source)
    elif isinstance(b, ir.JobSpec):
        parts.append(b.manifest)
    elif isinstance(b, ir.SubWorkflowSpec):
        parts.append(b.name)
    strings += [e.value for e in s.env if e.secret is None]
    parts += [_resolve(wf, s, t) for t in strings]
    for a in s.input_artifacts:
        if isinstance(a.source, ir.ArtifactLocation):
            parts += _location(a.source)
    for o in s.output_artifacts:
        if o.location is not None:
            parts += _location(o.location)
    return "\n".join(parts).lower()


def _resolve(wf: ir.Workflow, s: ir.Step, text: str) -> str:
    def one(m: re.Match[str]) -> str:
        inp = s.input(m.group(1))
        if inp is None:
            return m.group(0)
        v = inp.value
        if isinstance(v, ir.Literal):
            return v.text
        if isinstance(v, ir.WorkflowParamRef):
            p = wf.parameter(v.name)
            if p is not None and p.default is not None:
                return p.default.text
        return m.group(0)

    return _PLACEHOLDER.sub(one, text)


def _location(loc: ir.ArtifactLocation) -> list[str]:
    out = [loc.url, loc.endpoint]
    if loc.bucket or loc.key:
        out.append(f"{loc.storage.value}://{loc.bucket}/{loc.key}")
        if loc.storage is ir.StorageKind.GCS:
            out.append(f"gs://{loc.bucket}/{loc.key}")
    return out


def _copies_mentioning(leaf: _Leaf, word: str) -> list[int]:
    """``[WHOLE]`` when the step's own text contains ``word``; otherwise the copies (item
    indices) whose map item does."""
    if word in leaf.text:
        return [WHOLE]
    return [i for i, item in enumerate(leaf.items) if word in item]


def _mentioning(g: _Graph, word: str) -> list[tuple[_Leaf, int]]:
    return [(leaf, c) for leaf in g.leaves for c in _copies_mentioning(leaf, word)]


# --------------------------------------------------------------------------- values


def seconds(value: object) -> float:
    """A duration: a number of seconds, or text such as "90", "45m", "3h", "1h30m", "2d".

    Raises:
        ValueError: if ``value`` is not a duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)([dhms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value!r} is not a duration (e.g. 90, '45m', '3h', '1h30m')")
    return sum(float(n) * units[u] for n, u in parts)


_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_FIELDS = [  # (low, high, names starting at low)
    (0, 59, []), (0, 23, []), (1, 31, []), (1, 12, _MONTHS), (0, 7, _DAYS),
]
_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def cron_fields(expr: str) -> tuple[frozenset[int], ...]:
    """The five fields of a cron expression as sets of values (Sunday is 0).

    Raises:
        ValueError: if ``expr`` is not a five-field cron expression.
    """
    text = _MACROS.get(expr.strip().lower(), expr.strip().lower())
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(f"{expr!r} is not a five-field cron expression")
    out = [_cron_field(f, *spec) for f, spec in zip(fields, _FIELDS, strict=True)]
    out[4] = frozenset(0 if d == 7 else d for d in out[4])
    return tuple(out)


def _cron_field(text: str, low: int, high: int, names: list[str]) -> frozenset[int]:
    def value(t: str) -> int:
        if t in names:
            return low + names.index(t)
        n = int(t)
        if not low <= n <= high:
            raise ValueError(f"{t} is out of range {low}-{high}")
        return n

    got: set[int] = set()
    for part in text.split(","):
        rng, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"step {step_text!r} must be positive")
        if rng in ("*", "?"):
            a, b = low, high
        elif "-" in rng:
            first, last = rng.split("-", 1)
            a, b = value(first), value(last)
        else:
            a = value(rng)
            b = high if step_text else a
        got.update(range(a, b + 1, step))
    return frozenset(got)


def _num(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def _operand(wf: ir.Workflow, v: ir.ValueSource) -> tuple[str, list[float]]:
    """Text of a condition operand and the numbers it stands for."""
    if isinstance(v, ir.Literal):
        n = _num(v.value)
        return v.text, [] if n is None else [n]
    if isinstance(v, ir.StepOutputRef):
        return f"steps.{v.step}.outputs.{v.output}", []
    if isinstance(v, ir.WorkflowParamRef):
        p = wf.parameter(v.name)
        if p is not None and p.default is not None:
            n = _num(p.default.value)
            return f"workflow.parameters.{v.name} {p.default.text}", [] if n is None else [n]
        return f"workflow.parameters.{v.name}", []
    return f"item.{v.key}" if v.key else "item", []


# --------------------------------------------------------------------------- the keys


def _effective(wf: ir.Workflow, s: ir.Step) -> tuple[ir.RetryPolicy | None, int | None,
                                                      ir.Resources | None]:
    d = wf.defaults
    return (s.retry or d.retry, s.timeout_seconds or d.timeout_seconds,
            s.resources or d.resources)


def _all_nodes(g: _Graph) -> Iterable[ir.Step]:
    return g.nodes.values()


def _words(value: object, key: str) -> list[str]:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [str(value).lower()]
    if isinstance(value, list) and value and all(
            isinstance(w, (str, int, float)) and not isinstance(w, bool) for w in value):
        return [str(w).lower() for w in value]
    raise ValueError(f"{key}: expected a word or a list of words, got {value!r}")


def _int(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}: expected an integer, got {value!r}")
    return value


def _number(value: object, key: str) -> float:
    n = _num(value)
    if n is None or isinstance(value, bool):
        raise ValueError(f"{key}: expected a number, got {value!r}")
    return n


def _k_mentions(g: _Graph, value: object) -> list[str]:
    return [f"mentions: no step mentions {w!r}" for w in _words(value, "mentions")
            if not _mentioning(g, w)]


def _k_min_steps(g: _Graph, value: object) -> list[str]:
    n = _int(value, "min_steps")
    if len(g.leaves) >= n:
        return []
    return [f"min_steps: {len(g.leaves)} steps, expected at least {n}"]


def _concurrent(g: _Graph, a: tuple[_Leaf, int], b: tuple[_Leaf, int]) -> bool:
    (la, ca), (lb, cb) = a, b
    if la.path == lb.path:  # two copies of one fan-out, unless one is the step as a whole
        fe = la.step.foreach
        return WHOLE not in (ca, cb) and ca != cb and fe is not None and fe.parallelism != 1
    return not g.related(la, lb)


def _pick(g: _Graph, cands: list[list[tuple[_Leaf, int]]],
          chosen: list[tuple[_Leaf, int]]) -> bool:
    if len(chosen) == len(cands):
        return True
    for c in cands[len(chosen)]:
        if all(_concurrent(g, c, o) for o in chosen):
            chosen.append(c)
            if _pick(g, cands, chosen):
                return True
            chosen.pop()
    return False


def _k_parallel(g: _Graph, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(grp, list) for grp in value):
        raise ValueError(f"parallel: expected a list of groups, got {value!r}")
    fails = []
    for grp in value:
        words = _words(grp, "parallel")
        cands = [_mentioning(g, w) for w in words]
        if not _pick(g, cands, []):
            fails.append(f"parallel: no concurrent steps mentioning each of {words}")
    return fails


def _k_order(g: _Graph, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2
                                              for p in value):
        raise ValueError(f"order: expected a list of [a, b] pairs, got {value!r}")
    fails = []
    for pair in value:
        a, b = _words(pair, "order")
        if not any(g.before(x, y) for x, _ in _mentioning(g, a) for y, _ in _mentioning(g, b)):
            fails.append(f"order: no step mentioning {a!r} comes before one mentioning {b!r}")
    return fails


def _max_unrelated(g: _Graph, leaves: list[_Leaf]) -> int:
    """The size of the largest set of ``leaves`` with no path between any two."""
    if len(leaves) > 16:  # too many subsets: a greedy lower bound
        best: list[_Leaf] = []
        for leaf in leaves:
            if all(not g.related(leaf, o) for o in best):
                best.append(leaf)
        return len(best)
    for size in range(len(leaves), 1, -1):
        for combo in itertools.combinations(leaves, size):
            if all(not g.related(x, y) for x, y in itertools.combinations(combo, 2)):
                return size
    return min(len(leaves), 1)


def _fanout_counts(g: _Graph) -> set[int]:
    counts: set[int] = set()
    for path, s in g.nodes.items():
        if s.foreach is None:
            continue
        items, n = _fan(g.wf, s, g.scope_of[path])
        if items or s.foreach.items:
            counts.add(n)
        elif isinstance(s.foreach.source, ir.StepOutputRef):
            producer = g.scope_of[path].get(s.foreach.source.step)
            if producer is not None:
                text = _text(g.wf, producer)
                counts.update(int(m) for m in re.findall(r"(?<![\d.])\d+(?![\d.])", text))
    by_template: dict[str, list[_Leaf]] = {}
    for leaf in g.leaves:
        if leaf.step.template:
            by_template.setdefault(leaf.step.template, []).append(leaf)
    for group in by_template.values():
        if len(group) > 1:
            counts.add(_max_unrelated(g, group))
    return counts


def _k_fanout(g: _Graph, value: object) -> list[str]:
    n = _int(value, "fanout")
    if n in _fanout_counts(g):
        return []
    return [f"fanout: no step fanned out over exactly {n} items"]


def _k_when(g: _Graph, value: object) -> list[str]:
    word = _words(value, "when")[0]
    want = _num(word)
    for s in _all_nodes(g):
        if s.when is None:
            continue
        c = s.when.condition
        (lt, ln), (rt, rn) = _operand(g.wf, c.left), _operand(g.wf, c.right)
        if word in f"{lt} {c.op.value} {rt}".lower():
            return []
        if want is not None and any(math.isclose(want, n) for n in ln + rn):
            return []
    return [f"when: no step's condition mentions {word!r}"]


def _k_retry(g: _Graph, value: object) -> list[str]:
    n = _int(value, "retry")
    for s in _all_nodes(g):
        r = _effective(g.wf, s)[0]
        if r is not None and r.limit >= n:
            return []
    return [f"retry: no step retries at least {n} times"]


def _k_cron(g: _Graph, value: object) -> list[str]:
    if not isinstance(value, str):
        raise ValueError(f"cron: expected a cron expression, got {value!r}")
    want = cron_fields(value)
    sched = g.wf.schedule
    if sched is None:
        return [f"cron: the workflow has no schedule, expected {value!r}"]
    try:
        got = cron_fields(sched.schedule)
    except ValueError:
        got = None
    if got == want:
        return []
    return [f"cron: schedule {sched.schedule!r} is not equivalent to {value!r}"]


def _k_gpu(g: _Graph, value: object) -> list[str]:
    n = _number(value, "gpu")
    for s in _all_nodes(g):
        res = _effective(g.wf, s)[2]
        if res is not None and res.gpu >= n:
            return []
    return [f"gpu: no step requests at least {value} GPUs"]


def _k_memory_gi(g: _Graph, value: object) -> list[str]:
    want = Decimal(str(_number(value, "memory_gi"))) * _GIB
    for s in _all_nodes(g):
        res = _effective(g.wf, s)[2]
        if res is None:
            continue
        for q in (res.memory_request, res.memory_limit):
            try:
                if q and ir.parse_quantity(q) >= want:
                    return []
            except ValueError:
                continue
    return [f"memory_gi: no step requests at least {value}Gi of memory"]


def _k_timeout(g: _Graph, value: object) -> list[str]:
    want = seconds(value)
    found = [g.wf.timeout_seconds] + [_effective(g.wf, s)[1] for s in _all_nodes(g)]
    if any(t is not None and math.isclose(t, want) for t in found):
        return []
    return [f"timeout: no step (nor the workflow) has a timeout of {value} ({want:g} s)"]


_SUCCESS = {ir.EdgeCondition.SUCCEEDED, ir.EdgeCondition.SUCCEEDED_ONLY,
            ir.EdgeCondition.ANY_SUCCEEDED}
_FAILURE = {ir.EdgeCondition.FAILED, ir.EdgeCondition.ERRORED, ir.EdgeCondition.ALL_FAILED}
_WHATEVER = {ir.EdgeCondition.COMPLETED, ir.EdgeCondition.ANY}
_NEGATION = {  # the outcome a negated leaf stands for
    **dict.fromkeys(_SUCCESS, ir.EdgeCondition.FAILED),
    **dict.fromkeys(_FAILURE, ir.EdgeCondition.SUCCEEDED),
    ir.EdgeCondition.COMPLETED: ir.EdgeCondition.ERRORED,
    ir.EdgeCondition.SKIPPED: ir.EdgeCondition.COMPLETED,
    ir.EdgeCondition.OMITTED: ir.EdgeCondition.COMPLETED,
}


def _edges(s: ir.Step) -> dict[str, set[ir.EdgeCondition]]:
    """Per upstream step, the outcomes that let ``s`` run (a negated leaf counts as its
    opposite: not succeeded = failed)."""
    out: dict[str, set[ir.EdgeCondition]] = {}
    if s.depends is not None:
        for term, negated in _terms(s.depends):
            cond = _NEGATION.get(term.condition) if negated else term.condition
            if cond is not None:
                out.setdefault(term.step, set()).add(cond)
    else:
        for d in s.dependencies:
            out.setdefault(d.step, set()).add(d.condition)
    return out


def _word(value: object, key: str) -> str:
    words = _words(value, key)
    if len(words) != 1:
        raise ValueError(f"{key}: expected one word, got {value!r}")
    return words[0]


def _k_on_failure(g: _Graph, value: object) -> list[str]:
    word = _word(value, "on_failure")
    for leaf, _ in _mentioning(g, word):
        if leaf.hook in (ir.RunStatus.FAILED, ir.RunStatus.ERROR, ir.RunStatus.ANY):
            return []
        if any(conds & (_FAILURE | _WHATEVER) for conds in _edges(leaf.step).values()):
            return []
    return [f"on_failure: no step mentioning {word!r} runs when the workflow fails"]


def _k_on_exit(g: _Graph, value: object) -> list[str]:
    word = _word(value, "on_exit")
    hooks: set[ir.RunStatus] = set()
    for leaf, _ in _mentioning(g, word):
        if leaf.hook is not None:
            hooks.add(leaf.hook)
        edges = _edges(leaf.step)
        if edges and all(conds & _WHATEVER or (conds & _SUCCESS and conds & _FAILURE)
                         for conds in edges.values()):
            return []
    if ir.RunStatus.ANY in hooks or (ir.RunStatus.SUCCEEDED in hooks and hooks & {
            ir.RunStatus.FAILED, ir.RunStatus.ERROR}):
        return []
    return [f"on_exit: no step mentioning {word!r} runs whatever the outcome"]


def _k_max_parallel(g: _Graph, value: object) -> list[str]:
    n = _int(value, "max_parallel")
    found = {g.wf.parallelism}
    for s in _all_nodes(g):
        found |= {s.parallelism, s.foreach.parallelism if s.foreach else None}
    if n in found:
        return []
    return [f"max_parallel: no fan-out, step or workflow limited to {n} at once"]


def _k_loop(g: _Graph, value: object) -> list[str]:
    n = _int(value, "loop")
    if any(s.loop is not None and s.loop.max_iterations <= n for s in _all_nodes(g)):
        return []
    return [f"loop: no step repeats with at most {n} iterations"]


_CHECKS = {
    "mentions": _k_mentions, "min_steps": _k_min_steps, "parallel": _k_parallel,
    "order": _k_order, "fanout": _k_fanout, "when": _k_when, "retry": _k_retry,
    "cron": _k_cron, "gpu": _k_gpu, "memory_gi": _k_memory_gi, "timeout": _k_timeout,
    "on_failure": _k_on_failure, "on_exit": _k_on_exit, "max_parallel": _k_max_parallel,
    "loop": _k_loop,
}
KEYS = frozenset(_CHECKS)


def check(wf: ir.Workflow, expect: dict[str, object]) -> list[str]:
    """The failed expectations of ``expect`` on ``wf``; empty when every one holds.

    Unknown keys and malformed values are failures too, never passes.
    """
    g = _build(wf)
    fails: list[str] = []
    for key, value in expect.items():
        fn = _CHECKS.get(key)
        if fn is None:
            fails.append(f"{key}: unknown expectation key")
            continue
        try:
            fails += fn(g, value)
        except ValueError as e:
            fails.append(f"{key}: bad expectation: {e}")
    return fails
