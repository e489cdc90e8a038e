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
    "coin_flip", "concurrent", "concurrent_subtasks", "dag_diamond", "dag_linear",
    "dag_linear_set_dependencies", "dag_conditional",
    "exit_handlers", "implicit_parameter_passing", "input_bare_string", "input_from_script",
    "input_two_calls", "input_two_params", "map_static", "map_upstream", "multiple_outputs",
    "policies", "producer_consumer", "resources", "secrets", "when_else", "workflow_parameters",
]
UNSUPPORTED = {  # program → (step, feature)
    "cron": ("", "cron schedule"),
    "job_apply": ("mnist", "job step (Kubernetes resource)"),
    "while_loop": ("flip-coin", "bounded loop"),
}


def kfp_python() -> str:
    if not KFP_PYTHON.exists():
        pytest.fail(f"{KFP_PYTHON} is missing: run scripts/setup-engine-venv.sh kfp "
                    "(kfp needs its own environment, it pins protobuf < 7)")
    return str(KFP_PYTHON)


def run_in_kfp(directory: Path, name: str, source: str, *args: str,
               timeout: float = 300) -> Any:
    """Run ``source`` as ``directory/name`` in .venv-kfp; the JSON its last line prints."""
    script = directory / name
    script.write_text(source)
    proc = subprocess.run([kfp_python(), str(script), *args], capture_output=True, text=True,
                          check=False, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def helper(tmp_path: Path, *args: str, timeout: float = 300) -> Any:
    return run_in_kfp(tmp_path, "kfp_helper.py", HELPER, *args, timeout=timeout)


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
        if isinstance(step.body, ir.SubWorkflowSpec):  # a nested pipeline of its steps
            assert sorted(comp["dag"]["tasks"]) == sorted(s.name for s in step.body.steps)
            assert set(task.get("dependentTasks", [])) == {d.step for d in step.dependencies}
            continue
        executor = spec["deploymentSpec"]["executors"][comp["executorLabel"]]["container"]
        assert isinstance(step.body, (ir.ContainerSpec, ir.ScriptSpec))
        assert executor["image"] == step.body.image
        # a step escalating memory on OOM is its first rung (test_kfp_memory.py)
        ladder = step.retry is not None and step.retry.memory_factor is not None
        assert set(comp.get("inputDefinitions", {}).get("parameters", {})) == {
            i.name.replace("-", "_") for i in step.inputs} | (
            {"couler_attempts_before"} if ladder else set())
        assert set(comp.get("outputDefinitions", {}).get("parameters", {})) == {
            o.name.replace("-", "_") for o in step.outputs} | (
            {"couler_class", "couler_attempts"} if ladder else set())
        if step.when is None and step.foreach is None:
            want = {d.step for d in step.dependencies}
            want |= {i.value.step for i in step.inputs if isinstance(i.value, ir.StepOutputRef)}
            assert set(task.get("dependentTasks", [])) == want, step.name
        cache = task.get("cachingOptions", {})  # KFP caches unless told; Couler does not
        assert cache.get("enableCache", False) == bool(step.cache and step.cache.enabled)


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


def test_a_step_after_a_conditional_step_follows_its_sub_pipeline(tmp_path: Path) -> None:
    """A step written after a conditional step runs after it, skipped or not (rule S1): the
    conditional step sits in a sub-pipeline, which KFP lets a task outside depend on."""
    program = tmp_path / "after_when.py"
    program.write_text(
        "import couler.argo as couler\n"
        "out = couler.run_script(image='python:3.12', source='print(1)', step_name='gate')\n"
        "couler.when(couler.equal(out, '1'), lambda: couler.run_container(\n"
        "    image='alpine', command=['true'], step_name='maybe'))\n"
        "couler.run_container(image='alpine', command=['true'], step_name='after')\n")
    spec = helper(tmp_path, "compile", str(program))[str(program)]["spec"]
    root = spec["root"]["dag"]["tasks"]
    assert sorted(root) == ["after", "couler-maybe", "gate"]
    assert root["after"]["dependentTasks"] == ["couler-maybe"]
    inner = spec["components"]["comp-couler-maybe"]["dag"]["tasks"]
    assert inner["condition-1"]["triggerPolicy"]["condition"] == (
        "inputs.parameter_values['pipelinechannel--couler_in_0'] == '1'")


def test_reading_a_conditional_steps_output_is_refused(tmp_path: Path) -> None:
    program = tmp_path / "read_when.py"
    program.write_text(
        "import couler.argo as couler\n"
        "out = couler.run_script(image='python:3.12', source='print(1)', step_name='gate')\n"
        "got = couler.when(couler.equal(out, '1'), lambda: couler.run_script(\n"
        "    image='python:3.12', source='print(2)', step_name='maybe'))\n"
        "couler.run_container(image='alpine', command=['echo', got], step_name='after')\n")
    result = helper(tmp_path, "compile", str(program))[str(program)]
    assert (result["step"], result["feature"]) == ("after", "reading a conditional step's output")
    assert "dsl.OneOf is not mapped" in result["message"]


def test_succeeded_only_edge_from_a_conditional_step_guards_its_branch(tmp_path: Path) -> None:
    """strict_succeeded: audit (ship.Succeeded) and archive (after audit) run under ship's
    condition, notify (a bare edge) after ship whatever it did."""
    program = ROOT / "tests" / "conformance" / "programs" / "strict_succeeded.py"
    script = tmp_path / "strict.py"
    script.write_text(
        "import json, sys\nfrom pathlib import Path\nsys.path.insert(0, '.')\n"
        "from tests.conformance.loader import load_program\n"
        "from couler.compilers import kfp as K\n"
        f"print(json.dumps(K.compile_workflow(load_program(Path({str(program)!r})))))\n")
    proc = subprocess.run([kfp_python(), str(script)], capture_output=True, text=True,
                          check=False, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    spec = json.loads(proc.stdout.strip().splitlines()[-1])
    root = spec["root"]["dag"]["tasks"]
    assert root["notify"]["dependentTasks"] == ["couler-ship"]
    assert sorted(root["couler-audit"]["dependentTasks"]) == ["check", "couler-ship"]
    assert sorted(root["couler-archive"]["dependentTasks"]) == ["check", "couler-audit"]
    for name in ("audit", "archive"):  # each reads check's output to test ship's condition
        assert root[f"couler-{name}"]["inputs"]["parameters"]["couler_in_0"] == {
            "taskOutputParameter": {"outputParameterKey": "out", "producerTask": "check"}}
        inner = spec["components"][f"comp-couler-{name}"]["dag"]["tasks"]
        (cond,) = [t for t in inner.values() if "triggerPolicy" in t]
        assert cond["triggerPolicy"]["condition"] == (
            "inputs.parameter_values['pipelinechannel--couler_in_0'] == 'yes'")


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


def test_secret_references_become_secret_env_vars(compiled: dict[str, Any]) -> None:
    """Both steps read the created secret's keys as env vars (kfp-kubernetes secretAsEnv)."""
    from couler.api.capture import capture_program

    wf = capture_program(str(GOLDEN / "secrets.py"))[0]
    executors = compiled["secrets"]["spec"]["platforms"]["kubernetes"]["deploymentSpec"][
        "executors"]
    assert sorted(executors) == ["exec-first", "exec-second"]
    for step in wf.steps:
        (entry,) = executors[f"exec-{step.name}"]["secretAsEnv"]
        refs = [e.secret for e in step.env if e.secret is not None]
        assert {r.name for r in refs} == {entry["secretName"]}
        assert sorted((k["secretKey"], k["envVar"]) for k in entry["keyToEnv"]) == sorted(
            (r.key, e.name) for e in step.env for r in [e.secret] if r is not None)
        assert entry["optional"] is False  # a missing secret fails the pod, as on Argo


# Kubernetes settings through kfp-kubernetes: every volume kind, node selectors and
# tolerations (the step's replace the workflow's), timeouts, labels, pull policy, security
# context; then what the extension cannot say.
PLATFORM = r"""
import json, sys
from couler import ir
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError

def step(name, mounts=(), **kw):
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", command=("true",),
                                                    image_pull_policy=kw.pop("pull", "")),
                   volume_mounts=tuple(ir.VolumeMount(*m) for m in mounts), **kw)

V = ir.VolumeKind
volumes = (ir.Volume("data", V.PVC, claim_name="shared-data"),
           ir.Volume("work", V.CLAIM_TEMPLATE, size="2Gi", access_modes=("ReadWriteMany",),
                     storage_class="fast"),
           ir.Volume("scratch", V.EMPTY_DIR),
           ir.Volume("conf", V.CONFIG_MAP, claim_name="app-config"),
           ir.Volume("keys", V.SECRET, claim_name="tls-keys"))
tol = ir.Toleration(key="gpu", operator="Exists", effect="NoSchedule")
wf = ir.Workflow(
    name="platform", volumes=volumes, node_selector=(("pool", "cpu"),), tolerations=(tol,),
    image_pull_secrets=("regcred",), security_context=ir.SecurityContext(run_as_user=1000),
    defaults=ir.StepDefaults(timeout_seconds=300),
    steps=(step("write", [("data", "/data", False, "sub"), ("work", "/work")],
                labels=(("team", "ml"),), pull="Always"),
           step("read", [("work", "/work"), ("scratch", "/tmp/s"), ("conf", "/etc/app"),
                         ("keys", "/etc/keys")],
                dependencies=(ir.Dependency("write"),), node_selector=(("pool", "gpu"),),
                timeout_seconds=60)))
out = {"spec": K.compile_workflow(wf)}
# what kfp.Client sends: both halves parse into kfp's protos, executor configs strictly
from google.protobuf import json_format
from kfp.kubernetes import kubernetes_executor_config_pb2 as kpb
from kfp.pipeline_spec import pipeline_spec_pb2 as pb
spec, platform = K.split_platform_spec(out["spec"])
assert "platforms" not in spec and list(platform) == ["platforms"]
json_format.ParseDict(spec, pb.PipelineSpec())
json_format.ParseDict(platform, pb.PlatformSpec())
for cfg in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values():
    json_format.ParseDict(cfg, kpb.KubernetesExecutorConfig())
refusals = {}
for name, bad in {
    "read-only pvc": ir.Workflow(name="ro", volumes=volumes[:1],
                                 steps=(step("a", [("data", "/d", True)]),)),
    "claim in exit hook": ir.Workflow(
        name="hook", volumes=volumes[1:2], steps=(step("a"),),
        exit_hooks=(ir.ExitHook(ir.RunStatus.ANY, (step("h", [("work", "/w")]),)),)),
    "fs group": ir.Workflow(name="fsg", steps=(step("a"),),
                            security_context=ir.SecurityContext(fs_group=1)),
}.items():
    try:
        K.compile_workflow(bad)
        refusals[name] = None
    except UnsupportedFeatureError as exc:
        refusals[name] = [exc.step, exc.feature, str(exc)]
out["refusals"] = refusals
print(json.dumps(out))
"""


def test_kubernetes_settings_reach_the_platform_spec(tmp_path: Path) -> None:
    # not platform.py: it would shadow the stdlib
    out = run_in_kfp(tmp_path, "kfp_platform_check.py", PLATFORM)
    spec = out["spec"]
    tasks = spec["root"]["dag"]["tasks"]
    assert sorted(tasks) == ["createpvc", "deletepvc", "read", "write"]
    # the claim template: made before its users, deleted after them
    assert tasks["write"]["dependentTasks"] == ["createpvc"]
    assert sorted(tasks["read"]["dependentTasks"]) == ["createpvc", "write"]
    assert sorted(tasks["deletepvc"]["dependentTasks"]) == ["createpvc", "read", "write"]
    create = tasks["createpvc"]["inputs"]["parameters"]
    assert create["size"]["runtimeValue"]["constant"] == "2Gi"
    assert create["access_modes"]["runtimeValue"]["constant"] == ["ReadWriteMany"]
    assert create["storage_class_name"]["runtimeValue"]["constant"] == "fast"
    assert create["pvc_name_suffix"]["runtimeValue"]["constant"] == "-work"
    k8s = spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    write, read = k8s["exec-write"], k8s["exec-read"]
    claim = {"taskOutputParameter": {"outputParameterKey": "name", "producerTask": "createpvc"}}
    assert [(m["mountPath"], m.get("subPath", "")) for m in write["pvcMount"]] == [
        ("/data", "sub"), ("/work", "")]
    assert write["pvcMount"][0]["pvcNameParameter"]["runtimeValue"]["constant"] == "shared-data"
    assert write["pvcMount"][1]["pvcNameParameter"] == claim
    assert read["pvcMount"][0]["pvcNameParameter"] == claim
    assert read["emptyDirMounts"] == [{"volumeName": "scratch", "mountPath": "/tmp/s"}]
    assert read["configMapAsVolume"][0]["configMapName"] == "app-config"
    assert read["configMapAsVolume"][0]["mountPath"] == "/etc/app"
    assert read["secretAsVolume"][0]["secretName"] == "tls-keys"
    # the step's node selector replaces the workflow's; tolerations come from the workflow
    assert write["nodeSelector"] == {"labels": {"pool": "cpu"}}
    assert read["nodeSelector"] == {"labels": {"pool": "gpu"}}
    assert write["tolerations"] == read["tolerations"] == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # the step's timeout, else the default one
    assert (write["activeDeadlineSeconds"], read["activeDeadlineSeconds"]) == ("300", "60")
    assert write["podMetadata"]["labels"] == {"team": "ml"}
    assert write["imagePullPolicy"] == "Always" and "imagePullPolicy" not in read
    assert [p["secretName"] for p in write["imagePullSecret"]] == ["regcred"]
    assert read["imagePullSecret"] == write["imagePullSecret"]
    assert write["securityContext"] == {"runAsUser": "1000"}
    refusals = out["refusals"]
    assert refusals["read-only pvc"][:2] == ["a", "volumes"]
    assert "readOnly" in refusals["read-only pvc"][2]
    assert refusals["claim in exit hook"][:2] == ["h", "volumes"]
    assert refusals["fs group"][:2] == ["", "security context"]


# Edge conditions: a handler on one failed / completed / any edge, then what KFP cannot say.
EDGES = r"""
import json
from couler import ir
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError

F = ir.EdgeCondition
def step(name, *deps, **kw):
    out = (ir.OutputParameter("out", ir.OutputSource.STDOUT),)
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", command=("echo", name)),
                   dependencies=tuple(ir.Dependency(*d) for d in deps), outputs=out, **kw)

wf = ir.Workflow(name="edges", steps=(
    step("train"), step("on-fail", ("train", F.FAILED)), step("done", ("train", F.COMPLETED)),
    step("always", ("train", F.ANY))))
out = {"spec": K.compile_workflow(wf), "refusals": {}}
for name, steps in {
    "dependent": (step("a"), step("h", ("a", F.FAILED)), step("after", ("h",))),
    "two edges": (step("a"), step("b"), step("h", ("a", F.FAILED), ("b",))),
    "errored": (step("a"), step("h", ("a", F.ERRORED))),
    "succeeded hook": (step("a"), step("h", ("a", F.ANY))),
    "mapped upstream": (step("a", foreach=ir.ForEach(items=(ir.Literal.of(1),))),
                        step("h", ("a", F.COMPLETED))),
    "depends": (step("a"), step("b"), step("h", ("a",), ("b",), depends=ir.DependsAny((
        ir.DependsTerm("a"), ir.DependsNot(ir.DependsTerm("b", F.FAILED)))))),
}.items():
    hooks = (ir.ExitHook(ir.RunStatus.SUCCEEDED, (step("yay"),)),) if "hook" in name else ()
    try:
        K.compile_workflow(ir.Workflow(name="bad", steps=steps, exit_hooks=hooks))
        out["refusals"][name] = None
    except UnsupportedFeatureError as exc:
        out["refusals"][name] = [exc.step, exc.feature, str(exc)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out: dict[str, Any] = run_in_kfp(tmp_path_factory.mktemp("edges"), "kfp_edges_check.py",
                                     EDGES)
    return out


def test_edge_handlers_ignore_upstream_failure(edges: dict[str, Any]) -> None:
    tasks = edges["spec"]["root"]["dag"]["tasks"]
    for name in ("on-fail", "done", "always"):
        assert tasks[name]["dependentTasks"] == ["train"]
        assert tasks[name]["triggerPolicy"] == {"strategy": "ALL_UPSTREAM_TASKS_COMPLETED"}
    for name in ("on-fail", "done"):  # they read train's final status
        assert tasks[name]["inputs"]["parameters"]["couler_status"] == {
            "taskFinalStatus": {"producerTask": "train"}}
    assert "couler_status" not in tasks["always"].get("inputs", {}).get("parameters", {})
    assert "triggerPolicy" not in tasks["train"]


@pytest.mark.parametrize(("handler", "state", "runs"), [
    ("on-fail", "FAILED", True), ("on-fail", "SUCCEEDED", False),
    ("on-fail", "CANCELLED", False),
    ("done", "SUCCEEDED", True), ("done", "FAILED", True), ("done", "CANCELLED", False),
])
def test_edge_handler_runs_its_command_only_on_the_edge_states(
        edges: dict[str, Any], tmp_path: Path, handler: str, state: str, runs: bool) -> None:
    executor = edges["spec"]["deploymentSpec"]["executors"][f"exec-{handler}"]["container"]
    target = tmp_path / "out"
    status = json.dumps({"state": state, "pipelineTaskName": "train"})
    out = _run_container(executor, {
        "{{$.inputs.parameters['couler_status']}}": status,
        "{{$.outputs.parameters['out'].output_file}}": str(target)})
    assert out == (f"{handler}\n" if runs else "")
    assert target.read_text() == (handler if runs else "")  # empty outputs when skipped


@pytest.mark.parametrize(("case", "step", "feature", "reason"), [
    ("dependent", "h", "edge conditions (failed / any)", "'after' depends on it"),
    ("two edges", "h", "edge conditions (failed / any)", "more than one edge"),
    ("errored", "h", "edge conditions (failed / any)", "platform error"),
    ("succeeded hook", "h", "edge conditions (failed / any)", "a succeeded exit hook"),
    ("mapped upstream", "h", "edge conditions (failed / any)", "conditional or mapped"),
    ("depends", "h", "depends expression (and / or / not)", "one upstream task only"),
])
def test_edges_kfp_cannot_express_are_refused_with_the_reason(
        edges: dict[str, Any], case: str, step: str, feature: str, reason: str) -> None:
    refusal = edges["refusals"][case]
    assert refusal is not None, case
    assert refusal[:2] == [step, feature]
    assert reason in refusal[2]


ARTIFACTS = r"""
import json, sys
from couler import ir
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError

tmp = sys.argv[1]
def sh(name, script, **kw):
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", command=("sh", "-c", script)),
                   **kw)
producer = sh("producer", f"mkdir -p {tmp}/p/model && echo w1 > {tmp}/p/model/weights && "
                          f"echo payload > {tmp}/p/report.txt",
              output_artifacts=(ir.OutputArtifact("report", f"{tmp}/p/report.txt"),
                                ir.OutputArtifact("model", f"{tmp}/p/model")))
consumer = sh("consumer", f"cat {tmp}/c/in.txt {tmp}/c/model/weights",
              input_artifacts=(ir.InputArtifact("report", f"{tmp}/c/in.txt",
                                                ir.StepArtifactRef("producer", "report")),
                               ir.InputArtifact("model", f"{tmp}/c/model",
                                                ir.StepArtifactRef("producer", "model"))),
              dependencies=(ir.Dependency("producer"),))
out = {"spec": K.compile_workflow(ir.Workflow(name="arts", steps=(producer, consumer))),
       "refusals": {}}
s3 = ir.ArtifactLocation(storage=ir.StorageKind.S3, bucket="b", key="k")
for name, steps in {
    "location": (sh("a", "true", output_artifacts=(ir.OutputArtifact("x", "/x", s3),)),),
    "from storage": (sh("a", "true", input_artifacts=(ir.InputArtifact("x", "/x", s3),)),),
}.items():
    hooks = (ir.ExitHook(ir.RunStatus.SUCCEEDED, (step("yay"),)),) if "hook" in name else ()
    try:
        K.compile_workflow(ir.Workflow(name="bad", steps=steps, exit_hooks=hooks))
        out["refusals"][name] = None
    except UnsupportedFeatureError as exc:
        out["refusals"][name] = [exc.step, exc.feature, str(exc)]
print(json.dumps(out))
"""


def test_artifacts_are_kfp_artifacts_copied_in_and_out(tmp_path: Path) -> None:
    out = run_in_kfp(tmp_path, "kfp_artifacts_check.py", ARTIFACTS, str(tmp_path))
    spec = out["spec"]
    outs = spec["components"]["comp-producer"]["outputDefinitions"]["artifacts"]
    assert {n: a["artifactType"]["schemaTitle"] for n, a in outs.items()} == {
        "report": "system.Artifact", "model": "system.Artifact"}
    consumer = spec["root"]["dag"]["tasks"]["consumer"]
    assert consumer["inputs"]["artifacts"]["model"] == {
        "taskOutputArtifact": {"outputArtifactKey": "model", "producerTask": "producer"}}
    execs = spec["deploymentSpec"]["executors"]
    store = tmp_path / "store"
    _run_container(execs["exec-producer"]["container"], {
        "{{$.outputs.artifacts['report'].path}}": str(store / "report"),
        "{{$.outputs.artifacts['model'].path}}": str(store / "model")})
    assert (store / "report").read_text() == "payload\n"
    assert (store / "model" / "weights").read_text() == "w1\n"  # a directory artifact
    shown = _run_container(execs["exec-consumer"]["container"], {
        "{{$.inputs.artifacts['report'].path}}": str(store / "report"),
        "{{$.inputs.artifacts['model'].path}}": str(store / "model")})
    assert shown == "payload\nw1\n"
    (tmp_path / "p" / "report.txt").unlink()  # a missing output artifact fails the step
    words = [w.replace("echo payload > ", "true ") for w in
             [*execs["exec-producer"]["container"]["command"],
              *execs["exec-producer"]["container"]["args"]]]
    words = [w.replace("{{$.outputs.artifacts['report'].path}}", str(tmp_path / "r2"))
             .replace("{{$.outputs.artifacts['model'].path}}", str(tmp_path / "m2"))
             for w in words]
    failed = subprocess.run(words, capture_output=True, text=True, check=False, timeout=30)
    assert failed.returncode != 0 and "is missing" in failed.stderr
    refusals = out["refusals"]
    assert refusals["location"][:2] == ["a", "artifacts"]
    assert "pipeline root" in refusals["location"][2]
    assert refusals["from storage"][:2] == ["a", "artifacts"]


SUB_ARTIFACT = r"""
import json, os, sys
from couler import ir
from couler.compilers import kfp as K

tmp = sys.argv[1]
def sh(name, script, **kw):
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", command=("sh", "-c", script)),
                   **kw)
