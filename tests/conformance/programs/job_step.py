"""A Kubernetes job step (resource template) with success / failure conditions."""
import couler.argo as couler

MANIFEST = """
apiVersion: batch/v1
kind: Job
metadata:
  generateName: conf-job-
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: main
          image: alpine:3.20
          command: ["echo", "job"]
"""

couler.config_workflow(name="conf-job-step")
couler.run_job(manifest=MANIFEST, success_condition="status.succeeded > 0",
               failure_condition="status.failed > 3", step_name="k8s-job")
