"""The Couler-compatible API builds the right IR for the SDK's golden scenarios (and more).

Each test writes a small program in the SDK's style (``import couler.argo as
couler``), captures the workflow it builds and asserts on the IR structure.
"""
# The programs deliberately pass ``lambda: f()`` where ``f`` would do: that is the SDK's style.
# ruff: noqa: PLW0108

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import couler.argo as couler
from couler import ir
from couler.api.builder import Defaults, discard_implicit_builder, get_defaults, set_defaults
from couler.api.capture import capture_callable
from couler.argo import WFStatus
from couler.errors import UserError, ValidationError


@pytest.fixture(autouse=True)
def _fresh_builder() -> Iterator[None]:
    discard_implicit_builder()
    set_defaults(Defaults())
    yield
    discard_implicit_builder()
    set_defaults(Defaults())


def build(program: Callable[[], Any]) -> ir.Workflow:
    """The single workflow ``program`` builds."""
    workflows = capture_callable(program)
    assert len(workflows) == 1
    return workflows[0]


def step(wf: ir.Workflow, name: str) -> ir.Step:
    s = wf.step(name)
    assert s is not None, f"no step {name!r} in {[x.name for x in wf.steps]}"
    return s


def deps(s: ir.Step) -> list[tuple[str, ir.EdgeCondition]]:
    return [(d.step, d.condition) for d in s.dependencies]


def inputs(s: ir.Step) -> list[tuple[str, ir.ValueSource, ir.ValueType]]:
    return [(i.name, i.value, i.type) for i in s.inputs]


SUCCEEDED = ir.EdgeCondition.SUCCEEDED


# --------------------------------------------------------------------------- shared step functions


def toss() -> None:
    import random

    print("heads" if random.random() < 0.5 else "tails")


def flip_coin() -> list[couler.StepOutput]:
    return couler.run_script(image="python:3.12-alpine", source=toss)


def heads() -> list[couler.StepOutput]:
    return couler.run_container(image="alpine:3.20", command=["echo", "heads"])


def tails() -> list[couler.StepOutput]:
    return couler.run_container(image="alpine:3.20", command=["echo", "tails"])


def job(name: str) -> None:
    couler.run_container(image="alpine:3.20", command=["echo"], args=[name], step_name=name)


# --------------------------------------------------------------------------- coin flip / when


def test_coin_flip_with_two_whens() -> None:
    def program() -> None:
        couler.config_workflow(name="coin-flip")
        outcome = flip_coin()
        couler.when(couler.equal(outcome, "heads"), lambda: heads())
        couler.when(couler.equal(outcome, "tails"), lambda: tails())

    wf = build(program)
    assert wf.name == "coin-flip"
    assert [s.name for s in wf.steps] == ["flip-coin", "heads", "tails"]
    flip = step(wf, "flip-coin")
    assert isinstance(flip.body, ir.ScriptSpec)
    assert flip.body.language == ir.ScriptLanguage.PYTHON
    assert flip.body.source == (
        "import random\n\nprint(\"heads\" if random.random() < 0.5 else \"tails\")\n")
    assert flip.outputs == (ir.OutputParameter("result", ir.OutputSource.STDOUT),)
    result = ir.StepOutputRef("flip-coin", "result")
    h, t = step(wf, "heads"), step(wf, "tails")
    assert h.when == ir.When(ir.Condition(result, ir.CompareOp.EQ, ir.Literal.of("heads")))
    assert t.when == ir.When(ir.Condition(result, ir.CompareOp.EQ, ir.Literal.of("tails")))
    assert deps(h) == [("flip-coin", SUCCEEDED)]
    # two whens on the same output are siblings (one step group per condition in the
    # open-source SDK): a failing "heads" must not keep "tails" from running
    assert deps(t) == [("flip-coin", SUCCEEDED)]
    # container steps get no stdout output unless something reads it
    assert h.outputs == () and t.outputs == ()


def test_whens_on_the_same_output_are_siblings_and_what_follows_waits_for_both() -> None:
    def program() -> None:
        couler.config_workflow(name="three-way")
        score = couler.run_script(image="python:3.12-alpine", source="print(2)",
                                  step_name="score")
        couler.when(couler.equal(score, "1"), lambda: job("one"))
        couler.when(couler.equal(score, "2"), lambda: job("two"))
        couler.when(couler.equal(score, "3"), lambda: job("three"))
        job("report")

    wf = build(program)
    for name in ("one", "two", "three"):
        assert deps(step(wf, name)) == [("score", SUCCEEDED)], name
    assert deps(step(wf, "report")) == [("one", SUCCEEDED), ("two", SUCCEEDED),
                                        ("three", SUCCEEDED)]


def test_whens_on_other_outputs_or_apart_from_each_other_stay_in_sequence() -> None:
    def program() -> None:
        couler.config_workflow(name="apart")
        a = couler.run_script(image="python:3.12-alpine", source="print(1)", step_name="a")
        couler.when(couler.equal(a, "1"), lambda: job("if-a"))
        b = couler.run_script(image="python:3.12-alpine", source="print(1)", step_name="b")
        couler.when(couler.equal(b, "1"), lambda: job("if-b"))
        job("between")
        couler.when(couler.equal(b, "1"), lambda: job("again-b"))

    wf = build(program)
    assert deps(step(wf, "b")) == [("if-a", SUCCEEDED)]
    assert deps(step(wf, "if-b")) == [("b", SUCCEEDED)]
    # a statement in between: the next when on the same output comes after it
    assert deps(step(wf, "again-b")) == [("b", SUCCEEDED), ("between", SUCCEEDED)]