flag = ir.Condition(ir.StepOutputRef("producer", "flag"), ir.CompareOp.EQ, ir.Literal.of("yes"))
wf = ir.Workflow(name="subart", steps=(
    sh("producer", f"echo payload > {tmp}/r.txt; echo yes",
       outputs=(ir.OutputParameter("flag", ir.OutputSource.STDOUT),),
       output_artifacts=(ir.OutputArtifact("report", f"{tmp}/r.txt"),)),
    sh("consumer", f"cat {tmp}/in.txt", dependencies=(ir.Dependency("producer"),),
       input_artifacts=(ir.InputArtifact("report", f"{tmp}/in.txt",
                                         ir.StepArtifactRef("producer", "report")),),
       when=ir.When(flag))))
spec = K.compile_workflow(wf)
os.chdir(tmp)
print(json.dumps({"inputs": spec["root"]["dag"]["tasks"]["couler-consumer"]["inputs"],
                  "runs": K.run_locally(wf, f"{tmp}/root")}))
"""


def test_an_artifact_reaches_a_step_in_a_sub_pipeline(tmp_path: Path) -> None:
    """A conditional reader gets the artifact as an input of its sub-pipeline; on kfp.local
    the producer's file is moved into the artifact, so the reader sees it only through KFP."""
    out = run_in_kfp(tmp_path, "kfp_sub_artifact.py", SUB_ARTIFACT, str(tmp_path))
    (art,) = out["inputs"]["artifacts"].values()
    assert art == {"taskOutputArtifact": {"outputArtifactKey": "report",
                                          "producerTask": "producer"}}
    assert out["runs"] == {"producer": ["yes\n"], "consumer": ["payload\n"]}
    assert not (tmp_path / "r.txt").exists()  # moved into the artifact store


