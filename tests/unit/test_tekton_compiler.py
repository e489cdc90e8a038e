"""Tests of the IR -> Tekton compiler (:mod:`couler.compilers.tekton`).

Every compiled Pipeline / PipelineRun is checked against the vendored Tekton
v1 CRD schemas (``tests/data/schemas/tekton``) with ``Draft7Validator``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator

from couler import ir
from couler.api.capture import capture_program
from couler.compilers import tekton
from couler.engines.base import Feature, first_unsupported
from couler.errors import UnsupportedFeatureError
from tests.unit.k8s_schema import kube_errors, triggers_errors
from tests.unit.tekton_sim import run_pipeline

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "tests" / "data" / "schemas" / "tekton"
PROGRAMS = sorted((ROOT / "tests" / "golden" / "programs").glob("*.py"))

S = ir.Step
L = ir.Literal.of


# --------------------------------------------------------------------------- schema helper


@cache
def _validator(kind: str) -> Draft7Validator:
    file = {"Pipeline": "300-pipeline.yaml", "PipelineRun": "300-pipelinerun.yaml"}[kind]
    crd = yaml.safe_load((SCHEMAS / file).read_text(encoding="utf-8"))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return Draft7Validator(version["schema"]["openAPIV3Schema"])


def schema_errors(doc: dict[str, Any]) -> list[str]:
    """Schema errors of a compiled document (picked by ``kind``): Pipeline and PipelineRun
    against the vendored Tekton CRDs, ConfigMap and CronJob against the ``kubernetes``
    client's models, Tekton Triggers objects structurally (tests/unit/k8s_schema.py)."""
    if doc["kind"] in ("ConfigMap", "CronJob"):
        return kube_errors(doc)
    if doc["apiVersion"].startswith("triggers.tekton.dev/"):
        return triggers_errors(doc, schema_errors)
    return [f"{list(e.absolute_path)}: {e.message}"
            for e in _validator(doc["kind"]).iter_errors(doc)]


def compile_ok(wf: ir.Workflow) -> list[dict[str, Any]]:
    docs = tekton.compile_workflow(wf)
    kinds = [d["kind"] for d in docs]
    # a schedule adds [ConfigMap, CronJob], event triggers [TriggerBinding,
    # TriggerTemplate, EventListener] (tests/unit/test_tekton_schedule.py)
    assert kinds[:2] == ["Pipeline", "PipelineRun"]
    assert kinds[2:] in ([], ["ConfigMap", "CronJob"],
                         ["TriggerBinding", "TriggerTemplate", "EventListener"],
                         ["ConfigMap", "CronJob", "TriggerBinding", "TriggerTemplate",
                          "EventListener"])
    for doc in docs:
        assert doc["apiVersion"] == "tekton.dev/v1" or doc["kind"] not in (
            "Pipeline", "PipelineRun")
        assert schema_errors(doc) == []
    assert list(yaml.safe_load_all(tekton.to_yaml(docs))) == docs
    return docs


def tasks(docs: list[dict[str, Any]], key: str = "tasks") -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in docs[0]["spec"].get(key, [])}


def ctr(*command: str, image: str = "alpine:3.20") -> ir.ContainerSpec:
    return ir.ContainerSpec(image, tuple(command))


def wf_of(*steps: ir.Step, **kw: Any) -> ir.Workflow:
    return ir.Workflow(kw.pop("name", "wf"), tuple(steps), **kw)


# --------------------------------------------------------------------------- schema sanity


def test_schema_helper_reports_wrong_types() -> None:
    bad = {"apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": "x"},
           "spec": {"tasks": [{"name": "a", "retries": "three"}]}}
    assert schema_errors(bad)


# --------------------------------------------------------------------------- golden programs


