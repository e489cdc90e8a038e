"""A process of the embedded stack that fails to start leaves nothing behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from couler.errors import UserError
from couler_runtime import stack


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_server_that_dies_while_starting_takes_its_children_along(tmp_path: Path) -> None:
    """The started process exits before it is ready, leaving a child in its session: `up`
    reports it with the log's last lines and kills the whole session."""
    child = tmp_path / "child.pid"
    argv = ["sh", "-c", f"sleep 60 & echo $! > {child}; echo 'bind: address in use'; exit 1"]
    with pytest.raises(UserError, match=r"nats-server exited while starting(.|\n)*address in use"):
        stack._start_nats(argv, tmp_path / "nats.log", ports_dir=tmp_path)
    assert child.exists()
    assert _gone(int(child.read_text())), "the server's child outlived the failed start"
