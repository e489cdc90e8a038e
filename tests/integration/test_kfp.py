"""Kubeflow Pipelines: golden programs compile to a PipelineSpec with the real KFP SDK, and
workflows run end to end with ``kfp.local`` (SubprocessRunner, no Docker).

kfp pins protobuf < 7, so it lives in ``.venv-kfp``; these tests drive it through
subprocesses. A missing ``.venv-kfp`` is a failure, never a skip.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "programs"
KFP_PYTHON = ROOT / ".venv-kfp" / "bin" / "python"

# Runs inside .venv-kfp: capture each program, compile (or run locally), print JSON.
HELPER = r'''
import json, sys
from couler.api.capture import capture_program
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError

mode, *paths = sys.argv[1:]
if mode == "run":
    wf = capture_program(paths[0])[0]
    print(json.dumps({"runs": K.run_locally(wf, paths[1])}))
    raise SystemExit(0)
if mode == "run-failing":  # the run must fail; report the steps that ran
    wf = capture_program(paths[0])[0]
    try:
        K.run_locally(wf, paths[1])
    except K.LocalRunError as exc:
        print(json.dumps({"error": str(exc), "ran": sorted([*exc.runs, *exc.failed]),
                          "failed": exc.failed}))
        raise SystemExit(0)
    raise SystemExit("the run succeeded")
out = {}
for path in paths:
    wf = capture_program(path)[0]
    try:
        out[path] = {"spec": K.compile_workflow(wf)}
    except UnsupportedFeatureError as exc:
        out[path] = {"step": exc.step, "feature": exc.feature, "message": str(exc)}
print(json.dumps(out))
'''

SUPPORTED = [
    "coin_flip", "concurrent", "dag_diamond", "dag_linear", "dag_linear_set_dependencies",
    "dag_conditional",
    "exit_handlers", "implicit_parameter_passing", "input_bare_string", "input_from_script",
    "input_two_calls", "input_two_params", "map_static", "map_upstream", "multiple_outputs",
    "producer_consumer", "resources", "when_else", "workflow_parameters",
]
UNSUPPORTED = {  # program → (step, feature)
    "concurrent_subtasks": ("concurrent-task", "inline sub-workflow"),
    "cron": ("", "cron schedule"),
    "job_apply": ("mnist", "job step (Kubernetes resource)"),
    "policies": ("train", "retry by failure class"),
    "secrets": ("first", "secret references"),
    "while_loop": ("flip-coin", "bounded loop"),
}


def kfp_python() -> str:
    if not KFP_PYTHON.exists():
        pytest.fail(f"{KFP_PYTHON} is missing: run scripts/setup-engine-venv.sh kfp "
                    "(kfp needs its own environment, it pins protobuf < 7)")
    return str(KFP_PYTHON)


def helper(tmp_path: Path, *args: str, timeout: float = 300) -> Any:
    script = tmp_path / "kfp_helper.py"
    script.write_text(HELPER)
    proc = subprocess.run([kfp_python(), str(script), *args], capture_output=True, text=True,
                          check=False,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    names = [*SUPPORTED, *UNSUPPORTED]
    assert sorted(names) == sorted(p.stem for p in GOLDEN.glob("*.py")), "new golden program"
    tmp = tmp_path_factory.mktemp("kfp")
    out = helper(tmp, "compile", *(str(GOLDEN / f"{n}.py") for n in names))
    return {Path(k).stem: v for k, v in out.items()}


def all_tasks(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every task of the pipeline (root DAG and nested condition / loop DAGs) by name."""
    tasks = dict(spec["root"]["dag"]["tasks"])
    for comp in spec["components"].values():
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    return tasks


@pytest.mark.parametrize("name", SUPPORTED)
def test_supported_program_compiles_to_pipeline_spec(name: str,
                                                     compiled: dict[str, Any]) -> None:
    from couler import ir
    from couler.api.capture import capture_program

    wf = capture_program(str(GOLDEN / f"{name}.py"))[0]
    result = compiled[name]
    assert "spec" in result, result
    spec = result["spec"]
    assert spec["pipelineInfo"]["name"] == wf.name
    assert spec["schemaVersion"] == "2.1.0"
    tasks = all_tasks(spec)
    for step in wf.steps:
        assert step.name in tasks, (step.name, sorted(tasks))
        task = tasks[step.name]
        assert task["taskInfo"]["name"] == step.name
        comp = spec["components"][task["componentRef"]["name"]]
        executor = spec["deploymentSpec"]["executors"][comp["executorLabel"]]["container"]
        assert isinstance(step.body, (ir.ContainerSpec, ir.ScriptSpec))
        assert executor["image"] == step.body.image
        assert set(comp.get("inputDefinitions", {}).get("parameters", {})) == {
            i.name.replace("-", "_") for i in step.inputs}
        assert set(comp.get("outputDefinitions", {}).get("parameters", {})) == {
            o.name.replace("-", "_") for o in step.outputs}
        if step.when is None and step.foreach is None:
            want = {d.step for d in step.dependencies}
            want |= {i.value.step for i in step.inputs if isinstance(i.value, ir.StepOutputRef)}
            assert set(task.get("dependentTasks", [])) == want, step.name
        cache = task.get("cachingOptions", {})
        assert not cache.get("enableCache", False)


