"""What the training-job steps share: argument checks and the replica pod templates.

The Kubeflow training operator runs a ``TFJob``, ``PyTorchJob`` or ``MPIJob``
as groups of replicas (``Chief``, ``PS``, ``Worker``, ``Master``, ``Launcher``,
...), each with its own pod template. :func:`training_job` builds such a
manifest from the SDK's arguments; every check names the call (and the
``step_name``, if given) and the argument at fault. Secrets enter the
manifest only as ``secretKeyRef`` references, never as values.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from couler import ir
from couler.api.builder import current_builder
from couler.api.handles import Secret
from couler.api.options import to_resources
from couler.compilers.kube import resource_requirements
from couler.errors import UserError

__all__ = [
    "API_VERSION",
    "CLEAN_POD_POLICIES",
    "RESTART_POLICIES",
    "Call",
    "Command",
    "Replica",
    "ResourceSpec",
    "any_failed",
    "count",
    "succeeded",
    "training_job",
]

API_VERSION = "kubeflow.org/v1"
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("All", "Running", "None")

ResourceSpec: TypeAlias = str | Mapping[str, object] | ir.Resources | None
"""``"cpu=1,memory=2048,gpu=1"`` (the SDK's form), or a dict as for ``run_container``."""

_RESOURCE_KEYS = ("cpu", "memory", "gpu")


@dataclass(frozen=True)
class Call:
    """One call of a step function, e.g. ``tensorflow.train``: where a mistake is reported.

    Attributes:
        api: The function, as programs spell it (``"pytorch.train"``).
        step_name: The ``step_name`` given to it, if any.
    """

    api: str
    step_name: str | None = None

    def error(self, field: str, message: str) -> UserError:
        """A :class:`UserError` naming the workflow, this call, and ``field``."""
        where = f"workflow {current_builder().workflow_name()!r}: {self.api}"
        if self.step_name:
            where += f" (step {self.step_name!r})"
        return UserError(f"{where}: {field}: {message}")


Command: TypeAlias = str | Sequence[str] | None
"""A list, or one string split like a shell line; empty for the image's entrypoint."""


@dataclass(frozen=True)
class Replica:
    """One replica group of a training job, as the SDK's arguments describe it.

    Attributes:
        role: The operator's replica type (``"Worker"``).
        prefix: How the SDK's arguments for this group start (``"worker"`` for
            ``worker_image``, ``worker_command``, ...); used in messages.
        replicas: How many pods.
        image: The group's own image; empty for the job's ``image``.
        command: The group's own command; empty for the job's ``command``.
        resources: The group's resources.
        restart_policy: ``Always``, ``OnFailure``, ``Never`` or ``ExitCode``;
            None leaves it to the operator.
        inherits_command: Whether the group runs the job's ``command`` when it
            has none of its own.
    """

    role: str
    prefix: str
    replicas: int
    image: str | None
    command: Command
    resources: ResourceSpec = None
    restart_policy: str | None = None
    inherits_command: bool = True


def count(call: Call, field: str, value: object, *, minimum: int) -> int:
    """``value`` as a replica count of at least ``minimum``.

    Raises:
        UserError: for a non-integer or a count below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise call.error(field, f"must be an integer, not {value!r}")
    if value < minimum:
        raise call.error(field, f"must be at least {minimum}, got {value}")
    return value


def succeeded(role: str, replicas: int) -> str:
    """An Argo success condition: all ``replicas`` pods of ``role`` succeeded."""
    return f"status.replicaStatuses.{role}.succeeded == {replicas}"


def any_failed(roles: Iterable[str]) -> str:
    """An Argo failure condition: a pod of any of ``roles`` failed.

    Argo fails the step when *any* comma-separated failure requirement holds
    (success requirements must *all* hold).
    """
    return ",".join(f"status.replicaStatuses.{role}.failed > 0" for role in roles)


def training_job(
    call: Call,
    *,
    kind: str,
    generate_name: str,
    specs_key: str,
    container: str,
    replicas: Sequence[Replica],
    image: str | None,
    command: Command,
    secret: Secret | str | None,
    clean_pod_policy: str,
    extra_spec: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The manifest of a training-operator job (``apiVersion: kubeflow.org/v1``).

    Args:
        call: The calling step function, for messages.
        kind: ``TFJob``, ``PyTorchJob`` or ``MPIJob``.
        generate_name: The job's name prefix; Kubernetes appends a unique
            suffix, so a retried or repeated step never clashes.
        specs_key: Where the replica groups go (``tfReplicaSpecs``, ...).
        container: The container name the operator expects (``tensorflow``,
            ``pytorch``, ``mpi``): it injects ports and cluster settings by it.
        replicas: The replica groups.
        image: The image of groups without their own.
        command: The command of groups without their own (that inherit it).
        secret: A secret whose keys every container reads as environment variables.
        clean_pod_policy: ``All``, ``Running`` or ``None``: which pods to delete
            when the job ends.
        extra_spec: More fields of the job's ``spec``.

    Raises:
        UserError: for a missing image, an unknown policy, bad resources or an
            unknown secret.
    """
    if clean_pod_policy not in CLEAN_POD_POLICIES:
        raise call.error("clean_pod_policy", f"{clean_pod_policy!r} is not one of "
                                             f"{', '.join(CLEAN_POD_POLICIES)}")
    env = _secret_env(call, secret)
    specs = {group.role: _replica_spec(call, group, container_name=container, image=image,
                                       command=command, env=env)
             for group in replicas}
    spec: dict[str, object] = {"runPolicy": {"cleanPodPolicy": clean_pod_policy}}
    spec.update(extra_spec or {})
    spec[specs_key] = specs
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"generateName": generate_name},
            "spec": spec}


