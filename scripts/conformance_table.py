"""Print, or write to tests/conformance/RESULTS.md, the conformance tables.

Usage: ``python scripts/conformance_table.py [--update | --check]``. Compiles
every program in ``tests/conformance/programs`` for every engine (KFP in
``.venv-kfp``), runs it on the local engine, and renders the engine x program
and engine x feature tables. ``--update`` writes RESULTS.md; ``--check`` exits
non-zero when RESULTS.md differs from what would be written.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conformance.harness import RESULTS, collect, render_results  # noqa: E402


def render() -> str:
    """The text of RESULTS.md."""
    with tempfile.TemporaryDirectory() as tmp:
        return render_results(collect(Path(tmp)))


def main(argv: list[str]) -> int:
    """Print the tables; ``--update`` writes RESULTS.md, ``--check`` compares with it."""
    text = render()
    if "--check" in argv:
        current = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
        if current != text:
            print(f"{RESULTS} is out of date; run scripts/conformance_table.py --update",
                  file=sys.stderr)
            return 1
        return 0
    if "--update" in argv:
        RESULTS.write_text(text, encoding="utf-8")
        print(f"wrote {RESULTS}")
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