def test_diamond_dependencies(compiled: dict[str, Any]) -> None:
    tasks = compiled["dag_diamond"]["spec"]["root"]["dag"]["tasks"]
    assert sorted(tasks) == ["a", "b", "c", "d"]
    assert "dependentTasks" not in tasks["a"]
    assert tasks["b"]["dependentTasks"] == ["a"]
    assert tasks["c"]["dependentTasks"] == ["a"]
    assert sorted(tasks["d"]["dependentTasks"]) == ["b", "c"]


def test_when_else_becomes_two_numeric_conditions(compiled: dict[str, Any]) -> None:
    spec = compiled["when_else"]["spec"]
    conds = {t["taskInfo"]["name"]: t["triggerPolicy"]["condition"]
             for comp in spec["components"].values()
             for t in comp.get("dag", {}).get("tasks", {}).values() if "triggerPolicy" in t}
    # each conditional step sits in a sub-pipeline whose input carries the upstream output
    assert conds["deploy-when"] == "inputs.parameter_values['pipelinechannel--couler_in_0'] > 0.9"
    assert conds["retrain-when"].endswith("<= 0.9")
    root = spec["root"]["dag"]["tasks"]
    assert sorted(root) == ["couler-deploy", "couler-retrain", "evaluate"]
    assert root["couler-deploy"]["inputs"]["parameters"]["couler_in_0"] == {
        "taskOutputParameter": {"outputParameterKey": "result", "producerTask": "evaluate"}}
    assert spec["components"]["comp-couler-deploy"]["inputDefinitions"]["parameters"][
        "couler_in_0"]["parameterType"] == "NUMBER_DOUBLE"
    # compared numerically: the stdout output is declared a float
    assert spec["components"]["comp-evaluate"]["outputDefinitions"]["parameters"]["result"][
        "parameterType"] == "NUMBER_DOUBLE"


def test_stdout_output_uses_sh_wrapper(compiled: dict[str, Any]) -> None:
    spec = compiled["input_from_script"]["spec"]
    gen = spec["deploymentSpec"]["executors"]["exec-generate"]["container"]
    assert gen["command"][:2] == ["/bin/sh", "-c"]
    assert "{{$.outputs.parameters['result'].output_file}}" in gen["args"]
    assert gen["args"][1:3] == ["python", "-c"]
    show2 = spec["root"]["dag"]["tasks"]["show-2"]["inputs"]["parameters"]["para_show_1"]
    assert show2["taskOutputParameter"] == {"outputParameterKey": "result",
                                           "producerTask": "generate"}


def test_map_static_and_upstream(compiled: dict[str, Any]) -> None:
    spec = compiled["map_static"]["spec"]
    loop = next(t for t in spec["root"]["dag"]["tasks"].values() if "parameterIterator" in t)
    assert loop["iteratorPolicy"]["parallelismLimit"] == 2
    items = json.loads(loop["parameterIterator"]["items"]["raw"])
    assert items[0] == {"k_0": "0.1", "k_1": "32"}
    spec = compiled["map_upstream"]["spec"]
    # the loop sits in a sub-pipeline whose list input is the upstream output
    sub = spec["root"]["dag"]["tasks"]["couler-process"]
    assert sub["dependentTasks"] == ["list-shards"]
    assert sub["inputs"]["parameters"]["couler_in_0"] == {
        "taskOutputParameter": {"outputParameterKey": "result", "producerTask": "list-shards"}}
    loop = spec["components"]["comp-couler-process"]["dag"]["tasks"]["for-loop-1"]
    assert loop["parameterIterator"]["items"] == {"inputParameter": "pipelinechannel--couler_in_0"}
    assert spec["components"]["comp-list-shards"]["outputDefinitions"]["parameters"][
        "result"]["parameterType"] == "LIST"


