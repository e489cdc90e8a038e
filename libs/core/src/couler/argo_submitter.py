"""Submit workflows to Argo Workflows on Kubernetes.

``from couler.argo_submitter import ArgoSubmitter`` works without the
``kubernetes`` package; it is imported only when something is submitted.
This is the minimal adapter of the SDK: it creates the secrets and the
Workflow/CronWorkflow object and returns the created object. Watching and
cancelling come with the full engine adapter.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from couler import ir
from couler.api.handles import SecretMaterial
from couler.errors import ConflictError, RetryableError, UserError

__all__ = ["ArgoSubmitter"]

GROUP = "argoproj.io"
VERSION = "v1alpha1"

# The open-source SDK chose between a Python and a Go submission path with this variable;
# its programs and tests set it. Both values are accepted here and submit the same way:
# the Kubernetes API from Python (the SDK's Go path, a cgo library that also waited for the
# workflow to finish, is not provided). Another value is refused.
_SUBMITTER_IMPL_ENV_VAR_KEY = "SUBMITTER_IMPLEMENTATION"


class _SubmitterImplTypes:
    """The values of ``SUBMITTER_IMPLEMENTATION`` the open-source SDK knew."""

    GO = "Go"
    PYTHON = "Python"


def _check_implementation() -> None:
    chosen = os.environ.get(_SUBMITTER_IMPL_ENV_VAR_KEY, "")
    if chosen and chosen not in (_SubmitterImplTypes.GO, _SubmitterImplTypes.PYTHON):
        raise UserError(f"{_SUBMITTER_IMPL_ENV_VAR_KEY}={chosen!r}: expected "
                        f"{_SubmitterImplTypes.PYTHON!r} or {_SubmitterImplTypes.GO!r} "
                        "(both submit through the Kubernetes API)")


class ArgoSubmitter:
    """Creates Argo ``Workflow``/``CronWorkflow`` objects through the Kubernetes API.

    Args:
        namespace: Where workflows and their secrets are created.
        config_file: Kube config file; default: the usual lookup, then the
            in-cluster configuration.
        context: Kube config context.
        client_configuration: A ``kubernetes.client.Configuration`` to fill.
    """

    def __init__(self, namespace: str = "argo", config_file: str | None = None,
                 context: str | None = None, client_configuration: object = None) -> None:
        self.namespace = namespace
        self.config_file = config_file
        self.context = context
        self.client_configuration = client_configuration
        self._apis: tuple[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"ArgoSubmitter(namespace={self.namespace!r})"

    def submit(self, workflow_ir: ir.Workflow, secrets: Sequence[SecretMaterial] = (), *,
               cluster_config_file: str | None = None) -> Any:
        """Compile ``workflow_ir`` for Argo, create its secrets, then create the workflow.

        Secrets are created in this submitter's namespace (where the pods
        run), replacing an existing secret of the same name; dry-run and
        existing secrets are skipped.

        Args:
            workflow_ir: The validated workflow.
            secrets: Secret material from the builder (values never logged).
            cluster_config_file: Cluster hooks to apply to the Argo document.

        Returns:
            The created object, as the API server returned it.

        Raises:
            UserError: if the ``kubernetes`` package is missing or the API
                server rejects the request; ConflictError if the object exists.
            RetryableError: for server-side errors.
        """
        from couler.argo import compile_ir

        _check_implementation()
        doc = compile_ir(workflow_ir, cluster_config_file)
        custom, core = self._clients()
        for secret in secrets:
            if secret.should_create:
                self._create_secret(core, secret)
        plural = "cronworkflows" if doc.get("kind") == "CronWorkflow" else "workflows"
        try:
            return custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, plural,
                                                          doc)
        except self._api_exception() as e:
            raise _error(e, f"creating {doc.get('kind', 'Workflow')} of {workflow_ir.name!r}") \
                from e

    def delete(self, name: str, *, grace_period_seconds: int = 5,
               propagation_policy: str = "Background") -> Any:
        """Delete the Workflow object ``name`` in this submitter's namespace."""
        custom, _ = self._clients()
        try:
            return custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "workflows", name,
                grace_period_seconds=grace_period_seconds, propagation_policy=propagation_policy)
        except self._api_exception() as e:
            raise _error(e, f"deleting workflow {name!r}") from e

    # ------------------------------------------------------------------ internals

    def _create_secret(self, core: Any, secret: SecretMaterial) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret.name, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/managed-by": "couler"}},
            "type": "Opaque",
            "stringData": secret.reveal(),
        }
        try:
            core.create_namespaced_secret(self.namespace, body)
        except self._api_exception() as e:
            if getattr(e, "status", None) != 409:
                raise _error(e, f"creating secret {secret.name!r}") from None
            try:
                core.replace_namespaced_secret(secret.name, self.namespace, body)
            except self._api_exception() as e2:
                raise _error(e2, f"replacing secret {secret.name!r}") from None

    @staticmethod
    def _api_exception() -> type[Exception]:
        rest = _kubernetes("kubernetes.client.rest")
        exc: type[Exception] = rest.ApiException
        return exc

    def _clients(self) -> tuple[Any, Any]:
        if self._apis is not None:
            return self._apis
        client = _kubernetes("kubernetes.client")
        config = _kubernetes("kubernetes.config")
        try:
            config.load_kube_config(config_file=self.config_file, context=self.context,
                                    client_configuration=self.client_configuration)
        except (config.ConfigException, OSError, TypeError):
            try:
                config.load_incluster_config()
            except config.ConfigException as e:
                raise UserError("no Kubernetes configuration found: set KUBECONFIG, pass "
                                "config_file=, or run inside a cluster") from e
        self._apis = (client.CustomObjectsApi(), client.CoreV1Api())
        return self._apis


def _kubernetes(module: str) -> Any:
    """Import a module of the optional ``kubernetes`` package."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError("ArgoSubmitter needs the Kubernetes client: pip install kubernetes") from e


def _error(e: Exception, action: str) -> Exception:
    """Map a Kubernetes API error to Couler's hierarchy, without echoing request bodies."""
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", "") or type(e).__name__
    message = f"{action}: the Kubernetes API answered {status} {reason}"
    if status == 409:
        return ConflictError(message)
    if isinstance(status, int) and status >= 500:
        return RetryableError(message)
    return UserError(message)
