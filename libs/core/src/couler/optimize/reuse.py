"""Cached steps taken out of a workflow before it is compiled for a remote engine.

The local engine restores a cached step's outputs and artifacts itself and reports it
``cached``. A remote engine (Argo, Tekton, Airflow, KFP, Ray) runs the document it is
given, so the optimizer rewrites the workflow instead (:func:`substitute_cached`): a
cached step is removed, and what its readers took from it is written in --

* an output parameter becomes a literal (typed as the output was declared);
* an output artifact becomes a reference to its blob in the artifact store
  (:class:`ArtifactStore`: an S3 location the engine's pods read, credentials by secret
  reference), so an engine with S3 input artifacts (Argo) fetches it;
* a map over one of its outputs fans out over the recorded list;
* an edge to it is dropped: it succeeded.

A step that no remaining step needs (:func:`~couler.optimize.cache_key.unneeded_steps`)
is removed with it. A cached step stays in the workflow (and runs again) when a step
looks at it in a way a value cannot stand for: an edge waiting for it to fail or be
skipped, a ``depends`` expression naming it, or an artifact it passes with no artifact
store the engine can read. Pure: IR in, IR and notes out.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from couler import ir
from couler.optimize.cache_key import (
    depends_names,
    producers,
    unneeded_steps,
    upstream_names,
)

__all__ = ["ArtifactStore", "Substituted", "substitute_cached"]

# Edges a cached step (it succeeded) satisfies; any other waits for a state it never has.
_SATISFIED = frozenset({
    ir.EdgeCondition.SUCCEEDED, ir.EdgeCondition.SUCCEEDED_ONLY,
    ir.EdgeCondition.COMPLETED, ir.EdgeCondition.ANY_SUCCEEDED,
})


@dataclass(frozen=True, slots=True)
class ArtifactStore:
    """The artifact store's S3 bucket as a remote engine's pods reach it.

    A blob's object is ``<prefix>/sha256/<hex>`` (:mod:`couler_runtime.blobs`); a
    directory artifact's blob is the tar archive the engine handed over.
    """

    endpoint: str
    bucket: str
    prefix: str = ""
    insecure: bool = False
    access_key: ir.SecretRef | None = None
    secret_key: ir.SecretRef | None = None

    def location(self, digest: str) -> ir.ArtifactLocation:
        """Where the blob of ``digest`` (``sha256:<hex>`` or ``<hex>``) is."""
        hex_digest = digest.removeprefix("sha256:")
        key = f"sha256/{hex_digest}"
        return ir.ArtifactLocation(
            storage=ir.StorageKind.S3, endpoint=self.endpoint, bucket=self.bucket,
            key=f"{self.prefix.strip('/')}/{key}" if self.prefix.strip("/") else key,
            insecure=self.insecure, access_key=self.access_key, secret_key=self.secret_key)


@dataclass(frozen=True, slots=True)
class Substituted:
    """The rewritten workflow and what was taken out of it."""

    workflow: ir.Workflow
    cached: tuple[str, ...]  # cached steps removed (their results written in)
    unneeded: tuple[str, ...]  # steps removed because nothing left needs them
    notes: tuple[str, ...]


def substitute_cached(wf: ir.Workflow, outputs: Mapping[str, Mapping[str, str]],
                      artifacts: Mapping[str, Mapping[str, str]],
                      store: ArtifactStore | None) -> Substituted:
    """Take the cached top-level steps out of ``wf`` (see the module docstring).

    Args:
        outputs: The cached steps' output parameters (text), by step name.
        artifacts: The cached steps' output artifacts (content digests), by step name.
        store: The artifact store the engine reads, or None when it reads none.
    """
    by_name = {s.name: s for s in wf.steps}
    hook_steps = [s for hook in wf.exit_hooks for s in ir.all_steps(hook.steps)]
    readers: dict[str, list[ir.Step]] = {}  # one pass: linear in the steps and edges
    for step in (*wf.steps, *hook_steps):
        for ref in _references(step) - {step.name}:
            readers.setdefault(ref, []).append(step)
    notes: list[str] = []
    removable: set[str] = set()
    for name in outputs:
        if name not in by_name:
            continue
        why = _kept_because(name, readers.get(name, ()), outputs[name],
                            artifacts.get(name, {}), store)
        if why:
            notes.append(f"step {name!r}: cached but run again: {why}")
        else:
            removable.add(name)
    if not removable:
        return Substituted(wf, (), (), tuple(notes))
    unneeded = unneeded_steps(wf, removable) - removable
    gone = removable | unneeded
    if gone >= by_name.keys():
        notes.append("every step is cached: nothing is left for the engine to run")
    values = {n: outputs[n] for n in removable}
    blobs = {n: artifacts.get(n, {}) for n in removable}

    def rewrite(step: ir.Step) -> ir.Step:
        return _rewrite(step, gone, values, blobs=blobs, store=store, by_name=by_name)

    steps = tuple(rewrite(s) for s in wf.steps if s.name not in gone)
    hooks = tuple(dataclasses.replace(h, steps=tuple(rewrite(s) for s in h.steps))
                  for h in wf.exit_hooks)
    new = dataclasses.replace(wf, steps=steps, exit_hooks=hooks)
    return Substituted(new, tuple(sorted(removable)), tuple(sorted(unneeded)), tuple(notes))


def _references(step: ir.Step) -> set[str]:
    """The steps ``step`` waits for, reads from or fans out over."""
    src = step.foreach.source if step.foreach is not None else None
    fans = {src.step} if isinstance(src, ir.StepOutputRef) else set()
    return upstream_names(step) | producers(step) | fans


def _kept_because(name: str, readers: Sequence[ir.Step], values: Mapping[str, str],
                  digests: Mapping[str, str], store: ArtifactStore | None) -> str:
    """Why the cached step ``name`` must stay in the workflow ("": it need not), from the
    steps that refer to it."""
    for step in readers:
        src = step.foreach.source if step.foreach is not None else None
        if isinstance(src, ir.StepOutputRef) and src.step == name and \
                _items(values.get(src.output)) is None:
            return (f"step {step.name!r} fans out over its output {src.output!r}, which is "
                    "not a JSON list")
        for dep in step.dependencies:
            if dep.step == name and dep.condition not in _SATISFIED:
                return (f"step {step.name!r} waits for it to be {dep.condition.value}, which "
                        "a reused result never is")
        if name in depends_names(step):
            return f"step {step.name!r} names it in a depends expression"
        for art in step.input_artifacts:
            ref = art.source
            if isinstance(ref, ir.StepArtifactRef) and ref.step == name:
                if store is None:
                    return (f"step {step.name!r} reads its artifact {ref.artifact!r} and the "
                            "engine reads no artifact store (Argo reads one in S3: "
                            "COULER_ARTIFACTS=s3://...)")
                if not digests.get(ref.artifact):
                    return f"its cached artifact {ref.artifact!r} has no digest"
    return ""


def _items(text: str | None) -> tuple[ir.Literal, ...] | None:
    """A cached output a map fans out over, as the map's literal items (None: not a list)."""
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return tuple(ir.Literal.of(v) for v in value) if isinstance(value, list) else None