def test_workflow_parameters_and_resources(compiled: dict[str, Any]) -> None:
    spec = compiled["workflow_parameters"]["spec"]
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["epochs"]["parameterType"] == "NUMBER_INTEGER"
    assert params["epochs"]["defaultValue"] == 10
    assert params["dataset"]["defaultValue"] == "s3://data/train.csv"
    spec = compiled["resources"]["spec"]
    res = spec["deploymentSpec"]["executors"]["exec-train"]["container"]["resources"]
    assert res["resourceCpuLimit"] == "2" and res["resourceMemoryLimit"] == "4Gi"
    assert res["accelerator"]["resourceType"] == "nvidia.com/gpu"


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_program_names_step_and_feature(name: str,
                                                    compiled: dict[str, Any]) -> None:
    result = compiled[name]
    assert "spec" not in result
    step, feature = UNSUPPORTED[name]
    assert (result["step"], result["feature"]) == (step, feature)
    assert "engine 'kfp' does not support" in result["message"]


def test_a_dependency_the_user_never_wrote_is_said_where_it_came_from(tmp_path: Path) -> None:
    """A step written after a conditional step runs after it (steps run in sequence), and
    KFP cannot depend on a task that may not run: the refusal says where it came from."""
    program = tmp_path / "after_when.py"
    program.write_text(
        "import couler.argo as couler\n"
        "out = couler.run_script(image='python:3.12', source='print(1)', step_name='gate')\n"
        "couler.when(couler.equal(out, '1'), lambda: couler.run_container(\n"
        "    image='alpine', command=['true'], step_name='maybe'))\n"
        "couler.run_container(image='alpine', command=['true'], step_name='after')\n")
    result = helper(tmp_path, "compile", str(program))[str(program)]
    assert (result["step"], result["feature"]) == ("after", "dependency on a conditional step")
    assert "steps written one after another run in sequence" in result["message"]


def test_run_locally_script_stdout_feeds_next_step(tmp_path: Path) -> None:
    out = helper(tmp_path, "run", str(GOLDEN / "input_from_script.py"), str(tmp_path / "root"))
    runs = out["runs"]
    assert runs["show"] == ["got start\n"]
    (number,) = runs["generate"]
    assert 0 <= int(number) <= 100
    assert runs["show-2"] == [f"got {number.strip()}\n"]


def test_run_locally_diamond(tmp_path: Path) -> None:
    out = helper(tmp_path, "run", str(GOLDEN / "dag_diamond.py"), str(tmp_path / "root"))
    assert out["runs"] == {"a": ["a\n"], "b": ["b\n"], "c": ["c\n"], "d": ["d\n"]}


def test_run_locally_map_over_upstream_output(tmp_path: Path) -> None:
    out = helper(tmp_path, "run", str(GOLDEN / "map_upstream.py"), str(tmp_path / "root"))
    assert out["runs"]["process"] == ["a\n", "b\n", "c\n"]


def test_run_locally_numeric_condition_picks_one_branch(tmp_path: Path) -> None:
    out = helper(tmp_path, "run", str(GOLDEN / "when_else.py"), str(tmp_path / "root"))
    assert out["runs"] == {"evaluate": ["0.93\n"], "deploy": ["deploy\n"]}  # 0.93 > 0.9


def test_run_locally_file_outputs(tmp_path: Path) -> None:
    out = helper(tmp_path, "run", str(GOLDEN / "multiple_outputs.py"), str(tmp_path / "root"))
    assert out["runs"]["consumer"] == ["x y\n"]


def test_failed_hook_is_the_exit_task_reading_the_final_status(
        compiled: dict[str, Any]) -> None:
    spec = compiled["exit_handlers"]["spec"]
    root = spec["root"]["dag"]["tasks"]
    assert sorted(root) == ["exit-handler-1", "mourn"]
    mourn = root["mourn"]
    assert mourn["triggerPolicy"] == {"strategy": "ALL_UPSTREAM_TASKS_COMPLETED"}
    assert mourn["inputs"]["parameters"]["couler_status"] == {
        "taskFinalStatus": {"producerTask": "exit-handler-1"}}
    assert spec["components"]["comp-mourn"]["inputDefinitions"]["parameters"][
        "couler_status"]["parameterType"] == "TASK_FINAL_STATUS"
    # the succeeded hook runs inside the handler, after every workflow step
    inner = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert inner["celebrate"]["dependentTasks"] == ["hello"]


def _run_container(executor: dict[str, Any], values: dict[str, str]) -> str:
    """Run a compiled container executor's command on the host with /bin/sh."""
    words = [*executor["command"], *executor.get("args", [])]
    for placeholder, value in values.items():
        words = [w.replace(placeholder, value) for w in words]
    proc = subprocess.run(words, capture_output=True, text=True, check=True, timeout=30)
    return proc.stdout


