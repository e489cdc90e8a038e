"""Generated Airflow DAG files, loaded and run by a real Apache Airflow 3.x.

Airflow conflicts with the main environment, so it lives in ``.venv-airflow``
(``scripts/setup-engine-venv.sh airflow``, run by ``scripts/test.sh``); these
tests call its Python and ``airflow`` CLI in subprocesses with ``AIRFLOW_HOME``
in a temporary directory. The metadata DB is migrated once per module.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from couler import ir
from couler.api.capture import capture_program
from couler.compilers import airflow
from couler.engines.base import Support, features_used
from couler.errors import UnsupportedFeatureError

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-airflow"
PYTHON = VENV / "bin" / "python"
AIRFLOW = VENV / "bin" / "airflow"
PROGRAMS = sorted((ROOT / "tests" / "golden" / "programs").glob("*.py"))

S = ir.Step
L = ir.Literal.of

# Loads every *.py file of a folder with Airflow's own DagBag, one bag per file.
DAGBAG_SCRIPT = """
import json, sys
from pathlib import Path
from airflow.dag_processing.dagbag import DagBag

result = {}
for f in sorted(Path(sys.argv[1]).glob("*.py")):
    bag = DagBag(dag_folder=str(f))
    result[f.stem] = {
        "errors": {str(k): str(v) for k, v in bag.import_errors.items()},
        "dags": {
            dag_id: {
                t.task_id: {"upstream": sorted(t.upstream_task_ids),
                            "trigger_rule": getattr(t.trigger_rule, "value", str(t.trigger_rule))}
                for t in dag.tasks
            }
            for dag_id, dag in bag.dags.items()
        },
    }
