"""The data-flow rules of ``couler.ir.validate``: run-time parameters, what a step reads
(inputs, placeholders, maps, conditions) and what it forwards.

Written against the survivors of the mutation check (bench/mutation.py, target
``validate-flow``): each test pins a rule a mutant broke without any test noticing.
"""

from __future__ import annotations

import dataclasses

import pytest

from couler import ir
from couler.errors import ValidationError

C = ir.ContainerSpec


def _problems(call: object, *args: object) -> list[str]:
    with pytest.raises(ValidationError) as info:
        call(*args)  # type: ignore[operator]
    return [f"{i.step}|{i.field}: {i.message}" for i in info.value.issues]


def _wf(*steps: ir.Step, params: tuple[ir.Parameter, ...] = ()) -> ir.Workflow:
    return ir.Workflow(name="flow", steps=steps, parameters=params)


STEP = ir.Step("s", C("alpine", command=("true",)))


# --------------------------------------------------------------------------- parameters


def test_every_bad_parameter_is_reported_not_only_the_first_unknown_one() -> None:
    w = _wf(STEP, params=(ir.Parameter("a", default=ir.Literal.of("x")),
                          ir.Parameter("b", ir.ValueType.INT, ir.Literal.of(1))))
    found = _problems(ir.check_parameters, w, {"zz": "1", "b": "one"})
    assert [f.split(":")[0] for f in found] == ["|parameters.zz", "|parameters.b"]
    # the declared names, listed for the typo
    assert found[0].endswith("(the workflow declares: a, b)")


def test_false_is_a_boolean() -> None:
    w = _wf(STEP, params=(ir.Parameter("fast", ir.ValueType.BOOL, ir.Literal.of(True)),))
    ir.check_parameters(w, {"fast": "false"})
    ir.check_parameters(w, {"fast": "False"})


# --------------------------------------------------------------------------- helpers

S = ir.Step


def _found(*steps: ir.Step, **wf: object) -> list[tuple[str, str, str]]:
    """Every problem of a workflow of ``steps``: (step, field, message)."""
    w = ir.Workflow(name="flow", steps=steps, **wf)  # type: ignore[arg-type]
    return [(i.step, i.field, i.message) for i in ir.find_issues(w)]


def _fields(*steps: ir.Step, **wf: object) -> list[tuple[str, str]]:
    return [(s, f) for s, f, _ in _found(*steps, **wf)]


def _ctr(name: str = "s", *args: str, **kw: object) -> ir.Step:
    return S(name, C("alpine", command=("echo",), args=args), **kw)  # type: ignore[arg-type]


def _inp(name: str, value: ir.ValueSource, type_: ir.ValueType = ir.ValueType.STRING
         ) -> ir.InputParameter:
    return ir.InputParameter(name, value, type_)


UP = S("up", C("alpine", command=("echo",)),
       outputs=(ir.OutputParameter("n", ir.OutputSource.STDOUT, "", ir.ValueType.INT),
                ir.OutputParameter("rows", ir.OutputSource.STDOUT, "", ir.ValueType.LIST)),
       output_artifacts=(ir.OutputArtifact("model", "/tmp/model"),))
AFTER_UP = (ir.Dependency("up"),)


# --------------------------------------------------------------------------- literals


def test_literals_are_typed_whether_simple_strings_or_other_json() -> None:
    step = _ctr("s", "{{inputs.a}}", "{{inputs.b}}", "{{inputs.c}}", inputs=(
        _inp("a", ir.Literal.of("text"), ir.ValueType.INT),     # a simple JSON string
        _inp("b", ir.Literal.of([1, 2]), ir.ValueType.INT),     # other JSON
        _inp("c", ir.Literal('{"broken"'), ir.ValueType.INT)))  # not JSON
    assert _found(step) == [
        ("s", "inputs.a", "type mismatch: a string value feeds an input of type int"),
        ("s", "inputs.b", "type mismatch: a list value feeds an input of type int"),
        ("s", "inputs.c", "'{\"broken\"' is not valid JSON")]


# --------------------------------------------------------------------------- bodies


def test_each_body_kind_is_checked_on_its_own_fields() -> None:
    assert _found(S("c", C("", command=("{{inputs.x}}",), args=("{{inputs.y}}",),
                           working_dir="/w/{{inputs.z}}"))) == [
        ("c", "image", "a container or script step needs an image"),
        ("c", "command", "placeholder {{inputs.x}} names no input of the step"),
        ("c", "args", "placeholder {{inputs.y}} names no input of the step"),
        ("c", "working_dir", "placeholder {{inputs.z}} names no input of the step")]
    assert _found(S("p", ir.ScriptSpec("python:3", "  \n"))) == [
        ("p", "source", "a script step needs source code")]
    assert _found(S("p", ir.ScriptSpec("python:3", "print(1)"))) == []


