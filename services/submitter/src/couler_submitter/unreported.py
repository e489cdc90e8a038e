"""What the run record says of the steps an engine never reported, once the run has ended.

An engine reports the steps it ran or decided on; a step it never got to may leave no
trace in its status at all: an exit hook of a run Argo terminated (``argo terminate``
runs no exit handler), a hook or a task KFP never reached, the rest of a DAG that Argo's
fail-fast never scheduled, the hooks of a dry run. Without a record such a step would
look pending forever, in ``Get``/``Watch`` and on the monitor's dashboard.

So when a run ends (SUCCEEDED, FAILED or CANCELLED), every top-level step and exit-hook
step of its workflow that the engine never reported is given a terminal record, the same
on every engine:

==============================  ===========  ==================================================
step                            state        message
==============================  ===========  ==================================================
exit-hook step                  SKIPPED      ``exit hook on <on> did not fire: the run <state>``
                                             (``...: the run was cancelled``), the local
                                             engine's and the Ray executor's words
                                             (:func:`couler_runtime.local.engine.hook_not_fired`)
other step, run cancelled       CANCELLED    ``not run by <engine>: the run was cancelled`` (as
                                             the local engine records a step a cancel kept
                                             from starting)
other step, run ended otherwise SKIPPED      ``not run by <engine>: the run <state>``
==============================  ===========  ==================================================

What an engine did report is never replaced, whatever its state: Argo reports a hook
whose ``workflow.status`` guard was false as a Skipped node ("when 'Succeeded == Failed'
evaluated false"), Tekton lists it in ``skippedTasks``, and those records stand as the
engine gave them. A step counts as reported when the engine reported it under its own
name or, for an inline sub-workflow, reported one of its inner steps under the name the
engine gives it (``outer/inner`` locally, ``outer-inner`` on Tekton, ``outer.inner`` on
Airflow): such a group ran, even when its own name never appears. The store adds a
further guard: these records are written only for steps with no record at all
(:meth:`couler_submitter.store.RunStore.put_steps`, ``unreported``), so a record from
before a restart is never overwritten either.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from couler import ir
from couler.engines.base import StepState
from couler_runtime.local.engine import hook_not_fired
from couler_runtime.rpc.records import RunState, StepRecord

__all__ = ["unreported_steps"]

# How engines name the inner steps of an inline sub-workflow: local, Tekton, Airflow.
_INNER_SEPARATORS = ("/", "-", ".")


def _names(step: ir.Step, sep: str) -> Iterator[str]:
    """``step``'s name and, for an inline sub-workflow, its inner steps' names joined
    with ``sep`` (at every level)."""
    yield step.name
    body = step.body
    if isinstance(body, ir.SubWorkflowSpec):
        for inner in body.steps:
            for name in _names(inner, sep):
                yield f"{step.name}{sep}{name}"


def _reported(step: ir.Step, reported: Collection[str]) -> bool:
    if step.name in reported:
        return True
    body = step.body
    if not (isinstance(body, ir.SubWorkflowSpec) and body.steps):
        return False
    return any(name in reported for sep in _INNER_SEPARATORS for name in _names(step, sep))


def unreported_steps(wf: ir.Workflow, reported: Collection[str], *, engine: str,
                     state: RunState, at: float) -> list[StepRecord]:
    """The records of ``wf``'s steps that are not in ``reported`` (see the module docstring).

    Args:
        wf: The workflow the run ran (its top-level and exit-hook steps are considered).
        reported: The names of the steps the engine reported, under any key.
        engine: The run's engine, named in the messages.
        state: How the run ended; nothing is recorded for a run that has not ended.
        at: When it ended (the records' ``finished_at``).
    """
    if not state.terminal:
        return []
    why = "the run was cancelled" if state is RunState.CANCELLED else f"the run {state.value}"
    main_state = StepState.CANCELLED if state is RunState.CANCELLED else StepState.SKIPPED
    out = [StepRecord(name=step.name, state=main_state, finished_at=at,
                      message=f"not run by {engine}: {why}")
           for step in wf.steps if not _reported(step, reported)]
    for hook in wf.exit_hooks:
        out.extend(StepRecord(name=step.name, state=StepState.SKIPPED, finished_at=at,
                              message=hook_not_fired(hook, why))
                   for step in hook.steps if not _reported(step, reported))
    return out