def test_when_with_else_branch() -> None:
    def score() -> None:
        print(0.93)

    def program() -> None:
        couler.config_workflow(name="when-else")
        accuracy = couler.run_script(image="python:3.12-alpine", source=score,
                                     step_name="evaluate")
        couler.when(
            couler.bigger(accuracy, 0.9),
            lambda: couler.run_container(image="alpine:3.20", command=["echo", "deploy"],
                                         step_name="deploy"),
            lambda: couler.run_container(image="alpine:3.20", command=["echo", "retrain"],
                                         step_name="retrain"),
        )
        couler.run_container(image="alpine:3.20", command=["echo", "done"], step_name="report")

    wf = build(program)
    cond = ir.Condition(ir.StepOutputRef("evaluate", "result"), ir.CompareOp.GT,
                        ir.Literal.of(0.9))
    assert step(wf, "deploy").when == ir.When(cond, expect=True)
    assert step(wf, "retrain").when == ir.When(cond, expect=False)
    assert deps(step(wf, "deploy")) == [("evaluate", SUCCEEDED)]
    assert deps(step(wf, "retrain")) == [("evaluate", SUCCEEDED)]
    # the next group waits for both branches
    assert deps(step(wf, "report")) == [("deploy", SUCCEEDED), ("retrain", SUCCEEDED)]


def test_when_on_a_container_result_adds_its_stdout_output() -> None:
    def program() -> None:
        out = couler.run_container(image="alpine:3.20", command=["sh", "-c", "echo yes"],
                                   step_name="check")
        couler.when(couler.not_equal(out, "no"), heads)

    wf = build(program)
    assert step(wf, "check").outputs == (ir.OutputParameter("result", ir.OutputSource.STDOUT),)
    assert step(wf, "heads").when is not None
    assert step(wf, "heads").when.condition.op == ir.CompareOp.NE  # type: ignore[union-attr]


@pytest.mark.parametrize(("predicate", "op"), [
    (couler.equal, ir.CompareOp.EQ), (couler.not_equal, ir.CompareOp.NE),
    (couler.bigger, ir.CompareOp.GT), (couler.smaller, ir.CompareOp.LT),
    (couler.bigger_equal, ir.CompareOp.GE), (couler.smaller_equal, ir.CompareOp.LE),
])
def test_every_predicate_maps_to_its_operator(predicate: Callable[..., couler.Predicate],
                                              op: ir.CompareOp) -> None:
    def program() -> None:
        out = flip_coin()
        couler.when(predicate(out, 3), heads)

    wf = build(program)
    when = step(wf, "heads").when
    assert when is not None and when.condition.op == op
    assert when.condition.right == ir.Literal.of(3)
    assert predicate("a", "b")["condition"] == op.value  # the SDK's dict-style access


def test_when_predicate_operand_may_be_a_callable_called_first() -> None:
    def program() -> None:
        couler.when(couler.equal(flip_coin, "heads"), heads)

    wf = build(program)
    assert [s.name for s in wf.steps] == ["flip-coin", "heads"]
    assert step(wf, "heads").when == ir.When(ir.Condition(
        ir.StepOutputRef("flip-coin", "result"), ir.CompareOp.EQ, ir.Literal.of("heads")))


# --------------------------------------------------------------------------- exit handlers


def test_exit_handlers_by_status() -> None:
    def say_hello() -> None:
        print("hello from a script body")

    def program() -> None:
        couler.config_workflow(name="exit-handlers")
        couler.run_script(image="python:3.12-alpine", source=say_hello, step_name="hello")
        couler.set_exit_handler(WFStatus.Succeeded, heads)
        couler.set_exit_handler(WFStatus.Failed, tails)
        couler.set_exit_handler(WFStatus.Failed, lambda: couler.run_container(
            image="alpine:3.20", command=["echo", "cleanup"], step_name="cleanup"))
        couler.set_exit_handler(WFStatus.Error, lambda: couler.run_container(
            image="alpine:3.20", command=["echo", "error"], step_name="on-error"))

    wf = build(program)
    assert [s.name for s in wf.steps] == ["hello"]
    hooks = {h.on: [s.name for s in h.steps] for h in wf.exit_hooks}
    assert hooks == {
        ir.RunStatus.SUCCEEDED: ["heads"],
        ir.RunStatus.FAILED: ["tails", "cleanup"],
        ir.RunStatus.ERROR: ["on-error"],
    }
    failed = next(h for h in wf.exit_hooks if h.on == ir.RunStatus.FAILED)
    # steps inside one handler run one after another
    assert deps(failed.steps[1]) == [("tails", SUCCEEDED)]
    assert deps(failed.steps[0]) == []


# --------------------------------------------------------------------------- exec_while


def test_exec_while_repeats_the_body_step_on_its_own_result() -> None:
    def program() -> None:
        couler.config_workflow(name="while-loop")
        couler.exec_while(couler.equal("tails"), lambda: flip_coin(), max_iterations=20)

    wf = build(program)
    (flip,) = wf.steps
    assert flip.name == "flip-coin"
    assert flip.loop == ir.Loop(ir.Condition(ir.StepOutputRef("flip-coin", "result"),
                                             ir.CompareOp.EQ, ir.Literal.of("tails")),
                                max_iterations=20)


def test_exec_while_default_bound_callable_condition_and_container_body() -> None:
    def program() -> None:
        couler.exec_while(couler.equal(lambda: "tails"), heads)

    wf = build(program)
    (h,) = wf.steps
    assert h.loop is not None and h.loop.max_iterations == 100
    assert h.loop.condition.right == ir.Literal.of("tails")
    # the container body gained the stdout output the condition reads
    assert h.outputs == (ir.OutputParameter("result", ir.OutputSource.STDOUT),)


def test_exec_while_two_operand_form_reads_the_body() -> None:
    def program() -> None:
        couler.exec_while(couler.equal(flip_coin, "tails"), flip_coin)

    wf = build(program)
    (flip,) = wf.steps
    assert flip.loop is not None
    assert flip.loop.condition.left == ir.StepOutputRef("flip-coin", "result")


