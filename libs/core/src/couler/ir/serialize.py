"""Canonical JSON form of the IR, its inverse, and the content digest.

The canonical form is a JSON object per dataclass with fields equal to their
default left out, members of a union tagged with ``"kind"``, enums as their
values, tuples as arrays, and keys sorted. Two equal IR values always have the
same canonical text, so its sha256 is a content digest.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import types
import typing
from functools import cache
from typing import Any, TypeVar

from couler.ir import model

T = TypeVar("T")

_MISSING = dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class _FieldInfo:
    name: str
    hint: Any
    default: Any  # the default value, or _MISSING


@cache
def _fields(cls: type) -> tuple[_FieldInfo, ...]:
    hints = typing.get_type_hints(cls, vars(model))
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not _MISSING:
            default: Any = f.default
        elif f.default_factory is not _MISSING:
            default = f.default_factory()
        else:
            default = _MISSING
        out.append(_FieldInfo(f.name, hints[f.name], default))
    return tuple(out)


def _union_args(hint: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(hint)
    return None


def to_dict(value: Any) -> Any:
    """Encode an IR value as JSON-compatible data (the canonical form)."""
    return _encode(value, type(value))


def _encode(value: Any, hint: Any) -> Any:
    # What depends only on the type and the hint is looked up once per pair (cached):
    # encoding is per step on every plan (cache keys, the digest), 5 s of 20 at 10k steps.
    if value is None:
        return None
    cls = type(value)
    if cls is str or cls is bool:
        return value
    plan = _dataclass_plan(cls)  # type: ignore[arg-type]
    if plan is not None:
        out: dict[str, Any] = {}
        if _tagged(cls, hint):  # type: ignore[arg-type]
            out["kind"] = cls.KIND
        for name, field_hint, default, floats in plan:
            item = getattr(value, name)
            if default is not _MISSING and item == default:
                continue
            # Leaves inline (a call per field was most of the cost): the same values
            # the recursive call returns for them.
            kind = type(item)
            if kind is str or kind is bool or item is None:
                out[name] = item
            elif kind is int:
                out[name] = float(item) if floats else item
            else:
                out[name] = _encode(item, field_hint)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        item_hint, fixed = _tuple_hints(hint)
        if fixed is not None:  # a fixed-size tuple such as a (key, value) pair
            return [_encode(v, a) for v, a in zip(value, fixed, strict=True)]
        return [v if type(v) is str else _encode(v, item_hint) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and _is_float(hint):
        return float(value)
    return value


@cache
def _dataclass_plan(cls: type) -> tuple[tuple[str, Any, Any, bool], ...] | None:
    """Per field of a dataclass type: its name, hint, default (or _MISSING) and whether
    an int there is encoded as a float; None for any other type."""
    fields = _dataclass_fields(cls)
    if fields is None:
        return None
    return tuple((f.name, f.hint, f.default, _is_float(f.hint)) for f in fields)


@cache
def _dataclass_fields(cls: type) -> tuple[_FieldInfo, ...] | None:
    """The fields of a dataclass type; None for any other type."""
    if not dataclasses.is_dataclass(cls):
        return None
    return _fields(cls)


@cache
def _tagged(cls: type, hint: Any) -> bool:
    """Whether a ``cls`` value where ``hint`` is expected carries its ``kind``."""
    union = _union_args(hint)
    return union is not None and sum(1 for a in union if a is not type(None)) > 1


@cache
def _tuple_hints(hint: Any) -> tuple[Any, tuple[Any, ...] | None]:
    """The item hint of a ``tuple[X, ...]`` hint, or the hints of a fixed-size one."""
    args = typing.get_args(hint)
    if not args:
        return Any, None
    if len(args) == 2 and args[1] is Ellipsis:
        return args[0], None
    return Any, args


@cache
def _is_float(hint: Any) -> bool:
    if hint is float:
        return True
    union = _union_args(hint)
    return union is not None and float in union


def from_dict(cls: type[T], data: Any) -> T:
    """Decode canonical JSON data into an IR value of type ``cls``."""
    result: T = _decode(data, cls)
    return result


def _decode(data: Any, hint: Any) -> Any:
    if hint is Any:
        return data
    union = _union_args(hint)
    if union is not None:
        if data is None:
            if type(None) in union:
                return None
            raise ValueError(f"null is not allowed for {hint}")
        members = [a for a in union if a is not type(None)]
        if len(members) == 1:
            return _decode(data, members[0])
        if all(dataclasses.is_dataclass(m) for m in members):
            if not isinstance(data, dict) or "kind" not in data:
                raise ValueError(f"expected an object with a 'kind' for {hint}")
            for m in members:
                if data["kind"] == m.KIND:
                    return _decode(data, m)
            raise ValueError(f"unknown kind {data['kind']!r} for {hint}")
        for m in members:  # scalar unions such as float | None
            if m is float and isinstance(data, (int, float)) and not isinstance(data, bool):
                return float(data)
            if isinstance(m, type) and isinstance(data, m):
                return data
        raise ValueError(f"{data!r} does not match {hint}")
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"expected an array for {hint}, got {data!r}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(v, args[0]) for v in data)
        if len(args) != len(data):
            raise ValueError(f"expected {len(args)} items for {hint}, got {len(data)}")
        return tuple(_decode(v, a) for v, a in zip(data, args, strict=True))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(data)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(data, dict):
            raise ValueError(f"expected an object for {hint.__name__}, got {data!r}")
        kwargs = {}
        known = set()
        for info in _fields(hint):
            known.add(info.name)
            if info.name in data:
                kwargs[info.name] = _decode(data[info.name], info.hint)
        unknown = set(data) - known - {"kind"}
        if unknown:
            raise ValueError(f"unknown fields for {hint.__name__}: {sorted(unknown)}")
        return hint(**kwargs)
    if hint is float:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise ValueError(f"expected a number, got {data!r}")
    if hint is int and (not isinstance(data, int) or isinstance(data, bool)):
        raise ValueError(f"expected an integer, got {data!r}")
    if hint is str and not isinstance(data, str):
        raise ValueError(f"expected a string, got {data!r}")
    if hint is bool and not isinstance(data, bool):
        raise ValueError(f"expected a boolean, got {data!r}")
    return data


def to_json(value: Any) -> str:
    """The canonical JSON text of an IR value (sorted keys, no whitespace)."""
    return json.dumps(to_dict(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def from_json(cls: type[T], text: str | bytes) -> T:
    """Parse canonical (or any equivalent) JSON text into an IR value of type ``cls``."""
    return from_dict(cls, json.loads(text))


def digest(value: Any) -> str:
    """The content digest of an IR value: ``sha256:`` + hex of its canonical JSON."""
    return "sha256:" + hashlib.sha256(to_json(value).encode()).hexdigest()
