"""The ops console: server-rendered pages (Jinja2) and a JSON API, served by uvicorn on the
monitor's own event loop.

Pages (every value escaped by the templates: run ids, step names, messages and logs come
from users):

* ``/`` -- the runs, newest first: filters (state, workflow, engine, since when), search
  (``q``: text in the run id, workflow or message), paging (``page``), the cache figures over
  every run kept; the table follows the store live (server-sent events, no reloads);
* ``/runs/{run_id}`` -- one run: its graph (SVG, layers by dependency depth, coloured by
  state, map items / chunks as marks), the cache panel, each step's attempts, failure class
  and reason, inputs, outputs and cache status, CPU and memory over time against the planned
  request and limit (growing live while the step runs), the logs (fetched from the
  submitter), the recommendations for the workflow's next run, and the actions;
* ``/recommendations/{workflow}`` -- what the optimizer will change next time, with the
  evidence (the recommender's target, range, percentile, runs, samples, history, why);
* ``/login`` -- the token form (a session cookie); ``POST /logout`` ends the session.

Live updates: ``/events/runs?<filters>`` and ``/events/runs/{run_id}`` are
``text/event-stream``: an ``event: fragment`` with the re-rendered part of the page
whenever it changed (checked every ``live_interval`` seconds), comments as heartbeats.
``/static/console.js`` (the only script: it swaps those fragments in) and
``/static/console.css`` are served by the monitor itself.

Actions: ``POST /runs/{run_id}/cancel``, ``/retry`` (from the failure point) and
``/resubmit`` (the run's latest planned workflow as a new run) call the submitter over gRPC
(``COULER_SUBMITTER_ADDRESS``, with the monitor's token). They need a token to be configured
(an open console offers no actions) and, from a browser, a session: the form carries the
session's CSRF token, the cookie is ``SameSite=Strict``, and the request's ``Origin`` (or
``Sec-Fetch-Site``) must be this origin. A client sending ``Authorization: Bearer`` needs
none of that (a browser never sends it cross-site).

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

With a token configured (``COULER_AUTH_TOKEN``) every other path (but ``/static/`` and
``/login``) needs it: as ``Authorization: Bearer <token>``, through the login form, or once as
``?token=<token>``. The last two start a session: an HttpOnly, SameSite=Strict cookie holding
a random session id (never the token), and a redirect to the page without the token in its
URL. Without it a page answers 401 with the login form, an ``/api/`` path 401 in JSON. A
redirect is always a path on the console's own origin (:func:`local_target`), never a URL
built from the raw request target: ``//host/`` would be another site to a browser.

Errors (no or a wrong token, an unknown run or path, a bad query parameter, a refused
action) answer ``{"error": <message>, "status": <code>}`` under ``/api/`` and an HTML page
elsewhere; every answer carries the same strict Content-Security-Policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from google.protobuf import text_format
from starlette.exceptions import HTTPException as StarletteHTTPException

from couler import ir
from couler.engines.base import StepState
from couler.errors import CoulerError, NotFoundError, RetryableError, UserError
from couler.v1 import workflow_pb2
from couler_monitor import console
from couler_monitor.recommendations import MI
from couler_monitor.service import DEFAULT_SAMPLE_LIMIT, MAX_SAMPLE_LIMIT, Monitor, RunQuery
from couler_runtime import codec
from couler_runtime.http_server import AsgiServer
from couler_runtime.rpc.records import (
    RecommendationKind,
    RecommendationReport,
    Run,
    RunState,
    StepRecord,
    recommendation_json,
)

__all__ = ["COOKIE", "CSP", "DEFAULT_RUNS", "MAX_RUNS", "DashboardServer", "Submitter",
           "create_app", "local_target", "recommendations_json"]

log = logging.getLogger(__name__)

COOKIE = "couler_session"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
DEFAULT_RUNS = 100
MAX_RUNS = 500
PAGE_RUNS = 50  # runs per page of the console's list
MAX_SESSIONS = 10_000
SESSION_SECONDS = 12 * 3600.0
LOG_BYTES = 64 * 1024  # the tail of each step's log shown in the page
LOG_STEPS = 30  # step executions whose logs a run page fetches
MAX_STEP_ROWS = 1000  # step records a run page lists (the JSON API has them all)
_INTERNAL_MESSAGE = "internal error (logged by the monitor)"
_UNAUTHORIZED_MESSAGE = ("a valid token is required: log in with it, send "
                         "'Authorization: Bearer <token>', or open the page once with "
                         "?token=<token>")
# What may stay unescaped in a redirect's path: RFC 3986 pchar and "/", without "%", so
# that every other character (a "\", "?", "#", a control character) is encoded and the
# browser asks for exactly the path that was requested.
_PATH_SAFE = "/!$&'()*+,;=:@-._~"
_LIMIT_SHOWN = 40  # characters of a bad value quoted back in an error message
_HERE = Path(__file__).resolve().parent
_STATIC = {"console.js": "text/javascript; charset=utf-8",
           "console.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
_RANGES = (("", "any time"), ("3600", "last hour"), ("86400", "last 24 hours"),
           ("604800", "last 7 days"), ("2592000", "last 30 days"))
_ACTIONS = (("cancel", "Cancel"), ("retry", "Retry from failure"), ("resubmit", "Resubmit"))
_LEGEND = ("pending", "running", "succeeded", "failed", "cached", "skipped", "cancelled",
           "unreported")


class Submitter(Protocol):
    """What the console's actions and logs need of the submitter (blocking calls; a
    :class:`couler_runtime.client.SubmitterClient`)."""

    def cancel(self, run_id: str, reason: str = "") -> Run: ...

    def retry(self, run_id: str) -> Run: ...

    def submit(self, source: ir.Workflow | str | None = None, *,
               engine: str = "") -> Any: ...

    def logs(self, run_id: str, step: str, key: str = "", *, max_bytes: int = 0) -> str: ...


@dataclasses.dataclass
class _Session:
    csrf: str
    expires: float
    flash: str = ""


def _time(at: float | None) -> str:
    if at is None:
        return "—"
    try:
        return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # a damaged record
        return "?"


def _seconds(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {sec:02d}s" if hours else f"{minutes}m {sec:02d}s"


def _duration(start: float | None, end: float | None, *, now: float) -> str:
    if start is None:
        return "—"
    text = _seconds((end if end is not None else now) - start)
    return text if end is not None else f"{text} (running)"


def _memory(n: int | None) -> str:
    return "—" if n is None else f"{n / MI:.1f} Mi"


def _size(n: float | None) -> str:
    if n is None:
        return "—"
    for unit, scale in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _cpu(c: float | None) -> str:
    return "—" if c is None else f"{c:.2f} cores"


def _done(steps: tuple[StepRecord, ...]) -> int:
    return sum(1 for s in steps if s.state.terminal)


def _cached(steps: tuple[StepRecord, ...]) -> int:
    return sum(1 for s in steps if s.cached or s.state is StepState.CACHED)


def _run_duration(run: Run, now: float) -> str:
    return _duration(run.started_at, run.finished_at if run.state.terminal else None, now=now)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(time=_time, size=_size, seconds=_seconds,
                       urlpart=lambda v: quote(str(v), safe=""), run_duration=_run_duration)
    return env


def _failure(s: StepRecord) -> str:
    """A failed or retrying step's class and why (shown after its state)."""
    if s.state.value not in ("failed", "retrying"):
        return ""
    return s.failure_reason or (s.failure_class.value if s.failure_class else "")


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
    return _seconds(seconds) if seconds else "—"


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


