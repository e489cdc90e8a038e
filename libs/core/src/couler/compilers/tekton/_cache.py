"""Step caching on Tekton: results memoized on a persistent volume by the step's script.

Tekton Pipelines has no result cache, so a step with a cache policy keeps its results on
a PersistentVolumeClaim that outlives the runs -- the claim named by the policy's
``name`` (``couler-cache`` when unnamed), which must exist in the namespace (ReadWriteMany
when steps of parallel runs share it). The PipelineRun binds it as the workspace
``couler-cache[-NAME]``. The step's script

* computes the entry's key: the SHA-256 of the policy's ``key`` (its ``{{inputs.X}}``
  filled in by Tekton) or, without one, of the step's definition (image, command, source,
  env, outputs, the policy's ``salt``) and the values of its inputs;
* on a hit -- ``WORKFLOW/STEP/KEY/created`` exists and is younger than ``max_age`` --
  copies the stored results to its result files, writes ``couler-cached`` = ``true`` and
  does not run the command;
* on a miss runs the command and, when it succeeded, stores its results under a
  temporary name and renames it into place (a concurrent writer of the same key loses
  nothing: both entries are equal).

Results only: a step with output artifacts or memory escalation is refused. Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from couler import ir

__all__ = ["CACHED_RESULT", "DEFAULT_CLAIM", "CachePlan", "plan_for"]

CACHED_RESULT = "couler-cached"  # "true" when the step's results were reused
DEFAULT_CLAIM = "couler-cache"


@dataclass(frozen=True, slots=True)
class CachePlan:
    """How one step uses the cache: its workspace, claim and the key's material."""

    workspace: str
    claim: str
    key_material: str  # the COULER_CACHE_KEY env value (Tekton fills in $(params.X))
    dir: str  # the entry's parent directory, under the workspace
    max_age: int | None

    def lookup(self) -> list[str]:
        """sh lines setting ``couler_hit`` (non-empty on a fresh entry) and the entry path."""
        age = ("" if self.max_age is None else
               f' && [ $(( $(date +%s) - $(cat "$couler_entry/created") )) -le {self.max_age} ]')
        return [
            'couler_key=$(printf \'%s\' "$COULER_CACHE_KEY" | sha256sum | cut -d " " -f 1)',
            f'couler_entry="{self.dir}/$couler_key"',
            f'couler_hit=; [ -f "$couler_entry/created" ]{age} && couler_hit=1',
        ]

    @staticmethod
    def restore(results: Sequence[str]) -> list[str]:
        """sh lines copying a hit's results into the step's result files."""
        lines = ['echo "couler: results reused from the cache ($couler_key)" >&2']
        lines += [f'cp "$couler_entry/{r}" "$(results.{r}.path)"' for r in results]
        lines.append(f"printf true > \"$(results.{CACHED_RESULT}.path)\"")
        return lines

    @staticmethod
    def store(results: Sequence[str]) -> list[str]:
        """sh lines saving a successful run's results as the entry (atomically renamed)."""
        tmp = '"$couler_entry.tmp.$$"'
        return [
            f"printf '' > \"$(results.{CACHED_RESULT}.path)\"",
            f'mkdir -p {tmp} && '
            + "".join(f'cp "$(results.{r}.path)" {tmp}/{r} && ' for r in results)
            + f'date +%s > {tmp}/created && rm -rf "$couler_entry" && '
            f'{{ mv {tmp} "$couler_entry" 2>/dev/null || rm -rf {tmp}; }} || '
            "echo 'couler: the cache entry was not stored' >&2",
        ]


def _digest(step: ir.Step, salt: str) -> str:
    body = step.body
    text = repr((body, tuple(e for e in step.env if e.secret is None),
                 tuple(o.name for o in step.outputs), salt))
    return hashlib.sha256(text.encode()).hexdigest()


def plan_for(step: ir.Step, workflow: str, cache: ir.CachePolicy, key: str,
             inputs: Sequence[str]) -> CachePlan:
    """The cache plan of ``step``: ``key`` is the policy's key in Tekton's syntax (""
    for none), ``inputs`` the step's param names whose values enter the key."""
    claim = cache.name or DEFAULT_CLAIM
    workspace = DEFAULT_CLAIM if claim == DEFAULT_CLAIM else f"{DEFAULT_CLAIM}-{claim}"
    if key:
        material = "key\n" + key
    else:
        material = "\n".join([_digest(step, cache.salt),
                              *(f"{n}=$(params.{n})" for n in inputs)])
    return CachePlan(workspace, claim, material,
                     f"$(workspaces.{workspace}.path)/{workflow}/{step.name}",
                     cache.max_age_seconds)
