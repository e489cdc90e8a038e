"""couler.cli_format: sizes and durations for people, sizes from people."""

from __future__ import annotations

import pytest

from couler.cli_format import human_bytes, human_seconds, parse_bytes
from couler.errors import UserError


@pytest.mark.parametrize(("n", "shown"), [
    (0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (10 * 1024**2, "10 MiB"),
    (int(2.25 * 1024**3), "2.2 GiB"), (5 * 1024**5, "5.0 PiB"),
])
def test_human_bytes(n: int, shown: str) -> None:
    assert human_bytes(n) == shown


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (-3, "0s"), (0.4, "0.4s"), (3.0, "3s"), (42.4, "42s"), (192, "3m 12s"),
    (3600, "1h"), (4320, "1h 12m"), (4325, "1h 12m"), (86400 * 2 + 3 * 3600, "2d 3h"),
    (float("inf"), "0s"),
])
def test_human_seconds(seconds: float, shown: str) -> None:
    assert human_seconds(seconds) == shown


@pytest.mark.parametrize(("text", "n"), [
    ("1000", 1000), ("512M", 512 * 1024**2), ("10GiB", 10 * 1024**3), ("1.5k", 1536),
    ("2 TB", 2 * 1024**4),
])
def test_parse_bytes(text: str, n: int) -> None:
    assert parse_bytes(text, "--free-bytes") == n


def test_parse_bytes_names_the_option() -> None:
    with pytest.raises(UserError, match="--free-bytes: 'lots' is not a size"):
        parse_bytes("lots", "--free-bytes")
