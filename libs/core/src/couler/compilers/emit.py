"""A streaming YAML emitter for JSON-like documents (dicts, lists, str, int, float, bool, None).

Why not PyYAML's dumper: it first builds a node graph of the whole document,
which for a 100k-step workflow (37 MB of YAML) took 10.6 s and most of a 1.7 GiB
peak, growing faster than the document. Compiled documents are plain data, so
this emitter writes block-style YAML directly, in one pass, in the layout
PyYAML uses (two-space indents, list items at their key's indentation, key
order kept).

Scalars are written plain only when PyYAML's own resolver reads them back as
the same string; otherwise strings are double-quoted (JSON escapes, plus
escapes for characters YAML does not allow raw). Multi-line strings (script
sources, manifests) use literal blocks (``|``) when that is exact. The tests
check ``yaml.safe_load(to_yaml(doc)) == doc`` on generated documents.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

__all__ = ["to_yaml"]

_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = Resolver()
# A plain (unquoted) scalar in block context: it starts with a character that is not a YAML
# indicator (or with "-", "?" or ":" followed by a non-space), and holds no control
# characters, tabs or line breaks. ": " and " #" inside, a trailing blank or ":", and a
# leading "---" or "..." (document markers) are rejected separately.
_PLAIN = re.compile(
    r"(?:[^\s\-?:,\[\]{}#&*!|>'\"%@`\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff]"
    r"|[-?:][^\s,\[\]{}\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff])"
    r"[^\t\n\r\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]*"
)
# Everything YAML's c-printable set excludes, plus the characters YAML treats as line
# breaks (NEL, LS, PS) and the byte-order mark: these must be escaped.
_NEEDS_ESCAPE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]"
)
_NOT_PRINTABLE_IN_BLOCK = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]"
)


def to_yaml(doc: Any) -> str:
    """Render a JSON-like document as block-style YAML text."""
    out: list[str] = []
    _node(doc, 0, out, top=True)
    return "".join(out)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


# Printable ASCII but ``"`` and ``\``: JSON writes such text between quotes as it is, and
# YAML needs nothing escaped in it (the numbers of a long chain's arguments, 200k at 100k steps).
_AS_IS_QUOTED = re.compile(r'[ !#-\[\]-~]*')


def _quoted(text: str) -> str:
    if _AS_IS_QUOTED.fullmatch(text):
        return f'"{text}"'
    return _NEEDS_ESCAPE.sub(_escape, json.dumps(text, ensure_ascii=False))


# A word of letters, digits and ``_ . / -`` starting with a letter: always plain (it starts
# with no indicator and holds no space, ":" or "#"), and PyYAML resolves every such word
# as a string but its booleans and nulls (the other implicit types start with a digit,
# a sign, ".", "~", "<" or "="), which the full check below decides. Most of a compiled
# workflow's values are such words (names, images, arguments): the resolver's regexes
# were a fifth of rendering.
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")
_WORDS_NOT_STR = frozenset({"yes", "no", "true", "false", "on", "off", "null", "y", "n"})


@functools.lru_cache(maxsize=8192)  # keys and common values repeat in every task/template
def _string(text: str) -> str:
    if _WORD.fullmatch(text) and text.lower() not in _WORDS_NOT_STR:
        return text
    if (
        text
        and _PLAIN.fullmatch(text)
        and not text.endswith((" ", ":"))
        and not text.startswith(("---", "..."))
        and ": " not in text
        and " #" not in text
        and _RESOLVER.resolve(ScalarNode, text, (True, False)) == _STR_TAG  # type: ignore[no-untyped-call]
    ):
        return text
    return _quoted(text)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        if "." not in text and "e" in text:  # YAML 1.1 floats need a dot: 1e-05 -> 1.0e-05
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    if isinstance(value, str):
        return _string(value)
    raise TypeError(f"cannot render {type(value).__name__} as YAML")


def _block(text: str, indent: int) -> str | None:
    """A literal block for a multi-line string, or None when a block would not be exact."""
    if "\n" not in text or "\r" in text or _NOT_PRINTABLE_IN_BLOCK.search(text):
        return None
    if text[0] in " \t\n":  # a leading blank would need an indentation indicator
        return None
    body = text.rstrip("\n")
    trailing = len(text) - len(body)
    chomp = "-" if trailing == 0 else ("" if trailing == 1 else "+")
    pad = " " * indent
    lines = [pad + line if line else "" for line in body.split("\n")]
    lines.extend([""] * (trailing - 1))
    return f"|{chomp}\n" + "\n".join(lines) + "\n"


def _node(value: Any, indent: int, out: list[str], *, top: bool = False) -> None:
    """Append ``value`` as the rest of the current line plus any nested lines."""
    kind = type(value)  # exact types first: an ABC isinstance check costs 10x more
    if kind is dict or (kind is not list and kind is not str and isinstance(value, Mapping)):
        if not value:
            out.append("{}\n")
            return
        first = True
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(f"mapping keys must be strings, not {type(key).__name__}")
            out.append(_key_line(key, indent if top or not first else 0))
            first = False
            if type(item) is str and "\n" not in item:
                out.append(_after_key(item))
            else:
                _value_after_key(item, indent, out)
        return
    if kind is list or kind is tuple:
        if not value:
            out.append("[]\n")
            return
        first = True
        for item in value:
            out.append(_dash(indent if top or not first else 0))
            first = False
            if type(item) is str:
                if "\n" in item:
                    block = _block(item, indent + 2)
                    out.append(block if block is not None else _quoted(item) + "\n")
                else:
                    out.append(_string(item) + "\n")
            else:
                _node(item, indent + 2, out)  # a collection continues on this line
        return
    out.append(_scalar(value))
    out.append("\n")


@functools.lru_cache(maxsize=8192)
def _after_key(text: str) -> str:
    """`` value`` and the line break after a key, for a one-line string."""
    return " " + _string(text) + "\n"


@functools.lru_cache(maxsize=16384)  # the same keys recur at the same depths on every line
def _key_line(key: str, indent: int) -> str:
    return " " * indent + _string(key) + ":"


@functools.lru_cache(maxsize=256)
def _dash(indent: int) -> str:
    return " " * indent + "- "


def _value_after_key(item: Any, indent: int, out: list[str]) -> None:
    kind = type(item)
    if kind is dict and item:
        out.append("\n")
        _node(item, indent + 2, out, top=True)
    elif kind is list and item:
        out.append("\n")
        _node(item, indent, out, top=True)  # list items sit at their key's indentation
    elif isinstance(item, Mapping) and item:
        out.append("\n")
        _node(item, indent + 2, out, top=True)
    elif isinstance(item, (list, tuple)) and item:
        out.append("\n")
        _node(item, indent, out, top=True)  # list items sit at their key's indentation
    elif isinstance(item, str) and "\n" in item:
        block = _block(item, indent + 2)
        out.append(" " + (block if block is not None else _quoted(item) + "\n"))
    elif isinstance(item, Mapping):
        out.append(" {}\n")
    elif isinstance(item, (list, tuple)):
        out.append(" []\n")
    else:
        out.append(" " + _scalar(item) + "\n")
