"""The local engine runs real workflows as real processes on this machine."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest

from couler import ir
from couler.api.capture import capture_program
from couler.engines.base import Feature, RunState, StepState, StepStatus, Support
from couler.errors import (
    ConflictError,
    InvalidWorkflowError,
    NotFoundError,
    UnsupportedFeatureError,
)
from couler.optimize import DEFAULT_RETRY
from couler.optimize.cache_key import workflow_keys
from couler_runtime.local import CAPABILITIES, LocalEngine, LocalRun, Reuse
from tests.waiting import eventually
from tests.workflows import make_and_use

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
    assert CAPABILITIES[Feature.GPU].support is Support.REWRITTEN  # test_local_gpus.py
    # the embedded stack's submitter keeps the schedule; a run of it here is one run
    assert CAPABILITIES[Feature.CRON].support is Support.REWRITTEN
    assert CAPABILITIES[Feature.NODE_SELECTOR].note == "ignored on one machine"


def test_unsupported_feature_rejected(engine: LocalEngine) -> None:
    step = ir.Step(name="train", body=ir.JobSpec.of(
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "t"}}))
    with pytest.raises(UnsupportedFeatureError, match=r"'train'.*job step"):
        engine.run(wf("job", step))


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


def rendezvous(where: Path, me: str, other: str) -> str:
    """Source of a step that marks it started, then holds until ``other`` has started too
    (a barrier: it fails after 120 s if ``other`` never runs alongside it)."""
    return (f"import pathlib, time\n"
            f"d = pathlib.Path({str(where)!r})\n"
            f"(d / {me!r}).touch()\n"
            f"deadline = time.monotonic() + 120\n"
            f"while not (d / {other!r}).exists():\n"
            f"    if time.monotonic() > deadline:\n"
            f"        raise SystemExit({other!r} + ' never ran alongside')\n"
            f"    time.sleep(0.02)\n")


def test_diamond_runs_middle_steps_in_parallel(engine: LocalEngine, tmp_path: Path) -> None:
    where = tmp_path / "started"
    where.mkdir()
    status = engine.run(wf(
        "diamond", script("a", "pass"),
        script("b", rendezvous(where, "b", "c"), dependencies=after("a")),
        script("c", rendezvous(where, "c", "b"), dependencies=after("a")),
        script("d", "pass", dependencies=after("b", "c"))))
    assert status.state is RunState.SUCCEEDED, status.message  # each waited for the other
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


def test_a_step_that_never_ran_because_its_upstream_failed_stops_its_dependents(
        engine: LocalEngine) -> None:
    """Argo's rule: ``b`` after a failed ``a`` is not run (Omitted), and neither is ``d``
    after ``b`` -- a default edge accepts a step skipped by its own ``when``, never one
    that did not run because its upstream failed (a deployment after a failed training)."""
    status = engine.run(wf(
        "omitted", container("train", "false"),
        container("evaluate", "true", dependencies=after("train")),
        container("deploy", "true", dependencies=after("evaluate")),
        container("report", "true", dependencies=after("deploy")),
        container("cleanup", "true",
                  dependencies=after("evaluate", cond=ir.EdgeCondition.ANY)),
        container("if-skipped", "true",
                  dependencies=after("evaluate", cond=ir.EdgeCondition.SKIPPED))))
    assert status.state is RunState.FAILED
    for name in ("evaluate", "deploy", "report"):
        step = by_key(status, name)
        assert step.state is StepState.SKIPPED and step.attempts == 0, step
    assert "did not reach succeeded" in by_key(status, "deploy").message
    assert by_key(status, "cleanup").state is StepState.SUCCEEDED  # any outcome will do
    # .Skipped is a skip by its own when, not a step that never ran (Argo's Omitted)
    assert by_key(status, "if-skipped").state is StepState.SKIPPED


def test_dependents_of_a_step_skipped_by_its_when_run_and_keep_running(
        engine: LocalEngine) -> None:
    cond = ir.Condition(ir.Literal.of("a"), ir.CompareOp.EQ, ir.Literal.of("b"))
    status = engine.run(wf(
        "skipped", container("gate", "true", when=ir.When(cond)),
        container("next", "true", dependencies=after("gate")),
        container("last", "true", dependencies=after("next")),
        container("if-skipped", "true",
                  dependencies=after("gate", cond=ir.EdgeCondition.SKIPPED))))
    assert status.state is RunState.SUCCEEDED
    assert by_key(status, "gate").state is StepState.SKIPPED
    assert [by_key(status, n).state for n in ("next", "last", "if-skipped")] == \
        [StepState.SUCCEEDED] * 3


def test_succeeded_is_strict_where_the_default_edge_accepts_a_when_skip(
        engine: LocalEngine) -> None:
    """B2, Argo's rule: ``A.Succeeded`` needs A to have run and succeeded; bare ``A`` also
    accepts A skipped by its own when. A step not run for that reason is omitted, and so
    are its bare dependents; ``.Omitted`` picks exactly those."""
    cond = ir.Condition(ir.Literal.of("a"), ir.CompareOp.EQ, ir.Literal.of("b"))
    status = engine.run(wf(
        "strict", container("gate", "true", when=ir.When(cond)),
        container("bare", "true", dependencies=after("gate")),
        container("strict", "true",
                  dependencies=after("gate", cond=ir.EdgeCondition.SUCCEEDED_ONLY)),
        container("after-strict", "true", dependencies=after("strict")),
        container("if-omitted", "true",
                  dependencies=after("strict", cond=ir.EdgeCondition.OMITTED)),
        container("gate-omitted", "true",
                  dependencies=after("gate", cond=ir.EdgeCondition.OMITTED))))
    assert status.state is RunState.SUCCEEDED
    assert by_key(status, "bare").state is StepState.SUCCEEDED
    assert by_key(status, "strict").state is StepState.SKIPPED
    assert "did not reach succeeded_only" in by_key(status, "strict").message
    assert by_key(status, "after-strict").state is StepState.SKIPPED
    assert by_key(status, "if-omitted").state is StepState.SUCCEEDED
    # gate was skipped by its own when: that is not "omitted"
    assert by_key(status, "gate-omitted").state is StepState.SKIPPED


def test_any_succeeded_and_all_failed_count_a_maps_items(engine: LocalEngine) -> None:
    def fan(name: str, codes: tuple[int, ...]) -> ir.Step:
        return container(name, "sh", "-c", "exit {{inputs.code}}",
                         foreach=ir.ForEach(items=tuple(ir.Literal.of(c) for c in codes)),
                         inputs=(ir.InputParameter("code", ir.ItemRef()),))

    any_ok, all_bad = ir.EdgeCondition.ANY_SUCCEEDED, ir.EdgeCondition.ALL_FAILED
    status = engine.run(wf(
        "counting", fan("mixed", (0, 1)), fan("broken", (1, 2)),
        container("one-of-mixed", "true", dependencies=after("mixed", cond=any_ok)),
        container("all-of-mixed", "true", dependencies=after("mixed", cond=all_bad)),
        container("one-of-broken", "true", dependencies=after("broken", cond=any_ok)),
        container("all-of-broken", "true", dependencies=after("broken", cond=all_bad))))
    assert by_key(status, "mixed").state is StepState.FAILED
    assert [by_key(status, n).state for n in
            ("one-of-mixed", "all-of-mixed", "one-of-broken", "all-of-broken")] == [
        StepState.SUCCEEDED, StepState.SKIPPED, StepState.SKIPPED, StepState.SUCCEEDED]


def test_a_failure_a_step_handles_leaves_the_run_succeeded(engine: LocalEngine) -> None:
    """Rule S7 (Argo's DAG phase): `train` fails, `fallback` (its .Failed edge) succeeds,
    so no failure reaches a leaf; the exit hook on failure does not fire. In a group the
    same rule decides the group step's outcome."""
    fail = ir.EdgeCondition.FAILED
    inner = (container("try", "false"),
             container("rescue", "true", dependencies=after("try", cond=fail)))
    group = ir.Step(name="group", body=ir.SubWorkflowSpec(name="group", steps=inner))
    status = engine.run(wf(
        "handled", container("train", "false"),
        container("fallback", "true", dependencies=after("train", cond=fail)),
        group, container("after-group", "true", dependencies=after("group")),
        exit_hooks=(ir.ExitHook(ir.RunStatus.FAILED, (container("mourn", "true"),)),)))
    assert status.state is RunState.SUCCEEDED, status.message
    assert by_key(status, "train").state is StepState.FAILED
    assert "handled by a step that ran after it: train" in status.message
    assert by_key(status, "group").state is StepState.SUCCEEDED
    assert by_key(status, "after-group").state is StepState.SUCCEEDED
    assert by_key(status, "mourn").state is StepState.SKIPPED


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
    # three items that each ran once: the map step took one attempt, not three
    assert by_key(status, "sq").attempts == 1
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
    # A DNS error twice (INFRA: the network, not the step), then success. Before failure
    # classes every exit was transient; the same error twice is now a user error (below),
    # so the flaky step names a platform error.
    counter = tmp_path / "tries"
    source = (f"import pathlib, sys; p = pathlib.Path({str(counter)!r}); "
              "n = len(p.read_text()) if p.exists() else 0; p.write_text('x' * (n + 1)); "
              "n < 2 and print('fetch https://data.example: Temporary failure in name "
              "resolution', file=sys.stderr); sys.exit(0 if n >= 2 else 3)")
    policy = ir.RetryPolicy(limit=4, backoff=ir.Backoff(0.05, 2.0, 0.1),
                            on=(ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA))
    events: list[StepStatus] = []
    status = engine.run(wf("retry", script("flaky", source, retry=policy)), on_event=events.append)
    assert status.state is RunState.SUCCEEDED
    assert by_key(status, "flaky").attempts == 3
    retrying = [e for e in events if e.state is StepState.RETRYING]
    assert retrying and {e.failure for e in retrying} == {"infra"}
    assert "name resolution" in retrying[0].failure_reason


def test_default_policy_does_not_retry_a_python_exception(engine: LocalEngine) -> None:
    step = script("bug", "raise ValueError('bad input')", retry=DEFAULT_RETRY)
    status = engine.run(wf("bug", step))
    got = by_key(status, "bug")
    assert got.state is StepState.FAILED and got.attempts == 1
    assert got.failure == "user"
    assert got.failure_reason.startswith("user error: Python ValueError in the traceback")
    assert "not retried" in got.failure_reason


def test_default_policy_retries_a_dns_error_then_succeeds(engine: LocalEngine,
                                                          tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    source = (f"import pathlib, socket; p = pathlib.Path({str(marker)!r})\n"
              "if not p.exists():\n"
              "    p.touch()\n"
              "    raise socket.gaierror(-3, 'Temporary failure in name resolution')\n"
              "print('ok')")
    policy = dataclasses.replace(DEFAULT_RETRY, backoff=ir.Backoff(0.05, 2.0, 0.1))
    status = engine.run(wf("dns", script("fetch", source, retry=policy)))
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "fetch").attempts == 2


def test_the_same_exit_and_error_twice_is_not_retried_again(engine: LocalEngine) -> None:
    # An unknown exit is retried once to see whether it repeats; a repeat is deterministic.
    policy = ir.RetryPolicy(limit=5, on=(ir.FailureClass.TRANSIENT,))
    status = engine.run(wf("repeat", container("x", "sh", "-c", "echo broken >&2; exit 3",
                                               retry=policy)))
    got = by_key(status, "x")
    assert got.state is StepState.FAILED and got.attempts == 2
    assert got.failure == "user" and "same exit code 3 and error twice" in got.failure_reason
    # ...while a policy on ANY keeps retrying every class, user errors too.
    status = engine.run(wf("any", container("x", "sh", "-c", "echo broken >&2; exit 3",
                                            retry=ir.RetryPolicy(limit=2))))
    assert by_key(status, "x").attempts == 3


def test_failure_class_not_in_policy_is_not_retried(engine: LocalEngine) -> None:
    policy = ir.RetryPolicy(limit=3, on=(ir.FailureClass.OOM,))
    status = engine.run(wf("no-retry", container("fail", "sh", "-c", "exit 1", retry=policy)))
    step = by_key(status, "fail")
    assert step.state is StepState.FAILED and step.attempts == 1 and step.exit_code == 1
    # A SIGKILL without memory evidence is no OOM (it was an OOM before failure classes):
    # something else killed it. Killed at its memory limit, it is (test_memory_limit_...).
    status = engine.run(wf("oom", container("oom", "sh", "-c", "kill -9 $$", retry=policy)))
    killed = by_key(status, "oom")
    assert killed.attempts == 1 and killed.failure == "infra"
    assert "without memory evidence" in killed.failure_reason


def test_process_that_cannot_start_is_infra(engine: LocalEngine) -> None:
    policy = ir.RetryPolicy(limit=1, on=(ir.FailureClass.INFRA,))
    status = engine.run(wf("infra", container("x", "/no/such/binary", retry=policy)))
    step = by_key(status, "x")
    assert step.state is StepState.FAILED and step.attempts == 2
    assert "cannot start" in step.message


def test_timeout_kills_the_step(engine: LocalEngine, tmp_path: Path) -> None:
    end = tmp_path / "reached-the-end"
    status = engine.run(wf("timeout", container("slow", "sh", "-c", f"sleep 30; touch {end}",
                                                timeout_seconds=1)))
    step = by_key(status, "slow")
    assert step.state is StepState.FAILED and "timed out" in step.message
    assert not end.exists()  # killed at its timeout: the run did not wait for its end


def test_cancel_running_workflow(engine: LocalEngine, tmp_path: Path) -> None:
    end = tmp_path / "reached-the-end"
    handle = engine.start(wf("cancel", container("sleep", "sh", "-c", f"sleep 30; touch {end}"),
                             container("next", "true", dependencies=after("sleep"))))
    eventually(lambda: by_state(handle.status(), "sleep") is StepState.RUNNING,
               "the step running")
    handle.cancel()
    status = handle.wait(timeout=120)
    assert not end.exists()  # its process was killed, not waited for
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


def test_a_short_peak_between_samples_is_caught_and_the_engine_is_not_counted(
        engine: LocalEngine) -> None:
    """The peak is each process's high-water mark: 80 MiB held for a few milliseconds (less
    than a sampling interval) is still seen once the process is sampled after it; and a
    step never counts the engine's own pages (its process starts as a fork of the engine,
    hundreds of MiB here, before it execs the step)."""
    grow = script("grow", "import time\nx = bytearray(80 * 1024 * 1024)\n"
                  "for i in range(0, len(x), 4096): x[i] = 1\n"
                  "del x\ntime.sleep(0.3)")  # the peak is over before the process ends
    quick = container("quick", "sh", "-c", "true")
    status = engine.run(wf("peaks", grow, quick))
    peak = by_key(status, "grow").peak_memory_bytes or 0
    assert 80 * 2**20 <= peak < 80 * 2**20 + 100 * 2**20, peak
    assert (by_key(status, "quick").peak_memory_bytes or 0) < 50 * 2**20  # 0: not sampled


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
    assert by_key(status, "mourn").state is StepState.SKIPPED  # recorded, never run
    assert "did not fire" in by_key(status, "mourn").message


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


# --------------------------------------------------------------------------- sub-workflows


def group(name: str, *inner: ir.Step, **kw: object) -> ir.Step:
    return ir.Step(name=name, body=ir.SubWorkflowSpec(name=name, steps=inner),
                   **kw)  # type: ignore[arg-type]


def stdout_out(name: str = "out") -> tuple[ir.OutputParameter, ...]:
    return (ir.OutputParameter(name, ir.OutputSource.STDOUT),)


def test_inline_subworkflow_runs_inner_graph_and_forwards_outputs(engine: LocalEngine) -> None:
    inner_a = container("prep", "echo", "inner-{{workflow.name}}", outputs=stdout_out("a"))
    inner_b = container("join", "sh", "-c", "echo {{inputs.a}}+{{inputs.who}}; echo note >&2",
                        inputs=(ir.InputParameter("a", ir.StepOutputRef("prep", "a")),
                                ir.InputParameter("who", ir.WorkflowParamRef("who"))),
                        outputs=stdout_out("joined"), dependencies=after("prep"))
    status = engine.run(wf(
        "nest",
        container("prep", "echo", "outer", outputs=stdout_out("a")),  # same name as inside
        group("grp", inner_a, inner_b, outputs=stdout_out("joined"), dependencies=after("prep")),
        container("use", "echo", "got {{inputs.j}}", outputs=stdout_out(),
                  inputs=(ir.InputParameter("j", ir.StepOutputRef("grp", "joined")),),
                  dependencies=after("grp")),
        parameters=(ir.Parameter("who", default=ir.Literal.of("me")),)))
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "prep").outputs == {"a": "outer"}
    assert by_key(status, "grp/prep").outputs == {"a": "inner-nest"}
    assert by_key(status, "grp/join").outputs == {"joined": "inner-nest+me"}
    assert by_key(status, "grp").outputs == {"joined": "inner-nest+me"}
    assert by_key(status, "use").outputs == {"out": "got inner-nest+me"}
    run_dir = engine.work_dir / status.run_id
    assert (run_dir / "steps/grp/main/join/main/stdout").read_text() == "inner-nest+me\n"
    assert engine.logs(run_dir, "grp/join") == "inner-nest+me\nnote\n"
    assert engine.logs(run_dir, "grp") == ""  # no process of its own
    record = json.loads((run_dir / "run.json").read_text())
    names = {r["step"]: r["state"] for r in record["steps"]}
    assert names["grp/prep"] == names["grp/join"] == "succeeded"


