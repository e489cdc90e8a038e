"""Mechanics tests: the gRPC machinery (server, interceptors, client) against fake servers.

These tests check how calls travel -- tokens, deadlines, error mapping, traces, limits,
health and reflection -- not what a service answers: the servicers here are fakes, named
``Fake...``, on real gRPC servers on 127.0.0.1:0 (so they are not unit tests, which use no
sockets). What our services answer is tested against the real services in
tests/integration and tests/e2e (tests/unit/test_no_standins.py keeps fakes out of there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from couler_runtime.rpc import RpcServer, start_server
from tests.integration.loop_thread import LoopThread


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
