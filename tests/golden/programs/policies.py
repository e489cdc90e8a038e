import couler.argo as couler
from couler import ir

couler.config_workflow(name="policies", timeout=3600, time_to_clean=600)
couler.run_container(
    image="python:3.12-slim",
    command=["python", "-m", "train"],
    step_name="train",
    timeout=1800,
    retry=ir.RetryPolicy(
        limit=4,
        backoff=ir.Backoff(base_seconds=10, factor=2, cap_seconds=300),
        on=(ir.FailureClass.TRANSIENT, ir.FailureClass.OOM),
        memory_factor=2.0,
        memory_ceiling="16Gi",
    ),
    resources={"cpu": "1", "memory": "2Gi"},
    cache=couler.Cache(name="train-cache", key="train-v1", max_age="1h"),
    node_selector={"pool": "gpu"},
)
