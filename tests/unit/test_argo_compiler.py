"""Tests of the IR -> Argo compiler (:mod:`couler.compilers.argo`).

Every compiled document is also checked against the vendored Argo JSON schema,
including the walk that rejects keys the schema does not declare.
"""

from __future__ import annotations

import json
import re
import sys
import types
from typing import Any

import pytest
import yaml

from couler import ir
from couler.compilers import argo
from couler.errors import UnsupportedFeatureError, ValidationError
from tests.argo_schema import assert_valid_argo, unknown_keys, validate_argo

# --------------------------------------------------------------------------- helpers

S = ir.Step
L = ir.Literal.of


def ctr(image: str = "alpine:3.19", *args: str, command: tuple[str, ...] = ("sh", "-c")
        ) -> ir.ContainerSpec:
    return ir.ContainerSpec(image, command, args)


def wf_of(*steps: ir.Step, **kw: Any) -> ir.Workflow:
    return ir.Workflow(kw.pop("name", "wf"), tuple(steps), **kw)


def compile_ok(wf: ir.Workflow) -> dict[str, Any]:
    doc = argo.compile_workflow(wf)
    assert_valid_argo(doc)
    return doc


def spec(doc: dict[str, Any]) -> dict[str, Any]:
    s = doc["spec"]
    return s["workflowSpec"] if doc["kind"] == "CronWorkflow" else s


def templates(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in spec(doc)["templates"]}


def tmpl(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return templates(doc)[name]


def tasks(doc: dict[str, Any], template: str | None = None) -> dict[str, dict[str, Any]]:
    name = template or spec(doc)["entrypoint"]
    return {t["name"]: t for t in tmpl(doc, name)["dag"]["tasks"]}


def task(doc: dict[str, Any], name: str, template: str | None = None) -> dict[str, Any]:
    return tasks(doc, template)[name]


def step_tmpl(doc: dict[str, Any], step: str, template: str | None = None) -> dict[str, Any]:
    return tmpl(doc, task(doc, step, template)["template"])


def args_of(t: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in t.get("arguments", {}).get("parameters", [])}


def in_params(t: dict[str, Any]) -> list[str]:
    return [p["name"] for p in t.get("inputs", {}).get("parameters", [])]


# --------------------------------------------------------------------------- schema helper


def test_schema_helper_reports_unknown_keys_and_wrong_types() -> None:
    doc = {
        "apiVersion": argo.API_VERSION, "kind": "Workflow", "metadata": {"generateName": "x-"},
        "spec": {"entrypoint": "x", "templatse": [],
                 "templates": [{"name": "x", "containr": {"image": "a"},
                                "retryStrategy": {"limit": 3}}]},
    }
    problems = validate_argo(doc)
    assert "spec.templatse: unknown field" in problems
    assert "spec.templates[0].containr: unknown field" in problems
    assert any("limit" in p and "string" in p for p in problems)
    assert validate_argo({"kind": "Pod"}) == ["kind: 'Pod' is not one of Workflow, CronWorkflow, "
                                              "WorkflowTemplate, ClusterWorkflowTemplate"]
    # free-form objects (withItems entries) and maps (labels) are walked correctly
    schema = {"$ref": "#/definitions/io.argoproj.workflow.v1alpha1.DAGTask"}
    assert list(unknown_keys({"name": "a", "withItems": [{"anything": 1}]}, schema)) == []


# --------------------------------------------------------------------------- document shape


def test_minimal_workflow_metadata_and_entrypoint() -> None:
    wf = wf_of(S("hello", ctr("alpine:3.19", "echo hi")), name="greet", tenant="team-a",
               labels=ir.pairs({"app": "demo"}), annotations=ir.pairs({"owner": "ml"}))
    doc = compile_ok(wf)
    assert doc["apiVersion"] == "argoproj.io/v1alpha1"
    assert doc["kind"] == "Workflow"
    assert doc["metadata"] == {"generateName": "greet-", "namespace": "team-a",
                               "labels": {"app": "demo"}, "annotations": {"owner": "ml"}}
    s = doc["spec"]
    assert s["entrypoint"] == "greet"
    assert s["templates"][0] == {"name": "greet", "dag": {"tasks": [
        {"name": "hello", "template": "hello"}]}}
    assert tmpl(doc, "hello")["container"] == {
        "image": "alpine:3.19", "command": ["sh", "-c"], "args": ["echo hi"]}


def test_event_triggers_are_recorded_in_an_annotation() -> None:
    wf = wf_of(S("a", ctr()), triggers=(ir.EventTrigger("data.ready", "size > 10"),
                                        ir.EventTrigger("models.>")))
    doc = compile_ok(wf)
    recorded = json.loads(doc["metadata"]["annotations"][argo.TRIGGERS_ANNOTATION])
    assert recorded == [{"subject": "data.ready", "filter": "size > 10"},
                        {"subject": "models.>", "filter": ""}]


def test_workflow_parameters_become_arguments() -> None:
    wf = wf_of(
        S("a", ctr("alpine", "echo {{inputs.lr}} {{inputs.mode}}"),
          inputs=(ir.InputParameter("lr", ir.WorkflowParamRef("lr"), ir.ValueType.FLOAT),
                  ir.InputParameter("mode", ir.WorkflowParamRef("mode")))),
        parameters=(
            ir.Parameter("lr", ir.ValueType.FLOAT, L(0.1), "learning rate"),
            ir.Parameter("mode", default=L("fast"), enum=(L("fast"), L("slow"))),
            ir.Parameter("flag", ir.ValueType.BOOL, L(True)),
            ir.Parameter("required"),
        ))
    doc = compile_ok(wf)
    assert doc["spec"]["arguments"] == {"parameters": [
        {"name": "lr", "value": "0.1", "description": "learning rate"},
        {"name": "mode", "value": "fast", "enum": ["fast", "slow"]},
        {"name": "flag", "value": "true"},
        {"name": "required"},
    ]}
    assert args_of(task(doc, "a")) == {"lr": "{{workflow.parameters.lr}}",
                                       "mode": "{{workflow.parameters.mode}}"}
    assert tmpl(doc, "a")["container"]["args"] == [
        "echo {{inputs.parameters.lr}} {{inputs.parameters.mode}}"]


def test_workflow_level_pod_settings() -> None:
    wf = wf_of(
        S("a", ctr()),
        service_account="runner", image_pull_secrets=("regcred", "other"),
        dns=ir.DnsConfig("None", ("1.1.1.1",), ("svc.local",), (("ndots", "2"), ("edns0", ""))),
        security_context=ir.SecurityContext(1000, 2000, 3000, True),
        timeout_seconds=3600, ttl_seconds=600, parallelism=5,
        node_selector=ir.pairs({"pool": "cpu"}),
        tolerations=(ir.Toleration("gpu", "Exists", effect="NoSchedule"),
                     ir.Toleration("spot", value="yes", toleration_seconds=30)),
    )
    s = compile_ok(wf)["spec"]
    assert s["serviceAccountName"] == "runner"
    assert s["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
    assert s["dnsPolicy"] == "None"
    assert s["dnsConfig"] == {"nameservers": ["1.1.1.1"], "searches": ["svc.local"],
                              "options": [{"name": "edns0"}, {"name": "ndots", "value": "2"}]}
    assert s["securityContext"] == {"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 3000,
                                    "runAsNonRoot": True}
    assert s["activeDeadlineSeconds"] == 3600
    assert s["ttlStrategy"] == {"secondsAfterCompletion": 600}
    assert "ttlSecondsAfterFinished" not in s
    assert s["parallelism"] == 5
    assert s["nodeSelector"] == {"pool": "cpu"}
    assert s["tolerations"] == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Equal", "value": "yes", "tolerationSeconds": 30}]


def test_volumes_claim_templates_and_mounts() -> None:
    vols = (
        ir.Volume("data", ir.VolumeKind.PVC, claim_name="data-pvc"),
        ir.Volume("scratch", ir.VolumeKind.EMPTY_DIR),
        ir.Volume("conf", ir.VolumeKind.CONFIG_MAP, claim_name="app-conf"),
        ir.Volume("creds", ir.VolumeKind.SECRET, claim_name="app-creds"),
        ir.Volume("work", ir.VolumeKind.CLAIM_TEMPLATE, size="10Gi",
                  access_modes=("ReadWriteMany",), storage_class="fast"),
        ir.Volume("cache", ir.VolumeKind.CLAIM_TEMPLATE, size="1Gi"),
    )
    step = S("a", ctr(), volume_mounts=(
        ir.VolumeMount("data", "/data", read_only=True),
        ir.VolumeMount("work", "/work", sub_path="run"),
        ir.VolumeMount("couler-out-dir-0", "/out"),
    ))
    doc = compile_ok(wf_of(step, volumes=vols))
    s = doc["spec"]
    assert s["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data-pvc"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "conf", "configMap": {"name": "app-conf"}},
        {"name": "creds", "secret": {"secretName": "app-creds"}},
    ]
    assert s["volumeClaimTemplates"] == [
        {"metadata": {"name": "work"}, "spec": {
            "accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}},
            "storageClassName": "fast"}},
        {"metadata": {"name": "cache"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
    ]
    t = tmpl(doc, "a")
    assert t["container"]["volumeMounts"] == [
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "work", "mountPath": "/work", "subPath": "run"},
        {"name": "couler-out-dir-0", "mountPath": "/out"},
    ]
    assert t["volumes"] == [{"name": "couler-out-dir-0", "emptyDir": {}}]


# --------------------------------------------------------------------------- templates


def test_content_identical_steps_share_one_template() -> None:
    body = ctr("alpine", "echo {{inputs.msg}}")
    steps = [S(f"s{i}", body, template="echo",
               inputs=(ir.InputParameter("msg", L(f"hello {i}")),)) for i in range(3)]
    doc = compile_ok(wf_of(*steps))
    assert [t["template"] for t in tasks(doc).values()] == ["echo", "echo", "echo"]
    assert sorted(templates(doc)) == ["echo", "wf"]
    assert [args_of(t)["msg"] for t in tasks(doc).values()] == ["hello 0", "hello 1", "hello 2"]


def test_same_hint_different_body_gets_its_own_template() -> None:
    doc = compile_ok(wf_of(
        S("a", ctr("alpine:3.19", "echo hi"), template="echo"),
        S("b", ctr("busybox:1.36", "echo hi"), template="echo"),  # other image
        S("c", ctr("alpine:3.19", "echo hi"), template="echo"),  # same as a
        S("d", ctr("alpine:3.19", "echo bye"), template="echo"),  # other args
        S("e", ctr("alpine:3.19", "echo hi"), template="echo",
          resources=ir.Resources(cpu_limit="1")),  # other policy
    ))
    names = {n: t["template"] for n, t in tasks(doc).items()}
    assert names == {"a": "echo", "b": "echo-2", "c": "echo", "d": "echo-3", "e": "echo-4"}
    ts = templates(doc)
    assert ts["echo"]["container"]["image"] == "alpine:3.19"
    assert ts["echo-2"]["container"]["image"] == "busybox:1.36"
    assert ts["echo-3"]["container"]["args"] == ["echo bye"]
    assert ts["echo-4"]["container"]["resources"] == {"limits": {"cpu": "1"}}


def test_template_names_are_made_valid_and_avoid_the_entrypoint() -> None:
    doc = compile_ok(wf_of(
        S("a", ctr("alpine", "x"), template="train_model.v2"),
        S("b", ctr("alpine", "y"), template="wf"),  # the entrypoint's name
        S("c", ctr("alpine", "z")),  # no hint: the step name
    ))
    assert {n: t["template"] for n, t in tasks(doc).items()} == {
        "a": "train-model-v2", "b": "wf-2", "c": "c"}


def _reserve_lines(n: int) -> tuple[int, Any]:
    """Compile ``n`` distinct bodies sharing one template hint; the lines the compiler's
    name reservation executed (traced) and the document."""
    steps = [S(f"s{i}", ctr("alpine", f"echo {i}"), template="work") for i in range(n)]
    code = argo._Compiler.reserve.__code__
    count = 0

    def local(frame: types.FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def global_(frame: types.FrameType, event: str, arg: object) -> Any:
        return local if frame.f_code is code else None

    sys.settrace(global_)
    try:
        doc = argo.compile_workflow(wf_of(*steps))
    finally:
        sys.settrace(None)
    return count, doc


def test_many_distinct_bodies_sharing_a_hint_get_unique_names_in_linear_work() -> None:
    # The numbering resumes where it stopped: the work per name does not grow with the
    # names already handed out (probing "work-2", "work-3"... from 2 each time would make
    # it quadratic) -- counted in lines executed, not in seconds.
    small, _ = _reserve_lines(300)
    lines, doc = _reserve_lines(3000)
    assert small > 300 and lines < 20 * small, (small, lines)  # quadratic: ~100 times
    names = [t["template"] for t in tasks(doc).values()]
    assert names[:3] == ["work", "work-2", "work-3"]
    assert len(set(names)) == 3000


def test_container_fields() -> None:
    step = S(
        "train",
        ir.ContainerSpec("trainer:1.0", ("python", "train.py"), ("--epochs", "{{inputs.epochs}}"),
                         working_dir="/app", image_pull_policy="IfNotPresent"),
        inputs=(ir.InputParameter("epochs", L(3), ir.ValueType.INT),),
        env=(ir.EnvVar("MODE", "fast"), ir.EnvVar("EPOCHS", "{{inputs.epochs}}"),
             ir.EnvVar("TOKEN", secret=ir.SecretRef("api-token", "token"))),
        resources=ir.Resources("500m", "2", "1Gi", "4Gi", gpu=2),
    )
    doc = compile_ok(wf_of(step))
    c = tmpl(doc, "train")["container"]
    assert c == {
        "image": "trainer:1.0",
        "command": ["python", "train.py"],
        "args": ["--epochs", "{{inputs.parameters.epochs}}"],
        "workingDir": "/app",
        "imagePullPolicy": "IfNotPresent",
        "env": [
            {"name": "MODE", "value": "fast"},
            {"name": "EPOCHS", "value": "{{inputs.parameters.epochs}}"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api-token",
                                                             "key": "token"}}},
        ],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                      "limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"}},
    }
    assert args_of(task(doc, "train")) == {"epochs": "3"}