def _first_unsupported(wf: ir.Workflow) -> tuple[Feature, str] | None:
    return first_unsupported(tekton.CAPABILITIES, wf)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_golden_program(program: Path) -> None:
    (wf,) = capture_program(str(program))
    expected = _first_unsupported(wf)
    if expected is not None:
        feature, step = expected
        with pytest.raises(UnsupportedFeatureError) as err:
            tekton.compile_workflow(wf)
        assert feature.value in str(err.value)
        assert err.value.step == step
        if step:
            assert repr(step) in str(err.value)
        return
    try:
        docs = tekton.compile_workflow(wf)
    except UnsupportedFeatureError as e:  # rejected while compiling: must name step + feature
        assert e.step and e.feature and e.step in str(e)
        # policies: a cache on a memory-escalating step (the cache keeps results only);
        # job_apply: kubectl apply of a manifest without a name (generateName)
        assert program.stem in {"while_loop", "policies", "job_apply"}, str(e)
        return
    for doc in docs:
        assert schema_errors(doc) == []


def test_golden_outcomes() -> None:
    """Which golden programs compile is part of the contract."""
    compiled, rejected = set(), set()
    for program in PROGRAMS:
        (wf,) = capture_program(str(program))
        try:
            tekton.compile_workflow(wf)
            compiled.add(program.stem)
        except UnsupportedFeatureError:
            rejected.add(program.stem)
    assert rejected == {"job_apply", "policies", "while_loop"}
    assert "concurrent_subtasks" in compiled and "map_upstream" in compiled


# --------------------------------------------------------------------------- structure


def test_params_results_and_run_after() -> None:
    producer = S("producer", ctr("sh", "-c", "echo -n hi > /tmp/out.txt"),
                 outputs=(ir.OutputParameter("out", selector="/tmp/out.txt"),))
    consumer = S("consumer", ir.ContainerSpec("alpine:3.20", ("echo",), ("{{inputs.msg}}",)),
                 inputs=(ir.InputParameter("msg", ir.StepOutputRef("producer", "out")),),
                 dependencies=(ir.Dependency("producer"),))
    docs = compile_ok(wf_of(producer, consumer))
    t = tasks(docs)
    p = t["producer"]["taskSpec"]
    assert p["results"] == [{"name": "out", "type": "string"}]
    step = p["steps"][0]
    assert step["args"] == ["sh", "-c", "echo -n hi > /tmp/out.txt"]
    assert 'cp /tmp/out.txt "$(results.out.path)"' in step["script"]
    assert step["script"].startswith("#!/bin/sh\n")
    c = t["consumer"]
    assert c["runAfter"] == ["producer"]
    assert c["params"] == [{"name": "msg", "value": "$(tasks.producer.results.out)"}]
    assert c["taskSpec"]["params"] == [{"name": "msg", "type": "string"}]
    assert c["taskSpec"]["steps"][0]["args"] == ["$(params.msg)"]


def test_stdout_output_of_script() -> None:
    step = S("gen", ir.ScriptSpec("python:3.12", "print('x')\n"),
             outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),))
    script = tasks(compile_ok(wf_of(step)))["gen"]["taskSpec"]["steps"][0]["script"]
    assert "python /tmp/couler-script \"$@\" > /tmp/couler-stdout" in script
    assert "\"$(cat /tmp/couler-stdout)\" > \"$(results.result.path)\"" in script
    assert "print('x')" in script


def test_script_without_outputs_uses_shebang() -> None:
    step = S("s", ir.ScriptSpec("python:3.12", "print(1)\n"))
    tstep = tasks(compile_ok(wf_of(step)))["s"]["taskSpec"]["steps"][0]
    assert tstep["script"] == "#!/usr/bin/env python\nprint(1)\n"


def _flip() -> ir.Step:
    return S("flip", ir.ScriptSpec("python:3.12", "print('heads')\n"),
             outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),))