def test_subworkflow_failure_then_retry_from_the_failure_point(engine: LocalEngine,
                                                               tmp_path: Path) -> None:
    side, flag = tmp_path / "side", tmp_path / "fixed"
    once = container("once", "sh", "-c", f"echo run >> {side}; echo v1", outputs=stdout_out("v"))
    flaky = container("flaky", "sh", "-c", f"test -e {flag} && echo ok-{{{{inputs.v}}}}",
                      inputs=(ir.InputParameter("v", ir.StepOutputRef("once", "v")),),
                      outputs=stdout_out(), dependencies=after("once"))
    workflow = wf("sub-retry", group("grp", once, flaky, outputs=stdout_out()),
                  container("after", "echo", "{{inputs.v}}", outputs=stdout_out(),
                            inputs=(ir.InputParameter("v", ir.StepOutputRef("grp", "out")),),
                            dependencies=after("grp")))
    status = engine.run(workflow)
    assert status.state is RunState.FAILED
    grp = by_key(status, "grp")
    assert grp.state is StepState.FAILED and "grp/flaky" in grp.message
    assert by_key(status, "grp/flaky").state is StepState.FAILED
    assert by_key(status, "after").state is StepState.SKIPPED
    run_dir = engine.work_dir / status.run_id
    flag.write_text("")
    again = engine.retry(run_dir)
    assert again.state is RunState.SUCCEEDED, again
    assert side.read_text().count("run") == 1  # the inner step that succeeded was reused
    assert "reused" in by_key(again, "grp/once").message
    assert by_key(again, "grp/flaky").outputs == {"out": "ok-v1"}
    assert by_key(again, "after").outputs == {"out": "ok-v1"}
    # The record on disk (snapshot + journal) holds the inner steps of the new attempt.
    states = {(r["step"], r["key"]): r["state"]
              for r in json.loads((run_dir / "run.json").read_text())["steps"]}
    assert states[("grp/once", "")] == states[("grp/flaky", "")] == "succeeded"
    # A second retry reuses the whole sub-workflow step, and carries its inner records over.
    third = engine.retry(run_dir)
    assert third.state is RunState.SUCCEEDED
    assert "reused" in by_key(third, "grp").message
    assert by_key(third, "grp/flaky").outputs == {"out": "ok-v1"}
    assert side.read_text().count("run") == 1


