"""The ops dashboard: a small FastAPI app served by uvicorn on the service's own event loop.

Pages (HTML, every value escaped: run ids, step names and messages come from users):

* ``/`` -- the latest runs: id, workflow, engine, state, started, duration, steps done/total,
  cached steps;
* ``/runs/{run_id}`` -- one run's steps: name, key, state, attempts, cached, duration, peak
  memory, peak CPU, message (for a skipped or cancelled step, why: e.g. "exit hook on failed
  did not fire: the run succeeded"); a failed or retrying step's state says which failure
  class and why, e.g. "failed (user error: Python ValueError in the traceback; not
  retried: ...)";
* ``/recommendations/{workflow}`` -- per step, the requests of the workflow's latest plan
  and what the monitor recommends: value, the recommender's target and range, its
  percentile, runs, samples, the time its histograms span, and why.

JSON: ``/api/runs?limit=``, ``/api/runs/{run_id}``,
``/api/utilization?workflow=&run_id=&step=&limit=``,
``/api/recommendations/{workflow}?step=``; ``/healthz`` answers ``{"status": "ok"}``
without authentication.

``/api/utilization`` answers the newest points of the time series, oldest first: raw
``samples`` (average cores over each interval, memory, interval) where the monitor keeps
them, and 1-minute ``rollups`` (mean and highest CPU, highest memory, count) for older
time, with the ``peaks`` per step over both.

``limit`` is a whole number: ``/api/runs`` lists 1 to :data:`MAX_RUNS` (500) runs, 100 by
default; ``/api/utilization`` returns 1 to ``MAX_SAMPLE_LIMIT`` (10000) points (samples and
rollups together), 1000 by default. Absent, empty or 0 means the default, a larger value
is capped at the maximum, and a negative or non-integer value is a 400.

With a token configured (``COULER_AUTH_TOKEN``) every other path needs it, as
``Authorization: Bearer <token>``, or once as ``?token=<token>``: that answer sets an
HttpOnly cookie (holding a digest of the token, not the token) and redirects to the same
page without the token in its URL, so a browser keeps working. Anything else is 401. The
redirect is always a path on the dashboard's own origin (:func:`local_target`), never a
URL built from the raw request target: ``//host/`` would be another site to a browser.

Errors (no or a wrong token, an unknown run or path, a bad query parameter) answer
``{"error": <message>, "status": <code>}`` under ``/api/`` and an HTML page elsewhere;
every answer carries the same strict Content-Security-Policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import hmac
import html
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, urlencode

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from couler import ir
from couler.engines.base import StepState
from couler.errors import NotFoundError, RetryableError, UserError
from couler_monitor.recommendations import MI
from couler_monitor.service import DEFAULT_SAMPLE_LIMIT, MAX_SAMPLE_LIMIT, Monitor
from couler_runtime.rpc.records import (
    RecommendationKind,
    RecommendationReport,
    Run,
    StepRecord,
    recommendation_json,
)

__all__ = ["COOKIE", "DEFAULT_RUNS", "MAX_RUNS", "DashboardServer", "create_app",
           "local_target", "recommendations_json", "recommendations_page"]

log = logging.getLogger(__name__)

COOKIE = "couler_dashboard"
_REFRESH_SECONDS = 5
_CACHED_MARK = '<span class="cached">cached</span>'
_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
DEFAULT_RUNS = 100
MAX_RUNS = 500
_INTERNAL_MESSAGE = "internal error (logged by the monitor)"
_UNAUTHORIZED_MESSAGE = ("a valid token is required: send 'Authorization: Bearer <token>', "
                         "or open the page once with ?token=<token>")
# What may stay unescaped in a redirect's path: RFC 3986 pchar and "/", without "%", so
# that every other character (a "\", "?", "#", a control character) is encoded and the
# browser asks for exactly the path that was requested.
_PATH_SAFE = "/!$&'()*+,;=:@-._~"
_LIMIT_SHOWN = 40  # characters of a bad value quoted back in an error message


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _time(at: float | None) -> str:
    if at is None:
        return "—"
    try:
        return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # a damaged record
        return "?"


def _duration(start: float | None, end: float | None, *, now: float) -> str:
    if start is None:
        return "—"
    seconds = max(0.0, (end if end is not None else now) - start)
    if seconds < 60:
        text = f"{seconds:.1f} s"
    else:
        minutes, sec = divmod(round(seconds), 60)
        hours, minutes = divmod(minutes, 60)
        text = f"{hours}h {minutes:02d}m {sec:02d}s" if hours else f"{minutes}m {sec:02d}s"
    return text if end is not None else f"{text} (running)"


def _memory(n: int | None) -> str:
    return "—" if n is None else f"{n / MI:.1f} Mi"


def _cpu(c: float | None) -> str:
    return "—" if c is None else f"{c:.2f} cores"


def _done(steps: tuple[StepRecord, ...]) -> int:
    return sum(1 for s in steps if s.state.terminal)


def _cached(steps: tuple[StepRecord, ...]) -> int:
    return sum(1 for s in steps if s.cached or s.state is StepState.CACHED)


def _page(title: str, body: str, *, refresh: bool = True) -> str:
    meta = f'<meta http-equiv="refresh" content="{_REFRESH_SECONDS}">\n' if refresh else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
{meta}<title>{_e(title)} · Couler</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ border-bottom: 1px solid #ddd; padding: .3rem .7rem; text-align: left; }}
th {{ background: #f4f4f4; }}
.state-succeeded {{ color: #17692b; }} .state-failed {{ color: #b00020; }}
.state-running, .state-pending {{ color: #1a4fa0; }} .state-cached {{ color: #6a3fa0; }}
.state-skipped, .state-cancelled {{ color: #6b6b6b; }}
.cached {{ background: #efe6fb; border-radius: 3px; padding: 0 .3rem; }}
.msg {{ white-space: pre-wrap; max-width: 40rem; }}
</style></head>
<body><h1>{_e(title)}</h1>
{body}
</body></html>"""


