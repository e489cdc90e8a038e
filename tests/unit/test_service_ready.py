"""The READY line a service prints once it serves, and how ``couler up`` reads it."""

from __future__ import annotations

from couler_runtime.service import READY_PREFIX, Ready, parse_ready, ready_line


def test_a_ready_line_round_trips_with_its_endpoints() -> None:
    line = ready_line("monitor", "127.0.0.1:41234", {"dashboard": "http://127.0.0.1:40001/"})
    assert line.startswith(f"{READY_PREFIX} monitor 127.0.0.1:41234 ")
    assert parse_ready(line) == Ready("monitor", "127.0.0.1:41234",
                                      {"dashboard": "http://127.0.0.1:40001/"})


def test_a_ready_line_without_endpoints_has_three_fields() -> None:
    line = ready_line("cache", "[::1]:5000", {})
    assert line.split() == [READY_PREFIX, "cache", "[::1]:5000"]
    assert parse_ready(line + "\n") == Ready("cache", "[::1]:5000", {})


def test_other_lines_are_not_ready_lines() -> None:
    assert parse_ready("2026-11-30 cache INFO serving") is None
    assert parse_ready(f"{READY_PREFIX} cache") is None  # no address
    assert parse_ready("") is None