def test_mapped_subworkflow_keys_its_inner_records(engine: LocalEngine) -> None:
    inner = container("say", "echo", "hi", outputs=stdout_out())
    items = ir.ForEach(items=(ir.Literal.of("a"), ir.Literal.of("b")))
    status = engine.run(wf("sub-map", group("grp", inner, foreach=items, outputs=stdout_out())))
    assert status.state is RunState.SUCCEEDED, status
    assert json.loads(by_key(status, "grp").outputs["out"]) == ["hi", "hi"]
    assert by_key(status, "grp", "1").state is StepState.SUCCEEDED
    assert by_key(status, "grp[0]/say").outputs == {"out": "hi"}
    assert by_key(status, "grp[1]/say").outputs == {"out": "hi"}
    run_dir = engine.work_dir / status.run_id
    assert engine.logs(run_dir, "grp[1]/say") == "hi\n"
    assert (run_dir / "steps/grp/item-1/say/main/stdout").is_file()


def test_looped_subworkflow_with_a_retry_policy(engine: LocalEngine, tmp_path: Path) -> None:
    counter, tries = tmp_path / "count", tmp_path / "tries"
    inc = script("inc", (
        f"import pathlib; p = pathlib.Path({str(counter)!r}); "
        "n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n)); print(n)"))
    # Fails the first time it runs: the sub-workflow step's retry re-runs its inner graph.
    flaky = container("flaky", "sh", "-c", f"test -e {tries} || {{ touch {tries}; exit 4; }}",
                      dependencies=after("inc"))
    cond = ir.Condition(ir.StepOutputRef("grp", "result"), ir.CompareOp.LT, ir.Literal.of(3))
    status = engine.run(wf("sub-loop", group(
        "grp", inc, flaky, outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
        loop=ir.Loop(cond, max_iterations=10), retry=ir.RetryPolicy(limit=1))))
    assert status.state is RunState.SUCCEEDED, status
    # Iteration 0 ran its inner graph twice (inc: 1, 2), iteration 1 once (inc: 3 stops it).
    assert by_key(status, "grp").outputs == {"result": "3"}
    assert [s.key for s in status.steps if s.step == "grp" and s.key] == ["0", "1"]
    assert by_key(status, "grp", "0").attempts == 2
    assert by_key(status, "grp", "1").attempts == 1
    assert by_key(status, "grp[0]/flaky").state is StepState.SUCCEEDED
    assert by_key(status, "grp[0]/inc").outputs == {"result": "2"}
    assert by_key(status, "grp[1]/inc").outputs == {"result": "3"}
    run_dir = engine.work_dir / status.run_id
    assert engine.logs(run_dir, "grp[0]/inc") == "2\n"  # the last attempt


