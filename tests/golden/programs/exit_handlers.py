import couler.argo as couler
from couler.argo import WFStatus


def say_hello():
    print("hello from a script body")


def hello():
    return couler.run_script(image="python:3.12-alpine", source=say_hello)


def celebrate():
    return couler.run_container(image="alpine:3.20", command=["echo", "it worked"])


def mourn():
    return couler.run_container(image="alpine:3.20", command=["echo", "it failed"])


couler.config_workflow(name="exit-handlers")
hello()
couler.set_exit_handler(WFStatus.Succeeded, celebrate)
couler.set_exit_handler(WFStatus.Failed, mourn)
