"""Memory escalation on Tekton: attempt tasks with more memory, run in the Tekton stand-in.

The stand-in cannot kill at a memory limit; the command plays the OOM killer's part the
way the retry wrapper recognises it (exit 137 with an out-of-memory message, the rule
``sigkill-memory`` of couler.failures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from couler import ir
from couler.compilers import tekton
from couler.engines.base import Feature
from couler.errors import UnsupportedFeatureError
from tests.conformance.expected import EXPECTED
from tests.conformance.loader import load_program, program_paths
from tests.unit.tekton_sim import run_pipeline
from tests.unit.test_tekton_compiler import compile_ok, ctr, tasks, wf_of

ROOT = Path(__file__).resolve().parents[2]
S = ir.Step
C = ir.FailureClass
POLICY = ir.RetryPolicy(limit=3, on=(C.TRANSIENT, C.OOM), memory_factor=2.0,
                        memory_ceiling="4Gi")
RES = ir.Resources(memory_request="1Gi", memory_limit="1Gi")


def _memory(task: dict[str, Any]) -> str:
    return str(task["taskSpec"]["steps"][0]["computeResources"]["limits"]["memory"])


def test_oom_policies_program_compiles_to_attempt_tasks_with_more_memory(tmp_path: Path,
                                                                        ) -> None:
    (path,) = [p for p in program_paths() if p.stem == "oom_policies"]
    docs = compile_ok(load_program(path))
    by_name = tasks(docs)
    assert list(by_name) == ["train", "train-mem2", "train-mem3"]  # 1Gi, 2Gi, 4Gi (ceiling)
    assert [_memory(t) for t in by_name.values()] == ["1Gi", str(2 << 30), str(4 << 30)]
    assert by_name["train-mem3"]["runAfter"] == ["train-mem2"]
    assert "onError" not in by_name["train-mem3"]["taskSpec"]["steps"][0]
    run = run_pipeline(docs, tmp_path)
    assert run.status == "Succeeded" == EXPECTED["oom_policies"]["state"].capitalize()
    assert run.tasks["train-mem3"].results["couler-attempts"] == "1"  # passed on
    assert run.tasks["train"].exit_codes == [0]


def _oom_until(n: int, shared: Path) -> str:
    """A command killed for memory on its first ``n`` attempts, then printing 'done'."""
    count = shared / "count"
    return (f"c=$(cat {count} 2>/dev/null || echo 0); echo $((c + 1)) > {count}; "
            f"if [ \"$c\" -lt {n} ]; then echo 'fatal: out of memory' >&2; exit 137; fi; "
            "echo done")


def test_an_oom_kill_runs_the_next_attempt_with_more_memory(tmp_path: Path) -> None:
    out = ir.OutputParameter("said", ir.OutputSource.STDOUT)
    step = S("train", ctr("sh", "-c", _oom_until(2, tmp_path)), retry=POLICY, resources=RES,
             outputs=(out,))
    after = S("report", ctr("echo", "{{inputs.said}}"),
              inputs=(ir.InputParameter("said", ir.StepOutputRef("train", "said")),),
              dependencies=(ir.Dependency("train"),))
    docs = compile_ok(wf_of(step, after))
    assert tasks(docs)["report"]["runAfter"] == ["train-mem3"]
    assert tasks(docs)["report"]["params"][0]["value"] == "$(tasks.train-mem3.results.said)"
    run = run_pipeline(docs, tmp_path / "run", shared=tmp_path)
    assert run.status == "Succeeded"
    final = run.tasks["train-mem3"].results
    assert (final["said"], final["couler-attempts"], final["couler-failure"]) == (
        "done", "3", "")
    assert [run.tasks[t].results["couler-failure"] for t in ("train", "train-mem2")] == [
        "oom", "oom"]


def test_a_user_error_is_passed_on_not_retried_with_more_memory(tmp_path: Path) -> None:
    step = S("train", ctr("sh", "-c", "echo 'Traceback (most recent call last):' >&2; "
                                      "echo 'ValueError: bad' >&2; exit 1"),
             retry=POLICY, resources=RES)
    run = run_pipeline(compile_ok(wf_of(step)), tmp_path)
    assert run.status == "Failed"
    assert run.tasks["train"].exit_codes == [1]
    last = run.tasks["train-mem3"]
    assert (last.state, last.results["couler-failure"], last.results["couler-exit"]) == (
        "failed", "user", "1")
    assert last.results["couler-attempts"] == "1"


def test_oom_kills_beyond_the_limit_fail_the_step(tmp_path: Path) -> None:
    policy = ir.RetryPolicy(limit=1, memory_factor=3.0)
    step = S("train", ctr("sh", "-c", _oom_until(5, tmp_path)), retry=policy, resources=RES)
    docs = compile_ok(wf_of(step))
    assert list(tasks(docs)) == ["train", "train-mem2"]
    run = run_pipeline(docs, tmp_path / "run", shared=tmp_path)
    assert run.status == "Failed"
    assert run.tasks["train-mem2"].results["couler-attempts"] == "2"


def test_memory_escalation_of_a_mapped_step_is_refused() -> None:
    step = S("m", ctr("true"), retry=POLICY, resources=RES,
             inputs=(ir.InputParameter("i", ir.ItemRef()),),
             foreach=ir.ForEach(items=(ir.Literal.of(1),)))
    with pytest.raises(UnsupportedFeatureError) as err:
        tekton.compile_workflow(wf_of(step))
    assert err.value.feature == Feature.MEMORY_ESCALATION.value


def test_without_a_memory_quantity_there_is_nothing_to_escalate() -> None:
    docs = compile_ok(wf_of(S("t", ctr("true"), retry=POLICY)))
    assert list(tasks(docs)) == ["t"]
