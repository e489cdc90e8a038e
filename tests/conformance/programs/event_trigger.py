"""A workflow started by an event (no Python API for triggers yet; IR only)."""
from couler import ir


def workflow() -> ir.Workflow:
    return ir.Workflow(
        name="conf-event-trigger",
        steps=(ir.Step(name="react",
                       body=ir.ContainerSpec(image="alpine:3.20", command=("echo", "event"))),),
        triggers=(ir.EventTrigger(subject="datasets.ready", filter="body.size > 0"),),
    )
