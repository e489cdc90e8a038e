"""Checks of Kubernetes and Tekton Triggers documents for the Tekton compiler's tests.

:func:`kube_errors` checks a core Kubernetes object (ConfigMap, CronJob, ...) against the
models of the ``kubernetes`` Python client, which are generated from Kubernetes' OpenAPI
definitions: every key must be a field of the model (``attribute_map``), every value of the
field's type, and the client's deserializer must accept the whole object (its models refuse
a missing required field). :func:`triggers_errors` checks Tekton Triggers objects
structurally -- no Triggers schema is vendored (none ships on PyPI or npm): known keys,
required fields, and that the template's ``$(tt.params.X)`` are declared, the binding's
params are the template's and the template's PipelineRun is valid against the vendored
Tekton schema. :func:`tekton_errors` checks a Tekton Pipeline or PipelineRun against the
vendored CRD schema.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator
from kubernetes import client as k8s

_PRIMITIVE: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "bool": (bool,),
                                           "float": (int, float), "object": (object,)}


def _walk(data: Any, klass: str, path: str, errors: list[str]) -> None:
    if klass.startswith("List["):
        klass = "list[" + klass[5:]
    if klass.startswith("Dict["):
        klass = "dict(" + klass[5:-1] + ")"
    if klass.startswith("list["):
        if not isinstance(data, list):
            errors.append(f"{path}: not a list")
            return
        for i, item in enumerate(data):
            _walk(item, klass[5:-1], f"{path}[{i}]", errors)
        return
    if klass.startswith("dict("):
        if not isinstance(data, dict):
            errors.append(f"{path}: not an object")
            return
        inner = re.match(r"dict\(([^,]*), (.*)\)", klass)
        assert inner is not None
        for k, v in data.items():
            _walk(v, inner.group(2), f"{path}.{k}", errors)
        return
    if klass in _PRIMITIVE:
        if not isinstance(data, _PRIMITIVE[klass]) or (klass == "int" and isinstance(data, bool)):
            errors.append(f"{path}: {data!r} is not {klass}")
        return
    model = getattr(k8s.models, klass)
    if not isinstance(data, dict):
        errors.append(f"{path}: not an object ({klass})")
        return
    by_json = {v: k for k, v in model.attribute_map.items()}
    for key, value in data.items():
        if key not in by_json:
            errors.append(f"{path}.{key}: unknown field of {klass}")
            continue
        _walk(value, model.openapi_types[by_json[key]], f"{path}.{key}", errors)


def kube_errors(doc: dict[str, Any]) -> list[str]:
    """Errors of a core Kubernetes object against the client's model of its kind."""
    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else "core"
    version = doc["apiVersion"].split("/")[-1]
    klass = f"{version.capitalize()}{doc['kind']}"
    if not hasattr(k8s.models, klass):
        return [f"no model {klass} for {group}/{version}"]
    errors: list[str] = []
    _walk(doc, klass, doc["kind"], errors)
    if not errors:
        try:
            k8s.ApiClient()._ApiClient__deserialize(doc, klass)  # type: ignore[attr-defined]
        except ValueError as exc:  # a required field is missing
            errors.append(f"{doc['kind']}: {exc}")
    return errors


_TT_PARAM = re.compile(r"\$\(tt\.params\.([^)]+)\)")


def _keys(obj: Any, allowed: set[str], required: set[str], path: str,
          errors: list[str]) -> None:
    if not isinstance(obj, dict):
        errors.append(f"{path}: not an object")
        return
    errors += [f"{path}.{k}: unknown field" for k in sorted(set(obj) - allowed)]
    errors += [f"{path}.{k}: required" for k in sorted(required - set(obj))]


