"""A step priority."""
import couler.argo as couler

couler.config_workflow(name="conf-priority")
couler.run_container(
    image="alpine:3.20",
    command=["sh", "-c", "echo urgent > /tmp/p.txt"],
    output=couler.create_parameter_artifact(path="/tmp/p.txt", name="said"),
    step_name="urgent",
    priority=5,
)
