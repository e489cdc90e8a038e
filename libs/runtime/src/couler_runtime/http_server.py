"""An ASGI app served by uvicorn as a task on the service's event loop (the monitor's
console, every service's ``/metrics``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from couler.errors import UserError

__all__ = ["AsgiServer"]


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the service's harness owns SIGTERM / SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AsgiServer:
    """Serve ``app`` on ``address`` (``host:port``; port 0 picks a free one).

    Args:
        app: The ASGI app.
        address: Where to listen.
        what: What it serves, for messages ("dashboard", "metrics").
        setting: The setting ``address`` comes from, for messages.
        path: The path the URL :meth:`start` returns ends with.
        backlog: The listening socket's backlog.
        grace: Seconds requests in flight get to finish at :meth:`stop`.
    """

    def __init__(self, app: Any, address: str, *, what: str, setting: str, path: str = "/",
                 backlog: int = 128, grace: int = 5) -> None:
        self._app = app
        self._address = address
        self._what, self._setting, self._path = what, setting, path
        self._backlog, self._grace = backlog, grace
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self.url = ""

    async def start(self) -> str:
        """Bind and start serving; the URL.

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
            sock.listen(self._backlog)
        except (OSError, ValueError) as e:
            raise UserError(f"{self._what} address {self._address!r} ({self._setting}): "
                            f"{e}") from e
        sock.setblocking(False)
        self._sock = sock
        bound = sock.getsockname()[1]
        # log_config=None: the process's logging stays as the service harness set it up.
        config = uvicorn.Config(self._app, log_config=None, log_level="warning",
                                access_log=False, lifespan="off",
                                timeout_graceful_shutdown=self._grace)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=self._what)
        while not self._server.started:
            if self._task.done():
                raise UserError(f"{self._what} on {self._address!r} did not start: "
                                f"{self._task.exception()!r}")
            await asyncio.sleep(0.01)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}{self._path}"
        return self.url

    async def stop(self) -> None:
        """Stop serving (requests in flight get ``grace`` seconds to finish)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, SystemExit):
                await self._task
        if self._sock is not None:
            self._sock.close()
        self._server = self._task = self._sock = None
