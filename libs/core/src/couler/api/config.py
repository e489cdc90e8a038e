"""Workflow-level configuration: name, cron, labels, volumes, tolerations, DNS, parameters."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from couler import ir
from couler.api.builder import (
    Defaults,
    WorkflowBuilder,
    current_builder,
    freeze_mapping,
    get_defaults,
    set_defaults,
)
from couler.api.handles import WorkflowParam
from couler.api.options import to_seconds
from couler.errors import UserError

__all__ = [
    "DnsConfig",
    "ImagePullSecret",
    "Toleration",
    "Volume",
    "VolumeClaimTemplate",
    "VolumeMount",
    "WFStatus",
    "add_image_pull_secret",
    "add_toleration",
    "add_volume",
    "config_defaults",
    "config_workflow",
    "create_workflow_volume",
    "set_dns",
    "set_security_context",
    "workflow",
    "workflow_parameter",
]

USER_ID_LABEL = "couler.io/user-id"

VolumeMount = ir.VolumeMount
"""A volume mounted into a step: ``VolumeMount(name, mount_path)``."""


class WFStatus(enum.StrEnum):
    """Final status of a workflow, for :func:`couler.set_exit_handler`."""

    Succeeded = "Succeeded"
    Failed = "Failed"
    Error = "Error"

    def to_ir(self) -> ir.RunStatus:
        """The IR run status."""
        return {
            WFStatus.Succeeded: ir.RunStatus.SUCCEEDED,
            WFStatus.Failed: ir.RunStatus.FAILED,
            WFStatus.Error: ir.RunStatus.ERROR,
        }[self]


@dataclass(frozen=True)
class Volume:
    """An existing PersistentVolumeClaim: ``Volume(name, claim_name)``."""

    name: str
    claim_name: str

    def to_ir(self) -> ir.Volume:
        """The IR volume."""
        return ir.Volume(self.name, kind=ir.VolumeKind.PVC, claim_name=self.claim_name)


@dataclass(frozen=True)
class VolumeClaimTemplate:
    """A claim made for each run: ``VolumeClaimTemplate(claim_name, access_modes, size)``."""

    claim_name: str
    access_modes: Sequence[str] = ("ReadWriteOnce",)
    size: str = "1Gi"
    storage_class: str = ""

    def to_ir(self) -> ir.Volume:
        """The IR volume."""
        return ir.Volume(self.claim_name, kind=ir.VolumeKind.CLAIM_TEMPLATE, size=self.size,
                         access_modes=tuple(self.access_modes), storage_class=self.storage_class)


@dataclass(frozen=True)
class Toleration:
    """A Kubernetes toleration: ``Toleration(key, effect, operator)`` (the SDK's order)."""

    key: str
    effect: str = ""
    operator: str = "Equal"
    value: str = ""
    toleration_seconds: int | None = None

    def to_ir(self) -> ir.Toleration:
        """The IR toleration."""
        return ir.Toleration(key=self.key, operator=self.operator, value=self.value,
                             effect=self.effect, toleration_seconds=self.toleration_seconds)


@dataclass(frozen=True)
class ImagePullSecret:
    """A secret with registry credentials used to pull images."""

    name: str


@dataclass(frozen=True)
class DnsConfig:
    """Pod DNS settings: ``DnsConfig(nameservers, options, searches)``."""

    nameservers: Sequence[str] = ()
    options: Sequence[Mapping[str, str]] | Mapping[str, str] = field(default_factory=dict)
    searches: Sequence[str] = ()

    def to_ir(self, policy: str) -> ir.DnsConfig:
        """The IR DNS config with ``policy``."""
        if isinstance(self.options, Mapping):
            opts = [(str(k), str(v)) for k, v in self.options.items()]
        else:
            opts = [(str(o["name"]), str(o.get("value", ""))) for o in self.options]
        return ir.DnsConfig(policy=policy, nameservers=tuple(self.nameservers),
                            searches=tuple(self.searches), options=tuple(opts))


# --------------------------------------------------------------------------- workflow config


def config_workflow(  # noqa: PLR0917 - the SDK's positional signature
    name: str | None = None,
    user_id: str | None = None,
    timeout: int | str | None = None,
    time_to_clean: int | str | None = None,
    cluster_config_file: str | None = None,
    cron_config: Mapping[str, object] | None = None,
    service_account: str | None = None,
    *,
    labels: Mapping[str, object] | None = None,
    annotations: Mapping[str, object] | None = None,
    namespace: str | None = None,
    parameters: Mapping[str, object] | Iterable[ir.Parameter] | None = None,
    parallelism: int | None = None,
    node_selector: Mapping[str, object] | None = None,
) -> None:
    """Configure the current workflow.

    Args:
        name: The workflow's name (sanitised to DNS-1123, at most 52 characters).
        user_id: Recorded as the label ``couler.io/user-id``.
        timeout: Deadline of the whole workflow, in seconds or as ``"2h"``.
        time_to_clean: Delete the workflow this long after it finishes.
        cluster_config_file: A Python file defining ``cluster`` with hooks
            ``config_pod(template)`` and optionally ``config_workflow(spec)``,
            applied to the Argo document by :func:`couler.workflow_yaml`.
        cron_config: Run on a schedule. Keys: ``schedule`` (required),
            ``timezone`` (default: the engine's, no implicit Asia/Shanghai),
            ``concurrency_policy`` (Allow/Forbid/Replace),
            ``starting_deadline_seconds``, ``successful_jobs_history_limit``,
            ``failed_jobs_history_limit``, ``suspend``.
        service_account: The service account steps run as.
        labels: Workflow labels.
        annotations: Workflow annotations.
        namespace: The namespace (tenant) to run in.
        parameters: Workflow parameters: name -> default, or ``ir.Parameter`` s.
        parallelism: At most this many steps run at once.
        node_selector: Node labels every step's pod must match.

    Raises:
        UserError: for invalid settings.
    """
    _configure(current_builder(), name=name, user_id=user_id, timeout=timeout,
               time_to_clean=time_to_clean, cluster_config_file=cluster_config_file,
               cron_config=cron_config, service_account=service_account, labels=labels,
               annotations=annotations, namespace=namespace, parameters=parameters,
               parallelism=parallelism, node_selector=node_selector)


def workflow(
    name: str | None = None,
    *,
    parameters: Mapping[str, object] | Iterable[ir.Parameter] | None = None,
    labels: Mapping[str, object] | None = None,
    annotations: Mapping[str, object] | None = None,
    namespace: str | None = None,
    user_id: str | None = None,
    timeout: int | str | None = None,
    time_to_clean: int | str | None = None,
    cron_config: Mapping[str, object] | None = None,
    service_account: str | None = None,
    cluster_config_file: str | None = None,
    parallelism: int | None = None,
) -> WorkflowBuilder:
    """An explicit workflow scope: ``with couler.workflow("name") as wf: ...``.

    Inside the block every API call adds to ``wf``; on exit (also on an
    exception) the previous builder is restored. ``wf.to_ir()`` gives the IR,
    ``wf.to_yaml()`` the Argo YAML, ``wf.parameter(name)`` a parameter handle.

    Args:
        name: The workflow's name; default: the program's file name.
        parameters: Workflow parameters: name -> default, or ``ir.Parameter`` s.
        labels: Workflow labels.
        annotations: Workflow annotations.
        namespace: The namespace (tenant) to run in.
        user_id: Recorded as the label ``couler.io/user-id``.
        timeout: Deadline of the whole workflow.
        time_to_clean: Delete the workflow this long after it finishes.
        cron_config: A schedule, as for :func:`config_workflow`.
        service_account: The service account steps run as.
        cluster_config_file: Cluster hooks, as for :func:`config_workflow`.
        parallelism: At most this many steps run at once.

    Returns:
        The builder, to use as a context manager.
    """
    builder = WorkflowBuilder(name)
    _configure(builder, name=None, user_id=user_id, timeout=timeout, time_to_clean=time_to_clean,
               cluster_config_file=cluster_config_file, cron_config=cron_config,
               service_account=service_account, labels=labels, annotations=annotations,
               namespace=namespace, parameters=parameters, parallelism=parallelism,
               node_selector=None)
    return builder


def _configure(
    b: WorkflowBuilder, *, name: str | None, user_id: str | None, timeout: int | str | None,
    time_to_clean: int | str | None, cluster_config_file: str | None,
    cron_config: Mapping[str, object] | None, service_account: str | None,
    labels: Mapping[str, object] | None, annotations: Mapping[str, object] | None,
    namespace: str | None, parameters: Mapping[str, object] | Iterable[ir.Parameter] | None,
    parallelism: int | None, node_selector: Mapping[str, object] | None,
) -> None:
    cfg = b.config
    if name is not None:
        b.set_name(name)
    if user_id is not None:
        cfg.labels[USER_ID_LABEL] = _label_value(str(user_id))
    if timeout is not None:
        cfg.timeout_seconds = to_seconds(timeout, what="config_workflow timeout")
    if time_to_clean is not None:
        cfg.ttl_seconds = to_seconds(time_to_clean, what="config_workflow time_to_clean")
    if cluster_config_file is not None:
        path = Path(cluster_config_file)
        if not path.is_file():
            raise UserError(f"cluster_config_file {cluster_config_file!r} does not exist")
        cfg.cluster_config_file = str(path.resolve())
    if cron_config is not None:
        cfg.schedule = _cron(cron_config)
    if service_account is not None:
        cfg.service_account = service_account
    cfg.labels.update(freeze_mapping(labels, what="labels"))
    cfg.annotations.update(freeze_mapping(annotations, what="annotations"))
    cfg.node_selector.update(freeze_mapping(node_selector, what="node_selector"))
    if namespace is not None:
        cfg.tenant = namespace
    if parallelism is not None:
        cfg.parallelism = parallelism
    if parameters is not None:
        if isinstance(parameters, Mapping):
            for pname, default in parameters.items():
                b.add_parameter(_parameter(str(pname), default, None, ""))
        else:
            for p in parameters:
                if not isinstance(p, ir.Parameter):
                    raise UserError("parameters must be a dict of name -> default or "
                                    "ir.Parameter objects")
                b.add_parameter(p)


_CRON_KEYS = {
    "schedule": "schedule",
    "timezone": "timezone",
    "concurrency_policy": "concurrency_policy",
    "concurrencypolicy": "concurrency_policy",
    "starting_deadline_seconds": "starting_deadline_seconds",
    "startingdeadlineseconds": "starting_deadline_seconds",
    "successful_jobs_history_limit": "successful_history_limit",
    "successfuljobshistorylimit": "successful_history_limit",
    "failed_jobs_history_limit": "failed_history_limit",
    "failedjobshistorylimit": "failed_history_limit",
    "suspend": "suspend",
}


def _cron(config: Mapping[str, object]) -> ir.CronSchedule:
    if not isinstance(config, Mapping):
        raise UserError("cron_config must be a dict")
    values: dict[str, object] = {}
    for key, value in config.items():
        target = _CRON_KEYS.get(str(key).lower())
        if target is None:
            raise UserError(f"cron_config: unknown key {key!r}; known: "
                            "schedule, timezone, concurrency_policy, starting_deadline_seconds, "
                            "successful_jobs_history_limit, failed_jobs_history_limit, suspend")
        values[target] = value
    schedule = values.get("schedule")
    if not isinstance(schedule, str) or not schedule.strip():
        raise UserError("cron_config needs a 'schedule' such as '0 2 * * *'")
    policy_text = str(values.get("concurrency_policy", "Allow"))
    try:
        policy = ir.ConcurrencyPolicy(policy_text.lower())
    except ValueError as e:
        raise UserError(f"cron_config: concurrency_policy {policy_text!r} is not one of "
                        "Allow, Forbid, Replace") from e
    return ir.CronSchedule(
        schedule=schedule.strip(),
        timezone=str(values.get("timezone") or ""),
        concurrency_policy=policy,
        starting_deadline_seconds=_opt_int(values, "starting_deadline_seconds"),
        successful_history_limit=_opt_int(values, "successful_history_limit"),
        failed_history_limit=_opt_int(values, "failed_history_limit"),
        suspend=_bool(values.get("suspend", False)),
    )


def _opt_int(values: Mapping[str, object], key: str) -> int | None:
    value = values.get(key)
    if value is None:
        return None
    try:
        return int(str(value))
    except ValueError as e:
        raise UserError(f"cron_config: {key} must be an integer, got {value!r}") from e


def _bool(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _label_value(text: str) -> str:
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return value.strip("-_.")


def config_defaults(name_salter: Callable[[str], str] | None = None,
                    service_account: str | None = None) -> None:
    """Set defaults for the workflows built afterwards in this context (thread / task).

    Args:
        name_salter: Maps a workflow name to the name used, e.g. to append a
            random suffix. Couler adds no suffix by default: names are
            deterministic.
        service_account: The service account of workflows that set none.
    """
    current = get_defaults()
    set_defaults(Defaults(
        name_salter=name_salter if name_salter is not None else current.name_salter,
        service_account=service_account if service_account is not None
        else current.service_account,
    ))


# --------------------------------------------------------------------------- parameters


_PY_TYPES: dict[object, ir.ValueType] = {
    str: ir.ValueType.STRING, int: ir.ValueType.INT, float: ir.ValueType.FLOAT,
    bool: ir.ValueType.BOOL, list: ir.ValueType.LIST, tuple: ir.ValueType.LIST,
    dict: ir.ValueType.JSON,
}


def _parameter(name: str, default: object, type: object, description: str) -> ir.Parameter:
    if type is None:
        vtype = ir.type_of(default) if default is not None else ir.ValueType.STRING
    elif isinstance(type, ir.ValueType):
        vtype = type
    elif type in _PY_TYPES:
        vtype = _PY_TYPES[type]
    elif isinstance(type, str):
        try:
            vtype = ir.ValueType(type.lower())
        except ValueError as e:
            raise UserError(f"parameter {name!r}: unknown type {type!r}; use one of "
                            f"{[t.value for t in ir.ValueType]}") from e
    else:
        raise UserError(f"parameter {name!r}: unknown type {type!r}")
    lit = None
    if default is not None:
        try:
            lit = ir.Literal.of(list(default) if isinstance(default, tuple) else default)
        except (TypeError, ValueError) as e:
            raise UserError(f"parameter {name!r}: default {default!r} is not "
                            "JSON-compatible") from e
        if not ir.assignable(lit.type, vtype):
            raise UserError(f"parameter {name!r}: default {default!r} is not of type {vtype.value}")
    return ir.Parameter(name=name, type=vtype, default=lit, description=description)


def workflow_parameter(name: str, default: object = None, type: object = None,
                       description: str = "") -> WorkflowParam:
    """Declare a workflow parameter and get a handle to it.

    The handle can be passed as a step argument, as a ``when`` operand or as
    the source of a ``map``; the value is chosen when the workflow is run.

    Args:
        name: The parameter's name.
        default: Its default value (JSON-compatible).
        type: ``int``, ``float``, ``str``, ``bool``, ``list``, ``dict``, an
            ``ir.ValueType`` or its name; default: the default value's type.
        description: Shown to users of the workflow.

    Returns:
        The parameter handle. With only a name, for a parameter declared already (e.g. by
        ``config_workflow(parameters=...)``), the handle of that one.
    """
    b = current_builder()
    if default is None and type is None and not description and name in b.parameter_names():
        return b.parameter(name)
    return b.add_parameter(_parameter(name, default, type, description))


# --------------------------------------------------------------------------- cluster settings


def add_volume(volume: Volume) -> None:
    """Make an existing PersistentVolumeClaim available to the workflow's steps."""
    if not isinstance(volume, Volume):
        raise UserError("add_volume needs couler.Volume(name, claim_name)")
    _add_volume(volume.to_ir())


def create_workflow_volume(volume_claim_template: VolumeClaimTemplate) -> None:
    """Create a PersistentVolumeClaim for each run of the workflow."""
    if not isinstance(volume_claim_template, VolumeClaimTemplate):
        raise UserError("create_workflow_volume needs couler.VolumeClaimTemplate(...)")
    _add_volume(volume_claim_template.to_ir())


def _add_volume(volume: ir.Volume) -> None:
    cfg = current_builder().config
    if any(v.name == volume.name for v in cfg.volumes):
        if volume in cfg.volumes:
            return
        raise UserError(f"volume {volume.name!r} is declared twice with different settings")
    cfg.volumes.append(volume)


def add_toleration(toleration: Toleration | ir.Toleration) -> None:
    """Let every step of the workflow run on nodes with a matching taint."""
    tol = toleration.to_ir() if isinstance(toleration, Toleration) else toleration
    if not isinstance(tol, ir.Toleration):
        raise UserError("add_toleration needs couler.Toleration(key, effect, operator)")
    cfg = current_builder().config
    if tol not in cfg.tolerations:
        cfg.tolerations.append(tol)


def add_image_pull_secret(image_pull_secret: ImagePullSecret | str) -> None:
    """Use a registry secret to pull the workflow's images."""
    name = image_pull_secret.name if isinstance(image_pull_secret, ImagePullSecret) \
        else str(image_pull_secret)
    cfg = current_builder().config
    if name not in cfg.image_pull_secrets:
        cfg.image_pull_secrets.append(name)


def set_dns(dns_policy: str | None = None, dns_config: DnsConfig | None = None) -> None:
    """Set the pods' DNS policy (e.g. ``"None"``, ``"ClusterFirst"``) and configuration."""
    config = dns_config or DnsConfig()
    current_builder().config.dns = config.to_ir(dns_policy or "")


_SECURITY_KEYS = {
    "runasuser": "run_as_user", "run_as_user": "run_as_user",
    "runasgroup": "run_as_group", "run_as_group": "run_as_group",
    "fsgroup": "fs_group", "fs_group": "fs_group",
    "runasnonroot": "run_as_non_root", "run_as_non_root": "run_as_non_root",
    "selinuxoptions": "se_linux_options", "se_linux_options": "se_linux_options",
}
_SE_LINUX_KEYS = ("user", "role", "type", "level")


def set_security_context(security_context: Mapping[str, object] | ir.SecurityContext) -> None:
    """Set the pods' security context, as Kubernetes spells it: ``{"runAsUser": 1000,
    "runAsGroup": 3000, "fsGroup": 2000, "runAsNonRoot": True, "seLinuxOptions": {"level":
    "s0:c123,c456"}}`` (``seLinuxOptions`` takes ``user``, ``role``, ``type``, ``level``).

    Raises:
        UserError: An unsupported key or a value of the wrong type, named.
    """
    if isinstance(security_context, ir.SecurityContext):
        current_builder().config.security_context = security_context
        return
    if not isinstance(security_context, Mapping):
        raise UserError("set_security_context needs a dict such as {'runAsUser': 1000}")
    ids: dict[str, int] = {}
    non_root: bool | None = None
    se_linux: ir.SELinuxOptions | None = None
    for key, value in security_context.items():
        target = _SECURITY_KEYS.get(str(key).lower())
        if target is None:
            raise UserError(f"set_security_context: unsupported key {key!r}; supported: "
                            "runAsUser, runAsGroup, fsGroup, runAsNonRoot, seLinuxOptions")
        if target == "run_as_non_root":
            non_root = _bool(value)
        elif target == "se_linux_options":
            se_linux = _se_linux(value)
        else:
            try:
                ids[target] = int(str(value))
            except ValueError as e:
                raise UserError(f"set_security_context: {key} must be an integer") from e
    current_builder().config.security_context = ir.SecurityContext(
        run_as_user=ids.get("run_as_user"), run_as_group=ids.get("run_as_group"),
        fs_group=ids.get("fs_group"), run_as_non_root=non_root, se_linux_options=se_linux)


def _se_linux(value: object) -> ir.SELinuxOptions:
    if not isinstance(value, Mapping):
        raise UserError("set_security_context: seLinuxOptions must be a dict such as "
                        "{'level': 's0:c123,c456'}")
    unknown = sorted(str(k) for k in value if k not in _SE_LINUX_KEYS)
    if unknown:
        raise UserError(f"set_security_context: seLinuxOptions has unsupported key(s) "
                        f"{', '.join(map(repr, unknown))}; supported: "
                        f"{', '.join(_SE_LINUX_KEYS)}")
    bad = [k for k in _SE_LINUX_KEYS if k in value and not isinstance(value[k], str)]
    if bad:
        raise UserError(f"set_security_context: seLinuxOptions.{bad[0]} must be a string")
    return ir.SELinuxOptions(**{k: str(value.get(k, "")) for k in _SE_LINUX_KEYS})
