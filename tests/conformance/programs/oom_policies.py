"""Retry by failure class with memory escalation on OOM, under a memory limit."""
import couler.argo as couler
from couler import ir

couler.config_workflow(name="conf-oom-policies")
couler.run_container(
    image="python:3.12-alpine",
    command=["python3", "-c", "print('trained')"],
    step_name="train",
    resources={"cpu": "1", "memory": "1Gi"},
    retry=ir.RetryPolicy(
        limit=2,
        on=(ir.FailureClass.TRANSIENT, ir.FailureClass.OOM),
        memory_factor=2.0,
        memory_ceiling="4Gi",
    ),
)
