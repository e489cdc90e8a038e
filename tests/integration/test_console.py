"""The console over HTTP (a real uvicorn on 127.0.0.1:0 over a real Monitor and SQLite store):
login and sessions, the cross-site defences of the actions, the runs list's filters, search
and paging, the live stream, and what a finished run's unreported steps show.

The browser's view (scripts, CSP, live plots, a real submitter behind the actions) is in
test_console_browser.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from couler import ir
from couler.engines.base import StepState
from couler_monitor.dashboard import COOKIE, PAGE_RUNS, DashboardServer, create_app
from couler_monitor.service import Monitor
from couler_monitor.store import MonitorStore
from couler_runtime import codec
from couler_runtime.rpc.records import (
    Recommendation,
    Run,
    RunState,
    StepRecord,
    StoredArtifact,
)
from tests.integration.loop_thread import LoopThread

TOKEN = "console-token-93b1"
WAIT = 30.0


class Console:
    def __init__(self, url: str, monitor: Monitor, loop: LoopThread) -> None:
        self.url, self.monitor, self.loop = url.rstrip("/"), monitor, loop
        self.origin = self.url

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=WAIT, follow_redirects=False, **kw)

    def login(self, http: httpx.Client) -> str:
        """Log ``http`` in through the form; the session's CSRF token (from a page)."""
        answer = http.post("/login", data={"token": TOKEN, "next": "/"},
                           headers={"Origin": self.origin})
        assert answer.status_code == 303 and answer.headers["location"] == "/"
        page = http.get("/runs/r-0")
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found, page.text
        return found.group(1)