def test_gpu_resource_name_is_configurable() -> None:
    step = S("a", ctr(), resources=ir.Resources(gpu=1, gpu_resource="amd.com/gpu"))
    assert tmpl(compile_ok(wf_of(step)), "a")["container"]["resources"] == {
        "limits": {"amd.com/gpu": "1"}}


@pytest.mark.parametrize(("language", "command"), [
    (ir.ScriptLanguage.PYTHON, ["python"]),
    (ir.ScriptLanguage.BASH, ["bash"]),
    (ir.ScriptLanguage.SH, ["sh"]),
])
def test_script_default_command_by_language(language: ir.ScriptLanguage,
                                            command: list[str]) -> None:
    source = "echo one\necho two\n"
    doc = compile_ok(wf_of(S("s", ir.ScriptSpec("img", source, language))))
    assert tmpl(doc, "s")["script"] == {"image": "img", "command": command, "source": source}
    text = argo.to_yaml(doc)
    assert "source: |\n" in text  # multi-line strings are block literals


def test_script_explicit_command_args_and_source_placeholders() -> None:
    step = S("s", ir.ScriptSpec("python:3.11", "print('{{inputs.n}}')\n",
                                command=("python3", "-u"), args=("{{inputs.n}}",)),
             inputs=(ir.InputParameter("n", L(1), ir.ValueType.INT),))
    script = tmpl(compile_ok(wf_of(step)), "s")["script"]
    assert script["command"] == ["python3", "-u"]
    assert script["args"] == ["{{inputs.parameters.n}}"]
    assert script["source"] == "print('{{inputs.parameters.n}}')\n"


def test_job_becomes_a_resource_template() -> None:
    manifest = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"generateName": "train-"},
                "spec": {"replicas": "{{inputs.workers}}"}}
    step = S("job", ir.JobSpec.of(manifest, action=ir.JobAction.APPLY,
                                  success_condition="status.succeeded > 0",
                                  failure_condition="status.failed > 0"),
             inputs=(ir.InputParameter("workers", L(2), ir.ValueType.INT),),
             outputs=(ir.OutputParameter("job-name", ir.OutputSource.JSON_PATH,
                                         "{.metadata.name}"),
                      ir.OutputParameter("phase", ir.OutputSource.JQ, ".status.phase",
                                         global_name="job-phase")),
             retry=ir.RetryPolicy(2), timeout_seconds=600)
    doc = compile_ok(wf_of(step))
    t = tmpl(doc, "job")
    r = t["resource"]
    assert r["action"] == "apply"
    assert r["successCondition"] == "status.succeeded > 0"
    assert r["failureCondition"] == "status.failed > 0"
    assert r["setOwnerReference"] is True
    expected = dict(manifest, spec={"replicas": "{{inputs.parameters.workers}}"})
    assert yaml.safe_load(r["manifest"]) == expected
    assert t["outputs"] == {"parameters": [
        {"name": "job-name", "valueFrom": {"jsonPath": "{.metadata.name}"}},
        {"name": "phase", "valueFrom": {"jqFilter": ".status.phase"}, "globalName": "job-phase"},
    ]}
    assert t["timeout"] == "600s"  # activeDeadlineSeconds is for container/script templates
    assert "activeDeadlineSeconds" not in t
    assert t["retryStrategy"]["limit"] == "2"