def test_cancel_stops_inner_steps(engine: LocalEngine) -> None:
    handle = engine.start(wf("sub-cancel", group("grp", container("nap", "sleep", "30")),
                             container("next", "true", dependencies=after("grp"))))
    deadline = time.monotonic() + 30
    while by_state(handle.status(), "grp/nap") is not StepState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    handle.cancel()
    status = handle.wait(timeout=20)
    assert status.state is RunState.CANCELLED
    assert by_key(status, "grp/nap").state is StepState.CANCELLED
    assert by_key(status, "grp").state is StepState.CANCELLED
    assert by_key(status, "next").state is StepState.CANCELLED


def test_subworkflow_step_timeout_stops_its_inner_steps(engine: LocalEngine) -> None:
    nap = container("nap", "sleep", "30")
    status = engine.run(wf("sub-timeout", group("grp", nap, timeout_seconds=1)))
    grp = by_key(status, "grp")
    assert status.state is RunState.FAILED
    assert grp.state is StepState.FAILED and "timed out after 1 s" in grp.message
    inner = by_key(status, "grp/nap")
    assert inner.state is StepState.FAILED and inner.exit_code == -9
    assert "timed out" in inner.message


def test_subworkflows_share_the_worker_bound(tmp_path: Path) -> None:
    spans = tmp_path / "spans"
    spans.mkdir()

    def timed(name: str) -> ir.Step:
        source = (f"import time, pathlib; t = time.time(); time.sleep(0.4); "
                  f"pathlib.Path({str(spans)!r}, {name!r}).write_text(f'{{t}} {{time.time()}}')")
        return script(name, source, outputs=())

    status = LocalEngine(tmp_path / "runs", max_workers=2).run(wf(
        "bound", group("g1", timed("a"), timed("b")), group("g2", timed("c"), timed("d")),
        timed("e")))
    assert status.state is RunState.SUCCEEDED, status
    intervals = [tuple(map(float, p.read_text().split())) for p in spans.iterdir()]
    assert len(intervals) == 5
    most = max(sum(1 for s, e in intervals if s <= t < e) for t, _ in intervals)
    assert most <= 2


