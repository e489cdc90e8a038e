"""Job steps on Tekton: the kubectl step's script, run against a fake ``kubectl``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from couler import ir
from couler.compilers import tekton
from couler.compilers.tekton import _job
from couler.errors import UnsupportedFeatureError
from tests.conformance.loader import load_program, program_paths
from tests.unit.test_tekton_compiler import compile_ok, schema_errors, tasks, wf_of
from tests.unit.test_tekton_retry import run_step

FAKE_KUBECTL = """#!/bin/sh
echo "$*" >> {log}
case "$1" in
  create|apply|replace|patch|delete)
    cp "$3" {manifest}; echo job.batch/conf-job-x;;
  get)
    case "$*" in
      *'{{.status.succeeded}}'*)
        n=$(cat {polls} 2>/dev/null || echo 0); echo $((n + 1)) > {polls}
        [ "$n" -ge 1 ] && printf 1;;
      *'{{.status.failed}}'*) printf '%s' "{failed}";;
      *'{{.metadata.name}}'*) printf conf-job-x;;
      *'-o json') printf '{{"kind": "Job"}}';;
    esac;;
esac
"""


def _kubectl(tmp_path: Path, script: str, **fields: str) -> None:
    """Install ``script`` (formatted with the call log, manifest and poll files) as
    ``tmp_path/bin/kubectl``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(script.format(log=tmp_path / "calls", manifest=tmp_path / "m",
                                     polls=tmp_path / "polls", **fields))
    kubectl.chmod(0o755)


def _fake(tmp_path: Path, failed: str = "") -> None:
    _kubectl(tmp_path, FAKE_KUBECTL, failed=failed)


def _job_program() -> ir.Workflow:
    (path,) = [p for p in program_paths() if p.stem == "job_step"]
    return load_program(path)


def test_job_step_program_creates_polls_and_reads_outputs(tmp_path: Path) -> None:
    docs = compile_ok(_job_program())
    task = tasks(docs)["k8s-job"]
    assert task["taskSpec"]["steps"][0]["image"] == _job.JOB_IMAGE
    _fake(tmp_path)
    rc, results, _ = run_step(task, tmp_path)
    assert rc == 0
    assert results == {"job-name": "conf-job-x", "job-id": "", "job-obj": '{"kind": "Job"}'}
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "create -f /tmp/couler-manifest.json -o name"
    assert (tmp_path / "polls").read_text().strip() == "2"  # not yet, then succeeded
    assert (tmp_path / "slept").read_text().split() == [str(_job.POLL_SECONDS)]
    manifest = json.loads((tmp_path / "m").read_text())
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == "$(context.taskRun.uid)"
    assert manifest["metadata"]["generateName"] == "conf-job-"


def test_the_failure_condition_fails_the_step(tmp_path: Path) -> None:
    _fake(tmp_path, failed="4")
    rc, _, _ = run_step(tasks(compile_ok(_job_program()))["k8s-job"], tmp_path)
    assert rc == 1
    assert not (tmp_path / "slept").exists()  # failed at the first look


@pytest.mark.parametrize(("condition", "field", "holds"), [
    ("status.phase == Running", "Running", True),
    ("status.phase = Running", "Pending", False),
    ("status.phase != Failed", "Running", True),
    ("status.phase in (Running, Succeeded)", "Succeeded", True),
    ("status.phase notin (Running, Succeeded)", "Succeeded", False),
    ("status.phase", "", False),
    ("!status.phase", "", True),
    ("status.count < 3", "2", True),
    ("status.count > 3", "", False),
])
def test_condition_requirements(tmp_path: Path, condition: str, field: str, holds: bool,
                                ) -> None:
    test = _job.condition_test(condition)
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f"#!/bin/sh\nprintf '%s' '{field}'\n")
    kubectl.chmod(0o755)
    proc = subprocess.run(["/bin/sh", "-c", f"couler_obj=x; if {test}; then exit 0; fi; exit 7"],
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=False)
    assert (proc.returncode == 0) == holds


def test_unreadable_conditions_and_wrapped_features_are_refused() -> None:
    with pytest.raises(ValueError, match="integer"):
        _job.condition_test("status.count > many")
    job = ir.JobSpec.of({"apiVersion": "v1", "kind": "ConfigMap"},
                        success_condition="a ~ b")
    with pytest.raises(UnsupportedFeatureError, match="cannot read the requirement"):
        tekton.compile_workflow(wf_of(ir.Step(name="j", body=job)))
    unnamed = ir.JobSpec.of({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"generateName": "c-"}}, action=ir.JobAction.APPLY)
    with pytest.raises(UnsupportedFeatureError, match="generateName works with create only"):
        tekton.compile_workflow(wf_of(ir.Step(name="j", body=unnamed)))
    cached = ir.Step(name="j", body=ir.JobSpec.of({"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": {"name": "c"}}),
                     cache=ir.CachePolicy())
    with pytest.raises(UnsupportedFeatureError, match="a cache policy"):
        tekton.compile_workflow(wf_of(cached))


# --------------------------------------------------------------------------- references

FAKE_TKN = """#!/bin/sh
echo "$*" >> {log}
case "$1" in
  create) cp "$3" {manifest}; echo pipelinerun.tekton.dev/child-x7;;
  get)
    case "$*" in
      *'{{.status.conditions[0].status}}'*)
        n=$(cat {polls} 2>/dev/null || echo 0); echo $((n + 1)) > {polls}
        if [ "$n" -ge 1 ]; then printf '%s' "{final}"; else printf Unknown; fi;;
    esac;;
esac
"""


def _ref_task(tmp_path: Path, final: str, **step: object) -> dict[str, object]:
    _kubectl(tmp_path, FAKE_TKN, final=final)
    ref = ir.Step("child", ir.SubWorkflowSpec(name="child", digest="sha256:ab12"), **step)
    return tasks(compile_ok(wf_of(ref)))["child"]


def test_a_reference_creates_a_pipelinerun_of_the_named_pipeline_and_waits(
        tmp_path: Path) -> None:
    task = _ref_task(tmp_path, "True", inputs=(
        ir.InputParameter("rows", ir.Literal.of(10)),))
    assert task["params"] == [{"name": "rows", "value": "10"}]
    (step,) = task["taskSpec"]["steps"]  # type: ignore[index]
    step["script"] = step["script"].replace("$(params.rows)", "10")  # as Tekton does
    rc, _, _ = run_step(task, tmp_path)
    assert rc == 0
    run = json.loads((tmp_path / "m").read_text())
    assert schema_errors(run) == []  # a valid PipelineRun
    assert run["spec"] == {"pipelineRef": {"name": "child"},
                           "params": [{"name": "rows", "value": "10"}]}
    assert run["metadata"]["generateName"] == "child-"
    assert run["metadata"]["annotations"] == {"couler.io/digest": "sha256:ab12"}
    assert run["metadata"]["ownerReferences"][0]["kind"] == "TaskRun"
    assert (tmp_path / "polls").read_text().strip() == "2"  # Unknown, then True


def test_a_failed_child_run_fails_the_step(tmp_path: Path) -> None:
    rc, _, _ = run_step(_ref_task(tmp_path, "False"), tmp_path)
    assert rc == 1


def test_a_reference_declaring_outputs_is_refused() -> None:
    ref = ir.Step("child", ir.SubWorkflowSpec(name="child"), outputs=(
        ir.OutputParameter("n", ir.OutputSource.PATH, "/tmp/n"),))
    with pytest.raises(UnsupportedFeatureError, match=r"'child'.*cannot be read back"):
        tekton.compile_workflow(wf_of(ref))
