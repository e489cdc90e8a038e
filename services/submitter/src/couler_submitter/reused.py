"""Cached steps of a remote engine's run: reported here, committed under the plan's keys.

For an engine other than the local one the optimizer takes cached steps out of the
workflow (:mod:`couler.optimize.reuse`), so the engine never reports them:
:func:`taken_out` gives their records (``cached`` with their outputs, or ``skipped``
for a step nothing left needs), which the submitter reports when it starts the run. When
nothing is left to run, :class:`AllReused` stands for the run the engine was not asked
for. A remote engine computes no cache keys; :func:`keyed_by_plan` gives its finished
steps the keys the optimizer computed before the run (keys by lineage), so their results
are committed to the cache like the local engine's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from couler import ir
from couler.engines.base import RunState, RunStatus, StepState, StepStatus
from couler.optimize.cache_key import producers
from couler_runtime.rpc.records import Plan

__all__ = ["AllReused", "keyed_by_plan", "taken_out"]

UNNEEDED = "not run: not needed, every step that reads its results was reused from the cache"


def taken_out(plan: Plan) -> list[StepStatus]:
    """The records of the steps the plan took out of its workflow (none for the local
    engine, which keeps and restores cached steps itself)."""
    kept = {s.name for s in plan.workflow.steps} if not plan.nothing_to_run else set()
    now = time.time()
    out = [StepStatus(step=name, state=StepState.CACHED, started_at=now, finished_at=now,
                      outputs=dict(entry.outputs), cache_key=entry.key,
                      message=f"reused cached result {entry.key[:12]}")
           for name, entry in sorted(plan.cached.items())
           if name not in kept and "[" not in name]  # "step[N]": a map item, the engine's
    out += [StepStatus(step=name, state=StepState.SKIPPED, started_at=now, finished_at=now,
                       message=UNNEEDED) for name in plan.unneeded]
    return out


def keyed_by_plan(status: StepStatus, step: ir.Step | None, keys: Mapping[str, str]
                  ) -> StepStatus:
    """``status`` of a succeeded top-level ``step`` with the plan's key and lineage (the
    keys of the steps it reads from); others unchanged.

    The plan's key is the one the next plan looks up. An engine may compute none (a remote
    engine) or another: a chunk of a split plan reads its upstream chunks' outputs as
    parameters, which a key by lineage does not see as outputs.
    """
    key = keys.get(status.step, "")
    if not key or status.key or status.state is not StepState.SUCCEEDED:
        return status
    lineage = () if step is None else tuple(sorted(
        {keys[p] for p in producers(step) if p in keys}))
    return dataclasses.replace(status, cache_key=key, cache_lineage=lineage)


class AllReused:
    """The run of a plan with nothing left to run: ended, succeeded, with its cached and
    unneeded steps' records."""

    def __init__(self, run_id: str, workflow: str, steps: Sequence[StepStatus]) -> None:
        now = time.time()
        self._status = RunStatus(run_id, workflow, RunState.SUCCEEDED, tuple(steps), now, now,
                                 "every step was reused from the cache")

    def wait(self) -> RunStatus:
        return self._status

    def cancel(self) -> None:
        """Nothing runs: nothing to stop."""

    def artifact_path(self, step: str, artifact: str) -> Path | None:
        return None
