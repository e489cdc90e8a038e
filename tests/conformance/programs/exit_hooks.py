"""Exit hooks on success and on failure."""
import couler.argo as couler
from couler.argo import WFStatus


def work():
    return couler.run_container(image="alpine:3.20", command=["echo", "working"],
                                step_name="work")


def celebrate():
    return couler.run_container(image="alpine:3.20", command=["echo", "it worked"],
                                step_name="celebrate")


def mourn():
    return couler.run_container(image="alpine:3.20", command=["echo", "it failed"],
                                step_name="mourn")


couler.config_workflow(name="conf-exit-hooks")
work()
couler.set_exit_handler(WFStatus.Succeeded, celebrate)
couler.set_exit_handler(WFStatus.Failed, mourn)
