"""Natural language → IR: the parser, the template catalog, the planner and the LLM path.

:func:`couler.generate.planner.plan` is the deterministic offline planner;
:func:`couler.generate.spec.parse_spec` and :func:`couler.generate.spec.assemble` turn an
LLM's JSON answer into IR (never executing it); :mod:`couler.generate.llm` holds the
prompt and the repair loop.
"""
