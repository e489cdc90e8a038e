"""A workflow too large for its engine, through the whole stack: split, run, cached.

The stack's optimizer gets a budget of two steps per chunk (``COULER_MAX_STEPS_PER_CHUNK``,
the same pass that fits a workflow to Argo's object size limit), so a five-step chain is
split into an acyclic graph of chunks. The submitter runs them in order on the local
engine, passing each hand-off output to the next chunk; a second submit of the same
workflow finds every step in the cache and runs nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from couler import ir
from couler.engines.base import StepState
from couler_runtime import stack
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState
from tests.e2e.conftest import DEADLINE, Stack, script, stop_stack, unique

STEPS = 5


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("couler-split")
    info = stack.up(home, token=secrets.token_urlsafe(16),
                    extra_env={"COULER_MAX_STEPS_PER_CHUNK": "2"})
    s = Stack(home, info, CoulerClient(info.addresses, token=info.token))
    try:
        yield s
    finally:
        stop_stack(s)


def counting_chain(name: str) -> ir.Workflow:
    """s0 prints 1; each next step prints its input + 1 (so s4 prints 5)."""
    out = (ir.OutputParameter("n", source=ir.OutputSource.STDOUT),)
    steps = [script("s0", "print(1)", outputs=out)]
    for i in range(1, STEPS):
        steps.append(script(
            f"s{i}", "import os\nprint(int(os.environ['N']) + 1)", outputs=out,
            env=(ir.EnvVar("N", "{{inputs.n}}"),),
            inputs=(ir.InputParameter("n", ir.StepOutputRef(f"s{i - 1}", "n")),),
            dependencies=(ir.Dependency(f"s{i - 1}"),)))
    return ir.Workflow(name=name, steps=tuple(steps))


def test_a_split_workflow_runs_chunk_by_chunk_and_is_cached_the_second_time(
        small: Stack) -> None:
    wf = counting_chain(unique("split"))
    first = small.client.submitter.submit(wf)
    run = small.client.submitter.wait(first.run_id, timeout=DEADLINE)
    assert run.state is RunState.SUCCEEDED, run.message
    assert run.step(f"s{STEPS - 1}").outputs == {"n": str(STEPS)}
    split = next(p for p in run.passes if p.name == "split")
    assert split.changed, split
    chunk_dirs = sorted(p.name for p in small.runs_dir.iterdir()
                        if p.name.startswith(first.run_id + "-"))
    assert len(chunk_dirs) == 3  # 5 steps, at most 2 per chunk
    assert not (small.runs_dir / first.run_id).exists()  # never run in one piece
    assert {s.name: (s.state, s.attempts, s.message) for s in run.steps} == {
        f"s{i}": (StepState.SUCCEEDED, 1, "") for i in range(STEPS)}

    again = small.client.submitter.submit(wf)
    run = small.client.submitter.wait(again.run_id, timeout=DEADLINE)
    assert run.state is RunState.SUCCEEDED, run.message
    assert {s.name: (s.state, s.attempts) for s in run.steps} == {
        f"s{i}": (StepState.CACHED, 0) for i in range(STEPS)}
    assert run.step(f"s{STEPS - 1}").outputs == {"n": str(STEPS)}