def test_exec_while_with_several_body_steps_is_a_clear_error() -> None:
    def body() -> None:
        heads()
        tails()

    def program() -> None:
        couler.config_workflow(name="looping")
        couler.exec_while(couler.equal("x"), body)

    with pytest.raises(UserError, match=r"workflow 'looping': exec_while loop over 'body' "
                                        r"created 2 steps \['heads', 'tails'\]"):
        build(program)


# --------------------------------------------------------------------------- DAGs


def _linear_dag() -> None:
    couler.config_workflow(name="dag-linear")
    couler.dag([
        [lambda: job("a")],
        [lambda: job("a"), lambda: job("b")],
        [lambda: job("a"), lambda: job("c")],
        [lambda: job("b"), lambda: job("d")],
    ])


def _linear_set_dependencies() -> None:
    couler.config_workflow(name="dag-linear")
    couler.set_dependencies(lambda: job("a"), dependencies=None)
    couler.set_dependencies(lambda: job("b"), dependencies=["a"])
    couler.set_dependencies(lambda: job("c"), dependencies=["a"])
    couler.set_dependencies(lambda: job("d"), dependencies=["b"])


def test_linear_dag_via_dag_and_set_dependencies_is_the_same_ir() -> None:
    via_dag = build(_linear_dag)
    via_set = build(_linear_set_dependencies)
    assert via_dag == via_set
    assert ir.to_json(via_dag) == ir.to_json(via_set)
    assert [(s.name, deps(s)) for s in via_dag.steps] == [
        ("a", []), ("b", [("a", SUCCEEDED)]), ("c", [("a", SUCCEEDED)]), ("d", [("b", SUCCEEDED)]),
    ]
    a = step(via_dag, "a")
    assert inputs(a) == [("para-a-0", ir.Literal.of("a"), ir.ValueType.STRING)]
    assert isinstance(a.body, ir.ContainerSpec)
    assert a.body.args == ("{{inputs.para-a-0}}",)


def test_diamond_dag_via_dag_and_set_dependencies_is_the_same_ir() -> None:
    def via_dag() -> None:
        couler.config_workflow(name="dag-diamond")
        couler.dag([
            [lambda: job("A")],
            [lambda: job("A"), lambda: job("B")],
            [lambda: job("A"), lambda: job("C")],
            [lambda: job("B"), lambda: job("D")],
            [lambda: job("C"), lambda: job("D")],
        ])

    def via_set() -> None:
        couler.config_workflow(name="dag-diamond")
        couler.set_dependencies(lambda: job("A"))
        couler.set_dependencies(lambda: job("B"), dependencies=["A"])
        couler.set_dependencies(lambda: job("C"), dependencies=["A"])
        couler.set_dependencies(lambda: job("D"), dependencies=["B", "C"])

    a, b = build(via_dag), build(via_set)
    assert a == b
    assert [s.name for s in a.steps] == ["a", "b", "c", "d"]  # step names are sanitised
    assert deps(step(a, "d")) == [("b", SUCCEEDED), ("c", SUCCEEDED)]
    # the literal argument keeps its case: only names are sanitised
    assert step(a, "d").inputs[0].value == ir.Literal.of("D")


def test_dag_reusing_a_step_name_with_a_different_definition_is_an_error() -> None:
    def program() -> None:
        couler.dag([
            [lambda: couler.run_container(image="alpine:3.20", step_name="a")],
            [lambda: couler.run_container(image="busybox:1", step_name="a"), lambda: job("b")],
        ])

    with pytest.raises(UserError, match="step 'a' is defined twice"):
        build(program)


def test_conditional_dag() -> None:
    def flip() -> list[couler.StepOutput]:
        return couler.run_script(image="python:3.12-alpine", source=toss, step_name="flip-coin")

    def program() -> None:
        couler.config_workflow(name="dag-conditional")
        couler.set_dependencies(lambda: flip(), dependencies=None)
        couler.set_dependencies(
            lambda: couler.when(couler.equal(flip, "heads"), lambda: couler.run_container(
                image="alpine:3.20", command=["echo", "heads"], step_name="heads")),
            dependencies=["flip-coin"],
        )

    wf = build(program)
    assert [s.name for s in wf.steps] == ["flip-coin", "heads"]
    assert deps(step(wf, "flip-coin")) == []
    h = step(wf, "heads")
    assert deps(h) == [("flip-coin", SUCCEEDED)]
    assert h.when == ir.When(ir.Condition(ir.StepOutputRef("flip-coin", "result"),
                                          ir.CompareOp.EQ, ir.Literal.of("heads")))


def test_implicit_parameter_passing_in_a_dag() -> None:
    def produce_two() -> list[couler.StepOutput]:
        first = couler.create_parameter_artifact(path="/out/first.txt")
        second = couler.create_parameter_artifact(path="/out/second.txt")
        return couler.run_container(image="alpine:3.20", command=["sh", "-c", "true"],
                                    output=[first, second], step_name="a")

    def consume() -> list[couler.StepOutput]:
        return couler.run_container(image="alpine:3.20", command=["echo"], args=["got"],
                                    step_name="b")

    def program() -> None:
        couler.config_workflow(name="implicit-passing")
        couler.set_dependencies(lambda: produce_two(), dependencies=None)
        couler.set_dependencies(lambda: consume(), dependencies=["a"])

    wf = build(program)
    a, b = step(wf, "a"), step(wf, "b")
    assert a.outputs == (
        ir.OutputParameter("output-0", ir.OutputSource.PATH, "/out/first.txt"),
        ir.OutputParameter("output-1", ir.OutputSource.PATH, "/out/second.txt"),
    )
    assert inputs(b) == [
        ("para-b-0", ir.Literal.of("got"), ir.ValueType.STRING),
        ("para-b-1", ir.StepOutputRef("a", "output-0"), ir.ValueType.STRING),
        ("para-b-2", ir.StepOutputRef("a", "output-1"), ir.ValueType.STRING),
    ]
    assert isinstance(b.body, ir.ContainerSpec)
    assert b.body.args == ("{{inputs.para-b-0}}", "{{inputs.para-b-1}}", "{{inputs.para-b-2}}")
    assert deps(b) == [("a", SUCCEEDED)]


