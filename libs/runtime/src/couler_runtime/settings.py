"""Service settings from environment variables, validated once at start.

Every service reads its settings in ``main.py`` with ``XxxSettings.load("xxx")``, where
``XxxSettings`` subclasses :class:`CommonSettings` to add its own fields. A variable is named
``COULER_<FIELD>`` (e.g. ``COULER_NATS_URL``); a bad value fails the start with a
:class:`SettingsError` whose message names the variable::

    COULER_NATS_URL: scheme must be one of nats, tls, ws, wss (got 'http://x:4222')

Secrets (``COULER_AUTH_TOKEN``, ``COULER_S3_ACCESS_KEY``, ``COULER_S3_SECRET_KEY``,
``COULER_NATS_SEED``) are ``SecretStr`` and never appear in ``repr``/``str``/logs; passwords
inside URLs are masked in ``repr`` and in error messages too.

The bus is authenticated by default: a service needs its NATS identity (``COULER_NATS_SEED_FILE``
or ``COULER_NATS_SEED``, and ``COULER_NATS_TRUST_FILE``, all made by ``couler credentials init``
and by ``couler up``); only ``COULER_BUS_INSECURE=true`` runs it on an open bus (tests of a
single component). ``COULER_NATS_TLS_CA`` makes the connection TLS, verified with that CA.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from couler.errors import UserError

__all__ = ["ENV_PREFIX", "CommonSettings", "S3Location", "SettingsError", "check_endpoint",
           "redact_url"]

ENV_PREFIX = "COULER_"

_SERVICE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
# S3 bucket naming rules (AWS): 3-63 characters, lowercase letters, digits, dots and hyphens,
# starting and ending with a letter or digit.
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_NATS_SCHEMES = ("nats", "tls", "ws", "wss")
_SQL_BACKENDS = ("sqlite", "postgresql")

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class SettingsError(UserError):
    """One or more settings are invalid; the message names every bad variable."""


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs and error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return parts._replace(netloc=f"{user}@{netloc[-1]}").geturl()


def check_endpoint(value: str) -> str:
    """``value`` when it is ``host:port`` or ``http(s)://host:port`` (an OTLP collector, an
    S3 endpoint); ValueError saying what is expected otherwise."""
    parts = urlsplit(value if "://" in value else f"http://{value}")
    try:
        _ = parts.port  # ValueError when it is not a port number
    except ValueError:
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be host:port or http(s)://host:port (got {value!r})")
    return value


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "couler"


class S3Location:
    """The bucket and key prefix of an ``s3://bucket/prefix`` artifacts setting."""

    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    @classmethod
    def parse(cls, value: str) -> S3Location:
        """Parse ``s3://bucket[/prefix]``; raises ValueError on a bad bucket name."""
        parts = urlsplit(value)
        bucket = parts.netloc
        if not _BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
            raise ValueError(
                f"invalid bucket name {bucket!r} in {value!r} (3-63 characters: lowercase "
                "letters, digits, '.' and '-', starting and ending with a letter or digit)"
            )
        return cls(bucket, parts.path)

    def __repr__(self) -> str:
        return f"S3Location(bucket={self.bucket!r}, prefix={self.prefix!r})"


