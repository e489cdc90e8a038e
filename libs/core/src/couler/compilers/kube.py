"""Kubernetes shapes shared by the compilers whose engines run pods (Argo, Tekton)."""

from __future__ import annotations

from typing import Any

from couler import ir

__all__ = ["cron_policy", "dns_settings", "resource_requirements", "se_linux_options"]


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


_CONCURRENCY = {
    ir.ConcurrencyPolicy.ALLOW: "Allow",
    ir.ConcurrencyPolicy.FORBID: "Forbid",
    ir.ConcurrencyPolicy.REPLACE: "Replace",
}


def cron_policy(s: ir.CronSchedule) -> dict[str, Any]:
    """The fields of a schedule's policy that Argo's CronWorkflow spec and a Kubernetes
    ``batch/v1`` CronJob spec share, with the same names and meaning (concurrency policy,
    starting deadline, history limits, suspend), unset ones left out."""
    out: dict[str, Any] = {"concurrencyPolicy": _CONCURRENCY[s.concurrency_policy]}
    if s.starting_deadline_seconds is not None:
        out["startingDeadlineSeconds"] = s.starting_deadline_seconds
    if s.successful_history_limit is not None:
        out["successfulJobsHistoryLimit"] = s.successful_history_limit
    if s.failed_history_limit is not None:
        out["failedJobsHistoryLimit"] = s.failed_history_limit
    if s.suspend:
        out["suspend"] = True
    return out