def test_job_without_owner_reference() -> None:
    step = S("job", ir.JobSpec.of({"apiVersion": "v1", "kind": "ConfigMap"},
                                  action=ir.JobAction.CREATE, set_owner_reference=False))
    r = tmpl(compile_ok(wf_of(step)), "job")["resource"]
    assert r == {"action": "create", "manifest": "apiVersion: v1\nkind: ConfigMap\n"}


def test_inline_subworkflow_is_a_nested_dag() -> None:
    inner = (
        S("prep", ctr("alpine", "prep"), outputs=(ir.OutputParameter("out",
                                                                      ir.OutputSource.STDOUT),)),
        S("fit", ctr("alpine", "fit"), dependencies=(ir.Dependency("prep"),),
          outputs=(ir.OutputParameter("model", ir.OutputSource.PATH, "/tmp/model"),)),
    )
    group = S("group", ir.SubWorkflowSpec("training", inner), template="training",
              outputs=(ir.OutputParameter("model", selector="/tmp/model"),),
              retry=ir.RetryPolicy(1), parallelism=2)
    after = S("after", ctr("alpine", "echo {{inputs.m}}"),
              inputs=(ir.InputParameter("m", ir.StepOutputRef("group", "model")),),
              dependencies=(ir.Dependency("group"),))
    doc = compile_ok(wf_of(group, after))
    t = tmpl(doc, "training")
    assert t["dag"]["tasks"] == [
        {"name": "prep", "template": "prep"},
        {"name": "fit", "template": "fit", "depends": "prep"},
    ]
    assert t["outputs"] == {"parameters": [
        {"name": "model", "valueFrom": {"parameter": "{{tasks.fit.outputs.parameters.model}}"}}]}
    assert t["parallelism"] == 2
    assert t["retryStrategy"] == {"limit": "1", "retryPolicy": "Always"}
    assert args_of(task(doc, "after")) == {"m": "{{tasks.group.outputs.parameters.model}}"}


def test_external_subworkflow_creates_a_workflow_and_waits() -> None:
    step = S("child", ir.SubWorkflowSpec("etl-part-2", digest="sha256:abc"),
             inputs=(ir.InputParameter("day", L("2024-01-01")),))
    doc = compile_ok(wf_of(step))
    r = tmpl(doc, "child")["resource"]
    assert r["action"] == "create"
    assert r["successCondition"] == "status.phase == Succeeded"
    assert r["failureCondition"] == "status.phase in (Failed, Error)"
    assert r["setOwnerReference"] is True
    assert yaml.safe_load(r["manifest"]) == {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"generateName": "etl-part-2-",
                     "annotations": {argo.DIGEST_ANNOTATION: "sha256:abc"}},
        "spec": {"workflowTemplateRef": {"name": "etl-part-2"},
                 "arguments": {"parameters": [{"name": "day",
                                               "value": "{{inputs.parameters.day}}"}]}},
    }
    assert args_of(task(doc, "child")) == {"day": "2024-01-01"}


# --------------------------------------------------------------------------- values


def test_placeholders_are_translated_and_workflow_name_kept() -> None:
    step = S("a", ctr("alpine", "run {{inputs.x}} --name={{workflow.name}} {{ inputs.x }}"),
             inputs=(ir.InputParameter("x", L("v")),))
    args = tmpl(compile_ok(wf_of(step)), "a")["container"]["args"]
    assert args == ["run {{inputs.parameters.x}} --name={{workflow.name}} "
                    "{{inputs.parameters.x}}"]


def test_input_sources() -> None:
    up = S("up", ctr("alpine", "produce"), outputs=(
        ir.OutputParameter("file", ir.OutputSource.PATH, "/tmp/f"),
        ir.OutputParameter("text", ir.OutputSource.STDOUT),
    ))
    down = S("down", ctr("alpine", "consume"), dependencies=(ir.Dependency("up"),), inputs=(
        ir.InputParameter("s", L("plain text")),
        ir.InputParameter("i", L(42), ir.ValueType.INT),
        ir.InputParameter("f", L(1.5), ir.ValueType.FLOAT),
        ir.InputParameter("b", L(False), ir.ValueType.BOOL),
        ir.InputParameter("j", L({"k": [1, 2]}), ir.ValueType.JSON),
        ir.InputParameter("from-file", ir.StepOutputRef("up", "file")),
        ir.InputParameter("from-stdout", ir.StepOutputRef("up", "text")),
        ir.InputParameter("p", ir.WorkflowParamRef("p")),
    ))
    doc = compile_ok(wf_of(up, down, parameters=(ir.Parameter("p", default=L("x")),)))
    assert args_of(task(doc, "down")) == {
        "s": "plain text", "i": "42", "f": "1.5", "b": "false", "j": '{"k":[1,2]}',
        "from-file": "{{tasks.up.outputs.parameters.file}}",
        "from-stdout": "{{tasks.up.outputs.result}}",
        "p": "{{workflow.parameters.p}}",
    }
    assert in_params(tmpl(doc, "down")) == ["s", "i", "f", "b", "j", "from-file",
                                            "from-stdout", "p"]


def test_outputs() -> None:
    step = S("a", ctr(), outputs=(
        ir.OutputParameter("acc", ir.OutputSource.PATH, "/tmp/acc", ir.ValueType.FLOAT,
                           global_name="best-acc"),
        ir.OutputParameter("log", ir.OutputSource.STDOUT),
    ))
    t = tmpl(compile_ok(wf_of(step)), "a")
    assert t["outputs"] == {"parameters": [
        {"name": "acc", "valueFrom": {"path": "/tmp/acc"}, "globalName": "best-acc"}]}


def test_global_stdout_output_is_exported_through_a_wrapper() -> None:
    a = S("a", ctr("alpine", "echo 1"), template="emit",
          outputs=(ir.OutputParameter("out", ir.OutputSource.STDOUT, global_name="answer"),))
    b = S("b", ctr("alpine", "echo {{inputs.x}}"), dependencies=(ir.Dependency("a"),),
          inputs=(ir.InputParameter("x", ir.StepOutputRef("a", "out")),))
    doc = compile_ok(wf_of(a, b))
    wrapper = step_tmpl(doc, "a")
    assert wrapper["name"] == "emit-export"
    assert wrapper["outputs"] == {"parameters": [
        {"name": "out", "valueFrom": {"parameter": "{{tasks.body.outputs.result}}"},
         "globalName": "answer"}]}
    assert wrapper["dag"]["tasks"] == [{"name": "body", "template": "emit"}]
    assert args_of(task(doc, "b")) == {"x": "{{tasks.a.outputs.parameters.out}}"}