@pytest.mark.parametrize(("manifest", "expected"), [
    ("{not json", [("manifest", "the job manifest is not valid JSON")]),
    ("[1]", [("manifest", "the job manifest must be an object")]),
    ('{"kind": "Job"}', [("manifest.apiVersion", "the job manifest needs this field")]),
    ('{"apiVersion": "batch/v1"}', [("manifest.kind", "the job manifest needs this field")]),
    ('{"apiVersion": "batch/v1", "kind": "Job"}', []),
])
def test_a_job_manifest_is_an_object_with_api_version_and_kind(
        manifest: str, expected: list[tuple[str, str]]) -> None:
    assert [(f, m) for _, f, m in _found(S("j", ir.JobSpec(manifest)))] == expected


def test_a_reference_names_a_workflow_and_an_inline_body_is_checked() -> None:
    assert _fields(S("r", ir.SubWorkflowSpec(name="Not_A_Name"))) == [("r", "body.name")]
    assert _found(S("r", ir.SubWorkflowSpec(name="child"))) == []
    # an inline body has a label of its own (not a workflow name) and its steps are checked
    inner = S("i", C(""))
    assert _fields(S("g", ir.SubWorkflowSpec(name="Inline_Group", steps=(inner,)))) == [
        ("i", "image")]


# --------------------------------------------------------------------------- env


def test_env_names_values_and_secrets() -> None:
    step = _ctr("s", env=(
        ir.EnvVar("1BAD", "x"),
        ir.EnvVar("TOKEN", secret=ir.SecretRef("Bad_Secret", "k")),
        ir.EnvVar("BOTH", "v", secret=ir.SecretRef("creds", "k")),
        ir.EnvVar("REF", "{{inputs.missing}}"),
        ir.EnvVar("OK", "plain"),
        ir.EnvVar("FROM", secret=ir.SecretRef("creds", "token"))))
    assert _found(step) == [
        ("s", "env[0].name", "'1BAD' is not a valid environment variable name"),
        ("s", "env.TOKEN.secret", "'Bad_Secret' is not a valid secret name"),
        ("s", "env.BOTH", "set a value or a secret reference, not both"),
        ("s", "env.REF", "placeholder {{inputs.missing}} names no input of the step")]


# --------------------------------------------------------------------------- placeholders


def test_every_placeholder_of_every_text_is_checked() -> None:
    step = _ctr("s", "plain", "{{inputs.a}} and {{inputs.b}}", "{{inputs.c}}",
                inputs=(_inp("a", ir.Literal.of("x")),))
    # a text without placeholders does not end the check of the texts after it
    assert [m for _, _, m in _found(step)] == [
        "placeholder {{inputs.b}} names no input of the step",
        "placeholder {{inputs.c}} names no input of the step"]


def test_the_run_placeholders_and_unknown_ones() -> None:
    ok = _ctr("s", "{{workflow.name}}", "{{workflow.uid}}", "{{ workflow.status }}")
    assert _found(ok) == []
    assert _found(_ctr("s", "{{workflow.id}}")) == [
        ("s", "args", "unknown placeholder {{workflow.id}}; use {{inputs.NAME}}, {{item}}, "
                      "{{item.KEY}} or {{workflow.name}}")]
    assert _found(_ctr("s", "{{item}}", "{{item.key}}")) == [
        ("s", "args", "placeholder {{item}} is used outside a map"),
        ("s", "args", "placeholder {{item.key}} is used outside a map")]
    mapped = _ctr("s", "{{item}}", "{{item.key}}", foreach=ir.ForEach(
        items=(ir.Literal.of({"key": 1}),)))
    assert _found(mapped) == []


def _tuned(*args: str, inputs: tuple[ir.InputParameter, ...] = ()) -> ir.Step:
    return S("t", C("alpine", command=("echo",), args=args), inputs=inputs,
             outputs=(ir.OutputParameter("v", ir.OutputSource.STDOUT, "", ir.ValueType.FLOAT),),
             tune=ir.Tune(space=(ir.TuneParam("lr", low=0.1, high=0.2),),
                          objective="v", trials=2))


