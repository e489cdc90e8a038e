"""Placement: a node selector, a toleration and a shared workflow volume."""
import couler.argo as couler

couler.config_workflow(name="conf-placement")
couler.create_workflow_volume(couler.VolumeClaimTemplate("workdir"))
couler.add_toleration(couler.Toleration(key="dedicated", operator="Equal", value="ml",
                                        effect="NoSchedule"))
couler.run_container(
    image="alpine:3.20",
    command=["sh", "-c", "echo shared > /mnt/work/data.txt && cp /mnt/work/data.txt /tmp/w.txt"],
    output=couler.create_parameter_artifact(path="/tmp/w.txt", name="written"),
    step_name="write",
    node_selector={"pool": "cpu"},
    volume_mounts=[couler.VolumeMount("workdir", "/mnt/work")],
)
