"""The protobuf codec and the canonical JSON form round-trip every IR value exactly."""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from couler import ir
from couler.errors import InvalidWorkflowError
from couler.ir import model
from couler.v1 import workflow_pb2 as pb
from couler_runtime.codec import (
    step_from_proto,
    step_to_proto,
    workflow_from_proto,
    workflow_to_proto,
)
from tests.ir_strategies import steps, workflows

ROUND_TRIP = settings(max_examples=200, deadline=None)


def proto_round_trip(wf: ir.Workflow) -> ir.Workflow:
    wire = workflow_to_proto(wf).SerializeToString()
    return workflow_from_proto(pb.Workflow.FromString(wire))


# --------------------------------------------------------------------------- properties


@ROUND_TRIP
@given(workflows())
def test_proto_round_trip_is_exact(wf: ir.Workflow) -> None:
    back = proto_round_trip(wf)
    assert back == wf
    # Equality treats -0.0 as 0.0; the canonical text tells them apart.
    assert ir.to_json(back) == ir.to_json(wf)


@ROUND_TRIP
@given(workflows())
def test_json_round_trip_is_exact_and_stable(wf: ir.Workflow) -> None:
    text = ir.to_json(wf)
    back = ir.from_json(ir.Workflow, text)
    assert back == wf
    assert ir.to_json(back) == text
    assert ir.digest(back) == ir.digest(wf)


@settings(max_examples=50, deadline=None)
@given(steps())
def test_step_round_trip(step: ir.Step) -> None:
    assert step_from_proto(pb.Step.FromString(step_to_proto(step).SerializeToString())) == step


def _walk(value: object) -> Iterator[object]:
    """Every dataclass, enum member and field value reachable from ``value``."""
    yield value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _walk(getattr(value, f.name))
    elif isinstance(value, tuple):
        for item in value:
            yield from _walk(item)


def _optional_fields() -> set[tuple[type, str]]:
    """(class, field) for every ``X | None`` field of the IR."""
    out = set()
    for cls in _ir_dataclasses():
        hints = typing.get_type_hints(cls, vars(model))
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints[f.name])
            origin = typing.get_origin(hints[f.name])
            if origin in (typing.Union, types.UnionType) and type(None) in args:
                out.add((cls, f.name))
    return out


def _ir_dataclasses() -> list[type]:
    return [
        obj
        for obj in vars(model).values()
        if isinstance(obj, type)
        and dataclasses.is_dataclass(obj)
        and obj.__module__ == model.__name__
    ]


def test_strategies_cover_the_whole_ir() -> None:
    """The strategies reach every dataclass, enum value, and both states of every optional."""
    classes: set[type] = set()
    members: set[enum.Enum] = set()
    optional_states: set[tuple[type, str, bool]] = set()

    # 500: with tune specs (Tune, TuneParam and their enums) the IR has more to reach
    @settings(max_examples=500, deadline=None, derandomize=True, database=None)
    @given(workflows())
    def collect(wf: ir.Workflow) -> None:
        for v in _walk(wf):
            if isinstance(v, enum.Enum):
                members.add(v)
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                classes.add(type(v))
                for f in dataclasses.fields(v):
                    optional_states.add((type(v), f.name, getattr(v, f.name) is None))

    collect()
    assert set(_ir_dataclasses()) - classes == set()
    all_members = {
        m
        for obj in vars(model).values()
        if isinstance(obj, type) and issubclass(obj, enum.Enum) and obj.__module__ == model.__name__
        for m in obj
    }
    assert all_members - members == set()
    wanted = {(c, n, none) for c, n in _optional_fields() for none in (True, False)}
    assert wanted - optional_states == set()


# --------------------------------------------------------------------------- examples


def _workflow(*steps: ir.Step, **kwargs: typing.Any) -> ir.Workflow:
    return ir.Workflow(name="wf", steps=steps, **kwargs)


