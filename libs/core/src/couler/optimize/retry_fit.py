"""Fit the retry policies the optimizer gave to what the target engine can express.

The optimizer's default policy (and a retry limit or back-off learned by the monitor)
retries by failure class -- transient, infrastructure, out of memory, never a user error --
with back-off and memory escalation. Argo, the local engine and Ray express all of it;
Tekton, KFP and Airflow retry every failure alike, some without back-off or per-attempt
memory. A policy the *program* wrote is left alone (the engine's capability check names
what it cannot do); a policy the optimizer supplied is fitted, so a plan never fails for a
choice the user did not make:

* back-off or memory escalation the engine lacks is dropped (a retry still happens, at once
  or with the same memory);
* where the engine cannot tell failure classes apart, a step keeps retries only if the
  monitor saw it fail transiently (a learned limit above 0): then every failure is retried,
  up to that limit, as the engine can; otherwise it gets none -- retrying every failure
  would retry deterministic user errors, which the default never does.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from couler import ir
from couler.engines.base import Capability, Feature, Support

__all__ = ["fit_retries"]


def _can(capabilities: Mapping[Feature, Capability], feature: Feature) -> bool:
    cap = capabilities.get(feature)
    return cap is not None and cap.support is not Support.UNSUPPORTED


def fit_retries(wf: ir.Workflow, engine: str, capabilities: Mapping[Feature, Capability], *,
                written: Collection[str], flaky: Collection[str]
                ) -> tuple[ir.Workflow, list[str]]:
    """``wf`` with the optimizer's retry policies fitted to ``capabilities``, and notes.

    Args:
        wf: The workflow after the right-size and default-retry passes.
        engine: The engine's name (for the notes).
        capabilities: The engine's capability matrix.
        written: The top-level steps whose policy the program wrote (left alone).
        flaky: The steps the monitor saw fail transiently (a learned limit above 0).
    """
    if wf.defaults.retry is not None:  # the program's policy for every step
        return wf, []
    backoff = _can(capabilities, Feature.RETRY_BACKOFF)
    memory = _can(capabilities, Feature.MEMORY_ESCALATION)
    classes = _can(capabilities, Feature.RETRY_FAILURE_CLASSES)
    if backoff and memory and classes:  # the engine expresses every policy we give
        return wf, []
    dropped_backoff: list[str] = []
    dropped_memory: list[str] = []
    every: list[str] = []
    none: list[str] = []
    steps = []
    for step in wf.steps:
        policy = step.retry
        if policy is None or step.name in written:
            steps.append(step)
            continue
        if set(policy.on) != {ir.FailureClass.ANY} and not classes:
            if step.name in flaky and policy.limit > 0:
                policy = dataclasses.replace(policy, on=(ir.FailureClass.ANY,))
                every.append(step.name)
            else:
                none.append(step.name)
                steps.append(dataclasses.replace(step, retry=None))
                continue
        if policy.backoff is not None and not backoff:
            policy = dataclasses.replace(policy, backoff=None)
            dropped_backoff.append(step.name)
        if policy.memory_factor is not None and not memory:
            policy = dataclasses.replace(policy, memory_factor=None, memory_ceiling="")
            dropped_memory.append(step.name)
        steps.append(step if policy is step.retry else dataclasses.replace(step, retry=policy))
    notes = []
    if none:
        notes.append(f"{engine} retries every failure alike (it cannot tell a user error "
                     "from a transient one): no default retries on " + ", ".join(none)
                     + " (write a retry policy on=ANY to retry every failure there)")
    if every:
        notes.append(f"{engine} cannot select failures by class: every failure is retried "
                     "on " + ", ".join(every) + ", which failed transiently before")
    if dropped_backoff:
        notes.append(f"{engine} has no retry back-off: retried at once on "
                     + ", ".join(dropped_backoff))
    if dropped_memory:
        notes.append(f"{engine} cannot raise memory per attempt: retried with the same "
                     "memory on " + ", ".join(dropped_memory))
    return dataclasses.replace(wf, steps=tuple(steps)), notes
