"""The ops console in a real browser: Debian's headless Chromium (tests/cdp.py) against the
real monitor and submitter (threads, tests/service_thread.py) on the session's nats-server,
the monitor's history in the session's PostgreSQL, a token on both.

A real run on the local engine feeds it (step events, utilization batches, logs); a run
with HTML in its workflow and step names comes as real events on the bus. Every page is
checked for console errors (CSP violations included), and screenshots of the main pages
go to ``test-output/console/`` for a person to look at.

Waits are bounds on DOM conditions, never sleeps or timing assertions: the running step
works until the test lets it finish.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from couler import ir
from couler.v1 import common_pb2, events_pb2
from couler_monitor.main import MonitorSettings
from couler_monitor.main import build as build_monitor
from couler_optimizer.main import OptimizerSettings
from couler_optimizer.main import build as build_optimizer
from couler_runtime.bus import Bus
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import RunState
from couler_submitter.main import SubmitterSettings
from couler_submitter.main import build as build_submitter
from tests.cdp import Browser
from tests.servers import NatsServer, free_port, scratch_database
from tests.service_thread import ServiceThread
from tests.waiting import eventually

TOKEN = "console-browser-token-7c21"
WAIT = 60.0  # a bound on waiting, never an assertion about speed
PY = "python:3.11-slim"
OUT = Path(__file__).resolve().parents[2] / "test-output" / "console"
HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'


class Stack:
    def __init__(self, client: CoulerClient, url: str, nats: NatsServer) -> None:
        self.client, self.url, self.nats = client, url.rstrip("/"), nats

    def publish(self, messages: list[tuple[str, object, str]]) -> None:
        async def send() -> None:
            bus = await Bus.connect(self.nats.url, name="console-browser-test")
            try:
                await bus.ensure_streams()
                for subject, message, msg_id in messages:
                    await bus.publish(subject, message, msg_id=msg_id)  # type: ignore[arg-type]
            finally:
                await bus.close()

        asyncio.run(send())


@pytest.fixture(scope="module")
def stack(nats_server: NatsServer, postgres_url: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The real optimizer, the submitter (local engine sampling every 0.25 s, batches every
    0.5 s), then the monitor pointed at it (COULER_SUBMITTER_ADDRESS), all behind TOKEN."""
    tmp = tmp_path_factory.mktemp("console")
    opt = ServiceThread(OptimizerSettings.load(
        "optimizer", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
        state_dir=tmp / "optimizer", database_url=f"sqlite:///{tmp / 'opt.db'}",
        artifacts=str(tmp / "blobs"), auth_token=TOKEN, otel_endpoint=None,
        bus_insecure=True), build_optimizer).start()
    sub = ServiceThread(SubmitterSettings.load(
        "submitter", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
        state_dir=tmp / "submitter", database_url=f"sqlite:///{tmp / 'sub.db'}",
        artifacts=str(tmp / "blobs"), auth_token=TOKEN, otel_endpoint=None,
        engines="local", outbox_interval=1.0, metrics_interval=0.5, sample_interval=0.25,
        bus_insecure=True), build_submitter).start()
    try:
        with scratch_database(postgres_url, "console") as database:
            mon = ServiceThread(MonitorSettings.load(
                "monitor", nats_url=nats_server.url, grpc_address="127.0.0.1:0",
                state_dir=tmp / "monitor", database_url=database, auth_token=TOKEN,
                otel_endpoint=None, dashboard_address=f"127.0.0.1:{free_port()}",
                submitter_address=sub.address, bus_insecure=True), build_monitor).start()
            client = CoulerClient({"submitter": sub.address, "monitor": mon.address},
                                  timeout=WAIT, token=TOKEN)
            try:
                yield Stack(client, mon.endpoints["dashboard"], nats_server)
            finally:
                client.close()
                mon.stop()
    finally:
        sub.stop()
        opt.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    b = Browser(tmp_path_factory.mktemp("chromium"))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def logged_in(stack: Stack, browser: Browser) -> Browser:
    """The browser after logging in through the login page (the session cookie)."""
    browser.navigate(stack.url + "/")
    assert browser.evaluate("document.title").startswith("401 Unauthorized")
    assert browser.evaluate("!!document.querySelector('form.login input[name=token]')")
    browser.take_problems()  # the 401 itself is reported as a failed resource load
    browser.screenshot(OUT / "login.png")
    browser.evaluate(f"document.querySelector('form.login input[name=token]').value = "
                     f"{json.dumps(TOKEN)}, 0")
    browser.submit_and_wait("document.querySelector('form.login')")
    assert browser.evaluate("location.pathname") == "/", browser.evaluate(
        "document.body.textContent")
    assert browser.evaluate("document.title") == "Couler runs · Couler"
    assert browser.take_problems() == []
    return browser


