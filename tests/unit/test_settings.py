"""Settings come from COULER_* variables, are validated at start and never show secrets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from couler_runtime.settings import CommonSettings, SettingsError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("COULER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    # the bus's identity has tests of its own below; the others are about other settings
    monkeypatch.setenv("COULER_BUS_INSECURE", "true")


class CacheSettings(CommonSettings):
    byte_budget: int = 1 << 30


def test_defaults(tmp_path: Path) -> None:
    s = CommonSettings.load("submitter")
    assert s.service == "submitter"
    assert s.nats_url == "nats://127.0.0.1:4222"
    assert s.state_dir == tmp_path / "xdg" / "couler"
    assert s.database_url == f"sqlite:///{tmp_path / 'xdg' / 'couler' / 'submitter.db'}"
    assert s.artifacts == str(tmp_path / "xdg" / "couler" / "artifacts")
    assert s.s3_location is None
    assert s.auth_token is None and s.otel_endpoint is None
    assert s.log_level == "INFO"


def test_values_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COULER_NATS_URL", "nats://10.1.2.3:4333,nats://10.1.2.4:4333")
    monkeypatch.setenv("COULER_DATABASE_URL", "postgresql+psycopg://couler@db:5432/couler")
    monkeypatch.setenv("COULER_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COULER_GRPC_ADDRESS", "0.0.0.0:50071")
    monkeypatch.setenv("COULER_LOG_LEVEL", "debug")
    monkeypatch.setenv("COULER_OTEL_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("COULER_BYTE_BUDGET", "1024")
    s = CacheSettings.load("cache")
    assert s.nats_url == "nats://10.1.2.3:4333,nats://10.1.2.4:4333"
    assert s.database_url == "postgresql+psycopg://couler@db:5432/couler"
    assert s.state_dir == tmp_path / "state"
    assert s.grpc_address == "0.0.0.0:50071"
    assert s.log_level == "DEBUG"
    assert s.otel_endpoint == "http://collector:4317"
    assert s.byte_budget == 1024  # a service's own field, same prefix
    assert s.artifacts == str(tmp_path / "state" / "artifacts")


def test_s3_artifacts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COULER_ARTIFACTS", "s3://couler-artifacts/prod/cache")
    monkeypatch.setenv("COULER_S3_ENDPOINT", "minio:9000")
    monkeypatch.setenv("COULER_S3_ACCESS_KEY", "AKIAEXAMPLE")
    monkeypatch.setenv("COULER_S3_SECRET_KEY", "wJalrXUtnFEMI-secret")
    s = CommonSettings.load("cache")
    loc = s.s3_location
    assert loc is not None and (loc.bucket, loc.prefix) == ("couler-artifacts", "prod/cache")
    assert s.s3_secret_key is not None
    assert s.s3_secret_key.get_secret_value() == "wJalrXUtnFEMI-secret"


def test_secrets_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COULER_AUTH_TOKEN", "tok-s3cr3t")
    monkeypatch.setenv("COULER_ARTIFACTS", "s3://bucket-1")
    monkeypatch.setenv("COULER_S3_ENDPOINT", "127.0.0.1:9000")
    monkeypatch.setenv("COULER_S3_ACCESS_KEY", "access-s3cr3t")
    monkeypatch.setenv("COULER_S3_SECRET_KEY", "secret-s3cr3t")
    monkeypatch.setenv("COULER_DATABASE_URL", "postgresql+psycopg://u:pw-s3cr3t@db/couler")
    s = CommonSettings.load("cache")
    for text in (repr(s), str(s), s.model_dump_json(), f"{s}"):
        assert "s3cr3t" not in text, text
    assert "postgresql+psycopg://u:***@db/couler" in repr(s)
    assert s.auth_token is not None and s.auth_token.get_secret_value() == "tok-s3cr3t"
    assert s.database_url.endswith("pw-s3cr3t@db/couler")  # the real value stays usable


@pytest.mark.parametrize(("name", "value", "message"), [
    ("COULER_NATS_URL", "http://nats:4222", "COULER_NATS_URL: scheme must be one of"),
    ("COULER_NATS_URL", "nats://host:notaport", "COULER_NATS_URL: "),
    ("COULER_DATABASE_URL", "mysql://db/x", "COULER_DATABASE_URL: backend must be sqlite or"),
    ("COULER_DATABASE_URL", "not a url", "COULER_DATABASE_URL: not a database URL"),
    ("COULER_ARTIFACTS", "gs://bucket/x", "COULER_ARTIFACTS: must be a local directory or s3"),
    ("COULER_ARTIFACTS", "s3://Bad_Bucket", "COULER_ARTIFACTS: invalid bucket name"),
    ("COULER_GRPC_ADDRESS", "localhost", "COULER_GRPC_ADDRESS: must be host:port"),
    ("COULER_GRPC_ADDRESS", "localhost:70000", "COULER_GRPC_ADDRESS: must be host:port"),
    ("COULER_OTEL_ENDPOINT", "ftp://collector", "COULER_OTEL_ENDPOINT: must be host:port"),
    ("COULER_LOG_LEVEL", "chatty", "COULER_LOG_LEVEL: "),
    ("COULER_BYTE_BUDGET", "lots", "COULER_BYTE_BUDGET: "),
])
def test_invalid_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, name: str,
                                          value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        CacheSettings.load("cache")
    assert str(info.value).startswith(message)


def test_every_bad_variable_is_reported_without_secret_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COULER_NATS_URL", "http://u:pw-s3cr3t@nats:4222")
    monkeypatch.setenv("COULER_GRPC_ADDRESS", "nope")
    with pytest.raises(SettingsError) as info:
        CommonSettings.load("cache")
    text = str(info.value)
    assert text.startswith("invalid settings:")
    assert "COULER_NATS_URL: scheme must be one of nats, tls, ws, wss " \
           "(got 'http://u:***@nats:4222')" in text
    assert "COULER_GRPC_ADDRESS: must be host:port" in text
    assert "s3cr3t" not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_s3_artifacts_need_endpoint_and_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COULER_ARTIFACTS", "s3://bucket-1/p")
    monkeypatch.setenv("COULER_S3_ACCESS_KEY", "k")
    with pytest.raises(SettingsError, match=r"^COULER_S3_ENDPOINT, COULER_S3_SECRET_KEY: "
                                            r"required when COULER_ARTIFACTS is"):
        CommonSettings.load("cache")


def test_overrides_win_and_service_name_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COULER_LOG_LEVEL", "ERROR")
    assert CommonSettings.load("monitor", log_level="warning").log_level == "WARNING"
    with pytest.raises(SettingsError, match="service name 'Monitor!' must be a lowercase"):
        CommonSettings.load("Monitor!")


def test_bus_identity_required_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COULER_BUS_INSECURE")
    with pytest.raises(SettingsError) as err:
        CommonSettings.load("optimizer")
    text = str(err.value)
    assert "COULER_NATS_SEED_FILE" in text and "COULER_NATS_TRUST_FILE" in text
    assert "couler credentials init" in text and "COULER_BUS_INSECURE" in text


def test_bus_identity_from_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from couler_runtime.bus_keys import BusFiles
    from couler_runtime.service import bus_security

    files = BusFiles.create(tmp_path / "bus")
    monkeypatch.delenv("COULER_BUS_INSECURE")
    monkeypatch.setenv("COULER_NATS_SEED_FILE", str(files.seed_file("optimizer")))
    monkeypatch.setenv("COULER_NATS_TRUST_FILE", str(files.trust_file))
    s = CommonSettings.load("optimizer")
    assert s.nats_identity == "optimizer"
    identity, trust, tls = bus_security(s)
    assert identity is not None and identity.name == "optimizer"
    assert trust is not None and identity.public_key == trust.public_keys["optimizer"]
    assert tls is None
    assert "SU" not in repr(s) and "SU" not in repr(identity)  # the seed is never shown


def test_bus_seed_value_is_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from couler_runtime.bus_keys import BusFiles

    files = BusFiles.create(tmp_path / "bus")
    seed = files.seed_file("cache").read_text().strip()
    monkeypatch.delenv("COULER_BUS_INSECURE")
    monkeypatch.setenv("COULER_NATS_SEED", seed)
    monkeypatch.setenv("COULER_NATS_TRUST_FILE", str(files.trust_file))
    s = CommonSettings.load("cache")
    assert seed not in repr(s) and seed not in str(s)
    assert seed not in s.model_dump_json()


def test_bus_seed_file_too_open_is_refused(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    from couler_runtime.bus_keys import BusFiles
    from couler_runtime.service import bus_security

    files = BusFiles.create(tmp_path / "bus")
    files.seed_file("monitor").chmod(0o644)
    monkeypatch.setenv("COULER_NATS_SEED_FILE", str(files.seed_file("monitor")))
    monkeypatch.setenv("COULER_NATS_TRUST_FILE", str(files.trust_file))
    with pytest.raises(SettingsError, match="readable by others"):
        bus_security(CommonSettings.load("monitor"))