class CommonSettings(BaseSettings):
    """Settings every service shares; subclass to add a service's own fields.

    Attributes:
        service: The service's name (set by :meth:`load`, not from the environment).
        nats_url: NATS server URL(s), comma-separated (``COULER_NATS_URL``).
        database_url: SQLAlchemy URL; defaults to ``sqlite:///<state_dir>/<service>.db``.
        artifacts: A local directory (default ``<state_dir>/artifacts``) or
            ``s3://bucket[/prefix]`` together with the ``s3_*`` settings.
        s3_endpoint: ``host:port`` or ``http(s)://host:port`` of the S3 server.
        s3_access_key: S3 access key (secret).
        s3_secret_key: S3 secret key (secret).
        grpc_address: ``host:port`` the gRPC server listens on.
        auth_token: Bearer token required by the gRPC server when set (secret).
        otel_endpoint: OTLP endpoint for traces; tracing export is off when unset.
        state_dir: Directory for local state (SQLite databases, artifacts, logs).
        log_level: ``DEBUG`` .. ``CRITICAL``.
        nats_identity: The service's identity on the bus (default: the service's name).
        nats_seed_file: A file holding the identity's nkey seed (mode 0600).
        nats_seed: The seed itself (secret), instead of a file.
        nats_trust_file: The public keys of every identity (``trust.json``), which
            signatures of received messages are checked against.
        nats_tls_ca: A CA certificate: connect with TLS and verify the server with it.
        bus_insecure: Run on an open bus: no identity, no signatures (tests only).
        inline_payload_bytes: Bodies larger than this travel by reference (stored in the
            artifact store's ``payloads/``).
        grpc_max_message_bytes: The largest gRPC message received or sent.
        metrics_address: ``host:port`` of the Prometheus ``/metrics`` endpoint; off when
            empty (the default). Scrapes need ``auth_token`` as a bearer token.
        metrics_anonymous: Let scrapes in without the token; allowed on a loopback
            ``metrics_address`` only.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", case_sensitive=False, validate_default=True
    )

    service: str = "couler"
    nats_url: str = "nats://127.0.0.1:4222"
    database_url: str = ""
    artifacts: str = ""
    s3_endpoint: str | None = None
    s3_access_key: SecretStr | None = None
    s3_secret_key: SecretStr | None = None
    grpc_address: str = "127.0.0.1:50051"
    auth_token: SecretStr | None = None
    otel_endpoint: str | None = None
    state_dir: Path = Path()
    log_level: LogLevel = "INFO"
    nats_identity: str = ""
    nats_seed_file: Path | None = None
    nats_seed: SecretStr | None = None
    nats_trust_file: Path | None = None
    nats_tls_ca: Path | None = None
    bus_insecure: bool = False
    inline_payload_bytes: int = Field(default=64 * 1024, ge=1024, le=512 * 1024)
    grpc_max_message_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024,
                                        le=2**31 - 1)
    metrics_address: str = ""
    metrics_anonymous: bool = False

    @classmethod
    def load(cls, service: str, **overrides: Any) -> Self:
        """Read and validate the settings of ``service`` from the environment.

        Args:
            service: The service's name (lowercase identifier); it names the default
                SQLite file and the service's migration version table.
            **overrides: Values that take precedence over the environment (tests, CLI flags).

        Raises:
            SettingsError: Naming every invalid variable.
        """
        if not _SERVICE_NAME.fullmatch(service):
            raise SettingsError(
                f"service name {service!r} must be a lowercase identifier (letters, digits, _)"
            )
        try:
            return cls(service=service, **overrides)
        except ValidationError as e:
            # ``from None``: pydantic's own message repeats the raw input values, which may
            # hold credentials; ours names the variable and masks them.
            raise SettingsError(_describe(e)) from None

    @field_validator("state_dir", mode="before")
    @classmethod
    def _state_dir(cls, value: Any) -> Any:
        if value in ("", None) or value == Path():
            return _default_state_dir()
        return Path(str(value)).expanduser()

    @field_validator("nats_url")
    @classmethod
    def _nats_url(cls, value: str) -> str:
        for one in value.split(","):
            parts = urlsplit(one.strip())
            if parts.scheme not in _NATS_SCHEMES:
                raise ValueError(
                    f"scheme must be one of {', '.join(_NATS_SCHEMES)} (got {redact_url(one)!r})"
                )
            if not parts.hostname:
                raise ValueError(f"no host in {redact_url(one)!r}")
            _ = parts.port  # raises ValueError on a non-numeric or out-of-range port
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        if not value:
            return value
        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError(f"not a database URL: {redact_url(value)!r}") from None
        if url.get_backend_name() not in _SQL_BACKENDS:
            raise ValueError(
                f"backend must be sqlite or postgresql (got {url.get_backend_name()!r})"
            )
        return value

    @field_validator("artifacts")
    @classmethod
    def _artifacts(cls, value: str) -> str:
        if value.startswith("s3://"):
            S3Location.parse(value)
        elif "://" in value:
            raise ValueError(
                f"must be a local directory or s3://bucket/prefix (got {redact_url(value)!r})"
            )
        return value

    @field_validator("grpc_address")
    @classmethod
    def _grpc_address(cls, value: str) -> str:
        return _host_port(value)

    @field_validator("metrics_address")
    @classmethod
    def _metrics_address(cls, value: str) -> str:
        if value:
            _host_port(value)
        return value

    @field_validator("otel_endpoint", "s3_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        return check_endpoint(value)

    @field_validator("nats_seed_file", "nats_trust_file", "nats_tls_ca", mode="before")
    @classmethod
    def _optional_path(cls, value: Any) -> Any:
        return None if value in ("", None) else value

    @field_validator("nats_seed", mode="before")
    @classmethod
    def _optional_secret(cls, value: Any) -> Any:
        return None if value in ("", None) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _bus_identity(self) -> Self:
        if not self.nats_identity:
            self.nats_identity = self.service
        if self.bus_insecure:
            return self
        missing = []
        if self.nats_seed_file is None and self.nats_seed is None:
            missing.append(f"{ENV_PREFIX}NATS_SEED_FILE (or {ENV_PREFIX}NATS_SEED)")
        if self.nats_trust_file is None:
            missing.append(f"{ENV_PREFIX}NATS_TRUST_FILE")
        if missing:
            raise ValueError(
                f"{' and '.join(missing)}: required, the service's identity on the bus "
                f"(`couler credentials init DIR` makes them; `couler up` does it itself); "
                f"{ENV_PREFIX}BUS_INSECURE=true runs on an open bus, for tests only")
        return self

    @model_validator(mode="after")
    def _metrics_auth(self) -> Self:
        if not self.metrics_address:
            return self
        if self.metrics_anonymous:
            host = self.metrics_address.rpartition(":")[0].strip("[]")
            if not _loopback(host):
                raise ValueError(
                    f"{ENV_PREFIX}METRICS_ANONYMOUS: anonymous scrapes are allowed on a "
                    f"loopback address only ({ENV_PREFIX}METRICS_ADDRESS is "
                    f"{self.metrics_address!r}); set {ENV_PREFIX}AUTH_TOKEN and scrape "
                    f"with it instead")
        elif self.auth_token is None:
            raise ValueError(
                f"{ENV_PREFIX}METRICS_ADDRESS: the metrics endpoint needs {ENV_PREFIX}AUTH_TOKEN "
                f"(scrapes send it as a bearer token); {ENV_PREFIX}METRICS_ANONYMOUS=true "
                f"serves it without one on a loopback address")
        return self

    @model_validator(mode="after")
    def _defaults_and_s3(self) -> Self:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.state_dir / f'{self.service}.db'}"
        if not self.artifacts:
            self.artifacts = str(self.state_dir / "artifacts")
        if self.artifacts.startswith("s3://"):
            missing = [
                f"{ENV_PREFIX}{name.upper()}"
                for name in ("s3_endpoint", "s3_access_key", "s3_secret_key")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(
                    f"{', '.join(missing)}: required when {ENV_PREFIX}ARTIFACTS is "
                    f"{self.artifacts!r}"
                )
        return self

    @property
    def s3_location(self) -> S3Location | None:
        """The bucket and prefix when artifacts live in S3, else None."""
        return S3Location.parse(self.artifacts) if self.artifacts.startswith("s3://") else None

    @field_serializer("database_url", "nats_url", when_used="json")
    def _mask_url(self, value: str) -> str:
        return redact_url(value)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name in ("database_url", "nats_url") and isinstance(value, str):
                yield name, redact_url(value)
            else:
                yield name, value


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be host:port with a port 0-65535 (got {value!r})")
    return value


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        msg = str(item["msg"]).removeprefix("Value error, ")
        loc = item["loc"]
        if loc:
            lines.append(f"{ENV_PREFIX}{str(loc[0]).upper()}: {msg}")
        else:
            lines.append(msg)  # model-level checks name their variables themselves
    return "invalid settings:\n  " + "\n  ".join(lines) if len(lines) > 1 else lines[0]
