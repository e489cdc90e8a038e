"""couler.kfp_env without a subprocess: finding the kfp environment, its reply, its side.

The command run end to end (main environment → .venv-kfp) is in
tests/integration/test_cli_kfp_env.py.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from couler import ir, kfp_env
from couler.api.capture import capture_program
from couler.errors import CoulerError, UserError

ROOT = Path(__file__).resolve().parents[2]


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_setting_wins_and_must_name_an_executable(tmp_path: Path) -> None:
    env = kfp_env.locate({"COULER_KFP_PYTHON": sys.executable}, tmp_path / ".venv")
    assert env == kfp_env.KfpEnvironment(Path(sys.executable), configured=True)
    assert str(env) == f"the kfp environment COULER_KFP_PYTHON={sys.executable}"

    not_executable = tmp_path / "python"
    not_executable.write_text("")
    for value in (str(tmp_path / "missing"), str(not_executable), str(tmp_path)):
        with pytest.raises(UserError, match=r"^COULER_KFP_PYTHON=.*: no such executable"):
            kfp_env.locate({"COULER_KFP_PYTHON": value}, tmp_path / ".venv")


def test_by_default_the_venv_kfp_beside_this_environment(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        kfp_env.locate({"COULER_KFP_PYTHON": " "}, tmp_path / ".venv")
    message = str(info.value)
    assert f"no kfp environment at {tmp_path}/.venv-kfp/bin/python" in message
    assert "COULER_KFP_PYTHON" in message and "./scripts/setup.sh" in message

    python = executable(tmp_path / ".venv-kfp" / "bin" / "python")
    env = kfp_env.locate({}, tmp_path / ".venv")
    assert env == kfp_env.KfpEnvironment(python, configured=False)
    assert "(the default; COULER_KFP_PYTHON chooses another)" in str(env)


def test_a_reply_becomes_specs_or_the_error_of_its_kind() -> None:
    env = kfp_env.KfpEnvironment(Path("/k/bin/python"), configured=True)
    spec = {"pipelineInfo": {"name": "x"}}
    assert kfp_env.decode_reply({"specs": [spec]}, env) == [spec]

    def error(kind: str) -> dict[str, object]:
        return {"error": {"kind": kind, "type": "T", "message": "workflow 'x': no"}}

    with pytest.raises(UserError) as user:
        kfp_env.decode_reply(error("user"), env)
    assert str(user.value) == "workflow 'x': no"
    with pytest.raises(UserError, match=r"COULER_KFP_PYTHON=/k/bin/python cannot compile: "):
        kfp_env.decode_reply(error("environment"), env)
    with pytest.raises(CoulerError) as internal:
        kfp_env.decode_reply(error("internal"), env)
    assert not isinstance(internal.value, UserError)
    assert "kfp failed: T: workflow 'x': no" in str(internal.value)
    with pytest.raises(CoulerError, match="without pipeline specs"):
        kfp_env.decode_reply({"specs": "nope"}, env)


def test_the_kfp_side_replies_in_one_json_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kfp", None)  # as in an environment without kfp
    wf = capture_program(str(ROOT / "examples" / "dag_diamond.py"))[0]
    out = io.StringIO()
    assert kfp_env.serve(io.StringIO(ir.to_json(wf) + "\n"), out) == 0
    reply = json.loads(out.getvalue())
    assert out.getvalue().count("\n") == 1
    assert reply["error"]["kind"] == "environment"
    assert reply["error"]["message"] == f"kfp is not installed in {sys.prefix}"
