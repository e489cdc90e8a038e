"""The optimizer's passes (pure: IR in, IR and reports out) and the cache key.

See :mod:`couler.optimize.passes` for the pipeline, :mod:`couler.optimize.split`
for splitting a workflow to an engine's limits, and :mod:`couler.optimize.cache_key`
for content-addressed step keys.
"""

from couler.optimize.cache_key import cache_policy, not_cacheable_reason, step_cache_key
from couler.optimize.passes import (
    DEFAULT_RETRY,
    CachedStep,
    PassReport,
    Plan,
    Recommendation,
    apply_recommendations,
    compile_document,
    default_retry,
    document_size,
    optimize,
    prune_cached,
)
from couler.optimize.split import (
    Budget,
    Chunk,
    budget_for,
    handoff_parameter,
    learned_limit,
    split_workflow,
)

__all__ = [
    "DEFAULT_RETRY",
    "Budget",
    "CachedStep",
    "Chunk",
    "PassReport",
    "Plan",
    "Recommendation",
    "apply_recommendations",
    "budget_for",
    "cache_policy",
    "compile_document",
    "default_retry",
    "document_size",
    "handoff_parameter",
    "learned_limit",
    "not_cacheable_reason",
    "optimize",
    "prune_cached",
    "split_workflow",
    "step_cache_key",
]
