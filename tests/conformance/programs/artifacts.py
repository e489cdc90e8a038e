"""A file artifact written by one step and read by the next."""
import couler.argo as couler


def producer():
    out = couler.create_local_artifact(path="/tmp/report.txt", name="report")
    return couler.run_container(
        image="alpine:3.20",
        command=["sh", "-c", "echo artifact-payload > /tmp/report.txt"],
        output=out,
        step_name="producer",
    )


def consumer(report):
    seen = couler.create_parameter_artifact(path="/tmp/seen.txt", name="seen")
    return couler.run_container(image="alpine:3.20",
                                command=["sh", "-c", "cat /tmp/report.txt > /tmp/seen.txt"],
                                input=report, output=seen, step_name="consumer")


couler.config_workflow(name="conf-artifacts")
consumer(producer())