def test_a_tune_step_reads_its_trial_parameters_by_name() -> None:
    assert _found(_tuned("{{item.lr}}")) == []
    assert _found(_tuned("{{item.depth}}", "{{item}}")) == [
        ("t", "args", "placeholder {{item.depth}} names no parameter of the tune space; use "
                      "{{item.NAME}}"),
        ("t", "args", "placeholder {{item}} names no parameter of the tune space; use "
                      "{{item.NAME}}")]
    assert _found(_tuned(inputs=(_inp("x", ir.ItemRef("lr"), ir.ValueType.FLOAT),))) == []
    assert _found(_tuned(inputs=(_inp("x", ir.ItemRef("depth"), ir.ValueType.INT),))) == [
        ("t", "inputs.x", "reads trial parameter 'depth', which is not in the tune space "
                          "['lr']")]
    # the parameter's type is the input's: a float parameter does not feed an int
    assert _fields(_tuned(inputs=(_inp("x", ir.ItemRef("lr"), ir.ValueType.INT),))) == [
        ("t", "inputs.x")]


# --------------------------------------------------------------------------- inputs


def test_an_input_reads_a_declared_upstream_it_depends_on() -> None:
    reader = _ctr("r", "{{inputs.n}}", inputs=(_inp("n", ir.StepOutputRef("up", "n"),
                                                    ir.ValueType.INT),))
    assert _found(UP, reader) == [
        ("r", "inputs.n", "reads step 'up' but does not depend on it; add it to dependencies")]
    assert _found(UP, dataclasses.replace(reader, dependencies=AFTER_UP)) == []
    own = _ctr("r", inputs=(_inp("n", ir.StepOutputRef("r", "n")),), outputs=(
        ir.OutputParameter("n", ir.OutputSource.STDOUT, ""),))
    assert _fields(own) == [("r", "inputs.n")]  # its own output: not known before it runs
    wrong = dataclasses.replace(reader, dependencies=AFTER_UP, inputs=(
        _inp("n", ir.StepOutputRef("up", "rows"), ir.ValueType.INT),))
    assert _found(UP, wrong) == [
        ("r", "inputs.n", "type mismatch: a list value feeds an input of type int")]


def test_workflow_parameters_are_typed() -> None:
    params = (ir.Parameter("size", ir.ValueType.INT, ir.Literal.of(1)),)
    ok = _ctr("s", inputs=(_inp("n", ir.WorkflowParamRef("size"), ir.ValueType.FLOAT),))
    assert _found(ok, parameters=params) == []
    bad = _ctr("s", inputs=(_inp("n", ir.WorkflowParamRef("size"), ir.ValueType.BOOL),
                            _inp("m", ir.WorkflowParamRef("nope"))))
    assert _found(bad, parameters=params) == [
        ("s", "inputs.n", "type mismatch: a int value feeds an input of type bool"),
        ("s", "inputs.m", "refers to unknown workflow parameter 'nope'")]


def test_a_map_items_keys_are_checked_against_the_static_items() -> None:
    items = (ir.Literal.of({"k": 1}), ir.Literal.of({"j": 2}))
    step = _ctr("s", inputs=(_inp("a", ir.ItemRef("k")),), foreach=ir.ForEach(items=items))
    assert _found(step) == [("s", "inputs.a", 'map item {"j":2} has no key \'k\'')]
    scalar = _ctr("s", inputs=(_inp("a", ir.ItemRef("k")),), foreach=ir.ForEach(
        items=(ir.Literal.of(3),)))
    assert _found(scalar) == [("s", "inputs.a", "map item 3 has no key 'k'")]
    whole = _ctr("s", inputs=(_inp("a", ir.ItemRef("")),), foreach=ir.ForEach(items=items))
    assert _found(whole) == []
    unmapped = _ctr("s", inputs=(_inp("a", ir.ItemRef("k")),))
    assert _found(unmapped) == [("s", "inputs.a", "uses the map item but the step has no map")]


# --------------------------------------------------------------------------- outputs


