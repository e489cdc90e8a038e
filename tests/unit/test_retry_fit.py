"""The optimizer's retry policies fitted to what an engine can express (retry_fit)."""

from __future__ import annotations

import dataclasses

from couler import ir
from couler.compilers import airflow, argo_capabilities, tekton
from couler.engines.base import Capability, Feature, Support
from couler.optimize import DEFAULT_RETRY, Recommendation, optimize
from couler.optimize.retry_fit import fit_retries


def _step(name: str, after: str = "", retry: ir.RetryPolicy | None = None) -> ir.Step:
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine:3", command=("true",)),
                   dependencies=(ir.Dependency(after),) if after else (), retry=retry)


OWN = ir.RetryPolicy(limit=1)  # every failure, at once: every engine expresses it
WF = ir.Workflow(name="fit", steps=(_step("a"), _step("b", "a"), _step("c", "b", OWN)))
# Tekton as it was before its retry wrapper: no back-off, no classes, no memory escalation
# (an engine that retries every failure at once, with the same memory)
AT_ONCE = {**tekton.CAPABILITIES,
           Feature.RETRY_BACKOFF: Capability(Support.UNSUPPORTED, "retried at once"),
           Feature.RETRY_FAILURE_CLASSES: Capability(Support.UNSUPPORTED, "every failure"),
           Feature.MEMORY_ESCALATION: Capability(Support.UNSUPPORTED, "same memory")}


def test_an_engine_that_cannot_tell_classes_apart_gets_no_blanket_retries() -> None:
    plan = optimize(WF, "tekton", capabilities=AT_ONCE)
    a, b, c = plan.workflow.steps
    assert a.retry is None and b.retry is None  # a user error would be retried
    assert c.retry == OWN  # the program's own policy: the capability check speaks for it
    notes = next(r.notes for r in plan.reports if r.name == "default_retry")
    assert any("no default retries on a, b" in n for n in notes)
    assert "kind: Pipeline" in plan.document  # it compiles (it was refused before)


def test_a_step_seen_failing_transiently_keeps_retries_of_every_failure() -> None:
    learned = [Recommendation("fit", "a", "retry_limit", "3",
                              failure_class=ir.FailureClass.INFRA),
               Recommendation("fit", "b", "retry_limit", "2",  # OOM retries do not count
                              failure_class=ir.FailureClass.OOM)]
    # an engine with back-off that cannot tell failure classes apart nor raise memory
    # (Airflow's matrix without its step runner's classifier and pod steps)
    none = Capability(Support.UNSUPPORTED, "not here")
    caps = {**airflow.CAPABILITIES, Feature.RETRY_FAILURE_CLASSES: none,
            Feature.MEMORY_ESCALATION: none}
    plan = optimize(WF, "airflow", capabilities=caps, recommendations=learned)
    a, b, _ = plan.workflow.steps
    assert a.retry is not None and a.retry.limit == 3
    assert a.retry.on == (ir.FailureClass.ANY,) and a.retry.memory_factor is None
    assert a.retry.backoff == DEFAULT_RETRY.backoff  # Airflow has back-off
    assert b.retry is None
    # Airflow's step runner classifies failures: the default policy is kept by class
    plan = optimize(WF, "airflow", capabilities=airflow.CAPABILITIES)
    assert plan.workflow.steps[0].retry is not None
    assert plan.workflow.steps[0].retry.on == DEFAULT_RETRY.on


def test_back_off_and_memory_escalation_are_dropped_where_missing() -> None:
    on_any = dataclasses.replace(DEFAULT_RETRY, on=(ir.FailureClass.ANY,))
    wf = dataclasses.replace(WF, steps=(dataclasses.replace(WF.steps[0], retry=on_any),))
    out, notes = fit_retries(wf, "tekton", AT_ONCE, written=(), flaky=())
    assert out.steps[0].retry == ir.RetryPolicy(limit=2, on=(ir.FailureClass.ANY,))
    assert notes == ["tekton has no retry back-off: retried at once on a",
                     "tekton cannot raise memory per attempt: retried with the same memory "
                     "on a"]


def test_tekton_keeps_back_off_classes_and_memory_escalation() -> None:
    plan = optimize(WF, "tekton", capabilities=tekton.CAPABILITIES)
    a = plan.workflow.steps[0]
    assert a.retry == DEFAULT_RETRY  # the retry wrapper and attempt tasks express it all
    assert "kind: Pipeline" in plan.document


def test_an_engine_that_expresses_everything_is_left_alone() -> None:
    plan = optimize(WF, "argo", capabilities=argo_capabilities.CAPABILITIES)
    assert [s.retry for s in plan.workflow.steps] == [DEFAULT_RETRY, DEFAULT_RETRY, OWN]
    # a workflow-wide policy the program wrote is its own everywhere
    own_all = dataclasses.replace(WF, defaults=ir.StepDefaults(retry=OWN))
    assert fit_retries(own_all, "tekton", tekton.CAPABILITIES, written=(),
                       flaky=()) == (own_all, [])
