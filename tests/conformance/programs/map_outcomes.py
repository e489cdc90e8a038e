"""``AnySucceeded`` / ``AllFailed`` count a map step's items (semantics rule S4,
docs/semantics.md): one item of ``mixed`` succeeds, so ``salvage`` runs and
``give-up`` does not."""
from couler import ir

F = ir.EdgeCondition


def _sh(name: str, script: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="alpine:3.20", command=("sh", "-c", script))
    return ir.Step(name=name, body=body, **kw)  # type: ignore[arg-type]


def workflow() -> ir.Workflow:
    return ir.Workflow(
        name="conf-map-outcomes",
        steps=(
            _sh("mixed", "exit {{inputs.code}}",
                inputs=(ir.InputParameter("code", ir.ItemRef()),),
                foreach=ir.ForEach(items=(ir.Literal.of(0), ir.Literal.of(1)))),
            _sh("salvage", "echo salvage", dependencies=(ir.Dependency("mixed", F.ANY_SUCCEEDED),)),
            _sh("give-up", "echo give-up", dependencies=(ir.Dependency("mixed", F.ALL_FAILED),)),
        ),
    )
