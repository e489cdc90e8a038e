"""`couler submit` / `couler status` say which failure class a failed step had and why."""

from __future__ import annotations

import io

from couler import ir
from couler.engines.base import RunState, StepState
from couler.stack_cli import _failures, _Follow, _record
from couler_runtime.rpc.records import Run, StepRecord

BUG = ("user error: Python ValueError in the traceback; not retried: the policy retries "
       "transient, infra, oom")


def run_of(*steps: StepRecord) -> Run:
    return Run(run_id="r1", state=RunState.FAILED, workflow="wf", engine="local",
               steps=steps)


def test_a_failed_step_line_names_the_class_and_why() -> None:
    run = run_of(
        StepRecord("train", StepState.FAILED, attempts=1, exit_code=1,
                   message="exit code 1: ValueError: bad", failure_class=ir.FailureClass.USER,
                   failure_reason=BUG),
        StepRecord("fetch", StepState.FAILED, attempts=3, exit_code=6,
                   failure_class=ir.FailureClass.INFRA),  # a class but no reason: the class
        StepRecord("ok", StepState.SUCCEEDED, attempts=1))
    assert _failures(run)[:2] == [
        f"  step train failed ({BUG}): exit code 1: ValueError: bad",
        "  step fetch failed after 3 attempts (infra): exit code 6",
    ]
    steps = _record(run)["steps"]
    assert steps[0]["failure_reason"] == BUG and steps[2]["failure_reason"] == ""


def test_the_live_line_of_a_retrying_step_says_why() -> None:
    err = io.StringIO()
    follow = _Follow(err)
    dns = "infrastructure: a DNS error (name resolution) in the log"
    retrying = StepRecord("fetch", StepState.RETRYING, attempts=1, message="exit code 1",
                          failure_class=ir.FailureClass.INFRA, failure_reason=dns)
    follow(run_of(retrying), (retrying,))
    assert f"fetch                            retrying ({dns}): exit code 1" in err.getvalue()
