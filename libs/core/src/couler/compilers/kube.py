"""Kubernetes shapes shared by the compilers whose engines run pods (Argo, Tekton)."""

from __future__ import annotations

from typing import Any

from couler import ir

__all__ = ["dns_settings", "resource_requirements", "se_linux_options"]


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


def se_linux_options(options: ir.SELinuxOptions) -> dict[str, str]:
    """A ``seLinuxOptions`` object (only the labels that are set)."""
    return {k: v for k, v in (("user", options.user), ("role", options.role),
                              ("type", options.type), ("level", options.level)) if v}


def dns_settings(dns: ir.DnsConfig) -> dict[str, Any]:
    """A pod's ``dnsPolicy`` and ``dnsConfig`` (only the parts that are set)."""
    out: dict[str, Any] = {}
    if dns.policy:
        out["dnsPolicy"] = dns.policy
    config: dict[str, Any] = {}
    if dns.nameservers:
        config["nameservers"] = list(dns.nameservers)
    if dns.searches:
        config["searches"] = list(dns.searches)
    if dns.options:  # an option's value is optional in Kubernetes
        config["options"] = [{"name": k, "value": v} if v else {"name": k} for k, v in dns.options]
    if config:
        out["dnsConfig"] = config
    return out