def test_set_dependencies_with_a_depends_expression() -> None:
    def program() -> None:
        couler.set_dependencies(lambda: job("a"))
        couler.set_dependencies(lambda: job("c"))
        couler.set_dependencies(lambda: job("b"), dependencies="a && (c.Succeeded || c.Failed)")

    wf = build(program)
    b = step(wf, "b")
    assert b.depends == ir.DependsAll((
        ir.DependsTerm("a"),
        # "c.Succeeded" is Argo's: c ran and succeeded (not also "skipped by its when")
        ir.DependsAny((ir.DependsTerm("c", ir.EdgeCondition.SUCCEEDED_ONLY),
                       ir.DependsTerm("c", ir.EdgeCondition.FAILED))),
    ))
    assert deps(b) == [("a", SUCCEEDED), ("c", ir.EdgeCondition.ANY)]


def test_succeeded_is_strict_and_a_bare_name_is_argos_default_edge() -> None:
    """B2: "a.Succeeded" must not run after a skipped by its when; bare "a" may."""
    def program() -> None:
        couler.set_dependencies(lambda: job("a"))
        couler.set_dependencies(lambda: job("strict"), dependencies="a.Succeeded")
        couler.set_dependencies(lambda: job("listed"), dependencies=["a.Succeeded"])
        couler.set_dependencies(lambda: job("bare"), dependencies="a")
        couler.set_dependencies(lambda: job("gone"), dependencies="a.Omitted")

    wf = build(program)
    assert deps(step(wf, "strict")) == [("a", ir.EdgeCondition.SUCCEEDED_ONLY)]
    assert deps(step(wf, "listed")) == [("a", ir.EdgeCondition.SUCCEEDED_ONLY)]
    assert deps(step(wf, "bare")) == [("a", SUCCEEDED)]
    assert deps(step(wf, "gone")) == [("a", ir.EdgeCondition.OMITTED)]
    for name in ("strict", "listed", "bare", "gone"):
        assert step(wf, name).depends is None


def test_daemoned_and_an_expression_in_a_list_are_refused() -> None:
    with pytest.raises(UserError, match=r"Daemoned.*not supported"):
        build(lambda: (couler.set_dependencies(lambda: job("a")),
                       couler.set_dependencies(lambda: job("b"), dependencies="a.Daemoned")))

    def in_list() -> None:
        couler.set_dependencies(lambda: job("a"))
        couler.set_dependencies(lambda: job("b"), dependencies=["a.Succeeded || a.Failed"])

    with pytest.raises(UserError, match="is an expression; pass it as a string"):
        build(in_list)


def test_any_succeeded_needs_a_map_upstream() -> None:
    def program() -> None:
        couler.set_dependencies(lambda: job("a"))
        couler.set_dependencies(lambda: job("b"), dependencies="a.AnySucceeded")

    with pytest.raises(ValidationError, match="'any_succeeded' on 'a' needs a map step"):
        build(program)


def test_a_depends_string_of_plain_terms_is_just_edges() -> None:
    """"clean.Failed" or "a && b" say nothing edges cannot: no depends expression (which
    several engines cannot express), the same IR as edges with those conditions."""
    def program() -> None:
        couler.set_dependencies(lambda: job("a"))
        couler.set_dependencies(lambda: job("clean"))
        couler.set_dependencies(lambda: job("fallback"), dependencies="clean.Failed")
        couler.set_dependencies(lambda: job("both"), dependencies="a && clean")

    wf = build(program)
    assert step(wf, "fallback").depends is None
    assert deps(step(wf, "fallback")) == [("clean", ir.EdgeCondition.FAILED)]
    assert step(wf, "both").depends is None
    assert deps(step(wf, "both")) == [("a", SUCCEEDED), ("clean", SUCCEEDED)]


# --------------------------------------------------------------------------- input parameters


def say(message: object) -> list[couler.StepOutput]:
    return couler.run_container(image="alpine:3.20", command=["echo"], args=[message])


def test_one_template_twice_with_different_literal_args() -> None:
    def program() -> None:
        say("hello")
        say("goodbye")

    wf = build(program)
    first, second = wf.steps
    assert (first.name, second.name) == ("say", "say-2")
    assert first.template == second.template == "say"
    assert inputs(first) == [("para-say-0", ir.Literal.of("hello"), ir.ValueType.STRING)]
    assert inputs(second) == [("para-say-0", ir.Literal.of("goodbye"), ir.ValueType.STRING)]
    assert first.body == second.body  # same body: the compiler shares one template
    assert deps(second) == [("say", SUCCEEDED)]


def test_two_typed_params_per_call() -> None:
    def add(x: int, y: int) -> list[couler.StepOutput]:
        return couler.run_container(image="alpine:3.20", command=["expr"], args=[x, "+", y])

    def program() -> None:
        add(1, 2)
        add(30, 12)

    wf = build(program)
    assert inputs(step(wf, "add-2")) == [
        ("para-add-0", ir.Literal.of(30), ir.ValueType.INT),
        ("para-add-1", ir.Literal.of("+"), ir.ValueType.STRING),
        ("para-add-2", ir.Literal.of(12), ir.ValueType.INT),
    ]
    body = step(wf, "add").body
    assert isinstance(body, ir.ContainerSpec)
    assert body.args == ("{{inputs.para-add-0}}", "{{inputs.para-add-1}}", "{{inputs.para-add-2}}")


