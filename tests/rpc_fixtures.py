"""Fixtures for tests that start gRPC servers on a loop thread (imported by the conftests of
tests/integration and tests/mechanics)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from couler_runtime.rpc import RpcServer, start_server
from tests.integration.loop_thread import LoopThread

__all__ = ["loop", "serve"]


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    """An asyncio loop in a thread for the module's async servers."""
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture
def serve(loop: LoopThread) -> Iterator[Callable[..., RpcServer]]:
    """``serve(servicers, **kw)``: a gRPC server on 127.0.0.1, stopped at teardown."""
    started: list[RpcServer] = []

    def start(servicers: Mapping[str, object], **kw: Any) -> RpcServer:
        server = loop.run(start_server("127.0.0.1:0", servicers, **kw))
        started.append(server)
        return server

    yield start
    for server in started:
        loop.run(server.stop(None))