def test_workflow_reference_runs_the_given_workflow(tmp_path: Path) -> None:
    child = wf("child", container("greet", "echo", "hello {{inputs.w}}", outputs=stdout_out(
        "greeting"), inputs=(ir.InputParameter("w", ir.WorkflowParamRef("who")),)),
        parameters=(ir.Parameter("who"),),
        exit_hooks=(ir.ExitHook(ir.RunStatus.SUCCEEDED, (container("bye", "echo", "bye"),)),))
    call = ir.Step("call", ir.SubWorkflowSpec(name="child", digest=ir.digest(child)),
                   inputs=(ir.InputParameter("who", ir.Literal.of("bob")),),
                   outputs=(ir.OutputParameter("greeting", ir.OutputSource.PATH, "/unused"),))
    parent = wf("parent", call)
    engine = LocalEngine(tmp_path, workflows=[child])
    status = engine.run(parent)
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "call").outputs == {"greeting": "hello bob"}
    assert by_key(status, "call/greet").outputs == {"greeting": "hello bob"}
    assert by_key(status, "call/bye").state is StepState.SUCCEEDED  # the child's exit hook
    # Resume needs no registry: the referenced workflow is kept in the run record.
    again = LocalEngine(tmp_path).retry(tmp_path / status.run_id)
    assert again.state is RunState.SUCCEEDED
    assert by_key(again, "call").outputs == {"greeting": "hello bob"}


def test_unavailable_workflow_reference_names_workflow_step_and_field(tmp_path: Path) -> None:
    child = wf("child", container("x", "true"), parameters=(ir.Parameter("who"),))
    call = ir.Step("call", ir.SubWorkflowSpec(name="child"),
                   inputs=(ir.InputParameter("who", ir.Literal.of("bob")),))
    with pytest.raises(UnsupportedFeatureError,
                       match=r"workflow 'parent', step 'call'.*'body\.name'.*'child'"):
        LocalEngine(tmp_path).run(wf("parent", call))
    pinned = ir.Step("call", ir.SubWorkflowSpec(name="child", digest="sha256:" + "0" * 64),
                     inputs=call.inputs)
    with pytest.raises(UnsupportedFeatureError, match=r"step 'call'.*'body\.digest'"):
        LocalEngine(tmp_path, workflows=[child]).run(wf("parent", pinned))
    bare = ir.Step("call", ir.SubWorkflowSpec(name="child"))
    with pytest.raises(InvalidWorkflowError, match=r"step 'call', field 'inputs'.*'who'"):
        LocalEngine(tmp_path, workflows=[child]).run(wf("parent", bare))
    assert not any(tmp_path.iterdir())  # refused before anything ran


# --------------------------------------------------------------------------- workflow timeout


def test_workflow_timeout_fails_the_run_and_still_runs_exit_hooks(engine: LocalEngine,
                                                                  tmp_path: Path) -> None:
    marker = tmp_path / "never"
    hooks = (ir.ExitHook(ir.RunStatus.FAILED, (container("mourn", "echo", "late"),)),
             ir.ExitHook(ir.RunStatus.SUCCEEDED, (container("celebrate", "true"),)))
    status = engine.run(wf(
        "deadline",
        container("quick", "true"),
        container("slow", "sh", "-c", f"sleep 30; touch {marker}"),
        group("grp", container("nap", "sleep", "30")),
        container("next", "touch", str(marker), dependencies=after("slow")),
        exit_hooks=hooks, timeout_seconds=1))
    assert status.state is RunState.FAILED
    assert "workflow 'deadline' exceeded its timeout of 1 s" in status.message
    assert by_key(status, "quick").state is StepState.SUCCEEDED
    slow = by_key(status, "slow")
    assert slow.state is StepState.FAILED and slow.exit_code == -9
    assert "'deadline' exceeded its timeout" in slow.message
    assert by_key(status, "grp").state is StepState.FAILED
    assert by_key(status, "grp/nap").state is StepState.FAILED
    nxt = by_key(status, "next")
    assert nxt.state is StepState.CANCELLED and "not started" in nxt.message
    assert not marker.exists()
    assert by_key(status, "mourn").state is StepState.SUCCEEDED  # hooks run after a timeout
    assert by_key(status, "celebrate").state is StepState.SKIPPED  # recorded, never run
    assert "did not fire" in by_key(status, "celebrate").message
    run_dir = engine.work_dir / status.run_id
    assert engine.logs(run_dir, "mourn") == "late\n"
    assert json.loads((run_dir / "run.json").read_text())["state"] == "failed"


def test_workflow_timeout_not_reached(engine: LocalEngine) -> None:
    status = engine.run(wf("in-time", container("quick", "true"), timeout_seconds=30))
    assert status.state is RunState.SUCCEEDED and status.message == ""


# --------------------------------------------------------------------------- logs


def test_logs_of_steps_items_and_the_last_attempt(engine: LocalEngine, tmp_path: Path) -> None:
    counter = tmp_path / "n"
    flaky = script("flaky", (
        f"import pathlib, sys; p = pathlib.Path({str(counter)!r}); "
        "n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n)); "
        "print(f'attempt {n}'); print('err', n, file=sys.stderr); sys.exit(0 if n > 1 else 1)"),
        retry=ir.RetryPolicy(limit=2), outputs=())
    each = container("each", "echo", "item={{item}}",
                     foreach=ir.ForEach(items=(ir.Literal.of("x"), ir.Literal.of("y"))))
    skipped = container("skipped", "echo", "no", when=ir.When(ir.Condition(
        ir.Literal.of(1), ir.CompareOp.EQ, ir.Literal.of(2))))
    handle = engine.start(wf("logs", flaky, each, skipped))
    status = handle.wait()
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "flaky").attempts == 2
    assert handle.logs("flaky") == "attempt 2\nerr 2\n"  # the last attempt only
    assert handle.logs("each", "1") == "item=y\n"
    assert engine.logs(handle.run_dir, "each", "0") == "item=x\n"
    assert engine.logs(handle.run_dir, "skipped") == ""
    with pytest.raises(NotFoundError, match=r"workflow 'logs'.*no step 'ghost'"):
        engine.logs(handle.run_dir, "ghost")
    with pytest.raises(NotFoundError, match=r"step 'each': no execution with key '7'.*'0', '1'"):
        handle.logs("each", "7")
    with pytest.raises(NotFoundError, match="no local run record"):
        engine.logs(tmp_path / "missing", "flaky")


# ------------------------------------------------------------------ cache keys and reuse


def _cache_workflow() -> ir.Workflow:
    return make_and_use("cache-me")


