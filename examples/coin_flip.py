"""Flip a coin; report heads or tails (a `when` with an else branch)."""

import couler.argo as couler
from couler.argo_submitter import ArgoSubmitter


def random_code():
    import random

    result = "heads" if random.randint(0, 1) == 0 else "tails"
    print(result)


def flip_coin():
    return couler.run_script(image="python:3.12-alpine", source=random_code)


def heads():
    return couler.run_container(image="alpine:3.20", command=["sh", "-c", 'echo "it was heads"'])


def tails():
    return couler.run_container(image="alpine:3.20", command=["sh", "-c", 'echo "it was tails"'])


couler.config_workflow(name="coin-flip")
result = flip_coin()
couler.when(couler.equal(result, "heads"), lambda: heads(), lambda: tails())

if __name__ == "__main__":
    couler.run(submitter=ArgoSubmitter(namespace="argo"))
