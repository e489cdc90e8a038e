"""Two ``when``s on the same output are siblings (semantics rule S5, docs/semantics.md).

Both depend on ``flip`` only: the first one failing does not skip the second.
"""
import couler.argo as couler


def flip():
    print("heads")


def first():
    return couler.run_container(image="alpine:3.20", command=["sh", "-c", "echo first; exit 1"],
                                step_name="first")


def second():
    return couler.run_container(image="alpine:3.20", command=["echo", "second"],
                                step_name="second")


couler.config_workflow(name="conf-sibling-whens")
result = couler.run_script(image="python:3.12-alpine", source=flip, step_name="flip")
couler.when(couler.equal(result, "heads"), first)
couler.when(couler.equal(result, "heads"), second)
