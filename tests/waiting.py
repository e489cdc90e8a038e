"""Waiting for something to happen in a test: a bound on waiting, not a timing assertion."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats


def eventually(check: Callable[[], bool], what: str, deadline: float = 30.0) -> None:
    """Wait until ``check()`` holds; AssertionError naming ``what`` after ``deadline`` s."""
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline:.0f} s")
        time.sleep(0.1)


async def aeventually(check: Callable[[], bool], what: str, deadline: float = 30.0) -> None:
    """:func:`eventually` on the running event loop."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not check():
        if loop.time() > end:
            raise AssertionError(f"{what}: not within {deadline:.0f} s")
        await asyncio.sleep(0.02)


async def nkey_client(url: str, seed_file: Path, identity: str, errors: list[str],
                      tls: Any = None) -> Any:
    """A plain nats-py client connected with ``identity``'s seed (what a thief of the seed
    would run), collecting the server's asynchronous errors in ``errors``."""
    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    return await nats.connect(url, nkeys_seed=str(seed_file), inbox_prefix=f"_INBOX.{identity}",
                              error_cb=on_error, allow_reconnect=False, tls=tls)