def _run_link(run_id: str) -> str:
    return f'<a href="/runs/{_e(quote(run_id, safe=""))}">{_e(run_id)}</a>'


def _workflow_link(workflow: str) -> str:
    if not workflow:
        return "—"
    return (f'<a href="/recommendations/{_e(quote(workflow, safe=""))}" '
            f'title="recommendations">{_e(workflow)}</a>')


def runs_page(runs: tuple[Run, ...], *, now: float) -> str:
    """The HTML of ``/``."""
    if not runs:
        return _page("Couler runs", "<p>No runs yet.</p>")
    rows = "\n".join(
        f"<tr><td>{_run_link(r.run_id)}</td><td>{_workflow_link(r.workflow)}</td>"
        f"<td>{_e(r.engine or '—')}</td>"
        f'<td class="state-{_e(r.state.value)}">{_e(r.state.value)}</td>'
        f"<td>{_time(r.started_at)}</td>"
        f"<td>{_duration(r.started_at, r.finished_at if r.state.terminal else None, now=now)}"
        f"</td><td>{_done(r.steps)}/{len(r.steps)}</td><td>{_cached(r.steps)}</td></tr>"
        for r in runs)
    return _page("Couler runs", (
        "<table><thead><tr><th>run</th><th>workflow</th><th>engine</th><th>state</th>"
        "<th>started (UTC)</th><th>duration</th><th>steps done</th><th>cached steps</th>"
        f"</tr></thead><tbody>\n{rows}\n</tbody></table>"))


