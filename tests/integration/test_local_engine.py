"""The local engine runs real workflows as real processes on this machine."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from couler import ir
from couler.api.capture import capture_program
from couler.engines.base import Feature, RunState, StepState, StepStatus, Support
from couler.errors import UnsupportedFeatureError
from couler_runtime.local import CAPABILITIES, LocalEngine

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "programs"
PY = sys.executable


def script(name: str, source: str, **kw: object) -> ir.Step:
    kw.setdefault("outputs", (ir.OutputParameter("result", ir.OutputSource.STDOUT),))
    return ir.Step(name=name, body=ir.ScriptSpec(image="python:3.12", source=source),
                   **kw)  # type: ignore[arg-type]


def container(name: str, *argv: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="alpine", command=(argv[0],), args=tuple(argv[1:]))
    return ir.Step(name=name, body=body, **kw)  # type: ignore[arg-type]


def after(*names: str, cond: ir.EdgeCondition = ir.EdgeCondition.SUCCEEDED
          ) -> tuple[ir.Dependency, ...]:
    return tuple(ir.Dependency(n, cond) for n in names)


def wf(name: str, *steps: ir.Step, **kw: object) -> ir.Workflow:
    return ir.Workflow(name=name, steps=steps, **kw)  # type: ignore[arg-type]


def by_key(status: object, step: str, key: str = "") -> StepStatus:
    return next(s for s in status.steps if s.step == step and s.key == key)  # type: ignore[attr-defined]


@pytest.fixture
def engine(tmp_path: Path) -> LocalEngine:
    return LocalEngine(tmp_path / "runs", max_workers=4)


def test_capabilities_cover_every_feature() -> None:
    assert set(CAPABILITIES) == set(Feature)
    assert CAPABILITIES[Feature.JOB].support is Support.UNSUPPORTED
    assert CAPABILITIES[Feature.GPU].support is Support.UNSUPPORTED
    assert CAPABILITIES[Feature.CRON].support is Support.UNSUPPORTED
    assert CAPABILITIES[Feature.NODE_SELECTOR].note == "ignored on one machine"


def test_unsupported_feature_rejected(engine: LocalEngine) -> None:
    step = container("train", "true", resources=ir.Resources(gpu=1))
    with pytest.raises(UnsupportedFeatureError, match=r"'train'.*GPU"):
        engine.run(wf("gpu", step))


def test_script_output_feeds_container_args_and_path_outputs(engine: LocalEngine) -> None:
    produce = script("produce", "print('hello 42')")
    write = container(
        "write", "sh", "-c", "echo -n {{inputs.msg}} > /tmp/out.txt",
        inputs=(ir.InputParameter("msg", ir.StepOutputRef("produce", "result")),),
        outputs=(ir.OutputParameter("copy", ir.OutputSource.PATH, "/tmp/out.txt"),),
        dependencies=after("produce"))
    status = engine.run(wf("pass", produce, write))
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "write").outputs == {"copy": "hello 42"}
    assert by_key(status, "produce").exit_code == 0
    run_dir = engine.work_dir / status.run_id
    assert (run_dir / "steps/write/main/root/tmp/out.txt").read_text() == "hello 42"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded"


def test_diamond_runs_middle_steps_in_parallel(engine: LocalEngine) -> None:
    nap = "import time; time.sleep(0.8)"
    status = engine.run(wf(
        "diamond", script("a", "pass"),
        script("b", nap, dependencies=after("a")), script("c", nap, dependencies=after("a")),
        script("d", "pass", dependencies=after("b", "c"))))
    assert status.state is RunState.SUCCEEDED
    b, c, d = (by_key(status, n) for n in "bcd")
    assert b.started_at and c.started_at and b.finished_at and c.finished_at and d.started_at
    assert b.started_at < c.finished_at and c.started_at < b.finished_at  # overlapped
    assert d.started_at >= max(b.finished_at, c.finished_at)


def test_when_and_else(engine: LocalEngine) -> None:
    cond = ir.Condition(ir.StepOutputRef("flip", "result"), ir.CompareOp.EQ,
                        ir.Literal.of("heads"))
    status = engine.run(wf(
        "coin", script("flip", "print('heads')"),
        container("heads", "echo", "H", dependencies=after("flip"), when=ir.When(cond)),
        container("tails", "echo", "T", dependencies=after("flip"),
                  when=ir.When(cond, expect=False)),
        container("after-tails", "echo", "x", dependencies=after("tails"))))
    assert status.state is RunState.SUCCEEDED
    assert by_key(status, "heads").state is StepState.SUCCEEDED
    assert by_key(status, "tails").state is StepState.SKIPPED
    # SUCCEEDED edges are satisfied by a skipped upstream.
    assert by_key(status, "after-tails").state is StepState.SUCCEEDED


def test_when_compares_numbers_numerically(engine: LocalEngine) -> None:
    cond = ir.Condition(ir.StepOutputRef("n", "result"), ir.CompareOp.GT, ir.Literal.of(9))
    status = engine.run(wf("num", script("n", "print(10)"),
                           container("big", "true", dependencies=after("n"), when=ir.When(cond))))
    assert by_key(status, "big").state is StepState.SUCCEEDED  # "10" > "9" as strings is False


def test_failed_edge_and_depends_expression(engine: LocalEngine) -> None:
    status = engine.run(wf(
        "edges", container("bad", "false"), container("good", "true"),
        container("on-fail", "true", dependencies=after("bad", cond=ir.EdgeCondition.FAILED)),
        container("on-ok", "true", dependencies=after("bad")),
        container("expr", "true", dependencies=after("good", "bad"), depends=ir.DependsAll((
            ir.DependsTerm("good"), ir.DependsNot(ir.DependsTerm("bad"))))),
        container("expr2", "true", dependencies=after("good", "bad"), depends=ir.DependsAny((
            ir.DependsTerm("bad"), ir.DependsTerm("good", ir.EdgeCondition.FAILED))))))
    assert status.state is RunState.FAILED
    assert by_key(status, "on-fail").state is StepState.SUCCEEDED
    assert by_key(status, "on-ok").state is StepState.SKIPPED
    assert by_key(status, "expr").state is StepState.SUCCEEDED
    assert by_key(status, "expr2").state is StepState.SKIPPED


@pytest.mark.parametrize("parallelism", [1, 3])
def test_map_static_items(engine: LocalEngine, parallelism: int) -> None:
    step = script("sq", "import sys, time; time.sleep(0.3); print(int(sys.argv[1]) ** 2)",
                  foreach=ir.ForEach(items=tuple(ir.Literal.of(i) for i in (1, 2, 3)),
                                     parallelism=parallelism),
                  inputs=(ir.InputParameter("n", ir.ItemRef()),))
    step = ir.Step(**{**{f: getattr(step, f) for f in step.__slots__},  # type: ignore[arg-type]
                      "body": ir.ScriptSpec(image="py", source=step.body.source,  # type: ignore[union-attr]
                                            args=("{{inputs.n}}",))})
    status = engine.run(wf("map", step))
    assert status.state is RunState.SUCCEEDED
    assert json.loads(by_key(status, "sq").outputs["result"]) == ["1", "4", "9"]
    items = [by_key(status, "sq", str(i)) for i in range(3)]
    spans = [(i.started_at or 0, i.finished_at or 0) for i in items]
    overlaps = sum(1 for a in spans for b in spans if a != b and a[0] < b[1] and b[0] < a[1])
    if parallelism == 1:
        assert overlaps == 0
    else:
        assert overlaps > 0


def test_map_over_upstream_json_list(engine: LocalEngine) -> None:
    status = engine.run(wf(
        "map-up",
        script("list", "import json; print(json.dumps([{'k': 'x'}, {'k': 'y'}]))",
               outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT,
                                           type=ir.ValueType.LIST),)),
        container("use", "echo", "got-{{item.k}}", dependencies=after("list"),
                  foreach=ir.ForEach(source=ir.StepOutputRef("list", "result"), parallelism=2),
                  outputs=(ir.OutputParameter("out", ir.OutputSource.STDOUT),))))
    assert status.state is RunState.SUCCEEDED
    assert json.loads(by_key(status, "use").outputs["out"]) == ["got-x", "got-y"]


def test_loop_until_condition(engine: LocalEngine, tmp_path: Path) -> None:
    counter = tmp_path / "count"
    source = (f"import pathlib; p = pathlib.Path({str(counter)!r}); "
              "n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n)); print(n)")
    cond = ir.Condition(ir.StepOutputRef("inc", "result"), ir.CompareOp.LT, ir.Literal.of(3))
    status = engine.run(wf("loop", script("inc", source, loop=ir.Loop(cond, max_iterations=10))))
    assert status.state is RunState.SUCCEEDED
    assert counter.read_text() == "3"
    assert by_key(status, "inc").outputs["result"] == "3"
    assert [s.key for s in status.steps if s.step == "inc" and s.key] == ["0", "1", "2"]
    # Bounded: a condition that always holds stops at max_iterations.
    always = ir.Condition(ir.Literal.of(1), ir.CompareOp.EQ, ir.Literal.of(1))
    status = engine.run(wf("loop2", script("inc", source, loop=ir.Loop(always, 2))))
    assert counter.read_text() == "5"


@pytest.mark.parametrize(("command", "expected"), [("true", "celebrate"), ("false", "mourn")])
def test_exit_hooks(engine: LocalEngine, command: str, expected: str) -> None:
    hooks = (ir.ExitHook(ir.RunStatus.SUCCEEDED, (container("celebrate", "echo", "ok"),)),
             ir.ExitHook(ir.RunStatus.FAILED, (container("mourn", "echo", "bad"),)),
             ir.ExitHook(ir.RunStatus.ANY, (container("always", "echo", "done"),)))
    status = engine.run(wf("hooks", container("main", command), exit_hooks=hooks))
    ran = {s.step for s in status.steps if s.state is StepState.SUCCEEDED}
    assert expected in ran and "always" in ran
    assert ({"celebrate", "mourn"} - {expected}).isdisjoint(ran)
    assert status.state is (RunState.SUCCEEDED if command == "true" else RunState.FAILED)


def test_retry_until_success(engine: LocalEngine, tmp_path: Path) -> None:
    counter = tmp_path / "tries"
    source = (f"import pathlib, sys; p = pathlib.Path({str(counter)!r}); "
              "n = len(p.read_text()) if p.exists() else 0; p.write_text('x' * (n + 1)); "
              "sys.exit(0 if n >= 2 else 3)")
    policy = ir.RetryPolicy(limit=4, backoff=ir.Backoff(0.05, 2.0, 0.1),
                            on=(ir.FailureClass.TRANSIENT,))
    events: list[StepStatus] = []
    status = engine.run(wf("retry", script("flaky", source, retry=policy)), on_event=events.append)
    assert status.state is RunState.SUCCEEDED
    assert by_key(status, "flaky").attempts == 3
    assert StepState.RETRYING in {e.state for e in events}


def test_failure_class_not_in_policy_is_not_retried(engine: LocalEngine) -> None:
    policy = ir.RetryPolicy(limit=3, on=(ir.FailureClass.OOM,))
    status = engine.run(wf("no-retry", container("fail", "sh", "-c", "exit 1", retry=policy)))
    step = by_key(status, "fail")
    assert step.state is StepState.FAILED and step.attempts == 1 and step.exit_code == 1
    # ...but an OOM (exit 137) is.
    status = engine.run(wf("oom", container("oom", "sh", "-c", "kill -9 $$", retry=policy)))
    assert by_key(status, "oom").attempts == 4


def test_process_that_cannot_start_is_infra(engine: LocalEngine) -> None:
    policy = ir.RetryPolicy(limit=1, on=(ir.FailureClass.INFRA,))
    status = engine.run(wf("infra", container("x", "/no/such/binary", retry=policy)))
    step = by_key(status, "x")
    assert step.state is StepState.FAILED and step.attempts == 2
    assert "cannot start" in step.message


def test_timeout_kills_the_step(engine: LocalEngine) -> None:
    t0 = time.monotonic()
    status = engine.run(wf("timeout", container("slow", "sh", "-c", "sleep 30; echo x",
                                                timeout_seconds=1)))
    assert time.monotonic() - t0 < 10
    step = by_key(status, "slow")
    assert step.state is StepState.FAILED and "timed out" in step.message


def test_cancel_running_workflow(engine: LocalEngine) -> None:
    handle = engine.start(wf("cancel", container("sleep", "sleep", "30"),
                             container("next", "true", dependencies=after("sleep"))))
    deadline = time.monotonic() + 5
    while by_state(handle.status(), "sleep") is not StepState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t0 = time.monotonic()
    threading.Timer(0.2, handle.cancel).start()
    status = handle.wait(timeout=10)
    assert time.monotonic() - t0 < 10
    assert status.state is RunState.CANCELLED
    assert by_key(status, "sleep").state is StepState.CANCELLED
    assert by_key(status, "next").state is StepState.CANCELLED


def by_state(status: object, step: str) -> StepState | None:
    return next((s.state for s in status.steps  # type: ignore[attr-defined]
                 if s.step == step and not s.key), None)


def test_retry_run_from_failure_point(engine: LocalEngine, tmp_path: Path) -> None:
    side, flag = tmp_path / "side", tmp_path / "fixed"
    first = container("first", "sh", "-c", f"echo run >> {side}; echo out-1",
                      outputs=(ir.OutputParameter("o", ir.OutputSource.STDOUT),))
    second = container("second", "sh", "-c", f"test -e {flag} && echo {{{{inputs.v}}}}",
                       inputs=(ir.InputParameter("v", ir.StepOutputRef("first", "o")),),
                       outputs=(ir.OutputParameter("o", ir.OutputSource.STDOUT),),
                       dependencies=after("first"))
    status = engine.run(wf("resume", first, second))
    assert status.state is RunState.FAILED
    flag.write_text("")
    again = engine.retry(engine.work_dir / status.run_id)
    assert again.state is RunState.SUCCEEDED
    assert side.read_text().count("run") == 1  # "first" was not run again
    assert by_key(again, "second").outputs == {"o": "out-1"}
    assert "reused" in by_key(again, "first").message


def test_peak_memory_recorded(engine: LocalEngine) -> None:
    source = "import time; block = b'x' * (60 * 1024 * 1024); time.sleep(0.6); print(len(block))"
    status = engine.run(wf("mem", script("alloc", source)))
    step = by_key(status, "alloc")
    assert step.state is StepState.SUCCEEDED
    assert (step.peak_memory_bytes or 0) >= 30 * 1024 * 1024
    assert step.peak_cpu is not None


def test_memory_limit_is_an_oom(engine: LocalEngine) -> None:
    source = "import time; block = b'x' * (200 * 1024 * 1024); time.sleep(5)"
    step = script("hog", source, resources=ir.Resources(memory_limit="64Mi"),
                  retry=ir.RetryPolicy(limit=1, on=(ir.FailureClass.OOM,)))
    status = engine.run(wf("hog", step))
    hog = by_key(status, "hog")
    assert hog.state is StepState.FAILED and hog.attempts == 2 and "memory" in hog.message


def test_secrets_resolved_and_missing(tmp_path: Path) -> None:
    env = (ir.EnvVar("TOKEN", secret=ir.SecretRef("creds", "token")),)
    step = container("show", "sh", "-c", "echo $TOKEN", env=env,
                     outputs=(ir.OutputParameter("o", ir.OutputSource.STDOUT),))
    engine = LocalEngine(tmp_path, secrets={("creds", "token"): "s3cr3t"})
    assert by_key(engine.run(wf("sec", step)), "show").outputs == {"o": "s3cr3t"}
    status = LocalEngine(tmp_path).run(wf("sec", step))
    show = by_key(status, "show")
    assert show.state is StepState.FAILED
    assert "'creds'" in show.message and "'token'" in show.message and "'sec'" in show.message


def test_artifacts_flow_between_steps(engine: LocalEngine) -> None:
    make = container("make", "sh", "-c", "mkdir -p /out && echo data > /out/f.txt",
                     output_artifacts=(ir.OutputArtifact("dir", "/out"),))
    use = container("use", "cat", "/in/f.txt", dependencies=after("make"),
                    input_artifacts=(ir.InputArtifact("dir", "/in",
                                                      ir.StepArtifactRef("make", "dir")),),
                    outputs=(ir.OutputParameter("o", ir.OutputSource.STDOUT),))
    status = engine.run(wf("art", make, use))
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "use").outputs == {"o": "data"}


def test_golden_dag_diamond(engine: LocalEngine) -> None:
    (prog,) = capture_program(str(GOLDEN / "dag_diamond.py"))
    status = engine.run(prog)
    assert status.state is RunState.SUCCEEDED
    run_dir = engine.work_dir / status.run_id
    for name in "abcd":
        assert (run_dir / "steps" / name / "main" / "stdout").read_text() == f"{name}\n"


def test_golden_map_upstream(engine: LocalEngine) -> None:
    (prog,) = capture_program(str(GOLDEN / "map_upstream.py"))
    status = engine.run(prog)
    assert status.state is RunState.SUCCEEDED
    assert json.loads(by_key(status, "list-shards").outputs["result"]) == ["a", "b", "c"]
    run_dir = engine.work_dir / status.run_id
    outs = [(run_dir / "steps/process" / f"item-{i}" / "stdout").read_text() for i in range(3)]
    assert outs == ["a\n", "b\n", "c\n"]


def test_golden_producer_consumer(engine: LocalEngine) -> None:
    (prog,) = capture_program(str(GOLDEN / "producer_consumer.py"))
    status = engine.run(prog)
    # The producer writes /tmp/hello.txt, mapped into its run directory.
    assert by_key(status, "producer").outputs == {"output-0": "hello world"}
    # The consumer runs `cat "hello world"` (the value, as on Argo), which fails.
    assert by_key(status, "consumer").state is StepState.FAILED
    assert "hello world" in by_key(status, "consumer").message


def test_golden_exit_handlers(engine: LocalEngine) -> None:
    (prog,) = capture_program(str(GOLDEN / "exit_handlers.py"))
    status = engine.run(prog)
    assert status.state is RunState.SUCCEEDED
    assert by_key(status, "hello").outputs == {"result": "hello from a script body"}
    assert by_key(status, "celebrate").state is StepState.SUCCEEDED
    assert all(s.step != "mourn" for s in status.steps)


def test_steps_after_a_map_run_when_it_finishes(tmp_path: Path) -> None:
    """Regression: the map finished after its dependents were examined in the same pass."""
    import couler.argo as couler

    with couler.workflow("after-map") as wf:
        couler.map(
            lambda x: couler.run_container(image="alpine", command=["echo"], args=[x],
                                           step_name="each"),
            ["a", "b", "c"],
        )
        couler.run_container(image="alpine", command=["echo", "done"], step_name="after")
        workflow = wf.to_ir()
    status = LocalEngine(tmp_path).run(workflow)
    states = {s.step: s.state for s in status.steps if not s.key}
    assert status.state == RunState.SUCCEEDED, status.message
    assert states == {"each": StepState.SUCCEEDED, "after": StepState.SUCCEEDED}


def test_relative_work_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a relative work dir broke script paths (steps run in their own dirs)."""
    monkeypatch.chdir(tmp_path)
    wf = ir.Workflow(
        "rel", (ir.Step("s", ir.ScriptSpec("python", "print('ok')"),
                        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),)),),
    )
    status = LocalEngine("runs").run(wf)
    assert status.state == RunState.SUCCEEDED, status.message
    assert status.steps[0].outputs == {"result": "ok"}


