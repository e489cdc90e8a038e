"""Names are deterministic and independent of source lines; bodies are never silently shared."""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import couler.argo as couler
from couler import ir
from couler.api.builder import discard_implicit_builder
from couler.api.capture import capture_callable, capture_program
from couler.api.naming import image_base_name, sanitize, unique_name
from couler.api.steps import script_source
from couler.errors import UserError


@pytest.fixture(autouse=True)
def _fresh_builder() -> Iterator[None]:
    discard_implicit_builder()
    yield
    discard_implicit_builder()


def build(program: Callable[[], Any]) -> ir.Workflow:
    (wf,) = capture_callable(program)
    return wf


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(("text", "expected"), [
    ("flip_coin", "flip-coin"),
    ("Flip.Coin", "flip-coin"),
    ("__call__", "call"),
    ("a__b", "a-b"),
    ("héllo wörld!", "h-llo-w-rld"),
    ("x" * 80, "x" * 63),
    ("___", "step"),
])
def test_sanitize(text: str, expected: str) -> None:
    assert sanitize(text) == expected


@pytest.mark.parametrize(("image", "expected"), [
    ("docker/whalesay:latest", "whalesay"),
    ("python:3.12-alpine", "python"),
    ("localhost:5000/team/My_Image:1.0", "my-image"),
    ("gcr.io/proj/trainer@sha256:abc", "trainer"),
    ("alpine", "alpine"),
])
def test_image_base_name(image: str, expected: str) -> None:
    assert image_base_name(image) == expected


def test_unique_name_suffixes_and_stays_within_63_characters() -> None:
    assert unique_name("a", set()) == "a"
    assert unique_name("a", {"a"}) == "a-2"
    assert unique_name("a", {"a", "a-2"}) == "a-3"
    long = "x" * 63
    assert unique_name(long, {long}) == "x" * 61 + "-2"


# --------------------------------------------------------------------------- template names


def test_user_step_names_are_mapped_but_never_mangled() -> None:
    def program() -> None:
        couler.run_container(image="alpine:3.20", step_name="Flip_Coin.v2")

    assert [s.name for s in build(program).steps] == ["flip-coin-v2"]
    with pytest.raises(UserError, match=r"'Not_A_DNS_Name!' is not a valid name.*DNS-1123"):
        build(lambda: couler.run_container(image="alpine:3.20", step_name="Not_A_DNS_Name!"))


def test_module_level_and_lambda_calls_fall_back_to_the_image_name() -> None:
    def program() -> None:
        fn = eval("lambda: couler.run_container(image='docker/whalesay:latest')",
                  {"couler": couler})
        fn()
        [couler.run_container(image="docker/whalesay:latest") for _ in range(2)]

    wf = build(program)
    assert [s.name for s in wf.steps] == ["whalesay", "whalesay-2", "whalesay-3"]
    assert {s.template for s in wf.steps} == {"whalesay"}


def test_script_step_at_module_level_is_named_after_its_source_function() -> None:
    def random_code() -> None:
        print("x")

    (s,) = build(lambda: couler.run_script(image="python:3.12", source=random_code)).steps
    assert s.name == "random-code"


class Steps:
    """Callables of every kind, as the SDK's tests used them."""

    def __init__(self) -> None:
        self.image = "alpine:3.20"

    def bound_method(self) -> list[couler.StepOutput]:
        return couler.run_container(image=self.image, command=["echo", "bound"])

    @staticmethod
    def static_method() -> list[couler.StepOutput]:
        return couler.run_container(image="alpine:3.20", command=["echo", "static"])

    @classmethod
    def class_method(cls) -> list[couler.StepOutput]:
        return couler.run_container(image="alpine:3.20", command=["echo", cls.__name__])


class CallableStep:
    def __call__(self) -> list[couler.StepOutput]:
        return couler.run_container(image="alpine:3.20", command=["echo", "called"])


def test_callables_of_every_kind_as_exit_handlers_and_concurrent_members() -> None:
    obj = Steps()

    def program() -> None:
        couler.run_container(image="alpine:3.20", step_name="main")
        couler.concurrent([obj.bound_method, Steps.static_method, Steps.class_method,
                           CallableStep(), lambda: obj.bound_method()])  # noqa: PLW0108
        couler.set_exit_handler(couler.WFStatus.Succeeded, obj.bound_method)
        couler.set_exit_handler(couler.WFStatus.Succeeded, Steps.static_method)
        couler.set_exit_handler(couler.WFStatus.Failed, Steps.class_method)
        couler.set_exit_handler(couler.WFStatus.Error, CallableStep())

    wf = build(program)
    assert [s.name for s in wf.steps] == [
        "main", "bound-method", "static-method", "class-method", "callablestep",
        "bound-method-2"]
    hooks = {h.on: [s.name for s in h.steps] for h in wf.exit_hooks}
    assert hooks == {
        ir.RunStatus.SUCCEEDED: ["bound-method-3", "static-method-2"],
        ir.RunStatus.FAILED: ["class-method-2"],
        ir.RunStatus.ERROR: ["callablestep-2"],
    }


def test_methods_in_dag_and_set_dependencies() -> None:
    class Jobs:
        @staticmethod
        def a() -> None:
            couler.run_container(image="alpine:3.20", args=["a"], step_name="a")

        @classmethod
        def b(cls) -> None:
            couler.run_container(image="alpine:3.20", args=["b"], step_name="b")

        def c(self) -> None:
            couler.run_container(image="alpine:3.20", args=["c"], step_name="c")

    jobs = Jobs()

    def via_dag() -> None:
        couler.dag([[Jobs.a], [Jobs.a, Jobs.b], [Jobs.a, jobs.c]])

    def via_set() -> None:
        couler.set_dependencies(Jobs.a)
        couler.set_dependencies(Jobs.b, dependencies=["a"])
        couler.set_dependencies(jobs.c, dependencies=["a"])

    assert build(via_dag) == build(via_set)


