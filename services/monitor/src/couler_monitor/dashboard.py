"""The ops dashboard: a small FastAPI app served by uvicorn on the service's own event loop.

Pages (HTML, every value escaped: run ids, step names and messages come from users):

* ``/`` -- the latest runs: id, workflow, engine, state, started, duration, steps done/total,
  cached steps;
* ``/runs/{run_id}`` -- one run's steps: name, key, state, attempts, cached, duration, peak
  memory, peak CPU, message.

JSON: ``/api/runs``, ``/api/runs/{run_id}``, ``/api/utilization?workflow=&run_id=&step=``;
``/healthz`` answers ``{"status": "ok"}`` without authentication.

With a token configured (``COULER_AUTH_TOKEN``) every other path needs it, as
``Authorization: Bearer <token>``, or once as ``?token=<token>``: that answer sets an
HttpOnly cookie (holding a digest of the token, not the token) and redirects to the same
page without the token in its URL, so a browser keeps working. Anything else is 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import hmac
import html
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import quote

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from couler.engines.base import StepState
from couler.errors import NotFoundError, RetryableError, UserError
from couler_monitor.service import MI, Monitor
from couler_runtime.rpc.records import Run, StepRecord

__all__ = ["COOKIE", "DashboardServer", "create_app"]

log = logging.getLogger(__name__)

COOKIE = "couler_dashboard"
_REFRESH_SECONDS = 5
_CACHED_MARK = '<span class="cached">cached</span>'
_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _time(at: float | None) -> str:
    if at is None:
        return "—"
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


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


def _page(title: str, body: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{_REFRESH_SECONDS}">
<title>{_e(title)} · Couler</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ border-bottom: 1px solid #ddd; padding: .3rem .7rem; text-align: left; }}
th {{ background: #f4f4f4; }}
.state-succeeded {{ color: #17692b; }} .state-failed {{ color: #b00020; }}
.state-running, .state-pending {{ color: #1a4fa0; }} .state-cached {{ color: #6a3fa0; }}
.cached {{ background: #efe6fb; border-radius: 3px; padding: 0 .3rem; }}
.msg {{ white-space: pre-wrap; max-width: 40rem; }}
</style></head>
<body><h1>{_e(title)}</h1>
{body}
</body></html>"""


def _run_link(run_id: str) -> str:
    return f'<a href="/runs/{_e(quote(run_id, safe=""))}">{_e(run_id)}</a>'


def runs_page(runs: tuple[Run, ...], *, now: float) -> str:
    """The HTML of ``/``."""
    if not runs:
        return _page("Couler runs", "<p>No runs yet.</p>")
    rows = "\n".join(
        f"<tr><td>{_run_link(r.run_id)}</td><td>{_e(r.workflow or '—')}</td>"
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
        f"<p>workflow <b>{_e(run.workflow or '—')}</b> on <b>{_e(run.engine or '—')}</b>, "
        f'<span class="state-{_e(run.state.value)}">{_e(run.state.value)}</span>, '
        f"started {_time(run.started_at)}, "
        f"{_duration(run.started_at, run.finished_at if run.state.terminal else None, now=now)}"
        f"; {_done(run.steps)}/{len(run.steps)} steps done, {_cached(run.steps)} cached</p>")
    if run.message:
        head += f'<p class="msg">{_e(run.message)}</p>'
    rows = "\n".join(
        f"<tr><td>{_e(s.name)}</td><td>{_e(s.key)}</td>"
        f'<td class="state-{_e(s.state.value)}">{_e(s.state.value)}</td>'
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


def _step_json(s: StepRecord) -> dict[str, Any]:
    return {"name": s.name, "key": s.key, "state": s.state.value, "attempts": s.attempts,
            "cached": s.cached, "exit_code": s.exit_code, "started_at": s.started_at,
            "finished_at": s.finished_at, "peak_memory_bytes": s.peak_memory_bytes,
            "peak_cpu": s.peak_cpu, "message": s.message,
            "failure_class": s.failure_class.value if s.failure_class else None}


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


def create_app(monitor: Monitor, *, token: str | None = None,
               clock: Callable[[], float] = time.time) -> FastAPI:
    """The dashboard's ASGI app over ``monitor``; ``token`` guards every page but /healthz."""
    app = FastAPI(title="Couler monitor", docs_url=None, redoc_url=None, openapi_url=None)
    digest = _token_digest(token) if token else None

    @app.middleware("http")
    async def guard(request: Request,
                    call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if token is None or digest is None or request.url.path == "/healthz":
            return _secured(await call_next(request))
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
            return _secured(JSONResponse({"detail": "a valid token is required"},
                                         status_code=401,
                                         headers={"WWW-Authenticate": "Bearer"}))
        if query is None:
            return _secured(await call_next(request))
        # Keep the token out of the address bar and history: remember it in a cookie.
        url = request.url.remove_query_params("token")
        target = url.path + (f"?{url.query}" if url.query else "")
        response: Response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, digest, httponly=True, samesite="strict", path="/")
        return _secured(response)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(runs_page(await monitor.runs(), now=clock()))

    @app.get("/runs/{run_id:path}", response_class=HTMLResponse)
    async def run(run_id: str) -> HTMLResponse:
        with _errors():
            got = await monitor.run(run_id)
        return HTMLResponse(run_page(got, now=clock()))

    @app.get("/api/runs")
    async def api_runs(limit: int = 100) -> list[dict[str, Any]]:
        return [_run_json(r, steps=False) for r in await monitor.runs(limit)]

    @app.get("/api/runs/{run_id:path}")
    async def api_run(run_id: str) -> dict[str, Any]:
        with _errors():
            got = await monitor.run(run_id)
        return _run_json(got, steps=True)

    @app.get("/api/utilization")
    async def api_utilization(workflow: str = "", run_id: str = "", step: str = "",
                              limit: int = 0) -> dict[str, Any]:
        with _errors():
            got = await monitor.utilization(run_id=run_id, workflow=workflow, step=step,
                                            limit=limit)
        return {
            "samples": [{"run_id": s.run_id, "workflow": s.workflow, "step": s.step,
                         "key": s.key, "attempt": s.attempt, "at": s.at, "cpu": s.cpu,
                         "memory_bytes": s.memory_bytes} for s in got.samples],
            "peaks": [{"run_id": p.run_id, "workflow": p.workflow, "step": p.step,
                       "key": p.key, "peak_cpu": p.peak_cpu,
                       "peak_memory_bytes": p.peak_memory_bytes, "samples": p.samples}
                      for p in got.peaks],
        }

    @app.exception_handler(_HttpError)
    async def http_error(_request: Request, exc: _HttpError) -> Response:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

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