def _recommendation_rows(report: RecommendationReport) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in _steps(report):
        current = _current(report, name)
        recs = [r for r in report.recommendations if r.step == name]
        if not recs:
            rows.append({"cells": [name, "—", "—", "—", *["—"] * 6], "bold": False,
                         "why": "no recommendation yet"})
            continue
        for r in recs:
            field = _CURRENT_FIELD.get(r.kind)
            now = ("unknown" if current is None or field is None
                   else getattr(current, field) or "not set")
            resource = r.percentile > 0
            rows.append({"cells": [
                name, r.kind.value, now, r.value,
                r.target if resource else "—",
                f"{r.lower_bound}..{r.upper_bound}" if resource else "—",
                f"p{r.percentile * 100:g}" if resource else "—",
                r.runs if resource else "—", r.samples if resource else "—",
                _span(r.span_seconds) if resource else "—"], "bold": True, "why": r.reason})
    return rows


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


def _is_api(request: Request) -> bool:
    path = request.scope.get("path", "")
    return path.startswith("/api/") or path in ("/api", "/healthz")


def _query(params: Mapping[str, str], *, now: float) -> tuple[RunQuery, str, int]:
    """The runs list's filters from the query string: (query, the range chosen, page)."""
    page_raw = params.get("page", "1")
    page = int(page_raw) if page_raw.isdigit() and 0 < len(page_raw) < 7 else 1
    page = max(1, page)
    since_raw = params.get("since", "")
    since = float(since_raw) if since_raw in {v for v, _ in _RANGES if v} else None
    state = params.get("state", "")
    if state and state not in {s.value for s in RunState}:
        raise _HttpError(400, f"state {state[:_LIMIT_SHOWN]!r} is not one of "
                              f"{', '.join(s.value for s in RunState)}")
    query = RunQuery(state=state, workflow=params.get("workflow", "")[:255],
                     engine=params.get("engine", "")[:64],
                     since=None if since is None else now - since,
                     text=params.get("q", "").strip()[:200],
                     offset=(page - 1) * PAGE_RUNS, limit=PAGE_RUNS)
    return query, since_raw if since is not None else "", page


