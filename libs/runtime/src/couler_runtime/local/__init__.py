"""The local engine: runs Couler workflows as processes on this machine.

See :mod:`couler_runtime.local.engine` for the execution rules and
:mod:`couler_runtime.local.artifacts` for how container paths map to host paths.
"""

from .capabilities import CAPABILITIES, ENGINE
from .engine import LocalEngine, LocalRun
from .reuse import Reuse

__all__ = ["CAPABILITIES", "ENGINE", "LocalEngine", "LocalRun", "Reuse"]