@pytest.mark.parametrize(("body", "out", "expected"), [
    (C("alpine", command=("echo",)), ir.OutputParameter("o", ir.OutputSource.PATH, "rel/o"),
     ["an output read from a file needs an absolute path"]),
    (C("alpine", command=("echo",)), ir.OutputParameter("o", ir.OutputSource.PATH, "/tmp/o"),
     []),
    (C("alpine", command=("echo",)), ir.OutputParameter("o", ir.OutputSource.JSON_PATH, ""),
     ["json_path outputs are only for job steps", "a json_path output needs a selector"]),
    (ir.JobSpec('{"apiVersion": "v1", "kind": "Pod"}'),
     ir.OutputParameter("o", ir.OutputSource.JQ, ""), ["a jq output needs a selector"]),
    (ir.JobSpec('{"apiVersion": "v1", "kind": "Pod"}'),
     ir.OutputParameter("o", ir.OutputSource.JSON_PATH, "{.metadata.name}"), []),
    (ir.JobSpec('{"apiVersion": "v1", "kind": "Pod"}'),
     ir.OutputParameter("o", ir.OutputSource.STDOUT, ""),
     ["stdout outputs are only for container and script steps"]),
    (ir.ScriptSpec("python:3", "print(1)"), ir.OutputParameter("o", ir.OutputSource.STDOUT,
                                                                 ""), []),
])
def test_where_each_kind_of_output_is_read_from(body: ir.StepBody, out: ir.OutputParameter,
                                                 expected: list[str]) -> None:
    assert [m for _, _, m in _found(S("s", body, outputs=(out,)))] == expected


def test_a_sub_workflow_output_is_forwarded_from_one_inner_step_of_its_type() -> None:
    def inner(name: str, type_: ir.ValueType) -> ir.Step:
        return S(name, C("alpine", command=("echo",)), outputs=(
            ir.OutputParameter("o", ir.OutputSource.STDOUT, "", type_),))

    def group(*steps: ir.Step, type_: ir.ValueType = ir.ValueType.INT) -> ir.Step:
        # a forwarded output's own source and selector are not used (a relative path here)
        return S("g", ir.SubWorkflowSpec(name="g", steps=steps), outputs=(
            ir.OutputParameter("o", ir.OutputSource.PATH, "unused", type_),))

    assert _found(group(inner("a", ir.ValueType.INT))) == []
    assert _found(group(inner("a", ir.ValueType.STRING))) == [
        ("g", "outputs.o", "type mismatch: inner step 'a' produces a string value for an "
                           "output of type int")]
    two = group(inner("a", ir.ValueType.INT), inner("b", ir.ValueType.INT))
    assert _found(two) == [
        ("g", "outputs.o", "a sub-workflow output is forwarded from the inner step that "
                           "declares 'o'; 2 inner steps do")]
    # each forwarded output is checked, not only the first
    both = S("g", ir.SubWorkflowSpec(name="g", steps=(inner("a", ir.ValueType.INT),)),
             outputs=(ir.OutputParameter("x", type=ir.ValueType.INT),
                      ir.OutputParameter("o", type=ir.ValueType.BOOL)))
    assert _fields(both) == [("g", "outputs.x"), ("g", "outputs.o")]


# --------------------------------------------------------------------------- artifacts


def test_input_artifacts_read_a_declared_artifact_of_a_dependency() -> None:
    def reader(*arts: ir.InputArtifact, deps: tuple[ir.Dependency, ...] = AFTER_UP
               ) -> ir.Step:
        return _ctr("r", input_artifacts=arts, dependencies=deps)

    ok = ir.InputArtifact("m", "/in/m", ir.StepArtifactRef("up", "model"))
    assert _found(UP, reader(ok)) == []
    assert _found(UP, reader(ok, ok)) == [
        ("r", "input_artifacts.m", "artifact is declared twice")]
    assert _found(UP, reader(dataclasses.replace(ok, path="in/m"))) == [
        ("r", "input_artifacts.m", "artifact path must be absolute")]
    assert _found(UP, reader(ok, deps=())) == [
        ("r", "input_artifacts.m", "reads step 'up' but does not depend on it; add it to "
                                   "dependencies")]
    other = ir.InputArtifact("m", "/in/m", ir.StepArtifactRef("up", "weights"))
    assert _found(UP, reader(other)) == [
        ("r", "input_artifacts.m", "step 'up' has no output artifact 'weights'")]
    s3 = ir.InputArtifact("d", "/in/d", ir.ArtifactLocation(ir.StorageKind.S3, key="k"))
    assert _found(UP, reader(s3)) == [
        ("r", "input_artifacts.d", "a s3 artifact needs a bucket")]


def test_output_artifacts_have_absolute_paths_unique_names_and_valid_locations() -> None:
    out = ir.OutputArtifact("m", "/out/m")
    assert _found(_ctr("s", output_artifacts=(out,))) == []
    assert _found(_ctr("s", output_artifacts=(out, out))) == [
        ("s", "output_artifacts.m", "artifact is declared twice")]
    assert _found(_ctr("s", output_artifacts=(ir.OutputArtifact("m", "out/m"),))) == [
        ("s", "output_artifacts.m", "artifact path must be absolute")]
    gcs = ir.OutputArtifact("m", "/out/m", ir.ArtifactLocation(ir.StorageKind.GCS))
    assert _found(_ctr("s", output_artifacts=(gcs,))) == [
        ("s", "output_artifacts.m", "a gcs artifact needs a bucket")]