def test_literal_types_bool_float_and_no_embedded_quotes() -> None:
    def program() -> None:
        couler.run_container(image="alpine:3.20", args=[True, 0.5, "it's \"quoted\""],
                             env={"FLAG": True, "N": 1}, step_name="s")

    s = step(build(program), "s")
    assert [i.type for i in s.inputs] == [ir.ValueType.BOOL, ir.ValueType.FLOAT,
                                          ir.ValueType.STRING]
    assert s.inputs[2].value == ir.Literal.of("it's \"quoted\"")
    assert isinstance(s.body, ir.ContainerSpec)
    assert all("'" not in a and '"' not in a for a in s.body.args)
    assert s.env == (ir.EnvVar("FLAG", "True"), ir.EnvVar("N", "1"))


def test_script_result_passed_as_an_argument() -> None:
    def number() -> None:
        import random

        print(random.randint(0, 100))

    def generate() -> list[couler.StepOutput]:
        return couler.run_script(image="python:3.12-alpine", source=number)

    def show(value: object) -> list[couler.StepOutput]:
        return couler.run_container(image="alpine:3.20", command=["echo"], args=["got", value])

    def program() -> None:
        show("start")
        show(generate())

    wf = build(program)
    assert [s.name for s in wf.steps] == ["show", "generate", "show-2"]
    second = step(wf, "show-2")
    assert inputs(second) == [
        ("para-show-0", ir.Literal.of("got"), ir.ValueType.STRING),
        ("para-show-1", ir.StepOutputRef("generate", "result"), ir.ValueType.STRING),
    ]
    assert deps(second) == [("generate", SUCCEEDED)]


def test_args_as_a_bare_string_in_a_nested_function() -> None:
    def outer() -> None:
        def shout(text: str) -> list[couler.StepOutput]:
            return couler.run_container(image="alpine:3.20", command=["echo"], args=text)

        shout("a bare string argument")

    wf = build(outer)
    (s,) = wf.steps
    assert s.name == "shout"
    assert inputs(s) == [("para-shout-0", ir.Literal.of("a bare string argument"),
                          ir.ValueType.STRING)]


# --------------------------------------------------------------------------- outputs


def test_producer_consumer_through_a_parameter_artifact() -> None:
    def producer() -> list[couler.StepOutput]:
        place = couler.create_parameter_artifact(path="/tmp/hello.txt", is_global=True)
        return couler.run_container(image="alpine:3.20", command=["sh", "-c"],
                                    args=["echo -n hello world > /tmp/hello.txt"], output=place)

    def consumer(inputs: object) -> list[couler.StepOutput]:
        return couler.run_container(image="alpine:3.20", command=["cat"], args=inputs)

    def program() -> None:
        consumer(producer())

    wf = build(program)
    p, c = step(wf, "producer"), step(wf, "consumer")
    assert p.outputs == (ir.OutputParameter("output-0", ir.OutputSource.PATH, "/tmp/hello.txt",
                                            global_name="producer-output-0"),)
    assert inputs(c) == [("para-consumer-0", ir.StepOutputRef("producer", "output-0"),
                          ir.ValueType.STRING)]
    assert deps(c) == [("producer", SUCCEEDED)]


def test_multiple_outputs_become_multiple_args_and_names_can_be_given() -> None:
    def producer() -> list[couler.StepOutput]:
        a = couler.create_parameter_artifact(path="/tmp/a.txt")
        b = couler.create_parameter_artifact(path="/tmp/b.txt", name="second")
        return couler.run_container(image="alpine:3.20", command=["sh", "-c", "true"],
                                    output=[a, b])

    def consumer(values: object) -> list[couler.StepOutput]:
        return couler.run_container(image="alpine:3.20", command=["echo"], args=values)

    def program() -> None:
        outs = producer()
        assert [o.name for o in outs] == ["output-0", "second"]
        consumer(outs)

    wf = build(program)
    assert [o.name for o in step(wf, "producer").outputs] == ["output-0", "second"]
    assert [i.value for i in step(wf, "consumer").inputs] == [
        ir.StepOutputRef("producer", "output-0"), ir.StepOutputRef("producer", "second")]


def test_output_artifacts_feed_input_artifacts_not_args() -> None:
    def program() -> None:
        model = couler.create_s3_artifact(path="/out/model", bucket="models", key="m/1",
                                          endpoint="minio:9000")
        local = couler.create_local_artifact(path="/out/log")
        outs = couler.run_container(image="trainer:1", output=[model, local], step_name="train")
        couler.run_container(image="evaluator:1", args=[outs[0], "--fast"], step_name="evaluate")

    wf = build(program)
    train, evaluate = step(wf, "train"), step(wf, "evaluate")
    assert train.output_artifacts == (
        ir.OutputArtifact("output-0", "/out/model", location=ir.ArtifactLocation(
            storage=ir.StorageKind.S3, endpoint="minio:9000", bucket="models", key="m/1")),
        ir.OutputArtifact("output-1", "/out/log"),
    )
    assert evaluate.input_artifacts == (
        ir.InputArtifact("output-0", "/out/model", ir.StepArtifactRef("train", "output-0")),)
    assert isinstance(evaluate.body, ir.ContainerSpec)
    assert evaluate.body.args == ("{{inputs.para-evaluate-1}}",)  # the artifact is no arg
    assert deps(evaluate) == [("train", SUCCEEDED)]


def test_input_artifacts_from_storage_and_env_fed_by_an_output() -> None:
    def program() -> None:
        data = couler.create_s3_artifact(path="/in/data.csv", bucket="datasets", key="train.csv",
                                         name="dataset")
        version = couler.run_script(image="python:3.12", source="print('v3')", step_name="ver")
        couler.run_container(image="trainer:1", input=[data], env={"VERSION": version},
                             step_name="train")

    train = step(build(program), "train")
    location = ir.ArtifactLocation(storage=ir.StorageKind.S3, bucket="datasets", key="train.csv")
    assert train.input_artifacts == (ir.InputArtifact("dataset", "/in/data.csv", location),)
    assert train.env == (ir.EnvVar("VERSION", "{{inputs.para-train-0}}"),)
    assert inputs(train) == [("para-train-0", ir.StepOutputRef("ver", "result"),
                              ir.ValueType.STRING)]
    assert deps(train) == [("ver", SUCCEEDED)]


