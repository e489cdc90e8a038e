"""Flip a coin until it lands heads (a bounded loop)."""

import couler.argo as couler
from couler.argo_submitter import ArgoSubmitter


def random_code():
    import random

    print("heads" if random.randint(0, 1) == 0 else "tails")


def flip_coin():
    return couler.run_script(image="python:3.12-alpine", source=random_code)


couler.config_workflow(name="flip-until-heads")
couler.exec_while(couler.equal("tails"), lambda: flip_coin(), max_iterations=20)

if __name__ == "__main__":
    couler.run(submitter=ArgoSubmitter())