def test_artifacts_with_storage_and_from_steps() -> None:
    key = ir.SecretRef("s3-creds", "access")
    secret = ir.SecretRef("s3-creds", "secret")
    producer = S("produce", ctr(), output_artifacts=(
        ir.OutputArtifact("model", "/out/model", ir.ArtifactLocation(
            ir.StorageKind.S3, "minio:9000", "models", "run/model.pt", insecure=True,
            access_key=key, secret_key=secret), global_name="final-model"),
        ir.OutputArtifact("report", "/out/report", ir.ArtifactLocation(
            ir.StorageKind.OSS, "oss.example.com", "b", "r.txt", access_key=key,
            secret_key=secret)),
        ir.OutputArtifact("plot", "/out/plot", ir.ArtifactLocation(
            ir.StorageKind.GCS, bucket="g", key="p.png", secret_key=secret)),
        ir.OutputArtifact("hdfs", "/out/h", ir.ArtifactLocation(
            ir.StorageKind.HDFS, endpoint="nn1:8020,nn2:8020", key="/data/h")),
        ir.OutputArtifact("plain", "/out/plain"),
    ))
    consumer = S("consume", ctr(), dependencies=(ir.Dependency("produce"),), input_artifacts=(
        ir.InputArtifact("model", "/in/model", ir.StepArtifactRef("produce", "model")),
        ir.InputArtifact("code", "/src", ir.ArtifactLocation(
            ir.StorageKind.GIT, url="https://github.com/x/y.git", revision="main",
            access_key=key, secret_key=secret)),
        ir.InputArtifact("data", "/in/data", ir.ArtifactLocation(
            ir.StorageKind.HTTP, url="https://example.com/d.csv")),
    ))
    doc = compile_ok(wf_of(producer, consumer))
    creds = {"accessKeySecret": {"name": "s3-creds", "key": "access"},
             "secretKeySecret": {"name": "s3-creds", "key": "secret"}}
    assert tmpl(doc, "produce")["outputs"]["artifacts"] == [
        {"name": "model", "path": "/out/model", "globalName": "final-model",
         "s3": {"endpoint": "minio:9000", "bucket": "models", "key": "run/model.pt",
                "insecure": True, **creds}},
        {"name": "report", "path": "/out/report",
         "oss": {"endpoint": "oss.example.com", "bucket": "b", "key": "r.txt", **creds}},
        {"name": "plot", "path": "/out/plot",
         "gcs": {"bucket": "g", "key": "p.png",
                 "serviceAccountKeySecret": {"name": "s3-creds", "key": "secret"}}},
        {"name": "hdfs", "path": "/out/h",
         "hdfs": {"path": "/data/h", "addresses": ["nn1:8020", "nn2:8020"]}},
        {"name": "plain", "path": "/out/plain"},
    ]
    assert tmpl(doc, "consume")["inputs"]["artifacts"] == [
        {"name": "model", "path": "/in/model"},
        {"name": "code", "path": "/src", "git": {
            "repo": "https://github.com/x/y.git", "revision": "main",
            "usernameSecret": {"name": "s3-creds", "key": "access"},
            "passwordSecret": {"name": "s3-creds", "key": "secret"}}},
        {"name": "data", "path": "/in/data", "http": {"url": "https://example.com/d.csv"}},
    ]
    assert task(doc, "consume")["arguments"] == {"artifacts": [
        {"name": "model", "from": "{{tasks.produce.outputs.artifacts.model}}"}]}


# --------------------------------------------------------------------------- dependencies


@pytest.mark.parametrize(("condition", "expected"), [
    (ir.EdgeCondition.SUCCEEDED, "a"),
    (ir.EdgeCondition.FAILED, "a.Failed"),
    (ir.EdgeCondition.ERRORED, "a.Errored"),
    (ir.EdgeCondition.SKIPPED, "a.Skipped"),
    (ir.EdgeCondition.COMPLETED, "(a.Succeeded || a.Failed)"),
    # "any terminal state": Argo's Omitted (not run: its dependencies failed) included
    (ir.EdgeCondition.ANY, "(a.Succeeded || a.Failed || a.Errored || a.Skipped || a.Omitted)"),
    (ir.EdgeCondition.SUCCEEDED_ONLY, "a.Succeeded"),
    (ir.EdgeCondition.OMITTED, "a.Omitted"),
])
def test_dependency_conditions(condition: ir.EdgeCondition, expected: str) -> None:
    doc = compile_ok(wf_of(S("a", ctr()), S("b", ctr(), dependencies=(
        ir.Dependency("a", condition),))))
    t = task(doc, "b")
    assert t["depends"] == expected
    assert "dependencies" not in t


@pytest.mark.parametrize(("condition", "expected"), [
    (ir.EdgeCondition.ANY_SUCCEEDED, "a.AnySucceeded"),
    (ir.EdgeCondition.ALL_FAILED, "a.AllFailed"),
])
def test_item_counting_conditions_on_a_map(condition: ir.EdgeCondition, expected: str) -> None:
    fan = S("a", ctr(), foreach=ir.ForEach(items=(ir.Literal.of(1), ir.Literal.of(2))))
    doc = compile_ok(wf_of(fan, S("b", ctr(), dependencies=(ir.Dependency("a", condition),))))
    assert task(doc, "b")["depends"] == expected


def test_several_dependencies_are_and_joined() -> None:
    doc = compile_ok(wf_of(S("a", ctr()), S("b", ctr()), S("c", ctr(), dependencies=(
        ir.Dependency("a"), ir.Dependency("b", ir.EdgeCondition.FAILED)))))
    assert task(doc, "c")["depends"] == "a && b.Failed"
    assert "depends" not in task(doc, "a")


def test_depends_expression() -> None:
    expr = ir.DependsAny((
        ir.DependsAll((ir.DependsTerm("a"), ir.DependsNot(ir.DependsTerm("b",
                                                                         ir.EdgeCondition.FAILED)))),
        ir.DependsTerm("c", ir.EdgeCondition.COMPLETED),
        ir.DependsNot(ir.DependsAny((ir.DependsTerm("a", ir.EdgeCondition.SKIPPED),
                                     ir.DependsTerm("b")))),
    ))
    deps = tuple(ir.Dependency(n, ir.EdgeCondition.ANY) for n in "abc")
    doc = compile_ok(wf_of(S("a", ctr()), S("b", ctr()), S("c", ctr()),
                           S("d", ctr(), dependencies=deps, depends=expr)))
    assert task(doc, "d")["depends"] == (
        "(a && !b.Failed) || (c.Succeeded || c.Failed) || !(a.Skipped || b)")


# --------------------------------------------------------------------------- when


def _flip(*extra: ir.Step) -> tuple[ir.Step, ...]:
    return (S("flip", ctr("alpine", "coin"), outputs=(
        ir.OutputParameter("side", ir.OutputSource.STDOUT),
        ir.OutputParameter("n", ir.OutputSource.PATH, "/tmp/n", ir.ValueType.INT))), *extra)


def test_when_quotes_strings() -> None:
    heads = S("heads", ctr(), dependencies=(ir.Dependency("flip"),), when=ir.When(
        ir.Condition(ir.StepOutputRef("flip", "side"), ir.CompareOp.EQ, L("heads"))))
    quote = S("quote", ctr(), dependencies=(ir.Dependency("flip"),), when=ir.When(
        ir.Condition(L("it's"), ir.CompareOp.NE, ir.StepOutputRef("flip", "side"))))
    doc = compile_ok(wf_of(*_flip(heads, quote)))
    assert task(doc, "heads")["when"] == "'{{tasks.flip.outputs.result}}' == 'heads'"
    assert task(doc, "quote")["when"] == "'it\\'s' != '{{tasks.flip.outputs.result}}'"


def test_when_leaves_numbers_and_bools_unquoted() -> None:
    big = S("big", ctr(), dependencies=(ir.Dependency("flip"),), when=ir.When(
        ir.Condition(ir.StepOutputRef("flip", "n"), ir.CompareOp.GT, L(5))))
    flag = S("flag", ctr(), when=ir.When(
        ir.Condition(ir.WorkflowParamRef("on"), ir.CompareOp.EQ, L(True))))
    doc = compile_ok(wf_of(*_flip(big, flag), parameters=(
        ir.Parameter("on", ir.ValueType.BOOL, L(False)),)))
    assert task(doc, "big")["when"] == "{{tasks.flip.outputs.parameters.n}} > 5"
    assert task(doc, "flag")["when"] == "{{workflow.parameters.on}} == true"


def test_an_ordering_of_two_step_outputs_compares_numbers() -> None:
    """'10' > '9' is false as strings: two run-time values are ordered bare (as numbers, like
    the local engine and Airflow do when both sides are numbers); equality stays quoted."""
    other = S("other", ctr("alpine", "coin"), outputs=(
        ir.OutputParameter("side", ir.OutputSource.STDOUT),))
    after = (ir.Dependency("flip"), ir.Dependency("other"))
    more = S("more", ctr(), dependencies=after, when=ir.When(ir.Condition(
        ir.StepOutputRef("flip", "side"), ir.CompareOp.GT, ir.StepOutputRef("other", "side"))))
    same = S("same", ctr(), dependencies=after, when=ir.When(ir.Condition(
        ir.StepOutputRef("flip", "side"), ir.CompareOp.EQ, ir.StepOutputRef("other", "side"))))
    doc = compile_ok(wf_of(*_flip(other, more, same)))
    assert task(doc, "more")["when"] == (
        "{{tasks.flip.outputs.result}} > {{tasks.other.outputs.result}}")
    assert task(doc, "same")["when"] == (
        "'{{tasks.flip.outputs.result}}' == '{{tasks.other.outputs.result}}'")