# --------------------------------------------------------------------------- cron and config


def test_cron_workflow_without_a_timezone_default() -> None:
    def program() -> None:
        couler.config_workflow(
            name="cron-report",
            cron_config={
                "schedule": "*/30 * * * *",
                "concurrency_policy": "Forbid",
                "successful_jobs_history_limit": 5,
                "failed_jobs_history_limit": 2,
                "starting_deadline_seconds": 60,
            },
        )
        couler.run_container(image="alpine:3.20", command=["date"], step_name="report")

    wf = build(program)
    assert wf.schedule == ir.CronSchedule(
        schedule="*/30 * * * *", timezone="", concurrency_policy=ir.ConcurrencyPolicy.FORBID,
        starting_deadline_seconds=60, successful_history_limit=5, failed_history_limit=2,
        suspend=False)


def test_config_workflow_settings() -> None:
    def program() -> None:
        couler.config_workflow(name="Cfg_Test.v2", user_id="Alice Smith", timeout="2h",
                               time_to_clean=600, service_account="runner",
                               labels={"team": "ml"}, namespace="ml-prod", parallelism=3)
        couler.add_volume(couler.Volume("data", "data-claim"))
        couler.create_workflow_volume(couler.VolumeClaimTemplate("scratch", size="5Gi"))
        couler.add_toleration(couler.Toleration("gpu", "NoSchedule", "Exists"))
        couler.add_image_pull_secret(couler.ImagePullSecret("registry"))
        couler.set_dns("None", couler.DnsConfig(nameservers=["1.1.1.1"],
                                                options=[{"name": "ndots", "value": "2"}]))
        couler.set_security_context({"runAsUser": 1000, "fsGroup": 2000})
        couler.run_container(image="alpine:3.20", step_name="s",
                             volume_mounts=[couler.VolumeMount("data", "/data")])

    wf = build(program)
    assert wf.name == "cfg-test-v2"
    assert dict(wf.labels) == {"couler.io/user-id": "Alice-Smith", "team": "ml"}
    assert (wf.timeout_seconds, wf.ttl_seconds, wf.service_account, wf.tenant, wf.parallelism) \
        == (7200, 600, "runner", "ml-prod", 3)
    assert wf.volumes == (
        ir.Volume("data", kind=ir.VolumeKind.PVC, claim_name="data-claim"),
        ir.Volume("scratch", kind=ir.VolumeKind.CLAIM_TEMPLATE, size="5Gi",
                  access_modes=("ReadWriteOnce",)),
    )
    assert wf.tolerations == (ir.Toleration(key="gpu", operator="Exists", effect="NoSchedule"),)
    assert wf.image_pull_secrets == ("registry",)
    assert wf.dns == ir.DnsConfig(policy="None", nameservers=("1.1.1.1",),
                                  options=(("ndots", "2"),))
    assert wf.security_context == ir.SecurityContext(run_as_user=1000, fs_group=2000)
    assert step(wf, "s").volume_mounts == (ir.VolumeMount("data", "/data"),)


def test_config_defaults_salter_and_service_account() -> None:
    def program() -> None:
        couler.config_defaults(name_salter=lambda n: n + "-x1", service_account="default-sa")
        couler.config_workflow(name="salted")
        couler.run_container(image="alpine:3.20", step_name="s")

    wf = build(program)
    assert (wf.name, wf.service_account) == ("salted-x1", "default-sa")
    assert get_defaults() == Defaults()  # what the captured code set does not leak out


# --------------------------------------------------------------------------- concurrency


def test_concurrent_steps_and_the_group_after_them() -> None:
    def whalesay() -> list[couler.StepOutput]:
        return couler.run_container(image="docker/whalesay:latest", command=["cowsay", "hi"])

    def program() -> None:
        couler.run_container(image="alpine:3.20", step_name="first")
        results = couler.concurrent([whalesay, heads, tails])
        assert len(results) == 3
        couler.run_container(image="alpine:3.20", step_name="summary")

    wf = build(program)
    assert [s.name for s in wf.steps] == ["first", "whalesay", "heads", "tails", "summary"]
    for name in ("whalesay", "heads", "tails"):
        assert deps(step(wf, name)) == [("first", SUCCEEDED)]
    assert deps(step(wf, "summary")) == [
        ("whalesay", SUCCEEDED), ("heads", SUCCEEDED), ("tails", SUCCEEDED)]


def test_concurrent_same_function_twice_gets_distinct_names() -> None:
    def program() -> None:
        couler.concurrent([heads, heads])

    wf = build(program)
    assert [s.name for s in wf.steps] == ["heads", "heads-2"]


def test_concurrent_subtasks_become_inline_sub_workflows() -> None:
    def one() -> None:
        job("one-a")
        job("one-b")

    def two() -> None:
        job("two-a")
        job("two-b")

    def program() -> None:
        couler.config_workflow(name="concurrent-subtasks")
        job("first")
        couler.concurrent([one, two], subtasks=True)
        job("last")

    wf = build(program)
    assert [s.name for s in wf.steps] == ["first", "concurrent-task", "concurrent-task-2", "last"]
    t1, t2 = step(wf, "concurrent-task"), step(wf, "concurrent-task-2")
    assert isinstance(t1.body, ir.SubWorkflowSpec) and isinstance(t2.body, ir.SubWorkflowSpec)
    assert [s.name for s in t1.body.steps] == ["one-a", "one-b"]
    assert deps(t1.body.steps[1]) == [("one-a", SUCCEEDED)]
    assert deps(t1.body.steps[0]) == []
    assert deps(t1) == deps(t2) == [("first", SUCCEEDED)]
    assert deps(step(wf, "last")) == [("concurrent-task", SUCCEEDED),
                                      ("concurrent-task-2", SUCCEEDED)]


