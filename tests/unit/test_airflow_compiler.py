"""Tests of the IR -> Airflow DAG-file compiler (:mod:`couler.compilers.airflow`).

No Airflow here: the generated source is parsed with :mod:`ast` and its calls,
keyword arguments and ``STEPS`` table are inspected. Loading and running the
files with Airflow itself is in ``tests/integration/test_airflow.py``.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace as Ns
from typing import Any

import pytest

from couler import failures, ir
from couler.api.capture import capture_program
from couler.compilers import airflow
from couler.compilers.airflow.failures import classifier_source, pattern_table
from couler.compilers.airflow.jobs import JOB_RUNTIME
from couler.compilers.airflow.pods import POD_RUNTIME
from couler.engines.base import Feature, first_unsupported
from couler.errors import UnsupportedFeatureError

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((ROOT / "tests" / "golden" / "programs").glob("*.py"))

S = ir.Step
L = ir.Literal.of


def ctr(*command: str, args: tuple[str, ...] = ()) -> ir.ContainerSpec:
    return ir.ContainerSpec("alpine:3.20", tuple(command), args)


def wf_of(*steps: ir.Step, **kw: Any) -> ir.Workflow:
    return ir.Workflow(kw.pop("name", "wf"), tuple(steps), **kw)


# --------------------------------------------------------------------------- ast helper


@dataclass
class Task:
    """One ``t[KEY] = task(fn, **kwargs)(...)`` assignment of the generated DAG."""

    fn: str
    kwargs: dict[str, Any]
    call_kwargs: dict[str, str]  # keyword -> source text of the call (or .partial) argument
    expand: str | None = None  # source text of .expand(item=...)


@dataclass
class Dag:
    source: str
    dag_kwargs: dict[str, str] = field(default_factory=dict)
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)


def _key(node: ast.expr) -> str:
    assert isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
    return str(node.slice.value)


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _task(value: ast.expr) -> tuple[Task, ast.Call]:
    """Unwrap ``task(fn, **kw)(...)`` or ``task(fn, **kw).partial(...).expand(...)``, or
    a pod step's ``_CoulerPod(**kw).output`` (fn ``_CoulerPod``)."""
    if isinstance(value, ast.Attribute) and value.attr == "output":
        pod = value.value
        assert isinstance(pod, ast.Call) and ast.unparse(pod.func) == "_CoulerPod"
        kwargs = {k.arg: ast.unparse(k.value) for k in pod.keywords if k.arg}
        return Task("_CoulerPod", kwargs, kwargs), pod
    assert isinstance(value, ast.Call)
    if ast.unparse(value.func) == "_CoulerTrigger":  # a sub-workflow reference
        kwargs = {k.arg: ast.unparse(k.value) for k in value.keywords if k.arg}
        return Task("_CoulerTrigger", kwargs, kwargs), value
    expand = None
    call = value
    if isinstance(call.func, ast.Attribute) and call.func.attr == "expand":
        expand = ast.unparse(call.keywords[0].value)
        assert call.keywords[0].arg == "item"
        call = call.func.value  # type: ignore[assignment]
        assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        assert call.func.attr == "partial"
        inner = call.func.value
    else:
        inner = call.func
    assert isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name)
    assert inner.func.id == "task"
    fn = inner.args[0]
    assert isinstance(fn, ast.Name)
    kwargs = {k.arg: _literal(k.value) for k in inner.keywords if k.arg}
    call_kwargs = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg}
    return Task(fn.id, kwargs, call_kwargs, expand), call


def parse(source: str) -> Dag:
    tree = ast.parse(source)
    dag = Dag(source)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            dag.imports.update(f"{node.module}.{a.name}" for a in node.names)
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
                and isinstance(node.targets[0].value, ast.Name)
                and node.targets[0].value.id == "STEPS"):
            dag.steps[_key(node.targets[0])] = ast.literal_eval(node.value)
        if isinstance(node, ast.With):
            call = node.items[0].context_expr
            assert isinstance(call, ast.Call) and ast.unparse(call.func) == "DAG"
            dag.dag_kwargs = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg}
            _walk(node.body, dag)
    return dag


def _walk(body: list[ast.stmt], dag: Dag) -> None:
    for stmt in body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Subscript):
            dag.tasks[_key(stmt.targets[0])] = _task(stmt.value)[0]
        elif isinstance(stmt, ast.With):
            call = stmt.items[0].context_expr
            assert isinstance(call, ast.Call) and ast.unparse(call.func) == "TaskGroup"
            target = stmt.items[0].optional_vars
            assert target is not None
            dag.groups.append(_key(target))
            _walk(stmt.body, dag)
        elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.BinOp)
              and isinstance(stmt.value.op, ast.RShift)):
            left, right = stmt.value.left, stmt.value.right
            lefts = ([_key(e) for e in left.elts] if isinstance(left, ast.List)
                     else ["main"] if isinstance(left, ast.Name) else [_key(left)])
            dag.edges += [(a, _key(right)) for a in lefts]


def compile_ok(wf: ir.Workflow) -> Dag:
    source = airflow.compile_workflow(wf)
    compile(source, f"{wf.name}.py", "exec")  # valid Python
    assert airflow.compile_workflow(wf) == source  # deterministic
    dag = parse(source)
    assert dag.dag_kwargs["dag_id"] == repr(wf.name)
    return dag


# --------------------------------------------------------------------------- contract


def test_every_feature_has_a_capability_with_a_note() -> None:
    assert set(airflow.CAPABILITIES) == set(Feature)
    for feature, cap in airflow.CAPABILITIES.items():
        assert cap.note, feature


def test_limits_have_sources() -> None:
    names = {lim.name for lim in airflow.LIMITS}
    assert any("max_map_length" in n for n in names)
    for lim in airflow.LIMITS:
        assert lim.value > 0 and lim.unit and lim.source


def test_compiler_does_not_import_airflow() -> None:
    tree = ast.parse(inspect.getsource(airflow))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("airflow") for a in node.names)
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("airflow")


