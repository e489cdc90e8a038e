"""Distributed PyTorch training as a step: ``couler.steps.pytorch.train``.

Creates a ``PyTorchJob`` (``kubeflow.org/v1``, run by the Kubeflow training
operator) and waits for it, as the open-source SDK's module of the same name:

    import couler.steps.pytorch as pytorch

    pytorch.train(image="pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
                  command="python /app/train.py --epochs 10", num_workers=3,
                  worker_resources={"cpu": "4", "memory": "16Gi", "gpu": 1})
"""

from __future__ import annotations

from collections.abc import Sequence

from couler.api.handles import Secret, StepOutput
from couler.api.steps import run_job
from couler.steps._kubeflow import Call, Replica, ResourceSpec, any_failed, count, succeeded
from couler.steps._kubeflow import training_job as _training_job

__all__ = ["train"]


def train(  # noqa: PLR0917 - the SDK's positional signature
    image: str | None = None,
    command: str | Sequence[str] = "",
    secret: Secret | str | None = None,
    master_image: str | None = None,
    master_resources: ResourceSpec = None,
    master_restart_policy: str = "Never",
    master_command: str | Sequence[str] | None = None,
    num_workers: int = 0,
    worker_image: str | None = None,
    worker_resources: ResourceSpec = None,
    worker_restart_policy: str = "Never",
    worker_command: str | Sequence[str] | None = None,
    clean_pod_policy: str = "Running",
    timeout: int | str | None = None,
    *,
    step_name: str | None = None,
) -> list[StepOutput]:
    """Run a distributed PyTorch job (a ``PyTorchJob``: one master, workers) as one step.

    The master and the workers take their image and command from their own
    arguments, else from ``image`` and ``command``. The step succeeds when all
    ``num_workers`` workers have succeeded (as in the SDK) and fails as soon
    as the master or a worker pod fails (the operator then fails the job).

    Args:
        image: The image of the master and workers, unless they name their own.
        command: Their command, unless they name their own: a list, or one
            string split like a shell line (no shell runs it; use
            ``["sh", "-c", "..."]`` for one). Empty: the image's entrypoint.
        secret: A secret from ``couler.create_secret``/``obtain_secret`` (or
            its name); each key becomes an environment variable of every
            container, read from the secret by reference.
        master_image: The master's image.
        master_resources: The master's resources: ``"cpu=1,memory=2048,gpu=1"``
            (the SDK's form; a bare memory number is MiB) or a dict as for
            ``run_container`` (``{"cpu": "1", "memory": "2Gi"}``).
        master_restart_policy: ``Always``, ``OnFailure``, ``Never`` or ``ExitCode``.
        master_command: The master's command.
        num_workers: Number of workers; at least 1.
        worker_image: The workers' image.
        worker_resources: Their resources.
        worker_restart_policy: Their restart policy.
        worker_command: Their command.
        clean_pod_policy: Which pods to delete when the job ends: ``All``,
            ``Running`` (default) or ``None``.
        timeout: Deadline of the step, in seconds or as ``"2h"``.
        step_name: Names the step (not in the SDK); default: the calling
            function's name, as the SDK names it, else the job's generateName.

    Returns:
        ``[job-name, job-id, job-obj]`` output handles, as ``run_job`` returns.

    Raises:
        UserError: for fewer than one worker, a replica group without an
            image, an unknown policy, bad resources or an unknown secret; the
            message names the argument.
    """
    call = Call("pytorch.train", step_name)
    workers = count(call, "num_workers", num_workers, minimum=1)
    groups = [
        Replica("Master", "master", 1, master_image, master_command, master_resources,
                master_restart_policy),
        Replica("Worker", "worker", workers, worker_image, worker_command, worker_resources,
                worker_restart_policy),
    ]
    manifest = _training_job(call, kind="PyTorchJob", generate_name="pytorch-train-",
                             specs_key="pytorchReplicaSpecs", container="pytorch",
                             replicas=groups, image=image, command=command, secret=secret,
                             clean_pod_policy=clean_pod_policy)
    return run_job(manifest, succeeded("Worker", workers), any_failed(g.role for g in groups),
                   timeout=timeout, step_name=step_name, caller_depth=1)
