"""``run()``: submit the current workflow (or record it, in capture mode)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from couler import ir
from couler.api.builder import (
    WorkflowBuilder,
    active_capture,
    current_builder,
    discard_implicit_builder,
)
from couler.errors import UserError

__all__ = ["CapturedRun", "default_submitter", "run", "run_builder", "set_default_submitter"]


class CapturedRun(Mapping[str, object]):
    """What :func:`run` returns while the command line captures a program (``couler
    compile``, ``couler run``, ``couler submit``): the workflow is recorded, not yet
    submitted, and programs written for the open-source SDK read the result as the object
    a submitter created (``wf["metadata"]["name"]``). It reads as that object's stub
    (``apiVersion``, ``kind``, ``metadata.name``); :attr:`workflow` is the recorded IR.
    """

    def __init__(self, workflow: ir.Workflow) -> None:
        self.workflow = workflow
        self._doc: dict[str, object] = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "CronWorkflow" if workflow.schedule is not None else "Workflow",
            "metadata": {"name": workflow.name},
        }

    def __getitem__(self, key: str) -> object:
        return self._doc[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._doc)

    def __len__(self) -> int:
        return len(self._doc)

    def __repr__(self) -> str:
        return f"CapturedRun(workflow={self.workflow.name!r})"

_default: list[object] = []  # the submitter run() uses when given none


def set_default_submitter(submitter: object) -> None:
    """The submitter :func:`run` uses when it is given none (``None`` clears it), as in the
    open-source SDK: ``couler.set_default_submitter(ArgoSubmitter(namespace="argo"))``.

    Raises:
        UserError: ``submitter`` has no ``submit(workflow, secrets)`` method (nor, for a
            class, its instances).
    """
    if submitter is not None and not callable(getattr(submitter, "submit", None)):
        raise UserError(f"set_default_submitter(): {submitter!r} has no "
                        "submit(workflow, secrets) method")
    _default[:] = [submitter] if submitter is not None else []


def default_submitter() -> object:
    """The submitter :func:`set_default_submitter` set, or None."""
    return _default[0] if _default else None


def run(submitter: object = None) -> object:
    """Submit the current workflow and, for the implicit workflow, start a fresh one.

    In capture mode (the CLI, :mod:`couler.api.capture`) the workflow is
    recorded instead of submitted. Otherwise ``submitter.submit(ir, secrets)``
    is called with the validated IR and the secret material to create (e.g.
    :class:`couler.argo_submitter.ArgoSubmitter`; a class is instantiated
    with no arguments).

    Args:
        submitter: The submitter; default: the one :func:`set_default_submitter` set.

    Returns:
        What the submitter returned (in capture mode: a :class:`CapturedRun`).

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
        return CapturedRun(session.record(builder))
    if submitter is None:
        submitter = default_submitter()
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
