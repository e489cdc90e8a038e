"""The Ray executor: runs Couler workflows as Ray tasks, one task per step execution.

See :mod:`couler_runtime.ray.executor`. Importing this package does not import
Ray; :class:`RayExecutor` imports it when it runs.
"""

from .capabilities import CAPABILITIES, ENGINE, LIMITS
from .executor import RayExecutor, RayRun

__all__ = ["CAPABILITIES", "ENGINE", "LIMITS", "RayExecutor", "RayRun"]
