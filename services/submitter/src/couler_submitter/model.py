"""The submitter's own value types (the rest are :mod:`couler_runtime.rpc.records`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from couler import ir
from couler_runtime.rpc.records import Objective

__all__ = ["DEFAULT_ENGINE", "RunOptions", "RunRequest"]

DEFAULT_ENGINE = "local"


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How a run was asked to run (``couler.v1.RunOptions``)."""

    engine: str = DEFAULT_ENGINE
    parameters: Mapping[str, str] = field(default_factory=dict)
    dry_run: bool = False
    no_cache: bool = False
    constraints: tuple[str, ...] = ()
    objectives: tuple[Objective, ...] = ()
    tenant: str = ""

    def to_json(self) -> dict[str, object]:
        """A JSON-able dict (as stored in the runs table)."""
        return {"engine": self.engine, "parameters": dict(self.parameters),
                "dry_run": self.dry_run, "no_cache": self.no_cache,
                "constraints": list(self.constraints),
                "objectives": [o.value for o in self.objectives], "tenant": self.tenant}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RunOptions:
        """The inverse of :meth:`to_json`."""
        params = data.get("parameters")
        params = params if isinstance(params, dict) else {}
        constraints = data.get("constraints")
        constraints = constraints if isinstance(constraints, list) else []
        objectives = data.get("objectives")
        objectives = objectives if isinstance(objectives, list) else []
        return cls(engine=str(data.get("engine") or DEFAULT_ENGINE),
                   parameters={str(k): str(v) for k, v in params.items()},
                   dry_run=bool(data.get("dry_run")), no_cache=bool(data.get("no_cache")),
                   constraints=tuple(str(c) for c in constraints),
                   objectives=tuple(Objective(str(o)) for o in objectives),
                   tenant=str(data.get("tenant") or ""))


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What a run was submitted with: a workflow or a text (a template becomes a workflow).

    ``encoded`` is the workflow's ``couler.v1.Workflow`` encoding when it is at hand (as
    submitted): what is published need not encode the workflow again.
    """

    workflow: ir.Workflow | None
    text: str | None
    options: RunOptions
    template: str = ""
    encoded: bytes | None = field(default=None, compare=False, repr=False)
