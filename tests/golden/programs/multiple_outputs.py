import couler.argo as couler


def producer():
    a = couler.create_parameter_artifact(path="/tmp/a.txt")
    b = couler.create_parameter_artifact(path="/tmp/b.txt")
    return couler.run_container(
        image="alpine:3.20",
        command=["sh", "-c", "echo -n x > /tmp/a.txt; echo -n y > /tmp/b.txt"],
        output=[a, b],
    )


def consumer(inputs):
    return couler.run_container(image="alpine:3.20", command=["echo"], args=inputs)


couler.config_workflow(name="multiple-outputs")
consumer(producer())
