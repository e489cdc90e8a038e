"""Pass credentials to a step as secret references: the values never enter the workflow."""

import couler.argo as couler
from couler.argo_submitter import ArgoSubmitter

couler.config_workflow(name="secret-demo")
creds = couler.create_secret(
    secret_data={"DB_USER": "analyst", "DB_PASSWORD": "not-in-the-yaml"}, dry_run=True
)
couler.run_container(
    image="postgres:16-alpine",
    command=["sh", "-c", 'psql -U "$DB_USER" -c "select 1"'],
    secret=creds,
    step_name="query",
)

if __name__ == "__main__":
    couler.run(submitter=ArgoSubmitter())
