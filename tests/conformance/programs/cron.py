"""A cron-scheduled workflow."""
import couler.argo as couler

couler.config_workflow(
    name="conf-cron",
    cron_config={"schedule": "*/30 * * * *", "concurrency_policy": "Forbid"},
)
couler.run_container(image="alpine:3.20", command=["echo", "tick"], step_name="tick")
