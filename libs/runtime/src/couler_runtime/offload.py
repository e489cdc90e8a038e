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

__all__ = ["LARGE_BYTES", "LARGE_STEPS", "convert", "run"]

T = TypeVar("T")
V = TypeVar("V")

LARGE_STEPS = 1000
LARGE_BYTES = 64 * 1024  # an encoded workflow this large (about 1,500 small steps)


async def convert(steps: int, fn: Callable[[V], T], value: V) -> T:
    """``fn(value)``, in a worker thread when ``steps`` makes it long."""
    return await asyncio.to_thread(fn, value) if steps > LARGE_STEPS else fn(value)


async def run(encoded_bytes: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, work on a workflow whose encoding has ``encoded_bytes`` bytes
    (decoding or checking it), in a worker thread when that makes it long: the size
    counts what nested sub-workflows and large values hold, which top-level steps do not."""
    return await asyncio.to_thread(fn, *args) if encoded_bytes > LARGE_BYTES else fn(*args)