def test_journal_lines_newer_than_the_snapshot_are_replayed(tmp_path: Path) -> None:
    """A crash between snapshots loses nothing: retry replays run.journal over run.json."""
    marker = tmp_path / "count"
    wf = ir.Workflow("journal", (
        ir.Step("first", ir.ContainerSpec("sh", command=("sh", "-c", f"echo x >> {marker}"))),
        ir.Step("second", ir.ContainerSpec("sh", command=("sh", "-c", "exit 1")),
                dependencies=(ir.Dependency("first"),)),
    ))
    status = LocalEngine(tmp_path / "runs").run(wf)
    assert status.state == RunState.FAILED
    run_dir = tmp_path / "runs" / status.run_id
    snapshot = json.loads((run_dir / "run.json").read_text())
    # Simulate a crash right after the run started: the snapshot knows nothing yet...
    snapshot["seq"] = 0
    for rec in snapshot["steps"]:
        rec.update(state="pending", outputs={})
    (run_dir / "run.json").write_text(json.dumps(snapshot))
    # ...and the last journal line was cut short.
    with (run_dir / "run.journal").open("a") as journal:
        journal.write('{"seq": 99, "rec')
    again = LocalEngine(tmp_path / "runs").retry(run_dir)
    assert again.state == RunState.FAILED
    # "first" succeeded according to the journal, so the retry reused it.
    assert marker.read_text().count("x") == 1