# --------------------------------------------------------------------------- maps


def test_a_map_has_items_or_a_list_source_and_a_positive_bound() -> None:
    items = (ir.Literal.of(1),)
    assert _found(_ctr("s", foreach=ir.ForEach(items=items, parallelism=1))) == []
    assert _found(_ctr("s", foreach=ir.ForEach(items=items, parallelism=0))) == [
        ("s", "foreach.parallelism", "must be at least 1")]
    assert _found(_ctr("s", foreach=ir.ForEach())) == [
        ("s", "foreach", "a map needs either static items or a source, not both")]
    assert _found(_ctr("s", foreach=ir.ForEach(items=(ir.Literal("[oops"),)))) == [
        ("s", "foreach.items", "'[oops' is not valid JSON")]
    over = _ctr("r", foreach=ir.ForEach(source=ir.StepOutputRef("up", "rows")),
                dependencies=AFTER_UP)
    assert _found(UP, over) == []
    assert _found(UP, dataclasses.replace(over, dependencies=())) == [
        ("r", "foreach.source", "reads step 'up' but does not depend on it; add it to "
                                "dependencies")]
    count = dataclasses.replace(over, foreach=ir.ForEach(source=ir.StepOutputRef("up", "n")))
    assert _found(UP, count) == [("r", "foreach.source", "a map needs a list, not a int value")]
    own = _ctr("r", foreach=ir.ForEach(source=ir.StepOutputRef("r", "rows")),
               outputs=(ir.OutputParameter("rows", ir.OutputSource.STDOUT, "",
                                           ir.ValueType.LIST),))
    assert _fields(own) == [("r", "foreach.source")]  # not its own output


# --------------------------------------------------------------------------- the rest


def test_a_step_does_not_read_its_own_artifact_but_a_loop_reads_its_own_outputs() -> None:
    own = _ctr("s", output_artifacts=(ir.OutputArtifact("m", "/m"),), input_artifacts=(
        ir.InputArtifact("m2", "/m2", ir.StepArtifactRef("s", "m")),))
    assert _found(own) == [("s", "input_artifacts.m2", "reads step 's' but does not depend "
                                                       "on it; add it to dependencies")]

    def looping(output: str) -> ir.Step:
        cond = ir.Condition(ir.StepOutputRef("s", output), ir.CompareOp.EQ, ir.Literal.of("1"))
        return _ctr("s", outputs=(ir.OutputParameter("n", ir.OutputSource.STDOUT, ""),),
                    loop=ir.Loop(condition=cond, max_iterations=3))

    assert _found(looping("n")) == []
    # its own output is looked up like any other: an unknown one is named
    assert _found(looping("nope")) == [
        ("s", "loop.condition.left", "step 's' has no output 'nope'")]


def test_names_and_duplicates_of_inputs_and_outputs_say_what_is_wrong() -> None:
    out = ir.OutputParameter("o", ir.OutputSource.STDOUT, "")
    step = _ctr("s", inputs=(_inp("a", ir.Literal.of("x")), _inp("a", ir.Literal.of("y")),
                             _inp("1a", ir.Literal.of("z"))),
                outputs=(out, out, dataclasses.replace(out, name="o o")))
    assert _found(step) == [
        ("s", "inputs.a", "input is declared twice"),
        ("s", "inputs.1a", "'1a' is not a valid parameter name"),
        ("s", "outputs.o", "output is declared twice"),
        ("s", "outputs.o o", "'o o' is not a valid parameter name")]


def test_run_parameter_messages_name_the_value_and_the_type() -> None:
    w = _wf(STEP, params=(ir.Parameter("n", ir.ValueType.INT, ir.Literal.of(1)),
                          ir.Parameter("f", ir.ValueType.BOOL, ir.Literal.of(True)),
                          ir.Parameter("l", ir.ValueType.LIST, ir.Literal.of([]))))
    found = _problems(ir.check_parameters, w, {"n": "x", "f": "yes", "l": "{}"})
    assert found[1:] == ["|parameters.f: 'yes' is not a valid bool: expected true or false",
                         "|parameters.l: '{}' is not a valid list: expected a JSON list, "
                         "e.g. [1, 2]"]
    assert found[0].startswith("|parameters.n: 'x' is not a valid int: invalid literal")
