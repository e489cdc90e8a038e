"""A producer writes a parameter artifact; the consumer receives it as an argument."""

import couler.argo as couler
from couler.argo_submitter import ArgoSubmitter


def producer():
    out = couler.create_parameter_artifact(path="/tmp/message.txt", is_global=True)
    return couler.run_container(
        image="alpine:3.20",
        command=["sh", "-c"],
        args=["echo -n hello world > %s" % out.path],
        output=out,
        step_name="produce",
    )


def consumer(message):
    return couler.run_container(
        image="alpine:3.20", command=["echo"], args=message, step_name="consume"
    )


couler.config_workflow(name="producer-consumer")
consumer(producer())

if __name__ == "__main__":
    couler.run(submitter=ArgoSubmitter())
