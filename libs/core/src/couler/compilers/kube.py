"""Kubernetes shapes shared by the compilers whose engines run pods (Argo, Tekton)."""

from __future__ import annotations

from typing import Any

from couler import ir

__all__ = ["resource_requirements"]


def resource_requirements(r: ir.Resources) -> dict[str, Any]:
    """A container's ``resources`` (requests and limits; GPUs as a limit of their resource)."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if r.cpu_request:
        requests["cpu"] = r.cpu_request
    if r.memory_request:
        requests["memory"] = r.memory_request
    if r.cpu_limit:
        limits["cpu"] = r.cpu_limit
    if r.memory_limit:
        limits["memory"] = r.memory_limit
    if r.gpu:
        limits[r.gpu_resource] = str(r.gpu)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out
