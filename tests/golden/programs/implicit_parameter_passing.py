import couler.argo as couler


def produce_two():
    first = couler.create_parameter_artifact(path="/out/first.txt")
    second = couler.create_parameter_artifact(path="/out/second.txt")
    return couler.run_container(
        image="alpine:3.20",
        command=["sh", "-c", "echo -n 1 > /out/first.txt; echo -n 2 > /out/second.txt"],
        output=[first, second],
        step_name="a",
    )


def consume():
    return couler.run_container(image="alpine:3.20", command=["echo"], step_name="b")


couler.config_workflow(name="implicit-passing")
couler.set_dependencies(lambda: produce_two(), dependencies=None)
couler.set_dependencies(lambda: consume(), dependencies=["a"])
