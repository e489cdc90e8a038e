"""The Ray executor runs real workflows as Ray tasks, with the local engine's results.

Run only by tests/ray_engine/run_in_netns.sh (Ray venv, private network namespace).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from couler import ir
from couler.engines.base import Feature, RunState, RunStatus, StepState, StepStatus
from couler.errors import UnsupportedFeatureError
from couler.optimize import DEFAULT_RETRY
from couler_runtime.local import LocalEngine
from couler_runtime.ray import CAPABILITIES, RayExecutor
from couler_runtime.ray.executor import RetryAttempt, task_options

STDOUT = (ir.OutputParameter("result", ir.OutputSource.STDOUT),)
LIST_STDOUT = (ir.OutputParameter("result", ir.OutputSource.STDOUT, type=ir.ValueType.LIST),)


def script(name: str, source: str, **kw: object) -> ir.Step:
    kw.setdefault("outputs", STDOUT)
    return ir.Step(name=name, body=ir.ScriptSpec(image="python:3.12", source=source),
                   **kw)  # type: ignore[arg-type]


def container(name: str, *argv: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="alpine", command=(argv[0],), args=tuple(argv[1:]))
    return ir.Step(name=name, body=body, **kw)  # type: ignore[arg-type]


def after(*names: str, cond: ir.EdgeCondition = ir.EdgeCondition.SUCCEEDED
          ) -> tuple[ir.Dependency, ...]:
    return tuple(ir.Dependency(n, cond) for n in names)


def inp(name: str, step: str, output: str = "result") -> ir.InputParameter:
    return ir.InputParameter(name, ir.StepOutputRef(step, output))


def wf(name: str, *steps: ir.Step, **kw: object) -> ir.Workflow:
    return ir.Workflow(name=name, steps=steps, **kw)  # type: ignore[arg-type]


def by_key(status: RunStatus, step: str, key: str = "") -> StepStatus:
    return next(s for s in status.steps if s.step == step and s.key == key)


def summary(status: RunStatus) -> dict[tuple[str, str], tuple[str, dict[str, str]]]:
    return {(s.step, s.key): (s.state.value, dict(s.outputs)) for s in status.steps}


@pytest.fixture
def ray_exec(tmp_path: Path) -> RayExecutor:
    return RayExecutor(tmp_path / "ray-runs")


# --------------------------------------------------------------------------- workflows


def diamond() -> ir.Workflow:
    a = script("a", "print(5)")
    b = ir.Step(name="b", body=ir.ScriptSpec(
        image="python:3.12", source="import sys; print(int(sys.argv[1]) + 1)",
        args=("{{inputs.x}}",)), inputs=(inp("x", "a"),), outputs=STDOUT,
        dependencies=after("a"))
    c = container("c", sys.executable, "-c", "import sys; print(int(sys.argv[1]) * 2)",
                  "{{inputs.x}}", inputs=(inp("x", "a"),), outputs=STDOUT,
                  dependencies=after("a"))
    d = container("d", "sh", "-c", "echo $(( {{inputs.l}} + {{inputs.r}} ))",
                  inputs=(inp("l", "b"), inp("r", "c")), outputs=STDOUT,
                  dependencies=after("b", "c"))
    return wf("diamond", a, b, c, d)


def script_to_container() -> ir.Workflow:
    produce = script("produce", "print('hello 42')")
    write = container(
        "write", "sh", "-c", "echo -n {{inputs.msg}} > /tmp/out.txt",
        inputs=(inp("msg", "produce"),),
        outputs=(ir.OutputParameter("copy", ir.OutputSource.PATH, "/tmp/out.txt"),),
        dependencies=after("produce"))
    return wf("pass", produce, write)


def static_map() -> ir.Workflow:
    each = container("each", "sh", "-c", "echo item-{{item}}", outputs=STDOUT,
                     foreach=ir.ForEach(items=tuple(ir.Literal.of(i) for i in (1, 2, 3))))
    total = container("total", "echo", "{{inputs.all}}", inputs=(inp("all", "each"),),
                      outputs=STDOUT, dependencies=after("each"))
    return wf("static-map", each, total)


def dynamic_map() -> ir.Workflow:
    gen = script("gen", "import json; print(json.dumps([{'n': 1}, {'n': 10}, {'n': 100}]))",
                 outputs=LIST_STDOUT)
    each = container("each", "sh", "-c", "echo $(( {{item.n}} * 3 ))", outputs=STDOUT,
                     foreach=ir.ForEach(source=ir.StepOutputRef("gen", "result"),
                                        parallelism=2),
                     dependencies=after("gen"))
    return wf("dynamic-map", gen, each)


def when_else() -> ir.Workflow:
    flip = script("flip", "print('heads')")
    cond = ir.Condition(ir.StepOutputRef("flip", "result"), ir.CompareOp.EQ,
                        ir.Literal.of("heads"))
    heads = container("heads", "echo", "it was heads", outputs=STDOUT,
                      when=ir.When(cond), dependencies=after("flip"))
    tails = container("tails", "echo", "it was tails", outputs=STDOUT,
                      when=ir.When(cond, expect=False), dependencies=after("flip"))
    # A skipped upstream still satisfies a "succeeded" edge (local engine rule).
    join = container("join", "echo", "joined", outputs=STDOUT, dependencies=after("tails"))
    return wf("when-else", flip, heads, tails, join)


def edges_and_hooks() -> ir.Workflow:
    bad = container("bad", "sh", "-c", "exit 3")
    cleanup = container("cleanup", "echo", "cleaned", outputs=STDOUT,
                        dependencies=after("bad", cond=ir.EdgeCondition.FAILED))
    never = container("never", "echo", "no", outputs=STDOUT, dependencies=after("bad"))
    # never ran because "never" did not: does not run either (Argo's Omitted)
    nor = container("nor", "echo", "no", outputs=STDOUT, dependencies=after("never"))
    hook = container("notify", "echo", "run failed", outputs=STDOUT)
    unfired = container("celebrate", "echo", "yay", outputs=STDOUT)
    return wf("edges", bad, cleanup, never, nor,
              exit_hooks=(ir.ExitHook(ir.RunStatus.FAILED, (hook,)),
                          ir.ExitHook(ir.RunStatus.SUCCEEDED, (unfired,))))


def counting_loop(tmp: Path) -> ir.Workflow:
    counter = tmp / "loop-count"
    src = (f"from pathlib import Path\np = Path({str(counter)!r})\n"
           "n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\nprint(n)")
    step = script("count", src, loop=ir.Loop(
        ir.Condition(ir.StepOutputRef("count", "result"), ir.CompareOp.LT, ir.Literal.of(3)),
        max_iterations=10))
    return wf("loop", step)


# --------------------------------------------------------------------------- checks


def test_capabilities_cover_every_feature() -> None:
    assert set(CAPABILITIES) == set(Feature)


def test_diamond_passes_real_outputs_downstream(ray_exec: RayExecutor) -> None:
    status = ray_exec.run(diamond())
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "a").outputs == {"result": "5"}
    assert by_key(status, "b").outputs == {"result": "6"}
    assert by_key(status, "c").outputs == {"result": "10"}
    assert by_key(status, "d").outputs == {"result": "16"}
    b, c, d = (by_key(status, n) for n in "bcd")
    assert d.started_at is not None and b.finished_at is not None and c.finished_at is not None
    assert d.started_at >= max(b.finished_at, c.finished_at) - 0.01
    record = json.loads((ray_exec.work_dir / status.run_id / "run.json").read_text())
    assert record["state"] == "succeeded" and record["engine"] == "ray"


def test_script_output_feeds_container_step(ray_exec: RayExecutor) -> None:
    status = ray_exec.run(script_to_container())
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "write").outputs == {"copy": "hello 42"}
    run_dir = ray_exec.work_dir / status.run_id
    assert (run_dir / "steps/write/main/root/tmp/out.txt").read_text() == "hello 42"


def test_map_over_static_items(ray_exec: RayExecutor) -> None:
    status = ray_exec.run(static_map())
    assert status.state is RunState.SUCCEEDED, status
    assert [by_key(status, "each", str(i)).outputs["result"] for i in range(3)] == [
        "item-1", "item-2", "item-3"]
    assert json.loads(by_key(status, "each").outputs["result"]) == ["item-1", "item-2",
                                                                    "item-3"]
    assert by_key(status, "total").outputs["result"] == '["item-1", "item-2", "item-3"]'


def test_map_over_upstream_json_list(ray_exec: RayExecutor) -> None:
    status = ray_exec.run(dynamic_map())
    assert status.state is RunState.SUCCEEDED, status
    assert json.loads(by_key(status, "each").outputs["result"]) == ["3", "30", "300"]
    assert {s.key for s in status.steps if s.step == "each"} == {"", "0", "1", "2"}


def test_map_over_a_non_list_fails_the_step(ray_exec: RayExecutor) -> None:
    gen = script("gen", "print('not a list')", outputs=LIST_STDOUT)  # declared a list, is not
    each = container("each", "echo", "{{item}}", dependencies=after("gen"),
                     foreach=ir.ForEach(source=ir.StepOutputRef("gen", "result")))
    status = ray_exec.run(wf("bad-map", gen, each))
    assert status.state is RunState.FAILED
    assert "expected a JSON list" in by_key(status, "each").message


def test_when_and_else(ray_exec: RayExecutor) -> None:
    status = ray_exec.run(when_else())
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "heads").outputs == {"result": "it was heads"}
    assert by_key(status, "tails").state is StepState.SKIPPED
    assert "when condition" in by_key(status, "tails").message
    assert by_key(status, "join").state is StepState.SUCCEEDED


def test_edge_condition_and_exit_hook(ray_exec: RayExecutor) -> None:
    status = ray_exec.run(edges_and_hooks())
    assert status.state is RunState.FAILED
    bad = by_key(status, "bad")
    assert bad.state is StepState.FAILED and bad.exit_code == 3
    assert by_key(status, "cleanup").outputs == {"result": "cleaned"}
    assert by_key(status, "never").state is StepState.SKIPPED
    assert by_key(status, "nor").state is StepState.SKIPPED and by_key(status, "nor").attempts == 0
    assert by_key(status, "notify").outputs == {"result": "run failed"}
    celebrate = by_key(status, "celebrate")
    assert celebrate.state is StepState.SKIPPED
    assert celebrate.message == "exit hook on succeeded did not fire: the run failed"


def test_retry_fails_twice_then_succeeds(ray_exec: RayExecutor, tmp_path: Path) -> None:
    counter = tmp_path / "attempts"
    src = (f"from pathlib import Path\np = Path({str(counter)!r})\n"
           "n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\n"
           "print(n)\nraise SystemExit(0 if n >= 3 else 1)")
    step = script("flaky", src, retry=ir.RetryPolicy(
        limit=3, backoff=ir.Backoff(base_seconds=0.1, factor=2.0)))
    assert task_options(step, wf("x", step))["max_retries"] == 3
    assert task_options(step, wf("x", step))["retry_exceptions"] == [RetryAttempt]
    status = ray_exec.run(wf("retry", step))
    assert status.state is RunState.SUCCEEDED, status
    flaky = by_key(status, "flaky")
    assert flaky.attempts == 3
    assert flaky.outputs == {"result": "3"}
    assert counter.read_text() == "3"


def test_retry_limit_exhausted_and_unretried_class(ray_exec: RayExecutor) -> None:
    always = container("always", "sh", "-c", "exit 1", retry=ir.RetryPolicy(limit=1))
    oom_only = container("oom-only", "sh", "-c", "exit 1",
                         retry=ir.RetryPolicy(limit=2, on=(ir.FailureClass.OOM,)))
    status = ray_exec.run(wf("retry-fail", always, oom_only))
    assert status.state is RunState.FAILED
    assert by_key(status, "always").attempts == 2
    assert by_key(status, "always").state is StepState.FAILED
    assert by_key(status, "oom-only").attempts == 1  # transient is not retried by this policy


def test_failure_classes_decide_retries(ray_exec: RayExecutor) -> None:
    # A Python ValueError is a user error: the default policy does not retry it.
    bug = script("bug", "raise ValueError('bad input')", retry=DEFAULT_RETRY)
    # The same exit and error on two Ray task attempts (the earlier attempts are kept
    # across Ray's retries): the second is a user error, no third attempt.
    repeat = container("repeat", "sh", "-c", "echo broken >&2; exit 3",
                       retry=ir.RetryPolicy(limit=4, on=(ir.FailureClass.TRANSIENT,)))
    status = ray_exec.run(wf("classes", bug, repeat))
    assert status.state is RunState.FAILED
    got = by_key(status, "bug")
    assert got.attempts == 1 and got.failure == "user"
    assert got.failure_reason.startswith("user error: Python ValueError in the traceback")
    again = by_key(status, "repeat")
    assert again.attempts == 2 and again.failure == "user"
    assert "same exit code 3 and error twice" in again.failure_reason


def test_loop_runs_until_condition(ray_exec: RayExecutor, tmp_path: Path) -> None:
    status = ray_exec.run(counting_loop(tmp_path))
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "count").outputs == {"result": "3"}
    assert {s.key for s in status.steps if s.step == "count"} == {"", "0", "1", "2"}


def test_resources_mapped_and_checked(ray_exec: RayExecutor) -> None:
    one = container("one-cpu", "echo", "ok", outputs=STDOUT,
                    resources=ir.Resources(cpu_request="1", memory_request="64Mi"))
    opts = task_options(one, wf("x", one))
    assert opts["num_cpus"] == 1.0 and opts["memory"] == 64 * 2**20
    half = container("half", "echo", "ok", resources=ir.Resources(cpu_request="500m"))
    assert task_options(half, wf("x", half))["num_cpus"] == 0.5
    status = ray_exec.run(wf("one", one))
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "one-cpu").outputs == {"result": "ok"}

    big = container("big", "echo", "never", resources=ir.Resources(cpu_request="64"))
    downstream = container("after-big", "echo", "x", dependencies=after("big"))
    status = ray_exec.run(wf("too-big", big, downstream))
    assert status.state is RunState.FAILED
    rec = by_key(status, "big")
    assert rec.state is StepState.FAILED
    # refused before submission (a task Ray cannot place would wait forever)
    assert "requests 64 CPUs but the Ray cluster has 2" in rec.message
    assert by_key(status, "after-big").state is StepState.SKIPPED


def test_timeout_kills_the_step(ray_exec: RayExecutor, tmp_path: Path) -> None:
    end = tmp_path / "reached-the-end"
    slow = container("slow", "sh", "-c", f"sleep 20; touch {end}", timeout_seconds=1)
    status = ray_exec.run(wf("timeout", slow))
    assert status.state is RunState.FAILED
    assert "timed out after 1 s" in by_key(status, "slow").message
    assert not end.exists()  # killed at its timeout: the run did not wait for its end


def test_secrets_resolved_from_the_executor(tmp_path: Path) -> None:
    step = container("show", "sh", "-c", "echo $PW", outputs=STDOUT,
                     env=(ir.EnvVar("PW", secret=ir.SecretRef("db", "password")),))
    status = RayExecutor(tmp_path / "runs", secrets={("db", "password"): "s3cret"}).run(
        wf("secret", step))
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "show").outputs == {"result": "s3cret"}


def test_unsupported_feature_rejected(ray_exec: RayExecutor) -> None:
    step = container("daemon", "true", daemon=True)
    with pytest.raises(UnsupportedFeatureError, match=r"'daemon'.*daemon"):
        ray_exec.run(wf("d", step))


@pytest.mark.parametrize("build", [diamond, script_to_container, static_map, dynamic_map,
                                   when_else, edges_and_hooks])
def test_same_outputs_as_local_engine(build: object, ray_exec: RayExecutor,
                                      tmp_path: Path) -> None:
    workflow = build()  # type: ignore[operator]
    local = LocalEngine(tmp_path / "local-runs").run(workflow)
    remote = ray_exec.run(workflow)
    assert remote.state is local.state
    assert summary(remote) == summary(local)


def test_running_steps_are_sampled_in_their_task(tmp_path: Path) -> None:
    from couler.engines.base import StepSample

    executor = RayExecutor(tmp_path / "ray-runs", series_seconds=0.25)
    samples: list[StepSample] = []
    order: list[object] = []

    def on_sample(s: StepSample) -> None:
        samples.append(s)
        order.append(s)

    # Burns one second of CPU (however long that takes on a busy machine).
    busy = script("busy", "import time\nwhile time.process_time() < 1.0:\n"
                          "    sum(range(10000))\nprint(time.process_time())")
    status = executor.run(wf("sampled", busy), on_event=order.append, on_sample=on_sample)
    assert status.state is RunState.SUCCEEDED, status.message
    assert len(samples) > 1, samples  # a series while the task ran
    assert all((s.step, s.key, s.attempt) == ("busy", "", 1) for s in samples)
    assert all(s.memory_bytes > 0 and s.interval_seconds > 0 for s in samples), samples
    used = float(by_key(status, "busy").outputs["result"])
    cpu_seconds = sum(s.cpu * s.interval_seconds for s in samples)
    assert used * 0.8 <= cpu_seconds <= used * 1.5 + 0.3, (used, samples)
    end = next(i for i, s in enumerate(order) if isinstance(s, StepStatus)
               and s.state is StepState.SUCCEEDED)
    assert all(not isinstance(s, StepSample) for s in order[end:])  # before the step's end
    # Nobody asked for samples: the tasks write none.
    quiet = RayExecutor(tmp_path / "quiet-runs").run(wf("quiet", busy))
    assert quiet.state is RunState.SUCCEEDED
    assert not list((tmp_path / "quiet-runs").glob("*/samples.jsonl"))


TRIAL = r'''
import os, sys, time
from couler_runtime.tune import report
x = float(sys.argv[1])
for epoch in range(5):
    report(epoch, x)
    time.sleep(0.05)
print(-(x - 0.25) ** 2)
'''


def test_a_tune_step_drives_its_study_in_a_task(ray_exec: RayExecutor, tmp_path: Path) -> None:
    import optuna

    trial = ir.Step(
        "fit", ir.ScriptSpec("python:3.12", TRIAL, args=("{{item.x}}",)),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT, type=ir.ValueType.FLOAT),),
        tune=ir.Tune(space=(ir.TuneParam("x", ir.TuneKind.UNIFORM, 0.0, 1.0),),
                     objective="result", trials=4, parallel=2, seed=4,
                     pruner=ir.TunePruner.NONE))
    use = ir.Step(name="use", body=ir.ScriptSpec(image="python:3.12", source="import sys; "
                                                 "print(sys.argv[1])", args=("{{inputs.x}}",)),
                  inputs=(inp("x", "fit", "x"),), outputs=STDOUT, dependencies=after("fit"))
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    status = RayExecutor(tmp_path / "runs", tune_storage=storage).run(wf("ray-tune", trial, use))
    assert status.state is RunState.SUCCEEDED, status.message
    trials = [s for s in status.steps if s.step == "fit" and s.key]
    assert len(trials) == 4 and all(s.state is StepState.SUCCEEDED for s in trials)
    name = optuna.get_all_study_names(storage)[0]
    study = optuna.load_study(study_name=name, storage=storage)
    values = [t.value for t in study.trials if t.state is optuna.trial.TrialState.COMPLETE]
    best = by_key(status, "fit")
    assert len(values) == 4 and float(best.outputs["best_value"]) == max(values)
    assert by_key(status, "use").outputs["result"] == best.outputs["x"]
    assert task_options(trial, wf("w", trial))["max_retries"] == 0
