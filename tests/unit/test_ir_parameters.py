"""Run-time parameter values checked against a workflow's declared parameters."""

from __future__ import annotations

import pytest

from couler import ir
from couler.errors import ValidationError

STEP = ir.Step(name="s", body=ir.ContainerSpec(image="alpine", command=("true",)))


def wf(*params: ir.Parameter) -> ir.Workflow:
    return ir.Workflow(name="params", steps=(STEP,), parameters=params)


def problems(workflow: ir.Workflow, values: dict[str, str]) -> list[str]:
    with pytest.raises(ValidationError) as info:
        ir.check_parameters(workflow, values)
    return [f"{i.field}: {i.message}" for i in info.value.issues]


def test_valid_values_pass() -> None:
    w = wf(ir.Parameter("n", ir.ValueType.INT, ir.Literal.of(3)),
           ir.Parameter("rate", ir.ValueType.FLOAT, ir.Literal.of(0.5)),
           ir.Parameter("fast", ir.ValueType.BOOL, ir.Literal.of(False)),
           ir.Parameter("sizes", ir.ValueType.LIST, ir.Literal.of([1])),
           ir.Parameter("cfg", ir.ValueType.JSON, ir.Literal.of({})),
           ir.Parameter("env", default=ir.Literal.of("dev"),
                        enum=(ir.Literal.of("dev"), ir.Literal.of("prod"))))
    ir.check_parameters(w, {"n": "-4", "rate": "1e-3", "fast": "TRUE", "sizes": "[2, 3]",
                            "cfg": '{"a": 1}', "env": "prod"})
    ir.check_parameters(w, {})  # every one has a default


def test_an_unknown_name_lists_the_declared_ones() -> None:
    w = wf(ir.Parameter("env", default=ir.Literal.of("dev")))
    assert problems(w, {"envv": "prod"}) == [
        "parameters.envv: no such parameter (the workflow declares: env)"]
    assert problems(wf(), {"foo": "1"}) == [
        "parameters.foo: no such parameter (the workflow declares: none)"]


def test_values_of_the_wrong_type_are_named_with_the_type() -> None:
    w = wf(ir.Parameter("n", ir.ValueType.INT, ir.Literal.of(3)),
           ir.Parameter("fast", ir.ValueType.BOOL, ir.Literal.of(False)),
           ir.Parameter("sizes", ir.ValueType.LIST, ir.Literal.of([1])),
           ir.Parameter("rate", ir.ValueType.FLOAT, ir.Literal.of(0.5)))
    found = problems(w, {"n": "abc", "fast": "yes", "sizes": '{"a": 1}', "rate": "fast"})
    assert [f.split(":")[0] for f in found] == [
        "parameters.n", "parameters.fast", "parameters.sizes", "parameters.rate"]
    assert "'abc' is not a valid int" in found[0]
    assert "expected true or false" in found[1]
    assert "expected a JSON list" in found[2]
    assert "'fast' is not a valid float" in found[3]


def test_enum_and_required_parameters() -> None:
    w = wf(ir.Parameter("env", enum=(ir.Literal.of("dev"), ir.Literal.of("prod"))),
           ir.Parameter("table"))
    found = problems(w, {"env": "staging"})
    assert found == ["parameters.env: 'staging' is not one of the allowed values (dev, prod)",
                     "parameters.table: has no default; give a value (e.g. -p table=VALUE)"]
    with pytest.raises(ValidationError, match=r"workflow 'params', field 'parameters\.env'"):
        ir.check_parameters(w, {"env": "test", "table": "t.csv"})
    ir.check_parameters(w, {"env": "dev", "table": "t.csv"})
