"""Cron schedules (a CronJob creating PipelineRuns) and event triggers (Tekton Triggers)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from couler import ir
from couler.compilers import tekton
from couler.compilers.tekton._schedule import LAUNCHER_ACCOUNT, SCHEDULED_BY, cel_filter
from couler.errors import UnsupportedFeatureError
from tests.unit.k8s_schema import kube_errors
from tests.unit.test_tekton_compiler import schema_errors


def _wf(**kw: Any) -> ir.Workflow:
    return ir.Workflow(kw.pop("name", "wf"), (ir.Step(
        name="a", body=ir.ContainerSpec("alpine:3.20", ("echo", "{{inputs.size}}")),
        inputs=(ir.InputParameter("size", ir.WorkflowParamRef("size")),)),),
        parameters=(ir.Parameter("size", default=ir.Literal.of("1")),), **kw)


def _compile(wf: ir.Workflow) -> dict[str, dict[str, Any]]:
    docs = tekton.compile_workflow(wf)
    for doc in docs:
        assert schema_errors(doc) == [], doc["kind"]
    assert list(yaml.safe_load_all(tekton.to_yaml(docs))) == docs
    return {d["kind"]: d for d in docs}


CRON = ir.CronSchedule("*/5 * * * *", timezone="Europe/Berlin",
                       concurrency_policy=ir.ConcurrencyPolicy.FORBID,
                       starting_deadline_seconds=30, successful_history_limit=2,
                       failed_history_limit=1, suspend=True)


def test_cron_compiles_to_a_cronjob_creating_the_pipelinerun() -> None:
    docs = _compile(_wf(schedule=CRON, tenant="team"))
    assert list(docs) == ["Pipeline", "PipelineRun", "ConfigMap", "CronJob"]
    spec = docs["CronJob"]["spec"]
    assert {k: v for k, v in spec.items() if k != "jobTemplate"} == {
        "schedule": "*/5 * * * *", "timeZone": "Europe/Berlin", "concurrencyPolicy": "Forbid",
        "startingDeadlineSeconds": 30, "successfulJobsHistoryLimit": 2,
        "failedJobsHistoryLimit": 1, "suspend": True}
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == LAUNCHER_ACCOUNT
    assert pod["volumes"] == [{"name": "pipelinerun",
                               "configMap": {"name": "wf-pipelinerun"}}]
    script = pod["containers"][0]["command"][2]
    assert "kubectl create -f /etc/couler/pipelinerun.yaml" in script
    assert f"-l {SCHEDULED_BY}=wf" in script and "exit 0" in script  # forbid
    run = yaml.safe_load(docs["ConfigMap"]["data"]["pipelinerun.yaml"])
    assert run["metadata"]["generateName"] == "wf-"
    assert run["metadata"]["labels"] == {SCHEDULED_BY: "wf"}
    assert run["spec"] == docs["PipelineRun"]["spec"]
    assert schema_errors(run) == []
    assert docs["CronJob"]["metadata"]["namespace"] == "team"


@pytest.mark.parametrize(("policy", "expected"), [
    (ir.ConcurrencyPolicy.ALLOW, "Allow"), (ir.ConcurrencyPolicy.REPLACE, "Replace")])
def test_concurrency_policies(policy: ir.ConcurrencyPolicy, expected: str) -> None:
    docs = _compile(_wf(schedule=ir.CronSchedule("0 * * * *", concurrency_policy=policy)))
    spec = docs["CronJob"]["spec"]
    assert spec["concurrencyPolicy"] == expected
    assert "timeZone" not in spec and "suspend" not in spec
    script = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert ("Cancelled" in script) == (policy is ir.ConcurrencyPolicy.REPLACE)
    assert ("kubectl get" in script) == (policy is ir.ConcurrencyPolicy.REPLACE)


def test_kube_check_catches_unknown_and_missing_fields() -> None:
    cron = _compile(_wf(schedule=CRON))["CronJob"]
    bad = {**cron, "spec": {**cron["spec"], "concurrency": "Forbid"}}
    assert kube_errors(bad) == ["CronJob.spec.concurrency: unknown field of V1CronJobSpec"]
    no_schedule = {**cron, "spec": {k: v for k, v in cron["spec"].items() if k != "schedule"}}
    assert any("schedule" in e for e in kube_errors(no_schedule))
    wrong_type = {**cron, "spec": {**cron["spec"], "suspend": "yes"}}
    assert kube_errors(wrong_type) == ["CronJob.spec.suspend: 'yes' is not bool"]


def test_event_triggers_compile_to_tekton_triggers() -> None:
    wf = _wf(triggers=(ir.EventTrigger("datasets.*", "body.size > 0 and not body.partial"),
                       ir.EventTrigger("models.ready")),
             annotations=(("couler.io/launchers", "ci, lab"),))
    docs = _compile(wf)
    assert list(docs) == ["Pipeline", "PipelineRun", "TriggerBinding", "TriggerTemplate",
                          "EventListener"]
    assert docs["TriggerBinding"]["spec"]["params"] == [
        {"name": "size", "value": "$(extensions.couler.size)"}]
    res = docs["TriggerTemplate"]["spec"]["resourcetemplates"][0]
    assert res["spec"]["params"] == [{"name": "size", "value": "$(tt.params.size)"}]
    listener = docs["EventListener"]["spec"]
    assert listener["serviceAccountName"] == LAUNCHER_ACCOUNT
    first, second = listener["triggers"]
    params = {p["name"]: p["value"] for p in first["interceptors"][0]["params"]}
    assert params["filter"].startswith(
        'header.canonical("Couler-Subject").matches("^datasets\\\\.[^.]+$") && '
        'header.canonical("Couler-Launcher") in ["ci", "lab"] && ')
    assert 'double(string(body["size"]).trim()) > double(0.0)' in params["filter"]
    assert params["overlays"] == [{"key": "couler.size", "expression":
                                   '"size" in body ? string(body["size"]) : "1"'}]
    second_filter = second["interceptors"][0]["params"][0]["value"]
    assert second_filter.endswith('matches("^models\\\\.ready$") && '
                                  'header.canonical("Couler-Launcher") in ["ci", "lab"] && (true)')
    assert first["bindings"] == [{"ref": "wf"}] and first["template"] == {"ref": "wf"}


NUM = r'.matches("^\\s*[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][-+]?[0-9]+)?\\s*$")'


def test_cel_filter_translation() -> None:
    assert cel_filter("") == "true"
    assert cel_filter('body["kind"] == "csv"') == \
        '"kind" in body && (string(body["kind"]) == "csv")'
    assert cel_filter("body.k in ['a', 1]") == \
        '"k" in body && (string(body["k"]) in ["a", "1"])'
    assert cel_filter("body.k not in ['a']", ("p",)) == \
        '"p" in body && "k" in body && (!(string(body["k"]) in ["a"]))'
    # a number constant: numbers when the field reads as one, else strings (submitter)
    assert cel_filter("body.n > 2") == (
        f'"n" in body && ((string(body["n"]){NUM} ? double(string(body["n"]).trim()) > '
        'double(2.0) : string(body["n"]) > "2"))')
    # `or`: the submitter reads b only when a is false, and a missing b is false then
    truth = '!(string(body["a"]).lowerAscii().trim() in ["", "0", "false", "no"])'
    truth_b = truth.replace('["a"]', '["b"]')
    assert cel_filter("body.a or body.b") == (
        f'!(!("a" in body) || (!{truth} && !("b" in body))) && '
        f'({truth} || {truth_b})')
    with pytest.raises(ValueError):
        cel_filter("len(body.a) > 1")


def test_a_parameter_without_default_is_required_by_the_filter() -> None:
    wf = ir.Workflow("wf", (ir.Step(name="a", body=ir.ContainerSpec("alpine", ("true",))),),
                     parameters=(ir.Parameter("n"),), triggers=(ir.EventTrigger("s"),))
    docs = _compile(wf)
    flt = docs["EventListener"]["spec"]["triggers"][0]["interceptors"][0]["params"][0]
    assert flt["value"].endswith('("n" in body && true)')


def test_a_filter_outside_the_language_is_rejected() -> None:
    with pytest.raises(UnsupportedFeatureError, match="event trigger"):
        tekton.compile_workflow(_wf(triggers=(ir.EventTrigger("s", "body.a.b == 1"),)))


def _run_job(policy: ir.ConcurrencyPolicy, listed: str, tmp_path: Path) -> list[str]:
    """Run the CronJob's script with a stand-in kubectl that lists ``listed`` (what
    ``kubectl get -o jsonpath`` prints: name and completionTime per run) and records
    the other calls."""
    tmp_path.mkdir()
    docs = _compile(_wf(schedule=ir.CronSchedule("0 * * * *", concurrency_policy=policy)))
    pod = docs["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    calls = tmp_path / "calls"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\nif [ "$1" = get ]; then printf %s "$LISTED"; '
                       f'else echo "$@" >> {calls}; fi\n')
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "LISTED": listed}
    subprocess.run(pod["containers"][0]["command"], env=env, check=True)
    return calls.read_text().splitlines() if calls.exists() else []


CREATE = "create -f /etc/couler/pipelinerun.yaml"
DONE = "wf-abc 2024-05-01T10:00:00Z\n"


def test_the_job_applies_the_concurrency_policy_to_pipelineruns(tmp_path: Path) -> None:
    forbid, replace, allow = (ir.ConcurrencyPolicy.FORBID, ir.ConcurrencyPolicy.REPLACE,
                              ir.ConcurrencyPolicy.ALLOW)
    assert _run_job(forbid, DONE, tmp_path / "f1") == [CREATE]
    assert _run_job(forbid, DONE + "wf-def \n", tmp_path / "f2") == []
    assert _run_job(replace, DONE + "wf-def \nwf-ghi \n", tmp_path / "r") == [
        'patch pipelinerun wf-def --type merge -p {"spec":{"status":"Cancelled"}}',
        'patch pipelinerun wf-ghi --type merge -p {"spec":{"status":"Cancelled"}}', CREATE]
    assert _run_job(allow, "wf-def \n", tmp_path / "a") == [CREATE]
