import couler.argo as couler


def producer():
    place = couler.create_parameter_artifact(path="/tmp/hello.txt")
    return couler.run_container(
        image="alpine:3.20",
        command=["sh", "-c"],
        args=["echo -n hello world > /tmp/hello.txt"],
        output=place,
    )


def consumer(inputs):
    return couler.run_container(image="alpine:3.20", command=["cat"], args=inputs)


couler.config_workflow(name="producer-consumer")
consumer(producer())
