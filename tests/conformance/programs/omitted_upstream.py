"""A step that was not run (Argo's Omitted) is neither failed nor completed (semantics rule
S2, docs/semantics.md): after a failed ``train``, ``evaluate`` is not run, its ``.Failed``
and completed-edge handlers are not run either, and only an any-outcome edge runs."""
from couler import ir

F = ir.EdgeCondition


def _sh(name: str, script: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="alpine:3.20", command=("sh", "-c", script))
    return ir.Step(name=name, body=body, **kw)  # type: ignore[arg-type]


def workflow() -> ir.Workflow:
    return ir.Workflow(
        name="conf-omitted-upstream",
        steps=(
            _sh("train", "exit 1"),
            _sh("evaluate", "echo evaluate", dependencies=(ir.Dependency("train"),)),
            _sh("on-eval-failure", "echo handler",
                dependencies=(ir.Dependency("evaluate", F.FAILED),)),
            _sh("after-eval", "echo completed",
                dependencies=(ir.Dependency("evaluate", F.COMPLETED),)),
            _sh("always", "echo always", dependencies=(ir.Dependency("evaluate", F.ANY),)),
        ),
    )
