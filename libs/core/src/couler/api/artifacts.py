"""Artifacts: what a step writes (``output=``) or reads (``input=``).

``create_parameter_artifact`` declares an output *parameter* read from a file;
the other constructors declare files or directories kept in an artifact store.
Names are ``output-<i>`` by position in the step's ``output`` list unless given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from couler import ir
from couler.api.handles import LocationDraft, Secret
from couler.api.secrets import create_secret
from couler.errors import UserError

__all__ = [
    "Artifact",
    "FileArtifact",
    "LocalArtifact",
    "OssArtifact",
    "ParameterArtifact",
    "S3Artifact",
    "create_local_artifact",
    "create_oss_artifact",
    "create_parameter_artifact",
    "create_s3_artifact",
]


@dataclass(frozen=True)
class ParameterArtifact:
    """An output parameter whose value is the contents of the file at ``path``."""

    path: str
    is_global: bool = False
    name: str | None = None
    type: str = "parameters"


@dataclass(frozen=True)
class FileArtifact:
    """A file or directory at ``path`` kept in an artifact store."""

    path: str
    is_global: bool = False
    name: str | None = None

    def location(self) -> LocationDraft | None:
        """Where the artifact is stored; None for the engine's default repository."""
        return None


@dataclass(frozen=True)
class LocalArtifact(FileArtifact):
    """An artifact in the engine's default artifact repository."""

    type: str = "local"


@dataclass(frozen=True)
class _RemoteArtifact(FileArtifact):
    bucket: str = ""
    key: str = ""
    endpoint: str = ""
    insecure: bool = False
    credentials: Secret | None = None

    KIND: ClassVar[ir.StorageKind] = ir.StorageKind.DEFAULT

    def location(self) -> LocationDraft:
        return LocationDraft(storage=self.KIND, endpoint=self.endpoint, bucket=self.bucket,
                             key=self.key, insecure=self.insecure, credentials=self.credentials)


@dataclass(frozen=True)
class S3Artifact(_RemoteArtifact):
    """An artifact in an S3-compatible bucket."""

    KIND: ClassVar[ir.StorageKind] = ir.StorageKind.S3
    type: str = "s3"


@dataclass(frozen=True)
class OssArtifact(_RemoteArtifact):
    """An artifact in an Alibaba Cloud OSS bucket."""

    KIND: ClassVar[ir.StorageKind] = ir.StorageKind.OSS
    type: str = "oss"


Artifact = ParameterArtifact | LocalArtifact | S3Artifact | OssArtifact


def create_parameter_artifact(path: str, is_global: bool = False, *,
                              name: str | None = None) -> ParameterArtifact:
    """Declare an output parameter read from the file at ``path`` when the step ends.

    Args:
        path: Absolute path of the file the step writes.
        is_global: Also publish the value as a workflow-level output.
        name: The output's name; default ``output-<i>`` by position in ``output``.

    Returns:
        The artifact; pass it as ``output=`` to a ``run_*`` call.
    """
    return ParameterArtifact(path=_path(path), is_global=is_global, name=name)


def create_local_artifact(path: str, is_global: bool = False, *,
                          name: str | None = None) -> LocalArtifact:
    """Declare a file or directory kept in the engine's default artifact repository.

    Args:
        path: Absolute path the step writes (as output) or reads (as input).
        is_global: Also publish the artifact as a workflow-level output.
        name: The artifact's name; default ``output-<i>`` by position.

    Returns:
        The artifact.
    """
    return LocalArtifact(path=_path(path), is_global=is_global, name=name)


def create_s3_artifact(  # noqa: PLR0917 - the SDK's positional signature
    path: str,
    bucket: str | None = None,
    accesskey_id: str | None = None,
    accesskey_secret: str | None = None,
    key: str | None = None,
    endpoint: str | None = None,
    is_global: bool = False,
    insecure: bool = False,
    *,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    secret: Secret | None = None,
    name: str | None = None,
) -> S3Artifact:
    """Declare an artifact stored in an S3-compatible bucket.

    Credentials given as values (``accesskey_id``/``accesskey_secret`` as in
    the SDK, or ``access_key_id``/``secret_access_key``) become a secret with
    keys ``accessKey`` and ``secretKey``, created at submit time; the IR only
    references it. ``secret=`` uses an existing secret with those keys instead.

    Args:
        path: Absolute path in the step's container.
        bucket: The bucket.
        accesskey_id: Access key id (SDK spelling).
        accesskey_secret: Secret access key (SDK spelling).
        key: Object key in the bucket.
        endpoint: The S3 endpoint, e.g. ``s3.amazonaws.com`` or ``minio:9000``.
        is_global: Also publish the artifact as a workflow-level output.
        insecure: Use plain HTTP.
        access_key_id: Access key id.
        secret_access_key: Secret access key.
        secret: A secret (from ``create_secret``/``obtain_secret``) holding
            ``accessKey`` and ``secretKey``.
        name: The artifact's name; default ``output-<i>`` by position.

    Returns:
        The artifact.
    """
    creds = _credentials(access_key_id or accesskey_id, secret_access_key or accesskey_secret,
                         secret)
    return S3Artifact(path=_path(path), is_global=is_global, name=name, bucket=bucket or "",
                      key=key or "", endpoint=endpoint or "", insecure=insecure, credentials=creds)


def create_oss_artifact(  # noqa: PLR0917 - the SDK's positional signature
    path: str,
    bucket: str | None = None,
    accesskey_id: str | None = None,
    accesskey_secret: str | None = None,
    key: str | None = None,
    endpoint: str | None = None,
    is_global: bool = False,
    *,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    secret: Secret | None = None,
    name: str | None = None,
) -> OssArtifact:
    """Declare an artifact stored in an Alibaba Cloud OSS bucket.

    Same credential handling as :func:`create_s3_artifact`. Unlike the SDK
    there is no default endpoint.

    Args:
        path: Absolute path in the step's container.
        bucket: The bucket.
        accesskey_id: Access key id (SDK spelling).
        accesskey_secret: Access key secret (SDK spelling).
        key: Object key in the bucket.
        endpoint: The OSS endpoint.
        is_global: Also publish the artifact as a workflow-level output.
        access_key_id: Access key id.
        secret_access_key: Access key secret.
        secret: A secret holding ``accessKey`` and ``secretKey``.
        name: The artifact's name; default ``output-<i>`` by position.

    Returns:
        The artifact.
    """
    creds = _credentials(access_key_id or accesskey_id, secret_access_key or accesskey_secret,
                         secret)
    return OssArtifact(path=_path(path), is_global=is_global, name=name, bucket=bucket or "",
                       key=key or "", endpoint=endpoint or "", credentials=creds)


def _path(path: str) -> str:
    if not isinstance(path, str) or not path:
        raise UserError(f"an artifact needs a path, got {path!r}")
    return path


def _credentials(access_key: str | None, secret_key: str | None,
                 secret: Secret | None) -> Secret | None:
    if secret is not None:
        if access_key or secret_key:
            raise UserError("give artifact credentials either as values or as secret=, not both")
        return secret
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise UserError("artifact credentials need both the access key id and the secret key")
    return create_secret({"accessKey": access_key, "secretKey": secret_key},
                         artifact_secret=True)
