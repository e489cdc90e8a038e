"""Compiled documents as the engines' APIs take them: compact JSON.

The Kubernetes API server (Argo, Tekton; KFP's backend runs a pipeline as an Argo
Workflow object) stores an object as compact JSON, and etcd's request limit applies to
that; KFP receives the pipeline spec as JSON in the run's body. So a document's size
against an engine's byte limit is the length of its compact JSON, not of the YAML
``couler compile`` prints (a fifth larger for a long Argo chain, and slower to render).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_size", "to_json"]


def to_json(doc: Any) -> str:
    """``doc`` as compact JSON (no spaces; non-ASCII characters escaped, so it is ASCII)."""
    return json.dumps(doc, separators=(",", ":"))


def json_size(doc: Any) -> int:
    """Bytes of ``doc`` as compact JSON (:func:`to_json`): the size an engine's object-size
    limit is checked against. Escaping non-ASCII characters counts them at 6-12 bytes
    where the server may store 2-4 (UTF-8): never less than what is stored."""
    return len(to_json(doc))
