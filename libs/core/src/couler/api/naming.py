"""Deterministic names for templates, steps and workflows.

Names never depend on source line numbers:

* a template is named after ``step_name`` when given, else after the Python
  function that called ``run_*`` (``frame.f_code.co_name``); calls made at
  module level, from a lambda or from a comprehension fall back to a name
  taken from what the step runs (for containers, the image's base name:
  ``docker/whalesay:latest`` -> ``whalesay``);
* every name is sanitised to a DNS-1123 label (lowercase, ``_`` and ``.``
  become ``-``, at most 63 characters); a name the user chose (``step_name``)
  is mapped the same way but never mangled further: other characters that
  DNS-1123 rejects are an error naming it;
* a step is named after its template; the first use of a name is the bare
  name, later ones get ``-2``, ``-3``, ... in creation order.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Collection
from pathlib import Path
from types import FrameType

__all__ = [
    "MAX_NAME",
    "MAX_WORKFLOW_NAME",
    "NameRegistry",
    "caller_function_name",
    "image_base_name",
    "sanitize",
    "unique_name",
    "user_name",
    "workflow_name_from_path",
]

MAX_NAME = 63
MAX_WORKFLOW_NAME = 52

_INVALID = re.compile(r"[^a-z0-9-]+")
_DASHES = re.compile(r"-{2,}")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def sanitize(text: str, *, limit: int = MAX_NAME, fallback: str = "step") -> str:
    """Turn ``text`` into a DNS-1123 label of at most ``limit`` characters.

    Args:
        text: Any text, e.g. a Python function name.
        limit: Maximum length of the result.
        fallback: Returned when nothing usable is left of ``text``.

    Returns:
        Lowercase letters, digits and ``-``, starting and ending with a letter
        or digit.
    """
    name = text.strip().lower().replace("_", "-").replace(".", "-")
    name = _INVALID.sub("-", name)
    name = _DASHES.sub("-", name).strip("-")
    name = name[:limit].rstrip("-")
    return name or fallback


def user_name(name: str) -> str | None:
    """A name the user chose, mapped to DNS-1123 (lowercase, ``_``/``.`` -> ``-``, <= 63).

    Returns None when the name has characters that mapping cannot fix (the
    caller reports it); such names are not silently rewritten.
    """
    mapped = name.strip().lower().replace("_", "-").replace(".", "-")
    mapped = mapped[:MAX_NAME].rstrip("-")
    return mapped if _DNS_LABEL.match(mapped) else None


def image_base_name(image: str) -> str:
    """The base name of a container image: ``docker/whalesay:latest`` -> ``whalesay``."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return sanitize(last.split(":", 1)[0], fallback="step")


def caller_function_name(frame: FrameType | None) -> str | None:
    """The name of the function running in ``frame``, or None when it has no useful name.

    Module-level code, lambdas and comprehensions (``<module>``, ``<lambda>``,
    ``<listcomp>`` ...) have no useful name. A ``__call__`` method is named
    after its class; other dunder methods lose their underscores.
    """
    if frame is None:
        return None
    name = frame.f_code.co_name
    if name.startswith("<"):
        return None
    if name == "__call__":
        owner = frame.f_locals.get("self")
        if owner is not None:
            return type(owner).__name__
    if name.startswith("__") and name.endswith("__"):
        name = name.strip("_")
    return name or None


def caller_frame(depth: int) -> FrameType | None:
    """The frame ``depth`` levels above the caller of this function."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:  # pragma: no cover - the stack is never that shallow in practice
        return None


def unique_name(base: str, used: Collection[str], start: int = 2) -> str:
    """``base`` if unused, else ``base-2``, ``base-3``, ... (kept within 63 characters).

    ``start`` is the first suffix to try (callers that remember it stay linear).
    """
    if base not in used:
        return base
    n = start
    while True:
        candidate = _suffixed(base, n)
        if candidate not in used:
            return candidate
        n += 1


def _suffixed(base: str, n: int) -> str:
    suffix = f"-{n}"
    return base[: MAX_NAME - len(suffix)].rstrip("-") + suffix


class NameRegistry:
    """The step names of a workflow, handed out uniquely, with an undo journal.

    ``take(base)`` gives ``base``, then ``base-2``, ``base-3``, ... in amortised
    constant time (it remembers the next suffix per base), so a program that
    names 100k steps alike stays linear. ``mark()``/``rollback(mark)`` undo the
    names taken since the mark, for steps removed when a scope body raises.
    """

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._next: dict[str, int] = {}
        self._journal: list[tuple[str, str, int | None]] = []

    def __contains__(self, name: object) -> bool:
        return name in self._used

    def take(self, base: str) -> str:
        """Reserve and return the next free name for ``base``."""
        previous = self._next.get(base)
        name = unique_name(base, self._used, previous or 2)
        if name != base:
            n = int(name.rsplit("-", 1)[1])
            self._next[base] = n + 1
        self._used.add(name)
        self._journal.append((name, base, previous))
        return name

    def mark(self) -> int:
        """A point to roll back to."""
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        """Release every name taken since ``mark``."""
        for name, base, previous in reversed(self._journal[mark:]):
            self._used.discard(name)
            if previous is None:
                self._next.pop(base, None)
            else:
                self._next[base] = previous
        del self._journal[mark:]


@functools.lru_cache(maxsize=64)  # asked once per step added (a Path per step: 1 s at 100k)
def workflow_name_from_path(path: str) -> str | None:
    """A workflow name derived from a program's file name, or None if it gives none."""
    stem = Path(path).stem
    if not stem or stem.startswith("_") or stem.startswith("<"):
        return None
    return sanitize(stem, limit=MAX_WORKFLOW_NAME, fallback="workflow")
