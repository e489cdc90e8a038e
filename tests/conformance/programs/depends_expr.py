"""A depends expression: run when one upstream succeeded or the other did not fail."""
from couler import ir

F = ir.EdgeCondition


def _sh(name: str, script: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="alpine:3.20", command=("sh", "-c", f"{script} > /tmp/out.txt"))
    outputs = (ir.OutputParameter("out", ir.OutputSource.PATH, "/tmp/out.txt"),)
    return ir.Step(name=name, body=body, outputs=outputs, **kw)  # type: ignore[arg-type]


def workflow() -> ir.Workflow:
    return ir.Workflow(
        name="conf-depends-expr",
        steps=(
            _sh("ok", "echo ok"),
            _sh("also-ok", "echo also-ok"),
            _sh("either", "echo either",
                dependencies=(ir.Dependency("ok"), ir.Dependency("also-ok")),
                depends=ir.DependsAny((
                    ir.DependsTerm("ok", F.SUCCEEDED),
                    ir.DependsNot(ir.DependsTerm("also-ok", F.FAILED)),
                ))),
        ),
    )
