import couler.argo as couler


def toss():
    import random

    print("heads" if random.random() < 0.5 else "tails")


def flip_coin():
    return couler.run_script(image="python:3.12-alpine", source=toss)


def heads():
    return couler.run_container(image="alpine:3.20", command=["echo", "heads"])


def tails():
    return couler.run_container(image="alpine:3.20", command=["echo", "tails"])


couler.config_workflow(name="coin-flip")
outcome = flip_coin()
couler.when(couler.equal(outcome, "heads"), lambda: heads())
couler.when(couler.equal(outcome, "tails"), lambda: tails())
