"""One submitted workflow is one trace, across the services and the NATS hops between them.

``python -m couler up --otel-endpoint URL`` starts the real stack (a supervisor, nats-server
with its nkey identities, the five services) exporting spans over OTLP/gRPC to a receiver
in this process: a gRPC server implementing OpenTelemetry's ``TraceService`` (the
``opentelemetry-proto`` stubs). A one-step workflow is submitted through the typed client;
the spans that arrive must form one trace: the submitter's ``Submit`` call, the optimizer
answering the plan request it published, the submitter taking the optimized plan, and the
monitor consuming the run's events -- each hop a child of the span that published the
message (the W3C ``traceparent`` travels in the NATS headers).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from couler import ir
from couler_runtime import stack
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState
from tests.otlp import CONSUMER, Receiver, Span, otlp_receiver

from .conftest import DEADLINE, leftovers, recorded_pids, script, unique, wait_until

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
Done = subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, str]]:
    with otlp_receiver() as received:
        yield received


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory,
           receiver: tuple[Receiver, str]) -> Iterator[tuple[Path, Done]]:
    home = tmp_path_factory.mktemp("couler-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    env["COULER_HOME"] = str(home)
    env["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # export every 0.2 s, not every 5 s
    up = subprocess.run([sys.executable, "-m", "couler", "up", "--otel-endpoint", receiver[1]],
                        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
                        check=False)
    try:
        yield home, up
    finally:
        if (home / "stack.json").exists():
            pids = recorded_pids(home)
            stack.down(home)
            assert leftovers(home, pids) == []


def _trace(spans: list[Span], trace_id: str) -> list[Span]:
    return [s for s in spans if s.trace_id == trace_id]


def test_one_submitted_workflow_is_one_trace_across_the_nats_hops(
        traced: tuple[Path, Done],
        receiver: tuple[Receiver, str]) -> None:
    home, up = traced
    assert up.returncode == 0, up.stderr
    assert "COULER_OTEL_ENDPOINT" in up.stdout  # listed among the settings passed
    info, _ = stack.status(home)
    assert info.passed == ["COULER_OTEL_ENDPOINT"]
    rec = receiver[0]
    client = CoulerClient(info.addresses, token=info.token)
    try:
        sub = client.submitter.submit(ir_hello(unique("traced")))
        run = client.submitter.wait(sub.run_id, timeout=DEADLINE)
    finally:
        client.close()
    assert run.state is RunState.SUCCEEDED, run.message

    def submit_span() -> Span | None:
        return next((s for s in rec.spans() if s.service == "submitter"
                     and s.name.endswith("/Submit")), None)

    wait_until(lambda: submit_span() is not None, "the submitter's Submit span")
    root = submit_span()
    assert root is not None and root.parent_id == ""  # the client sent no trace context

    def consumed(service: str, subject_part: str) -> list[Span]:
        return [s for s in _trace(rec.spans(), root.trace_id)
                if s.service == service and s.kind == CONSUMER
                and subject_part in s.attributes.get("messaging.destination.name", "")]

    def hops_arrived() -> bool:
        return bool(consumed("optimizer", "") and consumed("submitter", "optimized")
                    and consumed("monitor", ""))

    wait_until(hops_arrived, "spans of the optimizer, the submitter's plan and the monitor "
                             "in the Submit's trace", deadline=60)
    spans = _trace(rec.spans(), root.trace_id)
    # every process on the path exported its spans (the setting reached each of them)
    assert {s.service for s in spans} >= {"submitter", "optimizer", "cache", "monitor"}
    by_id = {s.span_id: s for s in spans}

    def ancestors(span: Span) -> list[Span]:
        chain = []
        while span.parent_id in by_id:
            span = by_id[span.parent_id]
            chain.append(span)
        return chain

    # submitter → optimizer: the optimizer's consumer span descends from the Submit call
    (optimizer,) = [s for s in consumed("optimizer", "") if s.attributes.get(
        "couler.run_id") == sub.run_id]
    assert optimizer.parent_id in by_id and by_id[optimizer.parent_id].service == (
        "submitter")
    assert root in ancestors(optimizer)
    # optimizer → submitter: the optimized plan is taken in a child of the optimizer's span
    (taken,) = [s for s in consumed("submitter", "optimized")
                if s.attributes.get("couler.run_id") == sub.run_id]
    assert by_id[taken.parent_id] is optimizer or optimizer in ancestors(taken)
    # submitter → monitor: the run's events are consumed under the plan's span
    monitored = [s for s in consumed("monitor", "") if taken in ancestors(s)]
    assert monitored, [(s.service, s.name) for s in spans]
    assert all(by_id[s.parent_id].service == "submitter" for s in monitored)
    # one trace: no span of this run is in another trace
    elsewhere = [s for s in rec.spans() if s.trace_id != root.trace_id
                 and s.attributes.get("couler.run_id") == sub.run_id]
    assert elsewhere == [], elsewhere


def ir_hello(name: str) -> ir.Workflow:
    out = (ir.OutputParameter("said", source=ir.OutputSource.STDOUT),)
    return ir.Workflow(name=name, steps=(script("hello", "print('hello')", outputs=out),))