# --------------------------------------------------------------------------- resources and options


def test_resources_identical_requests_and_limits() -> None:
    def program() -> None:
        couler.run_container(image="python:3.12-slim", step_name="train",
                             resources={"cpu": "2", "memory": "4Gi", "gpu": 1})
        couler.run_container(image="python:3.12-slim", step_name="split",
                             resources={"requests": {"cpu": "500m", "memory": "1Gi"},
                                        "limits": {"cpu": 2, "memory": "2Gi",
                                                   "amd.com/gpu": 2}})

    wf = build(program)
    assert step(wf, "train").resources == ir.Resources(
        cpu_request="2", cpu_limit="2", memory_request="4Gi", memory_limit="4Gi", gpu=1)
    assert step(wf, "split").resources == ir.Resources(
        cpu_request="500m", cpu_limit="2", memory_request="1Gi", memory_limit="2Gi", gpu=2,
        gpu_resource="amd.com/gpu")


def test_step_options_map_onto_the_ir() -> None:
    retry = ir.RetryPolicy(limit=4, backoff=ir.Backoff(base_seconds=10, factor=2))

    def program() -> None:
        couler.run_container(
            image="python:3.12-slim", command="python", step_name="train", timeout=1800,
            retry=retry, cache=couler.Cache(name="train-cache", key="v1", max_age="1h"),
            node_selector={"pool": "gpu"}, image_pull_policy=couler.ImagePullPolicy.Always,
            working_dir="/work", daemon=True, parallelism=2, pool="ignored",
            enable_ulogfs=False, tolerations=[couler.Toleration("gpu", "NoSchedule")],
            priority=5, labels={"tier": "train"})
        couler.run_script(image="python:3.12-slim", source="print(1)", step_name="s", retry=3,
                          cache=couler.Cache("c", "k", "1d"), timeout="5m",
                          image_pull_policy="ifnotpresent")

    wf = build(program)
    t = step(wf, "train")
    assert isinstance(t.body, ir.ContainerSpec)
    assert (t.body.command, t.body.working_dir, t.body.image_pull_policy) == (
        ("python",), "/work", "Always")
    assert (t.timeout_seconds, t.retry, t.daemon, t.parallelism, t.priority) == (
        1800, retry, True, 2, 5)
    assert t.cache == ir.CachePolicy(enabled=True, key="v1", name="train-cache",
                                     max_age_seconds=3600)
    assert dict(t.node_selector) == {"pool": "gpu"} and dict(t.labels) == {"tier": "train"}
    assert t.tolerations == (ir.Toleration(key="gpu", effect="NoSchedule"),)
    s = step(wf, "s")
    assert s.retry == ir.RetryPolicy(limit=3)
    assert s.cache is not None and s.cache.max_age_seconds == 86400
    assert s.timeout_seconds == 300
    assert isinstance(s.body, ir.ScriptSpec) and s.body.image_pull_policy == "IfNotPresent"


def test_env_from_is_refused_not_dropped() -> None:
    def program() -> None:
        couler.run_container(image="alpine:3.20", env_from=[{"configMapRef": {"name": "x"}}])

    with pytest.raises(UserError, match="env_from is not supported yet"):
        build(program)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"resources": {"disk": "1Gi"}}, "unsupported key 'disk'"),
    ({"retry": "3"}, "retry must be an int"),
    ({"cache": couler.Cache("c", "k", "soon")}, "is not a duration"),
    ({"image_pull_policy": "sometimes"}, "image_pull_policy"),
    ({"timeout": 0}, "must be positive"),
])
def test_bad_options_raise_user_errors(kwargs: dict[str, Any], message: str) -> None:
    def program() -> None:
        couler.run_container(image="alpine:3.20", **kwargs)

    with pytest.raises(UserError, match=message):
        build(program)


# --------------------------------------------------------------------------- map


def test_map_over_static_items() -> None:
    def train(size: object) -> list[couler.StepOutput]:
        return couler.run_container(image="python:3.12-slim", args=["--batch", size],
                                    step_name="train")

    def program() -> None:
        couler.run_container(image="alpine:3.20", step_name="prepare")
        couler.map(lambda size: train(size), [16, 32, 64])
        couler.run_container(image="alpine:3.20", step_name="collect")

    wf = build(program)
    t = step(wf, "train")
    assert t.foreach == ir.ForEach(items=tuple(ir.Literal.of(v) for v in (16, 32, 64)))
    assert inputs(t) == [
        ("para-train-0", ir.Literal.of("--batch"), ir.ValueType.STRING),
        ("para-train-1", ir.ItemRef(), ir.ValueType.INT),
    ]
    assert deps(t) == [("prepare", SUCCEEDED)]
    assert deps(step(wf, "collect")) == [("train", SUCCEEDED)]


def test_map_over_zipped_lists() -> None:
    def train(lr: object, batch: object) -> list[couler.StepOutput]:
        return couler.run_container(image="python:3.12-slim", command=["python", "-m", "train"],
                                    args=[lr, batch], step_name="train")

    def program() -> None:
        couler.map(lambda lr, batch: train(lr, batch), [0.1, 0.01, 0.001], [32, 64, 128],
                   parallelism=2)

    (t,) = build(program).steps
    assert t.foreach == ir.ForEach(items=(
        ir.Literal.of({"0": 0.1, "1": 32}), ir.Literal.of({"0": 0.01, "1": 64}),
        ir.Literal.of({"0": 0.001, "1": 128})), parallelism=2)
    assert inputs(t) == [("para-train-0", ir.ItemRef("0"), ir.ValueType.FLOAT),
                         ("para-train-1", ir.ItemRef("1"), ir.ValueType.INT)]