def create_app(monitor: Monitor, *, token: str | None = None,
               clock: Callable[[], float] = time.time, submitter: Submitter | None = None,
               live_interval: float = 1.0) -> FastAPI:
    """The console's ASGI app over ``monitor``; ``token`` guards every page but /healthz,
    /static/ and /login; ``submitter`` (optional) serves the actions and the logs."""
    # redirect_slashes=False: Starlette would answer "/healthz/" with a redirect to an
    # absolute URL built from the client's Host header.
    app = FastAPI(title="Couler monitor", docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    env = _environment()
    static = {name: (_HERE / "static" / name).read_bytes() for name in _STATIC}
    sessions: dict[str, _Session] = {}
    closing = asyncio.Event()
    app.state.closing = closing

    def render(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**values), status_code=status)

    def error_page(request: Request, status: int, message: str,
                   headers: Mapping[str, str] | None = None) -> Response:
        if _is_api(request):
            return JSONResponse({"error": message, "status": status}, status_code=status,
                                headers=headers)
        title = f"{status} {HTTPStatus(status).phrase}"
        if status == 401:
            response = render("login.html", 401, title=title, message=message,
                              session=None, next=local_target(request.scope.get("path", "/")))
        else:
            response = render("error.html", status, title=title, message=message,
                              session=session_of(request))
        if headers:
            response.headers.update(headers)
        return response

    def session_of(request: Request) -> _Session | None:
        sid = request.cookies.get(COOKIE, "")
        got = sessions.get(sid) if sid else None
        if got is None:
            return None
        if got.expires < clock():
            sessions.pop(sid, None)
            return None
        return got

    def new_session(response: Response) -> None:
        now = clock()
        for sid in [k for k, v in sessions.items() if v.expires < now]:
            sessions.pop(sid, None)
        while len(sessions) >= MAX_SESSIONS:  # the oldest first
            sessions.pop(next(iter(sessions)))
        sid = secrets.token_urlsafe(32)
        sessions[sid] = _Session(secrets.token_urlsafe(32), now + SESSION_SECONDS)
        response.set_cookie(COOKIE, sid, httponly=True, samesite="strict", path="/",
                            max_age=int(SESSION_SECONDS))

    def bearer_ok(request: Request) -> bool:
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(
            bearer.strip().encode(), str(token).encode())

    def same_origin(request: Request) -> bool:
        """The request came from a page of this origin, as the browser says: its
        ``Sec-Fetch-Site`` (set by the browser, never by a page) when sent, and its
        ``Origin`` when it names one (under ``Referrer-Policy: no-referrer`` a browser
        sends ``Origin: null`` even for its own pages)."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site != "same-origin":
            return False
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            host = request.headers.get("host", "")
            return bool(host) and origin in (f"http://{host}", f"https://{host}")
        return site == "same-origin"

    async def answer(request: Request,
                     call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        try:
            return _secured(await call_next(request))
        except Exception:
            # Logged here, answered like every other error (not uvicorn's plain text).
            log.exception("dashboard: %s %s failed", request.method, request.scope.get("path"))
            return _secured(error_page(request, 500, _INTERNAL_MESSAGE))

    @app.middleware("http")
    async def guard(request: Request,
                    call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.scope.get("path", "")
        if (token is None or path == "/healthz" or path.startswith("/static/")
                or path == "/login"):
            return await answer(request, call_next)
        query = request.query_params.get("token")
        by_query = query is not None and hmac.compare_digest(query.encode(), token.encode())
        if not (bearer_ok(request) or by_query or session_of(request) is not None):
            return _secured(error_page(request, 401, _UNAUTHORIZED_MESSAGE,
                                       {"WWW-Authenticate": "Bearer"}))
        if not by_query:
            return await answer(request, call_next)
        # Keep the token out of the address bar and history: a session cookie instead.
        # The target is built from the path alone (request.url would take a scheme and
        # host from a request target like "https://host/").
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        response: Response = RedirectResponse(local_target(path, rest), status_code=303)
        new_session(response)
        return _secured(response)

    async def form(request: Request) -> dict[str, str]:
        body = await request.body()
        if len(body) > 16_384:
            raise _HttpError(413, "the form is too large")
        return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/static/{name}")
    async def static_file(name: str) -> Response:
        if name not in static:
            raise _HttpError(404, f"nothing at {'/static/' + name!r}")
        return Response(static[name], media_type=_STATIC[name],
                        headers={"Cache-Control": "no-cache"})

    @app.get("/login", response_class=HTMLResponse)
    async def login_page(request: Request, next: str = "/") -> Response:
        if token is None:
            return RedirectResponse("/", status_code=303)
        return render("login.html", title="Log in", message="", session=None,
                      next=local_target(next))

    @app.post("/login")
    async def login(request: Request) -> Response:
        if token is None:
            return RedirectResponse("/", status_code=303)
        if not same_origin(request):
            raise _HttpError(403, "a login must come from this console's own page")
        fields = await form(request)
        target = local_target(fields.get("next", "/").split("?", 1)[0] or "/")
        if not hmac.compare_digest(fields.get("token", "").encode(), token.encode()):
            return render("login.html", 401, title="401 Unauthorized",
                          message="that is not the token", session=None, next=target)
        response: Response = RedirectResponse(target, status_code=303)
        new_session(response)
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        check_post(request, await form(request))
        sessions.pop(request.cookies.get(COOKIE, ""), None)
        response: Response = RedirectResponse("/login" if token else "/", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    def check_post(request: Request, fields: Mapping[str, str]) -> None:
        """A state-changing request from a browser: this origin, with the session's CSRF
        token (a bearer-token client needs neither)."""
        if bearer_ok(request):
            return
        if not same_origin(request):
            raise _HttpError(403, "refused: the request did not come from this console "
                                  "(cross-site requests cannot act on runs)")
        session = session_of(request)
        if session is None or not hmac.compare_digest(fields.get("csrf", "").encode(),
                                                       session.csrf.encode()):
            raise _HttpError(403, "refused: the form's CSRF token does not match the "
                                  "session; reload the page and try again")

    # ------------------------------------------------------------------ runs list

    async def runs_values(request: Request) -> dict[str, Any]:
        now = clock()
        query, since, page_no = _query(request.query_params, now=now)
        with _errors():
            page = await monitor.run_page(query)
        params = [(k, v) for k, v in request.query_params.multi_items()
                  if k in ("q", "state", "workflow", "engine", "since") and v]

        def link(n: int) -> str:
            return local_target("/", [*params, ("page", str(n))])

        return {"page": page, "query": query, "since": since, "now": now,
                "filtered": bool(params),
                "prev_page": link(page_no - 1) if page_no > 1 else "",
                "next_page": (link(page_no + 1)
                              if query.offset + len(page.runs) < page.total else ""),
                "live": local_target("/events/runs", params + (
                    [("page", str(page_no))] if page_no > 1 else []))}

    @app.get("/", response_class=HTMLResponse)
    async def index(request: Request) -> HTMLResponse:
        values = await runs_values(request)
        total, hits, size, saved = await monitor.cache_totals()
        return render("runs.html", title="Couler runs", session=session_of(request),
                      states=[s.value for s in RunState], ranges=_RANGES,
                      totals=console.CachePanel(total, hits, size, saved), **values)

    @app.get("/events/runs")
    async def runs_events(request: Request) -> StreamingResponse:
        await runs_values(request)  # a bad filter is a 400 now, not inside the stream

        async def fragment() -> str | None:
            return env.get_template("runs_table.html").render(**await runs_values(request))

        return _stream(request, fragment, closing, live_interval)

    # ------------------------------------------------------------------ one run

    async def run_values(run_id: str) -> dict[str, Any]:
        with _errors():
            run = await monitor.run(run_id)
            plan = await monitor.plan(run_id)
            usage = await monitor.utilization(run_id=run_id, limit=MAX_SAMPLE_LIMIT)
            details = await monitor.step_details(run_id)
            computed = await monitor.computed_seconds(
                run.workflow, sorted({s.name for s in run.steps if s.cached}))
        resources = console.step_resources(plan)
        inputs = _declared_inputs(plan)
        rows = []
        now = clock()
        for s in run.steps[:MAX_STEP_ROWS]:
            state, why = console.shown_state(run, s.state.value)
            detail = details.get((s.name, s.key))
            rows.append({
                "name": s.name, "key": s.key, "state": state,
                "why": _failure(s) or why, "attempts": s.attempts,
                "cached": s.cached or s.state is StepState.CACHED,
                "duration": ("—" if s.cached else
                             _duration(s.started_at, s.finished_at, now=now)),
                "memory": _memory(s.peak_memory_bytes), "cpu": _cpu(s.peak_cpu),
                "message": s.message, "cache_key": s.cache_key,
                "inputs": inputs.get(s.name, ()),
                "outputs": sorted((detail.outputs if detail else {}).items()),
                "artifacts": sorted(
                    (k, f"{_size(console.artifact_size(v))} {v.get('uri', '')}".strip())
                    for k, v in (detail.artifacts if detail else {}).items()
                    if isinstance(v, dict))})
        recorded = {s.name for s in run.steps}
        g = console.graph(run, plan)
        for n in g.nodes:  # planned steps with no record yet
            if n.name not in recorded and len(rows) < MAX_STEP_ROWS:
                state, why = console.shown_state(run, "")
                rows.append({"name": n.name, "key": "", "state": state, "why": why,
                             "attempts": 0, "cached": False, "duration": "—", "memory": "—",
                             "cpu": "—", "message": "", "cache_key": "",
                             "inputs": inputs.get(n.name, ()), "outputs": [],
                             "artifacts": []})
        hidden = len(run.steps) + sum(1 for n in g.nodes if n.name not in recorded) - len(rows)
        return {"run": run, "now": now, "done": _done(run.steps), "cached": _cached(run.steps),
                "hidden": max(0, hidden),
                "graph": g, "legend": _LEGEND, "steps": rows, "unrecorded": bool(rows),
                "plots": console.plots(run, usage, resources),
                "peaks_only": any(s.peak_memory_bytes is not None for s in run.steps),
                "cache": console.cache_panel(run, details, computed), "plan": plan}

    @app.get("/events/runs/{run_id:path}")
    async def run_events(request: Request, run_id: str) -> StreamingResponse:
        await run_values(run_id)  # an unknown run is a 404 now

        async def fragment() -> str | None:
            try:
                values = await run_values(run_id)
            except _HttpError as e:
                if e.status == 404:
                    return None  # gone (expired): the stream ends
                raise
            return env.get_template("run_live.html").render(**values)

        return _stream(request, fragment, closing, live_interval)

    @app.get("/runs/{run_id:path}", response_class=HTMLResponse)
    async def run_page(request: Request, run_id: str) -> HTMLResponse:
        try:
            return await full_run_page(request, run_id)
        except _HttpError:
            raise
        except Exception as exc:  # stored data never takes a page down: say what is wrong
            log.exception("console: run %r: its page could not be built", run_id)
            return render("error.html", title=f"Run {run_id}: damaged record",
                          message=(f"run {run_id!r}: part of its stored record cannot be "
                                   f"read ({type(exc).__name__}); the monitor's log names "
                                   "it, and /api/runs/ shows what can be read"),
                          session=session_of(request))

    async def full_run_page(request: Request, run_id: str) -> HTMLResponse:
        values = await run_values(run_id)
        run: Run = values["run"]
        session = session_of(request)
        notice = ""
        if session is not None and session.flash:
            notice, session.flash = session.flash, ""
        with _errors():
            report = await monitor.recommendation_report(run.workflow) if run.workflow \
                else RecommendationReport((), ())
        logs, logs_note = await _logs(submitter, run)
        actions, note = _actions(run, token=token, submitter=submitter,
                                 plan=values["plan"] is not None)
        return render("run.html", title=f"Run {run.run_id}", session=session, notice=notice,
                      live=local_target(f"/events/runs/{run_id}"), actions=actions,
                      actions_note=note, logs=logs, logs_note=logs_note, report=report,
                      rec_rows=_recommendation_rows(report), **values)

    @app.post("/runs/{target:path}")
    async def act(request: Request, target: str) -> Response:
        run_id, _, action = target.rpartition("/")
        if action not in {a for a, _ in _ACTIONS} or not run_id:
            raise _HttpError(404, f"nothing to POST at {request.scope.get('path', '')!r}")
        fields = await form(request)
        if token is None:
            raise _HttpError(403, "actions need the monitor's token to be configured "
                                  "(COULER_AUTH_TOKEN): an open console cannot act on runs")
        check_post(request, fields)
        if submitter is None:
            raise _HttpError(503, "the monitor has no submitter to send this to: set "
                                  "COULER_SUBMITTER_ADDRESS")
        with _errors():
            run = await monitor.run(run_id)
            plan = await monitor.plan(run_id) if action == "resubmit" else None
        go = run_id
        try:
            if action == "cancel":
                await asyncio.to_thread(submitter.cancel, run_id, "cancelled from the console")
                said = "cancel sent to the submitter"
            elif action == "retry":
                await asyncio.to_thread(submitter.retry, run_id)
                said = "retry from the failure point sent to the submitter"
            else:
                if plan is None:
                    raise _HttpError(409, "no plan of this run was seen: nothing to resubmit")
                message = workflow_pb2.Workflow()
                try:
                    message.ParseFromString(plan)
                    workflow = codec.workflow_from_proto(message)
                except Exception as e:  # a damaged row
                    raise _HttpError(409, "the stored plan of this run cannot be read: "
                                          "nothing to resubmit") from e
                got = await asyncio.to_thread(submitter.submit, workflow, engine=run.engine)
                go = got.run_id
                # Known here at once (its own events follow on the bus), so that its
                # page answers now rather than 404 until they arrive.
                with _errors():
                    await monitor.record_requested(go, workflow=run.workflow,
                                                   engine=run.engine, at=clock())
                said = f"resubmitted as run {got.run_id}"
        except CoulerError as e:
            log.warning("console: %s of run %r refused by the submitter: %s", action, run_id, e)
            raise _HttpError(409 if isinstance(e, UserError) else 503,
                             f"{action} of run {run_id!r}: {e}") from e
        log.info("console: %s of run %r: %s", action, run_id, said)
        session = session_of(request)
        if session is not None:
            session.flash = said
        if bearer_ok(request) and session is None and "text/html" not in request.headers.get(
                "accept", ""):
            return JSONResponse({"run_id": go, "action": action, "result": said})
        return RedirectResponse(local_target(f"/runs/{go}"), status_code=303)

    @app.get("/recommendations/{workflow:path}", response_class=HTMLResponse)
    async def recommendations(request: Request, workflow: str) -> HTMLResponse:
        with _errors():
            got = await monitor.recommendation_report(workflow)
        return render("recommendations.html", title=f"Recommendations for {workflow}",
                      session=session_of(request), workflow=workflow, report=got,
                      rec_rows=_recommendation_rows(got))

    # ------------------------------------------------------------------ JSON

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
        return error_page(request, exc.status, exc.detail)

    @app.exception_handler(StarletteHTTPException)
    async def framework_error(request: Request, exc: StarletteHTTPException) -> Response:
        path = request.scope.get("path", "")
        message = {404: f"nothing at {path!r}",
                   405: f"{request.method} is not allowed on {path!r}"}.get(
            exc.status_code, str(exc.detail))
        return error_page(request, exc.status_code, message, exc.headers)

    return app


def _stream(request: Request, fragment: Callable[[], Awaitable[str | None]],
            closing: asyncio.Event, interval: float) -> StreamingResponse:
    """Server-sent events: ``fragment()`` whenever it changed, a heartbeat comment every
    15 s; ends when the client leaves, the fragment is gone (None) or the server stops."""

    async def events() -> AsyncIterator[str]:
        last = ""
        quiet = 0.0
        failing = False
        yield "retry: 2000\n\n"
        loop = asyncio.get_running_loop()
        while not closing.is_set() and not await request.is_disconnected():
            began = loop.time()
            try:
                text = await fragment()
                failing = False
            except Exception:
                if not failing:  # logged once until it works again
                    log.exception("dashboard: the live update of %s failed",
                                  request.scope.get("path"))
                failing = True
                text = None
            if text is None and failing:
                text = ""  # nothing sent; tried again at the next tick
            if text is None:
                yield "event: gone\ndata: \n\n"
                return
            digest = hashlib.sha256(text.encode()).hexdigest()
            if text and digest != last:
                last = digest
                quiet = 0.0
                yield "event: fragment\n" + "".join(
                    f"data: {line}\n" for line in text.split("\n")) + "\n"
            else:
                quiet += interval
                if quiet >= 15.0:
                    quiet = 0.0
                    yield ": still here\n\n"
            # a page that is slow to render is looked at less often (big runs)
            pause = max(interval, 2 * (loop.time() - began))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing.wait(), pause)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store",
                                      "X-Accel-Buffering": "no"})


def _declared_inputs(plan: bytes | None) -> dict[str, tuple[tuple[str, str], ...]]:
    """Per step: its declared inputs and where their values come from (the plan's)."""
    if not plan:
        return {}
    wf = workflow_pb2.Workflow()
    try:
        wf.ParseFromString(plan)
    except Exception:
        return {}
    out = {}
    for s in [*wf.steps, *(h for hook in wf.exit_hooks for h in hook.steps)]:
        out[s.name] = tuple(
            (i.name, text_format.MessageToString(i.value, as_one_line=True)[:200])
            for i in s.inputs)
    return out


async def _logs(submitter: Submitter | None, run: Run
                ) -> tuple[list[tuple[str, str, str]], str]:
    """The tails of the run's step logs from the submitter, and a note on what is not
    shown (the monitor keeps no logs: the submitter does)."""
    if submitter is None:
        return [], ("The monitor does not keep logs; the submitter does. Set "
                    "COULER_SUBMITTER_ADDRESS for them to show here, or run "
                    "`couler logs RUN STEP`.")
    mapped = {s.name for s in run.steps if s.key}  # a map step: its items have the logs
    wanted = [s for s in run.steps if s.state.value not in ("pending", "cached", "skipped")
              and not (s.name in mapped and not s.key)]
    wanted.sort(key=lambda s: (s.state.value != "failed", s.started_at or 0.0))
    out: list[tuple[str, str, str]] = []
    failed: list[str] = []
    for s in wanted[:LOG_STEPS]:
        try:
            text = await asyncio.to_thread(submitter.logs, run.run_id, s.name, s.key,
                                           max_bytes=LOG_BYTES)
        except CoulerError as e:
            failed.append(f"{s.name}: {e}")
            continue
        out.append((s.name, s.key, text or "(empty)"))
    notes = []
    if len(wanted) > LOG_STEPS:
        notes.append(f"the logs of the first {LOG_STEPS} of {len(wanted)} steps are shown "
                     "(failed ones first)")
    if failed:
        notes.append("not available: " + "; ".join(failed[:5]))
    if not wanted:
        notes.append("no step has run yet")
    return out, "; ".join(notes)


def _actions(run: Run, *, token: str | None, submitter: Submitter | None, plan: bool
             ) -> tuple[list[tuple[str, str, bool, str]], str]:
    """The action buttons: (action, label, enabled, why not)."""
    if token is None:
        return [], "Actions need the monitor's token (COULER_AUTH_TOKEN)."
    if submitter is None:
        return [], "Actions need COULER_SUBMITTER_ADDRESS (the submitter's gRPC address)."
    terminal = run.state.terminal
    return [
        ("cancel", "Cancel", not terminal, "the run has ended"),
        ("retry", "Retry from failure",
         run.state in (RunState.FAILED, RunState.CANCELLED), "only a failed or cancelled run"),
        ("resubmit", "Resubmit", plan, "no plan of this run was seen"),
    ], ""


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
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


class DashboardServer(AsgiServer):
    """The dashboard's HTTP server, a task on the running loop.

    Args:
        app: The ASGI app.
        address: ``host:port`` to listen on (port 0 picks a free one).
    """

    def __init__(self, app: FastAPI, address: str) -> None:
        super().__init__(app, address, what="dashboard", setting="COULER_DASHBOARD_ADDRESS")
        self._fastapi = app

    async def stop(self) -> None:
        """Stop serving (requests in flight get a few seconds to finish)."""
        closing = getattr(self._fastapi.state, "closing", None)
        if closing is not None:  # the live streams end now, not at the grace period
            closing.set()
        await super().stop()
