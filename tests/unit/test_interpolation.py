"""Handles formatted into strings (f-strings, ``%``, ``str.format``) become engine placeholders.

A map item, a step output or a workflow parameter formatted into a step's args,
command or env is an input of the step and its placeholder in the text; every
compiler renders the placeholder natively. Where no engine can fill a value in
(an image, a name, a script source) the build fails naming the step and field,
and what would need the value now (a format spec, ``%d``) fails at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import couler.argo as couler
from couler import ir
from couler.api.builder import discard_implicit_builder
from couler.api.capture import capture_callable
from couler.compilers import airflow, argo, tekton
from couler.errors import UserError
from tests.argo_schema import validate_argo


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    discard_implicit_builder()
    yield
    discard_implicit_builder()


def build(program: Callable[[], Any]) -> ir.Workflow:
    (wf,) = capture_callable(program)
    return wf


def step(wf: ir.Workflow, name: str) -> ir.Step:
    found = wf.step(name)
    assert found is not None, [s.name for s in wf.steps]
    return found


def sources(s: ir.Step) -> dict[str, ir.ValueSource]:
    return {i.name: i.value for i in s.inputs}


def square_map() -> None:
    def square(x: object) -> object:
        return couler.run_container(image="python:3.12-alpine", command=["python3", "-c"],
                                    args=["print(%s*%s)" % (x, x)],  # noqa: UP031 - SDK style
                                    step_name="square")

    couler.map(lambda v: square(v), [2, 3, 4])  # noqa: PLW0108 - as the SDK's examples write it


def test_a_map_item_formatted_with_percent_is_one_input_and_its_placeholder() -> None:
    sq = step(build(square_map), "square")
    assert isinstance(sq.body, ir.ContainerSpec)
    assert sq.body.args == ("print({{inputs.para-square-0}}*{{inputs.para-square-0}})",)
    assert sources(sq) == {"para-square-0": ir.ItemRef()}
    assert "Handle" not in repr(sq.body)  # no Python repr reaches the workflow


def test_step_output_and_parameter_in_fstrings_format_and_env_feed_inputs() -> None:
    def program() -> None:
        lr = couler.workflow_parameter("lr", 0.1)
        out = couler.run_script(image="python:3.12", source="print('m.bin')", step_name="fit")
        couler.run_container(image="alpine", command=["sh", "-c", f"cp {out} /out/"],
                             args=[f"--lr={lr}", "--model={}".format(out[0])],  # noqa: UP032
                             env={"MODEL": f"path={out}"}, step_name="serve")

    wf = build(program)
    serve = step(wf, "serve")
    assert isinstance(serve.body, ir.ContainerSpec)
    by_source = {v: k for k, v in sources(serve).items()}
    model = by_source[ir.StepOutputRef("fit", "result")]
    lr = by_source[ir.WorkflowParamRef("lr")]
    assert serve.body.args == (f"--lr={{{{inputs.{lr}}}}}", f"--model={{{{inputs.{model}}}}}")
    assert serve.body.command == ("sh", "-c", f"cp {{{{inputs.{model}}}}} /out/")
    assert [(e.name, e.value) for e in serve.env] == [("MODEL", f"path={{{{inputs.{model}}}}}")]
    assert [d.step for d in serve.dependencies] == ["fit"]  # reading an output is an edge
    assert len(serve.inputs) == 2  # one input per handle, shared by every field


def test_literal_placeholder_text_next_to_a_handle_stays_literal() -> None:
    def program() -> None:
        out = couler.run_script(image="python:3.12", source="print(1)", step_name="one")
        couler.run_container(image="alpine", command=["echo"], args=[f"{out} {{{{x}}}}"],
                             step_name="echo")

    e = step(build(program), "echo")
    assert isinstance(e.body, ir.ContainerSpec)
    (arg,) = e.body.args
    literal = [i for i in e.inputs if isinstance(i.value, ir.Literal)]
    assert len(literal) == 1 and literal[0].value.value == " {{x}}"
    assert arg.endswith(f"{{{{inputs.{literal[0].name}}}}}") and "{{x}}" not in arg


def test_every_compiler_renders_the_placeholders_in_place() -> None:
    wf = build(square_map)
    doc = argo.compile_workflow(wf)
    assert validate_argo(doc) == []
    (template,) = [t for t in doc["spec"]["templates"] if t["name"] == "square"]
    assert template["container"]["args"] == [
        "print({{inputs.parameters.para-square-0}}*{{inputs.parameters.para-square-0}})"]
    (pipeline,) = [d for d in tekton.compile_workflow(wf) if d["kind"] == "Pipeline"]
    (task,) = pipeline["spec"]["tasks"]
    assert task["taskSpec"]["steps"][0]["args"] == [
        "print($(params.para-square-0)*$(params.para-square-0))"]
    src = airflow.compile_workflow(wf)
    assert "print({{inputs.para-square-0}}*{{inputs.para-square-0}})" in src  # the runner fills


@pytest.mark.parametrize(("field", "program"), [
    ("body.image", lambda out: couler.run_container(image=f"repo/{out}", command=["true"],
                                                    step_name="use")),
    ("body.source", lambda out: couler.run_script(image="python", source=f"print('{out}')",
                                                  step_name="use")),
    ("labels", lambda out: couler.run_container(image="alpine", command=["true"],
                                                labels={"v": f"{out}"}, step_name="use")),
])
def test_a_handle_where_no_engine_fills_it_is_refused_naming_step_and_field(
        field: str, program: Callable[[object], object]) -> None:
    def build_it() -> None:
        out = couler.run_script(image="python:3.12", source="print(1)", step_name="one")
        program(out)

    with pytest.raises(UserError) as err:
        build(build_it)
    text = str(err.value)
    assert "step 'use'" in text and f"field {field!r}" in text and "step='one'" in text


def test_a_handle_in_a_step_name_is_refused() -> None:
    def program() -> None:
        out = couler.run_script(image="python:3.12", source="print(1)", step_name="one")
        couler.run_container(image="alpine", command=["true"], step_name=f"use-{out}")

    with pytest.raises(UserError, match="names are fixed when the workflow is built"):
        build(program)


def test_what_needs_the_value_now_fails_at_once() -> None:
    def spec() -> None:
        lr = couler.workflow_parameter("lr", 0.1)
        couler.run_container(image="alpine", command=["echo"], args=[f"{lr:.3f}"])

    with pytest.raises(UserError, match=r"formatted with '\.3f'.*known only when the workflow"):
        build(spec)

    def number() -> None:
        def use(x: object) -> object:
            return couler.run_container(image="alpine", command=["echo"], args=["%d" % x])  # noqa: UP031
        couler.map(use, [1, 2])

    with pytest.raises(UserError, match=r"used as a number .*use %s or \{\}"):
        build(number)


def test_an_artifact_formatted_into_args_says_it_is_a_file() -> None:
    def program() -> None:
        art = couler.create_local_artifact(path="/tmp/model.bin")
        (model,) = couler.run_container(image="alpine", command=["true"], output=art,
                                        step_name="fit")
        couler.run_container(image="alpine", command=["cat"], args=[f"{model}"], step_name="use")

    with pytest.raises(UserError, match=r"artifact .* is a file, not a value"):
        build(program)


def test_the_list_a_step_returns_formats_as_its_first_output() -> None:
    def program() -> None:
        out = couler.run_script(image="python:3.12", source="print(1)", step_name="one")
        couler.run_container(image="alpine", command=["echo"], args=[f"n={out}"],
                             step_name="use")

    use = step(build(program), "use")
    assert sources(use) == {"para-use-0": ir.StepOutputRef("one", "result")}


def test_a_handle_from_another_workflow_is_refused() -> None:
    with couler.workflow("first"):
        leaked = str(couler.workflow_parameter("lr", 0.1))
    discard_implicit_builder()

    def program() -> None:
        couler.run_container(image="alpine", command=["echo"], args=[f"--lr={leaked}"],
                             step_name="use")

    with pytest.raises(UserError, match="formatted while building another workflow"):
        build(program)


def test_formatting_outside_any_workflow_shows_the_handle() -> None:
    with couler.workflow("alone"):
        lr = couler.workflow_parameter("lr", 0.1)
    discard_implicit_builder()
    assert str(lr).count("couler-ref") == 1  # its workflow still resolves it
    assert "Handle" not in str(lr)
