"""Distributed TensorFlow training as a step: ``couler.steps.tensorflow.train``.

Creates a ``TFJob`` (``kubeflow.org/v1``, run by the Kubeflow training
operator) and waits for it, as the open-source SDK's module of the same name:

    from couler.steps import tensorflow as tf

    tf.train(image="tensorflow/tensorflow:2.16.1", command="python /app/train.py",
             num_ps=1, num_workers=2, worker_resources="cpu=2,memory=4096")
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
    no_chief: bool = True,
    chief_image: str | None = None,
    chief_resources: ResourceSpec = None,
    chief_restart_policy: str = "Never",
    chief_command: str | Sequence[str] | None = None,
    num_ps: int = 0,
    ps_image: str | None = None,
    ps_resources: ResourceSpec = None,
    ps_restart_policy: str = "Never",
    ps_command: str | Sequence[str] | None = None,
    num_workers: int = 0,
    worker_image: str | None = None,
    worker_resources: ResourceSpec = None,
    worker_restart_policy: str = "Never",
    worker_command: str | Sequence[str] | None = None,
    num_evaluators: int = 0,
    evaluator_image: str | None = None,
    evaluator_resources: ResourceSpec = None,
    evaluator_restart_policy: str = "Never",
    evaluator_command: str | Sequence[str] | None = None,
    clean_pod_policy: str = "Running",
    timeout: int | str | None = None,
    *,
    step_name: str | None = None,
) -> list[StepOutput]:
    """Run a distributed TensorFlow job (a ``TFJob``) as one step, and wait for it.

    Each replica group (chief, parameter servers, workers, evaluators) takes
    its image and command from its own argument, else from ``image`` and
    ``command``. The step succeeds when all ``num_workers`` workers have
    succeeded (as in the SDK) and fails as soon as a pod of any group fails
    (the operator then fails the job).

    Args:
        image: The image of every replica group that names none of its own.
        command: The command of every group that names none of its own: a
            list, or one string split like a shell line (no shell runs it;
            use ``["sh", "-c", "..."]`` for one). Empty: the image's entrypoint.
        secret: A secret from ``couler.create_secret``/``obtain_secret`` (or
            its name); each key becomes an environment variable of every
            container, read from the secret by reference.
        no_chief: Without a ``Chief`` replica (default); False adds one.
        chief_image: The chief's image.
        chief_resources: The chief's resources: ``"cpu=1,memory=2048,gpu=1"``
            (the SDK's form; a bare memory number is MiB) or a dict as for
            ``run_container`` (``{"cpu": "1", "memory": "2Gi"}``).
        chief_restart_policy: ``Always``, ``OnFailure``, ``Never`` or ``ExitCode``.
        chief_command: The chief's command.
        num_ps: Number of parameter servers (``PS`` replicas).
        ps_image: The parameter servers' image.
        ps_resources: Their resources.
        ps_restart_policy: Their restart policy.
        ps_command: Their command.
        num_workers: Number of workers; at least 1.
        worker_image: The workers' image.
        worker_resources: Their resources.
        worker_restart_policy: Their restart policy.
        worker_command: Their command.
        num_evaluators: Number of evaluators.
        evaluator_image: The evaluators' image.
        evaluator_resources: Their resources.
        evaluator_restart_policy: Their restart policy.
        evaluator_command: Their command.
        clean_pod_policy: Which pods to delete when the job ends: ``All``,
            ``Running`` (default) or ``None``.
        timeout: Deadline of the step, in seconds or as ``"2h"``.
        step_name: Names the step (not in the SDK); default: the calling
            function's name, as the SDK names it, else the job's generateName.

    Returns:
        ``[job-name, job-id, job-obj]`` output handles, as ``run_job`` returns.

    Raises:
        UserError: for fewer than one worker, a negative count, a group
            without an image, an unknown policy, bad resources or an unknown
            secret; the message names the argument.
    """
    call = Call("tensorflow.train", step_name)
    workers = count(call, "num_workers", num_workers, minimum=1)
    groups: list[Replica] = []
    if not no_chief:
        groups.append(Replica("Chief", "chief", 1, chief_image, chief_command, chief_resources,
                              chief_restart_policy))
    if count(call, "num_ps", num_ps, minimum=0):
        groups.append(Replica("PS", "ps", num_ps, ps_image, ps_command, ps_resources,
                              ps_restart_policy))
    groups.append(Replica("Worker", "worker", workers, worker_image, worker_command,
                          worker_resources, worker_restart_policy))
    if count(call, "num_evaluators", num_evaluators, minimum=0):
        groups.append(Replica("Evaluator", "evaluator", num_evaluators, evaluator_image,
                              evaluator_command, evaluator_resources, evaluator_restart_policy))
    manifest = _training_job(call, kind="TFJob", generate_name="tf-train-",
                             specs_key="tfReplicaSpecs", container="tensorflow", replicas=groups,
                             image=image, command=command, secret=secret,
                             clean_pod_policy=clean_pod_policy)
    return run_job(manifest, succeeded("Worker", workers), any_failed(g.role for g in groups),
                   timeout=timeout, step_name=step_name, caller_depth=1)
