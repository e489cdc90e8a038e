"""Edge conditions: steps that run when an upstream failed, or whatever its outcome."""
from couler import ir

F = ir.EdgeCondition


def _sh(name: str, script: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="alpine:3.20", command=("sh", "-c", f"{script} > /tmp/out.txt"))
    outputs = (ir.OutputParameter("out", ir.OutputSource.PATH, "/tmp/out.txt"),)
    return ir.Step(name=name, body=body, outputs=outputs, **kw)  # type: ignore[arg-type]


def workflow() -> ir.Workflow:
    return ir.Workflow(
        name="conf-edge-conditions",
        steps=(
            _sh("ok", "echo ok"),
            _sh("broken", "echo broken; exit 1"),
            _sh("on-failure", "echo recovering",
                dependencies=(ir.Dependency("broken", F.FAILED),)),
            _sh("always", "echo always",
                dependencies=(ir.Dependency("broken", F.ANY),)),
        ),
    )