def _first_unsupported(wf: ir.Workflow) -> tuple[Feature, str] | None:
    return first_unsupported(airflow.CAPABILITIES, wf)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_golden_program(program: Path) -> None:
    (wf,) = capture_program(str(program))
    expected = _first_unsupported(wf)
    if expected is not None:
        feature, step = expected
        with pytest.raises(UnsupportedFeatureError) as err:
            airflow.compile_workflow(wf)
        assert feature.value in str(err.value)
        assert err.value.step == step and repr(step) in str(err.value)
        return
    dag = compile_ok(wf)
    assert set(dag.steps) <= set(dag.tasks)


def test_golden_outcomes() -> None:
    rejected = set()
    for program in PROGRAMS:
        (wf,) = capture_program(str(program))
        try:
            airflow.compile_workflow(wf)
        except UnsupportedFeatureError:
            rejected.add(program.stem)
    assert rejected == set()


# --------------------------------------------------------------------------- structure


def test_container_step_and_dependencies() -> None:
    a = S("a", ctr("echo", args=("{{workflow.name}}",)))
    b = S("b", ctr("echo", "b"), dependencies=(ir.Dependency("a"),))
    dag = compile_ok(wf_of(a, b))
    assert dag.steps["a"]["kind"] == "container"
    assert dag.steps["a"]["command"] == ["echo"]
    assert dag.steps["a"]["args"] == ["{{workflow.name}}"]  # substituted by the runner
    assert dag.tasks["a"].fn == "_couler_run"
    assert dag.tasks["a"].kwargs == {"task_id": "a", "multiple_outputs": True}
    assert dag.tasks["b"].kwargs["trigger_rule"] == "none_failed"
    assert dag.tasks["a"].call_kwargs == {"step": "'a'", "xcoms": "{}"}
    assert dag.edges == [("a", "b")]
    assert dag.dag_kwargs["schedule"] == "None"
    assert "airflow.sdk.DAG" in dag.imports and "airflow.sdk.task" in dag.imports


def test_script_step() -> None:
    s = S("s", ir.ScriptSpec("python:3.12", "print('hi')\n"),
          outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),))
    sh = S("sh", ir.ScriptSpec("alpine", "echo hi\n", ir.ScriptLanguage.BASH))
    dag = compile_ok(wf_of(s, sh))
    assert dag.steps["s"]["kind"] == "script"
    assert dag.steps["s"]["interpreter"] == ["python"]
    assert dag.steps["s"]["source"] == "print('hi')\n"
    assert dag.steps["s"]["outputs"] == [
        {"name": "result", "source": "stdout", "path": "", "type": "string"}]
    assert dag.steps["sh"]["interpreter"] == ["bash"]
    assert "exec(" not in dag.source  # scripts run in a subprocess, never exec'd


def test_parameters_flow_through_xcom() -> None:
    producer = S("producer", ctr("sh", "-c", "echo -n hi > /tmp/out.txt"),
                 outputs=(ir.OutputParameter("out", selector="/tmp/out.txt"),))
    consumer = S("consumer", ctr("echo", args=("{{inputs.msg}}", "{{inputs.lit}}")),
                 inputs=(ir.InputParameter("msg", ir.StepOutputRef("producer", "out")),
                         ir.InputParameter("lit", L(3), ir.ValueType.INT)),
                 dependencies=(ir.Dependency("producer"),))
    # consumer listed first: the compiler orders producers before consumers
    dag = compile_ok(wf_of(consumer, producer))
    assert list(dag.tasks) == ["producer", "consumer"]
    assert dag.steps["producer"]["outputs"] == [
        {"name": "out", "source": "path", "path": "/tmp/out.txt", "type": "string"}]
    assert dag.steps["consumer"]["inputs"] == {"msg": {"xcom": "x0"}, "lit": {"literal": "3"}}
    assert dag.tasks["consumer"].call_kwargs["xcoms"] == "{'x0': t['producer']['out']}"


@pytest.mark.parametrize(("condition", "rule"), [
    (ir.EdgeCondition.FAILED, "all_failed"),
    (ir.EdgeCondition.ERRORED, "all_failed"),
    (ir.EdgeCondition.SKIPPED, "all_skipped"),
    (ir.EdgeCondition.COMPLETED, "all_done"),
    (ir.EdgeCondition.ANY, "all_done"),
])
def test_edge_conditions_are_trigger_rules(condition: ir.EdgeCondition, rule: str) -> None:
    a = S("a", ctr("false"))
    b = S("b", ctr("echo"), dependencies=(ir.Dependency("a", condition),))
    dag = compile_ok(wf_of(a, b))
    assert dag.tasks["b"].kwargs["trigger_rule"] == rule
    assert airflow.TRIGGER_RULES[condition] == rule


def test_mixed_edge_conditions_are_rejected() -> None:
    a, b = S("a", ctr("true")), S("b", ctr("true"))
    c = S("c", ctr("echo"), dependencies=(ir.Dependency("a"),
                                          ir.Dependency("b", ir.EdgeCondition.FAILED)))
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(a, b, c))
    assert err.value.step == "c" and Feature.EDGE_CONDITIONS.value in str(err.value)


def test_depends_expression_is_evaluated_by_the_runner() -> None:
    a, b = S("a", ctr("true")), S("b", ctr("true"))
    c = S("c", ctr("echo"), dependencies=(ir.Dependency("a"), ir.Dependency("b")),
          depends=ir.DependsAny((ir.DependsTerm("a", ir.EdgeCondition.FAILED),
                                 ir.DependsNot(ir.DependsTerm("b")))))
    dag = compile_ok(wf_of(a, b, c))
    # all_done: read once both have finished; the runner decides
    assert dag.tasks["c"].kwargs["trigger_rule"] == "all_done"
    assert {("a", "c"), ("b", "c")} <= set(dag.edges)
    assert dag.steps["c"]["depends"] == ["any", [["term", "a", "failed"],
                                                 ["not", ["term", "b", "succeeded"]]]]
    assert dag.steps["c"]["edges"] == []  # the expression replaces the edge checks
    assert airflow.EXIT_STATUS_TASK in dag.tasks  # a failure the expression handles


