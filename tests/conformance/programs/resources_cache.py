"""CPU / memory resources and a cache policy."""
import couler.argo as couler

couler.config_workflow(name="conf-resources-cache")
couler.run_container(
    image="alpine:3.20",
    command=["sh", "-c", "echo computed > /tmp/r.txt"],
    output=couler.create_parameter_artifact(path="/tmp/r.txt", name="computed"),
    step_name="compute",
    resources={"cpu": "500m", "memory": "256Mi"},
    cache=couler.Cache(name="compute-cache", key="compute-v1", max_age="1h"),
)
