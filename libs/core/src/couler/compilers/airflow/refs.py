"""Sub-workflow references: a step that runs another workflow by name.

The referenced workflow is its own DAG (compiled and deployed under its name, as the
Airflow adapter deploys every workflow). The step compiles to a ``_CoulerTrigger``
task, a ``TriggerDagRunOperator`` (provider ``apache-airflow-providers-standard``)
subclass written into the DAG file: it applies the step runner's gates (exit-hook
status, edges, depends, when), passes the step's inputs as the child run's ``conf``
(its params), triggers the child DAG and waits for it (``wait_for_completion``): the
step succeeds when the child run succeeds and fails when it fails. The child's
outputs cannot be read back into this run, so a reference step that declares outputs
is refused. ``dag.test()`` cannot run it (the triggered run needs a scheduler).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from couler import ir
from couler.engines.base import Feature

__all__ = ["REF_RUNTIME", "ref_kwargs"]

Fail = Callable[[str, Feature, str], Exception]


def ref_kwargs(step: ir.Step, fail: Fail) -> list[str]:
    """The keyword arguments (source text) of the step's ``_CoulerTrigger``."""
    body = step.body
    assert isinstance(body, ir.SubWorkflowSpec) and not body.steps
    if step.outputs or step.output_artifacts or step.input_artifacts:
        raise fail(step.name, Feature.SUBWORKFLOW_REF,
                   "the referenced workflow runs as its own DAG: its outputs and artifacts "
                   "cannot be read back into this run")
    for what, value in (("a map", step.foreach), ("a loop", step.loop)):
        if value is not None:
            raise fail(step.name, Feature.SUBWORKFLOW_REF,
                       f"{what} of a sub-workflow reference is not generated")
    return [f"trigger_dag_id={body.name!r}", "wait_for_completion=True", "poke_interval=5",
            "allowed_states=['success']", "failed_states=['failed']"]


# Written into DAG files with sub-workflow references, after the step runner (_RUNTIME).
REF_RUNTIME = r'''
from airflow.providers.standard.operators.trigger_dagrun import (  # noqa: E402
    TriggerDagRunOperator,
)


class _CoulerTrigger(TriggerDagRunOperator):
    """A sub-workflow reference: the step runner's gates, then the referenced workflow's
    DAG triggered with the step's inputs as its conf, waited for until it ends."""

    template_fields = ("couler_xcoms",)  # no Jinja: placeholders are Couler's

    def __init__(self, *, couler_step: str, couler_xcoms: dict[str, Any],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.couler_step = couler_step
        self.couler_xcoms = couler_xcoms

    def execute(self, context: Any) -> Any:
        step, spec = self.couler_step, STEPS[self.couler_step]
        fill = _couler_gate(step, spec, self.couler_xcoms, None)
        self.conf = {name: fill("{{inputs.%s}}" % name) for name in spec["inputs"]}
        print(f"couler: {step} runs the workflow {self.trigger_dag_id}", flush=True)
        return super().execute(context)
'''
