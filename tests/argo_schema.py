"""Check Argo documents against the vendored Argo Workflows JSON schema.

:func:`validate_argo` returns every problem found in a ``Workflow`` or
``CronWorkflow`` document (picked by its ``kind``): the schema's own errors
(types, shapes, required fields) plus every key the schema does not know. The
vendored definitions never set ``additionalProperties: false``, so a misspelt
field would otherwise pass; the key walk follows ``properties``, ``$ref``,
array ``items`` and map ``additionalProperties`` alongside the document.
:func:`assert_valid_argo` fails with all problems listed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMA_PATH = Path(__file__).parent / "data" / "schemas" / "argo-workflows.schema.json"
_PREFIX = "io.argoproj.workflow.v1alpha1."
KINDS = ("Workflow", "CronWorkflow", "WorkflowTemplate", "ClusterWorkflowTemplate")


@cache
def _definitions() -> dict[str, Any]:
    with SCHEMA_PATH.open(encoding="utf-8") as f:
        defs: dict[str, Any] = json.load(f)["definitions"]
    return defs


@cache
def _validator(kind: str) -> Draft202012Validator:
    schema = {"$ref": f"#/definitions/{_PREFIX}{kind}", "definitions": _definitions()}
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _resolve(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    seen = 0
    while "$ref" in schema and seen < 50:
        ref = schema["$ref"]
        schema = _definitions()[ref.rsplit("/", 1)[-1]]
        seen += 1
    return schema


def unknown_keys(value: Any, schema: Mapping[str, Any], path: str = "") -> Iterator[str]:
    """Paths of keys in ``value`` that ``schema`` (followed through refs) does not declare."""
    schema = _resolve(schema)
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if props is not None and key in props:
                yield from unknown_keys(item, props[key], where)
            elif isinstance(extra, Mapping):
                yield from unknown_keys(item, extra, where)
            elif props is not None:
                yield f"{where}: unknown field"
            # neither: a free-form object (e.g. withItems items), anything goes
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                yield from unknown_keys(item, items, f"{path}[{i}]")


def validate_argo(doc: Mapping[str, Any]) -> list[str]:
    """Every schema error and unknown key in an Argo document, as readable lines."""
    kind = doc.get("kind")
    if kind not in KINDS:
        return [f"kind: {kind!r} is not one of {', '.join(KINDS)}"]
    problems = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(_validator(kind).iter_errors(doc), key=lambda e: list(map(str, e.path)))
    ]
    problems += unknown_keys(doc, {"$ref": f"#/definitions/{_PREFIX}{kind}"})
    return problems


def assert_valid_argo(doc: Mapping[str, Any]) -> None:
    """Fail listing every problem :func:`validate_argo` finds."""
    problems = validate_argo(doc)
    assert not problems, "invalid Argo document:\n  " + "\n  ".join(problems)