def run_page(run: Run, *, now: float) -> str:
    """The HTML of ``/runs/{run_id}``."""
    head = (
        f"<p>workflow <b>{_workflow_link(run.workflow)}</b> on <b>{_e(run.engine or '—')}</b>, "
        f'<span class="state-{_e(run.state.value)}">{_e(run.state.value)}</span>, '
        f"started {_time(run.started_at)}, "
        f"{_duration(run.started_at, run.finished_at if run.state.terminal else None, now=now)}"
        f"; {_done(run.steps)}/{len(run.steps)} steps done, {_cached(run.steps)} cached</p>")
    if run.message:
        head += f'<p class="msg">{_e(run.message)}</p>'
    rows = "\n".join(
        f"<tr><td>{_e(s.name)}</td><td>{_e(s.key)}</td>"
        f'<td class="state-{_e(s.state.value)}">{_e(s.state.value)}{_failure(s)}</td>'
        f"<td>{s.attempts}</td>"
        f"<td>{_CACHED_MARK if s.cached else ''}</td>"
        f"<td>{_duration(s.started_at, s.finished_at, now=now) if not s.cached else '—'}</td>"
        f"<td>{_memory(s.peak_memory_bytes)}</td><td>{_cpu(s.peak_cpu)}</td>"
        f'<td class="msg">{_e(s.message)}</td></tr>'
        for s in run.steps)
    table = (
        "<table><thead><tr><th>step</th><th>key</th><th>state</th><th>attempts</th>"
        "<th>cached</th><th>duration</th><th>peak memory</th><th>peak CPU</th>"
        f"<th>message</th></tr></thead><tbody>\n{rows}\n</tbody></table>"
        if run.steps else "<p>No steps yet.</p>")
    return _page(f"Run {run.run_id}", f'<p><a href="/">all runs</a></p>{head}{table}')


def _failure(s: StepRecord) -> str:
    """`` (user error: ...)`` after a failed or retrying step's state: its class and why."""
    if s.state.value not in ("failed", "retrying"):
        return ""
    said = s.failure_reason or (s.failure_class.value if s.failure_class else "")
    return f' <span class="why">({_e(said)})</span>' if said else ""
_CURRENT_FIELD = {RecommendationKind.MEMORY_REQUEST: "memory_request",
                  RecommendationKind.CPU_REQUEST: "cpu_request",
                  RecommendationKind.MEMORY_LIMIT: "memory_limit"}


def _current(report: RecommendationReport, step: str) -> ir.Resources | None:
    """What the latest plan gave ``step`` (its own requests, else the workflow's
    defaults); None when no plan was seen."""
    planned = {q.step: q.resources for q in report.requested}
    if step in planned:
        return planned[step]
    return planned.get("")


def _steps(report: RecommendationReport) -> list[str]:
    return sorted({r.step for r in report.recommendations}
                  | {q.step for q in report.requested if q.step})


def _span(seconds: float) -> str:
    return _duration(0.0, seconds, now=0.0) if seconds else "—"


def recommendations_json(workflow: str, report: RecommendationReport) -> dict[str, Any]:
    """The JSON of ``/api/recommendations/{workflow}`` (as ``couler recommend --json``)."""
    steps = []
    for name in _steps(report):
        current = _current(report, name)
        steps.append({
            "step": name,
            "current": None if current is None else {
                "cpu_request": current.cpu_request, "memory_request": current.memory_request,
                "cpu_limit": current.cpu_limit, "memory_limit": current.memory_limit},
            "recommendations": [
                recommendation_json(r)
                for r in report.recommendations if r.step == name]})
    return {"workflow": workflow, "planned": bool(report.requested), "steps": steps}


