"""The local engine's scheduling decisions, from the semantics table (no processes run).

Whether a step runs, is skipped or waits follows from its upstreams' outcomes alone, so
these tests set the upstreams' records and ask the run's decision functions (``_decide``,
``_edge``, ``_outcome``) directly. Every expected answer is written by hand from the rule
it names (Argo's edge conditions, ``couler.ir.EdgeCondition``): they are not read back
from the engine's output. The end-to-end runs are in tests/integration/test_local_engine.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from couler import ir
from couler.engines.base import StepState
from couler.semantics import failed_leaves
from couler_runtime.local.engine import LocalEngine, LocalRun, skipped_without_running
from couler_runtime.local.journal import _Record

E = ir.EdgeCondition
S = StepState

# the upstream outcomes of the table: (state, omitted, errored)
OUTCOMES: dict[str, tuple[StepState, bool, bool]] = {
    "succeeded": (S.SUCCEEDED, False, False),
    "cached": (S.CACHED, False, False),
    "failed": (S.FAILED, False, False),
    "errored": (S.FAILED, False, True),        # the process could not start (Argo's Error)
    "skipped": (S.SKIPPED, False, False),      # by its own when (Argo's Skipped)
    "omitted": (S.SKIPPED, True, False),       # its own upstreams did not let it run
    "cancelled": (S.CANCELLED, False, False),
}

# which upstream outcomes let an edge of each condition hold (model.py / Argo's depends)
HOLDS: dict[ir.EdgeCondition, set[str]] = {
    E.SUCCEEDED: {"succeeded", "cached", "skipped"},          # bare ``depends: A``
    E.SUCCEEDED_ONLY: {"succeeded", "cached"},                # ``A.Succeeded``: it ran
    E.FAILED: {"failed", "errored"},
    E.ERRORED: {"errored"},
    E.SKIPPED: {"skipped"},                                   # not an omitted step
    E.OMITTED: {"omitted"},
    E.COMPLETED: {"succeeded", "cached", "failed", "errored"},
    E.ANY: set(OUTCOMES),                                     # any terminal state
    E.ANY_SUCCEEDED: {"succeeded", "cached"},                 # no items: its own state
    E.ALL_FAILED: set(),                                      # needs failed items
}

def ctr(name: str, **kw: object) -> ir.Step:
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", command=("true",)),
                   **kw)  # type: ignore[arg-type]


def cond(left: str, right: str) -> ir.Condition:
    return ir.Condition(ir.Literal.of(left), ir.CompareOp.EQ, ir.Literal.of(right))


def new_run(tmp_path: Path, *steps: ir.Step) -> LocalRun:
    wf = ir.Workflow(name="decide", steps=steps)
    return LocalRun(LocalEngine(tmp_path / "work"), wf, tmp_path / "run",
                    parameters={}, on_event=None)


def put(run: LocalRun, name: str, outcome: str, key: str = "") -> None:
    state, omitted, errored = OUTCOMES[outcome]
    run._records[(name, key)] = _Record(name, key, state, omitted=omitted, errored=errored)


@pytest.mark.parametrize("condition", list(HOLDS))
@pytest.mark.parametrize("outcome", list(OUTCOMES))
def test_an_edge_holds_exactly_for_the_outcomes_of_its_condition(
        tmp_path: Path, condition: ir.EdgeCondition, outcome: str) -> None:
    run = new_run(tmp_path, ctr("a"))
    put(run, "a", outcome)
    assert run._edge("a", condition) is (outcome in HOLDS[condition])


def test_an_edge_from_a_step_without_a_record_does_not_hold(tmp_path: Path) -> None:
    run = new_run(tmp_path, ctr("a"))
    for condition in (E.SUCCEEDED, E.SKIPPED, E.OMITTED, E.ERRORED, E.FAILED):
        assert run._edge("a", condition) is False


@pytest.mark.parametrize(("items", "any_succeeded", "all_failed"), [
    (("failed", "succeeded"), True, False),
    (("failed", "failed"), False, True),
    (("failed",), False, True),
])
def test_map_edges_count_the_items(tmp_path: Path, items: tuple[str, ...],
                                   any_succeeded: bool, all_failed: bool) -> None:
    """A map step fails when an item fails; ANY_SUCCEEDED / ALL_FAILED read its items."""
    run = new_run(tmp_path, ctr("m"))
    put(run, "m", "failed")
    for i, outcome in enumerate(items):
        put(run, "m", outcome, key=str(i))
    assert run._edge("m", E.ANY_SUCCEEDED) is any_succeeded
    assert run._edge("m", E.ALL_FAILED) is all_failed


@pytest.mark.parametrize(("outcome", "expected"), [
    ("succeeded", "succeeded"), ("cached", "succeeded"), ("failed", "failed"),
    ("errored", "failed"), ("skipped", "skipped"), ("omitted", "skipped"),
])
def test_outcome_for_rule_s7(tmp_path: Path, outcome: str, expected: str) -> None:
    run = new_run(tmp_path, ctr("a"))
    put(run, "a", outcome)
    assert run._outcome("a") == expected


def test_a_step_waits_while_an_upstream_is_not_done(tmp_path: Path) -> None:
    b = ctr("b", dependencies=(ir.Dependency("a"),))
    run = new_run(tmp_path, ctr("a"), b)
    assert run._decide(b) is None  # no record yet
    run._records[("a", "")] = _Record("a", "", S.RUNNING)
    assert run._decide(b) is None
    put(run, "a", "succeeded")
    assert run._decide(b) == ""


def test_a_step_waits_for_the_steps_named_only_in_its_depends(tmp_path: Path) -> None:
    expr = ir.DependsAll((ir.DependsTerm("a"), ir.DependsNot(ir.DependsTerm("b", E.FAILED))))
    c = ctr("c", depends=expr)
    run = new_run(tmp_path, ctr("a"), ctr("b"), c)
    put(run, "a", "succeeded")
    assert run._decide(c) is None  # b (under the not) has not finished
    put(run, "b", "succeeded")
    assert run._decide(c) == ""
    put(run, "b", "failed")
    why = run._decide(c)
    assert why == "its depends expression does not hold"
    assert skipped_without_running(why)  # omitted: its dependents' default edges fail


def test_a_depends_expression_replaces_the_dependency_edges(tmp_path: Path) -> None:
    """With ``depends``, the edges' conditions are not checked a second time."""
    b = ctr("b", dependencies=(ir.Dependency("a"),),
            depends=ir.DependsTerm("a", E.FAILED))
    run = new_run(tmp_path, ctr("a"), b)
    put(run, "a", "failed")
    assert run._decide(b) == ""
    put(run, "a", "succeeded")
    assert run._decide(b) == "its depends expression does not hold"


