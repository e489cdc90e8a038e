"""Tune steps on KFP: the study's rounds compiled by the real kfp compiler, and a mapped
step's output read downstream (dsl.Collected) run on ``kfp.local``.

The tune conformance program itself runs on kfp.local in
tests/integration/test_conformance_engines.py (KFP_RUN, compared with the expected answer).
kfp lives in ``.venv-kfp``; a missing one is a failure, never a skip.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
KFP_PYTHON = ROOT / ".venv-kfp" / "bin" / "python"

HELPER = r'''
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from couler import ir
from couler.compilers import kfp as K
from tests.conformance.loader import load_program
mode = sys.argv[2]
if mode == "tune":
    wf = load_program(Path(sys.argv[1]) / "tests" / "conformance" / "programs" / "tune.py")
    print(json.dumps(K.compile_workflow(wf)))
    raise SystemExit(0)
# a static map whose stdout a later step reads: the list of the items' outputs
mapped = ir.Step("m", ir.ContainerSpec("python:3.12-alpine", command=(
    sys.executable, "-c", "import sys; print(int(sys.argv[1]) * 10)", "{{item}}")),
    outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT, ""),),
    foreach=ir.ForEach(items=(ir.Literal.of(1), ir.Literal.of(2), ir.Literal.of(3))))
reader = ir.Step("r", ir.ContainerSpec("python:3.12-alpine", command=(
    sys.executable, "-c", "import sys; print(sys.argv[1])", "{{inputs.all}}")),
    inputs=(ir.InputParameter("all", ir.StepOutputRef("m", "result")),),
    dependencies=(ir.Dependency("m"),))
wf = ir.Workflow(name="collect", steps=(mapped, reader))
spec = K.compile_workflow(wf)
runs = K.run_locally(wf, sys.argv[3])
print(json.dumps({"spec": spec, "runs": runs}))
'''


def _kfp(*args: str) -> Any:
    if not KFP_PYTHON.exists():
        pytest.fail(f"{KFP_PYTHON} is missing: run scripts/setup-engine-venv.sh kfp",
                    pytrace=False)
    proc = subprocess.run([str(KFP_PYTHON), "-c", HELPER, str(ROOT), *args],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tune_spec() -> dict[str, Any]:
    spec: dict[str, Any] = _kfp("tune")
    return spec


def _executor(spec: dict[str, Any], task: str) -> dict[str, Any]:
    container: dict[str, Any] = spec["deploymentSpec"]["executors"][f"exec-{task}"]["container"]
    return container


def test_the_study_runs_as_rounds_of_ask_trials_and_tell(tune_spec: dict[str, Any]) -> None:
    tasks = tune_spec["root"]["dag"]["tasks"]
    # 3 trials, 2 at once: two rounds, then the best task under the tune step's name
    assert sorted(tasks) == ["couler-trial-0", "couler-trial-1", "trial", "trial-ask-0",
                             "trial-ask-1", "trial-tell-0", "trial-tell-1", "use"]
    assert tasks["trial-ask-1"]["dependentTasks"] == ["trial-tell-0"]
    assert tasks["trial"]["dependentTasks"] == ["trial-tell-1"]
    for r in (0, 1):
        sub = tune_spec["components"][f"comp-couler-trial-{r}"]["dag"]
        loop = sub["tasks"]["for-loop-1"]
        assert loop["iteratorPolicy"] == {"parallelismLimit": 2}
        # the sub-pipeline's output: the trials' objectives collected over the loop
        assert sub["outputs"]["parameters"]["Output"]["valueFromParameter"] == {
            "outputParameterKey": f"pipelinechannel--trial-{r}-result",
            "producerSubtask": "for-loop-1"}
        tell = tasks[f"trial-tell-{r}"]["inputs"]["parameters"]
        assert tell["values"] == {"taskOutputParameter": {
            "outputParameterKey": "Output", "producerTask": f"couler-trial-{r}"}}
        assert tell["trials"]["taskOutputParameter"]["producerTask"] == f"trial-ask-{r}"
        assert tune_spec["components"][f"comp-trial-tell-{r}"]["inputDefinitions"][
            "parameters"]["values"] == {"parameterType": "LIST"}


def test_the_tools_name_the_run_and_read_the_storage_secret(
        tune_spec: dict[str, Any]) -> None:
    for task in ("trial-ask-0", "trial-tell-0", "trial"):
        words = [*_executor(tune_spec, task).get("command", []),
                 *_executor(tune_spec, task).get("args", [])]
        assert "couler_runtime.tune" in words
        # the study of this run: a retry of the run resumes it, another run has its own
        assert words[words.index("--context") + 1] == "{{$.pipeline_job_uuid}}"
        assert "{{workflow.uid}}" not in json.dumps(words)
    ask = _executor(tune_spec, "trial-ask-0")
    assert "--text-params" in ask["args"]  # an item's 2 would read 2.0 otherwise
    k8s = tune_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert k8s["exec-trial-ask-0"]["secretAsEnv"] == [{
        "secretName": "couler-tune", "secretNameParameter": {
            "runtimeValue": {"constant": "couler-tune"}},
        "keyToEnv": [{"secretKey": "url", "envVar": "COULER_TUNE_STORAGE"}],
        "optional": False}]


def test_no_pruning_env_reaches_a_trial(tune_spec: dict[str, Any]) -> None:
    # KFP sets environment variables to literals only: the trial is not told its number
    trial = _executor(tune_spec, "trial-0")
    assert "COULER_TUNE" not in json.dumps(trial)
    assert trial["image"] == "python:3.12-alpine"


def test_a_mapped_steps_output_is_read_as_a_collected_list(tmp_path: Path) -> None:
    out = _kfp("collect", str(tmp_path / "root"))
    reader = out["spec"]["root"]["dag"]["tasks"]["r"]["inputs"]["parameters"]
    (param,) = reader.values()
    assert param["taskOutputParameter"]["producerTask"] == "for-loop-2"
    # kfp.local runs it: the items' outputs in item order, one list
    assert sorted(out["runs"]["m"]) == ["10\n", "20\n", "30\n"]
    assert [json.loads(s) for s in out["runs"]["r"]] == [["10", "20", "30"]]
