"""Edges some engines read differently (docs/semantics.md, exceptions E2 and E4).

``fan`` (a map) needs ``gate`` to have run and succeeded; ``gate`` is skipped by its when,
so ``fan`` is not run, and neither is ``after-fan`` (rule S2). ``on-error`` waits for a
platform error of ``broken``, whose command merely fails, so it is not run (rule S4).
"""
from couler import ir

F = ir.EdgeCondition


def _sh(name: str, script: str, **kw: object) -> ir.Step:
    body = ir.ContainerSpec(image="alpine:3.20", command=("sh", "-c", script))
    return ir.Step(name=name, body=body, **kw)  # type: ignore[arg-type]


def workflow() -> ir.Workflow:
    never = ir.Condition(ir.Literal.of("a"), ir.CompareOp.EQ, ir.Literal.of("b"))
    return ir.Workflow(
        name="conf-unusual-edges",
        steps=(
            _sh("gate", "echo gate", when=ir.When(never)),
            _sh("fan", "echo {{inputs.n}}", inputs=(ir.InputParameter("n", ir.ItemRef()),),
                foreach=ir.ForEach(items=(ir.Literal.of(1), ir.Literal.of(2))),
                dependencies=(ir.Dependency("gate", F.SUCCEEDED_ONLY),)),
            _sh("after-fan", "echo after", dependencies=(ir.Dependency("fan"),)),
            _sh("broken", "exit 1"),
            _sh("on-error", "echo platform error",
                dependencies=(ir.Dependency("broken", F.ERRORED),)),
        ),
    )
