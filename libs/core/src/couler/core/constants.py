"""``couler.core.constants`` of the open-source SDK: the constants its programs import."""

from couler.api import ImagePullPolicy, WFStatus

__all__ = ["ImagePullPolicy", "WFStatus"]
