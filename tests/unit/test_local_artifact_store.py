"""The local engine's artifact store under concurrent puts (the items of a map each keep
their artifact as the map step's too, side by side)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from couler_runtime.local.artifacts import ArtifactStore


def test_concurrent_puts_to_one_place_never_fail_and_the_last_wins(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    sources = []
    for i in range(8):
        src = tmp_path / f"src-{i}.txt"
        src.write_text(f"item {i}\n" * 1000)
        sources.append(src)
    with ThreadPoolExecutor(8) as pool:
        # each replacement unlinks what is there: two at once used to unlink it twice
        placed = list(pool.map(lambda i: store.put("sq", "out", sources[i % 8]), range(400)))
    assert set(placed) == {store.location("sq", "out")}
    assert store.location("sq", "out").read_text() in {s.read_text() for s in sources}
