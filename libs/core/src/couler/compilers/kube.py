"""Kubernetes shapes shared by the compilers whose engines run pods (Argo, Tekton, KFP)."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal
from typing import Any

from couler import ir
from couler.ir import parse_quantity

__all__ = [
    "DIGEST_ANNOTATION",
    "cron_policy",
    "dns_settings",
    "memory_levels",
    "resource_requirements",
    "se_linux_options",
]


#: The annotation recording the pinned digest of a referenced workflow on the run created
#: for a sub-workflow reference (Argo's child Workflow, Tekton's child PipelineRun).
DIGEST_ANNOTATION = "couler.io/digest"

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


def memory_levels(retry: ir.RetryPolicy | None, res: ir.Resources | None
                  ) -> list[dict[str, Any]]:
    """Memory escalation on OOM as attempt tasks (Tekton, KFP): the compute resources of
    each task, one per distinct memory -- the first as written, then the memory limit /
    request multiplied by ``memory_factor`` per task, capped at ``memory_ceiling`` (a
    request never above its limit), at most ``limit + 1`` tasks -- or [] when there is
    nothing to escalate (no factor, no memory quantity, or a ceiling reached at once).
    Escalated quantities are whole bytes."""
    if retry is None or retry.memory_factor is None or res is None or not (
            res.memory_limit or res.memory_request):
        return []  # nothing to multiply: every attempt has the same memory
    factor = Decimal(str(retry.memory_factor))
    ceiling = parse_quantity(retry.memory_ceiling) if retry.memory_ceiling else None

    def series(quantity: str) -> list[int]:
        base = parse_quantity(quantity)
        top = None if ceiling is None else max(ceiling, base)
        value, out = base, []
        for _ in range(retry.limit + 1):
            capped = value if top is None else min(value, top)
            out.append(int(capped.to_integral_value(ROUND_CEILING)))
            value *= factor
        return out

    limits = series(res.memory_limit) if res.memory_limit else []
    requests = series(res.memory_request) if res.memory_request else []
    if limits and requests:
        requests = [min(a, b) for a, b in zip(requests, limits, strict=True)]
    levels: list[dict[str, Any]] = [resource_requirements(res)]
    for k in range(1, retry.limit + 1):
        if (limits[k:k + 1], requests[k:k + 1]) == (limits[k - 1:k], requests[k - 1:k]):
            break  # the ceiling is reached: later attempts run in the last task
        compute = resource_requirements(res)
        if limits:
            compute.setdefault("limits", {})["memory"] = str(limits[k])
        if requests:
            compute.setdefault("requests", {})["memory"] = str(requests[k])
        levels.append(compute)
    return levels if len(levels) > 1 else []


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