@pytest.mark.parametrize(("status", "runs"), [
    ('{"state":"SUCCEEDED","pipelineTaskName":"exit-handler-1"}', False),
    ('{"error": {}, "state": "SUCCEEDED"}', False),  # protojson may add a space
    ('{"error":{"code":1},"state":"FAILED"}', True),
    ('{"state": "CANCELLED"}', True),
])
def test_failed_hook_command_runs_only_when_the_run_did_not_succeed(
        compiled: dict[str, Any], status: str, runs: bool) -> None:
    executor = compiled["exit_handlers"]["spec"]["deploymentSpec"]["executors"]["exec-mourn"]
    out = _run_container(executor["container"],
                         {"{{$.inputs.parameters['couler_status']}}": status})
    assert out == ("it failed\n" if runs else "")


def test_container_outputs_drop_trailing_newlines(tmp_path: Path) -> None:
    program = tmp_path / "outputs.py"
    file = str(tmp_path / "v.txt")
    script = f"printf 'v 1\\n\\n' > {file}; echo hi"
    program.write_text(
        "import couler.argo as couler\n"
        "couler.config_workflow(name='outputs')\n"
        f"out = couler.create_parameter_artifact(path={file!r}, name='v')\n"
        "couler.run_container(image='alpine:3.20', step_name='write', output=out,\n"
        f"                     command=['sh', '-c', {script!r}])\n")
    spec = helper(tmp_path, "compile", str(program))[str(program)]["spec"]
    executor = spec["deploymentSpec"]["executors"]["exec-write"]["container"]
    target = tmp_path / "out" / "v"
    out = _run_container(executor, {"{{$.outputs.parameters['v'].output_file}}": str(target)})
    assert out == "hi\n"  # the step's stdout still reaches the log
    assert target.read_text() == "v 1"


HOOKS = '''
import couler.argo as couler
from couler.argo import WFStatus

def step(name, script):
    return couler.run_container(image="alpine:3.20", command=["sh", "-c", script],
                                step_name=name)

couler.config_workflow(name="hooks")
step("work", "echo working; exit 3")
couler.set_exit_handler(WFStatus.Succeeded, lambda: step("celebrate", "echo yay"))
couler.set_exit_handler(WFStatus.Failed, lambda: step("mourn", "echo it failed"))
'''


def test_run_locally_failed_hook_runs_after_a_failure(tmp_path: Path) -> None:
    program = tmp_path / "hooks.py"
    program.write_text(HOOKS)
    out = helper(tmp_path, "run-failing", str(program), str(tmp_path / "root"))
    assert out["ran"] == ["mourn", "work"]
    assert "'work'" in out["error"] and out["failed"] == ["work"]


def test_two_status_dependent_hooks_are_rejected(tmp_path: Path) -> None:
    program = tmp_path / "two_hooks.py"
    program.write_text(HOOKS + "couler.set_exit_handler(WFStatus.Error, "
                               "lambda: step('page', 'echo page'))\n")
    result = helper(tmp_path, "compile", str(program))[str(program)]
    assert (result["step"], result["feature"]) == ("page", "exit hooks")
    assert "exit handlers do not nest" in result["message"]


REUSED = r'''
from couler import ir
from couler.optimize import CachedStep, optimize
from couler.optimize.cache_key import workflow_keys

def step(name, reads=None):
    return ir.Step(
        name=name, body=ir.ContainerSpec(image="alpine", command=("echo", name)),
        inputs=(ir.InputParameter("x", ir.StepOutputRef(reads, "out")),) if reads else (),
        dependencies=(ir.Dependency(reads),) if reads else (),
        outputs=(ir.OutputParameter("out", source=ir.OutputSource.STDOUT),))

wf = ir.Workflow(name="reused", steps=(step("prep"), step("train", "prep"),
                                       step("report", "train")))
hit = CachedStep(workflow_keys(wf)["train"], {"out": "31337"})
plan = optimize(wf, "kfp", lookup=lambda keys: {k: hit for k in keys if k == hit.key},
                substitute=True, retry=None)
print(plan.document)
print("=====")
print(optimize(wf, "kfp", retry=None).document)  # the same pipeline, nothing reused
'''


def test_a_resubmitted_pipeline_leaves_its_reused_steps_out(tmp_path: Path) -> None:
    """Issue 10, item 4, with the kfp compiler itself: the reused ``train`` and the ``prep``
    only it read are not in the PipelineSpec; ``report`` gets train's output as a value."""
    script = tmp_path / "reused.py"
    script.write_text(REUSED)
    proc = subprocess.run([kfp_python(), str(script)], capture_output=True, text=True,
                          check=False, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reused, whole = proc.stdout.split("=====")
    assert all(f"exec-{n}:" in whole for n in ("prep", "train", "report"))
    assert "exec-report:" in reused and "31337" in reused
    assert "exec-prep:" not in reused and "exec-train:" not in reused