def recommendations_page(workflow: str, report: RecommendationReport) -> str:
    """The HTML of ``/recommendations/{workflow}``."""
    title = f"Recommendations for {workflow}"
    back = '<p><a href="/">all runs</a></p>'
    names = _steps(report)
    if not names:
        return _page(title, back + "<p>Nothing recommended yet: a step needs a few measured "
                                   "runs.</p>")
    rows = []
    for name in names:
        current = _current(report, name)
        recs = [r for r in report.recommendations if r.step == name]
        if not recs:
            rows.append(f"<tr><td>{_e(name)}</td><td>—</td><td>—</td><td>—</td>"
                        + "<td>—</td>" * 6 + '<td class="msg">no recommendation yet</td></tr>')
            continue
        for r in recs:
            field = _CURRENT_FIELD.get(r.kind)
            now = ("unknown" if current is None or field is None
                   else getattr(current, field) or "not set")
            resource = r.percentile > 0
            rows.append(
                f"<tr><td>{_e(name)}</td><td>{_e(r.kind.value)}</td><td>{_e(now)}</td>"
                f"<td><b>{_e(r.value)}</b></td>"
                f"<td>{_e(r.target) if resource else '—'}</td>"
                f"<td>{_e(f'{r.lower_bound}..{r.upper_bound}') if resource else '—'}</td>"
                f"<td>{_e(f'p{r.percentile * 100:g}') if resource else '—'}</td>"
                f"<td>{r.runs if resource else '—'}</td>"
                f"<td>{r.samples if resource else '—'}</td>"
                f"<td>{_span(r.span_seconds) if resource else '—'}</td>"
                f'<td class="msg">{_e(r.reason)}</td></tr>')
    planned = ("" if report.requested else
               "<p>No plan of this workflow was seen: the current requests are unknown.</p>")
    return _page(title, back + planned + (
        "<table><thead><tr><th>step</th><th>kind</th><th>current</th><th>recommended</th>"
        "<th>target</th><th>range</th><th>percentile</th><th>runs</th><th>samples</th>"
        "<th>history</th><th>why</th></tr></thead><tbody>\n"
        + "\n".join(rows) + "\n</tbody></table>"))


def error_page(status: int, message: str) -> str:
    """The HTML of an error answer: the status and ``message`` (escaped)."""
    title = f"{status} {HTTPStatus(status).phrase}"
    return _page(title, f'<p class="msg">{_e(message)}</p><p><a href="/">all runs</a></p>',
                 refresh=False)


def _step_json(s: StepRecord) -> dict[str, Any]:
    return {"name": s.name, "key": s.key, "state": s.state.value, "attempts": s.attempts,
            "cached": s.cached, "exit_code": s.exit_code, "started_at": s.started_at,
            "finished_at": s.finished_at, "peak_memory_bytes": s.peak_memory_bytes,
            "peak_cpu": s.peak_cpu, "message": s.message,
            "failure_class": s.failure_class.value if s.failure_class else None,
            "failure_reason": s.failure_reason}


def _run_json(r: Run, *, steps: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "run_id": r.run_id, "workflow": r.workflow, "engine": r.engine, "state": r.state.value,
        "created_at": r.created_at, "started_at": r.started_at, "finished_at": r.finished_at,
        "message": r.message, "steps_total": len(r.steps), "steps_done": _done(r.steps),
        "cached_steps": _cached(r.steps)}
    if steps:
        out["steps"] = [_step_json(s) for s in r.steps]
    return out


def _token_digest(token: str) -> str:
    return hashlib.sha256(f"couler-dashboard:{token}".encode()).hexdigest()


def local_target(path: str, query: Sequence[tuple[str, str]] = ()) -> str:
    """A redirect target on this origin for the (decoded) request ``path`` and ``query``.

    The request target is the client's: it may start with ``//`` (another host, to a
    browser, also as ``/%2F%2F``), contain ``\\`` (read as ``/``), or be a whole URL
    (``GET https://host/``). The answer is a path starting with exactly one ``/``
    (leading slashes collapse; slashes inside, as in run ids, stay), every character
    outside a URL path's alphabet percent-encoded, and the query re-encoded.
    """
    target = quote("/" + path.lstrip("/"), safe=_PATH_SAFE)
    return f"{target}?{urlencode(query)}" if query else target


def _limit(where: str, raw: str | None, *, default: int, maximum: int) -> int:
    """The ``limit`` query parameter: default when absent, empty or 0; capped at ``maximum``.

    Raises:
        _HttpError: 400 for a negative or non-integer value.
    """
    if raw is None or raw in ("", "0"):
        return default
    if re.fullmatch(r"[0-9]+", raw):
        # Long digit strings are above any maximum; int() of them is needlessly slow.
        return maximum if len(raw) > 9 else min(int(raw) or default, maximum)
    shown = raw if len(raw) <= _LIMIT_SHOWN else raw[:_LIMIT_SHOWN] + "..."
    problem = ("must not be negative" if re.fullmatch(r"-[0-9]+", raw)
               else "must be a whole number")
    raise _HttpError(400, f"{where}: query parameter 'limit' {problem} "
                          f"(0 for the default, {default}; at most {maximum}); "
                          f"got {shown!r}")


