"""Couler's exception hierarchy.

::

    CoulerError
    ├── UserError                 the caller can fix it; retrying will not help
    │   ├── InvalidWorkflowError  the workflow (or a program building it) is wrong
    │   │   └── ValidationError   IR validation found problems (all of them, in .issues)
    │   ├── UnsupportedFeatureError  an engine cannot express a feature a step uses
    │   ├── NotFoundError
    │   └── ConflictError
    └── RetryableError            infrastructure trouble; the same call may succeed later
        └── OperationTimeoutError

Every message names the workflow, and the step and field where there is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class CoulerError(Exception):
    """Base of every error Couler raises on purpose."""


class UserError(CoulerError):
    """An error the caller must fix; retrying the same call will not help."""


class InvalidWorkflowError(UserError):
    """The workflow, or the program that builds it, is invalid."""


@dataclass(frozen=True)
class Issue:
    """One problem found in a workflow, located by step and field."""

    workflow: str
    step: str  # empty for workflow-level problems
    field: str
    message: str

    def __str__(self) -> str:
        where = f"workflow {self.workflow!r}"
        if self.step:
            where += f", step {self.step!r}"
        if self.field:
            where += f", field {self.field!r}"
        return f"{where}: {self.message}"


class ValidationError(InvalidWorkflowError):
    """Validation found one or more problems; ``issues`` lists them all."""

    def __init__(self, issues: Sequence[Issue]) -> None:
        self.issues = tuple(issues)
        lines = [str(i) for i in self.issues]
        head = f"{len(lines)} problem{'s' if len(lines) != 1 else ''} found"
        super().__init__(head + ":\n  " + "\n  ".join(lines))


class UnsupportedFeatureError(UserError):
    """An engine cannot express a feature that a step uses."""

    def __init__(
        self, engine: str, workflow: str, step: str, feature: str, detail: str = ""
    ) -> None:
        self.engine, self.workflow, self.step, self.feature = engine, workflow, step, feature
        where = f"workflow {workflow!r}" + (f", step {step!r}" if step else "")
        msg = f"{where}: engine {engine!r} does not support {feature}"
        super().__init__(msg + (f" ({detail})" if detail else ""))


class InsufficientResourcesError(UserError):
    """A step asks for more of a resource than the engine's machine has (the local engine:
    GPUs); the workflow is refused before it starts."""

    def __init__(self, engine: str, workflow: str, step: str, *, resource: str,
                 requested: int, available: int, hint: str = "") -> None:
        self.engine, self.workflow, self.step = engine, workflow, step
        self.resource, self.requested, self.available = resource, requested, available
        msg = (f"workflow {workflow!r}, step {step!r}: requests {requested} {resource}; "
               f"engine {engine!r} has {available or 'none'} on this machine")
        super().__init__(msg + (f" ({hint})" if hint else ""))


class DocumentTooLargeError(UserError):
    """An engine refused a workflow's document for its size (Kubernetes: 413, or etcd's
    "request is too large"; an Airflow DAG import timeout; a KFP spec limit).

    ``size_bytes`` is the size of the refused document in the unit of the optimizer's split
    budget (:func:`couler.optimize.passes.document_size`: compact JSON for a Kubernetes
    object -- what the API server stores --, the file's bytes for an Airflow DAG);
    ``sent_bytes`` the size of the request body the engine refused, when known (the
    Kubernetes client sends JSON with spaces after separators).
    """

    def __init__(self, engine: str, workflow: str, size_bytes: int, detail: str, *,
                 sent_bytes: int | None = None) -> None:
        self.engine, self.workflow, self.size_bytes = engine, workflow, size_bytes
        self.detail, self.sent_bytes = detail, sent_bytes
        sent = f", {sent_bytes} bytes as sent" if sent_bytes is not None else ""
        super().__init__(f"workflow {workflow!r}: engine {engine!r} refused its "
                         f"{size_bytes}-byte document{sent} as too large: {detail}")


class NotFoundError(UserError):
    """A named thing does not exist."""


class ConflictError(UserError):
    """The request conflicts with the current state."""


class RetryableError(CoulerError):
    """Infrastructure trouble; the same call may succeed later."""


class OperationTimeoutError(RetryableError):
    """An operation did not finish in time."""
