"""Argo's ``A.Succeeded`` (ran and succeeded) against the default edge on the other engines.

Engines without per-edge conditions (Tekton, KFP) compile a ``succeeded_only``
edge from a step that has no ``when`` as the plain edge: such a step cannot be
skipped by its own ``when``, so both accept the same outcomes. From a step with
a ``when`` the difference is real: KFP refuses it, naming the step; Tekton
compiles it with its step-status rewrite.
"""

from __future__ import annotations

import pytest

from couler import ir
from couler.compilers import airflow, tekton
from couler.engines.base import plain_edges
from couler.errors import UnsupportedFeatureError

STRICT = ir.EdgeCondition.SUCCEEDED_ONLY


def ctr(name: str, **kw: object) -> ir.Step:
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", command=("true",)),
                   **kw)  # type: ignore[arg-type]


def gated(name: str) -> ir.Step:
    cond = ir.Condition(ir.Literal.of("a"), ir.CompareOp.EQ, ir.Literal.of("a"))
    return ctr(name, when=ir.When(cond))


def wf_of(*steps: ir.Step, **kw: object) -> ir.Workflow:
    return ir.Workflow(name="edges", steps=steps, **kw)  # type: ignore[arg-type]


def test_plain_edges_relaxes_only_edges_from_steps_without_a_when() -> None:
    wf = wf_of(ctr("a"), gated("g"),
               ctr("b", dependencies=(ir.Dependency("a", STRICT), ir.Dependency("g", STRICT))),
               ctr("c", dependencies=(ir.Dependency("a", STRICT), ir.Dependency("g")),
                   depends=ir.DependsAny((ir.DependsTerm("a", STRICT),
                                          ir.DependsNot(ir.DependsTerm("g"))))))
    out = plain_edges(wf)
    b, c = out.step("b"), out.step("c")
    assert b is not None and c is not None
    assert [d.condition for d in b.dependencies] == [ir.EdgeCondition.SUCCEEDED, STRICT]
    assert c.depends == ir.DependsAny((ir.DependsTerm("a", ir.EdgeCondition.SUCCEEDED),
                                       ir.DependsNot(ir.DependsTerm("g"))))
    assert out.step("a") is wf.step("a")  # untouched steps are kept as they are


def test_plain_edges_reaches_into_groups_and_exit_hooks() -> None:
    inner = (ctr("x"), ctr("y", dependencies=(ir.Dependency("x", STRICT),)))
    group = ir.Step(name="grp", body=ir.SubWorkflowSpec(name="grp", steps=inner))
    hook = ir.ExitHook(ir.RunStatus.ANY, inner)
    out = plain_edges(wf_of(group, exit_hooks=(hook,)))
    for steps in (out.steps[0].body.steps, out.exit_hooks[0].steps):  # type: ignore[union-attr]
        assert steps[1].dependencies == (ir.Dependency("x"),)


def test_tekton_takes_a_strict_edge_from_an_ungated_step_as_a_plain_one() -> None:
    ok = tekton.compile_workflow(
        wf_of(ctr("a"), ctr("b", dependencies=(ir.Dependency("a", STRICT),))))
    pipeline = next(d for d in ok if d["kind"] == "Pipeline")
    b = next(t for t in pipeline["spec"]["tasks"] if t["name"] == "b")
    assert b["runAfter"] == ["a"]
    assert "onError" not in b["taskSpec"]["steps"][0]  # no step-status rewrite needed
    # from a gated step the difference is real: the step-status rewrite tests it in the
    # script (tests/unit/test_tekton_status.py runs it)
    gated_docs = tekton.compile_workflow(
        wf_of(gated("g"), ctr("b", dependencies=(ir.Dependency("g", STRICT),))))
    b = next(t for t in gated_docs[0]["spec"]["tasks"] if t["name"] == "b")
    assert 'couler_is "$(couler_agg $couler_up_0)" Succeeded;' in b["taskSpec"]["steps"][0][
        "script"]


def test_airflow_trigger_rules_of_the_argo_outcomes() -> None:
    assert airflow.TRIGGER_RULES[STRICT] == "all_success"  # a skipped upstream skips it
    assert airflow.TRIGGER_RULES[ir.EdgeCondition.ANY_SUCCEEDED] == "one_success"
    assert airflow.TRIGGER_RULES[ir.EdgeCondition.ALL_FAILED] == "all_failed"
    src = airflow.compile_workflow(wf_of(gated("g"), ctr("b", dependencies=(
        ir.Dependency("g", STRICT),))))
    assert "trigger_rule='all_success'" in src
    with pytest.raises(UnsupportedFeatureError, match="does not tell a task that was not run"):
        airflow.compile_workflow(wf_of(ctr("a"), ctr("b", dependencies=(
            ir.Dependency("a", ir.EdgeCondition.OMITTED),))))
