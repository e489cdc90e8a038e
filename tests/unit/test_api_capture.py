"""Capture mode, run(), workflow_yaml(), the package surface and the Argo submitter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import couler
import couler.argo
from couler import ir
from couler.api.builder import current_builder, discard_implicit_builder, peek_builder
from couler.api.capture import capture_callable, capture_program
from couler.argo_submitter import ArgoSubmitter
from couler.errors import ConflictError, InvalidWorkflowError, RetryableError, UserError


@pytest.fixture(autouse=True)
def _fresh_builder() -> Iterator[None]:
    discard_implicit_builder()
    yield
    discard_implicit_builder()


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


# --------------------------------------------------------------------------- surface


SURFACE = [
    "run_container", "run_script", "run_job", "when", "equal", "not_equal", "bigger", "smaller",
    "bigger_equal", "smaller_equal", "map", "concurrent", "dag", "set_dependencies",
    "exec_while", "set_exit_handler", "config_workflow", "config_defaults",
    "create_parameter_artifact", "create_local_artifact", "create_s3_artifact",
    "create_oss_artifact", "create_secret", "obtain_secret", "get_secret", "get_step_output",
    "Cache", "WFStatus",
    "ImagePullPolicy", "add_volume", "Volume", "create_workflow_volume", "VolumeClaimTemplate",
    "VolumeMount", "add_toleration", "Toleration", "add_image_pull_secret", "ImagePullSecret",
    "set_dns", "DnsConfig", "set_security_context", "workflow_yaml", "run", "delete",
    "workflow", "workflow_parameter",
]


@pytest.mark.parametrize("module", [couler, couler.argo], ids=["couler", "couler.argo"])
def test_the_sdk_surface_is_exported(module: types.ModuleType) -> None:
    for name in SURFACE:
        assert name in module.__all__, name
        assert callable(getattr(module, name)), name


def test_import_couler_then_build_with_the_package_functions() -> None:
    with couler.workflow("top-level") as wf:
        couler.run_container(image="alpine:3.20", step_name="s")
    assert [s.name for s in wf.to_ir().steps] == ["s"]


def test_ir_and_submitter_import_on_their_own_without_kubernetes() -> None:
    code = ("import sys; sys.modules['kubernetes'] = None\n"
            "import couler.ir\n"
            "from couler.argo_submitter import ArgoSubmitter\n"
            "s = ArgoSubmitter()\n"
            "assert s.namespace == 'argo'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- capture


def test_capture_program_with_argo_submitter(tmp_path: Path) -> None:
    program = write(tmp_path, "my_pipeline.py", """\
        import sys

        import couler.argo as couler
        from couler.argo_submitter import ArgoSubmitter


        def train():
            return couler.run_container(image="trainer:1", args=[sys.argv[1]])


        train()
        couler.run(submitter=ArgoSubmitter())
        """)
    argv_before, path_before = list(sys.argv), list(sys.path)
    (wf,) = capture_program(str(program), ["--fast"])
    assert (sys.argv, sys.path) == (argv_before, path_before)
    assert wf.name == "my-pipeline"  # derived from the file name
    (step,) = wf.steps
    assert step.name == "train"
    assert step.inputs == (ir.InputParameter("para-train-0", ir.Literal.of("--fast")),)
    assert peek_builder() is None  # the caller's context is untouched


def test_each_run_records_a_workflow_and_resets_the_implicit_one(tmp_path: Path) -> None:
    program = write(tmp_path, "two.py", """\
        import couler.argo as couler

        couler.config_workflow(name="first")
        couler.run_container(image="alpine:3.20", step_name="a")
        couler.run()
        couler.config_workflow(name="second")
        couler.run_container(image="alpine:3.20", step_name="b")
        couler.run()
        """)
    first, second = capture_program(str(program))
    assert (first.name, [s.name for s in first.steps]) == ("first", ["a"])
    assert (second.name, [s.name for s in second.steps]) == ("second", ["b"])


def test_program_without_run_records_its_workflows(tmp_path: Path) -> None:
    implicit = write(tmp_path, "implicit.py", """\
        import couler.argo as couler
        couler.run_container(image="alpine:3.20", step_name="only")
        """)
    (wf,) = capture_program(str(implicit))
    assert (wf.name, [s.name for s in wf.steps]) == ("implicit", ["only"])
    explicit = write(tmp_path, "explicit.py", """\
        import couler.argo as couler
        with couler.workflow("scoped"):
            couler.run_container(image="alpine:3.20", step_name="inside")
        """)
    (wf,) = capture_program(str(explicit))
    assert (wf.name, [s.name for s in wf.steps]) == ("scoped", ["inside"])


def test_program_importing_a_sibling_module(tmp_path: Path) -> None:
    write(tmp_path, "steps_lib.py", """\
        import couler.argo as couler

        def hello():
            return couler.run_container(image="alpine:3.20", command=["echo", "hello"])
        """)
    program = write(tmp_path, "uses_lib.py", """\
        import steps_lib
        steps_lib.hello()
        """)
    (wf,) = capture_program(str(program))
    assert [s.name for s in wf.steps] == ["hello"]
    sys.modules.pop("steps_lib", None)


def test_a_failing_program_names_its_path_line_and_error(tmp_path: Path) -> None:
    program = write(tmp_path, "broken.py", """\
        import couler.argo as couler

        couler.run_container(image="alpine:3.20", step_name="ok")
        values = {}
        values["missing"]
        """)
    with pytest.raises(InvalidWorkflowError) as info:
        capture_program(str(program))
    message = str(info.value)
    assert f"{program}, line 5" in message
    assert "KeyError: 'missing'" in message
    assert isinstance(info.value.__cause__, KeyError)
    assert peek_builder() is None


def test_a_program_whose_workflow_is_invalid(tmp_path: Path) -> None:
    program = write(tmp_path, "invalid.py", """\
        import couler.argo as couler
        couler.run_container(image="alpine:3.20", step_name="s",
                             output=couler.create_parameter_artifact("not/absolute"))
        couler.run()
        """)
    with pytest.raises(InvalidWorkflowError, match=r"(?s)line 4: .*ValidationError.*step 's'"):
        capture_program(str(program))


def test_sys_exit_in_a_program(tmp_path: Path) -> None:
    ok = write(tmp_path, "ok_exit.py", """\
        import sys
        import couler.argo as couler
        couler.run_container(image="alpine:3.20", step_name="s")
        couler.run()
        sys.exit(0)
        """)
    assert len(capture_program(str(ok))) == 1
    bad = write(tmp_path, "bad_exit.py", "import sys\nsys.exit(3)\n")
    with pytest.raises(InvalidWorkflowError, match=r"line 2: .*exit status 3"):
        capture_program(str(bad))
    with pytest.raises(UserError, match="does not exist"):
        capture_program(str(tmp_path / "missing.py"))


def test_capture_callable_propagates_exceptions_and_restores_state() -> None:
    outer = current_builder()
    with pytest.raises(ZeroDivisionError):
        capture_callable(lambda: 1 / 0)
    assert current_builder() is outer


# --------------------------------------------------------------------------- run()


class FakeSubmitter:
    def __init__(self) -> None:
        self.calls: list[tuple[ir.Workflow, list[Any], dict[str, Any]]] = []

    def submit(self, workflow: ir.Workflow, secrets: list[Any], **kwargs: Any) -> str:
        self.calls.append((workflow, list(secrets), kwargs))
        return "submitted"


def test_run_submits_ir_and_secret_material_then_resets_the_implicit_builder() -> None:
    submitter = FakeSubmitter()
    couler.config_workflow(name="submit-me")
    creds = couler.create_secret({"TOKEN": "t0ken"})
    couler.run_container(image="alpine:3.20", secret=creds, step_name="s")
    before = current_builder()
    assert couler.run(submitter=submitter) == "submitted"
    ((wf, secrets, kwargs),) = submitter.calls
    assert wf.name == "submit-me" and [s.name for s in wf.steps] == ["s"]
    assert [(m.name, m.reveal()) for m in secrets] == [("submit-me-secret-1", {"TOKEN": "t0ken"})]
    assert kwargs == {}
    assert current_builder() is not before and not current_builder().has_steps


def test_run_without_submitter_is_a_clear_error_and_still_resets() -> None:
    couler.run_container(image="alpine:3.20", step_name="s")
    with pytest.raises(UserError, match="run\\(\\) needs a submitter"):
        couler.run()
    assert not current_builder().has_steps


def test_run_inside_an_explicit_scope_keeps_the_scope() -> None:
    submitter = FakeSubmitter()
    with couler.workflow("kept") as wf:
        couler.run_container(image="alpine:3.20", step_name="s")
        couler.run(submitter=submitter)
        assert current_builder() is wf and wf.has_steps
    assert wf.run(submitter) == "submitted"
    assert len(submitter.calls) == 2


def test_run_instantiates_a_submitter_class_and_passes_cluster_config(tmp_path: Path) -> None:
    config = write(tmp_path, "cluster.py", "cluster = None\n")
    calls: list[dict[str, Any]] = []

    class Recorder:
        def submit(self, workflow: ir.Workflow, secrets: list[Any], **kwargs: Any) -> None:
            calls.append(kwargs)

    couler.config_workflow(name="cc", cluster_config_file=str(config))
    couler.run_container(image="alpine:3.20", step_name="s")
    couler.run(submitter=Recorder)
    assert calls == [{"cluster_config_file": str(config.resolve())}]


# --------------------------------------------------------------------------- workflow_yaml()


CLUSTER = """\
class Cluster:
    def config_pod(self, template):
        template.setdefault("nodeSelector", {})["pool"] = "batch"

    def config_workflow(self, spec):
        spec["serviceAccountName"] = "cluster-sa"


