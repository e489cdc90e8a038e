"""What ``couler up`` passes to its services and what it refuses (no processes here)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from couler.errors import UserError
from couler.stack_admin import tls_requested
from couler_runtime.stack import check_secrets_file, stack_decided, user_settings
from couler_runtime.supervisor import backoff_delay, describe_exit


def test_the_users_settings_pass_and_the_stacks_own_do_not() -> None:
    environ = {
        "COULER_OTEL_ENDPOINT": "http://127.0.0.1:4317",
        "COULER_SECRETS_FILE": "/etc/couler/secrets.json",
        "COULER_CACHE_BUDGET_BYTES": "1000",
        "COULER_MAX_STEPS_PER_CHUNK": "2",
        "COULER_DATABASE_URL": "postgresql+psycopg://db/couler",
        "COULER_BUS_INSECURE": "true",
        "COULER_NATS_URL": "nats://elsewhere:4222",
        "COULER_NATS_SEED": "SU...",
        "COULER_NATS_SEED_FILE": "/tmp/x.nk",
        "COULER_NATS_TLS": "true",
        "COULER_STATE_DIR": "/tmp/state",
        "COULER_ARTIFACTS": "s3://bucket",
        "COULER_AUTH_TOKEN": "theirs",
        "COULER_GRPC_ADDRESS": "0.0.0.0:1",
        "COULER_CACHE_ADDRESS": "elsewhere:1",
        "COULER_DASHBOARD_ADDRESS": "0.0.0.0:80",
        "COULER_HOME": "/tmp/home",
        "PATH": "/usr/bin",
    }
    assert user_settings(environ) == {
        "COULER_OTEL_ENDPOINT": "http://127.0.0.1:4317",
        "COULER_SECRETS_FILE": "/etc/couler/secrets.json",
        "COULER_CACHE_BUDGET_BYTES": "1000",
        "COULER_MAX_STEPS_PER_CHUNK": "2",
        "COULER_DATABASE_URL": "postgresql+psycopg://db/couler",
    }
    assert stack_decided("COULER_NATS_TRUST_FILE") and stack_decided("COULER_SUBMITTER_ADDRESS")
    assert not stack_decided("COULER_LOG_LEVEL")


def test_a_secrets_file_must_exist_and_be_private(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.json"
    with pytest.raises(UserError, match=r"secrets file .*secrets\.json: No such file"):
        check_secrets_file(secrets)
    secrets.write_text("{}")
    secrets.chmod(0o644)
    with pytest.raises(UserError, match=r"readable by others \(mode 644\); chmod 600"):
        check_secrets_file(secrets)
    secrets.chmod(0o600)
    assert check_secrets_file(secrets) == secrets.resolve()
    with pytest.raises(UserError, match="not a regular file"):
        check_secrets_file(tmp_path)


def test_backoff_doubles_from_half_a_second_to_thirty() -> None:
    assert [backoff_delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_exits_are_described_for_people() -> None:
    assert describe_exit(2) == "exit status 2"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(None).startswith("exited (status unknown")


def test_tls_is_asked_for_by_flag_or_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COULER_NATS_TLS", raising=False)
    assert tls_requested(False) is None and tls_requested(True) is True
    monkeypatch.setenv("COULER_NATS_TLS", "true")
    assert tls_requested(False) is True
    monkeypatch.setenv("COULER_NATS_TLS", "off")
    assert tls_requested(False) is None
    monkeypatch.setenv("COULER_NATS_TLS", "maybe")
    with pytest.raises(UserError, match="COULER_NATS_TLS='maybe': expected true or false"):
        tls_requested(False)


@pytest.mark.parametrize("endpoint", ["ftp://collector:4317", "http://:4317", "collector:port"])
def test_up_refuses_a_bad_otel_endpoint_before_starting_anything(
        endpoint: str, tmp_path: Path) -> None:
    import io

    from couler.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main(["up", "--home", str(tmp_path / "home"), "--otel-endpoint", endpoint],
                out=out, err=err)
    assert code == 2, err.getvalue()
    assert f"--otel-endpoint: must be host:port or http(s)://host:port (got {endpoint!r})" in (
        err.getvalue())
    assert not (tmp_path / "home").exists()
