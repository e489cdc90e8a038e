"""Secrets: references in the IR, values only in the builder's memory until submit time."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from couler.api.builder import current_builder
from couler.api.handles import Secret
from couler.errors import UserError

__all__ = ["SecretSpec", "create_secret", "get_secret", "obtain_secret"]

_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


@dataclass(frozen=True)
class SecretSpec:
    """What :func:`create_secret` / :func:`obtain_secret` register (values hidden from repr)."""

    values: dict[str, str] | None = field(repr=False)
    keys: tuple[str, ...] = ()
    namespace: str = "default"
    name: str | None = None
    dry_run: bool = False
    artifact_secret: bool = False


def create_secret(  # noqa: PLR0917 - the SDK's positional signature
    secret_data: Mapping[str, object],
    namespace: str = "default",
    name: str | None = None,
    dry_run: bool = False,
    use_existing: bool = False,
    artifact_secret: bool = False,
) -> Secret:
    """Register a secret whose keys steps can read as environment variables.

    The values are kept only in the current workflow builder's memory and are
    handed to the submitter, which creates the Kubernetes Secret at submit
    time. The IR holds only references (secret name and key). The same data
    registered twice gives the same secret.

    Args:
        secret_data: Key -> value; values are converted with ``str``.
        namespace: Namespace recorded with the secret. Submitters create it in
            the namespace the workflow runs in.
        name: The secret's name; default ``<workflow>-secret-<n>`` (creation
            order, no hash of the values).
        dry_run: Do not create the secret at submit time (it must exist).
        use_existing: Treat the secret as existing (like :func:`obtain_secret`);
            the values are not kept.
        artifact_secret: Marks credentials of an artifact store.

    Returns:
        The secret handle; pass it as ``secret=`` to ``run_container`` and friends.

    Raises:
        UserError: for an empty mapping or keys Kubernetes rejects.
    """
    if not isinstance(secret_data, Mapping) or not secret_data:
        raise UserError("create_secret needs a non-empty dict of key -> value")
    values = {str(k): str(v) for k, v in secret_data.items()}
    _check_keys(values)
    if use_existing:
        return obtain_secret(list(values), namespace=namespace, name=name, dry_run=dry_run)
    spec = SecretSpec(values=values, keys=tuple(values), namespace=namespace,
                      name=_check_name(name), dry_run=dry_run, artifact_secret=artifact_secret)
    return current_builder().add_secret(spec)


def obtain_secret(
    secret_keys: Sequence[str],
    namespace: str = "default",
    name: str | None = None,
    dry_run: bool = False,
) -> Secret:
    """Reference an existing Kubernetes secret by name and keys.

    Args:
        secret_keys: The keys steps will read.
        namespace: Namespace recorded with the reference.
        name: The existing secret's name (required).
        dry_run: Accepted for compatibility; an existing secret is never created.

    Returns:
        The secret handle.

    Raises:
        UserError: without a name or keys.
    """
    if not name:
        raise UserError("obtain_secret needs the name of the existing secret")
    if isinstance(secret_keys, str) or not secret_keys:
        raise UserError("obtain_secret needs a list of keys")
    keys = tuple(str(k) for k in secret_keys)
    _check_keys(dict.fromkeys(keys, ""))
    spec = SecretSpec(values=None, keys=keys, namespace=namespace, name=_check_name(name),
                      dry_run=dry_run)
    return current_builder().add_secret(spec)


def get_secret(name: str) -> Secret:
    """The secret registered earlier in the current workflow under ``name``.

    Args:
        name: The secret's name (``str()`` of what ``create_secret`` or
            ``obtain_secret`` returned).

    Returns:
        The secret handle; pass it as ``secret=`` to ``run_container`` and friends.

    Raises:
        UserError: if the current workflow has no secret called ``name``.
    """
    return current_builder().secret(str(name))


def _check_keys(values: Mapping[str, str]) -> None:
    bad = [k for k in values if not _KEY.match(k)]
    if bad:
        raise UserError(f"secret keys {bad} are not valid: use letters, digits, '-', '_' and '.'")


def _check_name(name: str | None) -> str | None:
    if name is None:
        return None
    if not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name):
        raise UserError(f"secret name {name!r} is not a valid Kubernetes name (DNS-1123)")
    return name
