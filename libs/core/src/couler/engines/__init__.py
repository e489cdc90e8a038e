"""Engines: one pure compiler per engine (IR -> engine document), each declaring what it can do.

:mod:`couler.engines.base` holds the shared vocabulary: the IR features an engine
may support (:class:`Feature`), how (:class:`Support`), its documented limits
(:class:`Limit`), the scan of which features a workflow uses, the capability check
that fails with an error naming the step and the feature, and the normalized run and
step states every engine adapter reports.
"""
