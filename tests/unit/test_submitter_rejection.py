"""A run the generator or optimizer refused fails with their reason and issues (no sockets).

The submitter's use case (:meth:`Submitter.rejected`) runs against its fake event port
(``FakeEvents``) and an SQLite store; the issue lines come from the ``WorkflowRejected``
message (``couler_submitter.events._issue``). The same with the real generator refusing a
text is tests/integration/test_submitter_service.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from couler.v1 import common_pb2
from couler_runtime.rpc.records import RunState
from couler_submitter.events import _issue
from couler_submitter.model import RunOptions
from couler_submitter.store import RunStore
from tests.unit.test_submitter_outbox import FakeEvents, run_async, submitter


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    s = RunStore(f"sqlite:///{tmp_path / 'submitter.db'}")
    yield s
    s.close()


def test_an_issue_names_workflow_step_and_field_when_given() -> None:
    assert _issue(common_pb2.Issue(workflow="w", step="s", field="f", message="bad")) == \
        "workflow 'w', step 's', field 'f': bad"
    assert _issue(common_pb2.Issue(workflow="w", message="empty")) == "workflow 'w': empty"


def test_a_rejected_run_fails_with_the_reason_and_its_issues(store: RunStore,
                                                             tmp_path: Path) -> None:
    events = FakeEvents()

    async def scenario() -> tuple[RunState, str, RunState, str]:
        sub = submitter(store, events, tmp_path)
        await sub.start()
        try:
            run_id, _ = await sub.submit(text="book me a flight", options=RunOptions("dryrun"))
            await sub.rejected(run_id, "generator", "cannot plan 'book me a flight'",
                               ["workflow 'w', step 's', field 'f': bad"])
            failed = await sub.get(run_id)
            # a late rejection of a run past planning changes nothing
            await sub.rejected(run_id, "optimizer", "too late")
            again = await sub.get(run_id)
            assert await sub.drained(30)
            return failed.state, failed.message, again.state, again.message
        finally:
            await sub.close()

    state, message, later, later_message = run_async(scenario)
    assert state is RunState.FAILED
    assert message == ("rejected by the generator: cannot plan 'book me a flight'\n"
                       "  workflow 'w', step 's', field 'f': bad")
    assert (later, later_message) == (state, message)
    assert [e[:3] for e in events.sent if e[0] == "finished"] == [
        ("finished", events.sent[0][1], "failed")]
