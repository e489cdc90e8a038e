"""The Argo Workflows adapter: submit, observe and cancel runs through the Kubernetes API.

See :mod:`couler_runtime.argo.adapter` for the state mapping and the pod-name rule.
"""

from .adapter import IDEMPOTENCY_KEY, ArgoAdapter, pod_name, run_status

__all__ = ["IDEMPOTENCY_KEY", "ArgoAdapter", "pod_name", "run_status"]
