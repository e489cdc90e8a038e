"""A step not run because its upstream failed stops its own dependents (Argo's Omitted).

Semantics rule S2 (docs/semantics.md): ``evaluate`` after a failed ``train`` is not
run, and ``deploy`` after ``evaluate`` is not run either -- a default edge accepts a
step skipped by its own ``when``, never one that was not run. A failed training must
not ship a model.
"""
import couler.argo as couler


def sh(name, script):
    return couler.run_container(image="alpine:3.20", command=["sh", "-c", script],
                                step_name=name)


couler.config_workflow(name="conf-skip-propagation")
couler.set_dependencies(lambda: sh("train", "echo training; exit 1"), dependencies=None)
couler.set_dependencies(lambda: sh("evaluate", "echo evaluating"), dependencies=["train"])
couler.set_dependencies(lambda: sh("deploy", "echo deploying"), dependencies=["evaluate"])
couler.set_dependencies(lambda: sh("unrelated", "echo fine"), dependencies=None)
