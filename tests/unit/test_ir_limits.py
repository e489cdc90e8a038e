"""The size limits of a workflow (``couler.ir.limits``): what is measured, and how it is said."""

from __future__ import annotations

import dataclasses

import pytest

from couler import ir
from couler.errors import ValidationError
from couler.ir.limits import (
    DEFAULT_LIMITS,
    MAX_ISSUES,
    SizeLimits,
    check_sizes,
    json_depth,
    size_issues,
)

SMALL = SizeLimits(max_value_bytes=1024, max_workflow_bytes=64 * 1024, max_steps=10,
                   max_depth=3)


def container(name: str, *args: str, **fields: object) -> ir.Step:
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", command=("echo",),
                                                    args=args), **fields)  # type: ignore[arg-type]


def wf(*steps: ir.Step, **fields: object) -> ir.Workflow:
    return ir.Workflow(name="sizes", steps=steps, **fields)  # type: ignore[arg-type]


def test_a_workflow_within_the_limits_passes() -> None:
    w = wf(container("a", "x" * 1024), container("b", "y"))
    assert size_issues(w, SMALL) == []
    check_sizes(w, SMALL)


@pytest.mark.parametrize(("step", "field"), [
    (container("a", "ok", "x" * 1025), "args[1]"),
    (ir.Step(name="a", body=ir.ContainerSpec(image="alpine", command=("sh", "z" * 2000))),
     "command[1]"),
    (ir.Step(name="a", body=ir.ScriptSpec(image="python", source="#" * 5000)), "source"),
    (container("a", env=(ir.EnvVar("BIG", "v" * 2000),)), "env.BIG"),
    (container("a", inputs=(ir.InputParameter("p", ir.Literal.of("q" * 2000)),)), "inputs.p"),
    (ir.Step(name="a", body=ir.JobSpec(manifest='{"k": "' + "m" * 2000 + '"}')), "manifest"),
    (container("a", outputs=(ir.OutputParameter("o", selector="/" + "s" * 2000),)),
     "outputs.o.selector"),
    (container("a", foreach=ir.ForEach(items=(ir.Literal.of(1), ir.Literal.of("i" * 2000)))),
     "foreach.items[1]"),
])
def test_each_kind_of_value_is_measured_and_named(step: ir.Step, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        check_sizes(wf(step), SMALL)
    (issue,) = info.value.issues
    assert (issue.workflow, issue.step, issue.field) == ("sizes", "a", field)
    assert "over the limit of 1 KiB per value" in issue.message
    # the message names workflow, step, field and limit
    assert f"workflow 'sizes', step 'a', field '{field}'" in str(info.value)


def test_bytes_are_counted_not_characters() -> None:
    # 300 four-byte characters: 300 characters, 1200 bytes
    w = wf(container("a", "\U0001F600" * 300))
    assert [i.field for i in size_issues(w, SMALL)] == ["args[0]"]
    assert "1200 bytes" in size_issues(w, SMALL)[0].message
    assert size_issues(wf(container("a", "é" * 300)), SMALL) == []  # 600 bytes


def test_parameters_defaults_and_run_values() -> None:
    w = wf(container("a"), parameters=(
        ir.Parameter("big", default=ir.Literal.of("d" * 2000)),
        ir.Parameter("choice", enum=(ir.Literal.of("e" * 2000),)),
    ))
    fields = [i.field for i in size_issues(w, SMALL, parameters={"run": "r" * 2000,
                                                                  "ok": "fine"})]
    assert fields == ["parameters.run", "parameters.big.default", "parameters.choice.enum[0]"]


def test_nested_steps_and_exit_hooks_are_measured_without_recursion() -> None:
    inner = container("deep", "x" * 2000)
    for level in range(5):  # 6 levels: over max_depth 3
        inner = ir.Step(name=f"level{level}", body=ir.SubWorkflowSpec(
            name=f"level{level}", steps=(inner,)))
    hook = ir.ExitHook(on=ir.RunStatus.FAILED, steps=(container("notify", "h" * 2000),))
    issues = size_issues(wf(inner, exit_hooks=(hook,)), SMALL)
    where = {(i.step, i.field) for i in issues}
    assert ("deep", "args[0]") in where and ("notify", "args[0]") in where
    assert any("nest 4 deep, over the limit of 3" in i.message for i in issues)


def test_the_step_count_and_the_encoded_size() -> None:
    many = wf(*(container(f"s{i}") for i in range(11)))
    (issue,) = size_issues(many, SMALL)
    assert issue.field == "steps" and "11 steps is over the limit of 10" in issue.message
    (issue,) = size_issues(wf(container("a")), SMALL, encoded_bytes=64 * 1024 + 1)
    assert issue.message == ("the workflow is 65537 bytes encoded, over the limit of 64 KiB")


def test_many_problems_are_listed_up_to_a_bound_and_counted() -> None:
    w = wf(*(container(f"s{i}", "x" * 2000) for i in range(10)),
           parameters=tuple(ir.Parameter(f"p{i}", default=ir.Literal.of("d" * 2000))
                            for i in range(20)))
    with pytest.raises(ValidationError) as info:
        check_sizes(w, SMALL)
    assert len(info.value.issues) == MAX_ISSUES + 1
    assert info.value.issues[-1].message == "and 10 more value(s) over the size limits"


def test_the_defaults_take_a_hundred_thousand_small_steps() -> None:
    assert DEFAULT_LIMITS.max_value_bytes == 256 * 1024
    steps = tuple(container(f"s{i}", str(i)) for i in range(100_000))
    assert size_issues(wf(*steps), DEFAULT_LIMITS, encoded_bytes=5 * 1024 * 1024) == []
    assert size_issues(wf(container("a", "x" * (256 * 1024))), DEFAULT_LIMITS) == []
    assert len(size_issues(wf(container("a", "x" * (256 * 1024 + 1))), DEFAULT_LIMITS)) == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_limits_must_be_positive_ints(bad: object) -> None:
    with pytest.raises(ValueError, match="max_value_bytes must be a positive int"):
        dataclasses.replace(SMALL, max_value_bytes=bad)  # type: ignore[arg-type]


def test_deeply_nested_json_literals_are_refused_before_anything_decodes_them() -> None:
    deep = ir.Literal(json="[" * 20_000 + "]" * 20_000)  # 40 KB: within the size limit
    nested = ir.Literal(json='{"a":' * 100 + "1" + "}" * 100)
    w = wf(container("a", inputs=(ir.InputParameter("x", deep),)),
           parameters=(ir.Parameter("p", default=nested),))
    issues = size_issues(w, DEFAULT_LIMITS)
    assert [(i.step, i.field) for i in issues] == [("", "parameters.p.default"), ("a", "inputs.x")]
    assert "nest 100 deep, over the limit of 64" in issues[0].message
    assert "nest 20000 deep" in issues[1].message
    fine = ir.Literal.of({"rows": [[1, 2], [3, "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]]})
    assert size_issues(wf(container("a", inputs=(ir.InputParameter("x", fine),))),
                       DEFAULT_LIMITS) == []


@pytest.mark.parametrize(("text", "depth"), [
    ("1", 0), ('"[["', 0), ("[1]", 1), ('[[1], {"a": [2]}]', 3), ('["a\\"[[", [1]]', 2),
    ("[[[", 3),  # not JSON: still measured, never decoded
])
def test_json_depth(text: str, depth: int) -> None:
    assert json_depth(text) == depth
