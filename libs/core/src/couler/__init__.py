"""Couler: describe an ML workflow once and run it on the engine you use.

``import couler.argo as couler`` gives the API of the open-source Couler SDK;
:mod:`couler.ir` is the engine-neutral workflow IR underneath it.
"""

__version__ = "0.2.0"
