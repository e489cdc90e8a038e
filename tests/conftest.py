"""Shared pytest configuration."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite tests/golden/expected from the current compiler output (never in CI)",
    )


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    update = bool(request.config.getoption("--update-goldens"))
    if update and os.environ.get("CI"):
        pytest.fail("--update-goldens is refused under CI: goldens change only on request")
    return update
