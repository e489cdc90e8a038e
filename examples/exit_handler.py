"""Run a job, then notify on success and clean up on failure (exit handlers)."""

import couler.argo as couler
from couler.argo import WFStatus
from couler.argo_submitter import ArgoSubmitter


def train():
    return couler.run_container(
        image="python:3.12-slim", command=["python", "-c", "print('training')"], step_name="train"
    )


def notify():
    return couler.run_container(
        image="alpine:3.20", command=["echo", "training succeeded"], step_name="notify"
    )


def cleanup():
    return couler.run_container(
        image="alpine:3.20", command=["echo", "cleaning up after failure"], step_name="cleanup"
    )


couler.config_workflow(name="train-with-hooks")
train()
couler.set_exit_handler(WFStatus.Succeeded, notify)
couler.set_exit_handler(WFStatus.Failed, cleanup)

if __name__ == "__main__":
    couler.run(submitter=ArgoSubmitter())
