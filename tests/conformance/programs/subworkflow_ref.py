"""A step that runs another workflow by reference (what splitting produces); IR only."""
from couler import ir


def workflow() -> ir.Workflow:
    return ir.Workflow(
        name="conf-subworkflow-ref",
        steps=(
            ir.Step(name="prepare",
                    body=ir.ContainerSpec(image="alpine:3.20", command=("echo", "prepare"))),
            ir.Step(name="child", body=ir.SubWorkflowSpec(name="conf-basic-steps"),
                    dependencies=(ir.Dependency("prepare"),)),
        ),
    )