@pytest.fixture(scope="module")
def console(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """The console behind TOKEN (no submitter), over a store holding runs r-0 .. r-(N-1)."""
    db = tmp_path_factory.mktemp("console") / "monitor.db"
    store = MonitorStore.open(f"sqlite:///{db}")

    async def publish(recommendation: Recommendation) -> None:
        raise AssertionError(f"nothing should be published, got {recommendation}")

    monitor = Monitor(store, publish)
    t0 = time.time()
    for i in range(PAGE_RUNS + 5):  # more than a page
        wf = "train" if i % 2 else "etl"
        loop.run(monitor.record_submitted(f"r-{i}", workflow=wf, engine="local", at=t0 + i))
        if i % 5 == 0:
            loop.run(monitor.record_finished(Run(
                run_id=f"r-{i}", state=RunState.FAILED, workflow=wf, engine="local",
                finished_at=t0 + i + 1, message=f"boom number {i}")))
    server = DashboardServer(create_app(monitor, token=TOKEN, live_interval=0.1),
                             "127.0.0.1:0")
    try:
        yield Console(loop.run(server.start()), monitor, loop)
    finally:
        loop.run(server.stop())
        store.close()


def test_the_login_page_starts_a_session(console: Console) -> None:
    with console.client() as http:
        denied = http.get("/runs/r-0")
        assert denied.status_code == 401
        assert '<form class="login" method="post" action="/login">' in denied.text
        assert 'name="next" value="/runs/r-0"' in denied.text
        assert http.get("/static/console.js").status_code == 200  # the login page's own
        wrong = http.post("/login", data={"token": "nope"}, headers={"Origin": console.origin})
        assert wrong.status_code == 401 and "that is not the token" in wrong.text
        assert COOKIE not in wrong.headers.get("set-cookie", "")
        # another site's form cannot log a browser in (login CSRF)
        forged = http.post("/login", data={"token": TOKEN},
                           headers={"Origin": "https://evil.example"})
        assert forged.status_code == 403
        ok = http.post("/login", data={"token": TOKEN, "next": "//evil.example/x"},
                       headers={"Origin": console.origin})
        assert ok.status_code == 303 and ok.headers["location"] == "/evil.example/x"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
        assert http.get("/runs/r-0").status_code == 200
        # logging out ends the session on the server, not only in this client
        sid = http.cookies[COOKIE]
        page = http.get("/runs/r-0").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf
        out = http.post("/logout", data={"csrf": csrf.group(1)},
                        headers={"Origin": console.origin})
        assert out.status_code == 303
    with console.client(cookies={COOKIE: sid}) as replay:
        assert replay.get("/").status_code == 401


def test_actions_refuse_cross_site_requests(console: Console) -> None:
    with console.client() as anonymous:
        assert anonymous.post("/runs/r-0/cancel").status_code == 401
    with console.client() as http:
        csrf = console.login(http)
        cross = http.post("/runs/r-0/cancel", data={"csrf": csrf},
                          headers={"Origin": "https://evil.example"})
        assert cross.status_code == 403 and "cross-site" in cross.text
        fetched = http.post("/runs/r-0/cancel", data={"csrf": csrf},
                            headers={"Sec-Fetch-Site": "cross-site", "Origin": "null"})
        assert fetched.status_code == 403
        no_origin = http.post("/runs/r-0/cancel", data={"csrf": csrf})
        assert no_origin.status_code == 403  # a browser says where it comes from
        bad_csrf = http.post("/runs/r-0/cancel", data={"csrf": "guess"},
                             headers={"Origin": console.origin})
        assert bad_csrf.status_code == 403 and "CSRF" in bad_csrf.text
        # every check passed: then the missing submitter is what stops it
        passed = http.post("/runs/r-0/cancel", data={"csrf": csrf},
                           headers={"Origin": console.origin})
        assert passed.status_code == 503 and "COULER_SUBMITTER_ADDRESS" in passed.text
        assert http.post("/runs/r-0/explode", data={"csrf": csrf},
                         headers={"Origin": console.origin}).status_code == 404
    # a script with the bearer token needs no session or CSRF (browsers never send it
    # cross-site)
    with console.client(headers={"Authorization": f"Bearer {TOKEN}"}) as script:
        assert script.post("/runs/r-0/cancel").status_code == 503


def test_the_open_console_offers_no_actions(loop: LoopThread, console: Console) -> None:
    server = DashboardServer(create_app(console.monitor), "127.0.0.1:0")
    url = loop.run(server.start())
    try:
        with httpx.Client(base_url=url, timeout=WAIT) as http:
            page = http.get("/runs/r-0")
            assert page.status_code == 200 and "<button" not in page.text.split(
                '<div id="live"')[0].split("</header>")[1]
            refused = http.post("/runs/r-0/cancel", headers={"Origin": url.rstrip("/")})
            assert refused.status_code == 403 and "COULER_AUTH_TOKEN" in refused.text
    finally:
        loop.run(server.stop())


def listed(text: str) -> list[str]:
    table = text.split('<table class="runs">', 1)[1] if '<table class="runs">' in text else ""
    return re.findall(r'<a href="/runs/([^"]+)">', table)


def test_filters_search_and_paging(console: Console) -> None:
    with console.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        first = http.get("/").text
        assert len(listed(first)) == PAGE_RUNS and listed(first)[0] == f"r-{PAGE_RUNS + 4}"
        assert '<a rel="next" href="/?page=2">' in first
        second = http.get("/", params={"page": "2"}).text
        assert listed(second) == [f"r-{i}" for i in range(4, -1, -1)]
        failed = listed(http.get("/", params={"state": "failed"}).text)
        assert failed == [f"r-{i}" for i in range(PAGE_RUNS + 4, -1, -1) if i % 5 == 0]
        both = listed(http.get("/", params={"state": "failed", "workflow": "train"}).text)
        assert both == [f"r-{i}" for i in range(PAGE_RUNS + 4, -1, -1)
                        if i % 5 == 0 and i % 2]
        assert listed(http.get("/", params={"q": "BOOM NUMBER 15"}).text) == ["r-15"]
        assert listed(http.get("/", params={"q": "100%"}).text) == []  # % is text
        assert listed(http.get("/", params={"engine": "argo"}).text) == []
        recent = listed(http.get("/", params={"since": "3600"}).text)
        assert len(recent) == PAGE_RUNS
        bad = http.get("/", params={"state": "<b>"})
        assert bad.status_code == 400 and "&lt;b&gt;" in bad.text


def test_the_live_stream_sends_the_fragment_and_needs_the_session(console: Console) -> None:
    with console.client() as anonymous:
        assert anonymous.get("/events/runs").status_code == 401
    with console.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
            http.stream("GET", "/events/runs/r-3") as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        seen: list[str] = []
        for line in stream.iter_lines():
            seen.append(line)
            if line == "" and any(s.startswith("event: fragment") for s in seen):
                break
        body = "\n".join(s.removeprefix("data: ") for s in seen if s.startswith("data: "))
        assert '<p class="summary">' in body
        assert '<span class="state-pending">pending</span>' in body
    with console.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        assert http.get("/events/runs/nope").status_code == 404


def test_a_finished_runs_unreported_exit_hook_is_not_pending(console: Console) -> None:
    """The plan has an exit hook on success; the run succeeded and the engine never reported
    the hook (or reported it pending): the console shows it "unreported", saying why."""
    hook = ir.Step(name="notify", body=ir.ScriptSpec(image="python:3.11-slim",
                                                     source="print(1)"))
    work = ir.Step(name="work", body=ir.ScriptSpec(image="python:3.11-slim",
                                                   source="print(2)"))
    mourn = ir.Step(name="mourn", body=ir.ScriptSpec(image="python:3.11-slim",
                                                     source="print(3)"))
    wf = ir.Workflow(name="hooked", steps=(work,), exit_hooks=(
        ir.ExitHook(ir.RunStatus.SUCCEEDED, (hook,)),
        ir.ExitHook(ir.RunStatus.FAILED, (mourn,))))
    t0 = time.time()
    m, loop = console.monitor, console.loop
    loop.run(m.record_planned("hooked-1", workflow="hooked", engine="local", at=t0,
                              plan=codec.workflow_to_proto(wf).SerializeToString()))
    loop.run(m.record_submitted("hooked-1", workflow="hooked", engine="local", at=t0))
    loop.run(m.record_step("hooked-1", "hooked", "local", StepRecord(
        "work", StepState.SUCCEEDED, attempts=1, started_at=t0, finished_at=t0 + 1), t0 + 1))
    loop.run(m.record_step("hooked-1", "hooked", "local", StepRecord(
        "notify", StepState.PENDING), t0 + 1.5))
    with console.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        running = http.get("/runs/hooked-1").text
        assert 'class="node state-pending" data-step="notify"' in running  # may still run
        loop.run(m.record_finished(Run(run_id="hooked-1", state=RunState.SUCCEEDED,
                                       workflow="hooked", engine="local",
                                       finished_at=t0 + 2)))
        text = http.get("/runs/hooked-1").text
    assert "state-pending" not in text.split('<p class="legend">')[0]
    assert 'class="node state-unreported" data-step="notify"' in text
    assert 'class="node state-unreported" data-step="mourn"' in text
    notify = next(r for r in text.split("<tr>") if "<td>notify</td>" in r)
    assert ('<td class="state-unreported">unreported <span class="why">(not reported: the '
            "run succeeded before the engine reported this step (its last record said "
            "pending))</span>") in notify
    assert 'class="node state-succeeded" data-step="work"' in text


def test_the_cache_panels_count_reuse_bytes_and_compute_saved(console: Console) -> None:
    """Per run and over every run: reused records, the bytes of their stored outputs, and the
    compute saved -- the engine's figure, else the step's latest computed duration."""
    m, loop = console.monitor, console.loop
    t0 = time.time()
    loop.run(m.record_submitted("cached-0", workflow="reuse", engine="local", at=t0))
    loop.run(m.record_step("cached-0", "reuse", "local", StepRecord(
        "fit", StepState.SUCCEEDED, attempts=1, started_at=t0, finished_at=t0 + 30), t0 + 30))
    loop.run(m.record_submitted("cached-1", workflow="reuse", engine="local", at=t0 + 60))
    loop.run(m.record_step("cached-1", "reuse", "local", StepRecord(
        "prep", StepState.CACHED, cached=True, cache_saved_seconds=12.0,
        artifacts={"table": StoredArtifact("sha256:aa", 3 * 1024 * 1024, "s3://b/aa")}),
        t0 + 61))
    loop.run(m.record_step("cached-1", "reuse", "local", StepRecord(
        "fit", StepState.CACHED, cached=True,
        artifacts={"model": StoredArtifact("sha256:bb", 1024 * 1024, "s3://b/bb")}), t0 + 61))
    loop.run(m.record_step("cached-1", "reuse", "local", StepRecord(
        "report", StepState.RUNNING, attempts=1, started_at=t0 + 62), t0 + 62))
    with console.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        page = http.get("/runs/cached-1").text
        panel = " ".join(page.split('<section class="panel cache">', 1)[1]
                         .split("</section>", 1)[0].split())
        # 12 s (the engine's figure for prep) + 30 s (fit's computed run in cached-0)
        assert ("2 of 3 step records reused from the cache (67% hit ratio), 4.0 Mi of "
                "outputs reused, 42.0 s of compute saved.") in panel
        assert "s3://b/aa" in page  # the stored artifact, listed with its step
        totals = " ".join(http.get("/").text.split(
            '<section class="panel cache-total">', 1)[1].split())
        # over every record kept: the engines' own figures only (12 s)
        assert "4.0 Mi of outputs reused, 12.0 s of compute saved." in totals


def test_a_run_whose_record_cannot_be_shown_gets_a_page_saying_so(
        console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored data never takes the page down: when part of a run's record cannot be read
    (here the monitor's step details raise as an undecodable row would), the page names the
    run and the problem with a 200, and other runs' pages are not affected."""
    m, loop = console.monitor, console.loop
    t0 = time.time()
    for rid in ("damaged-1", "healthy-1"):
        loop.run(m.record_submitted(rid, workflow="damaged", engine="local", at=t0))
        loop.run(m.record_step(rid, "damaged", "local", StepRecord(
            "work", StepState.SUCCEEDED, attempts=1, started_at=t0, finished_at=t0 + 1),
            t0 + 1))
    details = m.step_details

    async def unreadable(run_id: str) -> Any:
        if run_id == "damaged-1":
            raise ValueError("Expecting value: line 1 column 1 (char 0)")
        return await details(run_id)

    monkeypatch.setattr(m, "step_details", unreadable)
    with console.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        page = http.get("/runs/damaged-1")
        healthy = http.get("/runs/healthy-1")
    assert page.status_code == 200, page.text[:300]
    assert "run &#39;damaged-1&#39;: part of its stored record cannot be read (ValueError)" \
        in page.text
    assert healthy.status_code == 200 and 'data-step="work"' in healthy.text
