"""``A.Succeeded`` needs A to have run and succeeded; a bare ``A`` also accepts A skipped by
its own ``when`` (semantics rules S1 and S3, docs/semantics.md).

``ship`` is skipped by its when: ``notify`` (bare edge) runs, ``audit``
(``ship.Succeeded``) is not run, and ``archive`` after ``audit`` is not run either.
"""
from couler import ir

F = ir.EdgeCondition


def _sh(name: str, script: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="alpine:3.20", command=("sh", "-c", f"{script} > /tmp/out.txt"))
    outputs = (ir.OutputParameter("out", ir.OutputSource.PATH, "/tmp/out.txt"),)
    return ir.Step(name=name, body=body, outputs=outputs, **kw)  # type: ignore[arg-type]


def workflow() -> ir.Workflow:
    yes = ir.Condition(ir.StepOutputRef("check", "out"), ir.CompareOp.EQ, ir.Literal.of("yes"))
    return ir.Workflow(
        name="conf-strict-succeeded",
        steps=(
            _sh("check", "echo no"),
            _sh("ship", "echo shipped", dependencies=(ir.Dependency("check"),),
                when=ir.When(yes)),
            _sh("notify", "echo notified", dependencies=(ir.Dependency("ship"),)),
            _sh("audit", "echo audited", dependencies=(ir.Dependency("ship", F.SUCCEEDED_ONLY),)),
            _sh("archive", "echo archived", dependencies=(ir.Dependency("audit"),)),
        ),
    )