def ts(seconds: float) -> Timestamp:
    out = Timestamp()
    out.FromNanoseconds(round(seconds * 1e9))
    return out


def script(name: str, source: str, **kw: object) -> ir.Step:
    return ir.Step(name=name, body=ir.ScriptSpec(image=PY, source=source), **kw)  # type: ignore[arg-type]


def test_a_running_run_live_dag_plot_logs_and_actions(stack: Stack, logged_in: Browser,
                                                     tmp_path: Path) -> None:
    browser = logged_in
    release = tmp_path / "release"
    prep = script("prep", f"print({HOSTILE!r})\nprint('</pre><script>alert(1)</script>')")
    shard = script("shard", "print('shard', '{{item}}')",
                   foreach=ir.ForEach(items=tuple(ir.Literal.of(i) for i in (1, 2, 3))),
                   dependencies=(ir.Dependency("prep"),))
    work = script("work", f"import os\nwhile not os.path.exists({str(release)!r}):\n"
                          "    sum(range(20000))\n",
                  dependencies=(ir.Dependency("shard"),),
                  resources=ir.Resources(cpu_request="500m", cpu_limit="2",
                                         memory_request="64Mi", memory_limit="256Mi"))
    report = script("report", "print('done')", dependencies=(ir.Dependency("work"),))
    wf = ir.Workflow(name=f"console-{uuid.uuid4().hex[:6]}", steps=(prep, shard, work, report))
    run_id = stack.client.submitter.submit(wf).run_id  # the optimizer plans it
    page = f"{stack.url}/runs/{quote(run_id, safe='')}"

    # The runs list shows it, and follows it live: its row turns "running" in place.
    browser.navigate(stack.url + "/")
    browser.evaluate("window.__sameDocument = 'list', 0")
    row = (f"[...document.querySelectorAll('table.runs tr')].find(r => "
           f"r.textContent.includes({json.dumps(run_id)}))")
    browser.wait_for(f"(() => {{ const r = {row}; return !!r && "
                     "!!r.querySelector('td.state-running') })()", "the run listed running")
    assert browser.evaluate("window.__sameDocument") == "list"  # no reload happened
    browser.screenshot(OUT / "runs.png")

    browser.navigate(page)
    browser.evaluate("window.__sameDocument = 'yes', 0")
    # The DAG: one node per step of the plan, the map step's items as marks.
    nodes = browser.wait_for(
        "(() => { const n = [...document.querySelectorAll('svg.dag g.node')]"
        ".map(g => g.dataset.step); return n.length === 4 ? n : null })()", "the DAG")
    assert sorted(nodes) == ["prep", "report", "shard", "work"]
    assert browser.evaluate("document.querySelectorAll('svg.dag path.edge').length") == 3
    browser.wait_for("document.querySelectorAll('svg.dag g.node[data-step=shard] "
                     "rect.mark').length === 3", "the map items as marks")
    # The running step's plot grows without a reload.
    first = browser.wait_for(
        "(() => { const f = document.querySelector('figure.plot[data-step=work]');"
        " return f && +f.dataset.points >= 2 ? +f.dataset.points : 0 })()",
        "the running step's plot")
    browser.wait_for(
        "+document.querySelector('figure.plot[data-step=work]').dataset.points > "
        f"{first}", "the plot grew")
    assert browser.evaluate("window.__sameDocument") == "yes"  # no reload happened
    assert int(browser.evaluate("document.getElementById('live').dataset.updates")) >= 1
    assert browser.evaluate(
        "document.querySelector('svg.dag g.node[data-step=work]').classList"
        ".contains('state-running')")
    # requested and limit drawn against the series
    assert browser.evaluate("document.querySelectorAll('figure.plot[data-step=work] "
                            "svg.cpu line').length") == 2
    browser.screenshot(OUT / "run-running.png")
    assert browser.take_problems() == []

    # The logs, fetched from the submitter: HTML in them is text, no element injected.
    browser.navigate(page)
    logs = browser.wait_for(
        "[...document.querySelectorAll('pre.log')].map(p => p.textContent).join('\\n')",
        "the logs in the page")
    assert HOSTILE in logs and "<script>alert(1)</script>" in logs
    assert browser.evaluate("document.querySelectorAll('img, main script').length") == 0
    assert browser.evaluate("document.title") != "pwned"

    # A cross-site POST is refused: a form on another origin (a data: page), no token.
    state_before = stack.client.submitter.get(run_id).state
    browser.navigate(
        "data:text/html," + quote(
            f'<form method="post" action="{page}/cancel"><input name="csrf" value="x">'
            "</form>"))
    browser.submit_and_wait("document.forms[0]")
    # the session cookie is SameSite=Strict: the browser did not send it, the POST had no
    # credentials (with them, the Origin and CSRF checks refuse it: test_dashboard_hardening)
    assert browser.evaluate("document.title").startswith("401 Unauthorized")
    assert "a valid token is required" in browser.evaluate("document.body.textContent")
    assert stack.client.submitter.get(run_id).state is state_before
    browser.take_problems()  # the refused POST is reported as a failed resource load

    # Cancel from the page (the session's CSRF token, same origin): the run stops.
    browser.navigate(page)
    browser.submit_and_wait("document.querySelector('form[action$=\"/cancel\"]')")
    assert "cancel sent to the submitter" in browser.evaluate(
        "document.querySelector('.notice').textContent")
    eventually(lambda: stack.client.submitter.get(run_id).state is RunState.CANCELLED,
               "the run cancelled", WAIT)
    browser.wait_for("!!document.querySelector('#live .summary .state-cancelled')",
                     "the page shows the run cancelled")
    # nothing left "pending" in a finished run
    assert browser.evaluate("document.querySelectorAll('svg.dag .state-pending').length") == 0
    browser.screenshot(OUT / "run-cancelled.png")
    assert browser.take_problems() == []

    # Retry from the failure point: the submitter runs it again, from "work".
    browser.navigate(page)
    browser.submit_and_wait("document.querySelector('form[action$=\"/retry\"]')")
    assert "retry from the failure point sent" in browser.evaluate(
        "document.querySelector('.notice').textContent")
    eventually(lambda: not stack.client.submitter.get(run_id).state.terminal,
               "the run going again", WAIT)
    release.touch()  # now "work" may finish
    eventually(lambda: stack.client.submitter.get(run_id).state is RunState.SUCCEEDED,
               "the retried run succeeded", WAIT)
    browser.wait_for("!!document.querySelector('#live .summary .state-succeeded')",
                     "the page shows the run succeeded")
    assert browser.evaluate("document.querySelectorAll('svg.dag .node.state-succeeded')"
                            ".length") == 4

    # Resubmit: the run's plan as a new run; the page follows it.
    browser.submit_and_wait("document.querySelector('form[action$=\"/resubmit\"]')")
    path = browser.evaluate("location.pathname")
    assert path.startswith("/runs/") and path != f"/runs/{run_id}"
    new_id = path.removeprefix("/runs/")
    assert f"resubmitted as run {new_id}" in browser.evaluate(
        "document.querySelector('.notice').textContent")
    assert stack.client.submitter.get(new_id).workflow == wf.name
    eventually(lambda: stack.client.submitter.get(new_id).state is RunState.SUCCEEDED,
               "the resubmitted run succeeded", WAIT)
    assert browser.take_problems() == []


