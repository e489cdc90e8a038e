"""Concurrent branches of several steps each: inline sub-workflows."""
import couler.argo as couler


def step(name):
    return couler.run_container(image="alpine:3.20", command=["echo", name], step_name=name)


def branch_one():
    step("one-a")
    step("one-b")


def branch_two():
    step("two-a")
    step("two-b")


couler.config_workflow(name="conf-subworkflows")
step("first")
couler.concurrent([branch_one, branch_two], subtasks=True)
step("last")