def test_depends_expression_on_a_group_is_refused() -> None:
    group = S("g", ir.SubWorkflowSpec("g", (S("inner", ctr("true")),)))
    c = S("c", ctr("echo"), dependencies=(ir.Dependency("g"),),
          depends=ir.DependsNot(ir.DependsTerm("g", ir.EdgeCondition.FAILED)))
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(group, c))
    assert err.value.step == "c" and "TaskGroup" in str(err.value)


def test_when_and_else() -> None:
    ev = S("evaluate", ir.ScriptSpec("python", "print(0.93)\n"),
           outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),))
    cond = ir.Condition(ir.StepOutputRef("evaluate", "result"), ir.CompareOp.GT, L(0.9))
    deploy = S("deploy", ctr("echo", "deploy"), dependencies=(ir.Dependency("evaluate"),),
               when=ir.When(cond))
    retrain = S("retrain", ctr("echo", "retrain"), dependencies=(ir.Dependency("evaluate"),),
                when=ir.When(cond, expect=False))
    dag = compile_ok(wf_of(ev, deploy, retrain))
    want = {"left": {"xcom": "x0"}, "op": ">", "right": {"literal": "0.9"}}
    assert dag.steps["deploy"]["when"] == {**want, "expect": True}
    assert dag.steps["retrain"]["when"] == {**want, "expect": False}
    assert dag.tasks["retrain"].call_kwargs["xcoms"] == "{'x0': t['evaluate']['result']}"
    assert "AirflowSkipException" in dag.source


def test_static_map() -> None:
    step = S("train", ctr("echo", args=("{{inputs.lr}}",)),
             inputs=(ir.InputParameter("lr", ir.ItemRef("lr")),),
             foreach=ir.ForEach(items=(L({"lr": 0.1}), L({"lr": 0.01})), parallelism=1))
    dag = compile_ok(wf_of(step))
    assert dag.tasks["train"].expand == "[0, 1]"
    assert dag.tasks["train"].kwargs["max_active_tis_per_dagrun"] == 1
    assert dag.steps["train"]["items"] == [{"lr": 0.1}, {"lr": 0.01}]
    assert dag.steps["train"]["inputs"] == {"lr": {"item": "lr"}}


def test_static_map_over_limit_is_rejected() -> None:
    items = tuple(L(i) for i in range(airflow.MAX_MAP_LENGTH + 1))
    step = S("m", ctr("echo", args=("{{item}}",)), foreach=ir.ForEach(items=items))
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(step))
    assert err.value.step == "m" and "max_map_length" in str(err.value)


def test_dynamic_map_uses_an_items_helper_task() -> None:
    src = S("list", ir.ScriptSpec("python", "print('[1, 2]')\n"),
            outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT,
                                        type=ir.ValueType.LIST),))
    proc = S("process", ctr("echo", args=("{{inputs.x}}",)),
             inputs=(ir.InputParameter("x", ir.ItemRef()),),
             dependencies=(ir.Dependency("list"),),
             foreach=ir.ForEach(source=ir.StepOutputRef("list", "result")))
    dag = compile_ok(wf_of(src, proc))
    helper = dag.tasks["process--items"]
    assert helper.fn == "_couler_items"
    assert helper.kwargs == {"task_id": "process--items", "trigger_rule": "none_failed"}
    assert helper.call_kwargs == {"value": "t['list']['result']"}
    assert dag.tasks["process"].expand == "t['process--items']"
    assert dag.steps["process"]["items"] is None


def test_map_over_workflow_parameter() -> None:
    proc = S("process", ctr("echo", args=("{{item}}",)),
             foreach=ir.ForEach(source=ir.WorkflowParamRef("shards")))
    wf = wf_of(proc, parameters=(ir.Parameter("shards", ir.ValueType.LIST, L(["a", "b"])),))
    dag = compile_ok(wf)
    assert dag.tasks["process--items"].call_kwargs == {"param": "'shards'"}
    assert dag.dag_kwargs["params"] == "{'shards': Param(['a', 'b'], type='array')}"


def test_loop_runs_inside_the_task() -> None:
    step = S("flip", ir.ScriptSpec("python", "print('tails')\n"),
             outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
             loop=ir.Loop(ir.Condition(ir.StepOutputRef("flip", "result"), ir.CompareOp.EQ,
                                       L("tails")), max_iterations=5))
    dag = compile_ok(wf_of(step))
    assert dag.steps["flip"]["loop"] == {"left": {"own": "result"}, "op": "==",
                                         "right": {"literal": "tails"}, "max_iterations": 5}
    assert dag.tasks["flip"].call_kwargs["xcoms"] == "{}"


def test_retry_timeout_priority_and_defaults() -> None:
    step = S("train", ctr("train"),
             retry=ir.RetryPolicy(3, ir.Backoff(10, 3, 600)), timeout_seconds=60, priority=5)
    other = S("other", ctr("x"))
    wf = wf_of(step, other, defaults=ir.StepDefaults(retry=ir.RetryPolicy(2),
                                                     timeout_seconds=30))
    dag = compile_ok(wf)
    kw = dag.tasks["train"].kwargs
    assert kw["retries"] == 3
    assert kw["retry_delay"] == "datetime.timedelta(seconds=10)"
    assert kw["retry_exponential_backoff"] == 3.0
    assert kw["max_retry_delay"] == "datetime.timedelta(seconds=600)"
    assert kw["execution_timeout"] == "datetime.timedelta(seconds=60)"
    assert kw["priority_weight"] == 5
    kw = dag.tasks["other"].kwargs
    assert kw["retries"] == 2 and kw["retry_delay"] == "datetime.timedelta(seconds=0)"
    assert kw["execution_timeout"] == "datetime.timedelta(seconds=30)"


