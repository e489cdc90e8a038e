"""The Kubeflow Pipelines adapter: submit, observe and cancel runs through the KFP API server.

See :mod:`couler_runtime.kfp.adapter` for the state mapping, idempotency and logs. The kfp
SDK is imported lazily (it lives in ``.venv-kfp``), so this package imports without it.
"""

from .adapter import IDEMPOTENCY_PREFIX, KfpAdapter, run_status

__all__ = ["IDEMPOTENCY_PREFIX", "KfpAdapter", "run_status"]
