import couler.argo as couler


def report():
    return couler.run_container(image="alpine:3.20", command=["date"])


couler.config_workflow(
    name="cron-report",
    cron_config={
        "schedule": "*/30 * * * *",
        "concurrency_policy": "Forbid",
        "successful_jobs_history_limit": 5,
        "failed_jobs_history_limit": 2,
        "starting_deadline_seconds": 60,
    },
)
report()
