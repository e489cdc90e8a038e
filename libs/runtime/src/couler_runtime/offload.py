"""Converting large workflows without stalling a service's event loop.

A service's gRPC calls, consumers and outbox share one asyncio loop. Decoding or encoding
a 100,000-step workflow or plan takes seconds (2.6 s to decode a plan of 100k steps,
1.6 s to encode the workflow), which would stall every other call and every consumer's
acks meanwhile; above :data:`LARGE_STEPS` the conversion runs in a worker thread instead.
Small ones stay on the loop, where a thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

__all__ = ["LARGE_STEPS", "convert"]

T = TypeVar("T")
V = TypeVar("V")

LARGE_STEPS = 1000


async def convert(steps: int, fn: Callable[[V], T], value: V) -> T:
    """``fn(value)``, in a worker thread when ``steps`` makes it long."""
    return await asyncio.to_thread(fn, value) if steps > LARGE_STEPS else fn(value)
