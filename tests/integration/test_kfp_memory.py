"""Memory escalation on OOM on KFP: one task per memory level, each under dsl.If(the one
before ended out of memory) in a nested sub-pipeline, compiled by the kfp SDK, run by
kfp.local and, as compiled for a KFP backend, by /bin/sh on this host.

kfp.local cannot kill at a memory limit; the command plays the OOM killer's part the way
the retry wrapper recognises it (exit 137 with "Killed: out of memory" on stderr, the rule
``sigkill-memory`` of couler.failures, or a Python MemoryError).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.integration.test_kfp import helper, run_in_kfp

# argv: COUNTER OOMS. Killed for memory on its first OOMS attempts, then trains.
OOM_UNTIL = r'''
import pathlib, sys
counter, ooms = pathlib.Path(sys.argv[1]), int(sys.argv[2])
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
if n <= ooms:
    print("Killed: out of memory", file=sys.stderr)
    sys.exit(137)
print(f"trained after {n} attempts")
'''

# argv: COUNTER. A bug (a Python ValueError: user): neither retried nor escalated.
BUGGY = r'''
import pathlib, sys
counter = pathlib.Path(sys.argv[1])
counter.write_text(str(int(counter.read_text()) + 1 if counter.exists() else 1))
raise ValueError("learning rate must be positive")
'''

CLASS = "{{$.outputs.parameters['couler_class'].output_file}}"
ATTEMPTS = "{{$.outputs.parameters['couler_attempts'].output_file}}"
BEFORE = "{{$.inputs.parameters['couler_attempts_before']}}"
SAID = "{{$.outputs.parameters['said'].output_file}}"
STOP_AT_OOM = 'case " oom " in *" $couler_class "*) break;; esac'


def program(tmp_path: Path, name: str, source: str, *args: str) -> Path:
    """A training step (memory 1Gi, x2 per OOM up to 4Gi, 3 retries) and a step after it."""
    path = tmp_path / f"{name}.py"
    path.write_text(f'''
import couler.argo as couler
from couler import ir

couler.config_workflow(name="oom-{name}")
couler.run_container(
    image="python:3.12-alpine",
    command=["python3", "-c", {source!r}, {str(tmp_path / name)!r}, *{list(args)!r}],
    step_name="train", resources={{"memory": "1Gi"}},
    retry=ir.RetryPolicy(limit=3, on=(ir.FailureClass.OOM, ir.FailureClass.TRANSIENT),
                         memory_factor=2.0, memory_ceiling="4Gi"),
)
couler.run_container(image="alpine:3.20", command=["echo", "reported"], step_name="report")
''')
    return path


def rungs(spec: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """The ladder's rung tasks in order: (task, its executor's container, its condition)."""
    comps = spec["components"]
    root = spec["root"]["dag"]["tasks"]
    out = []
    task, condition, ladder = root["train"], "", root.get("couler-train-mem2")
    while True:
        comp = comps[task["componentRef"]["name"]]
        out.append((task, spec["deploymentSpec"]["executors"][comp["executorLabel"]][
            "container"], condition))
        if ladder is None:
            return out
        (cond,) = comps[ladder["componentRef"]["name"]]["dag"]["tasks"].values()
        condition = cond["triggerPolicy"]["condition"]
        inner = comps[cond["componentRef"]["name"]]["dag"]["tasks"]
        name = f"train-mem{len(out) + 1}"  # the rung's task (and component) name
        task = inner[name]
        ladder = next((t for n, t in inner.items() if n != name), None)
        if ladder is not None:  # rung k+1's pipeline takes rung k's class and attempts
            assert ladder["inputs"]["parameters"]["couler_class"]["taskOutputParameter"] == {
                "outputParameterKey": "couler_class", "producerTask": name}


def test_one_task_per_memory_level_each_under_the_oom_condition(tmp_path: Path) -> None:
    path = program(tmp_path, "spec", OOM_UNTIL, "1")
    spec: dict[str, Any] = helper(tmp_path, "compile", str(path))[str(path)]["spec"]
    root = spec["root"]["dag"]["tasks"]
    assert sorted(root) == ["couler-train-mem2", "report", "train"]
    assert root["report"]["dependentTasks"] == ["couler-train-mem2"]  # after the whole ladder
    ladder = rungs(spec)
    assert [c["resources"]["resourceMemoryLimit"] for _, c, _ in ladder] == ["1Gi", "2Gi", "4Gi"]
    assert [c["resources"]["resourceMemoryRequest"] for _, c, _ in ladder] == [
        "1Gi", "2Gi", "4Gi"]
    assert [t["taskInfo"]["name"] for t, _, _ in ladder] == ["train", "train-mem2", "train-mem3"]
    # one executor per rung (kfp 2.17 would merge same-named components' executors wrongly)
    assert [t["componentRef"]["name"] for t, _, _ in ladder] == [
        "comp-train", "comp-train-mem2", "comp-train-mem3"]
    assert [cond for _, _, cond in ladder] == [
        "", *["inputs.parameter_values['pipelinechannel--couler_class'] == 'oom'"] * 2]
    assert all("retryPolicy" not in t for t, _, _ in ladder)  # the wrapper retries
    assert ladder[0][0]["inputs"]["parameters"]["couler_attempts_before"] == {
        "runtimeValue": {"constant": 0.0}}
    for task, _, _ in ladder[1:]:
        assert task["inputs"]["parameters"]["couler_attempts_before"] == {
            "componentInputParameter": "pipelinechannel--couler_attempts"}
    # every rung but the last stops at an OOM and hands over; the last retries in place
    assert [STOP_AT_OOM in c["command"][2] for _, c, _ in ladder] == [True, True, False]


def test_the_compiled_rungs_hand_over_when_run_by_sh(tmp_path: Path) -> None:
    path = program(tmp_path, "sh", OOM_UNTIL, "1")
    spec = helper(tmp_path, "compile", str(path))[str(path)]["spec"]
    ladder = rungs(spec)

    def run(k: int, before: int) -> tuple[int, str, str, str]:
        container = ladder[k][1]
        files = tmp_path / f"rung{k}-{before}"
        sub = {CLASS: str(files / "class"), ATTEMPTS: str(files / "attempts"),
               BEFORE: str(before)}
        words = [*container["command"], *(sub.get(a, a) for a in container["args"])]
        proc = subprocess.run(words, capture_output=True, text=True, timeout=60, check=False)
        return (proc.returncode, (files / "class").read_text(),
                (files / "attempts").read_text(), proc.stdout + proc.stderr)

    code, cls, attempts, log = run(0, 0)  # killed for memory: hands over, exit 0
    assert (code, cls, attempts) == (0, "oom", "1"), log
    assert "attempt 1 failed (exit 137): oom (sigkill-memory)" in log
    code, cls, attempts, log = run(1, 1)  # more memory: trains
    assert (code, cls, attempts) == (0, "", "2"), log
    assert "trained after 2 attempts" in log
    assert (tmp_path / "sh").read_text() == "2"

    (tmp_path / "sh").write_text("0")  # the last rung retries an OOM in place, to the limit
    code, cls, attempts, log = run(2, 2)
    assert (code, cls, attempts) == (0, "", "4"), log
    assert log.count("oom (sigkill-memory)") == 1


def test_kfp_local_runs_the_next_rung_after_an_oom_and_succeeds(tmp_path: Path) -> None:
    path = program(tmp_path, "ok", OOM_UNTIL, "1")
    runs = helper(tmp_path, "run", str(path), str(tmp_path / "root"))["runs"]
    # rung 1 (1Gi) was killed for memory and handed over; rung 2 (2Gi) trained
    assert runs["train"] == ["", "trained after 2 attempts\n"]
    assert runs["report"] == ["reported\n"]
    assert (tmp_path / "ok").read_text() == "2"


def test_kfp_local_fails_a_user_error_in_the_first_rung(tmp_path: Path) -> None:
    path = program(tmp_path, "buggy", BUGGY)
    failed = helper(tmp_path, "run-failing", str(path), str(tmp_path / "root"))
    assert failed["failed"] == ["train"] and failed["ran"] == ["train"]
    assert (tmp_path / "buggy").read_text() == "1"  # no retry, no second rung
    assert "couler-train-mem2" not in failed["error"]


def test_kfp_local_stops_when_attempts_run_out_across_rungs(tmp_path: Path) -> None:
    path = program(tmp_path, "hungry", OOM_UNTIL, "99")
    failed = helper(tmp_path, "run-failing", str(path), str(tmp_path / "root"))
    assert failed["failed"] == ["train"] and "report" not in failed["ran"]
    # 1Gi, 2Gi, then 4Gi (the ceiling) twice: limit 3 → 4 attempts in all
    assert (tmp_path / "hungry").read_text() == "4"
    # the last rung (4Gi) failed, in the innermost sub-pipeline
    assert "failed: 'train-mem3' inside 'condition-1' inside 'couler-train-mem3'" in \
        failed["error"].replace("\x1b[96m", "").replace("\x1b[0m", "")


REFUSALS = r'''
import json
from couler import ir
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError

C = ir.FailureClass
RETRY = ir.RetryPolicy(limit=2, on=(C.OOM,), memory_factor=2.0)
RES = ir.Resources(memory_limit="1Gi")
OUT = ir.OutputParameter("said", ir.OutputSource.STDOUT)


def train(**kw):
    return ir.Step("train", ir.ContainerSpec(image="alpine", command=("echo", "x")),
                   retry=RETRY, resources=RES, **kw)


def after(*deps, **kw):
    return ir.Step("after", ir.ContainerSpec(image="alpine", command=("echo", "y")),
                   dependencies=tuple(ir.Dependency("train", c) for c in deps), **kw)


cases = {
    "mapped": [train(foreach=ir.ForEach(items=(ir.Literal.of(1), ir.Literal.of(2))))],
    "conditional": [ir.Step("gate", ir.ContainerSpec(image="alpine", command=("echo", "1")),
                            outputs=(OUT,)),
                    train(when=ir.When(ir.Condition(ir.StepOutputRef("gate", "said"),
                                                    ir.CompareOp.EQ, ir.Literal.of("1"))),
                          dependencies=(ir.Dependency("gate"),))],
    "read": [train(outputs=(OUT,)),
             after(ir.EdgeCondition.SUCCEEDED,
                   inputs=(ir.InputParameter("said", ir.StepOutputRef("train", "said")),))],
    "handler upstream": [train(), after(ir.EdgeCondition.FAILED)],
    "unread output": [train(outputs=(OUT,)), after(ir.EdgeCondition.SUCCEEDED)],
}
out = {}
for name, steps in cases.items():
    try:
        K.compile_workflow(ir.Workflow(name="refused", steps=tuple(steps)))
        out[name] = "compiled"
    except UnsupportedFeatureError as exc:
        out[name] = [exc.step, exc.feature, str(exc)]
hook = ir.Workflow(name="hook", steps=(after(),), exit_hooks=(
    ir.ExitHook(ir.RunStatus.ANY, (train(),)),))
try:
    K.compile_workflow(hook)
    out["exit hook"] = "compiled"
except UnsupportedFeatureError as exc:
    out["exit hook"] = [exc.step, exc.feature, str(exc)]
print(json.dumps(out))
'''


def test_what_a_ladder_cannot_carry_is_refused_naming_step_and_reason(tmp_path: Path) -> None:
    out = run_in_kfp(tmp_path, "refusals.py", REFUSALS)
    assert out.pop("unread output") == "compiled"  # outputs nobody reads are fine
    reasons = {"mapped": "mapped, looped or conditional",
               "conditional": "mapped, looped or conditional",
               "read": "'after' reads its outputs",
               "handler upstream": "failed / completed / any edge",
               "exit hook": "exit hook"}
    assert sorted(out) == sorted(reasons)
    for name, why in reasons.items():
        step, feature, message = out[name]
        assert (step, feature) == ("train", "memory escalation on OOM"), name
        assert why in message, (name, message)
