"""The open-source Couler SDK's module: ``import couler.argo as couler``.

Re-exports the whole API of :mod:`couler.api` and adds the Argo-specific
:func:`workflow_yaml` (the Argo document as a dict, compiled from the IR by
:mod:`couler.compilers.argo`) and :func:`delete`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from couler import ir, states
from couler.api import *  # noqa: F403 - this module's purpose is to re-export the API
from couler.api import __all__ as _api_all
from couler.api.builder import WorkflowBuilder, current_builder
from couler.errors import UserError

__all__ = list(_api_all)
__all__ += ["apply_cluster_config", "compile_ir", "delete", "states", "workflow_yaml"]


def workflow_yaml() -> dict[str, Any]:
    """The current workflow as an Argo ``Workflow``/``CronWorkflow`` document (a dict).

    Cluster-config hooks set with ``config_workflow(cluster_config_file=...)``
    are applied. The workflow is not reset (``run()`` does that).

    Raises:
        couler.errors.ValidationError: if the workflow is invalid.
        UserError: if the Argo compiler is not available.
    """
    return compile_builder(current_builder())


def compile_builder(builder: WorkflowBuilder) -> dict[str, Any]:
    """The Argo document of ``builder``'s workflow, with its cluster hooks applied."""
    return compile_ir(builder.to_ir(), builder.config.cluster_config_file)


def compile_ir(workflow: ir.Workflow, cluster_config_file: str | None = None) -> dict[str, Any]:
    """Compile IR to an Argo document and apply the cluster-config hooks, if any."""
    try:
        from couler.compilers.argo import compile_workflow
    except ImportError as e:
        if e.name is not None and not e.name.startswith("couler.compilers"):
            raise
        raise UserError("the Argo compiler (couler.compilers.argo) is not available") from e
    doc: dict[str, Any] = compile_workflow(workflow)
    if cluster_config_file:
        apply_cluster_config(doc, cluster_config_file)
    return doc


def apply_cluster_config(doc: dict[str, Any], path: str) -> None:
    """Apply a cluster-config file's hooks to an Argo document, in place.

    The file defines ``cluster`` with ``config_pod(template)``, called for
    every container, script and resource template (it may change the dict in
    place or return a replacement), and optionally ``config_workflow(spec)``,
    called with the workflow spec.

    Raises:
        UserError: if the file cannot be loaded or defines no ``cluster``.
    """
    module_spec = importlib.util.spec_from_file_location("couler_cluster_config", path)
    if module_spec is None or module_spec.loader is None:
        raise UserError(f"cluster_config_file {path!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except (OSError, SyntaxError) as e:
        raise UserError(f"cluster_config_file {path!r} cannot be loaded: {e}") from e
    cluster = getattr(module, "cluster", None)
    if cluster is None:
        raise UserError(f"cluster_config_file {path!r} defines no 'cluster' object")
    spec = doc.get("spec", {})
    if doc.get("kind") == "CronWorkflow":
        spec = spec.get("workflowSpec", {})
    config_pod: Callable[[dict[str, Any]], object] | None = getattr(cluster, "config_pod", None)
    if callable(config_pod):
        templates = spec.get("templates", [])
        for i, template in enumerate(templates):
            if any(k in template for k in ("container", "script", "resource")):
                replaced = config_pod(template)
                if isinstance(replaced, dict):
                    templates[i] = replaced
    config_wf: Callable[[dict[str, Any]], object] | None = getattr(cluster, "config_workflow", None)
    if callable(config_wf):
        config_wf(spec)


def delete(  # noqa: PLR0917 - the SDK's positional signature
    name: str,
    namespace: str = "default",
    config_file: str | None = None,
    context: str | None = None,
    client_configuration: object = None,
    persist_config: bool = True,
    grace_period_seconds: int = 5,
    propagation_policy: str = "Background",
) -> object:
    """Delete a submitted Argo Workflow by name (needs the ``kubernetes`` package).

    Args:
        name: The Workflow object's name.
        namespace: Its namespace.
        config_file: Kube config file; default: the usual lookup, then in-cluster.
        context: Kube config context.
        client_configuration: A ``kubernetes.client.Configuration`` to fill.
        persist_config: Accepted for compatibility.
        grace_period_seconds: Passed to the API server.
        propagation_policy: Passed to the API server.

    Returns:
        The API server's response.
    """
    from couler.argo_submitter import ArgoSubmitter

    submitter = ArgoSubmitter(namespace=namespace, config_file=config_file, context=context,
                              client_configuration=client_configuration)
    return submitter.delete(name, grace_period_seconds=grace_period_seconds,
                            propagation_policy=propagation_policy)
