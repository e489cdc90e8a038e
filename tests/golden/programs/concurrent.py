import couler.argo as couler


def whalesay():
    return couler.run_container(image="docker/whalesay:latest", command=["cowsay", "hi"])


def heads():
    return couler.run_container(image="alpine:3.20", command=["echo", "heads"])


def tails():
    return couler.run_container(image="alpine:3.20", command=["echo", "tails"])


def summary():
    return couler.run_container(image="alpine:3.20", command=["echo", "done"])


couler.config_workflow(name="concurrent")
couler.concurrent([whalesay, heads, tails])
summary()
