"""Job steps on KFP: a kubectl container component, compiled with the KFP SDK (.venv-kfp),
its command run on the host against a fake ``kubectl`` (as tests/unit/test_tekton_job.py
runs Tekton's: the script is the same, :mod:`couler.compilers.kube_job`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from couler.compilers import kube_job
from tests.integration.test_kfp import ROOT, kfp_python
from tests.unit.test_tekton_job import _fake

HELPER = r'''
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from couler import ir
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError
from tests.conformance.loader import load_program

out = {"job_step": K.compile_workflow(load_program(
    Path(sys.argv[1]) / "tests/conformance/programs/job_step.py"))}
cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "conf"},
      "data": {"size": "{{inputs.size}}"}}
patch = ir.Step(name="patch", body=ir.JobSpec.of(cm, action=ir.JobAction.PATCH),
                inputs=(ir.InputParameter("size", ir.WorkflowParamRef("size")),),
                outputs=(ir.OutputParameter("data", ir.OutputSource.JSON_PATH, "{.data}"),),
                retry=ir.RetryPolicy(limit=2))
wf = ir.Workflow(name="patch-job", steps=(patch,),
                 parameters=(ir.Parameter("size", default=ir.Literal.of("3")),))
out["patch"] = K.compile_workflow(wf)
job = ir.JobSpec.of({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
run = ir.Step(name="run", body=ir.ContainerSpec(image="alpine", command=("false",)))
bad = {
    "jq filter": ir.Workflow(name="jq", steps=(ir.Step(name="j", body=job, outputs=(
        ir.OutputParameter("n", ir.OutputSource.JQ, ".metadata.name"),)),)),
    "edge handler": ir.Workflow(name="edge", steps=(run, ir.Step(
        name="j", body=job,
        dependencies=(ir.Dependency("run", ir.EdgeCondition.FAILED),)))),
    "condition": ir.Workflow(name="cond", steps=(ir.Step(name="j", body=ir.JobSpec.of(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
        success_condition="a ~ b")),)),
}
refusals = {}
for name, wf in bad.items():
    try:
        K.compile_workflow(wf)
        refusals[name] = None
    except UnsupportedFeatureError as exc:
        refusals[name] = [exc.step, exc.feature, str(exc)]
try:
    K.run_locally(ir.Workflow(name="local", steps=(ir.Step(name="j", body=job),)),
                  sys.argv[2])
    refusals["local"] = None
except UnsupportedFeatureError as exc:
    refusals["local"] = [exc.step, exc.feature, str(exc)]
out["refusals"] = refusals
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("kfp-job")
    script = tmp / "kfp_job_helper.py"
    script.write_text(HELPER)
    proc = subprocess.run([kfp_python(), str(script), str(ROOT), str(tmp / "root")],
                          capture_output=True, text=True, check=False, timeout=300, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _executor(spec: dict[str, Any], step: str) -> dict[str, Any]:
    comp = spec["components"][spec["root"]["dag"]["tasks"][step]["componentRef"]["name"]]
    container: dict[str, Any] = spec["deploymentSpec"]["executors"][comp["executorLabel"]][
        "container"]
    return container


def _run(container: dict[str, Any], tmp_path: Path, values: dict[str, str]
         ) -> tuple[int, dict[str, str]]:
    """Run the executor's command like the KFP launcher: placeholders filled, the pod's
    name and uid in the environment (the downward API), a recording ``sleep``."""
    words = [*container["command"], *container.get("args", [])]
    outputs = {}
    for w in container.get("args", []):
        name = w.split("'")[1]  # {{$.outputs.parameters['NAME'].output_file}}
        outputs[name] = tmp_path / "out" / name
        values[w] = str(outputs[name])
    (tmp_path / "out").mkdir()
    for placeholder, value in values.items():
        words = [w.replace(placeholder, value) for w in words]
    assert not any("{{$" in w for w in words), "unsubstituted placeholder"
    bin_dir = tmp_path / "bin"
    (bin_dir / "sleep").write_text(f'#!/bin/sh\necho "$1" >> {tmp_path / "slept"}\n')
    (bin_dir / "sleep").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "COULER_POD_NAME": "k8s-job-pod", "COULER_POD_UID": "0000-pod-uid"}
    proc = subprocess.run(words, env=env, cwd=tmp_path, capture_output=True, text=True,
                          check=False, timeout=60)
    return proc.returncode, {n: p.read_text() for n, p in outputs.items() if p.exists()}


def test_job_step_is_a_kubectl_component_with_output_parameters(
        compiled: dict[str, Any], tmp_path: Path) -> None:
    spec = compiled["job_step"]
    container = _executor(spec, "k8s-job")
    assert container["image"] == kube_job.JOB_IMAGE
    assert container["command"][:2] == ["/bin/sh", "-c"]
    comp = spec["components"]["comp-k8s-job"]
    assert sorted(comp["outputDefinitions"]["parameters"]) == ["job_id", "job_name", "job_obj"]
    # the pod's name and uid (the resource's owner) from the downward API
    env = spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-k8s-job"][
        "fieldPathAsEnv"]
    assert env == [{"fieldPath": "metadata.name", "name": "COULER_POD_NAME"},
                   {"fieldPath": "metadata.uid", "name": "COULER_POD_UID"}]
    _fake(tmp_path)
    rc, outputs = _run(container, tmp_path, {})
    assert rc == 0
    assert outputs == {"job_name": "conf-job-x", "job_id": "", "job_obj": '{"kind": "Job"}'}
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == f"create -f {kube_job.MANIFEST_PATH} -o name"
    assert (tmp_path / "polls").read_text().strip() == "2"  # not yet, then succeeded
    assert (tmp_path / "slept").read_text().split() == [str(kube_job.POLL_SECONDS)]
    manifest = json.loads((tmp_path / "m").read_text())
    assert manifest["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "k8s-job-pod", "uid": "0000-pod-uid"}]


def test_the_failure_condition_fails_the_job_step(compiled: dict[str, Any],
                                                  tmp_path: Path) -> None:
    _fake(tmp_path, failed="4")
    rc, _ = _run(_executor(compiled["job_step"], "k8s-job"), tmp_path, {})
    assert rc == 1
    assert not (tmp_path / "slept").exists()  # failed at the first look


def test_patch_job_reads_its_input_and_keeps_task_policies(compiled: dict[str, Any],
                                                           tmp_path: Path) -> None:
    spec = compiled["patch"]
    task = spec["root"]["dag"]["tasks"]["patch"]
    assert task["retryPolicy"]["maxRetryCount"] == 2
    assert "platforms" not in spec  # patch: no owner reference, no pod fields needed
    container = _executor(spec, "patch")
    _fake(tmp_path)
    rc, _ = _run(container, tmp_path, {"{{$.inputs.parameters['size']}}": "3"})
    assert rc == 0
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].startswith(f"patch -f {kube_job.MANIFEST_PATH} --type merge -p ")
    manifest = json.loads((tmp_path / "m").read_text())
    assert manifest["data"] == {"size": "3"} and "ownerReferences" not in manifest["metadata"]


@pytest.mark.parametrize(("case", "detail"), [
    ("jq filter", "must be a JSONPath"),
    ("edge handler", "cannot carry a failed / completed edge"),
    ("condition", "cannot read the requirement"),
    ("local", "kfp.local runs no job step"),
])
def test_what_a_kfp_job_step_cannot_carry_is_refused(compiled: dict[str, Any], case: str,
                                                     detail: str) -> None:
    refusal = compiled["refusals"][case]
    assert refusal is not None, case
    step, feature, message = refusal
    assert (step, feature) == ("j", "job step (Kubernetes resource)")
    assert detail in message