def test_map_over_an_upstream_output() -> None:
    def shards() -> None:
        import json

        print(json.dumps(["a", "b", "c"]))

    def program() -> None:
        listing = couler.run_script(image="python:3.12-alpine", source=shards,
                                    step_name="list-shards")
        couler.map(lambda shard: couler.run_container(
            image="alpine:3.20", command=["echo"], args=[shard], step_name="process"),
            listing, parallelism=4)

    wf = build(program)
    listing, process = wf.steps
    assert process.foreach == ir.ForEach(source=ir.StepOutputRef("list-shards", "result"),
                                         parallelism=4)
    assert inputs(process) == [("para-process-0", ir.ItemRef(), ir.ValueType.STRING)]
    assert deps(process) == [("list-shards", SUCCEEDED)]
    assert listing.outputs == (ir.OutputParameter("result", ir.OutputSource.STDOUT,
                                                  type=ir.ValueType.LIST),)


def test_map_errors() -> None:
    with pytest.raises(UserError, match="differ in length"):
        build(lambda: couler.map(lambda a, b: say(a), [1, 2], [1]))
    with pytest.raises(UserError, match="must create exactly one step"):
        build(lambda: couler.map(lambda a: (say(a), say(a)), [1, 2]))
    with pytest.raises(UserError, match="empty"):
        build(lambda: couler.map(lambda a: say(a), []))


# --------------------------------------------------------------------------- workflow parameters


def test_workflow_parameters_as_args_and_when_operands() -> None:
    with couler.workflow("workflow-parameters", parameters={"mode": "full"}) as wf:
        dataset = couler.workflow_parameter("dataset", default="s3://data/train.csv")
        epochs = couler.workflow_parameter("epochs", default=10)
        lr = couler.workflow_parameter("lr", type=float)
        couler.run_container(image="python:3.12-slim", command=["python", "-m", "train"],
                             args=[dataset, epochs, lr], step_name="train")
        couler.when(couler.equal(wf.parameter("mode"), "full"), lambda: couler.run_container(
            image="alpine:3.20", step_name="full-report"))

    result = wf.to_ir()
    assert result.parameters == (
        ir.Parameter("mode", ir.ValueType.STRING, ir.Literal.of("full")),
        ir.Parameter("dataset", ir.ValueType.STRING, ir.Literal.of("s3://data/train.csv")),
        ir.Parameter("epochs", ir.ValueType.INT, ir.Literal.of(10)),
        ir.Parameter("lr", ir.ValueType.FLOAT),
    )
    assert inputs(step(result, "train")) == [
        ("para-train-0", ir.WorkflowParamRef("dataset"), ir.ValueType.STRING),
        ("para-train-1", ir.WorkflowParamRef("epochs"), ir.ValueType.INT),
        ("para-train-2", ir.WorkflowParamRef("lr"), ir.ValueType.FLOAT),
    ]
    assert step(result, "full-report").when == ir.When(ir.Condition(
        ir.WorkflowParamRef("mode"), ir.CompareOp.EQ, ir.Literal.of("full")))


def test_workflow_parameter_type_mismatch_is_refused() -> None:
    with couler.workflow("p"), pytest.raises(UserError, match="is not of type int"):
        couler.workflow_parameter("n", default="ten", type=int)


def test_a_parameter_declared_by_config_workflow_is_named_by_workflow_parameter() -> None:
    with couler.workflow("cfg", parameters={"env": "dev"}) as wf:
        env = couler.workflow_parameter("env")  # only the name: the one declared above
        couler.run_container(image="alpine", command=["echo"], args=[env], step_name="show")
        with pytest.raises(UserError, match=r"declared twice with different definitions "
                                            r"\(string, default \"dev\" and int, default 3\)"):
            couler.workflow_parameter("env", default=3)
    result = wf.to_ir()
    assert result.parameters == (ir.Parameter("env", ir.ValueType.STRING, ir.Literal.of("dev")),)
    assert inputs(step(result, "show"))[0][1] == ir.WorkflowParamRef("env")


# --------------------------------------------------------------------------- run_job


MANIFEST = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  generateName: mnist-
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
"""


def test_run_job_apply_with_yaml_manifest_and_env() -> None:
    def program() -> None:
        outs = couler.run_job(manifest=MANIFEST, success_condition="status.succeeded > 0",
                              failure_condition="status.failed > 0", action="apply",
                              env={"EPOCHS": 3}, step_name="mnist")
        assert [o.name for o in outs] == ["job-name", "job-id", "job-obj"]
        couler.run_container(image="alpine:3.20", args=[outs[0]], step_name="report")

    wf = build(program)
    mnist = step(wf, "mnist")
    assert isinstance(mnist.body, ir.JobSpec)
    assert mnist.body.action == ir.JobAction.APPLY
    assert mnist.body.success_condition == "status.succeeded > 0"
    assert mnist.body.manifest_dict == {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"generateName": "mnist-"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}},
                 "env": [{"name": "EPOCHS", "value": "3"}]},
    }
    assert mnist.outputs == (
        ir.OutputParameter("job-name", ir.OutputSource.JSON_PATH, "{.metadata.name}"),
        ir.OutputParameter("job-id", ir.OutputSource.JSON_PATH, "{.metadata.uid}"),
        ir.OutputParameter("job-obj", ir.OutputSource.JQ, "."),
    )
    assert step(wf, "report").inputs[0].value == ir.StepOutputRef("mnist", "job-name")


def test_run_job_dict_manifest_name_and_bad_action() -> None:
    manifest = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "Nightly_Job"}}

    def program() -> None:
        couler.run_job(manifest, "status.succeeded > 0", "status.failed > 0")

    (s,) = build(program).steps
    assert s.name == "program"  # the calling function names it
    assert isinstance(s.body, ir.JobSpec) and s.body.action == ir.JobAction.CREATE
    assert manifest == {"apiVersion": "batch/v1", "kind": "Job",
                        "metadata": {"name": "Nightly_Job"}}  # not mutated
    with pytest.raises(UserError, match="action 'upsert'"):
        build(lambda: couler.run_job(manifest, "", "", action="upsert"))