@pytest.mark.parametrize(("expr", "outcomes", "holds"), [
    (ir.DependsAny((ir.DependsTerm("a", E.FAILED), ir.DependsTerm("b"))),
     {"a": "succeeded", "b": "failed"}, False),
    (ir.DependsAny((ir.DependsTerm("a", E.FAILED), ir.DependsTerm("b"))),
     {"a": "succeeded", "b": "succeeded"}, True),
    (ir.DependsAll((ir.DependsTerm("a"), ir.DependsTerm("b"))),
     {"a": "succeeded", "b": "failed"}, False),
    (ir.DependsAll((ir.DependsTerm("a"), ir.DependsTerm("b"))),
     {"a": "succeeded", "b": "skipped"}, True),
    (ir.DependsNot(ir.DependsTerm("a", E.SUCCEEDED_ONLY)),
     {"a": "skipped", "b": "succeeded"}, True),
])
def test_depends_expressions_combine_their_terms(
        tmp_path: Path, expr: ir.DependsExpr, outcomes: dict[str, str], holds: bool) -> None:
    c = ctr("c", depends=expr)
    run = new_run(tmp_path, ctr("a"), ctr("b"), c)
    for name, outcome in outcomes.items():
        put(run, name, outcome)
    assert run._decide(c) == ("" if holds else "its depends expression does not hold")


def test_a_failed_default_edge_names_the_dependency_and_omits_the_step(
        tmp_path: Path) -> None:
    c = ctr("c", dependencies=(ir.Dependency("a"), ir.Dependency("b", E.FAILED)))
    run = new_run(tmp_path, ctr("a"), ctr("b"), c)
    put(run, "a", "succeeded")
    put(run, "b", "succeeded")
    why = run._decide(c)
    assert why == "dependency 'b' did not reach failed"
    assert skipped_without_running(why)
    put(run, "b", "failed")
    assert run._decide(c) == ""
    put(run, "a", "omitted")  # skip propagation: an omitted upstream stops the default edge
    assert run._decide(c) == "dependency 'a' did not reach succeeded"