def test_when_and_else() -> None:
    cond = ir.Condition(ir.StepOutputRef("flip", "result"), ir.CompareOp.EQ, L("heads"))
    dep = (ir.Dependency("flip"),)
    heads = S("heads", ctr("echo", "h"), dependencies=dep, when=ir.When(cond))
    tails = S("tails", ctr("echo", "t"), dependencies=dep, when=ir.When(cond, expect=False))
    t = tasks(compile_ok(wf_of(_flip(), heads, tails)))
    ref = "$(tasks.flip.results.result)"
    assert t["heads"]["when"] == [{"input": ref, "operator": "in", "values": ["heads"]}]
    assert t["tails"]["when"] == [{"input": ref, "operator": "notin", "values": ["heads"]}]


def _score(value: str) -> ir.Step:
    return S("score", ctr("sh", "-c", f"echo {value}"),
             outputs=(ir.OutputParameter("auc", ir.OutputSource.STDOUT),))


def _guarded(value: str) -> ir.Workflow:
    dep = (ir.Dependency("score"),)
    at_least = ir.Condition(ir.StepOutputRef("score", "auc"), ir.CompareOp.GE, L(0.8))
    above = ir.Condition(ir.StepOutputRef("score", "auc"), ir.CompareOp.GT, L(0.95))
    return wf_of(_score(value),
                 S("ship", ctr("echo", "ship"), dependencies=dep, when=ir.When(at_least)),
                 S("retrain", ctr("echo", "again"), dependencies=dep,
                   when=ir.When(at_least, expect=False)),
                 S("celebrate", ctr("echo", "!"), dependencies=dep, when=ir.When(above)))


def test_an_ordered_comparison_is_tested_by_a_guard_task() -> None:
    # Tekton's when expressions test set membership only: STEP-when compares as numbers
    t = tasks(compile_ok(_guarded("0.9")))
    assert t["ship"]["when"] == [{"input": "$(tasks.ship-when.results.holds)",
                                  "operator": "in", "values": ["true"]}]
    guard = t["ship-when"]
    assert [p["value"] for p in guard["params"]] == ["$(tasks.score.results.auc)", "0.8"]
    assert ">= (r + 0)" in guard["taskSpec"]["steps"][0]["script"]
    # the else branch tests the negation
    assert "< (r + 0)" in t["retrain-when"]["taskSpec"]["steps"][0]["script"]


@pytest.mark.parametrize("value, ran", [
    ("0.9", {"ship"}), ("0.5", {"retrain"}), ("0.97", {"ship", "celebrate"}),
    ("0.8", {"ship"}), ("1e-3", {"retrain"})])
def test_guarded_steps_run_as_the_numbers_say(tmp_path: Path, value: str,
                                              ran: set[str]) -> None:
    run = run_pipeline(compile_ok(_guarded(value)), tmp_path)
    assert run.status == "Succeeded"
    done = {n for n, r in run.tasks.items() if r.state == "succeeded" and
            not n.endswith("-when") and n != "score"}
    assert done == ran


def test_a_guard_fails_on_a_value_that_is_not_a_number(tmp_path: Path) -> None:
    run = run_pipeline(compile_ok(_guarded("high")), tmp_path)
    assert run.status == "Failed"
    assert run.tasks["ship-when"].state == "failed"
    assert "not both numbers" in "".join(run.tasks["ship-when"].stderr)
    assert "ship" not in run.tasks or run.tasks["ship"].state != "succeeded"


def test_a_step_named_like_a_guard_is_refused() -> None:
    wf = _guarded("0.9")
    clash = S("ship-when", ctr("true"))
    with pytest.raises(UnsupportedFeatureError, match=r"'ship'.*guard task name"):
        tekton.compile_workflow(wf_of(*wf.steps, clash))