@pytest.mark.parametrize(("step", "feature"), [
    (S("s", ir.JobSpec.of({"apiVersion": "batch/v1", "kind": "Job"},
                          action=ir.JobAction.DELETE)), Feature.JOB),  # delete what?
    (S("s", ctr("x"), daemon=True), Feature.DAEMON),
])
def test_unsupported_features_name_the_step(step: ir.Step, feature: Feature) -> None:
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(step))
    assert err.value.step == "s" and feature.value in str(err.value)


def test_exit_hooks() -> None:
    main = S("main", ctr("false"))
    wf = wf_of(main, exit_hooks=(
        ir.ExitHook(ir.RunStatus.SUCCEEDED, (S("yay", ctr("echo", "ok")),)),
        ir.ExitHook(ir.RunStatus.FAILED, (S("nay", ctr("echo", "failed")),)),
        ir.ExitHook(ir.RunStatus.ANY, (S("always", ctr("echo", "done")),)),
    ))
    dag = compile_ok(wf)
    # every hook waits for all tasks; the runner checks a gated hook against the run's
    # status by rule S7 (a handled failure is not a failed run), so no trigger rule can
    for name in ("yay", "nay", "always"):
        assert dag.tasks[name].kwargs["trigger_rule"] == "all_done"
    assert dag.steps["yay"]["status"] == "Succeeded" and dag.steps["nay"]["status"] == "Failed"
    assert "status" not in dag.steps["always"]
    status = dag.tasks[airflow.EXIT_STATUS_TASK]
    assert status.fn == "_couler_exit_status"
    assert status.kwargs["trigger_rule"] == "all_done"
    assert {("main", "yay"), ("main", "nay"), ("main", "always"),
            ("main", airflow.EXIT_STATUS_TASK)} <= set(dag.edges)


def test_exit_hook_steps_cannot_depend_on_each_other() -> None:
    hook = ir.ExitHook(ir.RunStatus.ANY, (S("h1", ctr("x")),
                                          S("h2", ctr("y"), dependencies=(ir.Dependency("h1"),))))
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(S("m", ctr("z")), exit_hooks=(hook,)), validate=False)
    assert err.value.step == "h2"


def test_inline_subworkflow_is_a_task_group() -> None:
    inner_a = S("a", ctr("echo", "a"),
                outputs=(ir.OutputParameter("out", ir.OutputSource.STDOUT),))
    inner_b = S("b", ctr("echo", "b"), dependencies=(ir.Dependency("a"),))
    group = S("g", ir.SubWorkflowSpec("g", (inner_a, inner_b)),
              outputs=(ir.OutputParameter("out", ir.OutputSource.STDOUT),))
    last = S("last", ctr("echo", args=("{{inputs.v}}",)),
             inputs=(ir.InputParameter("v", ir.StepOutputRef("g", "out")),),
             dependencies=(ir.Dependency("g"),))
    dag = compile_ok(wf_of(group, last))
    assert dag.groups == ["g"]
    assert dag.tasks["g.a"].kwargs["task_id"] == "a"
    assert dag.steps["g.b"]["command"] == ["echo", "b"]
    assert ("g.a", "g.b") in dag.edges and ("g", "last") in dag.edges
    assert dag.tasks["last"].call_kwargs["xcoms"] == "{'x0': t['g.a']['out']}"
    assert "airflow.sdk.TaskGroup" in dag.imports


def test_group_level_policy_is_rejected() -> None:
    group = S("g", ir.SubWorkflowSpec("g", (S("a", ctr("x")),)), retry=ir.RetryPolicy(1))
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(group))
    assert err.value.step == "g"


def test_secrets_read_airflow_variables() -> None:
    step = S("s", ctr("env"), env=(ir.EnvVar("TOKEN", secret=ir.SecretRef("creds", "token")),
                                   ir.EnvVar("MODE", "fast")))
    dag = compile_ok(wf_of(step))
    assert dag.steps["s"]["env"] == [{"name": "TOKEN", "secret": "creds/token"},
                                     {"name": "MODE", "value": "fast"}]
    assert "Variable.get(" in dag.source


def test_workflow_settings() -> None:
    step = S("train", ctr("train", args=("{{inputs.e}}",)),
             inputs=(ir.InputParameter("e", ir.WorkflowParamRef("epochs"), ir.ValueType.INT),))
    wf = wf_of(step, name="nightly",
               parameters=(ir.Parameter("epochs", ir.ValueType.INT, L(10), "how many"),
                           ir.Parameter("tag")),
               schedule=ir.CronSchedule("0 1 * * *", concurrency_policy=ir.ConcurrencyPolicy.FORBID,
                                        suspend=True),
               labels=(("team", "ml"),), parallelism=4, timeout_seconds=3600)
    dag = compile_ok(wf)
    kw = dag.dag_kwargs
    assert kw["schedule"] == "'0 1 * * *'"
    assert kw["max_active_runs"] == "1" and kw["is_paused_upon_creation"] == "True"
    assert kw["tags"] == "['team=ml']"
    assert kw["max_active_tasks"] == "4"
    assert kw["dagrun_timeout"] == "datetime.timedelta(seconds=3600)"
    assert kw["params"] == ("{'epochs': Param(10, type='integer', description='how many'), "
                            "'tag': Param(None, type=['string', 'null'])}")
    assert dag.steps["train"]["inputs"] == {"e": {"param": "epochs"}}


def test_cron_timezone_and_replace() -> None:
    step = S("r", ctr("report"))
    dag = compile_ok(wf_of(step, schedule=ir.CronSchedule("0 * * * *", timezone="Europe/Paris")))
    assert dag.dag_kwargs["schedule"] == (
        "CronTriggerTimetable('0 * * * *', timezone='Europe/Paris')")
    assert "airflow.sdk.CronTriggerTimetable" in dag.imports
    replace = ir.CronSchedule("0 * * * *", concurrency_policy=ir.ConcurrencyPolicy.REPLACE)
    with pytest.raises(UnsupportedFeatureError):
        airflow.compile_workflow(wf_of(step, schedule=replace))


