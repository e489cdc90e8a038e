"""Compilers: pure functions from the engine-neutral IR to an engine's document.

Each compiler module takes a :class:`couler.ir.Workflow`, validates it (unless
told not to) and returns the engine's document as plain data, with no network
I/O: :mod:`couler.compilers.argo` builds an Argo ``Workflow`` or
``CronWorkflow``. Features an engine cannot express raise
:class:`couler.errors.UnsupportedFeatureError`.
"""