def test_static_map_is_matrix_include() -> None:
    step = S("train", ir.ContainerSpec("py", ("train",), ("{{inputs.lr}}", "{{item.b}}")),
             inputs=(ir.InputParameter("lr", ir.ItemRef("a")),),
             foreach=ir.ForEach(items=(L({"a": 0.1, "b": 32}), L({"a": 0.01, "b": 64}))))
    task = tasks(compile_ok(wf_of(step)))["train"]
    assert task["matrix"] == {"include": [
        {"name": "item-0", "params": [{"name": "lr", "value": "0.1"},
                                      {"name": "couler-item-b", "value": "32"}]},
        {"name": "item-1", "params": [{"name": "lr", "value": "0.01"},
                                      {"name": "couler-item-b", "value": "64"}]}]}
    assert "params" not in task
    assert task["taskSpec"]["params"] == [{"name": "lr", "type": "string"},
                                          {"name": "couler-item-b", "type": "string"}]
    assert task["taskSpec"]["steps"][0]["args"] == ["$(params.lr)", "$(params.couler-item-b)"]


def test_static_map_over_limit_is_rejected() -> None:
    items = tuple(L(i) for i in range(tekton.MAX_MATRIX_COMBINATIONS + 1))
    step = S("m", ir.ContainerSpec("a", ("echo",), ("{{item}}",)), foreach=ir.ForEach(items))
    with pytest.raises(UnsupportedFeatureError, match="256"):
        tekton.compile_workflow(wf_of(step))


def test_dynamic_map_reads_array_result() -> None:
    lister = S("ls", ir.ScriptSpec("python:3.12", "print('[\"a\"]')\n"),
               outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT,
                                           type=ir.ValueType.LIST),))
    proc = S("proc", ir.ContainerSpec("a", ("echo",), ("{{inputs.x}}",)),
             inputs=(ir.InputParameter("x", ir.ItemRef()),),
             dependencies=(ir.Dependency("ls"),),
             foreach=ir.ForEach(source=ir.StepOutputRef("ls", "result")))
    t = tasks(compile_ok(wf_of(lister, proc)))
    assert t["ls"]["taskSpec"]["results"] == [{"name": "result", "type": "array"}]
    assert t["proc"]["matrix"] == {"params": [
        {"name": "x", "value": "$(tasks.ls.results.result[*])"}]}


def test_reading_output_of_mapped_step_is_rejected() -> None:
    m = S("m", ctr("sh", "-c", "echo {{item}} > /tmp/o"), foreach=ir.ForEach((L(1), L(2))),
          outputs=(ir.OutputParameter("o", selector="/tmp/o"),))
    r = S("r", ir.ContainerSpec("a", ("echo",), ("{{inputs.v}}",)),
          inputs=(ir.InputParameter("v", ir.StepOutputRef("m", "o")),),
          dependencies=(ir.Dependency("m"),))
    with pytest.raises(UnsupportedFeatureError, match=r"'r'.*map over static items"):
        tekton.compile_workflow(wf_of(m, r))


def test_short_loop_is_unrolled() -> None:
    cond = ir.Condition(ir.StepOutputRef("flip", "result"), ir.CompareOp.EQ, L("tails"))
    flip = ir.Step("flip", _flip().body, outputs=_flip().outputs, loop=ir.Loop(cond, 3))
    after = S("after", ctr("echo"), dependencies=(ir.Dependency("flip"),))
    t = tasks(compile_ok(wf_of(flip, after)))
    assert list(t) == ["flip", "flip-iter2", "flip-iter3", "after"]
    assert "when" not in t["flip"]
    assert t["flip-iter2"]["runAfter"] == ["flip"]
    assert t["flip-iter2"]["when"] == [{"input": "$(tasks.flip.results.result)",
                                        "operator": "in", "values": ["tails"]}]
    assert t["flip-iter3"]["when"][0]["input"] == "$(tasks.flip-iter2.results.result)"
    assert t["after"]["runAfter"] == ["flip", "flip-iter2", "flip-iter3"]


def test_long_loop_is_rejected() -> None:
    cond = ir.Condition(ir.StepOutputRef("flip", "result"), ir.CompareOp.EQ, L("tails"))
    flip = ir.Step("flip", _flip().body, outputs=_flip().outputs, loop=ir.Loop(cond, 9))
    with pytest.raises(UnsupportedFeatureError, match=r"'flip'.*bounded loop.*at most 8"):
        tekton.compile_workflow(wf_of(flip))


