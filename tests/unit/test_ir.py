"""Examples for the IR's canonical JSON, digest and validation."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from couler import ir
from couler.errors import Issue, ValidationError
from couler.ir.validate import MAX_WORKFLOW_NAME

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "python:3.11"


def container(*args: str) -> ir.ContainerSpec:
    return ir.ContainerSpec(image=IMAGE, command=("python", "-c"), args=args)


def step(name: str, *deps: str, **fields: object) -> ir.Step:
    fields.setdefault("body", container("print(1)"))
    return ir.Step(
        name=name,
        dependencies=tuple(ir.Dependency(d) for d in deps),
        **fields,  # type: ignore[arg-type]
    )


def sample_workflow() -> ir.Workflow:
    """A small valid workflow exercising data flow, maps, policies and labels."""
    produce = step(
        "produce",
        outputs=(ir.OutputParameter("items", selector="/tmp/items.json", type=ir.ValueType.LIST),),
    )
    fan_out = step(
        "fan-out",
        "produce",
        body=container("{{inputs.item}}", "{{item}}"),
        inputs=(ir.InputParameter("item", ir.ItemRef(), type=ir.ValueType.JSON),),
        foreach=ir.ForEach(source=ir.StepOutputRef("produce", "items"), parallelism=2),
        retry=ir.RetryPolicy(limit=2, backoff=ir.Backoff(cap_seconds=30.0)),
        resources=ir.Resources(cpu_request="500m", cpu_limit="1", memory_limit="2Gi"),
        labels=ir.pairs({"team": "ml", "app": "couler"}),
    )
    return ir.Workflow(
        name="sample",
        steps=(produce, fan_out),
        parameters=(ir.Parameter("epochs", ir.ValueType.INT, default=ir.Literal.of(3)),),
        labels=(("b", "2"), ("a", "1")),
    )


def issues_of(wf: ir.Workflow) -> list[Issue]:
    return ir.find_issues(wf)


def only(issues: list[Issue], field: str) -> list[Issue]:
    return [i for i in issues if i.field == field]


# --------------------------------------------------------------------------- validation


def test_sample_workflow_is_valid() -> None:
    assert issues_of(sample_workflow()) == []
    ir.validate(sample_workflow())


def test_cycle_reports_every_step_on_it() -> None:
    wf = ir.Workflow(
        "cyclic",
        (step("a", "c"), step("b", "a"), step("c", "b"), step("after", "a"), step("free")),
    )
    cycle = only(issues_of(wf), "dependencies")
    assert sorted(i.step for i in cycle) == ["a", "b", "c"]
    for issue in cycle:
        assert issue.message.startswith("dependency cycle: ")
        # The message shows the whole cycle, closed on its first step.
        names = issue.message.removeprefix("dependency cycle: ").split(" -> ")
        assert sorted(names[:-1]) == ["a", "b", "c"] and names[0] == names[-1]


def test_cycle_through_a_self_dependent_step_is_still_found() -> None:
    wf = ir.Workflow("cyclic", (step("a", "a", "b"), step("b", "a")))
    issues = only(issues_of(wf), "dependencies")
    assert any(i.step == "a" and "itself" in i.message for i in issues)
    assert sorted(i.step for i in issues if "cycle" in i.message) == ["a", "b"]


def test_dangling_dependency_names_the_step() -> None:
    wf = ir.Workflow("w", (step("a"), step("b", "nope")))
    (issue,) = issues_of(wf)
    assert (issue.step, issue.field) == ("b", "dependencies")
    assert "'nope'" in issue.message


@pytest.mark.parametrize("name", ["Bad_Name", "-lead", "trail-", "UPPER", "a" * 64, "dot.ted"])
def test_bad_step_name_is_reported_as_dns_1123(name: str) -> None:
    (issue,) = issues_of(ir.Workflow("w", (step(name),)))
    assert issue.field == "name"
    assert "DNS-1123" in issue.message and repr(name) in issue.message


def test_bad_workflow_name_is_reported() -> None:
    (issue,) = issues_of(ir.Workflow("Bad_Name", (step("a"),)))
    assert (issue.step, issue.field) == ("", "name")
    assert "DNS-1123" in issue.message
    long_name = "a" * (MAX_WORKFLOW_NAME + 1)
    assert only(issues_of(ir.Workflow(long_name, (step("a"),))), "name")


def test_type_mismatch_names_the_input() -> None:
    wf = ir.Workflow(
        "w",
        (
            step("a", outputs=(ir.OutputParameter("xs", selector="/xs", type=ir.ValueType.LIST),)),
            step(
                "b",
                "a",
                inputs=(
                    ir.InputParameter("n", ir.StepOutputRef("a", "xs"), type=ir.ValueType.INT),
                ),
            ),
        ),
    )
    (issue,) = issues_of(wf)
    assert (issue.step, issue.field) == ("b", "inputs.n")
    assert "type mismatch" in issue.message and "list" in issue.message and "int" in issue.message


def test_assignable_types_are_accepted() -> None:
    int_out = ir.OutputParameter("n", selector="/n", type=ir.ValueType.INT)
    wf = ir.Workflow(
        "w",
        (
            step("a", outputs=(int_out,)),
            step(
                "b",
                "a",
                inputs=(
                    ir.InputParameter("f", ir.StepOutputRef("a", "n"), type=ir.ValueType.FLOAT),
                    ir.InputParameter("s", ir.StepOutputRef("a", "n"), type=ir.ValueType.STRING),
                ),
            ),
        ),
    )
    assert issues_of(wf) == []


def test_data_flow_without_a_dependency_is_reported() -> None:
    wf = ir.Workflow(
        "w",
        (
            step("a", outputs=(ir.OutputParameter("o", selector="/o"),)),
            step("b", inputs=(ir.InputParameter("x", ir.StepOutputRef("a", "o")),)),
        ),
    )
    (issue,) = issues_of(wf)
    assert (issue.step, issue.field) == ("b", "inputs.x")
    assert "does not depend on it" in issue.message


def test_unknown_input_placeholder_is_reported() -> None:
    wf = ir.Workflow("w", (step("a", body=container("echo {{inputs.nope}}")),))
    (issue,) = issues_of(wf)
    assert (issue.step, issue.field) == ("a", "args")
    assert "{{inputs.nope}}" in issue.message


def test_validate_raises_with_every_issue() -> None:
    wf = ir.Workflow(
        "Bad_Name",
        (
            step("a", "b"),
            step("b", "a"),
            step("c", "missing", body=container("{{inputs.nope}}")),
        ),
    )
    found = issues_of(wf)
    with pytest.raises(ValidationError) as info:
        ir.validate(wf)
    assert info.value.issues == tuple(found)
    assert {(i.step, i.field) for i in found} >= {
        ("", "name"),
        ("a", "dependencies"),
        ("b", "dependencies"),
        ("c", "dependencies"),
        ("c", "args"),
    }
    text = str(info.value)
    assert text.startswith(f"{len(found)} problems found:")
    assert all(str(i) in text for i in found)


# --------------------------------------------------------------------------- quantities


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Decimal(0)),
        ("1", Decimal(1)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        (".5", Decimal("0.5")),
        ("2k", Decimal(2000)),
        ("2Ki", Decimal(2048)),
        ("2Gi", Decimal(2 * 2**30)),
        ("1M", Decimal(10**6)),
        ("1Mi", Decimal(2**20)),
        ("100n", Decimal("1e-7")),
        ("3u", Decimal("3e-6")),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("5e-1", Decimal("0.5")),
        ("1E", Decimal(10**18)),
        ("1Ei", Decimal(2**60)),
        ("+4", Decimal(4)),
        ("-1", Decimal(-1)),
        (" 2Gi ", Decimal(2 * 2**30)),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert ir.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "2GB", "1.2.3", "Gi", "2 Gi", "1e", "0x10", "--1"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        ir.parse_quantity(text)


def test_parse_quantity_out_of_range_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="out of range"):
        ir.parse_quantity("1e999999999")


def test_quantities_are_checked_in_resources() -> None:
    res = ir.Resources(cpu_request="2", cpu_limit="500m", memory_limit="lots")
    issues = issues_of(ir.Workflow("w", (step("a", resources=res),)))
    assert {i.field for i in issues} == {"resources.cpu_request", "resources.memory_limit"}


# --------------------------------------------------------------------------- canonical JSON


def test_canonical_json_leaves_defaults_out_and_tags_unions() -> None:
    s = ir.Step("a", ir.ContainerSpec(IMAGE), inputs=(ir.InputParameter("x", ir.ItemRef()),))
    assert ir.to_json(s) == (
        '{"body":{"image":"python:3.11","kind":"container"},'
        '"inputs":[{"name":"x","value":{"kind":"item"}}],"name":"a"}'
    )
    assert ir.to_dict(ir.Workflow("w", ())) == {"name": "w", "steps": []}


@pytest.mark.parametrize(
    "source",
    [
        ir.ArtifactLocation(),
        ir.ArtifactLocation(storage=ir.StorageKind.S3, bucket="b", key="k"),
        ir.StepArtifactRef("a", "model"),
    ],
)
def test_artifact_sources_round_trip(source: ir.ArtifactSource) -> None:
    art = ir.InputArtifact("in", "/in", source)
    assert ir.from_json(ir.InputArtifact, ir.to_json(art)) == art


def test_pairs_are_normalised() -> None:
    a = ir.Workflow("w", (), labels=(("b", "2"), ("a", "1")))
    b = ir.Workflow("w", (), labels=ir.pairs({"a": "1", "b": "2"}))
    assert a == b and a.labels == (("a", "1"), ("b", "2"))
    assert ir.to_json(a) == ir.to_json(b)


def test_from_json_rejects_malformed_data() -> None:
    with pytest.raises(ValueError, match="unknown fields"):
        ir.from_json(ir.Workflow, '{"name":"w","steps":[],"colour":"red"}')
    with pytest.raises(ValueError, match="unknown kind"):
        ir.from_json(ir.Step, '{"name":"a","body":{"kind":"lambda"}}')
    with pytest.raises(ValueError, match="'kind'"):
        ir.from_json(ir.Step, '{"name":"a","body":{"image":"i"}}')
    with pytest.raises(ValueError, match="expected an integer"):
        ir.from_json(ir.Workflow, '{"name":"w","steps":[],"parallelism":"2"}')


def test_from_json_accepts_ints_for_floats() -> None:
    text = '{"limit":1,"backoff":{"base_seconds":2,"cap_seconds":10}}'
    r = ir.from_json(ir.RetryPolicy, text)
    assert r.backoff == ir.Backoff(base_seconds=2.0, cap_seconds=10.0)
    assert isinstance(r.backoff.base_seconds, float)


# --------------------------------------------------------------------------- digest


def test_digest_is_equal_for_independently_built_equal_workflows() -> None:
    a, b = sample_workflow(), sample_workflow()
    assert a is not b and a == b
    assert ir.digest(a) == ir.digest(b)
    assert ir.digest(a).startswith("sha256:") and len(ir.digest(a)) == len("sha256:") + 64


def test_digest_changes_when_any_field_changes() -> None:
    base = sample_workflow()
    fan_out = base.steps[1]
    assert fan_out.retry is not None
    variants = [
        dataclasses.replace(base, name="other"),
        dataclasses.replace(base, parallelism=1),
        dataclasses.replace(base, labels=(("a", "1"),)),
        dataclasses.replace(base, steps=base.steps[:1]),
        dataclasses.replace(base, steps=(base.steps[0], dataclasses.replace(fan_out, priority=0))),
        dataclasses.replace(
            base,
            steps=(
                base.steps[0],
                dataclasses.replace(fan_out, retry=dataclasses.replace(fan_out.retry, limit=3)),
            ),
        ),
    ]
    digests = {ir.digest(base), *(ir.digest(v) for v in variants)}
    assert len(digests) == len(variants) + 1


def test_digest_is_stable_across_processes() -> None:
    code = (
        "from couler import ir\n"
        "from tests.unit.test_ir import sample_workflow\n"
        "print(ir.digest(sample_workflow()))\n"
    )
    seen = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        seen.add(out.stdout.strip())
    assert seen == {ir.digest(sample_workflow())}


def _inline(outputs: tuple[ir.OutputParameter, ...], *inner: ir.Step) -> ir.Workflow:
    wrapper = ir.Step("group", ir.SubWorkflowSpec("group", steps=inner), outputs=outputs)
    return ir.Workflow("w", (wrapper,))


def test_sub_workflow_output_is_forwarded_from_one_inner_step() -> None:
    produce = ir.Step(
        "produce",
        ir.ContainerSpec("alpine"),
        outputs=(ir.OutputParameter("score", selector="/tmp/score", type=ir.ValueType.FLOAT),),
    )
    ok = _inline((ir.OutputParameter("score", type=ir.ValueType.FLOAT),), produce)
    assert ir.find_issues(ok) == []

    missing = _inline((ir.OutputParameter("accuracy"),), produce)
    (issue,) = ir.find_issues(missing)
    assert (issue.step, issue.field) == ("group", "outputs.accuracy")
    assert "0 inner steps" in issue.message

    twice = _inline(
        (ir.OutputParameter("score", type=ir.ValueType.FLOAT),),
        produce,
        ir.Step("again", produce.body, outputs=produce.outputs),
    )
    assert "2 inner steps" in ir.find_issues(twice)[0].message

    wrong_type = _inline((ir.OutputParameter("score", type=ir.ValueType.INT),), produce)
    assert "type mismatch" in ir.find_issues(wrong_type)[0].message


@pytest.mark.parametrize(
    "value",
    ["", "x", 'q"uote', 0, -7, 10**30, 1.5, -0.0, 1e-07, 1e300, True, False, None,
     [], [1, "a"], {}, {"a": [1]}],
)
def test_literal_type_matches_the_decoded_value(value: object) -> None:
    lit = ir.Literal.of(value)
    assert lit.type == ir.type_of(value)
    # Non-canonical JSON text of the same value is typed by decoding it.
    spaced = ir.Literal(" " + lit.json + " ")
    assert spaced.type == ir.type_of(value)