@pytest.mark.parametrize(("left", "expect", "decision"), [
    ("x", True, ""),
    ("y", True, "its when condition is false"),
    ("x", False, "its when condition is true"),  # the else branch of a true when
    ("y", False, ""),
])
def test_a_when_decides_after_the_edges(tmp_path: Path, left: str, expect: bool,
                                        decision: str) -> None:
    b = ctr("b", dependencies=(ir.Dependency("a"),),
            when=ir.When(cond(left, "x"), expect=expect))
    run = new_run(tmp_path, ctr("a"), b)
    put(run, "a", "succeeded")
    assert run._decide(b) == decision
    if decision:
        assert not skipped_without_running(decision)  # skipped by its own when
    put(run, "a", "failed")  # the edge is checked first: omitted, whatever the when says
    assert run._decide(b) == "dependency 'a' did not reach succeeded"


def test_a_when_that_cannot_be_evaluated_skips_the_step_by_its_when(tmp_path: Path) -> None:
    when = ir.When(ir.Condition(ir.StepOutputRef("a", "out"), ir.CompareOp.EQ,
                                ir.Literal.of("x")))
    b = ctr("b", dependencies=(ir.Dependency("a"),), when=when)
    run = new_run(tmp_path, ctr("a"), b)
    put(run, "a", "succeeded")  # but it has no output "out"
    why = run._decide(b)
    assert why is not None and why.startswith("its when cannot be evaluated: ")
    assert "'out'" in why
    assert not skipped_without_running(why)


def test_skipped_without_running_tells_omitted_from_skipped_by_when() -> None:
    assert skipped_without_running("dependency 'a' did not reach succeeded")
    assert not skipped_without_running("its when condition is false")


# ------------------------------------------------------------- rule S7: failed leaves


def chain(*specs: tuple[str, tuple[str, ...]]) -> list[ir.Step]:
    return [ctr(n, dependencies=tuple(ir.Dependency(d) for d in ds)) for n, ds in specs]


def test_a_failure_travels_down_through_steps_that_did_not_run() -> None:
    steps = chain(("a", ()), ("b", ("a",)), ("c", ("b",)), ("d", ("c",)))
    out = {"a": "failed", "b": "skipped", "c": "skipped", "d": "skipped"}
    assert failed_leaves(steps, out.__getitem__) == ["d"]
    out["c"] = "succeeded"  # c ran (an edge on a's failure) and succeeded: handled
    assert failed_leaves(steps, out.__getitem__) == []
    out["d"] = "failed"  # the leaf's own failure
    assert failed_leaves(steps, out.__getitem__) == ["d"]


def test_a_join_is_decided_after_all_its_parents() -> None:
    """A diamond whose failed branch is listed last still reaches the skipped join."""
    steps = chain(("top", ()), ("ok", ("top",)), ("bad", ("top",)), ("join", ("ok", "bad")))
    out = {"top": "succeeded", "ok": "succeeded", "bad": "failed", "join": "skipped"}
    assert failed_leaves(steps, out.__getitem__) == ["join"]
    steps = chain(("top", ()), ("bad", ("top",)), ("ok", ("top",)), ("join", ("bad", "ok")))
    assert failed_leaves(steps, out.__getitem__) == ["join"]


def test_failed_leaves_come_in_step_order_and_ignore_outside_parents() -> None:
    # "outer" is not one of the steps (an edge out of a sub-workflow's scope): ignored
    steps = chain(("z", ("outer",)), ("a", ()), ("m", ()))
    out = {"z": "failed", "a": "failed", "m": "succeeded"}
    assert failed_leaves(steps, out.__getitem__) == ["z", "a"]


def test_a_step_not_run_at_all_carries_its_parents_branch() -> None:
    steps = chain(("a", ()), ("b", ("a",)))
    for not_run in ("skipped", "pending", "cancelled"):
        assert failed_leaves(steps, {"a": "failed", "b": not_run}.__getitem__) == ["b"]
        assert failed_leaves(steps, {"a": "succeeded", "b": not_run}.__getitem__) == []


def test_with_depends_a_step_still_waits_for_every_listed_dependency(
        tmp_path: Path) -> None:
    """The expression decides whether it runs; the dependencies, when it may decide."""
    c = ctr("c", dependencies=(ir.Dependency("a"), ir.Dependency("b", E.ANY)),
            depends=ir.DependsTerm("a"))
    run = new_run(tmp_path, ctr("a"), ctr("b"), c)
    put(run, "a", "succeeded")
    run._records[("b", "")] = _Record("b", "", S.RUNNING)
    assert run._decide(c) is None
    put(run, "b", "failed")
    assert run._decide(c) == ""
