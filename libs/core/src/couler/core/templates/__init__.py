"""``couler.core.templates`` of the open-source SDK: the classes its programs import."""

from couler.api import Toleration, Volume, VolumeClaimTemplate, VolumeMount

__all__ = ["Toleration", "Volume", "VolumeClaimTemplate", "VolumeMount"]