def test_html_in_workflow_and_step_names_is_shown_escaped(stack: Stack,
                                                          logged_in: Browser) -> None:
    browser = logged_in
    run_id = f"evil-{uuid.uuid4().hex[:6]}"
    workflow = f"wf{HOSTILE}"
    step = f"step{HOSTILE}"
    t0 = time.time()
    stack.publish([
        ("couler.workflow.submitted", events_pb2.WorkflowSubmitted(
            run_id=run_id, workflow=workflow, engine="local", at=ts(t0)), f"{run_id}.sub"),
        ("couler.step.failed", events_pb2.StepEvent(
            run_id=run_id, workflow=workflow, engine="local",
            step=common_pb2.StepRecord(name=step, state="STEP_STATE_FAILED", attempts=1,
                                       message=f"died: {HOSTILE}"),
            at=ts(t0 + 1)), f"{run_id}.step"),
    ])
    browser.navigate(stack.url + "/?q=" + quote(run_id))
    browser.wait_for(f"document.body.textContent.includes({json.dumps(run_id)})",
                     "the run listed")
    assert browser.evaluate(f"document.body.textContent.includes({json.dumps(workflow)})")
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    browser.navigate(f"{stack.url}/runs/{quote(run_id, safe='')}")
    names = browser.wait_for(
        "[...document.querySelectorAll('svg.dag g.node')].map(g => g.dataset.step)",
        "the DAG drawn from the records")
    assert names == [step]
    assert browser.evaluate(f"document.body.textContent.includes({json.dumps('died: ' + HOSTILE)})")
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    assert browser.evaluate("document.title") != "pwned"
    browser.screenshot(OUT / "run-escaped.png")
    assert browser.take_problems() == []
