"""Couler: describe an ML workflow once and run it on the engine you use.

``import couler.argo as couler`` gives the API of the open-source Couler SDK;
:mod:`couler.ir` is the engine-neutral workflow IR underneath it.
"""

__version__ = "0.2.0"

# As in the open-source SDK, ``import couler; couler.run_container(...)`` works too.
from couler import argo
from couler.argo import *  # noqa: F403

__all__ = ["__version__"]
__all__ += argo.__all__