def _replica_spec(call: Call, group: Replica, *, container_name: str, image: str | None,
                  command: Command, env: list[dict[str, object]]) -> dict[str, object]:
    # As in the SDK, a group's own image or command wins when it is not empty.
    own_image = f"{group.prefix}_image"
    image_field, group_image = (own_image, group.image) if group.image else ("image", image)
    if not isinstance(group_image, str) or not group_image.strip():
        raise call.error(image_field, f"the {group.role} replicas need an image: pass image= "
                                      f"or {own_image}=")
    container: dict[str, object] = {"name": container_name, "image": group_image}
    if group.command:
        argv = _command(call, f"{group.prefix}_command", group.command)
    else:
        argv = _command(call, "command", command) if group.inherits_command else []
    if argv:
        container["command"] = argv
    if env:
        container["env"] = list(env)
    resources = _resources(call, f"{group.prefix}_resources", group.resources)
    if resources:
        container["resources"] = resources
    spec: dict[str, object] = {"replicas": group.replicas}
    if group.restart_policy is not None:
        if group.restart_policy not in RESTART_POLICIES:
            choices = ", ".join(RESTART_POLICIES)
            raise call.error(f"{group.prefix}_restart_policy",
                             f"{group.restart_policy!r} is not one of {choices}")
        spec["restartPolicy"] = group.restart_policy
    spec["template"] = {"spec": {"containers": [container]}}
    return spec


def _command(call: Call, field: str, command: Command) -> list[str]:
    """The container's command; a string is split like a shell line (no shell runs it)."""
    if command is None:
        return []
    if isinstance(command, str):
        try:
            return shlex.split(command)
        except ValueError as e:
            raise call.error(field, f"cannot split {command!r} into arguments ({e})") from e
    if isinstance(command, Sequence):
        for part in command:
            if isinstance(part, bool) or not isinstance(part, (str, int, float)):
                raise call.error(field, f"every item must be a string or a number, got {part!r}")
        return [str(part) for part in command]
    raise call.error(field, f"must be a string or a list of strings, not "
                            f"{type(command).__name__}")


def _resources(call: Call, field: str, resources: ResourceSpec) -> dict[str, object]:
    """A container's ``resources``, checked; the SDK's string form is parsed first."""
    if resources is None:
        return {}
    given = _resource_string(call, field, resources) if isinstance(resources, str) else resources
    try:
        spec = to_resources(given)
    except UserError as e:
        raise call.error(field, str(e)) from e
    if spec is None:
        return {}
    for label, text in (("cpu", spec.cpu_request), ("cpu", spec.cpu_limit),
                        ("memory", spec.memory_request), ("memory", spec.memory_limit)):
        if text:
            try:
                ir.parse_quantity(text)
            except ValueError as e:
                raise call.error(field, f"{label}: {e}") from e
    if spec.gpu < 0:
        raise call.error(field, f"the GPU count must not be negative, got {spec.gpu}")
    return resource_requirements(spec)


def _resource_string(call: Call, field: str, text: str) -> dict[str, object]:
    """The SDK's ``"cpu=0.5,memory=1024,gpu=1"``; a memory given as a bare number is in MiB."""
    values: dict[str, object] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not key or not value:
            raise call.error(field, f"{item.strip()!r} is not key=value; write e.g. "
                                    "'cpu=1,memory=2Gi,gpu=1'")
        if key not in _RESOURCE_KEYS:
            raise call.error(field, f"{key!r} is not supported; use cpu, memory and gpu")
        if key == "memory" and value.isdigit():
            value += "Mi"  # the SDK's unit: Kubernetes would read a bare number as bytes
        values[key] = value
    return values


def _secret_env(call: Call, secret: Secret | str | None) -> list[dict[str, object]]:
    """One environment variable per key of ``secret``, each read from the secret by reference."""
    if secret is None:
        return []
    b = current_builder()
    if isinstance(secret, Secret):
        handle: Secret | None = secret
    elif isinstance(secret, str):
        handle = b.find_secret(secret)
    else:  # never show the value: it may hold the secret's data
        raise call.error("secret", f"must be what create_secret or obtain_secret returned (or "
                                   f"its name), not a {type(secret).__name__}")
    if handle is None:
        raise call.error("secret", f"no secret called {secret!r}; create it with create_secret "
                                   "or obtain_secret")
    if handle.builder is not b:
        raise call.error("secret", f"secret {handle.name!r} belongs to another workflow")
    return [{"name": key, "valueFrom": {"secretKeyRef": {"name": handle.name, "key": key}}}
            for key in handle.keys]
