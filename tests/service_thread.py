"""A service's ``serve()`` on its own event loop in a thread, as the service tests run it.

The service runs exactly as in production (``couler_runtime.service.serve`` with its
gRPC server, bus consumers and store) on 127.0.0.1 with port 0; ``address`` is where
it serves once :meth:`ServiceThread.start` returned. :meth:`ServiceThread.stop` is the
graceful stop (SIGTERM's path); errors raised inside the service are re-raised there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from couler_runtime.bus import Bus
from couler_runtime.service import Component, serve
from couler_runtime.settings import CommonSettings

S = TypeVar("S", bound=CommonSettings)

WAIT = 60.0

# A service's build function (its main.build).
Builder = Callable[[Any, Bus], Awaitable[Component]]


class ServiceThread(Generic[S]):
    """Run ``build`` with ``settings`` in a thread; ``address`` once it serves."""

    def __init__(self, settings: S, build: Callable[[S, Bus], Awaitable[Component]], *,
                 wait: float = WAIT) -> None:
        self.settings = settings
        self.builder = build
        self.wait = wait
        self.port = 0
        self.endpoints: dict[str, str] = {}  # the READY line's others: metrics, dashboard
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name=settings.service, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await serve(self.settings, self.builder, stop=self._stop, on_ready=self._on_ready,
                    on_endpoints=self.endpoints.update)

    def _on_ready(self, port: int) -> None:
        self.port = port
        self._ready.set()

    def start(self) -> ServiceThread[S]:
        self._thread.start()
        if not self._ready.wait(self.wait) or self._error is not None or not self.port:
            raise RuntimeError(f"the {self.settings.service} service did not start: "
                               f"{self._error!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(self.wait)
        assert not self._thread.is_alive(), f"the {self.settings.service} service did not stop"
        if self._error is not None:
            raise self._error