@pytest.mark.parametrize(("op", "negated"), [
    (ir.CompareOp.EQ, "!="), (ir.CompareOp.NE, "=="), (ir.CompareOp.GT, "<="),
    (ir.CompareOp.LT, ">="), (ir.CompareOp.GE, "<"), (ir.CompareOp.LE, ">"),
])
def test_else_branch_negates_the_operator(op: ir.CompareOp, negated: str) -> None:
    cond = ir.Condition(ir.StepOutputRef("flip", "n"), op, L(3))
    doc = compile_ok(wf_of(*_flip(
        S("then", ctr(), dependencies=(ir.Dependency("flip"),), when=ir.When(cond)),
        S("else", ctr(), dependencies=(ir.Dependency("flip"),), when=ir.When(cond, False)))))
    assert task(doc, "then")["when"] == f"{{{{tasks.flip.outputs.parameters.n}}}} {op.value} 3"
    assert task(doc, "else")["when"] == f"{{{{tasks.flip.outputs.parameters.n}}}} {negated} 3"


# --------------------------------------------------------------------------- foreach


def test_foreach_static_items_and_item_hoisting() -> None:
    step = S("train", ctr("alpine", "train --lr={{item.lr}} --cfg='{{item}}' {{inputs.tag}}"),
             template="train",
             inputs=(ir.InputParameter("tag", L("v1")),
                     ir.InputParameter("depth", ir.ItemRef("depth"), ir.ValueType.INT)),
             env=(ir.EnvVar("DEPTH", "{{item.depth}}"),),
             foreach=ir.ForEach(items=(L({"lr": 0.1, "depth": 2}), L({"lr": 0.2, "depth": 3}))))
    doc = compile_ok(wf_of(step))
    t = task(doc, "train")
    assert t["withItems"] == [{"depth": 2, "lr": 0.1}, {"depth": 3, "lr": 0.2}]
    assert args_of(t) == {"tag": "v1", "depth": "{{item.depth}}", "item-lr": "{{item.lr}}",
                          "item": "{{item}}"}
    c = tmpl(doc, "train")
    assert in_params(c) == ["tag", "depth", "item-lr", "item"]
    assert c["container"]["args"] == [
        "train --lr={{inputs.parameters.item-lr}} --cfg='{{inputs.parameters.item}}' "
        "{{inputs.parameters.tag}}"]
    # {{item.depth}} reuses the input already fed by that key
    assert c["container"]["env"] == [{"name": "DEPTH", "value": "{{inputs.parameters.depth}}"}]
    assert "{{item" not in json.dumps(spec(doc)["templates"][1:])


def test_foreach_scalar_items_hoist_avoids_input_name_clash() -> None:
    step = S("echo", ctr("alpine", "echo {{item}} {{inputs.item}}"),
             inputs=(ir.InputParameter("item", L("fixed")),),
             foreach=ir.ForEach(items=(L("a"), L(1), L(True))))
    doc = compile_ok(wf_of(step))
    t = task(doc, "echo")
    assert t["withItems"] == ["a", 1, True]
    assert args_of(t) == {"item": "fixed", "item-2": "{{item}}"}
    assert tmpl(doc, "echo")["container"]["args"] == [
        "echo {{inputs.parameters.item-2}} {{inputs.parameters.item}}"]


def test_foreach_over_an_upstream_list_and_a_parameter() -> None:
    gen = S("gen", ctr("alpine", "gen"), outputs=(
        ir.OutputParameter("list", ir.OutputSource.STDOUT, type=ir.ValueType.LIST),
        ir.OutputParameter("files", ir.OutputSource.PATH, "/tmp/files", ir.ValueType.LIST)))
    each = S("each", ctr("alpine", "{{item}}"), dependencies=(ir.Dependency("gen"),),
             foreach=ir.ForEach(source=ir.StepOutputRef("gen", "list")))
    files = S("files", ctr("alpine", "cat {{item}}"), dependencies=(ir.Dependency("gen"),),
              foreach=ir.ForEach(source=ir.StepOutputRef("gen", "files")))
    shards = S("shards", ctr("alpine", "{{item}}"),
               foreach=ir.ForEach(source=ir.WorkflowParamRef("shards")))
    doc = compile_ok(wf_of(gen, each, files, shards, parameters=(
        ir.Parameter("shards", ir.ValueType.LIST, L([1, 2])),)))
    assert task(doc, "each")["withParam"] == "{{tasks.gen.outputs.result}}"
    assert task(doc, "files")["withParam"] == "{{tasks.gen.outputs.parameters.files}}"
    assert task(doc, "shards")["withParam"] == "{{workflow.parameters.shards}}"


def test_foreach_parallelism_wraps_the_task_in_a_dag() -> None:
    gen = S("gen", ctr("alpine", "gen"),
            outputs=(ir.OutputParameter("list", ir.OutputSource.STDOUT, type=ir.ValueType.LIST),))
    step = S("work", ctr("alpine", "work {{item}} {{inputs.mode}}"), template="work",
             dependencies=(ir.Dependency("gen"),),
             inputs=(ir.InputParameter("mode", ir.WorkflowParamRef("mode")),),
             outputs=(ir.OutputParameter("res", ir.OutputSource.STDOUT),),
             foreach=ir.ForEach(source=ir.StepOutputRef("gen", "list"), parallelism=3))
    after = S("after", ctr("alpine", "echo {{inputs.all}}"), dependencies=(ir.Dependency("work"),),
              inputs=(ir.InputParameter("all", ir.StepOutputRef("work", "res")),))
    doc = compile_ok(wf_of(gen, step, after, parameters=(ir.Parameter("mode", default=L("x")),)))
    outer = task(doc, "work")
    assert outer["template"] == "work-map"
    assert "withParam" not in outer and "withItems" not in outer
    assert args_of(outer) == {"mode": "{{workflow.parameters.mode}}",
                              "items": "{{tasks.gen.outputs.result}}"}
    assert outer["depends"] == "gen"
    wrapper = tmpl(doc, "work-map")
    assert wrapper["parallelism"] == 3
    assert in_params(wrapper) == ["mode", "items"]
    assert wrapper["dag"]["tasks"] == [{
        "name": "body", "template": "work",
        "arguments": {"parameters": [
            {"name": "mode", "value": "{{inputs.parameters.mode}}"},
            {"name": "item", "value": "{{item}}"}]},
        "withParam": "{{inputs.parameters.items}}"}]
    assert wrapper["outputs"] == {"parameters": [
        {"name": "res", "valueFrom": {"parameter": "{{tasks.body.outputs.result}}"}}]}
    assert args_of(task(doc, "after")) == {"all": "{{tasks.work.outputs.parameters.res}}"}


def test_foreach_parallelism_with_static_items_and_item_condition() -> None:
    step = S("w", ctr("alpine", "run {{item}}"), foreach=ir.ForEach(
        items=(L("a"), L("skip")), parallelism=1),
        when=ir.When(ir.Condition(ir.ItemRef(), ir.CompareOp.NE, L("skip"))))
    doc = compile_ok(wf_of(step))
    outer = task(doc, "w")
    assert "when" not in outer
    body = tmpl(doc, outer["template"])["dag"]["tasks"][0]
    assert body["withItems"] == ["a", "skip"]
    assert body["when"] == "'{{item}}' != 'skip'"


# --------------------------------------------------------------------------- loop


def test_loop_recursion_shape() -> None:
    poll = S("poll", ctr("alpine", "check {{inputs.job}}"), template="poll",
             inputs=(ir.InputParameter("job", L("j-1")),),
             outputs=(ir.OutputParameter("state", ir.OutputSource.STDOUT),),
             loop=ir.Loop(ir.Condition(ir.StepOutputRef("poll", "state"), ir.CompareOp.NE,
                                       L("done")), max_iterations=20))
    after = S("after", ctr("alpine", "echo {{inputs.s}}"), dependencies=(ir.Dependency("poll"),),
              inputs=(ir.InputParameter("s", ir.StepOutputRef("poll", "state")),))
    doc = compile_ok(wf_of(poll, after))
    outer = task(doc, "poll")
    assert outer["template"] == "poll-loop"
    assert args_of(outer) == {"job": "j-1", "iteration": "1"}
    loop = tmpl(doc, "poll-loop")
    assert in_params(loop) == ["job", "iteration"]
    body, again = loop["dag"]["tasks"]
    assert body == {"name": "body", "template": "poll", "arguments": {"parameters": [
        {"name": "job", "value": "{{inputs.parameters.job}}"}]}}
    assert again == {
        "name": "again", "template": "poll-loop",
        "arguments": {"parameters": [
            {"name": "job", "value": "{{inputs.parameters.job}}"},
            {"name": "iteration", "value": "{{=asInt(inputs.parameters.iteration) + 1}}"}]},
        "depends": "body",
        "when": "'{{tasks.body.outputs.result}}' != 'done' && "
                "{{inputs.parameters.iteration}} < 20",
    }
    assert loop["outputs"] == {"parameters": [{"name": "state", "valueFrom": {
        "expression": 'tasks.again.status == "Succeeded" ? tasks.again.outputs.parameters.state'
                      " : tasks.body.outputs.result"}}]}
    assert tmpl(doc, "poll")["container"]["args"] == ["check {{inputs.parameters.job}}"]
    # downstream steps read the loop's (last) value as a parameter
    assert args_of(task(doc, "after")) == {"s": "{{tasks.poll.outputs.parameters.state}}"}