print("COULER-JSON " + json.dumps(result))
"""


def _require_venv() -> None:
    if not (PYTHON.exists() and AIRFLOW.exists()):
        pytest.fail(f"{VENV.name} is missing: run scripts/setup-engine-venv.sh airflow",
                    pytrace=False)


@dataclass(frozen=True)
class AirflowEnv:
    home: Path
    dags: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, env=self.env, cwd=self.home, text=True, timeout=timeout,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)


def _env(home: Path, dags: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(dags))
    return env


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> AirflowEnv:
    """An AIRFLOW_HOME with a migrated SQLite metadata DB (once per module)."""
    _require_venv()
    home = tmp_path_factory.mktemp("airflow-home")
    dags = home / "dags"
    dags.mkdir()
    env = AirflowEnv(home, dags, _env(home, dags))
    proc = env.run(str(AIRFLOW), "db", "migrate")
    assert proc.returncode == 0, proc.stdout[-4000:]
    return env


def run_dag(env: AirflowEnv, wf: ir.Workflow) -> subprocess.CompletedProcess[str]:
    """Write the compiled DAG into the dags folder and run it with ``airflow dags test``."""
    (env.dags / f"{wf.name.replace('-', '_')}.py").write_text(
        airflow.compile_workflow(wf), encoding="utf-8")
    return env.run(str(AIRFLOW), "dags", "test", wf.name)


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout[-6000:]


# --------------------------------------------------------------------------- DagBag


def _unsupported(wf: ir.Workflow) -> tuple[str, str] | None:
    for feature, steps in features_used(wf).items():
        cap = airflow.CAPABILITIES.get(feature)
        if cap is None or cap.support is Support.UNSUPPORTED:
            return feature.value, steps[0]
    return None


def _expected_tasks(wf: ir.Workflow) -> set[str]:
    ids: set[str] = set()

    def walk(steps: tuple[ir.Step, ...], prefix: str) -> None:
        for s in steps:
            if isinstance(s.body, ir.SubWorkflowSpec):
                walk(s.body.steps, f"{prefix}{s.name}.")
                continue
            ids.add(prefix + s.name)
            if s.foreach is not None and s.foreach.source is not None:
                ids.add(prefix + s.name + airflow.ITEMS_SUFFIX)

    walk(wf.steps, "")
    hooks = {s.name for h in wf.exit_hooks for s in h.steps}
    return ids | hooks | ({airflow.EXIT_STATUS_TASK} if hooks else set())


def test_golden_programs_load_in_dagbag(tmp_path: Path) -> None:
    _require_venv()
    folder = tmp_path / "dags"
    folder.mkdir()
    expected: dict[str, tuple[str, set[str]]] = {}
    rejected = []
    for program in PROGRAMS:
        (wf,) = capture_program(str(program))
        unsupported = _unsupported(wf)
        if unsupported is not None:
            feature, step = unsupported
            with pytest.raises(UnsupportedFeatureError) as err:
                airflow.compile_workflow(wf)
            assert feature in str(err.value) and repr(step) in str(err.value)
            rejected.append(program.stem)
            continue
        (folder / f"{program.stem}.py").write_text(airflow.compile_workflow(wf),
                                                     encoding="utf-8")
        expected[program.stem] = (wf.name, _expected_tasks(wf))
    assert len(expected) >= 20 and rejected == []

    env = _env(tmp_path / "home", folder)
    proc = subprocess.run([str(PYTHON), "-c", DAGBAG_SCRIPT, str(folder)], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
                          check=False)
    assert proc.returncode == 0, _tail(proc)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("COULER-JSON "))
    loaded: dict[str, Any] = json.loads(line.removeprefix("COULER-JSON "))
    assert set(loaded) == set(expected)
    for stem, (dag_id, task_ids) in expected.items():
        assert loaded[stem]["errors"] == {}, stem
        assert list(loaded[stem]["dags"]) == [dag_id], stem
        assert set(loaded[stem]["dags"][dag_id]) == task_ids, stem

    diamond = loaded["dag_diamond"]["dags"]["dag-diamond"]
    assert diamond["d"] == {"upstream": ["b", "c"], "trigger_rule": "none_failed"}
    assert diamond["a"]["upstream"] == []
    hooks = loaded["exit_handlers"]["dags"]["exit-handlers"]
    # hooks wait for every task; the runner checks the run's status (rule S7)
    assert hooks["celebrate"] == {"upstream": ["hello"], "trigger_rule": "all_done"}
    assert hooks["mourn"] == {"upstream": ["hello"], "trigger_rule": "all_done"}
    mapped = loaded["map_upstream"]["dags"]["map-upstream"]
    assert mapped["process"]["upstream"] == ["list-shards", "process--items"]
    group = loaded["concurrent_subtasks"]["dags"]["concurrent-subtasks"]
    assert group["concurrent-task.one-a"]["upstream"] == ["first"]
    assert group["last"]["upstream"] == ["concurrent-task-2.two-b", "concurrent-task.one-b"]


# --------------------------------------------------------------------------- end to end


def _sh(script: str, *args: str) -> ir.ContainerSpec:
    return ir.ContainerSpec("alpine:3.20", ("sh", "-c", script, "sh"), args)


def test_diamond_runs_in_dependency_order(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    log = tmp_path / "order.txt"

    def job(name: str, *deps: str) -> ir.Step:
        return S(name, _sh(f'echo {name} >> "$1"', str(log)),
                 dependencies=tuple(ir.Dependency(d) for d in deps))

    wf = ir.Workflow("couler-e2e-diamond", (job("a"), job("b", "a"), job("c", "a"),
                                            job("d", "b", "c")))
    proc = run_dag(airflow_env, wf)
    assert proc.returncode == 0, _tail(proc)
    order = log.read_text().split()
    assert order[0] == "a" and order[-1] == "d" and sorted(order[1:3]) == ["b", "c"]
    assert "state=success" in proc.stdout


def test_producer_passes_values_to_consumer(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    value_file, out = tmp_path / "value.txt", tmp_path / "consumer.txt"
    producer = S(
        "producer",
        ir.ScriptSpec("python:3.12", f"open({str(value_file)!r}, 'w').write('hello world')\n"
                                     "print(6 * 7)\n"),
        outputs=(ir.OutputParameter("file", selector=str(value_file)),
                 ir.OutputParameter("result", ir.OutputSource.STDOUT)))
    consumer = S(
        "consumer", _sh('printf "%s|%s|%s" "$1" "$2" "$3" > "$4"', "{{inputs.text}}",
                        "{{inputs.number}}", "{{workflow.name}}", str(out)),
        inputs=(ir.InputParameter("text", ir.StepOutputRef("producer", "file")),
                ir.InputParameter("number", ir.StepOutputRef("producer", "result"))),
        dependencies=(ir.Dependency("producer"),))
    wf = ir.Workflow("couler-e2e-producer-consumer", (producer, consumer))
    proc = run_dag(airflow_env, wf)
    assert proc.returncode == 0, _tail(proc)
    assert out.read_text() == "hello world|42|couler-e2e-producer-consumer"


def test_when_else_and_dynamic_map(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    cond = ir.Condition(ir.StepOutputRef("evaluate", "result"), ir.CompareOp.GT, L(10))
    evaluate = S("evaluate", ir.ScriptSpec("python:3.12", "print(9.5 + 1)\n"),
                 outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),))
    deploy = S("deploy", _sh('echo deploy > "$1"', str(tmp_path / "deploy")),
               dependencies=(ir.Dependency("evaluate"),), when=ir.When(cond))
    retrain = S("retrain", _sh('echo retrain > "$1"', str(tmp_path / "retrain")),
                dependencies=(ir.Dependency("evaluate"),), when=ir.When(cond, expect=False))
    shards = S("shards", ir.ScriptSpec("python:3.12", "import json\nprint(json.dumps("
                                                      "[{'n': 'x'}, {'n': 'y'}, {'n': 'z'}]))\n"),
               outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT,
                                           type=ir.ValueType.LIST),),
               dependencies=(ir.Dependency("deploy"), ir.Dependency("retrain")))
    process = S("process", _sh('echo "$1" >> "$2"', "{{inputs.shard}}", str(tmp_path / "map")),
                inputs=(ir.InputParameter("shard", ir.ItemRef("n")),),
                dependencies=(ir.Dependency("shards"),),
                foreach=ir.ForEach(source=ir.StepOutputRef("shards", "result"), parallelism=2))
    wf = ir.Workflow("couler-e2e-when-map", (evaluate, deploy, retrain, shards, process))
    proc = run_dag(airflow_env, wf)
    assert proc.returncode == 0, _tail(proc)
    assert (tmp_path / "deploy").exists()  # 10.5 > 10 compared as numbers, not text
    assert not (tmp_path / "retrain").exists()  # else branch skipped; shards still ran
    assert sorted((tmp_path / "map").read_text().split()) == ["x", "y", "z"]


def test_failure_edge_and_exit_hooks(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    main = S("main", _sh("exit 3"))
    recover = S("recover", _sh('echo recovered > "$1"', str(tmp_path / "recover")),
                dependencies=(ir.Dependency("main", ir.EdgeCondition.FAILED),))
    hooks = (
        ir.ExitHook(ir.RunStatus.SUCCEEDED,
                    (S("on-success", _sh('echo ok > "$1"', str(tmp_path / "ok"))),)),
        ir.ExitHook(ir.RunStatus.FAILED,
                    (S("on-failure", _sh('echo "$1" > "$2"', "{{workflow.status}}",
                                         str(tmp_path / "failed"))),)),
        ir.ExitHook(ir.RunStatus.ANY,  # status derived from the run's task states
                    (S("always", _sh('echo "$1" > "$2"', "{{workflow.status}}",
                                     str(tmp_path / "always"))),)),
    )
    # rule S7: `recover` handles main's failure, but `other` fails with no handler, so a
    # failure reaches a leaf and the run fails
    other = S("other", _sh("exit 4"))
    wf = ir.Workflow("couler-e2e-hooks", (main, recover, other), exit_hooks=hooks)
    proc = run_dag(airflow_env, wf)
    assert proc.returncode != 0, _tail(proc)  # the run fails: a step failed
    assert (tmp_path / "recover").read_text() == "recovered\n"
    assert (tmp_path / "failed").read_text() == "Failed\n"
    assert (tmp_path / "always").read_text() == "Failed\n"
    assert not (tmp_path / "ok").exists()


def test_a_handled_failure_leaves_the_run_succeeded(airflow_env: AirflowEnv,
                                                    tmp_path: Path) -> None:
    """Rule S7, as Argo decides a DAG's phase: main's failure is handled by `recover`,
    which succeeds, so no failure reaches a leaf: the run succeeds and the hook on
    failure does not fire (the runner checks the status, not a trigger rule)."""
    main = S("main", _sh("exit 3"))
    recover = S("recover", _sh('echo recovered > "$1"', str(tmp_path / "recover")),
                dependencies=(ir.Dependency("main", ir.EdgeCondition.FAILED),))
    hooks = (
        ir.ExitHook(ir.RunStatus.SUCCEEDED,
                    (S("on-success", _sh('echo "$1" > "$2"', "{{workflow.status}}",
                                         str(tmp_path / "ok"))),)),
        ir.ExitHook(ir.RunStatus.FAILED,
                    (S("on-failure", _sh('echo x > "$1"', str(tmp_path / "failed"))),)),
    )
    proc = run_dag(airflow_env, ir.Workflow("couler-e2e-handled", (main, recover),
                                            exit_hooks=hooks))
    assert proc.returncode == 0, _tail(proc)
    assert (tmp_path / "recover").read_text() == "recovered\n"
    assert (tmp_path / "ok").read_text() == "Succeeded\n"
    assert not (tmp_path / "failed").exists()


def test_missing_venv_fails_with_setup_hint(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setitem(globals(), "PYTHON", tmp_path / "missing" / "python")
    with pytest.raises(pytest.fail.Exception, match=r"scripts/setup-engine-venv\.sh airflow"):
        _require_venv()


def test_loop_params_and_static_map(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    counter, out = tmp_path / "counter", tmp_path / "params"
    count = S(
        "count",
        ir.ScriptSpec("python:3.12",
                      "import os\n"
                      f"p = {str(counter)!r}\n"
                      "n = int(open(p).read()) + 1 if os.path.exists(p) else 1\n"
                      "open(p, 'w').write(str(n))\n"
                      "print(n)\n"),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
        loop=ir.Loop(ir.Condition(ir.StepOutputRef("count", "result"), ir.CompareOp.LT, L(3)),
                     max_iterations=10))
    show = S("show", _sh('echo "$1 $2 $3" >> "$4"', "{{inputs.who}}", "{{inputs.n}}",
                         "{{inputs.lr}}", str(out)),
             inputs=(ir.InputParameter("who", ir.WorkflowParamRef("who")),
                     ir.InputParameter("n", ir.StepOutputRef("count", "result")),
                     ir.InputParameter("lr", ir.ItemRef())),
             dependencies=(ir.Dependency("count"),),
             foreach=ir.ForEach(items=(L(0.1), L(0.01))),
             retry=ir.RetryPolicy(2, ir.Backoff(1, 2, 5)), timeout_seconds=60)
    wf = ir.Workflow("couler-e2e-loop", (count, show),
                     parameters=(ir.Parameter("who", default=L("airflow")),))
    proc = run_dag(airflow_env, wf)
    assert proc.returncode == 0, _tail(proc)
    assert counter.read_text() == "3"  # ran while result < 3
    assert sorted(out.read_text().splitlines()) == ["airflow 3 0.01", "airflow 3 0.1"]


def test_depends_expressions(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    """Rule S5: and / or / not over upstream outcomes, evaluated by the step runner once
    every named step has finished (trigger rule all_done)."""
    F = ir.EdgeCondition

    def mark(name: str, **kw: Any) -> ir.Step:
        return S(name, _sh(f'echo {name} > "$1"', str(tmp_path / name)), **kw)

    def deps(*names: str) -> tuple[ir.Dependency, ...]:
        return tuple(ir.Dependency(n) for n in names)

    broken, ok = S("broken", _sh("exit 3")), mark("ok")
    # broken failed and ok succeeded: holds
    handled = mark("handled", dependencies=deps("broken", "ok"), depends=ir.DependsAll((
        ir.DependsTerm("broken", F.FAILED), ir.DependsTerm("ok", F.SUCCEEDED_ONLY))))
    # neither term holds: not run
    gated = mark("gated", dependencies=deps("broken", "ok"), depends=ir.DependsAny((
        ir.DependsTerm("broken", F.SUCCEEDED), ir.DependsNot(ir.DependsTerm("ok")))))
    # gated was not run (Omitted), which a plain edge would not accept
    after = mark("after", dependencies=deps("gated"),
                 depends=ir.DependsTerm("gated", F.OMITTED))
    wf = ir.Workflow("couler-e2e-depends", (broken, ok, handled, gated, after))
    proc = run_dag(airflow_env, wf)
    # rule S7: broken's failure is handled by `handled`; `after` ran after the not-run
    # `gated`, so no failure reaches a leaf
    assert proc.returncode == 0, _tail(proc)
    assert (tmp_path / "handled").read_text() == "handled\n"
    assert not (tmp_path / "gated").exists()
    assert (tmp_path / "after").read_text() == "after\n"
    assert "its depends expression does not hold (broken failed, ok succeeded)" in proc.stdout


def test_retry_by_failure_class(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    """The step runner classifies each failed attempt (couler.failures' patterns): a
    user error is not retried by a policy on transient / infra failures; an unknown exit
    (transient) is."""
    on = (ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA)
    tries_bug, tries_flaky = tmp_path / "bug", tmp_path / "flaky"
    bug = S("bug", ir.ScriptSpec("python:3.12", f"open({str(tries_bug)!r}, 'a').write('x')\n"
                                                "raise ValueError('bad input')\n"),
            retry=ir.RetryPolicy(3, on=on))
    flaky = S("flaky", _sh('echo x >> "$1"; [ "$(wc -l < "$1")" -ge 2 ] || exit 3',
                           str(tries_flaky)), retry=ir.RetryPolicy(3, on=on))
    proc = run_dag(airflow_env, ir.Workflow("couler-e2e-classes", (bug, flaky)))
    assert proc.returncode != 0, _tail(proc)  # bug failed
    assert tries_bug.read_text() == "x"  # one attempt: a user error is not retried
    assert "user (python-exception: Python ValueError in the traceback); not retried" \
        in proc.stdout
    assert tries_flaky.read_text().split() == ["x", "x"]  # exit 3 seen once: transient


def _run_with_store(airflow_env: AirflowEnv, wf: ir.Workflow, store: Path) -> None:
    """Run ``wf`` with ``airflow dags test``, its artifact store the directory ``store``."""
    (airflow_env.dags / f"{wf.name.replace('-', '_')}.py").write_text(
        airflow.compile_workflow(wf), encoding="utf-8")
    env = {**airflow_env.env, "AIRFLOW_VAR_COULER_ARTIFACT_ROOT": f"file://{store}"}
    proc = subprocess.run([str(AIRFLOW), "dags", "test", wf.name], env=env,
                          cwd=airflow_env.home, text=True, timeout=300, check=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, _tail(proc)


def test_artifacts_through_object_storage(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    """Output artifacts are copied to the artifact store (the Airflow Variable
    couler_artifact_root) under RUN_ID/STEP/NAME, input artifacts fetched to the path the
    step reads; an explicit location is used as is."""
    out, into, store = tmp_path / "out", tmp_path / "in", tmp_path / "store"
    pinned = tmp_path / "pinned" / "p.txt"
    producer = S(
        "producer", _sh('mkdir -p "$1/tree" && echo report > "$1/report.txt" && '
                        'echo one > "$1/tree/a" && echo two > "$1/tree/b" && '
                        'echo pin > "$1/pin.txt"', str(out)),
        output_artifacts=(
            ir.OutputArtifact("report", str(out / "report.txt")),
            ir.OutputArtifact("tree", str(out / "tree")),
            ir.OutputArtifact("pin", str(out / "pin.txt"), location=ir.ArtifactLocation(
                ir.StorageKind.LOCAL, key=str(pinned)))))
    consumer = S(
        "consumer", _sh('cat "$1/report.txt" "$1/tree/a" "$1/tree/b" "$1/pin.txt" > "$2"',
                        str(into), str(tmp_path / "seen")),
        input_artifacts=(
            ir.InputArtifact("report", str(into / "report.txt"),
                             ir.StepArtifactRef("producer", "report")),
            ir.InputArtifact("tree", str(into / "tree"), ir.StepArtifactRef("producer", "tree")),
            ir.InputArtifact("pin", str(into / "pin.txt"),
                             ir.ArtifactLocation(ir.StorageKind.LOCAL, key=str(pinned)))),
        dependencies=(ir.Dependency("producer"),))
    _run_with_store(airflow_env, ir.Workflow("couler-e2e-artifacts", (producer, consumer)),
                    store)
    assert (tmp_path / "seen").read_text().split() == ["report", "one", "two", "pin"]
    (run,) = store.iterdir()  # RUN_ID
    assert (run / "producer" / "report").read_text() == "report\n"
    assert sorted(p.name for p in (run / "producer" / "tree").iterdir()) == ["a", "b"]
    assert pinned.read_text() == "pin\n"


def test_cache_reuses_outputs_across_runs(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    """The step runner keeps a cached step's outputs in the artifact store: the second run
    reuses them without running the command; the consumer gets the same value."""
    runs, seen = tmp_path / "runs", tmp_path / "seen"
    compute = S("compute", _sh('echo ran >> "$1"; echo "value-$2"', str(runs), "{{inputs.n}}"),
                inputs=(ir.InputParameter("n", L(7)),),
                outputs=(ir.OutputParameter("out", ir.OutputSource.STDOUT),),
                cache=ir.CachePolicy(max_age_seconds=3600))
    use = S("use", _sh('echo "$1" >> "$2"', "{{inputs.v}}", str(seen)),
            inputs=(ir.InputParameter("v", ir.StepOutputRef("compute", "out")),),
            dependencies=(ir.Dependency("compute"),))
    wf = ir.Workflow("couler-e2e-cache", (compute, use))
    (airflow_env.dags / "cache.py").write_text(airflow.compile_workflow(wf), encoding="utf-8")
    env = {**airflow_env.env, "AIRFLOW_VAR_COULER_ARTIFACT_ROOT": f"file://{tmp_path / 'store'}"}
    for _ in range(2):
        proc = subprocess.run([str(AIRFLOW), "dags", "test", wf.name], env=env,
                              cwd=airflow_env.home, text=True, timeout=300, check=False,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.returncode == 0, _tail(proc)
    assert runs.read_text().split() == ["ran"]  # the second run reused the outputs
    assert seen.read_text().split() == ["value-7", "value-7"]
    assert "compute reused its cached outputs" in proc.stdout


def test_a_map_steps_items_keep_their_own_artifacts(airflow_env: AirflowEnv,
                                                     tmp_path: Path) -> None:
    """Each item of a map step stores its artifact under RUN_ID/STEP/NAME/item-INDEX: none
    overwrites another's."""
    store = tmp_path / "store"
    train = S("train", _sh('mkdir -p "$1" && echo "$2" > "$1/card"', str(tmp_path / "m"),
                           "{{item}}"),
              output_artifacts=(ir.OutputArtifact("model", str(tmp_path / "m")),),
              foreach=ir.ForEach(items=(ir.Literal.of("eu"), ir.Literal.of("us"))))
    _run_with_store(airflow_env, ir.Workflow("couler-e2e-map-artifacts", (train,)), store)
    (run,) = store.iterdir()  # RUN_ID
    cards = {d.name: (d / "card").read_text() for d in (run / "train" / "model").iterdir()}
    assert cards == {"item-0": "eu\n", "item-1": "us\n"}


# The pod step's pod, run on this host: the provider's KubernetesPodOperator.execute is
# replaced by one that runs the (wrapped) command with sh and records the volumes the
# operator would mount -- there is no cluster here. Everything before it (the step runner's
# gates, the Variables, the artifact wrapper) and the worker steps around it are Airflow's.
POD_ON_HOST = r"""
import json, subprocess, sys
from pathlib import Path
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

seen = {}

def on_host(self, context):
    seen[self.task_id] = {
        "volumes": [v.to_dict() for v in self.volumes],
        "mounts": [m.to_dict() for m in self.volume_mounts]}
    proc = subprocess.run([*self.cmds, *self.arguments], capture_output=True, text=True)
    sys.stderr.write(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"pod exited {proc.returncode}: {proc.stderr[-500:]}")

KubernetesPodOperator.execute = on_host
import importlib.util
spec = importlib.util.spec_from_file_location("dag_module", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
run = module.dag.test()
states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
print("COULER-JSON " + json.dumps({"states": states, "seen": seen}, default=str))
"""


def test_a_pod_steps_artifacts_pass_through_the_claim(airflow_env: AirflowEnv,
                                                      tmp_path: Path) -> None:
    """A worker step's artifact reaches a GPU pod step through the claim the workers mount
    at couler_artifact_root, and the pod step's output artifact reaches the next step."""
    claim = tmp_path / "claim"  # where the workers (and the pod) mount the claim
    prep = S("prep", _sh('mkdir -p "$1" && echo "a,b" > "$1/t.csv"', str(tmp_path / "p")),
             output_artifacts=(ir.OutputArtifact("data", str(tmp_path / "p")),))
    train = S("train", _sh('mkdir -p "$(dirname "$2")" && wc -l < "$1/t.csv" > "$2"',
                           str(tmp_path / "in"), str(tmp_path / "out" / "m.txt")),
              dependencies=(ir.Dependency("prep"),),
              resources=ir.Resources(memory_limit="1Gi", gpu=1),
              input_artifacts=(ir.InputArtifact("data", str(tmp_path / "in"),
                                                ir.StepArtifactRef("prep", "data")),),
              output_artifacts=(ir.OutputArtifact("model", str(tmp_path / "out" / "m.txt")),))
    report = S("report", _sh('cp "$1" "$2"', str(tmp_path / "got"), str(tmp_path / "seen")),
               dependencies=(ir.Dependency("train"),),
               input_artifacts=(ir.InputArtifact("model", str(tmp_path / "got"),
                                                 ir.StepArtifactRef("train", "model")),))
    wf = ir.Workflow("couler-e2e-pod-artifacts", (prep, train, report))
    dag_file = airflow_env.dags / "pod_artifacts.py"  # dag.test() parses the DAG folder
    dag_file.write_text(airflow.compile_workflow(wf), encoding="utf-8")
    driver = tmp_path / "driver.py"
    driver.write_text(POD_ON_HOST, encoding="utf-8")
    env = {**airflow_env.env, "AIRFLOW_VAR_COULER_ARTIFACT_ROOT": f"file://{claim}",
           "AIRFLOW_VAR_COULER_ARTIFACT_CLAIM": "ml-artifacts"}
    proc = subprocess.run([str(PYTHON), str(driver), str(dag_file)], env=env,
                          cwd=airflow_env.home, text=True, timeout=300, check=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("COULER-JSON ")), "")
    assert line, _tail(proc)
    out = json.loads(line.removeprefix("COULER-JSON "))
    assert out["states"] == {"prep": "success", "train": "success", "report": "success"}, \
        _tail(proc)
    assert (tmp_path / "seen").read_text().strip() == "1"
    pod = out["seen"]["train"]
    volume, mount = pod["volumes"][-1], pod["mounts"][-1]
    assert volume["name"] == mount["name"] == "couler-artifacts"
    assert volume["persistent_volume_claim"]["claim_name"] == "ml-artifacts"
    assert mount["mount_path"] == str(claim)

    # without the claim's Variable the pod step fails, naming what to set
    env.pop("AIRFLOW_VAR_COULER_ARTIFACT_CLAIM")
    proc = subprocess.run([str(PYTHON), str(driver), str(dag_file)], env=env,
                          cwd=airflow_env.home, text=True, timeout=300, check=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert "set the Airflow Variables couler_artifact_claim" in proc.stdout, _tail(proc)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("COULER-JSON ")), "")
    assert line and json.loads(line.removeprefix("COULER-JSON "))["states"]["train"] == "failed"