def triggers_errors(doc: dict[str, Any], pipelinerun_errors: Any) -> list[str]:
    """Structural errors of a TriggerBinding, TriggerTemplate or EventListener
    (``triggers.tekton.dev/v1beta1``); ``pipelinerun_errors`` checks a PipelineRun."""
    errors: list[str] = []
    if doc.get("apiVersion") != "triggers.tekton.dev/v1beta1":
        errors.append(f"apiVersion {doc.get('apiVersion')!r}")
    _keys(doc, {"apiVersion", "kind", "metadata", "spec"}, {"metadata", "spec"}, "", errors)
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"].get("name", "")):
        errors.append("metadata.name: not a DNS-1123 label")
    spec = doc.get("spec", {})
    kind = doc["kind"]
    if kind == "TriggerBinding":
        _keys(spec, {"params"}, set(), "spec", errors)
        for i, p in enumerate(spec.get("params", [])):
            _keys(p, {"name", "value"}, {"name", "value"}, f"spec.params[{i}]", errors)
            if not all(isinstance(v, str) for v in p.values()):
                errors.append(f"spec.params[{i}]: name and value must be strings")
    elif kind == "TriggerTemplate":
        _keys(spec, {"params", "resourcetemplates"}, {"resourcetemplates"}, "spec", errors)
        declared = set()
        for i, p in enumerate(spec.get("params", [])):
            _keys(p, {"name", "description", "default"}, {"name"}, f"spec.params[{i}]", errors)
            declared.add(p["name"])
        for i, res in enumerate(spec.get("resourcetemplates", [])):
            used = set(_TT_PARAM.findall(str(res)))
            errors += [f"spec.resourcetemplates[{i}]: $(tt.params.{u}) not declared"
                       for u in sorted(used - declared)]
            if res.get("kind") == "PipelineRun":
                if "generateName" not in res.get("metadata", {}):
                    errors.append(f"spec.resourcetemplates[{i}]: a PipelineRun needs "
                                  "generateName (one run per event)")
                errors += [f"spec.resourcetemplates[{i}]: {e}" for e in pipelinerun_errors(res)]
    elif kind == "EventListener":
        _keys(spec, {"serviceAccountName", "triggers", "namespaceSelector", "resources",
                     "labelSelector"}, {"triggers"}, "spec", errors)
        for i, t in enumerate(spec.get("triggers", [])):
            where = f"spec.triggers[{i}]"
            _keys(t, {"name", "interceptors", "bindings", "template", "serviceAccountName"},
                  {"template"}, where, errors)
            for j, ic in enumerate(t.get("interceptors", [])):
                _keys(ic, {"ref", "params", "name"}, {"ref"}, f"{where}.interceptors[{j}]",
                      errors)
                _keys(ic.get("ref"), {"name", "kind", "apiVersion"}, {"name"},
                      f"{where}.interceptors[{j}].ref", errors)
                for k, p in enumerate(ic.get("params", [])):
                    _keys(p, {"name", "value"}, {"name", "value"},
                          f"{where}.interceptors[{j}].params[{k}]", errors)
            for j, b in enumerate(t.get("bindings", [])):
                _keys(b, {"ref", "kind", "name", "value"}, set(), f"{where}.bindings[{j}]",
                      errors)
            _keys(t.get("template"), {"ref", "spec"}, set(), f"{where}.template", errors)
    else:
        errors.append(f"unknown Triggers kind {kind!r}")
    return errors


# --------------------------------------------------------------------------- Tekton CRDs

_TEKTON = Path(__file__).resolve().parents[1] / "data" / "schemas" / "tekton"
_TEKTON_FILES = {"Pipeline": "300-pipeline.yaml", "PipelineRun": "300-pipelinerun.yaml"}


@cache
def _tekton_schema(kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((_TEKTON / _TEKTON_FILES[kind]).read_text(encoding="utf-8"))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _pruned(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Keys a structural schema does not declare (the API server would prune them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if props is not None and key in props:
                out += _pruned(item, props[key], where)
            elif isinstance(extra, dict):
                out += _pruned(item, extra, where)
            elif props is not None and not (path == "" and key in ("apiVersion", "kind")) \
                    and path != "metadata" and not path.startswith("metadata."):
                out.append(f"{where}: unknown field")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += _pruned(item, schema["items"], f"{path}[{i}]")
    return out


def tekton_errors(doc: dict[str, Any]) -> list[str]:
    """Errors of a ``tekton.dev/v1`` Pipeline or PipelineRun against the vendored CRD
    schema (``tests/data/schemas/tekton``): the schema's own errors, then every field the
    structural schema does not declare."""
    kind = doc.get("kind")
    if kind not in _TEKTON_FILES:
        return [f"kind: {kind!r} is not one of {', '.join(_TEKTON_FILES)}"]
    schema = _tekton_schema(str(kind))
    errors = [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
              for e in Draft7Validator(schema).iter_errors(doc)]
    return errors + _pruned(doc, schema, "")