def test_exit_hooks_are_finally_tasks() -> None:
    hooks = (ir.ExitHook(ir.RunStatus.SUCCEEDED, (S("yay", ctr("echo", "ok")),)),
             ir.ExitHook(ir.RunStatus.FAILED, (S("nay", ctr("echo", "no")),)),
             ir.ExitHook(ir.RunStatus.ANY, (S("always", ctr("echo")),)))
    docs = compile_ok(wf_of(S("main", ctr("true")), exit_hooks=hooks))
    fin = tasks(docs, "finally")
    assert fin["yay"]["when"] == [{"input": "$(tasks.status)", "operator": "in",
                                   "values": ["Succeeded", "Completed"]}]
    assert fin["nay"]["when"] == [{"input": "$(tasks.status)", "operator": "in",
                                   "values": ["Failed"]}]
    assert "when" not in fin["always"]


def test_retries_timeout_resources() -> None:
    step = S("t", ctr("train"), retry=ir.RetryPolicy(limit=3), timeout_seconds=90,
             resources=ir.Resources(cpu_request="1", memory_limit="2Gi", gpu=1))
    docs = compile_ok(wf_of(step, timeout_seconds=3600))
    task = tasks(docs)["t"]
    assert task["retries"] == 3
    assert task["timeout"] == "90s"
    assert task["taskSpec"]["steps"][0]["computeResources"] == {
        "requests": {"cpu": "1"}, "limits": {"memory": "2Gi", "nvidia.com/gpu": "1"}}
    assert docs[1]["spec"]["timeouts"] == {"pipeline": "3600s"}


def test_defaults_apply() -> None:
    wf = wf_of(S("t", ctr("x")), defaults=ir.StepDefaults(retry=ir.RetryPolicy(limit=2),
                                                         timeout_seconds=5))
    task = tasks(compile_ok(wf))["t"]
    assert (task["retries"], task["timeout"]) == (2, "5s")


def test_memory_escalation_without_memory_is_plain_retries() -> None:
    step = S("t", ctr("x"), retry=ir.RetryPolicy(limit=3, memory_factor=2.0))
    task = tasks(compile_ok(wf_of(step)))["t"]  # nothing to multiply: as the local engine
    assert task["retries"] == 3


def test_secrets() -> None:
    step = S("s", ctr("env"), env=(ir.EnvVar("TOKEN", secret=ir.SecretRef("creds", "token")),
                                   ir.EnvVar("PLAIN", "v")))
    env = tasks(compile_ok(wf_of(step)))["s"]["taskSpec"]["steps"][0]["env"]
    assert env == [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                    "key": "token"}}},
                   {"name": "PLAIN", "value": "v"}]


def test_workflow_parameters() -> None:
    step = S("train", ir.ContainerSpec("py", ("train",), ("{{inputs.d}}",)),
             inputs=(ir.InputParameter("d", ir.WorkflowParamRef("dataset")),))
    params = (ir.Parameter("dataset", default=L("s3://x")),
              ir.Parameter("shards", ir.ValueType.LIST, default=L(["a", 1])),
              ir.Parameter("required"))
    docs = compile_ok(wf_of(step, parameters=params))
    assert docs[0]["spec"]["params"] == [
        {"name": "dataset", "type": "string", "default": "s3://x"},
        {"name": "shards", "type": "array", "default": ["a", "1"]},
        {"name": "required", "type": "string"}]
    assert docs[1]["spec"]["params"] == [{"name": "dataset", "value": "s3://x"},
                                         {"name": "shards", "value": ["a", "1"]}]
    assert tasks(docs)["train"]["params"] == [{"name": "d", "value": "$(params.dataset)"}]


