"""Order-insensitive canonical form of compiled documents, for golden comparisons.

Lists whose items are all mappings with a ``name`` (templates, tasks, parameters,
env vars, volumes, artifacts) are compared as sets keyed by name; every other list
(commands, args, items) keeps its order, because there order means something.
"""

from __future__ import annotations

import json
from typing import Any


def canonical(value: Any) -> Any:
    """The canonical form of a JSON-like value."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        items = [canonical(v) for v in value]
        if items and all(isinstance(i, dict) and "name" in i for i in items):
            items.sort(key=lambda i: (str(i["name"]), json.dumps(i, sort_keys=True)))
        return items
    return value


def canonical_text(value: Any) -> str:
    """Canonical JSON text, one key per line, for readable diffs."""
    return json.dumps(canonical(value), indent=1, sort_keys=True, ensure_ascii=False)
