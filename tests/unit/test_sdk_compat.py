"""Programs written for the open-source Couler SDK: the module paths, globals and calls they
use beyond the main API (``couler.core.templates``, ``couler.states``, the default
submitter, ``SUBMITTER_IMPLEMENTATION``, indexing ``run()``'s result, scratch volumes,
``seLinuxOptions``)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import couler
import couler.argo
from couler import ir
from couler.api.builder import discard_implicit_builder
from couler.api.capture import capture_program
from couler.api.submission import CapturedRun, default_submitter
from couler.compilers import tekton
from couler.errors import UserError
from couler.v1 import workflow_pb2
from couler_runtime import codec
from tests.argo_schema import validate_argo


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    discard_implicit_builder()
    couler.set_default_submitter(None)
    yield
    discard_implicit_builder()
    couler.set_default_submitter(None)


class Recorder:
    def __init__(self) -> None:
        self.got: list[ir.Workflow] = []

    def submit(self, workflow: ir.Workflow, secrets: object = ()) -> dict[str, Any]:
        self.got.append(workflow)
        return {"metadata": {"name": f"{workflow.name}-x7k2p"}}


# ------------------------------------------------------------------------- module paths


def test_the_sdk_module_paths_give_couler_classes_that_build_a_workflow() -> None:
    from couler.core.constants import WFStatus
    from couler.core.templates import Toleration as TolerationAgain
    from couler.core.templates.toleration import Toleration
    from couler.core.templates.volume import Volume, VolumeMount
    from couler.core.templates.volume_claim import VolumeClaimTemplate

    assert Toleration is TolerationAgain is couler.Toleration and WFStatus is couler.WFStatus
    assert VolumeClaimTemplate is couler.VolumeClaimTemplate
    couler.add_toleration(Toleration("gpu", "NoSchedule", "Exists"))
    couler.add_volume(Volume("data", "data-claim"))
    couler.run_container(image="alpine:3.20", command=["ls", "/data"], step_name="ls",
                         volume_mounts=[VolumeMount("data", "/data")])
    spec = couler.workflow_yaml()["spec"]
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists",
                                    "effect": "NoSchedule"}]
    assert spec["volumes"] == [{"name": "data",
                                "persistentVolumeClaim": {"claimName": "data-claim"}}]


# ------------------------------------------------------------------------- submitters


def test_run_uses_the_default_submitter_and_none_clears_it() -> None:
    recorder = Recorder()
    couler.set_default_submitter(recorder)
    assert default_submitter() is recorder
    couler.config_workflow(name="nightly")
    couler.run_container(image="alpine:3.20", step_name="a")
    wf = couler.run()
    assert wf["metadata"]["name"] == "nightly-x7k2p"  # the upstream tests index the result
    assert [w.name for w in recorder.got] == ["nightly"]
    # an explicit submitter still wins over the default
    other = Recorder()
    couler.run_container(image="alpine:3.20", step_name="b")
    couler.run(submitter=other)
    assert len(recorder.got) == 1 and len(other.got) == 1
    couler.set_default_submitter(None)
    couler.run_container(image="alpine:3.20", step_name="c")
    with pytest.raises(UserError, match="run\\(\\) needs a submitter"):
        couler.run()


def test_a_default_submitter_without_submit_is_refused_at_once() -> None:
    with pytest.raises(UserError, match="has no submit"):
        couler.set_default_submitter(object())
    assert default_submitter() is None


@pytest.mark.parametrize("value", ["Python", "Go", ""])
def test_submitter_implementation_python_and_go_submit_through_kubernetes(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from couler.argo_submitter import (
        _SUBMITTER_IMPL_ENV_VAR_KEY,
        ArgoSubmitter,
        _SubmitterImplTypes,
    )

    assert (_SUBMITTER_IMPL_ENV_VAR_KEY, _SubmitterImplTypes.GO,
            _SubmitterImplTypes.PYTHON) == ("SUBMITTER_IMPLEMENTATION", "Go", "Python")
    monkeypatch.setenv(_SUBMITTER_IMPL_ENV_VAR_KEY, value)
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    monkeypatch.setitem(sys.modules, "kubernetes.client", None)
    couler.run_container(image="alpine:3.20", step_name="a")
    # past the implementation check, on to the Kubernetes client (not installed here)
    with pytest.raises(UserError, match="pip install kubernetes"):
        couler.run(submitter=ArgoSubmitter())


def test_an_unknown_submitter_implementation_is_refused_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from couler.argo_submitter import ArgoSubmitter

    monkeypatch.setenv("SUBMITTER_IMPLEMENTATION", "Rust")
    couler.run_container(image="alpine:3.20", step_name="a")
    with pytest.raises(UserError, match="SUBMITTER_IMPLEMENTATION='Rust': expected 'Python' "
                                        "or 'Go'"):
        couler.run(submitter=ArgoSubmitter())


def test_a_captured_program_reads_run_results_as_the_created_object(tmp_path: Path) -> None:
    program = tmp_path / "upstream_style.py"
    program.write_text(textwrap.dedent("""\
        import couler.argo as couler
        from couler.argo_submitter import ArgoSubmitter

        couler.config_workflow(name="pytest")
        couler.run_container(image="alpine:3.20", command=["echo", "hi"], step_name="echo")
        wf = couler.run(submitter=ArgoSubmitter(namespace="argo"))
        wf_name = wf["metadata"]["name"]
        assert wf_name == "pytest", wf_name
        assert wf["kind"] == "Workflow"
        print("workflow %s created" % wf_name)
        """))
    (wf,) = capture_program(str(program))
    assert wf.name == "pytest"
    captured = CapturedRun(wf)
    assert dict(captured) == {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                              "metadata": {"name": "pytest"}}
    assert captured.workflow is wf


# ------------------------------------------------------------------------- states


def test_states_workflow_sets_the_security_context_with_se_linux_options() -> None:
    couler.config_workflow(name="secure")
    couler.states.workflow.set_security_context({
        "runAsUser": 1000, "fsGroup": 2000, "runAsNonRoot": True,
        "seLinuxOptions": {"level": "s0:c123,c456", "type": "spc_t"}})
    couler.run_container(image="alpine:3.20", step_name="a")
    assert couler.states.workflow.name == "secure"
    wf = couler.argo.current_builder().to_ir()
    assert wf.security_context == ir.SecurityContext(
        run_as_user=1000, fs_group=2000, run_as_non_root=True,
        se_linux_options=ir.SELinuxOptions(type="spc_t", level="s0:c123,c456"))
    doc = couler.workflow_yaml()
    assert validate_argo(doc) == []
    ctx = doc["spec"]["securityContext"]
    assert ctx == {"runAsUser": 1000, "fsGroup": 2000, "runAsNonRoot": True,
                   "seLinuxOptions": {"type": "spc_t", "level": "s0:c123,c456"}}
    docs = tekton.compile_workflow(wf)
    pipeline_run = next(d for d in docs if d.get("kind") == "PipelineRun")
    pod = pipeline_run["spec"]["taskRunTemplate"]["podTemplate"]
    assert pod["securityContext"]["seLinuxOptions"] == {"type": "spc_t",
                                                        "level": "s0:c123,c456"}
    # through the wire format and back unchanged
    message = codec.workflow_to_proto(wf)
    assert isinstance(message, workflow_pb2.Workflow)
    assert codec.workflow_from_proto(message) == wf


@pytest.mark.parametrize(("context", "message"), [
    ({"seLinuxOptions": "s0"}, "seLinuxOptions must be a dict"),
    ({"seLinuxOptions": {"levle": "s0"}}, "unsupported key\\(s\\) 'levle'"),
    ({"seLinuxOptions": {"level": 5}}, "seLinuxOptions.level must be a string"),
    ({"capabilities": {"add": ["NET_ADMIN"]}}, "unsupported key 'capabilities'"),
])
def test_a_bad_security_context_is_refused_naming_the_key(
        context: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        couler.states.workflow.set_security_context(context)


# ------------------------------------------------------------------------- volumes


def test_a_mount_of_an_undeclared_volume_gets_a_scratch_directory() -> None:
    from couler.core.templates.volume import VolumeMount

    couler.run_container(image="alpine:3.20", command=["sh", "-c", "date > /scratch/t"],
                         step_name="write", volume_mounts=[VolumeMount("scratch", "/scratch")])
    couler.run_container(image="alpine:3.20", command=["ls", "/scratch"], step_name="list",
                         volume_mounts=[VolumeMount("scratch", "/scratch")])
    wf = couler.argo.current_builder().to_ir()
    assert wf.volumes == (ir.Volume("scratch", kind=ir.VolumeKind.EMPTY_DIR),)
    doc = couler.workflow_yaml()
    assert validate_argo(doc) == []
    assert doc["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}]