def test_cache_keys_are_reported_and_stable_across_runs(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path, cache_keys=True)
    first = engine.run(_cache_workflow())
    second = engine.run(_cache_workflow())
    keys = [{s.step: s.cache_key for s in run.steps} for run in (first, second)]
    assert keys[0] == keys[1] and all(len(k) == 64 for k in keys[0].values())
    assert keys[0]["make"] != keys[0]["use"]
    # The lineage of a step's entry: the keys of the steps it read from.
    lineage = {s.step: s.cache_lineage for s in first.steps}
    assert lineage == {"make": (), "use": (keys[0]["make"],)}
    plain = LocalEngine(tmp_path / "plain").run(_cache_workflow())
    assert all(s.cache_key == "" for s in plain.steps)  # off unless asked for
    assert all(s.cache_lineage == () for s in plain.steps)


def test_a_cached_step_is_not_run_and_its_outputs_and_artifacts_flow_on(tmp_path: Path) -> None:
    stash = tmp_path / "stash.txt"
    stash.write_text("from-cache")
    engine = LocalEngine(tmp_path / "runs", cache_keys=True)
    handle = engine.start(_cache_workflow(), run_id="r1",
                          cached={"make": Reuse("k" * 64, {"said": "old"}, {"data": stash})})
    status = handle.wait()
    by = {s.step: s for s in status.steps}
    assert status.state is RunState.SUCCEEDED
    assert by["make"].state is StepState.CACHED and by["make"].attempts == 0
    assert by["make"].cache_key == "k" * 64
    assert by["use"].cache_lineage == ("k" * 64,)  # a reused producer is a parent too
    assert by["use"].outputs["seen"] == "from-cache old"
    assert not (tmp_path / "runs" / "r1" / "steps" / "make").exists()  # never executed
    with pytest.raises(ConflictError, match="'r1' exists already"):
        engine.start(_cache_workflow(), run_id="r1")


def test_run_time_keys_are_the_keys_the_optimizer_computes_before_the_run(
        tmp_path: Path) -> None:
    """Keys by lineage: what a run reports is what the plan looks up."""
    status = LocalEngine(tmp_path, cache_keys=True).run(_cache_workflow())
    assert {s.step: s.cache_key for s in status.steps} == workflow_keys(_cache_workflow())


def test_a_producer_every_reader_of_which_is_reused_is_not_run(tmp_path: Path) -> None:
    """The reader's entry is found without the producer's (its key is by lineage), so the
    producer -- its entry evicted -- need not run at all."""
    keys = workflow_keys(_cache_workflow())
    engine = LocalEngine(tmp_path / "runs", cache_keys=True)
    status = engine.start(_cache_workflow(), run_id="r2", cached={
        "use": Reuse(keys["use"], {"seen": "fresh new"})}).wait()
    by = {s.step: s for s in status.steps}
    assert status.state is RunState.SUCCEEDED
    assert by["use"].state is StepState.CACHED and by["use"].outputs == {"seen": "fresh new"}
    assert by["make"].state is StepState.SKIPPED and by["make"].attempts == 0
    assert "not needed" in by["make"].message
    assert not (tmp_path / "runs" / "r2" / "steps" / "make").exists()


def test_a_reused_step_only_reused_steps_read_needs_no_artifacts(tmp_path: Path) -> None:
    """Both steps reused: ``make``'s artifact is read by nobody that runs, so its hit is
    used without it (the submitter does not fetch it); with ``use`` run, it is needed."""
    keys = workflow_keys(_cache_workflow())
    engine = LocalEngine(tmp_path / "runs")
    hits = {"make": Reuse(keys["make"], {"said": "new"}),  # no artifact at hand
            "use": Reuse(keys["use"], {"seen": "fresh new"})}
    by = {s.step: s for s in engine.start(_cache_workflow(), cached=hits).wait().steps}
    assert by["make"].state is StepState.CACHED and by["make"].outputs == {"said": "new"}
    assert "not restored" in by["make"].message
    assert by["use"].state is StepState.CACHED
    alone = {s.step: s for s in engine.start(_cache_workflow(), cached={
        "make": hits["make"]}).wait().steps}
    assert alone["make"].state is StepState.SUCCEEDED and alone["make"].attempts == 1


def test_an_incomplete_cache_hit_runs_the_step(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path)
    status = engine.start(_cache_workflow(), cached={"make": Reuse("k", {"said": "x"})}).wait()
    make = next(s for s in status.steps if s.step == "make")
    assert make.state is StepState.SUCCEEDED and make.attempts == 1



def _sweep(items: tuple[int, ...]) -> ir.Workflow:
    """A map over ``items`` (each squared, written as an artifact too) and a step that reads
    the map's aggregated output."""
    sq = ir.Step(
        name="sq", body=ir.ContainerSpec(image="alpine", command=(
            "sh", "-c", "mkdir -p /tmp/o; echo $(({{item}} * {{item}})) | tee /tmp/o/sq.txt")),
        foreach=ir.ForEach(items=tuple(ir.Literal.of(i) for i in items), parallelism=2),
        outputs=(ir.OutputParameter("out", source=ir.OutputSource.STDOUT),),
        output_artifacts=(ir.OutputArtifact("sq", "/tmp/o/sq.txt"),))
    total = container("total", "echo", "{{inputs.all}}",
                      inputs=(ir.InputParameter("all", ir.StepOutputRef("sq", "out")),),
                      outputs=(ir.OutputParameter("said", ir.OutputSource.STDOUT),),
                      dependencies=after("sq"))
    return wf("sweep", sq, total)


def _item_hits(run: LocalRun, status: object, step: str,
               keys: tuple[str, ...]) -> dict[str, Reuse]:
    """The items ``keys`` of a finished run as the plan would hand them back (``step[N]``)."""
    hits = {}
    for k in keys:
        rec = by_key(status, step, k)
        art = run.artifact_path(f"{step}[{k}]", "sq")
        assert rec.cache_key and art is not None and art.read_text().strip() == rec.outputs["out"]
        hits[f"{step}[{k}]"] = Reuse(rec.cache_key, dict(rec.outputs), {"sq": art})
    return hits


