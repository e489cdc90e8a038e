"""``couler.core.templates.volume`` of the open-source SDK."""

from couler.api import Volume, VolumeMount

__all__ = ["Volume", "VolumeMount"]
