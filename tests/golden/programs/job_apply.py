import couler.argo as couler

manifest = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  generateName: mnist-
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers:
            - name: pytorch
              image: pytorch/mnist:1.0
"""

couler.config_workflow(name="job-apply")
couler.run_job(
    manifest=manifest,
    success_condition="status.replicaStatuses.Master.succeeded > 0",
    failure_condition="status.replicaStatuses.Master.failed > 0",
    action="apply",
    step_name="mnist",
)
