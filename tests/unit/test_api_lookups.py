"""Look-ups by name (``get_step_output``, ``get_secret``) and result lists passed as ``input=``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import couler.argo as couler
from couler import ir
from couler.api.builder import discard_implicit_builder
from couler.api.capture import capture_callable
from couler.errors import UserError


@pytest.fixture(autouse=True)
def _fresh_builder() -> Iterator[None]:
    discard_implicit_builder()
    yield
    discard_implicit_builder()


def _prep() -> None:
    print("prepared")


def test_get_step_output_returns_what_the_step_returned_and_feeds_later_steps() -> None:
    with couler.workflow("lookups") as wf:
        produced = couler.run_script(image="python:3.12", source=_prep, step_name="prep")
        artifact = couler.run_container(
            image="alpine:3.20", command=["sh", "-c", "echo x > /out/x"], step_name="write",
            output=couler.create_local_artifact("/out/x"))
        found = couler.get_step_output("prep")
        assert found == produced and all(a is b for a, b in zip(found, produced, strict=True))
        assert couler.get_step_output("write") == artifact
        couler.run_container(image="alpine:3.20", command=["echo"],
                             args=[couler.get_step_output("prep")], step_name="use")
    use = wf.to_ir().step("use")
    assert use is not None
    assert [i.value for i in use.inputs] == [ir.StepOutputRef("prep", "result")]
    assert sorted(d.step for d in use.dependencies) == ["prep", "write"]


def test_get_step_output_finds_steps_of_other_scopes_and_unsanitised_names() -> None:
    with couler.workflow("scopes"):
        couler.run_container(image="alpine:3.20", command=["echo"], step_name="Train_Model")
        couler.set_exit_handler(couler.WFStatus.Failed, lambda: couler.run_container(
            image="alpine:3.20", command=["echo", "failed"], step_name="on-failure"))
        assert [o.step_name for o in couler.get_step_output("Train_Model")] == ["train-model"]
        assert [o.step_name for o in couler.get_step_output("on-failure")] == ["on-failure"]


def test_get_step_output_of_an_unknown_step_names_it() -> None:
    with couler.workflow("unknown-step"):
        couler.run_container(image="alpine:3.20", command=["echo"], step_name="known")
        with pytest.raises(UserError, match=r"no step called 'missing'.*\['known'\]") as info:
            couler.get_step_output("missing")
    assert "workflow 'unknown-step'" in str(info.value)


def test_get_secret_returns_the_registered_handle() -> None:
    with couler.workflow("secret-lookup") as wf:
        created = couler.create_secret({"TOKEN": "not-shown"}, name="api-creds", dry_run=True)
        existing = couler.obtain_secret(["PASSWORD"], name="db-creds")
        assert couler.get_secret("api-creds") is created
        assert couler.get_secret(str(existing)) is existing
        couler.run_container(image="alpine:3.20", command=["env"],
                             secret=couler.get_secret("db-creds"), step_name="s")
    step = wf.to_ir().step("s")
    assert step is not None
    assert step.env == (ir.EnvVar("PASSWORD", secret=ir.SecretRef("db-creds", "PASSWORD")),)


def test_get_secret_of_an_unknown_secret_names_it() -> None:
    with couler.workflow("no-secret"):
        couler.obtain_secret(["K"], name="present")
        with pytest.raises(UserError, match=r"no secret called 'absent'.*\['present'\]"):
            couler.get_secret("absent")


def test_obtain_secret_through_create_secret_use_existing() -> None:
    with couler.workflow("use-existing") as wf:
        ref = couler.create_secret({"KEY": "ignored"}, name="cluster-creds", use_existing=True)
        assert ref is couler.obtain_secret(["KEY"], name="cluster-creds")
        couler.run_container(image="alpine:3.20", command=["env"], secret=ref, step_name="s")
    (material,) = wf.secret_material()
    assert material.reveal() == {} and not material.should_create
    assert "ignored" not in ir.to_json(wf.to_ir())


# --------------------------------------------------------------------------- input= result lists


def _script_with_artifact() -> list[couler.StepOutput]:
    return couler.run_script(image="python:3.12", source=_prep, step_name="prep",
                             output=couler.create_local_artifact("/tmp/out/x"))


def test_a_run_script_result_list_as_input_feeds_its_artifact() -> None:
    def program() -> None:
        p = _script_with_artifact()
        couler.run_container(image="trainer:1", command=["train"], input=p, step_name="train")

    (wf,) = capture_callable(program)
    train = wf.step("train")
    assert train is not None
    assert train.input_artifacts == (
        ir.InputArtifact("output-0", "/tmp/out/x", ir.StepArtifactRef("prep", "output-0")),)
    assert train.inputs == ()  # the stdout result is skipped, not passed
    assert [d.step for d in train.dependencies] == ["prep"]


def test_result_lists_inside_an_input_list_feed_all_their_artifacts() -> None:
    def program() -> None:
        p = _script_with_artifact()
        q = couler.run_container(
            image="alpine:3.20", step_name="other",
            output=[couler.create_parameter_artifact("/tmp/n", name="n"),
                    couler.create_local_artifact("/tmp/out/y", name="y"),
                    couler.create_local_artifact("/tmp/out/z", name="z")])
        couler.run_container(image="trainer:1", input=[p, q], step_name="train")

    (wf,) = capture_callable(program)
    train = wf.step("train")
    assert train is not None
    assert [(a.name, a.source) for a in train.input_artifacts] == [
        ("output-0", ir.StepArtifactRef("prep", "output-0")),
        ("y", ir.StepArtifactRef("other", "y")),
        ("z", ir.StepArtifactRef("other", "z")),
    ]


def test_inputs_without_an_artifact_still_fail() -> None:
    with couler.workflow("no-artifact"):
        p = couler.run_script(image="python:3.12", source=_prep, step_name="prep")
        message = (r"step 'train': input 0 is ParameterOutput\(step='prep', name='result'\); "
                   "pass an output artifact of an earlier step or an S3/OSS artifact")
        with pytest.raises(UserError, match=message):
            couler.run_container(image="trainer:1", input=p, step_name="train")
        with pytest.raises(UserError, match=message):
            couler.run_container(image="trainer:1", input=p[0], step_name="train")
        with_artifact = _script_with_artifact()
        with pytest.raises(UserError, match=r"input 0 is ParameterOutput\(step='prep-2'"):
            couler.run_container(image="trainer:1", input=[with_artifact[0]], step_name="train")
