"""Builder state lives in ContextVars; scopes are exception-safe and thread-isolated."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import couler.argo as couler
from couler import ir
from couler.api.builder import current_builder, discard_implicit_builder, peek_builder
from couler.errors import UserError, ValidationError


@pytest.fixture(autouse=True)
def _fresh_builder() -> Iterator[None]:
    discard_implicit_builder()
    yield
    discard_implicit_builder()


class BoomError(Exception):
    pass


def echo(word: str) -> list[couler.StepOutput]:
    return couler.run_container(image="alpine:3.20", command=["echo", word], step_name=word)


def explode() -> None:
    echo("half-built")
    raise BoomError("inside the body")


def test_workflow_scope_sets_and_restores_the_builder() -> None:
    outer = current_builder()
    with couler.workflow("inner") as wf:
        assert current_builder() is wf
        echo("a")
        with couler.workflow("nested") as nested:
            assert current_builder() is nested
        assert current_builder() is wf
    assert current_builder() is outer
    assert [s.name for s in wf.to_ir().steps] == ["a"]
    assert not outer.has_steps


def test_workflow_scope_restores_the_builder_after_an_exception() -> None:
    outer = current_builder()
    with pytest.raises(BoomError), couler.workflow("broken"):
        echo("a")
        raise BoomError
    assert current_builder() is outer


@pytest.mark.parametrize("make_scope", [
    pytest.param(lambda: couler.set_exit_handler(couler.WFStatus.Failed, explode), id="exit"),
    pytest.param(lambda: couler.when(couler.equal("a", "a"), explode), id="when"),
    pytest.param(lambda: couler.when(couler.equal("a", "a"), lambda: echo("x"), explode),
                 id="else"),
    pytest.param(lambda: couler.exec_while(couler.equal("x"), explode), id="while"),
    pytest.param(lambda: couler.map(lambda i: explode(), [1, 2]), id="map"),
    pytest.param(lambda: couler.concurrent([lambda: echo("y"), explode]), id="concurrent"),
    pytest.param(lambda: couler.concurrent([explode], subtasks=True), id="subtasks"),
    pytest.param(lambda: couler.dag([[explode]]), id="dag"),
    pytest.param(lambda: couler.set_dependencies(explode), id="set-dependencies"),
])
def test_an_exception_inside_a_scope_leaves_no_state(make_scope: object) -> None:
    echo("before")
    with pytest.raises(BoomError):
        make_scope()  # type: ignore[operator]
    # the implicit workflow goes on cleanly: no steps from the failed body, no open scope
    echo("after")
    wf = current_builder().to_ir()
    assert [s.name for s in wf.steps] == ["before", "after"]
    assert wf.exit_hooks == ()
    after = wf.step("after")
    assert after is not None and after.when is None and after.loop is None
    assert after.foreach is None
    # a fresh workflow builds cleanly too
    with couler.workflow("fresh") as fresh:
        echo("only")
    result = fresh.to_ir()
    assert [s.name for s in result.steps] == ["only"]
    assert result.steps[0].when is None and result.exit_hooks == ()


def test_nested_when_is_refused_and_leaves_no_state() -> None:
    flip = couler.run_script(image="python:3.12", source="print(1)", step_name="flip")
    with pytest.raises(UserError, match="when\\(\\) inside the body of another when"):
        couler.when(couler.equal(flip, "1"),
                    lambda: couler.when(couler.equal(flip, "2"), lambda: echo("x")))
    echo("next")
    step = current_builder().to_ir().step("next")
    assert step is not None and step.when is None


def test_two_workflows_built_in_two_threads_at_once() -> None:
    barrier = threading.Barrier(2)
    results: dict[str, ir.Workflow] = {}
    errors: list[BaseException] = []

    def build(name: str, words: list[str]) -> None:
        try:
            couler.config_workflow(name=name)  # the thread's own implicit builder
            for word in words:
                barrier.wait(timeout=5)
                echo(word)
            couler.when(couler.equal("a", "a"), lambda: echo(name + "-cond"))
            barrier.wait(timeout=5)
            results[name] = current_builder().to_ir()
        except BaseException as e:  # reported to the main thread
            errors.append(e)

    t1 = threading.Thread(target=build, args=("left", ["l1", "l2", "l3"]))
    t2 = threading.Thread(target=build, args=("right", ["r1", "r2", "r3"]))
    t1.start()
    t2.start()
    t1.join(10)
    t2.join(10)
    assert not errors
    assert [s.name for s in results["left"].steps] == ["l1", "l2", "l3", "left-cond"]
    assert [s.name for s in results["right"].steps] == ["r1", "r2", "r3", "right-cond"]
    assert peek_builder() is None  # the main thread's context was never touched


def test_explicit_scopes_in_threads_do_not_interfere() -> None:
    barrier = threading.Barrier(2)
    names: dict[str, list[str]] = {}

    def build(name: str) -> None:
        with couler.workflow(name) as wf:
            barrier.wait(timeout=5)
            echo(name + "-1")
            barrier.wait(timeout=5)
            echo(name + "-2")
        names[name] = [s.name for s in wf.to_ir().steps]

    threads = [threading.Thread(target=build, args=(n,)) for n in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert names == {"one": ["one-1", "one-2"], "two": ["two-1", "two-2"]}


def test_outputs_of_another_workflow_are_refused() -> None:
    with couler.workflow("first"):
        out = couler.run_script(image="python:3.12", source="print(1)", step_name="s")
    with couler.workflow("second"), pytest.raises(UserError, match="another workflow"):
        couler.run_container(image="alpine:3.20", args=[out])


def test_outputs_across_scopes_are_refused() -> None:
    out = couler.run_script(image="python:3.12", source="print(1)", step_name="s")
    with pytest.raises(UserError, match="outside the current scope"):
        couler.set_exit_handler(couler.WFStatus.Succeeded, lambda: couler.run_container(
            image="alpine:3.20", args=[out]))
    with pytest.raises(UserError, match="outside the current scope"):
        couler.concurrent([lambda: couler.run_container(image="alpine:3.20", args=[out])],
                          subtasks=True)


def test_map_item_used_outside_its_map_is_refused() -> None:
    items: list[object] = []
    couler.map(lambda i: items.append(i) or echo("m"), [1, 2])
    with pytest.raises(UserError, match="outside the function passed to map"):
        couler.run_container(image="alpine:3.20", args=[items[0]])


def test_validation_errors_name_the_step_and_field() -> None:
    with couler.workflow("invalid") as wf:
        couler.run_container(image="alpine:3.20", step_name="bad",
                             output=couler.create_parameter_artifact("relative/path"))
    with pytest.raises(ValidationError) as info:
        wf.to_ir()
    (issue,) = info.value.issues
    assert (issue.workflow, issue.step, issue.field) == ("invalid", "bad", "outputs.output-0")


def test_empty_workflow_and_unknown_dependency_fail_validation() -> None:
    with couler.workflow("empty") as wf:
        pass
    with pytest.raises(ValidationError, match="at least one step"):
        wf.to_ir()
    with couler.workflow("dangling") as wf2:
        couler.set_dependencies(lambda: echo("b"), dependencies=["missing"])
    with pytest.raises(ValidationError, match="unknown step 'missing'"):
        wf2.to_ir()


@pytest.mark.parametrize(("expression", "message"), [
    ("a &&", "expected a step name, '!' or '\\(' at position 4"),
    ("(a || b", "expected '\\)' at position 7"),
    ("a.Finished", "unknown status 'Finished'"),
    ("a.Daemoned", "not supported"),
    ("a b", "expected '&&', '\\|\\|' or the end at position 2"),
    ("a & b", "unexpected character '&' at position 2"),
    ("", "empty"),
])
def test_bad_depends_expressions_are_clear_errors(expression: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        couler.set_dependencies(lambda: echo("a"), dependencies=expression)
    assert not current_builder().has_steps


def test_depends_expression_with_negation_and_data_edges() -> None:
    with couler.workflow("neg") as wf:
        couler.set_dependencies(lambda: echo("a"))
        out = couler.set_dependencies(lambda: couler.run_script(
            image="python:3.12", source="print(1)", step_name="producer"))
        couler.set_dependencies(
            lambda: couler.run_container(image="alpine:3.20", args=[out], step_name="c"),
            dependencies="!a.Failed")
    c = wf.to_ir().step("c")
    assert c is not None
    # the data edge on "producer" must hold whatever the expression says
    assert c.depends == ir.DependsAll((
        ir.DependsNot(ir.DependsTerm("a", ir.EdgeCondition.FAILED)),
        ir.DependsTerm("producer", ir.EdgeCondition.SUCCEEDED),
    ))
    assert [(d.step, d.condition) for d in c.dependencies] == [
        ("producer", ir.EdgeCondition.SUCCEEDED), ("a", ir.EdgeCondition.FAILED)]