def test_cached_map_items_are_not_run_and_the_map_aggregates_as_if_they_had(
        tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path / "runs", cache_keys=True)
    full_run = engine.start(_sweep((1, 2, 3, 4)), run_id="full")
    full = full_run.wait()
    assert full.state is RunState.SUCCEEDED
    items = [by_key(full, "sq", str(i)) for i in range(4)]
    assert all(i.state is StepState.SUCCEEDED and len(i.cache_key) == 64 for i in items)
    assert len({i.cache_key for i in items}) == 4  # each item its own entry
    assert by_key(full, "sq").cache_key == ""  # the aggregate has none

    hits = _item_hits(full_run, full, "sq", ("0", "1", "3"))
    again = engine.start(_sweep((1, 2, 3, 4)), run_id="again", cached=hits).wait()
    assert again.state is RunState.SUCCEEDED
    # only item 2 ran: one execution directory, one attempt
    steps_dir = tmp_path / "runs" / "again" / "steps" / "sq"
    assert sorted(p.name for p in steps_dir.iterdir()) == ["item-2"]
    got = {k: by_key(again, "sq", k) for k in ("0", "1", "2", "3")}
    assert [got[k].state for k in sorted(got)] == [
        StepState.CACHED, StepState.CACHED, StepState.SUCCEEDED, StepState.CACHED]
    assert [got[k].attempts for k in sorted(got)] == [0, 0, 1, 0]
    assert got["2"].cache_key == items[2].cache_key  # the run item reports its key again
    # the map's aggregate and what reads it are exactly a full run's
    assert by_key(again, "sq").outputs == by_key(full, "sq").outputs
    assert json.loads(by_key(again, "sq").outputs["out"]) == ["1", "4", "9", "16"]
    assert by_key(again, "sq").state is StepState.SUCCEEDED
    assert "3 of 4 items reused" in by_key(again, "sq").message
    assert by_key(again, "total").outputs == by_key(full, "total").outputs

    # reordered and grown: items are matched by value, not position; only 5 runs
    every = _item_hits(full_run, full, "sq", ("0", "1", "2", "3"))
    grown = engine.start(_sweep((4, 3, 5, 2, 1)), run_id="grown", cached=every).wait()
    assert grown.state is RunState.SUCCEEDED
    assert sorted(p.name for p in (tmp_path / "runs" / "grown" / "steps" / "sq").iterdir()) \
        == ["item-2"]
    assert json.loads(by_key(grown, "sq").outputs["out"]) == ["16", "9", "25", "4", "1"]

    # every item cached: nothing of the map runs and the map step itself is CACHED
    whole = engine.start(_sweep((1, 2, 3, 4)), run_id="whole", cached=every).wait()
    assert by_key(whole, "sq").state is StepState.CACHED
    assert by_key(whole, "sq").outputs == by_key(full, "sq").outputs
    assert not (tmp_path / "runs" / "whole" / "steps" / "sq").exists()
    assert by_key(whole, "total").outputs == by_key(full, "total").outputs


def test_a_map_item_hit_without_its_artifact_runs_the_item(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path / "runs", cache_keys=True)
    full = engine.run(_sweep((1, 2)))
    rec = by_key(full, "sq", "0")
    status = engine.start(_sweep((1, 2)), run_id="r", cached={
        "sq[0]": Reuse(rec.cache_key, dict(rec.outputs), {"sq": tmp_path / "gone"})}).wait()
    assert by_key(status, "sq", "0").state is StepState.SUCCEEDED
    assert by_key(status, "sq", "0").attempts == 1


def test_cached_loop_iterations_are_replayed_and_the_loop_goes_on_after_them(
        tmp_path: Path) -> None:
    counter = tmp_path / "count"
    source = (f"import pathlib; p = pathlib.Path({str(counter)!r}); "
              "n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n)); print(n)")

    def looped(limit: int) -> ir.Workflow:
        cond = ir.Condition(ir.StepOutputRef("inc", "result"), ir.CompareOp.LT,
                            ir.Literal.of(limit))
        return wf("loop", script("inc", source, loop=ir.Loop(cond, max_iterations=10)))

    engine = LocalEngine(tmp_path / "runs", cache_keys=True)
    first = engine.run(looped(3))
    iterations = [by_key(first, "inc", str(n)) for n in range(3)]
    assert [i.outputs["result"] for i in iterations] == ["1", "2", "3"]
    keys = [i.cache_key for i in iterations]
    assert all(len(k) == 64 for k in keys) and len(set(keys)) == 3
    hits = {f"inc[{n}]": Reuse(keys[n], dict(iterations[n].outputs)) for n in range(3)}
    # the same loop again: every iteration replayed from the cache, nothing runs
    counter.write_text("100")
    again = engine.start(looped(3), run_id="again", cached=hits).wait()
    assert again.state is RunState.SUCCEEDED
    assert by_key(again, "inc").outputs["result"] == "3"
    assert by_key(again, "inc").state is StepState.CACHED
    assert counter.read_text() == "100"
    # a loop that goes further: the cached iterations replay, the next one runs (and is
    # keyed after them)
    counter.write_text("3")
    longer = engine.start(looped(4), run_id="longer", cached=hits).wait()
    assert [by_key(longer, "inc", str(n)).state for n in range(4)] == [
        StepState.CACHED] * 3 + [StepState.SUCCEEDED]
    assert by_key(longer, "inc").outputs["result"] == "4"
    assert by_key(longer, "inc", "3").cache_key not in ("", *keys)
    assert sorted(p.name for p in (tmp_path / "runs" / "longer" / "steps" / "inc").iterdir()) \
        == ["iter-3"]


# ------------------------------------------------------------------ crash of the engine process

CRASHING_ENGINE = r'''
import sys, time
from pathlib import Path
from couler import ir
from couler_runtime.local import LocalEngine
work, token = Path(sys.argv[1]), sys.argv[2]
a = ir.Step(name="a", body=ir.ContainerSpec(image="x", command=("echo", "a")))
b = ir.Step(name="b", body=ir.ContainerSpec(image="x", command=(
    "sh", "-c", f"echo $$ > {work}/b.pid; sleep 30 # {token}")),
    dependencies=(ir.Dependency("a"),))
handle = LocalEngine(work).start(ir.Workflow(name="crashy", steps=(a, b)), run_id="r")
print("started", flush=True)
time.sleep(120)
'''