def _error(request: Request, status: int, message: str,
           headers: Mapping[str, str] | None = None) -> Response:
    """An error answer: JSON under /api/ (and /healthz), an HTML page elsewhere."""
    path = request.scope.get("path", "")
    if path.startswith("/api/") or path in ("/api", "/healthz"):
        return JSONResponse({"error": message, "status": status}, status_code=status,
                            headers=headers)
    return HTMLResponse(error_page(status, message), status_code=status, headers=headers)


def create_app(monitor: Monitor, *, token: str | None = None,
               clock: Callable[[], float] = time.time) -> FastAPI:
    """The dashboard's ASGI app over ``monitor``; ``token`` guards every page but /healthz."""
    # redirect_slashes=False: Starlette would answer "/healthz/" with a redirect to an
    # absolute URL built from the client's Host header.
    app = FastAPI(title="Couler monitor", docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    digest = _token_digest(token) if token else None

    async def answer(request: Request,
                     call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        try:
            return _secured(await call_next(request))
        except Exception:
            # Logged here, answered like every other error (not uvicorn's plain text).
            log.exception("dashboard: %s %s failed", request.method, request.scope.get("path"))
            return _secured(_error(request, 500, _INTERNAL_MESSAGE))

    @app.middleware("http")
    async def guard(request: Request,
                    call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if token is None or digest is None or request.scope.get("path") == "/healthz":
            return await answer(request, call_next)
        auth = request.headers.get("authorization", "")
        scheme, _, bearer = auth.partition(" ")
        query = request.query_params.get("token")
        ok = (
            (scheme.lower() == "bearer" and hmac.compare_digest(bearer.strip().encode(),
                                                                token.encode()))
            or (query is not None and hmac.compare_digest(query.encode(), token.encode()))
            or hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), digest.encode())
        )
        if not ok:
            return _secured(_error(request, 401, _UNAUTHORIZED_MESSAGE,
                                   {"WWW-Authenticate": "Bearer"}))
        if query is None:
            return await answer(request, call_next)
        # Keep the token out of the address bar and history: remember it in a cookie.
        # The target is built from the path alone (request.url would take a scheme and
        # host from a request target like "https://host/").
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = local_target(request.scope.get("path", "/"), rest)
        response: Response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, digest, httponly=True, samesite="strict", path="/")
        return _secured(response)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        with _errors():
            runs = await monitor.runs(DEFAULT_RUNS)
        return HTMLResponse(runs_page(runs, now=clock()))

    @app.get("/runs/{run_id:path}", response_class=HTMLResponse)
    async def run(run_id: str) -> HTMLResponse:
        with _errors():
            got = await monitor.run(run_id)
        return HTMLResponse(run_page(got, now=clock()))

    # ``limit`` is taken as text and parsed by _limit, for an error that says what is
    # wrong (FastAPI's own would be a 422 listing pydantic's validation errors).
    @app.get("/api/runs")
    async def api_runs(limit: str | None = None) -> list[dict[str, Any]]:
        count = _limit("/api/runs", limit, default=DEFAULT_RUNS, maximum=MAX_RUNS)
        with _errors():
            runs = await monitor.runs(count)
        return [_run_json(r, steps=False) for r in runs]

    @app.get("/api/runs/{run_id:path}")
    async def api_run(run_id: str) -> dict[str, Any]:
        with _errors():
            got = await monitor.run(run_id)
        return _run_json(got, steps=True)

    @app.get("/recommendations/{workflow:path}", response_class=HTMLResponse)
    async def recommendations(workflow: str) -> HTMLResponse:
        with _errors():
            got = await monitor.recommendation_report(workflow)
        return HTMLResponse(recommendations_page(workflow, got))

    @app.get("/api/recommendations/{workflow:path}")
    async def api_recommendations(workflow: str, step: str = "") -> dict[str, Any]:
        with _errors():
            got = await monitor.recommendation_report(workflow, step)
        return recommendations_json(workflow, got)

    @app.get("/api/utilization")
    async def api_utilization(workflow: str = "", run_id: str = "", step: str = "",
                              limit: str | None = None) -> dict[str, Any]:
        count = _limit("/api/utilization", limit, default=DEFAULT_SAMPLE_LIMIT,
                       maximum=MAX_SAMPLE_LIMIT)
        with _errors():
            got = await monitor.utilization(run_id=run_id, workflow=workflow, step=step,
                                            limit=count)
        return {
            "samples": [{"run_id": s.run_id, "workflow": s.workflow, "step": s.step,
                         "key": s.key, "attempt": s.attempt, "at": s.at, "cpu": s.cpu,
                         "memory_bytes": s.memory_bytes,
                         "interval_seconds": s.interval_seconds} for s in got.samples],
            "rollups": [{"run_id": r.run_id, "workflow": r.workflow, "step": r.step,
                         "key": r.key, "attempt": r.attempt, "start": r.start,
                         "cpu_mean": r.cpu_mean, "cpu_max": r.cpu_max,
                         "memory_max_bytes": r.memory_max_bytes, "samples": r.samples}
                        for r in got.rollups],
            "peaks": [{"run_id": p.run_id, "workflow": p.workflow, "step": p.step,
                       "key": p.key, "peak_cpu": p.peak_cpu,
                       "peak_memory_bytes": p.peak_memory_bytes, "samples": p.samples}
                      for p in got.peaks],
        }

    @app.exception_handler(_HttpError)
    async def http_error(request: Request, exc: _HttpError) -> Response:
        return _error(request, exc.status, exc.detail)

    @app.exception_handler(StarletteHTTPException)
    async def framework_error(request: Request, exc: StarletteHTTPException) -> Response:
        path = request.scope.get("path", "")
        message = {404: f"nothing at {path!r}",
                   405: f"{request.method} is not allowed on {path!r}"}.get(
            exc.status_code, str(exc.detail))
        return _error(request, exc.status_code, message, exc.headers)

    return app