def test_generated_golden_files_are_lint_clean(tmp_path: Path) -> None:
    """Generated DAG files pass pyflakes / pycodestyle / bugbear (readable, no dead imports)."""
    for program in PROGRAMS:
        (wf,) = capture_program(str(program))
        if _first_unsupported(wf) is None:
            (tmp_path / f"{program.stem}.py").write_text(airflow.compile_workflow(wf),
                                                         encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select",
                           "E,F,W,B", "--line-length", "120", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- failure classes


def _generated_classifier() -> Any:
    namespace: dict[str, Any] = {}
    exec("import re\nfrom typing import Any\n" + classifier_source(), namespace)
    return namespace["_couler_classify"]


TRACE = "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
CASES: list[dict[str, Any]] = [
    {"exit_code": 1, "engine_reason": "OOMKilled"},
    {"exit_code": None, "engine_reason": "The node was low on resource: Evicted"},
    {"exit_code": None, "engine_reason": "node was lost"},
    {"exit_code": None, "engine_reason": "Back-off pulling image: ImagePullBackOff"},
    {"exit_code": None, "engine_reason": "Preempted by a spot reclaim"},
    {"exit_code": None, "engine_reason": "DeadlineExceeded"},
    {"exit_code": None, "engine_reason": "cannot start the process"},
    {"exit_code": 137, "memory_evidence": True},
    {"exit_code": 137, "log": "Killed: out of memory"},
    {"exit_code": -9},
    {"exit_code": 1, "log": TRACE + "MemoryError"},
    {"exit_code": 1, "log": "fatal: cannot allocate memory"},
    {"exit_code": None, "timed_out": True},
    {"exit_code": 143},
    {"exit_code": 1, "signal": 15},
    {"exit_code": 1, "log": TRACE + "requests.exceptions.ConnectionError: boom"},
    {"exit_code": 1, "log": TRACE + "socket.timeout: timed out"},
    {"exit_code": 1, "log": TRACE + "RuntimeError: download failed: Connection reset by peer"},
    {"exit_code": 1, "log": TRACE + "OSError: [Errno 28] No space left on device"},
    {"exit_code": 1, "log": TRACE + "ValueError: bad input 42"},
    {"exit_code": 1, "log": "curl: (6) Could not resolve host: example.org"},
    {"exit_code": 1, "log": "HTTP 503 Service Unavailable"},
    {"exit_code": 1, "log": "dial tcp: i/o timeout"},
    {"exit_code": 1, "log": "write: broken pipe"},
    {"exit_code": 1, "log": "read: Connection reset by peer"},
    {"exit_code": 1, "log": "dial: connection refused"},
    {"exit_code": 1, "log": "net/http: TLS handshake timeout"},
    {"exit_code": 1, "log": "error: timed out while reading"},
    {"exit_code": 1, "log": "cp: No space left on device"},
    {"exit_code": 127, "log": "sh: foo: not found"},
    {"exit_code": 2, "log": "usage: prog [-h]\nprog: error: unrecognized arguments"},
    {"exit_code": 3, "log": "something odd 17"},
    {"exit_code": 3, "log": "something odd 18",
     "previous": [failures.Attempt(3, "something odd #")]},
    {"exit_code": 3, "log": "other", "previous": [failures.Attempt(3, "something odd #")]},
    {"exit_code": None},
    {"exit_code": None, "engine_reason": "mystery"},
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_generated_classifier_matches_couler_failures(case: dict[str, Any]) -> None:
    expected = failures.classify(**case)
    previous = [[a.exit_code, a.error] for a in case.get("previous", ())]
    got = _generated_classifier()(
        case["exit_code"], case.get("signal"), case.get("engine_reason", ""),
        case.get("log", ""), previous, memory=case.get("memory_evidence", False),
        timed_out=case.get("timed_out", False))
    assert got == (expected.failure_class.value, expected.pattern, expected.reason)


def test_cases_reach_every_pattern() -> None:
    reached = {failures.classify(**case).pattern for case in CASES}
    names = {p.name for p in failures.PATTERNS}
    assert names - reached == set()
    assert {row[0] for row in pattern_table()} == names


def test_retry_on_classes_is_in_the_step_table() -> None:
    step = S("s", ctr("x"), retry=ir.RetryPolicy(2, on=(ir.FailureClass.TRANSIENT,
                                                        ir.FailureClass.INFRA)))
    dag = compile_ok(wf_of(step, S("t", ctr("y"), retry=ir.RetryPolicy(1))))
    assert dag.steps["s"]["retry_on"] == ["transient", "infra"]
    assert dag.tasks["s"].kwargs["retries"] == 2
    assert "retry_on" not in dag.steps["t"]  # any failure: Airflow's retries alone
    assert "def _couler_classify(" in dag.source


# --------------------------------------------------------------------------- artifacts


def test_artifact_locations() -> None:
    s3 = ir.ArtifactLocation(ir.StorageKind.S3, endpoint="minio:9000", bucket="b",
                             key="data/x.csv", insecure=True,
                             access_key=ir.SecretRef("s3", "id"),
                             secret_key=ir.SecretRef("s3", "secret"))
    make = S("make", ctr("true"), output_artifacts=(
        ir.OutputArtifact("model", "/tmp/model"), ir.OutputArtifact("csv", "/tmp/x", s3)))
    use = S("use", ctr("true"), dependencies=(ir.Dependency("make"),), input_artifacts=(
        ir.InputArtifact("m", "/in/model", ir.StepArtifactRef("make", "model")),
        ir.InputArtifact("c", "/in/x", ir.StepArtifactRef("make", "csv"))))
    dag = compile_ok(wf_of(make, use))
    assert dag.steps["make"]["output_artifacts"] == [
        {"name": "model", "path": "/tmp/model", "to": {"key": "make/model"}},
        {"name": "csv", "path": "/tmp/x", "to": {
            "url": "s3://b/data/x.csv", "endpoint": "http://minio:9000",
            "access_key": "s3/id", "secret_key": "s3/secret"}}]
    assert [a["from"] for a in dag.steps["use"]["input_artifacts"]] == [
        {"key": "make/model"}, dag.steps["make"]["output_artifacts"][1]["to"]]


@pytest.mark.parametrize("step", [
    S("s", ctr("true"), input_artifacts=(ir.InputArtifact("src", "/src", ir.ArtifactLocation(
        ir.StorageKind.GIT, url="https://example.org/r.git")),)),
    S("s", ctr("true"), output_artifacts=(ir.OutputArtifact("o", "/o", ir.ArtifactLocation(
        ir.StorageKind.S3, bucket="b", key="k")),), foreach=ir.ForEach(items=(L(1), L(2)))),
])
def test_artifacts_object_storage_cannot_carry_are_refused(step: ir.Step) -> None:
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(step))
    assert err.value.step == "s" and Feature.ARTIFACTS.value in str(err.value)


# --------------------------------------------------------------------------- pod steps


def test_pod_output_wrapper_writes_json(tmp_path: Path) -> None:
    """The shell wrapper of a pod step's outputs (run here with sh and this machine's awk)
    writes stdout and a file's contents as one JSON object, escapes included."""
    source = POD_RUNTIME[POD_RUNTIME.index("_COULER_AWK = "):POD_RUNTIME.index("class _Couler")]
    namespace: dict[str, Any] = {"json": json, "os": os, "shlex": shlex, "Any": Any}
    exec(source, namespace)
    tricky = 'a "quoted" \\ back\tslash\nline2 $HOME `x` \'s\n'
    out_file, target = tmp_path / "f.txt", tmp_path / "xcom" / "return.json"
    script = namespace["_couler_wrapper"](
        [{"name": "out", "source": "stdout", "path": ""},
         {"name": "file", "source": "path", "path": str(out_file)}], str(target))
    code = f"open({str(out_file)!r}, 'w').write({tricky!r}); print('hello \"w\"')"
    proc = subprocess.run(["sh", "-c", script, "couler", sys.executable, "-c", code],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout == 'hello "w"\n', proc.stderr
    assert json.loads(target.read_text()) == {"out": 'hello "w"', "file": tricky[:-1]}
    failed = subprocess.run(["sh", "-c", script, "couler", "sh", "-c", "exit 7"],
                            capture_output=True, text=True, check=False)
    assert failed.returncode == 7


def test_steps_with_resources_or_placement_become_pods() -> None:
    train = S("train", ctr("python3", "-c", "print(1)"),
              resources=ir.Resources(cpu_request="1", memory_limit="1Gi", gpu=1),
              node_selector=(("pool", "gpu"),),
              tolerations=(ir.Toleration("dedicated", "Equal", "ml", "NoSchedule"),),
              env=(ir.EnvVar("TOKEN", secret=ir.SecretRef("creds", "token")),),
              outputs=(ir.OutputParameter("out", ir.OutputSource.STDOUT),),
              retry=ir.RetryPolicy(2, on=(ir.FailureClass.OOM,), memory_factor=2.0,
                                   memory_ceiling="4Gi"))
    report = S("report", ctr("echo", args=("{{inputs.v}}",)), dependencies=(
        ir.Dependency("train"),), inputs=(ir.InputParameter("v", ir.StepOutputRef("train",
                                                                                  "out")),))
    source = airflow.compile_workflow(wf_of(train, report))
    assert "class _CoulerPod(KubernetesPodOperator)" in source
    assert "t['train'] = _CoulerPod(" in source and "t['report'] = task(" in source
    dag = parse(source)
    pod = dag.tasks["train"].kwargs
    assert pod["container_resources"] == ("k8s.V1ResourceRequirements(requests={'cpu': '1'}, "
                                          "limits={'memory': '1Gi', 'nvidia.com/gpu': '1'})")
    assert pod["node_selector"] == "{'pool': 'gpu'}"
    assert pod["tolerations"] == ("[k8s.V1Toleration(key='dedicated', operator='Equal', "
                                  "value='ml', effect='NoSchedule')]")
    assert pod["secrets"] == ("[Secret(deploy_type='env', deploy_target='TOKEN', "
                              "secret='creds', key='token')]")
    assert pod["cmds"] == "['python3']" and pod["arguments"] == "['-c', 'print(1)']"
    assert pod["image"] == "'alpine:3.20'" and pod["do_xcom_push"] == "True"
    assert pod["retries"] == "2"
    assert dag.steps["train"]["memory"] == {"factor": 2.0, "ceiling": "4Gi"}
    assert dag.steps["train"]["retry_on"] == ["oom"]
    assert "{'x0': t['train']['out']}" in source  # the worker task reads the pod's XCom


@pytest.mark.parametrize(("step", "feature"), [
    (S("s", ctr("x"), resources=ir.Resources(cpu_request="1"),
       foreach=ir.ForEach(items=(L(1),))), Feature.MAP_STATIC),
    (S("s", ctr("x"), node_selector=(("a", "b"),), input_artifacts=(ir.InputArtifact(
        "o", "/o", ir.ArtifactLocation(ir.StorageKind.HTTP, url="https://x/o")),)),
     Feature.ARTIFACTS),
])
def test_what_a_pod_step_cannot_carry_is_refused(step: ir.Step, feature: Feature) -> None:
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(step))
    assert err.value.step == "s" and feature.value in str(err.value)


def test_cache_policy_in_the_step_table() -> None:
    keyed = S("keyed", ctr("x"), cache=ir.CachePolicy(key="v1-{{inputs.n}}", name="c",
                                                       max_age_seconds=60),
              inputs=(ir.InputParameter("n", L(1)),))
    plain = S("plain", ctr("x"), cache=ir.CachePolicy(salt="s"))
    salted = S("plain", ctr("x"), cache=ir.CachePolicy(salt="t"))
    dag = compile_ok(wf_of(keyed, plain))
    assert dag.steps["keyed"]["cache"] == {"name": "c", "key": "v1-{{inputs.n}}",
                                           "digest": dag.steps["keyed"]["cache"]["digest"],
                                           "max_age": 60}
    assert dag.steps["plain"]["cache"]["name"] == "plain"
    assert dag.steps["plain"]["cache"]["max_age"] is None
    # the salt changes the content digest
    other = compile_ok(wf_of(salted)).steps["plain"]["cache"]["digest"]
    assert other != dag.steps["plain"]["cache"]["digest"]
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(S("s", ctr("x"), cache=ir.CachePolicy(),
                                         output_artifacts=(ir.OutputArtifact("o", "/o"),))))
    assert Feature.CACHE.value in str(err.value)


