"""A nightly report on a cron schedule."""

import couler.argo as couler
from couler.argo_submitter import ArgoSubmitter


def report():
    return couler.run_container(
        image="alpine:3.20", command=["sh", "-c", "date; echo nightly report"], step_name="report"
    )


couler.config_workflow(
    name="nightly-report",
    cron_config={
        "schedule": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "concurrency_policy": "Forbid",
    },
)
report()

if __name__ == "__main__":
    couler.run(submitter=ArgoSubmitter())