def test_none_and_defaults_are_distinct() -> None:
    step = ir.Step(
        name="s",
        body=ir.ContainerSpec(image="i"),
        retry=ir.RetryPolicy(limit=0, backoff=ir.Backoff(base_seconds=-0.0, factor=0.0)),
        cache=ir.CachePolicy(enabled=False, max_age_seconds=0),
        timeout_seconds=0,
        priority=None,
        when=ir.When(ir.Condition(ir.ItemRef(), ir.CompareOp.EQ, ir.Literal("")), expect=False),
    )
    wf = _workflow(step, security_context=ir.SecurityContext(run_as_non_root=False, fs_group=0))
    back = proto_round_trip(wf)
    assert back == wf
    s = back.steps[0]
    assert s.timeout_seconds == 0 and s.priority is None
    assert s.cache is not None and s.cache.max_age_seconds == 0 and s.cache.enabled is False
    assert s.retry is not None and s.retry.backoff is not None
    assert str(s.retry.backoff.base_seconds) == "-0.0"
    assert back.security_context == ir.SecurityContext(run_as_non_root=False, fs_group=0)


def test_absent_proto_fields_decode_to_ir_defaults() -> None:
    cond = pb.Condition(
        left=pb.ValueSource(item=pb.ItemRef()),
        op=pb.COMPARE_OP_EQ,
        right=pb.ValueSource(literal=pb.Literal(json="1")),
    )
    msg = pb.Workflow(
        name="wf",
        steps=[
            pb.Step(
                name="s",
                script=pb.ScriptSpec(image="i", source="print(1)"),
                outputs=[pb.OutputParameter(name="o")],
                retry=pb.RetryPolicy(limit=1, backoff=pb.Backoff(), on=[pb.FAILURE_CLASS_ANY]),
                resources=pb.Resources(),
                cache=pb.CachePolicy(),
                tolerations=[pb.Toleration()],
                when=pb.When(condition=cond),
                loop=pb.Loop(condition=cond),
                dependencies=[pb.Dependency(step="t")],
                depends=pb.DependsExpr(term=pb.DependsTerm(step="t")),
            ),
            pb.Step(name="j", job=pb.JobSpec(manifest="{}")),
        ],
        volumes=[pb.Volume(name="v")],
        schedule=pb.CronSchedule(schedule="@daily"),
        parameters=[pb.Parameter(name="p")],
        exit_hooks=[pb.ExitHook(on=pb.RUN_STATUS_ANY)],
    )
    c = ir.Condition(ir.ItemRef(), ir.CompareOp.EQ, ir.Literal("1"))
    expected = ir.Workflow(
        name="wf",
        steps=(
            ir.Step(
                name="s",
                body=ir.ScriptSpec(image="i", source="print(1)"),
                outputs=(ir.OutputParameter(name="o"),),
                retry=ir.RetryPolicy(limit=1, backoff=ir.Backoff()),
                resources=ir.Resources(),
                cache=ir.CachePolicy(),
                tolerations=(ir.Toleration(),),
                when=ir.When(c),
                loop=ir.Loop(c),
                dependencies=(ir.Dependency("t"),),
                depends=ir.DependsTerm("t"),
            ),
            ir.Step(name="j", body=ir.JobSpec(manifest="{}")),
        ),
        volumes=(ir.Volume(name="v"),),
        schedule=ir.CronSchedule(schedule="@daily"),
        parameters=(ir.Parameter(name="p"),),
        exit_hooks=(ir.ExitHook(on=ir.RunStatus.ANY, steps=()),),
    )
    assert workflow_from_proto(msg) == expected


def test_nested_subworkflows_and_depends_round_trip() -> None:
    FAILED = ir.EdgeCondition.FAILED
    expr = ir.DependsAny(
        (
            ir.DependsAll((ir.DependsTerm("a"), ir.DependsNot(ir.DependsTerm("b", FAILED)))),
            ir.DependsNot(ir.DependsAny(())),
        )
    )
    inner = ir.Step("inner", ir.ContainerSpec("i"), depends=expr, labels=(("ключ", "值"),))
    middle = ir.Step("middle", ir.SubWorkflowSpec("m", steps=(inner,)))
    outer = ir.Step("outer", ir.SubWorkflowSpec("o", steps=(middle,), digest="sha256:0"))
    wf = _workflow(outer, ir.Step("ref", ir.SubWorkflowSpec("other")))
    assert proto_round_trip(wf) == wf


