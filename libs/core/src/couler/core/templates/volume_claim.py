"""``couler.core.templates.volume_claim`` of the open-source SDK."""

from couler.api import VolumeClaimTemplate

__all__ = ["VolumeClaimTemplate"]