class _HttpError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Couler errors as HTTP statuses (the dashboard's edge, like the gRPC interceptor)."""
    try:
        yield
    except NotFoundError as e:
        raise _HttpError(404, str(e)) from e
    except UserError as e:
        raise _HttpError(400, str(e)) from e
    except RetryableError as e:
        raise _HttpError(503, str(e)) from e


def _secured(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the service's harness owns SIGTERM / SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class DashboardServer:
    """The dashboard's HTTP server, a task on the running loop.

    Args:
        app: The ASGI app.
        address: ``host:port`` to listen on (port 0 picks a free one).
    """

    def __init__(self, app: FastAPI, address: str) -> None:
        self._app = app
        self._address = address
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self.url = ""

    async def start(self) -> str:
        """Bind and start serving; the dashboard's URL.

        Raises:
            UserError: The address is invalid or taken.
        """
        host, _, port = self._address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            family = infos[0][0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(infos[0][4])
            sock.listen(128)
        except (OSError, ValueError) as e:
            raise UserError(f"dashboard address {self._address!r} "
                            f"(COULER_DASHBOARD_ADDRESS): {e}") from e
        sock.setblocking(False)
        self._sock = sock
        bound = sock.getsockname()[1]
        # log_config=None: the process's logging stays as the service harness set it up.
        config = uvicorn.Config(self._app, log_config=None, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=5)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]),
                                         name="monitor-dashboard")
        while not self._server.started:
            if self._task.done():
                exc = self._task.exception()
                raise UserError(f"dashboard on {self._address!r} did not start: {exc!r}")
            await asyncio.sleep(0.01)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}/"
        return self.url

    async def stop(self) -> None:
        """Stop serving (requests in flight get a few seconds to finish)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, SystemExit):
                await self._task
        if self._sock is not None:
            self._sock.close()
        self._server = self._task = self._sock = None