def _step_with(**fields: typing.Any) -> pb.Step:
    return pb.Step(name="s", container=pb.ContainerSpec(image="i"), **fields)


_ITEM = pb.ValueSource(item=pb.ItemRef())


@pytest.mark.parametrize(
    ("step", "field"),
    [
        (pb.Step(name="s"), "Step.body"),
        (_step_with(inputs=[pb.InputParameter(name="x")]), "InputParameter.value"),
        (_step_with(input_artifacts=[pb.InputArtifact(name="a")]), "InputArtifact.source"),
        (_step_with(depends=pb.DependsExpr()), "Step.depends"),
        (_step_with(depends={"all_of": {"terms": [{}]}}), "DependsAll.terms"),
        (_step_with(depends={"any_of": {"terms": [{}]}}), "DependsAny.terms"),
        (_step_with(depends={"negation": {}}), "DependsNot.term"),
        (_step_with(when=pb.When()), "When.condition"),
        (_step_with(loop=pb.Loop()), "Loop.condition"),
        (_step_with(when={"condition": {"left": _ITEM, "op": "COMPARE_OP_EQ"}}), "Condition.right"),
        (_step_with(when={"condition": {"right": _ITEM, "op": "COMPARE_OP_EQ"}}), "Condition.left"),
        (_step_with(when={"condition": {"left": _ITEM, "right": _ITEM}}), "Condition.op"),
        (_step_with(retry=pb.RetryPolicy(on=[pb.FAILURE_CLASS_UNSPECIFIED])), "RetryPolicy.on"),
    ],
)
def test_malformed_step_names_the_field(step: pb.Step, field: str) -> None:
    with pytest.raises(InvalidWorkflowError, match=re.escape(f"field '{field}' is not set")) as e:
        workflow_from_proto(pb.Workflow(name="wf", steps=[step]))
    assert str(e.value).startswith("workflow 'wf', step 's', ")


def test_exit_hook_needs_a_status() -> None:
    with pytest.raises(InvalidWorkflowError, match=re.escape("field 'ExitHook.on' is not set")):
        workflow_from_proto(pb.Workflow(name="wf", exit_hooks=[pb.ExitHook()]))


def test_unset_oneof_error_names_step_path_and_options() -> None:
    inner = pb.Step(name="inner")
    outer = pb.Step(name="outer", subworkflow=pb.SubWorkflowSpec(name="sub", steps=[inner]))
    with pytest.raises(InvalidWorkflowError) as info:
        workflow_from_proto(pb.Workflow(name="wf", steps=[outer]))
    assert str(info.value) == (
        "workflow 'wf', step 'outer', step 'inner', field 'Step.body' is not set; "
        "expected one of: container, script, job, subworkflow"
    )


def test_unknown_enum_value_is_rejected() -> None:
    msg = pb.Workflow(name="wf", steps=[_step_with(outputs=[pb.OutputParameter(name="o")])])
    msg.steps[0].outputs[0].type = 99  # proto3 enums are open: unknown values survive
    with pytest.raises(
        InvalidWorkflowError, match=re.escape("'OutputParameter.type' has unknown value 99")
    ):
        workflow_from_proto(pb.Workflow.FromString(msg.SerializeToString()))


def test_int_outside_int64_is_reported_not_crashed() -> None:
    wf = _workflow(ir.Step("s", ir.ContainerSpec("i"), priority=2**63))
    with pytest.raises(InvalidWorkflowError, match="workflow 'wf', step 's': cannot convert"):
        workflow_to_proto(wf)


@given(st.sampled_from([-0.0, 5e-324, -1.7976931348623157e308, 0.1]))
def test_float_bits_survive_both_forms(x: float) -> None:
    wf = _workflow(ir.Step("s", ir.ContainerSpec("i"), retry=ir.RetryPolicy(1, memory_factor=x)))
    for back in (proto_round_trip(wf), ir.from_json(ir.Workflow, ir.to_json(wf))):
        assert back.steps[0].retry is not None
        assert back.steps[0].retry.memory_factor is not None
        assert back.steps[0].retry.memory_factor.hex() == x.hex()