def _pod_helpers() -> dict[str, Any]:
    """The pod runtime's quantity / earlier-tries / escalation helpers, without Airflow."""
    source = POD_RUNTIME[POD_RUNTIME.index("_QUANTITY = "):POD_RUNTIME.index("# awk: ")]
    namespace: dict[str, Any] = {"re": __import__("re"), "Any": Any}
    exec(source, namespace)
    return namespace


def _fake_pod(try_number: int, reason: str, code: int) -> Any:
    done = Ns(reason=reason, exit_code=code)
    return Ns(metadata=Ns(name=f"pod-{try_number}", labels={"try_number": str(try_number)}),
              status=Ns(container_statuses=[Ns(name="base", state=Ns(terminated=done))]))


def test_pod_memory_escalates_after_oom_killed_tries() -> None:
    helpers = _pod_helpers()
    assert helpers["_couler_quantity"]("1Gi") == 2**30
    assert helpers["_couler_quantity"]("500m") == 0.5
    pods = [_fake_pod(2, "OOMKilled", 137), _fake_pod(1, "OOMKilled", 137),
            _fake_pod(3, "Error", 1)]
    seen: dict[str, str] = {}

    def list_pods(namespace: str, label_selector: str) -> Any:
        seen.update(namespace=namespace, selector=label_selector)
        return Ns(items=pods)

    op = Ns(_get_ti_pod_labels=lambda ctx, include_try_number: {"dag_id": "d", "task_id": "t"},
            client=Ns(list_namespaced_pod=list_pods), namespace=None,
            container_resources=Ns(requests={"memory": "1Gi"}, limits={"memory": "1Gi"}))
    tries = helpers["_couler_pod_tries"](op, {})
    assert tries == [("OOMKilled", 137, "pod-1"), ("OOMKilled", 137, "pod-2"),
                     ("Error", 1, "pod-3")]
    assert seen == {"namespace": "default", "selector": "dag_id=d,task_id=t"}
    helpers["_couler_escalate"](op, {}, {"factor": 2.0, "ceiling": "3Gi"})
    # two OOM kills: 1Gi * 2**2 = 4Gi, capped at the ceiling
    assert op.container_resources.limits == {"memory": str(3 * 2**30)}
    assert op.container_resources.requests == {"memory": str(3 * 2**30)}
    pods[:] = [_fake_pod(1, "Error", 1)]
    op.container_resources = Ns(requests=None, limits={"memory": "1Gi"})
    helpers["_couler_escalate"](op, {}, {"factor": 2.0, "ceiling": ""})
    assert op.container_resources.limits == {"memory": "1Gi"}  # no OOM: unchanged


