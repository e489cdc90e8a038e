"""``couler.core.templates.toleration`` of the open-source SDK."""

from couler.api import Toleration

__all__ = ["Toleration"]
