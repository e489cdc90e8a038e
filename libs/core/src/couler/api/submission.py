"""``run()``: submit the current workflow (or record it, in capture mode)."""

from __future__ import annotations

from couler.api.builder import (
    WorkflowBuilder,
    active_capture,
    current_builder,
    discard_implicit_builder,
)
from couler.errors import UserError

__all__ = ["run", "run_builder"]


def run(submitter: object = None) -> object:
    """Submit the current workflow and, for the implicit workflow, start a fresh one.

    In capture mode (the CLI, :mod:`couler.api.capture`) the workflow is
    recorded instead of submitted. Otherwise ``submitter.submit(ir, secrets)``
    is called with the validated IR and the secret material to create (e.g.
    :class:`couler.argo_submitter.ArgoSubmitter`; a class is instantiated
    with no arguments).

    Args:
        submitter: The submitter.

    Returns:
        What the submitter returned (in capture mode: the recorded IR).

    Raises:
        UserError: without a submitter outside capture mode.
        couler.errors.ValidationError: if the workflow is invalid.
    """
    builder = current_builder()
    try:
        return run_builder(builder, submitter)
    finally:
        if builder.implicit:
            discard_implicit_builder()


def run_builder(builder: WorkflowBuilder, submitter: object) -> object:
    """Submit (or, in capture mode, record) ``builder``'s workflow."""
    session = active_capture()
    if session is not None:
        return session.record(builder)
    if submitter is None:
        raise UserError(
            f"workflow {builder.workflow_name()!r}: run() needs a submitter, e.g. "
            "couler.run(submitter=ArgoSubmitter()) with "
            "'from couler.argo_submitter import ArgoSubmitter'")
    if isinstance(submitter, type):
        submitter = submitter()
    submit = getattr(submitter, "submit", None)
    if not callable(submit):
        raise UserError(f"run(): {submitter!r} has no submit(workflow, secrets) method")
    workflow = builder.to_ir()
    secrets = builder.secret_material()
    if builder.config.cluster_config_file:
        return submit(workflow, secrets, cluster_config_file=builder.config.cluster_config_file)
    return submit(workflow, secrets)
