"""Which engines exist and what each can do: the one registry the services and tools use.

:data:`CAPABILITY_MODULES` maps an engine's name to the module holding its
``CAPABILITIES`` and ``LIMITS`` (compilers in core, executors in the runtime),
imported on first use. ``dryrun`` is the submitter's engine that records every step
succeeded without running anything: it accepts every feature.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from couler import ir
from couler.engines.base import Capability, Feature, check_capabilities
from couler.errors import UserError

__all__ = ["CAPABILITY_MODULES", "DEFAULT_ENGINE", "DRY_RUN_ENGINE", "ENGINES",
           "capabilities_of", "check_engine", "engine_name"]

DEFAULT_ENGINE = "local"
DRY_RUN_ENGINE = "dryrun"

# Engine name -> the module with its CAPABILITIES and LIMITS (one line per engine).
CAPABILITY_MODULES: Mapping[str, str] = {
    "argo": "couler.compilers.argo_capabilities",
    "tekton": "couler.compilers.tekton",
    "kfp": "couler.compilers.kfp",
    "airflow": "couler.compilers.airflow",
    "local": "couler_runtime.local.capabilities",
    "ray": "couler_runtime.ray.capabilities",
}
ENGINES: tuple[str, ...] = (*CAPABILITY_MODULES, DRY_RUN_ENGINE)


def engine_name(engine: str, *, workflow: str = "") -> str:
    """The canonical name of ``engine`` ("" → local); UserError naming the known ones."""
    name = engine.strip().lower() or DEFAULT_ENGINE
    if name not in ENGINES:
        where = f"workflow {workflow!r}: " if workflow else ""
        raise UserError(f"{where}unknown engine {engine!r} (known: {', '.join(sorted(ENGINES))})")
    return name


def capabilities_of(engine: str) -> Mapping[Feature, Capability] | None:
    """The engine's capability matrix; None for the dry-run engine (everything goes)."""
    name = engine_name(engine)
    if name == DRY_RUN_ENGINE:
        return None
    caps: Mapping[Feature, Capability] = importlib.import_module(
        CAPABILITY_MODULES[name]).CAPABILITIES
    return caps


def check_engine(engine: str, wf: ir.Workflow) -> str:
    """Check ``wf`` against the engine's capabilities and return the engine's name.

    Raises UserError for an unknown engine and UnsupportedFeatureError naming the step
    and the feature.
    """
    name = engine_name(engine, workflow=wf.name)
    caps = capabilities_of(name)
    if caps is not None:
        check_capabilities(name, caps, wf)
    return name
