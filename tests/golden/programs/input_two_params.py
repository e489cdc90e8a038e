import couler.argo as couler


def add(x, y):
    return couler.run_container(image="alpine:3.20", command=["expr"], args=[x, "+", y])


couler.config_workflow(name="input-two-params")
add(1, 2)
add(30, 12)
