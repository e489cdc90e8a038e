import couler.argo as couler


def toss():
    import random

    print("heads" if random.random() < 0.5 else "tails")


def flip_coin():
    return couler.run_script(image="python:3.12-alpine", source=toss)


couler.config_workflow(name="while-loop")
couler.exec_while(couler.equal("tails"), lambda: flip_coin())