def _value(text: str, declared: ir.ValueType) -> ir.Literal:
    """A cached output's text as a literal of the type it was declared with."""
    if declared is not ir.ValueType.STRING:
        try:
            return ir.Literal.of(json.loads(text))
        except ValueError:
            pass
    return ir.Literal.of(text)


def _source(src: ir.ValueSource, values: Mapping[str, Mapping[str, str]],
            by_name: Mapping[str, ir.Step]) -> ir.ValueSource:
    if isinstance(src, ir.StepOutputRef) and src.step in values:
        text = values[src.step].get(src.output)
        if text is not None:
            declared = next((o.type for o in by_name[src.step].outputs
                             if o.name == src.output), ir.ValueType.STRING)
            return _value(text, declared)
    return src


def _rewrite(step: ir.Step, gone: set[str], values: Mapping[str, Mapping[str, str]], *,
             blobs: Mapping[str, Mapping[str, str]], store: ArtifactStore | None,
             by_name: Mapping[str, ir.Step]) -> ir.Step:
    if not _references(step) & gone:
        return step
    inputs = tuple(dataclasses.replace(i, value=_source(i.value, values, by_name))
                   for i in step.inputs)
    arts = []
    for art in step.input_artifacts:
        ref = art.source
        if isinstance(ref, ir.StepArtifactRef) and ref.step in blobs and store is not None:
            ref = store.location(blobs[ref.step][ref.artifact])
        arts.append(dataclasses.replace(art, source=ref))
    when = step.when
    if when is not None:
        when = dataclasses.replace(when, condition=_condition(when.condition, values, by_name))
    loop = step.loop
    if loop is not None:
        loop = dataclasses.replace(loop, condition=_condition(loop.condition, values, by_name))
    foreach = step.foreach
    src = foreach.source if foreach is not None else None
    if foreach is not None and isinstance(src, ir.StepOutputRef) and src.step in values:
        items = _items(values[src.step].get(src.output))
        assert items is not None  # _kept_because kept the step otherwise
        foreach = dataclasses.replace(foreach, items=items, source=None)
    deps = tuple(d for d in step.dependencies if d.step not in gone)
    return dataclasses.replace(step, inputs=inputs, input_artifacts=tuple(arts), when=when,
                               loop=loop, foreach=foreach, dependencies=deps)


def _condition(cond: ir.Condition, values: Mapping[str, Mapping[str, str]],
               by_name: Mapping[str, ir.Step]) -> ir.Condition:
    return dataclasses.replace(cond, left=_source(cond.left, values, by_name),
                               right=_source(cond.right, values, by_name))
