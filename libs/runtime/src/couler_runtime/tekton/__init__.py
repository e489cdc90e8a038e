"""The Tekton Pipelines adapter: submit, observe and cancel runs through the Kubernetes API.

See :mod:`couler_runtime.tekton.adapter` for the state mapping and how steps are named.
"""

from .adapter import IDEMPOTENCY_KEY, TektonAdapter, run_status

__all__ = ["IDEMPOTENCY_KEY", "TektonAdapter", "run_status"]
