"""What adapters of engines without a change stream share: polled watches, API times."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime

from couler.engines.base import RunStatus
from couler.errors import OperationTimeoutError

__all__ = ["parse_time", "poll_status"]


def poll_status(status: Callable[[str], RunStatus], run_id: str, *, interval: float,
                timeout: float | None = None) -> Iterator[RunStatus]:
    """Yield ``status(run_id)`` now and whenever it changes, until it is terminal.

    Polls every ``interval`` seconds; past ``timeout`` seconds raises
    OperationTimeoutError naming the run, its workflow and its last state.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    last = status(run_id)
    yield last
    while not last.state.terminal:
        pause = interval
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OperationTimeoutError(
                    f"run {run_id!r} of workflow {last.workflow!r}: not finished after "
                    f"{timeout} s (last state {last.state.value})")
            pause = min(pause, remaining)
        time.sleep(pause)
        current = status(run_id)
        if current != last:
            last = current
            yield current


def parse_time(value: object) -> float | None:
    """Seconds since the epoch of an ISO-8601 time from an engine's API (None if absent)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
