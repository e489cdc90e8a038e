"""How the submitter tells a failed step's class: the engine's own, else the classifier."""

from __future__ import annotations

from couler import ir
from couler.engines.base import StepState, StepStatus
from couler_runtime.rpc.records import StepRecord
from couler_submitter.service import _failure


def test_the_engines_own_class_and_reason_win() -> None:
    status = StepStatus("a", StepState.FAILED, exit_code=1, message="exit code 1",
                        failure="user", failure_reason="user error: Python KeyError in the "
                                                       "traceback; not retried")
    assert _failure(status) == (ir.FailureClass.USER, status.failure_reason)
    record = StepRecord.from_status(status)  # the record carries them too
    assert record.failure_class is ir.FailureClass.USER
    assert record.failure_reason == status.failure_reason


def test_a_remote_engines_message_is_classified() -> None:
    def of(exit_code: int | None, message: str,
           state: StepState = StepState.FAILED) -> tuple[ir.FailureClass | None, str]:
        return _failure(StepStatus("a", state, exit_code=exit_code, message=message))

    assert of(137, "OOMKilled (exit code 137)") == (
        ir.FailureClass.OOM, "out of memory: engine reason 'OOMKilled'")
    cls, why = of(None, "The node was low on resource: memory. Pod was Evicted")
    assert cls is ir.FailureClass.INFRA and "Evicted" in why
    cls, why = of(1, "Error (exit code 1)", StepState.RETRYING)
    assert cls is ir.FailureClass.TRANSIENT and why.startswith("transient: exit code 1")
    assert of(None, "timed out after 30 s")[0] is ir.FailureClass.TRANSIENT
    # nothing to classify: a step that ran and failed its checks, one with no exit code
    # and no known words, one that did not fail
    assert of(0, "output 'x' missing") == (None, "")
    assert of(None, "pod deleted") == (None, "")
    assert of(1, "Error (exit code 1)", StepState.SUCCEEDED) == (None, "")
