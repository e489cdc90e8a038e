"""Content-addressed cache keys for steps (ARCHITECTURE §4, "Cache").

A step's key is the SHA-256 of everything that determines its outputs: the body
(image as written — tag or digest —, command, args, working directory, script
source and interpreter), the environment (literal values; secrets by reference,
never by value), the resolved input parameter values, the digests of its input
artifacts, the outputs it declares, and the cache salt. Resources, retries,
timeouts and the step's name do not change what a step computes, so they are not
part of the key: two workflows that run the same command on the same inputs share
the entry.

A step whose key cannot be computed completely gets no key (``None``) — never a
partial key: an input that is not known yet, an input artifact without a digest,
a map or loop step, a step that mounts a volume, a job (it acts on a cluster), a daemon,
a sub-workflow, or caching turned off.

Caching is on by default (Couler reuses results automatically, like the paper's
system); a step opts out with ``cache=False`` (``CachePolicy(enabled=False)``),
or a whole workflow through ``defaults.cache``. A user-written key (Argo memoize
compatibility, ``CachePolicy.key``) replaces the content part of the key, salted
the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from couler import ir

__all__ = ["KEY_VERSION", "cache_policy", "not_cacheable_reason", "step_cache_key"]

KEY_VERSION = "couler-cache-v1"


def cache_policy(wf: ir.Workflow, step: ir.Step) -> ir.CachePolicy:
    """The cache policy in force for ``step``: its own, the workflow default, or the default."""
    if step.cache is not None:
        return step.cache
    if wf.defaults.cache is not None:
        return wf.defaults.cache
    return ir.CachePolicy()


def not_cacheable_reason(wf: ir.Workflow, step: ir.Step) -> str | None:
    """Why ``step`` can never have a key, or None when it can (given known inputs)."""
    if not cache_policy(wf, step).enabled:
        return "caching is turned off for this step"
    if isinstance(step.body, ir.JobSpec):
        return "a job acts on a cluster; its effect is not an output"
    if isinstance(step.body, ir.SubWorkflowSpec):
        return "sub-workflows are cached step by step, not as a whole"
    if step.daemon:
        return "a daemon step has no result to reuse"
    if step.foreach is not None:
        return "map steps are not cached as a whole yet"
    if step.loop is not None:
        return "loop steps are not cached as a whole yet"
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


def step_cache_key(wf: ir.Workflow, step: ir.Step, inputs: Mapping[str, str],
                   artifact_digests: Mapping[str, str] | None = None) -> str | None:
    """The cache key of ``step`` run with ``inputs`` (input name → resolved text).

    ``artifact_digests`` maps input artifact names to their content digests. Returns
    None when the key cannot be computed completely (see the module docstring).
    """
    if not_cacheable_reason(wf, step) is not None:
        return None
    digests = artifact_digests or {}
    values: list[list[str]] = []
    for param in step.inputs:
        if param.name not in inputs:
            return None
        values.append([param.name, inputs[param.name]])
    artifacts: list[list[str]] = []
    for art in step.input_artifacts:
        digest = digests.get(art.name, "")
        if not digest:
            return None
        artifacts.append([art.name, art.path, digest])
    policy = cache_policy(wf, step)
    material: dict[str, object]
    if policy.key:
        material = {"user_key": policy.key}
    else:
        material = {
            "body_kind": type(step.body).__name__,
            "body": json.loads(ir.to_json(step.body)),
            "env": _env(step),
            "inputs": sorted(values),
            "input_artifacts": sorted(artifacts),
            "outputs": sorted([o.name, o.source.value, o.selector, o.type.value]
                              for o in step.outputs),
            "output_artifacts": sorted([a.name, a.path] for a in step.output_artifacts),
        }
    material["version"] = KEY_VERSION
    material["salt"] = policy.salt
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
