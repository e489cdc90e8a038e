"""Distributed MPI training as a step: ``couler.steps.mpi.train``.

Creates an ``MPIJob`` (``kubeflow.org/v1``, as the open-source SDK does; run
by the Kubeflow training operator) and waits for it:

    from couler.steps import mpi

    mpi.train(image="horovod/horovod:0.28.1",
              command="mpirun -np 4 python /examples/tensorflow2_mnist.py",
              num_workers=4, worker_resources="cpu=2,memory=4096")

The launcher runs ``command`` (normally ``mpirun``), which starts the ranks
on the workers; workers without a command of their own idle until it does.
"""

from __future__ import annotations

from collections.abc import Sequence

from couler.api.handles import Secret, StepOutput
from couler.api.steps import run_job
from couler.steps._kubeflow import Call, Replica, ResourceSpec, any_failed, count
from couler.steps._kubeflow import training_job as _training_job

__all__ = ["train"]

# An MPIJob finishes with its launcher: the workers only host the ranks mpirun starts, and the
# operator stops them when the launcher ends, so they never count as succeeded.
_SUCCESS = "status.replicaStatuses.Launcher.succeeded > 0"


def train(  # noqa: PLR0917 - the SDK's positional signature
    image: str | None = None,
    command: str | Sequence[str] = "",
    secret: Secret | str | None = None,
    launcher_image: str | None = None,
    launcher_resources: ResourceSpec = None,
    launcher_command: str | Sequence[str] | None = None,
    num_workers: int = 0,
    worker_image: str | None = None,
    worker_resources: ResourceSpec = None,
    worker_command: str | Sequence[str] | None = None,
    clean_pod_policy: str = "Running",
    timeout: int | str | None = None,
    *,
    step_name: str | None = None,
) -> list[StepOutput]:
    """Run an MPI job (an ``MPIJob``: one launcher, workers) as one step, and wait for it.

    The step succeeds when the launcher has succeeded and fails as soon as
    the launcher or a worker pod fails.

    Args:
        image: The image of the launcher and workers, unless they name their own.
        command: The launcher's command unless ``launcher_command`` is given,
            e.g. ``"mpirun -np 4 python train.py"``: a list, or one string
            split like a shell line (no shell runs it).
        secret: A secret from ``couler.create_secret``/``obtain_secret`` (or
            its name); each key becomes an environment variable of every
            container, read from the secret by reference.
        launcher_image: The launcher's image.
        launcher_resources: The launcher's resources: ``"cpu=1,memory=2048"``
            (the SDK's form; a bare memory number is MiB) or a dict as for
            ``run_container`` (``{"cpu": "1", "memory": "2Gi"}``).
        launcher_command: The launcher's command.
        num_workers: Number of workers; at least 1.
        worker_image: The workers' image.
        worker_resources: Their resources.
        worker_command: Their command. Unlike the SDK, workers do not take
            ``command``: without one the operator keeps them idle for
            ``mpirun`` to use (running the launcher's command on every worker
            would start the job once per worker).
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
    call = Call("mpi.train", step_name)
    workers = count(call, "num_workers", num_workers, minimum=1)
    groups = [
        Replica("Launcher", "launcher", 1, launcher_image, launcher_command, launcher_resources),
        Replica("Worker", "worker", workers, worker_image, worker_command, worker_resources,
                inherits_command=False),
    ]
    # Both fields: the operator reads runPolicy; releases that predate it read the top-level one.
    manifest = _training_job(call, kind="MPIJob", generate_name="mpi-train-",
                             specs_key="mpiReplicaSpecs", container="mpi", replicas=groups,
                             image=image, command=command, secret=secret,
                             clean_pod_policy=clean_pod_policy,
                             extra_spec={"slotsPerWorker": 1, "cleanPodPolicy": clean_pod_policy})
    return run_job(manifest, _SUCCESS, any_failed(g.role for g in groups), timeout=timeout,
                   step_name=step_name, caller_depth=1)