GROUPS = r"""
import json
from couler import ir
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError

def step(name, **kw):
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", command=("echo", name)), **kw)
inner = ir.SubWorkflowSpec(name="grp", steps=(step("a"),
                                              step("b", dependencies=(ir.Dependency("a"),))))
out = {}
for name, group in {"ok": step("grp"), "retry": step("grp", retry=ir.RetryPolicy(limit=2))}.items():
    wf = ir.Workflow(name="groups", steps=(ir.Step(name="grp", body=inner, retry=group.retry),
                                           step("after", dependencies=(ir.Dependency("grp"),))))
    try:
        out[name] = {"spec": K.compile_workflow(wf)}
    except UnsupportedFeatureError as exc:
        out[name] = {"refused": [exc.step, exc.feature, str(exc)]}
print(json.dumps(out))
"""


def test_an_inline_sub_workflow_is_a_nested_pipeline(tmp_path: Path) -> None:
    out = run_in_kfp(tmp_path, "kfp_groups_check.py", GROUPS)
    spec = out["ok"]["spec"]
    root = spec["root"]["dag"]["tasks"]
    assert root["after"]["dependentTasks"] == ["grp"]
    inner = spec["components"][root["grp"]["componentRef"]["name"]]["dag"]["tasks"]
    assert sorted(inner) == ["a", "b"] and inner["b"]["dependentTasks"] == ["a"]
    refused = out["retry"]["refused"]
    assert refused[:2] == ["grp", "inline sub-workflow"]
    assert "no group-level retry" in refused[2]


