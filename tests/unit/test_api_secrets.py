"""Secrets are references in the IR; their values stay in the builder's memory only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import couler.argo as couler
from couler import ir
from couler.api.builder import discard_implicit_builder
from couler.api.capture import capture_callable
from couler.errors import UserError

VALUES = {"USER": "alice", "TOKEN": "s3cr3t-value"}


@pytest.fixture(autouse=True)
def _fresh_builder() -> Iterator[None]:
    discard_implicit_builder()
    yield
    discard_implicit_builder()


def test_secret_values_never_reach_the_ir_and_identical_data_is_one_secret() -> None:
    with couler.workflow("secrets") as wf:
        creds = couler.create_secret(secret_data=VALUES, dry_run=True)
        same = couler.create_secret(secret_data=dict(VALUES), dry_run=True)
        other = couler.create_secret({"USER": "bob-value"}, name="bob-creds")
        couler.run_container(image="alpine:3.20", command=["env"], secret=creds,
                             step_name="first")
        couler.run_container(image="alpine:3.20", command=["env"], secret=same,
                             step_name="second")
        couler.run_container(image="alpine:3.20", command=["env"], secret="bob-creds",
                             step_name="third")
    assert creds is same
    assert str(creds) == creds.name == "secrets-secret-1"
    assert other.name == "bob-creds"
    result = wf.to_ir()
    text = ir.to_json(result)
    for value in ("alice", "s3cr3t-value", "bob-value"):
        assert value not in text
    first = result.step("first")
    assert first is not None
    assert first.env == (
        ir.EnvVar("USER", secret=ir.SecretRef("secrets-secret-1", "USER")),
        ir.EnvVar("TOKEN", secret=ir.SecretRef("secrets-secret-1", "TOKEN")),
    )
    second, third = result.step("second"), result.step("third")
    assert second is not None and second.env == first.env
    assert third is not None
    assert third.env == (ir.EnvVar("USER", secret=ir.SecretRef("bob-creds", "USER")),)
    material = {m.name: m for m in wf.secret_material()}
    assert sorted(material) == ["bob-creds", "secrets-secret-1"]
    assert material["secrets-secret-1"].reveal() == VALUES
    assert material["secrets-secret-1"].should_create is False  # dry run
    assert material["bob-creds"].should_create is True


def test_secret_reprs_and_strs_hide_the_values() -> None:
    with couler.workflow("hidden") as wf:
        creds = couler.create_secret(VALUES)
    shown = " ".join([repr(creds), str(creds), *(repr(m) for m in wf.secret_material()),
                      *(str(m) for m in wf.secret_material()), repr(wf)])
    assert "alice" not in shown and "s3cr3t-value" not in shown
    assert "TOKEN" in repr(creds)


def test_default_secret_name_follows_the_final_workflow_name() -> None:
    def program() -> None:
        creds = couler.create_secret(VALUES)
        couler.run_container(image="alpine:3.20", secret=creds, step_name="use")
        couler.config_workflow(name="renamed-later")

    (wf,) = capture_callable(program)
    step = wf.step("use")
    assert step is not None and step.env[0].secret == ir.SecretRef("renamed-later-secret-1",
                                                                   "USER")


def test_obtain_secret_references_an_existing_secret() -> None:
    with couler.workflow("existing") as wf:
        ref = couler.obtain_secret(["password"], namespace="ml", name="db-creds")
        assert couler.obtain_secret(["password"], namespace="ml", name="db-creds") is ref
        couler.run_container(image="alpine:3.20", secret=ref, step_name="s")
    step = wf.to_ir().step("s")
    assert step is not None
    assert step.env == (ir.EnvVar("password", secret=ir.SecretRef("db-creds", "password")),)
    (material,) = wf.secret_material()
    assert (material.name, material.keys, material.should_create) == (
        "db-creds", ("password",), False)


def test_artifact_credentials_become_a_secret() -> None:
    with couler.workflow("artifacts") as wf:
        model = couler.create_s3_artifact(path="/out/model", bucket="models", key="m",
                                          endpoint="s3.example.com",
                                          access_key_id="AKIAEXAMPLE",
                                          secret_access_key="very-secret")
        legacy = couler.create_oss_artifact("/out/log", "logs", "ID2", "KEY2", key="l")
        couler.run_container(image="trainer:1", output=[model, legacy], step_name="train")
    result = wf.to_ir()
    text = ir.to_json(result)
    for value in ("AKIAEXAMPLE", "very-secret", "ID2", "KEY2"):
        assert value not in text
    step = result.step("train")
    assert step is not None
    s3, oss = (a.location for a in step.output_artifacts)
    assert s3 == ir.ArtifactLocation(
        storage=ir.StorageKind.S3, endpoint="s3.example.com", bucket="models", key="m",
        access_key=ir.SecretRef("artifacts-secret-1", "accessKey"),
        secret_key=ir.SecretRef("artifacts-secret-1", "secretKey"))
    assert oss is not None and oss.storage == ir.StorageKind.OSS
    assert oss.access_key == ir.SecretRef("artifacts-secret-2", "accessKey")
    material = {m.name: m.reveal() for m in wf.secret_material()}
    assert material == {
        "artifacts-secret-1": {"accessKey": "AKIAEXAMPLE", "secretKey": "very-secret"},
        "artifacts-secret-2": {"accessKey": "ID2", "secretKey": "KEY2"},
    }


def test_secret_errors() -> None:
    with couler.workflow("errors"):
        with pytest.raises(UserError, match="non-empty dict"):
            couler.create_secret({})
        with pytest.raises(UserError, match="not valid"):
            couler.create_secret({"bad key": "x"})
        with pytest.raises(UserError, match="needs the name"):
            couler.obtain_secret(["k"])
        with pytest.raises(UserError, match="no secret called 'nope'"):
            couler.run_container(image="alpine:3.20", secret="nope")
        with pytest.raises(UserError, match="both the access key id and the secret key"):
            couler.create_s3_artifact("/x", bucket="b", access_key_id="only-id")
