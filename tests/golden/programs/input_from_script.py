import couler.argo as couler


def number():
    import random

    print(random.randint(0, 100))


def generate():
    return couler.run_script(image="python:3.12-alpine", source=number)


def show(value):
    return couler.run_container(image="alpine:3.20", command=["echo"], args=["got", value])


couler.config_workflow(name="input-from-script")
show("start")
show(generate())