def test_a_crashed_engine_leaves_no_step_running_and_resume_counts_the_attempt(
        tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import uuid

    import psutil

    from couler_runtime.local.journal import _load

    token = uuid.uuid4().hex
    proc = subprocess.Popen([PY, "-c", CRASHING_ENGINE, str(tmp_path), token],
                            stdout=subprocess.PIPE, text=True)
    pid_file = tmp_path / "b.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "step b never started"
        time.sleep(0.05)
    step_pid = int(pid_file.read_text())
    os.kill(proc.pid, signal.SIGKILL)  # the engine process crashes mid-step
    proc.wait(10)
    assert proc.stdout is not None
    proc.stdout.close()
    deadline = time.monotonic() + 30
    while psutil.pid_exists(step_pid) and psutil.Process(step_pid).status() != "zombie":
        assert time.monotonic() < deadline, "the step outlived its engine"
        time.sleep(0.05)
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if token in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
    _, before = _load(tmp_path / "r")
    assert before[("b", "")].state is StepState.RUNNING and before[("b", "")].attempts == 1

    pid_file.write_text("")
    handle = LocalEngine(tmp_path).resume(tmp_path / "r")
    deadline = time.monotonic() + 60
    while not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "step b did not run again"
        time.sleep(0.05)
    status = handle.status()
    b = next(s for s in status.steps if s.step == "b")
    a = next(s for s in status.steps if s.step == "a")
    assert b.state is StepState.RUNNING and b.attempts == 2  # a new attempt, not attempt 1
    assert a.state is StepState.SUCCEEDED and a.attempts == 1  # reused, not run again
    handle.cancel()
    final = handle.wait(30)
    assert final.state is RunState.CANCELLED
    # The journal now holds both attempts' lines; loading must see the latest state only.
    _, after = _load(tmp_path / "r")
    assert after[("b", "")].state is StepState.CANCELLED and after[("b", "")].attempts == 2


def test_a_container_step_with_args_but_no_command_needs_a_command_or_a_mapped_image(
        tmp_path: Path) -> None:
    """Without a command the image's entrypoint would run; the local engine cannot know it,
    and must not run the first argument as the program instead."""
    step = ir.Step(name="say", body=ir.ContainerSpec(image="docker/whalesay", args=("hello",)),
                   outputs=(ir.OutputParameter("said", ir.OutputSource.STDOUT),))
    status = LocalEngine(tmp_path / "a").run(wf("no-command", step))
    failed = by_key(status, "say")
    assert failed.state is StepState.FAILED
    assert "field 'command'" in failed.message and "'docker/whalesay'" in failed.message
    assert "image_commands" in failed.message
    mapped = LocalEngine(tmp_path / "b", image_commands={"docker/whalesay": ["echo"]})
    status = mapped.run(wf("no-command", step))
    assert by_key(status, "say").outputs == {"said": "hello"}


def test_reading_an_output_of_a_skipped_step_says_it_was_skipped(engine: LocalEngine) -> None:
    """The branch of a when/else that did not run has no outputs: the reader's error says
    why, not only that the output is missing."""
    out = (ir.OutputParameter("v", ir.OutputSource.STDOUT),)
    flip = container("flip", "echo", "small", outputs=out)
    big = container("big", "echo", "B", outputs=out, dependencies=after("flip"), when=ir.When(
        ir.Condition(ir.StepOutputRef("flip", "v"), ir.CompareOp.EQ, ir.Literal.of("big"))))
    reader = container("publish", "echo", "{{inputs.x}}", dependencies=after("big"),
                       inputs=(ir.InputParameter("x", ir.StepOutputRef("big", "v")),))
    status = engine.run(wf("skipped-output", flip, big, reader))
    assert by_key(status, "big").state is StepState.SKIPPED
    failed = by_key(status, "publish")
    assert failed.state is StepState.FAILED
    assert "step 'big' has no output 'v' (it was skipped" in failed.message


def test_steps_do_not_inherit_the_engines_couler_settings(
        engine: LocalEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service's token and bus seed are its own, not the user's steps'."""
    monkeypatch.setenv("COULER_AUTH_TOKEN", "service-token")
    monkeypatch.setenv("COULER_NATS_SEED", "SUsecret")
    monkeypatch.setenv("COULERISH_OTHER", "kept")
    status = engine.run(wf("env", script(
        "show", "import os; print(sorted(k for k in os.environ if 'COULER' in k))",
        env=(ir.EnvVar("COULER_MODE", "declared by the workflow"),))))
    assert status.state is RunState.SUCCEEDED, status
    assert by_key(status, "show").outputs["result"] == "['COULERISH_OTHER', 'COULER_MODE']"


def test_a_failing_when_branch_does_not_keep_its_sibling_from_running(
        engine: LocalEngine, tmp_path: Path) -> None:
    """Two whens on the same output, built by the SDK's API: both branches hold, the first
    fails, the second still runs (they are siblings, not a sequence)."""
    program = tmp_path / "siblings.py"
    program.write_text(
        "import couler.argo as couler\n"
        "couler.config_workflow(name='siblings')\n"
        "out = couler.run_script(image='python:3.12', source='print(1)', step_name='gate')\n"
        "couler.when(couler.bigger(out, '0'), lambda: couler.run_container(\n"
        "    image='alpine', command=['false'], step_name='first'))\n"
        "couler.when(couler.bigger(out, '0'), lambda: couler.run_container(\n"
        "    image='alpine', command=['true'], step_name='second'))\n")
    (workflow,) = capture_program(str(program))
    status = engine.run(workflow)
    assert status.state is RunState.FAILED
    assert by_key(status, "first").state is StepState.FAILED
    assert by_key(status, "second").state is StepState.SUCCEEDED


@pytest.mark.parametrize(("command", "fired", "not_fired"), [
    ("true", "on-success", "on-failure"), ("false", "on-failure", "on-success")])
def test_an_exit_hook_that_does_not_fire_is_recorded_skipped_with_why(
        engine: LocalEngine, command: str, fired: str, not_fired: str) -> None:
    status = engine.run(wf(
        "hooks", container("main", command),
        exit_hooks=(ir.ExitHook(ir.RunStatus.SUCCEEDED, (container("on-success", "true"),)),
                    ir.ExitHook(ir.RunStatus.FAILED, (container("on-failure", "true"),)))))
    assert by_key(status, fired).state is StepState.SUCCEEDED
    skipped = by_key(status, not_fired)
    assert skipped.state is StepState.SKIPPED and skipped.attempts == 0
    outcome = "succeeded" if command == "true" else "failed"
    assert skipped.message == (f"exit hook on {'failed' if command == 'true' else 'succeeded'}"
                               f" did not fire: the run {outcome}")
