"""Numbers as the command line shows them to people: sizes and durations.

``--json`` output never goes through here: machines get the raw bytes and seconds.
"""

from __future__ import annotations

import math
import re

from couler.errors import UserError

__all__ = ["human_bytes", "human_seconds", "parse_bytes"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)", re.IGNORECASE)


def human_bytes(n: int) -> str:
    """``n`` bytes in binary units: ``"512 B"``, ``"1.5 KiB"``, ``"12 GiB"``."""
    size = float(max(n, 0))
    for unit in _UNITS:
        if size < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(size)} B"
            return f"{size:.1f} {unit}" if size < 10 else f"{size:.0f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def human_seconds(seconds: float) -> str:
    """A duration the way people say it: ``"0.4s"``, ``"42s"``, ``"3m 12s"``,
    ``"1h 12m"``, ``"2d 3h"`` (two units at most)."""
    if not math.isfinite(seconds) or seconds <= 0:
        return "0s"
    if seconds < 10:
        return f"{seconds:.1f}s".replace(".0s", "s")
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    first = next(i for i, (v, _) in enumerate(parts) if v)
    shown = [f"{v}{u}" for v, u in parts[first:first + 2] if v]
    return " ".join(shown)


def parse_bytes(text: str, what: str) -> int:
    """A size given on the command line -- ``"1000"``, ``"512M"``, ``"10GiB"`` (binary
    units) -- in bytes.

    Raises:
        UserError: ``text`` is not a size (the message names ``what``).
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise UserError(f"{what}: {text!r} is not a size (e.g. 1000, 512M, 10GiB)")
    number, unit = float(match.group(1)), match.group(2).upper()
    return int(number * 1024 ** (" KMGTP".index(unit) if unit else 0))