def test_partial_functions_use_the_wrapped_function_frame() -> None:
    def say(word: str) -> list[couler.StepOutput]:
        return couler.run_container(image="alpine:3.20", args=[word])

    (s,) = build(lambda: couler.concurrent([functools.partial(say, "hi")])) .steps
    assert s.name == "say"


# --------------------------------------------------------------------------- no silent reuse


def test_same_function_with_different_images_gets_different_bodies() -> None:
    def run(image: str, command: list[str]) -> list[couler.StepOutput]:
        return couler.run_container(image=image, command=command)

    def program() -> None:
        run("alpine:3.20", ["echo", "one"])
        run("busybox:1.36", ["echo", "one"])
        run("alpine:3.20", ["echo", "two"])

    wf = build(program)
    assert [s.name for s in wf.steps] == ["run", "run-2", "run-3"]
    bodies = [s.body for s in wf.steps]
    assert bodies[0] != bodies[1] and bodies[0] != bodies[2]
    assert [b.image for b in bodies if isinstance(b, ir.ContainerSpec)] == [
        "alpine:3.20", "busybox:1.36", "alpine:3.20"]


# --------------------------------------------------------------------------- line independence


PROGRAM = '''
import couler.argo as couler


def flip():
    return couler.run_script(image="python:3.12", source="import random\\nprint(random.random())")


def echo(value):
    return couler.run_container(image="alpine:3.20", command=["echo"], args=[value])


couler.config_workflow(name="lines")
result = flip()
couler.when(couler.bigger(result, 0.5), lambda: echo("high"), lambda: echo("low"))
echo(result)
couler.run_container(image="docker/whalesay:latest", command=["cowsay"])
couler.exec_while(couler.equal("again"), lambda: flip())
'''


def test_inserting_blank_lines_and_comments_changes_no_name(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text(PROGRAM)
    padded = tmp_path / "padded.py"
    padded.write_text("# a comment\n\n\n" + PROGRAM.replace("\n\n", "\n\n# note\n\n\n"))
    (a,) = capture_program(str(plain))
    (b,) = capture_program(str(padded))
    assert a == b
    assert ir.to_json(a) == ir.to_json(b)
    assert [s.name for s in a.steps] == ["flip", "echo", "echo-2", "echo-3", "whalesay", "flip-2"]


# --------------------------------------------------------------------------- script sources


def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


@logged
def annotated(x: int = 3, *, label: str = "a:b") -> dict[str, int]:
    """Docstring: with a colon."""
    total: int = x + 1
    if total > 2:
        print(label, total)
    return {"total": total}


def one_liner() -> None: print("one line")  # a trailing comment


def test_run_script_takes_the_body_of_an_annotated_decorated_function() -> None:
    (s,) = build(lambda: couler.run_script(image="python:3.12", source=annotated,
                                           step_name="annotated")).steps
    assert isinstance(s.body, ir.ScriptSpec)
    assert s.body.source == textwrap.dedent('''\
        """Docstring: with a colon."""
        total: int = x + 1
        if total > 2:
            print(label, total)
        return {"total": total}
        ''')
    assert s.body.language == ir.ScriptLanguage.PYTHON
    assert s.outputs == (ir.OutputParameter("result", ir.OutputSource.STDOUT),)


def test_script_source_single_line_function_and_string_source() -> None:
    assert script_source(one_liner) == 'print("one line")  # a trailing comment\n'

    def program() -> None:
        couler.run_script(image="bash:5", command=["bash"], source="echo hi\n", step_name="sh")
        couler.run_script(image="alpine", command="sh", source="echo hi", step_name="posix")

    wf = build(program)
    bash = wf.steps[0].body
    assert isinstance(bash, ir.ScriptSpec)
    assert (bash.language, bash.command, bash.source) == (
        ir.ScriptLanguage.BASH, ("bash",), "echo hi\n")
    posix = wf.steps[1].body
    assert isinstance(posix, ir.ScriptSpec) and posix.language == ir.ScriptLanguage.SH


def test_script_source_errors() -> None:
    with pytest.raises(UserError, match=r"not a plain function|not a function definition"):
        script_source(lambda: print("x"))
    with pytest.raises(UserError, match="cannot read the source"):
        script_source(print)
    with pytest.raises(UserError, match="interpreter 'node'"):
        build(lambda: couler.run_script(image="node:20", command=["node"], source="1"))
    with pytest.raises(UserError, match="needs source"):
        build(lambda: couler.run_script(image="python:3.12"))


def test_name_registry_suffixes_and_rolls_back() -> None:
    from couler.api.naming import NameRegistry

    names = NameRegistry()
    assert [names.take("job") for _ in range(3)] == ["job", "job-2", "job-3"]
    mark = names.mark()
    assert names.take("job") == "job-4"
    assert names.take("other") == "other"
    names.rollback(mark)
    assert "job-4" not in names and "other" not in names
    assert names.take("job") == "job-4"
    assert names.take("other") == "other"
    # A name taken explicitly is skipped by the suffix counter.
    assert names.take("x-2") == "x-2"
    assert names.take("x") == "x"
    assert names.take("x") == "x-3"


def test_many_steps_with_one_name_are_numbered_in_order() -> None:
    import couler.argo as couler

    with couler.workflow("many") as wf:
        for _ in range(2000):
            couler.run_container(image="alpine", command=["true"], step_name="job")
        workflow = wf.to_ir()
    names = [s.name for s in workflow.steps]
    assert names[:3] == ["job", "job-2", "job-3"] and names[-1] == "job-2000"
    assert len(set(names)) == 2000