def test_subworkflow_reference_triggers_the_dag() -> None:
    prep = S("prep", ctr("echo", args=("x",)),
             outputs=(ir.OutputParameter("out", ir.OutputSource.STDOUT),))
    child = S("child", ir.SubWorkflowSpec("other-flow"), dependencies=(ir.Dependency("prep"),),
              inputs=(ir.InputParameter("size", ir.StepOutputRef("prep", "out")),),
              retry=ir.RetryPolicy(1))
    after = S("after", ctr("true"), dependencies=(ir.Dependency("child"),))
    dag = compile_ok(wf_of(prep, child, after))
    kw = dag.tasks["child"].kwargs
    assert dag.tasks["child"].fn == "_CoulerTrigger"
    assert kw["trigger_dag_id"] == "'other-flow'" and kw["wait_for_completion"] == "True"
    assert kw["couler_xcoms"] == "{'x0': t['prep']['out']}" and kw["retries"] == "1"
    assert dag.steps["child"]["inputs"] == {"size": {"xcom": "x0"}}
    assert ("child", "after") in dag.edges
    assert "class _CoulerTrigger(TriggerDagRunOperator)" in dag.source
    assert "class _CoulerPod" not in dag.source
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(S("c", ir.SubWorkflowSpec("other"), outputs=(
            ir.OutputParameter("o", selector="/tmp/o"),))))
    assert err.value.step == "c" and Feature.SUBWORKFLOW_REF.value in str(err.value)


# --------------------------------------------------------------------------- job steps


def _job_helpers() -> dict[str, Any]:
    runtime = airflow._RUNTIME  # _couler_text comes from the step runner
    text = runtime[runtime.index("def _couler_text"):runtime.index("def _couler_value")]
    namespace: dict[str, Any] = {"re": __import__("re"), "json": json, "Any": Any,
                                 "_KINDS": {}}
    exec(text + JOB_RUNTIME, namespace)
    return namespace


JOB = {"metadata": {"name": "train-x7", "uid": "u-1", "labels": {"team": "ml"}},
       "status": {"succeeded": 2, "failed": 0, "phase": "Running",
                  "conditions": [{"type": "Complete"}]}}


@pytest.mark.parametrize(("condition", "holds"), [
    ("status.succeeded > 0", True),
    ("status.succeeded > 2", False),
    ("status.failed > 3", False),
    ("status.succeeded > 0,status.phase == Running", True),
    ("status.succeeded > 0, status.phase != Running", False),
    ("status.phase in (Running, Succeeded)", True),
    ("status.phase notin (Running, Succeeded)", False),
    ("status.phase = Running", True),
    ("status.conditions.0.type == Complete", True),
    ("metadata.labels.team", True),
    ("!metadata.deletionTimestamp", True),
    ("!metadata.labels", False),
    ("status.missing > 0", False),
])
def test_job_conditions_follow_argo(condition: str, holds: bool) -> None:
    assert _job_helpers()["_couler_k8s_holds"](condition, JOB) is holds


