"""Mechanics tests: the gRPC machinery (server, interceptors, client) against fake servers.

These tests check how calls travel -- tokens, deadlines, error mapping, traces, limits,
health and reflection -- not what a service answers: the servicers here are fakes, named
``Fake...``, on real gRPC servers on 127.0.0.1:0 (so they are not unit tests, which use no
sockets). What our services answer is tested against the real services in
tests/integration and tests/e2e (tests/unit/test_no_standins.py keeps fakes out of there).
"""

from __future__ import annotations

from tests.rpc_fixtures import loop, serve  # noqa: F401  (fixtures)


