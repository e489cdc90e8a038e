"""The monitor's dashboard under hostile requests, served by a real uvicorn on 127.0.0.1:0.

A real :class:`Monitor` over a SQLite store answers; it records the limits it is asked
for, so the caps are visible. Redirects are never followed: every Location is checked.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httpx
import pytest

from couler_monitor.dashboard import DashboardServer, create_app
from couler_monitor.service import Monitor, RunPage, RunQuery
from couler_monitor.store import MonitorStore
from couler_runtime.rpc.records import Recommendation, Run, Utilization
from tests.integration.loop_thread import LoopThread

TOKEN = "dashboard-hardening-token-4d1e"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
WAIT = 30.0


class RecordingMonitor(Monitor):
    """The real monitor, noting the limits it was asked for; ``failure`` makes runs raise."""

    def __init__(self, store: MonitorStore) -> None:
        async def publish(recommendation: Recommendation) -> None:
            raise AssertionError(f"nothing should be published, got {recommendation}")

        super().__init__(store, publish)
        self.limits: list[tuple[str, int]] = []
        self.failure: Exception | None = None

    async def runs(self, limit: int = 100) -> tuple[Run, ...]:
        self.limits.append(("runs", limit))
        if self.failure is not None:
            raise self.failure
        return await super().runs(limit)

    async def run_page(self, query: RunQuery) -> RunPage:
        if self.failure is not None:
            raise self.failure
        return await super().run_page(query)

    async def utilization(self, *, run_id: str = "", workflow: str = "", step: str = "",
                          limit: int = 0) -> Utilization:
        self.limits.append(("utilization", limit))
        return await super().utilization(run_id=run_id, workflow=workflow, step=step,
                                         limit=limit)


class Dashboard:
    def __init__(self, url: str, monitor: RecordingMonitor) -> None:
        self.url, self.monitor = url, monitor

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=WAIT, follow_redirects=False, **kw)

    def get_raw(self, http: httpx.Client, target: bytes, **kw: Any) -> httpx.Response:
        """GET with ``target`` sent as it is (httpx would resolve ``//host/`` itself)."""
        url = httpx.URL(self.url).copy_with(raw_path=target)
        return http.send(http.build_request("GET", url, **kw))


@pytest.fixture(scope="module")
def dashboards(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[dict[str | None, Dashboard]]:
    """An open dashboard and one behind TOKEN, each over its own store holding run r-1."""
    servers: list[DashboardServer] = []
    stores: list[MonitorStore] = []
    running: dict[str | None, Dashboard] = {}
    try:
        for token in (None, TOKEN):
            db = tmp_path_factory.mktemp("dashboard") / "monitor.db"
            store = MonitorStore.open(f"sqlite:///{db}")
            stores.append(store)
            monitor = RecordingMonitor(store)
            loop.run(monitor.record_submitted("r-1", workflow="train", engine="local",
                                              at=time.time()))
            server = DashboardServer(create_app(monitor, token=token), "127.0.0.1:0")
            servers.append(server)
            running[token] = Dashboard(loop.run(server.start()), monitor)
        yield running
    finally:
        for server in servers:
            loop.run(server.stop())
        for store in stores:
            store.close()


@pytest.fixture
def start(dashboards: dict[str | None, Dashboard]) -> Callable[[str | None], Dashboard]:
    """The dashboard with ``token`` (or none), its monitor's notes cleared."""
    def get(token: str | None) -> Dashboard:
        dashboard = dashboards[token]
        dashboard.monitor.limits.clear()
        dashboard.monitor.failure = None
        return dashboard

    return get


def assert_local(dashboard: Dashboard, location: str) -> None:
    """``location`` is a path on the dashboard's origin, however a browser reads it."""
    assert location.startswith("/"), location
    assert not location.startswith("//"), location
    assert all(33 <= ord(c) < 127 and c != "\\" for c in location), location
    parts = urlsplit(location)
    assert (parts.scheme, parts.netloc) == ("", ""), location
    resolved = urlsplit(urljoin(dashboard.url, location))
    assert (resolved.scheme, resolved.netloc) == ("http", urlsplit(dashboard.url).netloc)


# =========================================================================== redirects


@pytest.mark.parametrize(("target", "location"), [
    (b"//evil.example/", "/evil.example/"),
    (b"///evil.example", "/evil.example"),
    (b"/\\evil.example", "/%5Cevil.example"),
    (b"/\\/evil.example", "/%5C/evil.example"),
    (b"/%2F%2Fevil.example", "/evil.example"),
    (b"/%5C%5Cevil.example", "/%5C%5Cevil.example"),
    (b"/%09/evil.example", "/%09/evil.example"),
    (b"/https://evil.example/", "/https://evil.example/"),
    (b"/x%0D%0ALocation:%20https://evil.example", "/x%0D%0ALocation:%20https://evil.example"),
    (b"/a%3Fb%23c", "/a%3Fb%23c"),
    (b"/runs/a%2F%2Fb", "/runs/a//b"),  # a run id with slashes keeps them
    (b"/", "/"),
])
def test_the_token_redirect_stays_on_the_dashboard(start: Callable[[str | None], Dashboard],
                                                    target: bytes, location: str) -> None:
    dashboard = start(TOKEN)
    with dashboard.client() as http:
        for query, kept in ((f"token={TOKEN}", ""),
                            (f"x=%2F%2Fevil.example&token={TOKEN}&y=1",
                             "?x=%2F%2Fevil.example&y=1")):
            answer = dashboard.get_raw(http, target + b"?" + query.encode())
            assert answer.status_code == 303
            assert answer.headers["location"] == location + kept
            assert_local(dashboard, answer.headers["location"])
            assert answer.headers["content-security-policy"] == CSP


def raw_get(dashboard: Dashboard, target: bytes, host: bytes = b"127.0.0.1"
            ) -> tuple[int, dict[str, str]]:
    """GET in absolute form (``GET https://host/ HTTP/1.1``), which httpx cannot send."""
    parts = urlsplit(dashboard.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=WAIT) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: " + host +
                     b"\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (line.partition(":") for line in head[1:])}
    return int(head[0].split()[1]), headers


@pytest.mark.parametrize(("target", "location"), [
    (b"https://evil.example/", "/https://evil.example/"),
    (b"https://evil.example", "/https://evil.example"),
    (b"http://evil.example/runs/r-1", "/http://evil.example/runs/r-1"),
])
def test_a_whole_url_as_request_target_redirects_to_a_local_path(
        start: Callable[[str | None], Dashboard], target: bytes, location: str) -> None:
    dashboard = start(TOKEN)
    status, headers = raw_get(dashboard, target + f"?token={TOKEN}".encode(),
                              host=b"evil.example")
    assert status == 303
    assert headers["location"] == location
    assert_local(dashboard, headers["location"])


@pytest.mark.parametrize("token", [None, TOKEN])
def test_no_trailing_slash_redirect_to_the_host_header(start: Callable[[str | None], Dashboard],
                                                       token: str | None) -> None:
    dashboard = start(token)
    headers = {"Host": "evil.example"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with dashboard.client() as http:
        page = http.get("/healthz/", headers=headers)
        api = http.get("/api/utilization/", headers=headers)
    for answer in (page, api):
        assert answer.status_code == 404
        assert "location" not in answer.headers
    assert "nothing at &#39;/healthz/&#39;" in page.text
    assert api.json() == {"error": "nothing at '/api/utilization/'", "status": 404}


# =========================================================================== limits


@pytest.mark.parametrize(("raw", "asked"), [
    (None, 100), ("", 100), ("0", 100), ("7", 7), ("500", 500), ("501", 500),
    ("100000", 500), ("9" * 40, 500),
])
def test_the_runs_limit_defaults_and_is_capped(start: Callable[[str | None], Dashboard],
                                               raw: str | None, asked: int) -> None:
    dashboard = start(None)
    with dashboard.client() as http:
        answer = http.get("/api/runs", params={} if raw is None else {"limit": raw})
    assert answer.status_code == 200
    assert [r["run_id"] for r in answer.json()] == ["r-1"]
    assert dashboard.monitor.limits == [("runs", asked)]


@pytest.mark.parametrize(("raw", "asked"), [
    (None, 1000), ("0", 1000), ("25", 25), ("10000", 10000), ("10001", 10000),
    ("123456789012", 10000),
])
def test_the_utilization_limit_defaults_and_is_capped(start: Callable[[str | None], Dashboard],
                                                      raw: str | None, asked: int) -> None:
    dashboard = start(None)
    params = {"workflow": "train"} | ({} if raw is None else {"limit": raw})
    with dashboard.client() as http:
        answer = http.get("/api/utilization", params=params)
    assert answer.status_code == 200
    assert answer.json() == {"samples": [], "peaks": [], "rollups": []}
    assert dashboard.monitor.limits == [("utilization", asked)]


@pytest.mark.parametrize("path", ["/api/runs", "/api/utilization?workflow=train"])
@pytest.mark.parametrize(("raw", "problem"), [
    ("-1", "must not be negative"), ("-100000", "must not be negative"),
    ("abc", "must be a whole number"), ("1.5", "must be a whole number"),
    ("1e3", "must be a whole number"), ("0x10", "must be a whole number"),
    (" 5", "must be a whole number"), ("1_000", "must be a whole number"),
    ("\uff15", "must be a whole number"),  # a fullwidth digit five
])
def test_a_bad_limit_is_a_clear_400(start: Callable[[str | None], Dashboard], path: str, raw: str,
                                    problem: str) -> None:
    dashboard = start(TOKEN)
    with dashboard.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        answer = http.get(path, params={"limit": raw})
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["content-security-policy"] == CSP
    body = answer.json()
    assert set(body) == {"error", "status"} and body["status"] == 400
    where = path.split("?", maxsplit=1)[0]
    assert body["error"].startswith(f"{where}: query parameter 'limit' {problem}")
    assert body["error"].endswith(f"got {raw!r}")
    assert dashboard.monitor.limits == []  # refused before the monitor was asked


# =========================================================================== errors


def test_errors_are_json_under_api_and_pages_elsewhere(
        start: Callable[[str | None], Dashboard]) -> None:
    dashboard = start(TOKEN)
    hostile = "<script>alert(1)</script>"
    with dashboard.client() as anonymous:
        for path in ("/", "/runs/r-1", "/no/such/page"):
            page = anonymous.get(path)
            assert page.status_code == 401, path
            assert page.headers["content-type"].startswith("text/html")
            assert page.headers["www-authenticate"] == "Bearer"
            assert page.headers["content-security-policy"] == CSP
            assert "401 Unauthorized" in page.text and "a valid token is required" in page.text
        api = anonymous.get("/api/runs")
        assert api.status_code == 401
        assert api.headers["www-authenticate"] == "Bearer"
        assert api.headers["content-security-policy"] == CSP
        assert api.json()["status"] == 401
        assert api.json()["error"].startswith("a valid token is required")

    with dashboard.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        missing = http.get("/runs/nope")
        assert missing.status_code == 404
        assert missing.headers["content-type"].startswith("text/html")
        assert "404 Not Found" in missing.text and "run &#39;nope&#39;: not found" in (
            missing.text)
        escaped = http.get(f"/runs/{quote(hostile, safe='')}")
        assert escaped.status_code == 404
        assert hostile not in escaped.text and "&lt;script&gt;" in escaped.text
        assert http.get("/api/runs/nope").json() == {"error": "run 'nope': not found",
                                                     "status": 404}
        nowhere = http.get("/no/such/page")
        assert nowhere.status_code == 404 and "nothing at &#39;/no/such/page&#39;" in (
            nowhere.text)
        assert http.get("/api/nope").json() == {"error": "nothing at '/api/nope'",
                                                "status": 404}
        not_allowed = http.post("/api/runs")
        assert not_allowed.status_code == 405
        assert not_allowed.headers["allow"] == "GET"
        assert not_allowed.json() == {"error": "POST is not allowed on '/api/runs'",
                                      "status": 405}
        assert http.get("/api/utilization").json()["status"] == 400
        for answer in (missing, escaped, nowhere, not_allowed):
            assert answer.headers["content-security-policy"] == CSP


def test_an_unexpected_failure_is_a_generic_500_and_logged(
        start: Callable[[str | None], Dashboard], caplog: pytest.LogCaptureFixture) -> None:
    dashboard = start(None)
    dashboard.monitor.failure = RuntimeError("store exploded: password=hunter2")
    with caplog.at_level(logging.ERROR, logger="couler_monitor.dashboard"), \
            dashboard.client() as http:
        api = http.get("/api/runs")
        page = http.get("/")
    assert api.status_code == 500
    assert api.json() == {"error": "internal error (logged by the monitor)", "status": 500}
    assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
    assert "internal error (logged by the monitor)" in page.text
    for answer in (api, page):
        assert "hunter2" not in answer.text
        assert answer.headers["content-security-policy"] == CSP
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is RuntimeError]
    assert [r.getMessage() for r in logged] == ["dashboard: GET /api/runs failed",
                                                "dashboard: GET / failed"]
