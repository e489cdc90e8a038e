"""Handles formatted into strings: ``f"--lr={lr}"``, ``"print(%s)" % item``, ``"{}".format(out)``.

A step output, a map item or a workflow parameter is known only when the
workflow runs, so formatting one cannot produce its value. Instead ``str()``
and ``format()`` of a handle give a *mark*: a private-use-delimited token that
the workflow's builder resolves. Where a step takes text that engines
template (its ``args``, ``command`` and ``env`` values), each mark becomes an
input parameter of the step fed by the handle, and the mark its placeholder
``{{inputs.NAME}}``, which every compiler renders natively (Argo
``{{inputs.parameters.NAME}}``, Tekton ``$(params.NAME)``, KFP's input
placeholder, the Airflow step runner) and the local engine and Ray substitute.
Anywhere else (an image, a step name, a script source, a condition operand) a
mark is refused when the workflow is built, naming the step and the field.

What cannot be represented fails at once with :class:`~couler.errors.UserError`:
a format spec (``f"{lr:.3f}"``) or a numeric ``%`` conversion (``"%d" % n``)
would need the value now.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from couler.errors import UserError

if TYPE_CHECKING:
    from couler import ir

__all__ = [
    "MARK_OPEN",
    "Formattable",
    "Marks",
    "find_mark",
    "has_mark",
    "refuse_in_name",
    "split_marks",
    "texts",
]

MARK_OPEN = "\ue000"
_MARK_CLOSE = "\ue001"
_MARK = re.compile(MARK_OPEN + r"couler-ref-([0-9]+)-([0-9]+)" + _MARK_CLOSE)
_BUILDERS = itertools.count(1)


def has_mark(text: str) -> bool:
    """Whether ``text`` holds a formatted handle."""
    return MARK_OPEN in text


def split_marks(text: str) -> Iterator[tuple[str, str]]:
    """``text`` as ``(literal, mark)`` pairs; the last pair's mark is empty."""
    pos = 0
    for m in _MARK.finditer(text):
        yield text[pos:m.start()], m.group(0)
        pos = m.end()
    yield text[pos:], ""


class Marks:
    """One workflow builder's formatted handles, by mark."""

    __slots__ = ("_by_handle", "_by_mark", "_serial")

    def __init__(self) -> None:
        self._serial = next(_BUILDERS)
        self._by_mark: dict[str, object] = {}
        self._by_handle: dict[int, str] = {}

    def __bool__(self) -> bool:
        return bool(self._by_mark)

    def mark(self, handle: object) -> str:
        """The mark standing for ``handle`` (the same one each time it is formatted)."""
        known = self._by_handle.get(id(handle))
        if known is not None:
            return known
        text = f"{MARK_OPEN}couler-ref-{self._serial}-{len(self._by_mark)}{_MARK_CLOSE}"
        self._by_mark[text] = handle
        self._by_handle[id(handle)] = text
        return text

    def resolve(self, mark: str, *, where: str) -> object:
        """The handle behind ``mark``; refused when another workflow formatted it."""
        handle = self._by_mark.get(mark)
        if handle is None:
            raise UserError(f"{where}: the text holds a value formatted while building another "
                            "workflow; format it inside this workflow")
        return handle

    def describe(self, text: str) -> str:
        """What the first mark in ``text`` stands for, for error messages."""
        m = _MARK.search(text)
        handle = self._by_mark.get(m.group(0)) if m else None
        return repr(handle) if handle is not None else "a value of another workflow"


class Formattable:
    """Mixin of the handles: formatting gives a mark the builder turns into a placeholder."""

    __slots__ = ()

    def _marks(self) -> Marks | None:
        """The marks of the workflow this handle belongs to (None outside any workflow)."""
        raise NotImplementedError

    def _mark(self) -> str:
        marks = self._marks()
        return marks.mark(self) if marks is not None else repr(self)

    def __str__(self) -> str:
        return self._mark()

    def __format__(self, spec: str) -> str:
        if spec:
            raise UserError(f"{self!r} is formatted with {spec!r}, but its value is known only "
                            "when the workflow runs; format it inside the step, or use "
                            "{} / %s to pass it as text")
        return self._mark()

    def _not_a_number(self) -> UserError:
        return UserError(f"{self!r} is used as a number (%d, %f, int(), range()), but its value "
                         "is known only when the workflow runs; use %s or {} to pass it as text")

    def __int__(self) -> int:
        raise self._not_a_number()

    def __float__(self) -> float:
        raise self._not_a_number()

    def __index__(self) -> int:
        raise self._not_a_number()


def find_mark(step: ir.Step) -> str:
    """The first field of ``step`` (``body.image``, ``env``, ...) holding a mark; "" if none."""
    for field in dataclasses.fields(step):
        value = getattr(step, field.name)
        if field.name == "body":
            for inner in dataclasses.fields(value):
                if inner.name != "steps" and any(map(has_mark, texts(getattr(value, inner.name)))):
                    return f"body.{inner.name}"  # an inline sub-workflow's steps come one by one
        elif any(map(has_mark, texts(value))):
            return field.name
    return ""


def texts(value: object) -> Iterator[str]:
    """Every string inside ``value`` (IR dataclasses, tuples, enums excluded)."""
    if isinstance(value, enum.Enum):
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from texts(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from texts(getattr(value, f.name))


def refuse_in_name(name: str | None, what: str) -> None:
    """Refuse a formatted handle in a name: names are fixed when the workflow is built."""
    if name and has_mark(name):
        raise UserError(f"{what} {name!r} holds a value known only when the workflow runs (a "
                        "formatted step output, map item or parameter); names are fixed when "
                        "the workflow is built")
