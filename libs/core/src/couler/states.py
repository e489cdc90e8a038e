"""``couler.states`` of the open-source SDK, for the calls its programs make on it.

That SDK kept the workflow being built in module globals and had no public function for
the pods' security context: programs call ``couler.states.workflow.set_security_context
({...})``. Here the workflow being built is the current builder; :data:`workflow` passes
the calls the SDK's programs make to it. Nothing else of the SDK's global state exists.
"""

from __future__ import annotations

from collections.abc import Mapping

from couler import ir
from couler.api.builder import current_builder
from couler.api.config import set_security_context

__all__ = ["workflow"]


class _CurrentWorkflow:
    """The workflow being built (``couler.states.workflow``)."""

    @property
    def name(self) -> str:
        """The workflow's name (as ``config_workflow`` set it, or the default)."""
        return current_builder().workflow_name()

    def set_security_context(self, security_context: Mapping[str, object]
                             | ir.SecurityContext) -> None:
        """:func:`couler.set_security_context`."""
        set_security_context(security_context)

    def __repr__(self) -> str:  # without creating a workflow to name
        return "<couler.states.workflow: the workflow being built>"


workflow = _CurrentWorkflow()
