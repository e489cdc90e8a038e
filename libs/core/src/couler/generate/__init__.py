"""Natural language → IR: the step catalog, the offline planner, and the LLM spec format.

:func:`plan` is the deterministic offline planner; :func:`parse_spec` and
:func:`assemble` turn an LLM's JSON answer into IR (never executing it); see
:mod:`couler.generate.llm` for the prompt and the repair loop.
"""

from couler.generate.catalog import CATALOG, MODELS, CatalogEntry
from couler.generate.llm import generate_with_llm, system_prompt
from couler.generate.planner import GenerationReport, plan
from couler.generate.spec import SPEC_SCHEMA, StepSpec, WorkflowSpec, assemble, parse_spec

__all__ = [
    "CATALOG",
    "MODELS",
    "SPEC_SCHEMA",
    "CatalogEntry",
    "GenerationReport",
    "StepSpec",
    "WorkflowSpec",
    "assemble",
    "generate_with_llm",
    "parse_spec",
    "plan",
    "system_prompt",
]
