import couler.argo as couler


def toss():
    import random

    print("heads" if random.random() < 0.5 else "tails")


def flip_coin():
    return couler.run_script(image="python:3.12-alpine", source=toss, step_name="flip-coin")


def heads():
    return couler.run_container(image="alpine:3.20", command=["echo", "heads"], step_name="heads")


couler.config_workflow(name="dag-conditional")
couler.set_dependencies(lambda: flip_coin(), dependencies=None)
couler.set_dependencies(
    lambda: couler.when(couler.equal(flip_coin, "heads"), lambda: heads()),
    dependencies=["flip-coin"],
)
