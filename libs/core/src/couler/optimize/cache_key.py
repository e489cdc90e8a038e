"""Cache keys for steps by lineage (ARCHITECTURE §4, "Cache").

A step's key is the SHA-256 of everything that determines its outputs: its own spec --
the body (image as written -- tag or digest --, command, args, working directory, script
source and interpreter), the environment (literal values; secrets by reference, never by
value), the resolved values of its literal and workflow-parameter inputs, the outputs it
declares, the cache salt -- and, for every input it reads from another step, **that
producer's key** and the output's name (its lineage), not the bytes. So every step's key
is known before anything runs (:func:`workflow_keys`): a step can be found in the cache
although its inputs' bytes were evicted, and a cached descendant makes its ancestors
unnecessary (:func:`unneeded_steps`). Declared external inputs (an input artifact read
from S3, HTTP, git, ...) enter the key by their content digest, taken when the step runs,
so such a step and its descendants are keyed at run time only. Resources, retries,
timeouts and the step's name do not change what a step computes, so they are not part of
the key: two workflows that run the same command on the same inputs share the entry.

Keys by lineage assume what Argo's memoization and KFP's caching assume: a step's outputs
are a function of its key. A step that is not (it samples, reads the clock or a service)
opts out with ``cache=False``, or bumps its ``salt`` to force a fresh entry.

A step whose key cannot be computed completely gets no key (``None``) -- never a partial
key: an input that is not known yet, a producer without a key, an external input artifact
without a digest, a map or loop step, a step that mounts a volume, a job (it acts on a
cluster), a daemon, a sub-workflow, or caching turned off.

Caching is on by default (Couler reuses results automatically, like the paper's system);
a step opts out with ``cache=False`` (``CachePolicy(enabled=False)``), or a whole workflow
through ``defaults.cache``. A user-written key (Argo memoize compatibility,
``CachePolicy.key``) replaces the content part of the key, salted the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator, Mapping, Sequence

from couler import ir

__all__ = [
    "KEY_VERSION",
    "cache_policy",
    "depends_names",
    "item_cache_key",
    "iteration_cache_key",
    "map_items",
    "not_cacheable_part_reason",
    "not_cacheable_reason",
    "producers",
    "step_cache_key",
    "unneeded_steps",
    "upstream_names",
    "workflow_keys",
]

KEY_VERSION = "couler-cache-v2"  # v2: keys by lineage


def cache_policy(wf: ir.Workflow, step: ir.Step) -> ir.CachePolicy:
    """The cache policy in force for ``step``: its own, the workflow default, or the default."""
    if step.cache is not None:
        return step.cache
    if wf.defaults.cache is not None:
        return wf.defaults.cache
    return ir.CachePolicy()


def not_cacheable_reason(wf: ir.Workflow, step: ir.Step) -> str | None:
    """Why ``step`` can never have a key, or None when it can (given known inputs)."""
    reason = not_cacheable_part_reason(wf, step)
    if reason is not None:
        return reason
    if step.foreach is not None:
        return "map steps are not cached as a whole (each item is, by its value)"
    if step.loop is not None:
        return "loop steps are not cached as a whole (each iteration is)"
    if step.tune is not None:
        return "tune steps are not cached as a whole (each trial is, by its parameters)"
    return None


def not_cacheable_part_reason(wf: ir.Workflow, step: ir.Step) -> str | None:
    """Why ``step`` -- or, for a map or loop step, each of its items or iterations -- can
    never have a key."""
    if not cache_policy(wf, step).enabled:
        return "caching is turned off for this step"
    if isinstance(step.body, ir.JobSpec):
        return "a job acts on a cluster; its effect is not an output"
    if isinstance(step.body, ir.SubWorkflowSpec):
        return "sub-workflows are cached step by step, not as a whole"
    if step.daemon:
        return "a daemon step has no result to reuse"
    if step.volume_mounts:
        return "it mounts a volume, whose content is not part of the key"
    return None


def _env(step: ir.Step) -> list[list[str]]:
    out = []
    for e in step.env:
        if e.secret is not None:
            out.append([e.name, "secret", e.secret.name, e.secret.key])
        else:
            out.append([e.name, "value", e.value])
    return sorted(out)


def producers(step: ir.Step) -> set[str]:
    """The steps ``step`` reads outputs or artifacts from (its data lineage)."""
    names = {i.value.step for i in step.inputs if isinstance(i.value, ir.StepOutputRef)}
    names |= {a.source.step for a in step.input_artifacts
              if isinstance(a.source, ir.StepArtifactRef)}
    names.discard(step.name)
    return names


def step_cache_key(wf: ir.Workflow, step: ir.Step, *, params: Mapping[str, str],
                   producer_keys: Mapping[str, str],
                   external_digests: Mapping[str, str] | None = None) -> str | None:
    """The cache key of ``step`` (see the module docstring).

    Args:
        params: The run's workflow parameter values (defaults filled in).
        producer_keys: The keys of the steps it reads from, by step name.
        external_digests: Content digests of its external input artifacts, by input name
            (known when the step runs).

    Returns None when the key cannot be computed completely.
    """
    if not_cacheable_reason(wf, step) is not None:
        return None
    material = _material(wf, step, params, producer_keys, external_digests, item=False)
    return None if material is None else _hash(material)


def item_cache_key(wf: ir.Workflow, step: ir.Step, item: object, *,
                   params: Mapping[str, str], producer_keys: Mapping[str, str],
                   external_digests: Mapping[str, str] | None = None) -> str | None:
    """The cache key of one item of map step ``step`` (see the module docstring): the
    step's key as a plain step's, its inputs that read the item (whole or one field)
    standing for the item's value, which is part of the key as canonical JSON -- the
    item's position is not. None when ``step`` is not a map step or the key cannot be
    computed completely (arguments as for :func:`step_cache_key`). A trial of a tune step
    is keyed the same way, its parameters (a JSON object) being its item."""
    if (step.foreach is None and step.tune is None) or \
            not_cacheable_part_reason(wf, step) is not None:
        return None
    material = _material(wf, step, params, producer_keys, external_digests, item=True)
    if material is None:
        return None
    material["item"] = _canonical(item)
    return _hash(material)


def iteration_cache_key(wf: ir.Workflow, step: ir.Step, iteration: int, previous: str, *,
                        params: Mapping[str, str], producer_keys: Mapping[str, str],
                        external_digests: Mapping[str, str] | None = None) -> str | None:
    """The cache key of iteration ``iteration`` (from 0) of loop step ``step``: the step's
    key as a plain step's, the iteration's number and ``previous``, the key of the
    iteration before it ("" for the first). None when ``step`` is not a loop step, a later
    iteration has no previous key, or the key cannot be computed completely."""
    if step.loop is None or not_cacheable_part_reason(wf, step) is not None:
        return None
    if iteration < 0 or (iteration > 0 and not previous):
        return None
    material = _material(wf, step, params, producer_keys, external_digests, item=False)
    if material is None:
        return None
    material["iteration"] = iteration
    material["previous"] = previous if iteration > 0 else ""
    return _hash(material)


def map_items(wf: ir.Workflow, step: ir.Step, params: Mapping[str, str],
              outputs: Mapping[str, Mapping[str, str]] | None = None) -> list[object] | None:
    """The items of map step ``step`` when they are known before the run, else None:
    literal items, a workflow parameter's JSON list (``params``: the run's values), or a
    producer's output that is known already (``outputs``: recorded outputs by step name,
    e.g. of reused steps). Items of a step that runs are known only when it has run."""
    spec = step.foreach
    if spec is None:
        return None
    if spec.source is None:
        return [lit.value for lit in spec.items]
    text: str | None = None
    if isinstance(spec.source, ir.WorkflowParamRef):
        text = params.get(spec.source.name)
    elif isinstance(spec.source, ir.StepOutputRef):
        text = (outputs or {}).get(spec.source.step, {}).get(spec.source.output)
    if text is None:
        return None
    try:
        items = json.loads(text)
    except ValueError:
        return None
    return items if isinstance(items, list) else None


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _hash(material: Mapping[str, object]) -> str:
    return hashlib.sha256(_canonical(material).encode()).hexdigest()


def _material(wf: ir.Workflow, step: ir.Step, params: Mapping[str, str],
              producer_keys: Mapping[str, str], external_digests: Mapping[str, str] | None,
              *, item: bool) -> dict[str, object] | None:
    """What a key hashes (see :func:`step_cache_key`); ``item``: an input may read the map
    item (the caller adds the item's value). None when something is not known."""
    values: list[list[str]] = []
    for inp in step.inputs:
        src = inp.value
        if isinstance(src, ir.Literal):
            values.append([inp.name, "value", src.text])
        elif isinstance(src, ir.WorkflowParamRef) and src.name in params:
            values.append([inp.name, "value", params[src.name]])
        elif isinstance(src, ir.StepOutputRef) and producer_keys.get(src.step):
            values.append([inp.name, "output", producer_keys[src.step], src.output])
        elif isinstance(src, ir.ItemRef) and item:
            values.append([inp.name, "item", src.key])
        else:
            return None
    artifacts: list[list[str]] = []
    for art in step.input_artifacts:
        ref = art.source
        if isinstance(ref, ir.StepArtifactRef):
            if not producer_keys.get(ref.step):
                return None
            artifacts.append([art.name, art.path, "artifact", producer_keys[ref.step],
                              ref.artifact])
        else:
            digest = (external_digests or {}).get(art.name, "")
            if not digest:
                return None
            artifacts.append([art.name, art.path, "digest", digest])
    policy = cache_policy(wf, step)
    material: dict[str, object]
    if policy.key:
        material = {"user_key": policy.key}
    else:
        material = {
            "body_kind": type(step.body).__name__,
            # the canonical data itself: what a JSON round trip of its text gives back
            # (strings, numbers, lists, objects with string keys), without the round trip
            "body": ir.to_dict(step.body),
            "env": _env(step),
            "inputs": sorted(values),
            "input_artifacts": sorted(artifacts),
            "outputs": sorted([o.name, o.source.value, o.selector, o.type.value]
                              for o in step.outputs),
            "output_artifacts": sorted([a.name, a.path] for a in step.output_artifacts),
        }
    material["version"] = KEY_VERSION
    material["salt"] = policy.salt
    return material


def _ordered(steps: Sequence[ir.Step]) -> list[ir.Step]:
    """The steps in an order where every step comes after the steps it reads from or
    depends on (Kahn's algorithm; a validated workflow has no cycle -- any rest is
    appended as it stands). Linear in the steps and edges."""
    by_name = {s.name: s for s in steps}
    waiting: dict[str, int] = {}
    after: dict[str, list[str]] = {}
    for step in steps:
        ups = (upstream_names(step) | producers(step)) & by_name.keys()
        ups.discard(step.name)
        waiting[step.name] = len(ups)
        for up in ups:
            after.setdefault(up, []).append(step.name)
    ready = [s.name for s in steps if waiting[s.name] == 0]
    out: list[ir.Step] = []
    while ready:
        name = ready.pop()
        out.append(by_name[name])
        for nxt in after.get(name, ()):
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    if len(out) < len(steps):
        seen = {s.name for s in out}
        out += [s for s in steps if s.name not in seen]
    return out


def workflow_keys(wf: ir.Workflow, params: Mapping[str, str] | None = None
                  ) -> dict[str, str]:
    """The key of every top-level step whose key is known before the run, by step name.

    ``params``: the run's parameter values (defaults fill the rest). Steps with external
    input artifacts, steps that cannot be cached and their data descendants are absent.
    Linear in the steps and their inputs.
    """
    values = {p.name: p.default.text for p in wf.parameters if p.default is not None}
    values.update(params or {})
    keys: dict[str, str] = {}
    for step in _ordered(wf.steps):
        key = step_cache_key(wf, step, params=values, producer_keys=keys)
        if key is not None:
            keys[step.name] = key
    return keys


def upstream_names(step: ir.Step) -> set[str]:
    """The steps ``step`` waits for: its dependencies and the steps its depends expression
    and its ``when`` name."""
    names = {d.step for d in step.dependencies}
    names |= depends_names(step)
    if step.when is not None:
        names |= _condition_steps(step.when.condition)
    return names


def depends_names(step: ir.Step) -> set[str]:
    """The steps ``step``'s depends expression names (empty without one)."""
    return set() if step.depends is None else {t.step for t in _terms(step.depends)}


def _terms(expr: ir.DependsExpr) -> Iterator[ir.DependsTerm]:
    if isinstance(expr, ir.DependsTerm):
        yield expr
    elif isinstance(expr, ir.DependsNot):
        yield from _terms(expr.term)
    else:
        for part in expr.terms:
            yield from _terms(part)


def _condition_steps(cond: ir.Condition) -> set[str]:
    return {v.step for v in (cond.left, cond.right) if isinstance(v, ir.StepOutputRef)}


def unneeded_steps(wf: ir.Workflow, cached: Collection[str]) -> set[str]:
    """The top-level steps nothing needs because the cache holds what they lead to.

    A step is unneeded when it could be cached (its result is a function of its key), some
    step depends on it, and every step that depends on it is reused or unneeded itself,
    reads its outputs or artifacts (data it would only produce to be read), and waits for
    it by the default edge only -- not through a ``when``, a depends expression or an edge
    condition that looks at its state -- and no exit hook reads it. An unneeded step that
    is not cached is not run; one that is cached is reported reused without restoring its
    artifacts (nothing reads them) and without counting a hit. Linear in the steps and
    edges.
    """
    steps = _ordered(wf.steps)
    readers: dict[str, list[ir.Step]] = {}
    for step in steps:
        for up in upstream_names(step) | producers(step):
            if up != step.name:
                readers.setdefault(up, []).append(step)
    hooked = {name for hook in wf.exit_hooks for s in ir.all_steps(hook.steps)
              for name in upstream_names(s) | producers(s)}
    skipped = set(cached)
    unneeded: set[str] = set()
    for step in reversed(steps):
        name = step.name
        if (name in hooked or not readers.get(name)
                or not_cacheable_reason(wf, step) is not None):
            continue
        if all(r.name in skipped and _only_reads(r, name) for r in readers[name]):
            unneeded.add(name)
            skipped.add(name)
    return unneeded


def _only_reads(reader: ir.Step, name: str) -> bool:
    """Whether ``reader`` reads ``name``'s data and waits for it by the default edge only."""
    if name not in producers(reader):
        return False
    if name in depends_names(reader):
        return False
    if reader.when is not None and name in _condition_steps(reader.when.condition):
        return False
    return all(d.condition is ir.EdgeCondition.SUCCEEDED
               for d in reader.dependencies if d.step == name)
