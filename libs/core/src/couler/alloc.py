"""Allocation helpers for building large, acyclic structures."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["GrowthRelief", "gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the duration of the block.

    Freezing, validating and compiling a large workflow allocates hundreds of
    thousands of small dicts, tuples and dataclasses, none of them cyclic.
    The collector would re-scan the growing heap again and again: on a
    2-core machine, building 100k small dicts took 26x as long as 10k with
    it running and 11.6x with it paused. Reference counting still frees
    everything; the collector resumes (if it was on) when the block ends.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class GrowthRelief:
    """Keep the collector from re-scanning a structure that keeps growing.

    A builder that adds 100k steps keeps every draft alive, and each full
    collection re-scans all of them: at 100k steps, 12 full collections took
    2.5 s of a 4 s build. :meth:`grew` calls :func:`gc.freeze` every
    ``interval`` items, which moves the objects alive then out of future
    collections, so a collection scans at most one interval's worth of new
    objects; reference counting still frees frozen objects as usual.
    :meth:`release` (called when the structure is finished) returns them to
    the collector with :func:`gc.unfreeze`. Only cyclic garbage that exists at
    a freeze waits for the release to be collected.
    """

    __slots__ = ("_frozen", "_interval", "_next")

    def __init__(self, interval: int = 4096) -> None:
        self._interval = interval
        self._next = interval
        self._frozen = False

    def grew(self, size: int) -> None:
        """Report the structure's size; freezes the heap every ``interval`` items."""
        if size >= self._next:
            self._next = size + self._interval
            if gc.isenabled():
                gc.freeze()
                self._frozen = True

    def release(self) -> None:
        """Return frozen objects to the collector."""
        if self._frozen:
            self._frozen = False
            gc.unfreeze()