def test_loop_condition_reading_another_step_is_forwarded() -> None:
    target = S("target", ctr("alpine", "t"),
               outputs=(ir.OutputParameter("goal", ir.OutputSource.PATH, "/g", ir.ValueType.INT),))
    step = S("climb", ctr("alpine", "c"), dependencies=(ir.Dependency("target"),),
             outputs=(ir.OutputParameter("h", ir.OutputSource.PATH, "/h", ir.ValueType.INT),),
             output_artifacts=(ir.OutputArtifact("trace", "/trace"),),
             loop=ir.Loop(ir.Condition(ir.StepOutputRef("climb", "h"), ir.CompareOp.LT,
                                       ir.StepOutputRef("target", "goal")), 5))
    doc = compile_ok(wf_of(target, step))
    outer = task(doc, "climb")
    assert args_of(outer) == {"iteration": "1",
                              "loop-goal": "{{tasks.target.outputs.parameters.goal}}"}
    loop = tmpl(doc, outer["template"])
    again = loop["dag"]["tasks"][1]
    assert again["when"] == ("{{tasks.body.outputs.parameters.h}} < "
                             "{{inputs.parameters.loop-goal}} && "
                             "{{inputs.parameters.iteration}} < 5")
    assert args_of(again)["loop-goal"] == "{{inputs.parameters.loop-goal}}"
    assert loop["outputs"]["artifacts"] == [{"name": "trace", "fromExpression": (
        'tasks.again.status == "Succeeded" ? tasks.again.outputs.artifacts.trace'
        " : tasks.body.outputs.artifacts.trace")}]


def test_loop_forwards_input_artifacts_and_mapped_export_forwards_the_item() -> None:
    make = S("make", ctr(), output_artifacts=(ir.OutputArtifact("data", "/data"),))
    loop = S("refine", ctr("alpine", "refine"), dependencies=(ir.Dependency("make"),),
             input_artifacts=(ir.InputArtifact("data", "/in", ir.StepArtifactRef("make", "data")),),
             outputs=(ir.OutputParameter("done", ir.OutputSource.STDOUT),),
             loop=ir.Loop(ir.Condition(ir.StepOutputRef("refine", "done"), ir.CompareOp.EQ,
                                       L("no")), 4))
    each = S("each", ctr("alpine", "echo {{item}}"), template="each",
             foreach=ir.ForEach(items=(L("a"), L("b"))),
             outputs=(ir.OutputParameter("out", ir.OutputSource.STDOUT, global_name="last"),))
    doc = compile_ok(wf_of(make, loop, each))
    outer = task(doc, "refine")
    assert outer["arguments"]["artifacts"] == [
        {"name": "data", "from": "{{tasks.make.outputs.artifacts.data}}"}]
    wrapper = tmpl(doc, outer["template"])
    assert wrapper["inputs"]["artifacts"] == [{"name": "data"}]
    body, again = wrapper["dag"]["tasks"]
    for t in (body, again):
        assert t["arguments"]["artifacts"] == [{"name": "data",
                                                "from": "{{inputs.artifacts.data}}"}]
    mapped = task(doc, "each")
    assert mapped["template"] == "each-export"
    assert mapped["withItems"] == ["a", "b"]
    assert args_of(mapped) == {"item": "{{item}}"}
    export = tmpl(doc, "each-export")
    assert export["dag"]["tasks"][0]["arguments"] == {"parameters": [
        {"name": "item", "value": "{{inputs.parameters.item}}"}]}
    assert export["outputs"]["parameters"][0]["globalName"] == "last"


def test_loop_with_one_iteration_is_a_plain_step() -> None:
    step = S("once", ctr(), outputs=(ir.OutputParameter("o", ir.OutputSource.STDOUT),),
             loop=ir.Loop(ir.Condition(ir.StepOutputRef("once", "o"), ir.CompareOp.EQ,
                                       L("again")), max_iterations=1))
    assert task(compile_ok(wf_of(step)), "once")["template"] == "once"


# --------------------------------------------------------------------------- policies


@pytest.mark.parametrize(("on", "policy", "expression"), [
    ((ir.FailureClass.ANY,), "Always", None),
    ((ir.FailureClass.TRANSIENT,), "OnFailure", None),
    ((ir.FailureClass.INFRA,), "OnError", None),
    ((ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA), "Always", None),
    ((ir.FailureClass.TRANSIENT, ir.FailureClass.OOM), "OnFailure", None),
    # a user error is a failed exit to Argo (it sees no traceback)
    ((ir.FailureClass.USER,), "OnFailure", None),
    ((ir.FailureClass.USER, ir.FailureClass.INFRA), "Always", None),
    # the default policy: transient, infra and OOM
    ((ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA, ir.FailureClass.OOM), "Always", None),
    ((ir.FailureClass.OOM,), "Always",
     'asInt(lastRetry.exitCode) == 137 || lastRetry.message contains "OOMKilled"'),
    ((ir.FailureClass.INFRA, ir.FailureClass.OOM), "Always",
     'lastRetry.status == "Error" || asInt(lastRetry.exitCode) == 137 || '
     'lastRetry.message contains "OOMKilled"'),
])
def test_retry_policy_from_failure_classes(on: tuple[ir.FailureClass, ...], policy: str,
                                           expression: str | None) -> None:
    step = S("a", ctr(), retry=ir.RetryPolicy(3, on=on))
    rs = tmpl(compile_ok(wf_of(step)), "a")["retryStrategy"]
    assert rs["limit"] == "3"
    assert rs["retryPolicy"] == policy
    assert rs.get("expression") == expression


def test_retry_backoff() -> None:
    step = S("a", ctr(), retry=ir.RetryPolicy(5, ir.Backoff(1.5, 3, 120)))
    rs = tmpl(compile_ok(wf_of(step)), "a")["retryStrategy"]
    assert rs["backoff"] == {"duration": "1500ms", "factor": "3", "cap": "120s"}
    step = S("a", ctr(), retry=ir.RetryPolicy(5, ir.Backoff()))
    rs = tmpl(compile_ok(wf_of(step)), "a")["retryStrategy"]
    assert rs["backoff"] == {"duration": "1s", "factor": "2"}


def test_retry_backoff_with_fractional_factor_is_unsupported() -> None:
    step = S("a", ctr(), retry=ir.RetryPolicy(5, ir.Backoff(1, 1.5)))
    with pytest.raises(UnsupportedFeatureError, match="factor"):
        argo.compile_workflow(wf_of(step))


def test_memory_escalation_patches_the_main_container() -> None:
    step = S("a", ctr(), retry=ir.RetryPolicy(3, on=(ir.FailureClass.OOM,), memory_factor=2,
                                              memory_ceiling="3Gi"),
             resources=ir.Resources(memory_request="512Mi", memory_limit="1Gi"))
    t = tmpl(compile_ok(wf_of(step)), "a")
    patch = json.loads(t["podSpecPatch"])
    gi = 2**30
    assert patch == {"containers": [{"name": "main", "resources": {
        "limits": {"memory": f"{{{{=[{gi}, {2 * gi}, {3 * gi}]"
                             "[sprig.min(sprig.int(retries), 2)]}}"},
        "requests": {"memory": f"{{{{=[{gi // 2}, {gi}, {2 * gi}, {3 * gi}]"
                               "[sprig.int(retries)]}}"},
    }}]}
    assert t["container"]["resources"] == {"requests": {"memory": "512Mi"},
                                           "limits": {"memory": "1Gi"}}


def test_memory_escalation_without_memory_settings_adds_no_patch() -> None:
    step = S("a", ctr(), retry=ir.RetryPolicy(3, memory_factor=2))
    assert "podSpecPatch" not in tmpl(compile_ok(wf_of(step)), "a")


