"""`couler run` with secrets: values the program created, a secrets file, and a missing secret."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import textwrap
from pathlib import Path

import pytest

from couler.cli import main

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-5e4c1b-never-shown"
PASSWORD = "pw-81f2aa-never-shown"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def checker(var: str, value: str) -> str:
    """Script text that prints "ok" when ``$var`` holds ``value`` (compared by hash only)."""
    return (f"import hashlib, os\n"
            f"seen = hashlib.sha256(os.environ.get({var!r}, '').encode()).hexdigest()\n"
            f"print('ok' if seen == {sha(value)!r} else 'mismatch')\n")


def write_program(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "wf.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def files_text(directory: Path) -> str:
    return "".join(p.read_text(encoding="utf-8", errors="replace")
                   for p in directory.rglob("*") if p.is_file())


@pytest.fixture(autouse=True)
def _no_secrets_file_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COULER_SECRETS_FILE", raising=False)


def test_secret_created_by_the_program_reaches_the_step_and_nothing_else(tmp_path: Path) -> None:
    prog = write_program(tmp_path, f"""
        import couler.argo as couler

        couler.config_workflow(name="created-secret")
        creds = couler.create_secret(secret_data={{"API_TOKEN": {TOKEN!r}}}, dry_run=True)
        couler.run_script(image="python:3.12", source={checker("API_TOKEN", TOKEN)!r},
                          secret=creds, step_name="check")
    """)
    # The program's own text holds the value; the run directory must not.
    runs = tmp_path / "runs"
    status, out, err = run_cli("run", str(prog), "--json", "--work-dir", str(runs))
    assert status == 0, err
    record = json.loads(out)
    (check,) = [s for s in record["steps"] if s["step"] == "check"]
    assert check["state"] == "succeeded" and check["outputs"]["result"] == "ok"
    run_dir = runs / record["run_id"]
    assert (run_dir / "run.json").is_file() and (run_dir / "run.journal").is_file()
    for text in (out, err, files_text(run_dir)):
        assert TOKEN not in text


def test_secrets_file_supplies_obtained_secrets(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    prog = write_program(tmp_path, f"""
        import couler.argo as couler

        couler.config_workflow(name="obtained-secret")
        creds = couler.obtain_secret(["DB_PASSWORD"], name="db-creds")
        couler.run_script(image="python:3.12", source={checker("DB_PASSWORD", PASSWORD)!r},
                          secret=creds, step_name="check")
    """)
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"db-creds": {"DB_PASSWORD": PASSWORD}}), encoding="utf-8")
    runs = tmp_path / "runs"
    status, out, err = run_cli("run", str(prog), "--json", "--work-dir", str(runs),
                               "--secrets-file", str(secrets))
    assert status == 0, err
    record = json.loads(out)
    assert [s["outputs"]["result"] for s in record["steps"] if s["step"] == "check"] == ["ok"]
    for text in (out, err, files_text(runs)):
        assert PASSWORD not in text

    monkeypatch.setenv("COULER_SECRETS_FILE", str(secrets))  # the same, from the environment
    status, out, err = run_cli("run", str(prog), "--json", "--work-dir", str(runs))
    assert status == 0, err
    assert json.loads(out)["state"] == "succeeded"


def test_a_missing_secret_says_how_to_provide_it(tmp_path: Path) -> None:
    prog = write_program(tmp_path, f"""
        import couler.argo as couler

        couler.config_workflow(name="missing-secret")
        creds = couler.obtain_secret(["DB_PASSWORD"], name="db-creds")
        couler.run_script(image="python:3.12", source={checker("DB_PASSWORD", PASSWORD)!r},
                          secret=creds, step_name="check")
    """)
    status, out, err = run_cli("run", str(prog), "--json", "--work-dir", str(tmp_path / "runs"))
    assert status == 1
    (check,) = [s for s in json.loads(out)["steps"] if s["step"] == "check"]
    assert check["state"] == "failed" and check["attempts"] == 1
    message = check["message"]
    assert "secret 'db-creds' key 'DB_PASSWORD' is not in the local engine's secrets" in message
    assert "--secrets-file FILE" in message and "COULER_SECRETS_FILE" in message
    assert '{"db-creds": {"DB_PASSWORD": "value"}}' in message
    assert "--secrets-file" in err  # the progress line shows it too

    # Given the value, a retry runs the failed step.
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"db-creds": {"DB_PASSWORD": PASSWORD}}), encoding="utf-8")
    run_dir = tmp_path / "runs" / json.loads(out)["run_id"]
    status, out, err = run_cli("retry", str(run_dir), "--json", "--secrets-file", str(secrets))
    assert status == 0, err
    assert json.loads(out)["state"] == "succeeded"
    for text in (out, err, files_text(run_dir)):
        assert PASSWORD not in text


@pytest.mark.parametrize(("content", "problem"), [
    ("{not json " + PASSWORD, "not valid JSON"),
    (json.dumps(["db-creds"]), "expected a JSON object"),
    (json.dumps({"db-creds": PASSWORD}), "secret 'db-creds': expected an object"),
    (json.dumps({"db-creds": {"K": [PASSWORD]}}), "secret 'db-creds', key 'K': the value"),
])
def test_a_bad_secrets_file_is_a_user_error_without_values(tmp_path: Path, content: str,
                                                           problem: str) -> None:
    prog = write_program(tmp_path, """
        import couler.argo as couler

        couler.run_container(image="alpine", command=["true"], step_name="noop")
    """)
    secrets = tmp_path / "secrets.json"
    secrets.write_text(content, encoding="utf-8")
    status, _, err = run_cli("run", str(prog), "--work-dir", str(tmp_path / "runs"),
                             "--secrets-file", str(secrets))
    assert status == 2
    assert problem in err and str(secrets) in err
    assert PASSWORD not in err
    status, _, err = run_cli("run", str(prog), "--work-dir", str(tmp_path / "runs"),
                             "--secrets-file", str(tmp_path / "absent.json"))
    assert status == 2 and "cannot read it" in err


def test_the_secrets_example_runs_with_its_values(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # examples/secrets_env.py runs psql; a stand-in on PATH checks what it was given.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    psql = bin_dir / "psql"
    psql.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        [ "$DB_USER" = analyst ] || exit 7
        [ "$(printf %s "$DB_PASSWORD" | sha256sum | cut -d' ' -f1)" = {sha("not-in-the-yaml")} ] \\
            || exit 8
        echo "psql stand-in ok"
    """), encoding="utf-8")
    psql.chmod(psql.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    runs = tmp_path / "runs"
    status, out, err = run_cli("run", str(ROOT / "examples" / "secrets_env.py"), "--json",
                               "--work-dir", str(runs))
    assert status == 0, err
    record = json.loads(out)
    assert record["workflow"] == "secret-demo" and record["state"] == "succeeded"
    logs = files_text(runs)
    assert "psql stand-in ok" in logs
    for text in (out, err, logs):
        assert "not-in-the-yaml" not in text