cluster = Cluster()
"""


def test_workflow_yaml_compiles_with_the_argo_compiler_and_applies_cluster_hooks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ir.Workflow] = []

    def compile_workflow(wf: ir.Workflow) -> dict[str, Any]:
        seen.append(wf)
        return {"kind": "Workflow", "spec": {"templates": [
            {"name": "s", "container": {"image": "alpine:3.20"}}, {"name": "main", "dag": {}}]}}

    fake = types.ModuleType("couler.compilers.argo")
    fake.compile_workflow = compile_workflow  # type: ignore[attr-defined]
    fake.to_yaml = yaml.safe_dump  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "couler.compilers.argo", fake)
    config = write(tmp_path, "cluster.py", CLUSTER)
    couler.config_workflow(name="hooked", cluster_config_file=str(config))
    couler.run_container(image="alpine:3.20", step_name="s")
    doc = couler.workflow_yaml()
    assert seen[0].name == "hooked"
    assert doc["spec"]["templates"][0]["nodeSelector"] == {"pool": "batch"}
    assert "nodeSelector" not in doc["spec"]["templates"][1]
    assert doc["spec"]["serviceAccountName"] == "cluster-sa"
    assert current_builder().has_steps  # workflow_yaml does not reset
    assert yaml.safe_load(current_builder().to_yaml())["spec"]["serviceAccountName"] == \
        "cluster-sa"


def test_workflow_yaml_with_the_real_compiler() -> None:
    couler.config_workflow(name="real", cron_config={"schedule": "0 * * * *"})
    couler.run_container(image="alpine:3.20", command=["date"], step_name="tick")
    doc = couler.workflow_yaml()
    assert doc["kind"] == "CronWorkflow"
    assert isinstance(yaml.safe_load(current_builder().to_yaml()), dict)


def test_bad_cluster_config_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        couler.config_workflow(cluster_config_file=str(tmp_path / "none.py"))
    empty = write(tmp_path, "empty.py", "x = 1\n")
    with pytest.raises(UserError, match="defines no 'cluster'"):
        couler.argo.apply_cluster_config({"spec": {}}, str(empty))


# --------------------------------------------------------------------------- ArgoSubmitter


class FakeApiError(Exception):
    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class FakeKube:
    """Stand-ins for the kubernetes package's modules, recording every call."""

    def __init__(self, secret_status: int | None = None, create_status: int | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        kube = self

        class CustomObjectsApi:
            def create_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
                kube.calls.append(("create", *args))
                if create_status is not None:
                    raise FakeApiError(create_status, "nope")
                return {"metadata": {"name": "created"}}

            def delete_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> str:
                kube.calls.append(("delete", *args, kwargs))
                return "deleted"

        class CoreV1Api:
            def create_namespaced_secret(self, namespace: str, body: dict[str, Any]) -> None:
                kube.calls.append(("secret", namespace, body))
                if secret_status is not None:
                    raise FakeApiError(secret_status, "exists")

            def replace_namespaced_secret(self, name: str, namespace: str,
                                          body: dict[str, Any]) -> None:
                kube.calls.append(("replace", name, namespace, body))

        class ConfigException(Exception):  # noqa: N818 - the kubernetes name
            pass

        def load_kube_config(**kwargs: Any) -> None:
            kube.calls.append(("config", kwargs))

        self.modules = {
            "kubernetes": types.ModuleType("kubernetes"),
            "kubernetes.client": types.ModuleType("kubernetes.client"),
            "kubernetes.client.rest": types.ModuleType("kubernetes.client.rest"),
            "kubernetes.config": types.ModuleType("kubernetes.config"),
        }
        client, rest, config = (self.modules["kubernetes.client"],
                                self.modules["kubernetes.client.rest"],
                                self.modules["kubernetes.config"])
        client.CustomObjectsApi = CustomObjectsApi  # type: ignore[attr-defined]
        client.CoreV1Api = CoreV1Api  # type: ignore[attr-defined]
        rest.ApiException = FakeApiError  # type: ignore[attr-defined]
        config.ConfigException = ConfigException  # type: ignore[attr-defined]
        config.load_kube_config = load_kube_config  # type: ignore[attr-defined]
        config.load_incluster_config = lambda: None  # type: ignore[attr-defined]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name, module in self.modules.items():
            monkeypatch.setitem(sys.modules, name, module)


def _workflow_with_secrets() -> tuple[ir.Workflow, list[Any]]:
    with couler.workflow("sub") as wf:
        real = couler.create_secret({"TOKEN": "t0ken"})
        dry = couler.create_secret({"OTHER": "x"}, dry_run=True)
        couler.run_container(image="alpine:3.20", secret=real, step_name="a")
        couler.run_container(image="alpine:3.20", secret=dry, step_name="b")
    return wf.to_ir(), wf.secret_material()


def test_argo_submitter_without_kubernetes_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    monkeypatch.setitem(sys.modules, "kubernetes.client", None)
    workflow, secrets = _workflow_with_secrets()
    with pytest.raises(UserError, match="pip install kubernetes"):
        ArgoSubmitter().submit(workflow, secrets)


def test_argo_submitter_creates_secrets_then_the_workflow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.install(monkeypatch)
    workflow, secrets = _workflow_with_secrets()
    result = ArgoSubmitter(namespace="ml", config_file="/kube/config").submit(workflow, secrets)
    assert result == {"metadata": {"name": "created"}}
    config, secret, create = kube.calls
    assert config == ("config", {"config_file": "/kube/config", "context": None,
                                 "client_configuration": None})
    assert secret[0:2] == ("secret", "ml")
    assert secret[2]["metadata"]["name"] == "sub-secret-1"
    assert secret[2]["stringData"] == {"TOKEN": "t0ken"}  # the dry-run secret is skipped
    assert create[0:5] == ("create", "argoproj.io", "v1alpha1", "ml", "workflows")
    assert create[5]["kind"] == "Workflow"
    assert "t0ken" not in repr(create[5])


def test_argo_submitter_replaces_existing_secrets_and_maps_errors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube(secret_status=409, create_status=409)
    kube.install(monkeypatch)
    workflow, secrets = _workflow_with_secrets()
    with pytest.raises(ConflictError, match="409"):
        ArgoSubmitter().submit(workflow, secrets)
    assert [c[0] for c in kube.calls] == ["config", "secret", "replace", "create"]
    kube = FakeKube(create_status=503)
    kube.install(monkeypatch)
    with pytest.raises(RetryableError, match="503"):
        ArgoSubmitter().submit(workflow, [])


def test_argo_submitter_cron_plural_and_delete(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.install(monkeypatch)
    with couler.workflow("nightly", cron_config={"schedule": "0 2 * * *"}) as wf:
        couler.run_container(image="alpine:3.20", step_name="s")
    ArgoSubmitter().submit(wf.to_ir())
    assert kube.calls[-1][4] == "cronworkflows"
    assert couler.delete("old-run", namespace="ml") == "deleted"
    assert kube.calls[-1] == ("delete", "argoproj.io", "v1alpha1", "ml", "workflows", "old-run",
                              {"grace_period_seconds": 5, "propagation_policy": "Background"})