def test_timeout_priority_free_pod_settings_on_the_template() -> None:
    step = S("a", ctr(), timeout_seconds=300, node_selector=ir.pairs({"disk": "ssd"}),
             tolerations=(ir.Toleration("gpu", "Exists"),), daemon=True, parallelism=4,
             labels=ir.pairs({"team": "ml"}))
    t = tmpl(compile_ok(wf_of(step)), "a")
    assert t["activeDeadlineSeconds"] == "300"
    assert t["nodeSelector"] == {"disk": "ssd"}
    assert t["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert t["daemon"] is True
    assert t["parallelism"] == 4
    assert t["metadata"] == {"labels": {"team": "ml"}}


def test_cache_becomes_memoize() -> None:
    default = S("a", ctr("alpine", "{{inputs.x}} {{inputs.y}}"), inputs=(
        ir.InputParameter("x", L(1), ir.ValueType.INT), ir.InputParameter("y", L("b"))),
        cache=ir.CachePolicy(salt="v2", max_age_seconds=3600))
    custom = S("b", ctr("alpine", "b {{inputs.x}}"),
               inputs=(ir.InputParameter("x", L(1), ir.ValueType.INT),),
               cache=ir.CachePolicy(key="model-{{inputs.x}}", name="my-cache"))
    off = S("c", ctr(), cache=ir.CachePolicy(enabled=False))
    doc = compile_ok(wf_of(default, custom, off))
    m = tmpl(doc, "a")["memoize"]
    assert m["maxAge"] == "3600s"
    assert m["cache"] == {"configMap": {"name": "couler-cache"}}
    # content digest, then a hash of the input values (Argo keys allow only [a-zA-Z0-9-])
    assert re.fullmatch(r"couler-[0-9a-f]{16}-\{\{=sprig\.sha256sum\(toJson\(\["
                        r"inputs\.parameters\.x, inputs\.parameters\.y\]\)\)\}\}-v2", m["key"])
    assert tmpl(doc, "b")["memoize"] == {"key": "model-{{inputs.parameters.x}}", "maxAge": "",
                                         "cache": {"configMap": {"name": "my-cache"}}}
    assert "memoize" not in tmpl(doc, "c")


def test_default_cache_keys_differ_between_templates_and_salts() -> None:
    doc = compile_ok(wf_of(
        S("a", ctr("alpine", "a"), cache=ir.CachePolicy()),
        S("b", ctr("alpine", "b"), cache=ir.CachePolicy()),
        S("c", ctr("alpine", "a"), cache=ir.CachePolicy(salt="run 2.1")),
        S("d", ctr("alpine", "{{inputs.my-in}}"), cache=ir.CachePolicy(),
          inputs=(ir.InputParameter("my-in", L(0.5), ir.ValueType.FLOAT),)),
    ))
    keys = [step_tmpl(doc, n)["memoize"]["key"] for n in "abcd"]
    assert len(set(keys)) == 4
    assert re.fullmatch(r"couler-[0-9a-f]{16}", keys[0])
    assert re.fullmatch(r"couler-[0-9a-f]{16}-run-2-1", keys[2])
    assert keys[3].endswith("-{{=sprig.sha256sum(toJson([inputs.parameters['my-in']]))}}")


def test_step_defaults_apply_where_a_step_leaves_the_policy_unset() -> None:
    defaults = ir.StepDefaults(retry=ir.RetryPolicy(2), timeout_seconds=60,
                               resources=ir.Resources(cpu_request="100m"),
                               cache=ir.CachePolicy(max_age_seconds=10))
    plain = S("plain", ctr("alpine", "a"))
    own = S("own", ctr("alpine", "b"), retry=ir.RetryPolicy(7), timeout_seconds=5,
            resources=ir.Resources(cpu_request="2"), cache=ir.CachePolicy(enabled=False))
    job = S("job", ir.JobSpec.of({"apiVersion": "v1", "kind": "ConfigMap"}))
    group = S("group", ir.SubWorkflowSpec("g", (S("inner", ctr("alpine", "c")),)))
    doc = compile_ok(wf_of(plain, own, job, group, defaults=defaults))
    p = tmpl(doc, "plain")
    assert p["retryStrategy"]["limit"] == "2"
    assert p["activeDeadlineSeconds"] == "60"
    assert p["container"]["resources"] == {"requests": {"cpu": "100m"}}
    assert p["memoize"]["maxAge"] == "10s"
    o = tmpl(doc, "own")
    assert o["retryStrategy"]["limit"] == "7"
    assert o["activeDeadlineSeconds"] == "5"
    assert o["container"]["resources"] == {"requests": {"cpu": "2"}}
    assert "memoize" not in o
    j = tmpl(doc, "job")
    assert j["timeout"] == "60s" and j["retryStrategy"]["limit"] == "2"
    g = tmpl(doc, "group")  # a group: its inner steps get the defaults, not the DAG
    assert "retryStrategy" not in g and "memoize" not in g
    assert tmpl(doc, "inner")["retryStrategy"]["limit"] == "2"


# --------------------------------------------------------------------------- exit hooks


def test_exit_hooks_become_an_exit_handler_dag() -> None:
    wf = wf_of(
        S("main", ctr()),
        exit_hooks=(
            ir.ExitHook(ir.RunStatus.SUCCEEDED, (S("celebrate", ctr("alpine", "yay")),)),
            ir.ExitHook(ir.RunStatus.FAILED, (
                S("collect", ctr("alpine", "logs"),
                  outputs=(ir.OutputParameter("url", ir.OutputSource.STDOUT),)),
                S("notify", ctr("alpine", "mail {{inputs.u}}"),
                  dependencies=(ir.Dependency("collect"),),
                  inputs=(ir.InputParameter("u", ir.StepOutputRef("collect", "url")),)),
            )),
            ir.ExitHook(ir.RunStatus.ERROR, (S("page", ctr("alpine", "page")),)),
            ir.ExitHook(ir.RunStatus.ANY, (S("cleanup", ctr("alpine", "rm")),
                                           S("notify", ctr("alpine", "bye")))),
        ))
    doc = compile_ok(wf)
    assert doc["spec"]["onExit"] == "exit-handler"
    hooks = tasks(doc, "exit-handler")
    assert hooks["celebrate"]["when"] == "{{workflow.status}} == Succeeded"
    assert hooks["collect"]["when"] == "{{workflow.status}} == Failed"
    assert hooks["notify"] == {
        "name": "notify", "template": "notify",
        "arguments": {"parameters": [{"name": "u", "value": "{{tasks.collect.outputs.result}}"}]},
        "depends": "collect", "when": "{{workflow.status}} == Failed"}
    assert hooks["page"]["when"] == "{{workflow.status}} == Error"
    assert "when" not in hooks["cleanup"]
    # a second hook step called "notify" gets a unique task name
    assert hooks["notify-2"]["template"] == "notify-2"
    assert "when" not in hooks["notify-2"]


def test_exit_hook_step_condition_is_combined_with_the_status_guard() -> None:
    hook = S("report", ctr(), when=ir.When(ir.Condition(ir.WorkflowParamRef("notify"),
                                                        ir.CompareOp.EQ, L("yes"))))
    doc = compile_ok(wf_of(S("a", ctr()), parameters=(ir.Parameter("notify", default=L("no")),),
                           exit_hooks=(ir.ExitHook(ir.RunStatus.FAILED, (hook,)),)))
    assert task(doc, "report", "exit-handler")["when"] == (
        "{{workflow.status}} == Failed && ('{{workflow.parameters.notify}}' == 'yes')")


# --------------------------------------------------------------------------- cron


def test_cron_workflow() -> None:
    wf = wf_of(S("a", ctr()), name="nightly", tenant="ml", labels=ir.pairs({"app": "etl"}),
               schedule=ir.CronSchedule("0 2 * * *", concurrency_policy=ir.ConcurrencyPolicy.FORBID,
                                        starting_deadline_seconds=60,
                                        successful_history_limit=3, failed_history_limit=1,
                                        suspend=True))
    doc = compile_ok(wf)
    assert doc["apiVersion"] == "argoproj.io/v1alpha1"
    assert doc["kind"] == "CronWorkflow"
    assert doc["metadata"] == {"name": "nightly", "namespace": "ml", "labels": {"app": "etl"}}
    s = doc["spec"]
    assert s["schedules"] == ["0 2 * * *"]
    assert "schedule" not in s
    assert "timezone" not in s  # no default time zone
    assert s["concurrencyPolicy"] == "Forbid"
    assert s["startingDeadlineSeconds"] == 60
    assert s["successfulJobsHistoryLimit"] == 3
    assert s["failedJobsHistoryLimit"] == 1
    assert s["suspend"] is True
    assert s["workflowMetadata"] == {"labels": {"app": "etl"}}
    assert s["workflowSpec"]["entrypoint"] == "nightly"
    assert [t["name"] for t in s["workflowSpec"]["templates"]] == ["nightly", "a"]


@pytest.mark.parametrize(("policy", "text"), [
    (ir.ConcurrencyPolicy.ALLOW, "Allow"), (ir.ConcurrencyPolicy.REPLACE, "Replace")])
def test_cron_timezone_and_policy(policy: ir.ConcurrencyPolicy, text: str) -> None:
    wf = wf_of(S("a", ctr()), schedule=ir.CronSchedule("@hourly", "Europe/Berlin", policy))
    s = compile_ok(wf)["spec"]
    assert s["timezone"] == "Europe/Berlin"
    assert s["concurrencyPolicy"] == text
    assert "suspend" not in s


# --------------------------------------------------------------------------- unsupported


def test_step_priority_is_unsupported() -> None:
    with pytest.raises(UnsupportedFeatureError) as e:
        argo.compile_workflow(wf_of(S("a", ctr(), priority=5)))
    assert e.value.engine == "argo" and e.value.step == "a" and "priority" in e.value.feature
    with pytest.raises(UnsupportedFeatureError, match="priority"):
        argo.compile_workflow(wf_of(S("a", ctr()), defaults=ir.StepDefaults(priority=1)))


def test_local_artifact_storage_is_unsupported() -> None:
    step = S("a", ctr(), output_artifacts=(ir.OutputArtifact(
        "x", "/x", ir.ArtifactLocation(ir.StorageKind.LOCAL, key="x")),))
    with pytest.raises(UnsupportedFeatureError, match="local artifact storage"):
        argo.compile_workflow(wf_of(step))


def test_consuming_an_artifact_of_a_mapped_step_is_unsupported() -> None:
    mapped = S("m", ctr("alpine", "{{item}}"), foreach=ir.ForEach(items=(L(1), L(2))),
               output_artifacts=(ir.OutputArtifact("o", "/o"),))
    reader = S("r", ctr(), dependencies=(ir.Dependency("m"),), input_artifacts=(
        ir.InputArtifact("o", "/o", ir.StepArtifactRef("m", "o")),))
    with pytest.raises(UnsupportedFeatureError, match="mapped step"):
        argo.compile_workflow(wf_of(mapped, reader))


@pytest.mark.parametrize("step", [
    S("j", ir.JobSpec.of({"apiVersion": "v1", "kind": "Pod"}), env=(ir.EnvVar("A", "b"),)),
    S("j", ir.JobSpec.of({"apiVersion": "v1", "kind": "Pod"}),
      outputs=(ir.OutputParameter("o", ir.OutputSource.PATH, "/o"),)),
    S("g", ir.SubWorkflowSpec("g", (S("i", ctr()),)), timeout_seconds=5),
    S("g", ir.SubWorkflowSpec("g", (S("i", ctr()),)), node_selector=ir.pairs({"a": "b"})),
    S("x", ir.SubWorkflowSpec("other"), resources=ir.Resources(cpu_limit="1")),
])
def test_container_settings_on_steps_without_a_container_are_unsupported(step: ir.Step) -> None:
    with pytest.raises(UnsupportedFeatureError):
        argo.compile_workflow(wf_of(step))


# --------------------------------------------------------------------------- validation


def test_invalid_ir_raises_validation_error() -> None:
    bad = wf_of(S("Bad_Name", ctr()), S("b", ctr(), dependencies=(ir.Dependency("nope"),)))
    with pytest.raises(ValidationError) as e:
        argo.compile_workflow(bad)
    assert len(e.value.issues) >= 2


def test_validation_can_be_skipped() -> None:
    doc = argo.compile_workflow(wf_of(S("Bad_Name", ctr())), validate=False)
    assert tasks(doc)["Bad_Name"]["template"] == "Bad-Name"


# --------------------------------------------------------------------------- determinism and YAML


def _kitchen_sink() -> ir.Workflow:
    gen = S("gen", ir.ScriptSpec("python:3.11", "import json\nprint(json.dumps([1, 2]))\n"),
            outputs=(ir.OutputParameter("list", ir.OutputSource.STDOUT, type=ir.ValueType.LIST),))
    fan = S("fan", ctr("alpine", "echo '{{item}}' \"quoted\" {{inputs.p}}"),
            dependencies=(ir.Dependency("gen"),),
            inputs=(ir.InputParameter("p", ir.WorkflowParamRef("p")),),
            foreach=ir.ForEach(source=ir.StepOutputRef("gen", "list"), parallelism=2),
            retry=ir.RetryPolicy(2, ir.Backoff(2, 2, 30), on=(ir.FailureClass.OOM,),
                                 memory_factor=1.5),
            resources=ir.Resources(memory_limit="1Gi"))
    check = S("check", ctr("alpine", "check"), dependencies=(ir.Dependency("gen"),),
              outputs=(ir.OutputParameter("ok", ir.OutputSource.STDOUT),),
              when=ir.When(ir.Condition(ir.StepOutputRef("gen", "list"), ir.CompareOp.NE,
                                        L("[]"))),
              loop=ir.Loop(ir.Condition(ir.StepOutputRef("check", "ok"), ir.CompareOp.NE,
                                        L("yes")), 3))
    job = S("job", ir.JobSpec.of({"apiVersion": "batch/v1", "kind": "Job",
                                  "metadata": {"name": "x"}, "spec": {"template": {}}}),
            dependencies=(ir.Dependency("fan", ir.EdgeCondition.ANY), ir.Dependency("check")))
    return wf_of(gen, fan, check, job, name="sink", parameters=(
        ir.Parameter("p", default=L("it's")),), labels=ir.pairs({"a": "b"}),
        annotations=ir.pairs({"note": 'say "hi"'}), triggers=(ir.EventTrigger("x.y"),),
        exit_hooks=(ir.ExitHook(ir.RunStatus.ANY, (S("bye", ctr("alpine", "bye")),)),),
        volumes=(ir.Volume("v", ir.VolumeKind.CLAIM_TEMPLATE, size="1Gi"),))


def test_compile_is_deterministic() -> None:
    wf = _kitchen_sink()
    first = compile_ok(wf)
    second = argo.compile_workflow(wf)
    assert first == second
    assert json.dumps(first) == json.dumps(second)  # same key order too
    assert argo.to_yaml(first) == argo.to_yaml(second)


def test_yaml_round_trips_without_quote_artefacts() -> None:
    doc = compile_ok(_kitchen_sink())
    text = argo.to_yaml(doc)
    assert yaml.safe_load(text) == doc

    def strings(value: object) -> list[str]:
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    # The SDK's quote hack wrapped values in literal quotes ('"{{x}}"'); none here.
    wrapped = [
        s for s in strings(doc)
        if len(s) > 1 and s[0] == s[-1] and s[0] in "'\"" and s[0] not in s[1:-1]
    ]
    assert wrapped == []
    assert "&id" not in text and "*id" not in text  # no anchors or aliases
    assert list(yaml.safe_load(text)) == ["apiVersion", "kind", "metadata", "spec"]
    assert "source: |" in text
    assert argo.dump_yaml(_kitchen_sink()) == text


def test_to_yaml_accepts_any_mapping() -> None:
    from types import MappingProxyType

    doc = MappingProxyType({"a": ("x", "y"), "b": MappingProxyType({"c": "multi\nline\n"})})
    text = argo.to_yaml(doc)
    assert yaml.safe_load(text) == {"a": ["x", "y"], "b": {"c": "multi\nline\n"}}
    assert "c: |" in text


def test_tricky_strings_survive_yaml() -> None:
    values = ["yes", "no", "on", "null", "~", "1", "1.5", "0x1F", "1e3", "2024-01-01", "- a",
              ": x", "a: b", "a #b", "#x", "'q'", '"q"', "{{x}}", "[a]", "<<", "=", "", " lead",
              "trail ", "tab\tx", "héllo", "multi\nline", "two\n\n", "\nlead", "*a", "&b", "!c"]
    doc = {"values": values, "keyed": {v or "empty": v for v in values}}
    assert yaml.safe_load(argo.to_yaml(doc)) == doc


def test_independent_branches_run_to_completion_so_fail_fast_is_off() -> None:
    """Semantics rule S7: a failed step stops only its dependents. Argo's default fail-fast
    would fail the DAG as soon as a failed branch reaches a leaf, so whether the other
    branch's later steps run would depend on timing; a plain chain has nothing to stop."""
    branches = wf_of(S("a", ctr()), S("b", ctr()),
                     S("c", ctr(), dependencies=(ir.Dependency("b"),)))
    assert compile_ok(branches)["spec"]["templates"][0]["dag"]["failFast"] is False
    chain = wf_of(S("a", ctr()), S("b", ctr(), dependencies=(ir.Dependency("a"),)))
    assert "failFast" not in compile_ok(chain)["spec"]["templates"][0]["dag"]