LOOP = r"""
import json, os, sys
from couler import ir
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError

tmp = sys.argv[1]
count = f"{tmp}/count"
# says "again" on its first two runs, then "done"
source = (f"import pathlib\np = pathlib.Path({count!r})\nn = int(p.read_text()) if p.exists() "
          "else 0\np.write_text(str(n + 1))\nprint('again' if n < 2 else 'done')\n")
again = ir.Condition(ir.StepOutputRef("poll", "result"), ir.CompareOp.EQ, ir.Literal.of("again"))
poll = ir.Step(name="poll", body=ir.ScriptSpec(image="python:3.12", source=source),
               outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
               loop=ir.Loop(again, max_iterations=5))
after = ir.Step(name="after", body=ir.ContainerSpec(image="alpine", command=("echo", "after")),
                dependencies=(ir.Dependency("poll"),))
wf = ir.Workflow(name="loop", steps=(poll, after))
spec = K.compile_workflow(wf)
os.chdir(tmp)
out = {"spec": spec, "runs": K.run_locally(wf, f"{tmp}/root")}
reader = ir.Step(name="reader",
                 body=ir.ContainerSpec(image="alpine", command=("echo", "{{inputs.x}}")),
                 inputs=(ir.InputParameter("x", ir.StepOutputRef("poll", "result")),),
                 dependencies=(ir.Dependency("poll"),))
try:
    K.compile_workflow(ir.Workflow(name="loop", steps=(poll, reader)))
    out["refused"] = None
except UnsupportedFeatureError as exc:
    out["refused"] = [exc.step, exc.feature, str(exc)]
print(json.dumps(out))
"""


def test_a_bounded_loop_is_unrolled_into_guarded_nested_pipelines(tmp_path: Path) -> None:
    out = run_in_kfp(tmp_path, "kfp_loop_check.py", LOOP, str(tmp_path), timeout=600)
    spec = out["spec"]
    root = spec["root"]["dag"]["tasks"]
    assert root["after"]["dependentTasks"] == ["couler-poll-iter2"]  # after the last
    assert root["couler-poll-iter2"]["inputs"]["parameters"]["couler_prev_0"] == {
        "taskOutputParameter": {"outputParameterKey": "result", "producerTask": "poll"}}
    nested = [n for n in spec["components"] if n.startswith("comp-couler-poll-iter")]
    assert len(nested) == 4  # iterations 2..5
    # three runs: again, again, done; the loop stops there, then `after` runs
    assert out["runs"] == {"poll": ["again\n", "again\n", "done\n"], "after": ["after\n"]}
    refused = out["refused"]
    assert refused[:2] == ["reader", "bounded loop"]
    assert "last executed iteration" in refused[2]