def test_volumes_and_pod_settings() -> None:
    step = S("s", ctr("ls"), volume_mounts=(ir.VolumeMount("data", "/data", sub_path="x"),),
             node_selector=(("pool", "gpu"),), tolerations=(ir.Toleration("gpu", "Exists"),))
    wf = wf_of(step, volumes=(ir.Volume("data", ir.VolumeKind.PVC, claim_name="pvc-1"),),
               node_selector=(("zone", "a"),), service_account="runner",
               image_pull_secrets=("regcred",))
    docs = compile_ok(wf)
    assert docs[0]["spec"]["workspaces"] == [{"name": "data"}]
    task = tasks(docs)["s"]
    assert task["workspaces"] == [{"name": "data", "workspace": "data", "subPath": "x"}]
    assert task["taskSpec"]["workspaces"] == [{"name": "data", "mountPath": "/data"}]
    run = docs[1]["spec"]
    assert run["workspaces"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "pvc-1"}}]
    assert run["taskRunTemplate"] == {"serviceAccountName": "runner", "podTemplate": {
        "nodeSelector": {"zone": "a"}, "imagePullSecrets": [{"name": "regcred"}]}}
    assert run["taskRunSpecs"] == [{"pipelineTaskName": "s", "podTemplate": {
        "nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}}]


def test_inline_subworkflow_is_flattened() -> None:
    inner = (S("a", ctr("sh", "-c", "echo 1 > /tmp/o"),
               outputs=(ir.OutputParameter("o", selector="/tmp/o"),)),
             S("b", ctr("echo"), dependencies=(ir.Dependency("a"),)))
    group = S("g", ir.SubWorkflowSpec("g", inner), dependencies=(ir.Dependency("first"),),
              outputs=(ir.OutputParameter("o"),))
    last = S("last", ir.ContainerSpec("a", ("echo",), ("{{inputs.v}}",)),
             inputs=(ir.InputParameter("v", ir.StepOutputRef("g", "o")),),
             dependencies=(ir.Dependency("g"),))
    t = tasks(compile_ok(wf_of(S("first", ctr("true")), group, last)))
    assert list(t) == ["first", "g-a", "g-b", "last"]
    assert t["g-a"]["runAfter"] == ["first"]
    assert t["g-b"]["runAfter"] == ["g-a"]
    assert t["last"]["runAfter"] == ["g-a", "g-b"]
    assert t["last"]["params"] == [{"name": "v", "value": "$(tasks.g-a.results.o)"}]


def test_to_yaml_is_multi_document() -> None:
    docs = compile_ok(wf_of(S("a", ctr("true"))))
    text = tekton.to_yaml(docs)
    assert text.count("---\n") == 1
    assert [d["kind"] for d in yaml.safe_load_all(text)] == ["Pipeline", "PipelineRun"]


# --------------------------------------------------------------------------- matrix / limits


def test_every_feature_has_a_capability_with_a_note() -> None:
    assert set(tekton.CAPABILITIES) == set(Feature)
    for feature, cap in tekton.CAPABILITIES.items():
        assert cap.note, feature


def test_limits_have_sources() -> None:
    assert tekton.LIMITS
    names = [lim.name for lim in tekton.LIMITS]
    assert any("matrix" in n for n in names)
    for lim in tekton.LIMITS:
        assert lim.source.strip() and lim.value > 0 and lim.unit


def test_pod_dns_settings() -> None:
    wf = ir.Workflow(
        "dns",
        (ir.Step("s", ir.ContainerSpec("alpine", command=("true",))),),
        dns=ir.DnsConfig("None", ("1.1.1.1",), ("svc.local",), (("ndots", "2"), ("edns0", ""))),
    )
    _, run = compile_ok(wf)
    pod = run["spec"]["taskRunTemplate"]["podTemplate"]
    assert pod["dnsPolicy"] == "None"
    # Options are sorted by name; one without a value carries no "value" key.
    assert pod["dnsConfig"] == {"nameservers": ["1.1.1.1"], "searches": ["svc.local"],
                                "options": [{"name": "edns0"}, {"name": "ndots", "value": "2"}]}