def test_job_outputs_are_fields_of_the_resource() -> None:
    wf = capture_program(str(ROOT / "tests" / "conformance" / "programs" / "job_step.py"))[0]
    dag = compile_ok(wf)
    spec = dag.steps["k8s-job"]
    assert spec["kind"] == "job" and spec["failure"] == "status.failed > 3"
    assert spec["fields"] == {"job-name": "metadata.name", "job-id": "metadata.uid",
                              "job-obj": ""}
    outputs = _job_helpers()["_couler_job_outputs"](spec, JOB)
    assert outputs["job-name"] == "train-x7" and outputs["job-id"] == "u-1"
    assert json.loads(outputs["job-obj"]) == JOB
    bad = S("j", ir.JobSpec.of({"apiVersion": "v1", "kind": "ConfigMap"}), outputs=(
        ir.OutputParameter("x", ir.OutputSource.JQ, ".items[] | .name"),))
    with pytest.raises(UnsupportedFeatureError) as err:
        airflow.compile_workflow(wf_of(bad))
    assert err.value.step == "j" and "field paths" in str(err.value)


def test_a_map_steps_artifacts_are_kept_per_item_and_not_read_back() -> None:
    mapped = S("m", ctr("true"), output_artifacts=(ir.OutputArtifact("x", "/tmp/x"),),
               foreach=ir.ForEach(items=(L("a"), L("b"))))
    dag = compile_ok(wf_of(mapped))
    assert dag.steps["m"]["output_artifacts"][0]["to"] == {"key": "m/x", "per_item": True}
    reader = S("r", ctr("true"), dependencies=(ir.Dependency("m"),), input_artifacts=(
        ir.InputArtifact("x", "/tmp/x", ir.StepArtifactRef("m", "x")),))
    with pytest.raises(UnsupportedFeatureError, match="a map step's: each item keeps its own"):
        airflow.compile_workflow(ir.Workflow("w", (mapped, reader)))
    pinned = S("p", ctr("true"), foreach=ir.ForEach(items=(L("a"), L("b"))),
               output_artifacts=(ir.OutputArtifact("x", "/tmp/x", location=ir.ArtifactLocation(
                   ir.StorageKind.S3, bucket="b", key="k")),))
    with pytest.raises(UnsupportedFeatureError, match="has its own location"):
        airflow.compile_workflow(ir.Workflow("w", (pinned,)))


def _pod_runtime(names: str) -> dict[str, Any]:
    """The pod runtime's functions from ``names``'s first definition to ``class _Couler``."""
    source = POD_RUNTIME[POD_RUNTIME.index(names):POD_RUNTIME.index("class _Couler")]
    namespace: dict[str, Any] = {"json": json, "os": os, "shlex": shlex, "Any": Any}
    exec(source, namespace)
    return namespace


def test_a_pod_steps_artifacts_are_copied_through_the_claim(tmp_path: Path) -> None:
    """The wrapper (run here with sh) copies the inputs from the claim's RUN_ID directory,
    runs the command, and copies the outputs back in the workers' layout."""
    wrapper = _pod_runtime("ARTIFACT_CLAIM_VARIABLE = ")["_couler_artifact_wrapper"]
    run = tmp_path / "claim" / "run-1"
    (run / "prep" / "data").mkdir(parents=True)
    (run / "prep" / "data" / "t.csv").write_text("a,b\n")
    spec = {"input_artifacts": [{"name": "data", "path": str(tmp_path / "in" / "data"),
                                 "from": {"key": "prep/data"}}],
            "output_artifacts": [{"name": "model", "path": str(tmp_path / "out" / "m.txt"),
                                  "to": {"key": "train/model"}}]}
    script = wrapper("train", spec, str(run))
    command = f'mkdir -p {tmp_path}/out && wc -l < {tmp_path}/in/data/t.csv > {tmp_path}/out/m.txt'
    proc = subprocess.run(["sh", "-c", script, "couler", "sh", "-c", command],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (run / "train" / "model").read_text().strip() == "1"
    # a missing input fails before the command, naming it; a failed command stores nothing
    (run / "train" / "model").unlink()
    spec["input_artifacts"][0]["from"] = {"key": "nowhere/data"}
    proc = subprocess.run(["sh", "-c", wrapper("train", spec, str(run)), "couler", "true"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "input artifact data is missing" in proc.stderr
    spec["input_artifacts"] = []
    proc = subprocess.run(["sh", "-c", wrapper("train", spec, str(run)), "couler", "sh", "-c",
                           "exit 3"], capture_output=True, text=True, check=False)
    assert proc.returncode == 3 and not (run / "train" / "model").exists()


def test_a_pod_step_with_artifacts_compiles_and_own_locations_are_refused() -> None:
    prep = S("prep", ctr("true"), output_artifacts=(ir.OutputArtifact("data", "/tmp/d"),))
    train = S("train", ctr("true"), dependencies=(ir.Dependency("prep"),),
              resources=ir.Resources(memory_limit="2Gi", gpu=1),
              input_artifacts=(ir.InputArtifact("data", "/in", ir.StepArtifactRef("prep",
                                                                                   "data")),),
              output_artifacts=(ir.OutputArtifact("model", "/tmp/m"),))
    dag = compile_ok(wf_of(prep, train))
    assert dag.steps["train"]["input_artifacts"][0]["from"] == {"key": "prep/data"}
    assert dag.steps["train"]["output_artifacts"][0]["to"] == {"key": "train/model"}
    assert "_CoulerPod(" in dag.source
    pinned = S("train", ctr("true"), resources=ir.Resources(memory_limit="2Gi"),
               output_artifacts=(ir.OutputArtifact("m", "/tmp/m", ir.ArtifactLocation(
                   ir.StorageKind.S3, bucket="b", key="k")),))
    with pytest.raises(UnsupportedFeatureError, match="writes artifacts to the artifact "
                                                      "store's claim only"):
        airflow.compile_workflow(wf_of(pinned))
