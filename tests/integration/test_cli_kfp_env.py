"""``couler compile --engine kfp`` run as a user runs it, from the main environment.

kfp pins protobuf < 7, so it is not in ``.venv``: the command compiles in ``.venv-kfp``
(``couler.kfp_env``), which ``scripts/setup.sh`` creates, and without a kfp environment it
says which setting to use. These tests run the real ``couler`` command as a subprocess. A
missing ``.venv-kfp`` is a failure, never a skip.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COULER = Path(sys.prefix) / "bin" / "couler"  # the main environment's command
KFP_PYTHON = Path(sys.prefix).parent / ".venv-kfp" / "bin" / "python"

PROGRAM = '''
import couler.argo as couler


def count_rows():
    print(42)


def fetch():
    return couler.run_script(image="python:3.12-alpine", source=count_rows, step_name="fetch")


def train(rows):
    return couler.run_container(image="alpine:3.20", command=["echo"], args=[rows],
                                step_name="train")


with couler.workflow("kfp-env-check"):
    train(fetch())
    couler.run()
with couler.workflow("kfp-env-second"):
    couler.run_container(image="alpine:3.20", command=["echo", "hi"], step_name="hello")
    couler.run()
'''


@pytest.fixture
def program(tmp_path: Path) -> Path:
    if not KFP_PYTHON.exists():
        pytest.fail(f"{KFP_PYTHON} is missing: run ./scripts/setup.sh (it creates .venv-kfp)")
    path = tmp_path / "two_pipelines.py"
    path.write_text(textwrap.dedent(PROGRAM), encoding="utf-8")
    return path


def couler(*args: str, cwd: Path, kfp_python: str | None = None,
           command: Path = COULER) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COULER_KFP_PYTHON"}
    if kfp_python is not None:
        env["COULER_KFP_PYTHON"] = kfp_python
    return subprocess.run([str(command), *args], capture_output=True, text=True, check=False,
                          env=env, cwd=cwd, timeout=300)


def test_main_environment_compiles_for_kfp_in_the_kfp_environment(program: Path) -> None:
    # Otherwise this would not test the hand-over to .venv-kfp.
    assert importlib.util.find_spec("kfp") is None, "the main environment has kfp"
    # From a directory outside the repository, with the default kfp environment.
    proc = couler("compile", str(program), "--engine", "kfp", cwd=program.parent)
    assert proc.returncode == 0, proc.stderr
    first, second = list(yaml.safe_load_all(proc.stdout))

    assert first["pipelineInfo"] == {"name": "kfp-env-check"}
    assert first["schemaVersion"] == "2.1.0" and first["sdkVersion"].startswith("kfp-2.")
    assert set(first["components"]) == {"comp-fetch", "comp-train"}
    tasks: dict[str, Any] = first["root"]["dag"]["tasks"]
    assert set(tasks) == {"fetch", "train"}
    assert tasks["train"]["dependentTasks"] == ["fetch"]
    assert tasks["train"]["inputs"]["parameters"]["para_train_0"]["taskOutputParameter"] == {
        "outputParameterKey": "result", "producerTask": "fetch"}
    executors = first["deploymentSpec"]["executors"]
    assert executors["exec-train"]["container"]["image"] == "alpine:3.20"
    assert executors["exec-fetch"]["container"]["image"] == "python:3.12-alpine"

    assert second["pipelineInfo"] == {"name": "kfp-env-second"}
    assert set(second["root"]["dag"]["tasks"]) == {"hello"}

    # The same document as compiling in-process where kfp is installed.
    direct = couler("compile", str(program), "--engine", "kfp", cwd=program.parent,
                    command=KFP_PYTHON.parent / "couler")
    assert direct.returncode == 0, direct.stderr
    assert proc.stdout == direct.stdout


def test_output_file_and_a_chosen_kfp_environment(program: Path) -> None:
    target = program.parent / "out.yaml"
    proc = couler("-v", "compile", str(program), "--engine", "kfp", "-o", str(target),
                  cwd=program.parent, kfp_python=str(KFP_PYTHON))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert "wrote workflow 'kfp-env-check' (2 steps)" in proc.stderr
    names = [d["pipelineInfo"]["name"] for d in yaml.safe_load_all(target.read_text())]
    assert names == ["kfp-env-check", "kfp-env-second"]


def test_kubernetes_settings_follow_their_pipeline_as_its_platform_document(
        tmp_path: Path) -> None:
    """As kfp writes a package: the PipelineSpec, then its PlatformSpec."""
    path = tmp_path / "placed.py"
    path.write_text(textwrap.dedent("""
        import couler.argo as couler
        couler.config_workflow(name="placed")
        couler.run_container(image="alpine:3.20", command=["echo", "hi"], step_name="a",
                             node_selector={"disk": "ssd"})
    """), encoding="utf-8")
    proc = couler("compile", str(path), "--engine", "kfp", cwd=tmp_path,
                  kfp_python=str(KFP_PYTHON))
    assert proc.returncode == 0, proc.stderr
    pipeline, platform = list(yaml.safe_load_all(proc.stdout))
    assert pipeline["pipelineInfo"] == {"name": "placed"} and "platforms" not in pipeline
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    [config] = executors.values()
    assert config["nodeSelector"]["labels"] == {"disk": "ssd"}


def test_what_kfp_cannot_express_is_a_user_error(tmp_path: Path) -> None:
    proc = couler("compile", str(ROOT / "examples" / "exec_while.py"), "--engine", "kfp",
                  cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("couler: error: workflow 'flip-until-heads', step "
                                  "'flip-coin': engine 'kfp' does not support bounded loop")


def test_a_missing_kfp_environment_names_the_setting(program: Path) -> None:
    missing = program.parent / "no-venv" / "bin" / "python"
    proc = couler("compile", str(program), "--engine", "kfp", cwd=program.parent,
                  kfp_python=str(missing))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"couler: error: COULER_KFP_PYTHON={missing}: no such "
                                  "executable")
    assert "./scripts/setup.sh" in proc.stderr


def test_an_environment_without_kfp_names_the_setting(program: Path) -> None:
    # The main environment's python has couler but not kfp.
    proc = couler("compile", str(program), "--engine", "kfp", cwd=program.parent,
                  kfp_python=sys.executable)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"COULER_KFP_PYTHON={sys.executable} cannot compile: kfp is not installed" in (
        proc.stderr)


def test_an_environment_that_fails_to_start_names_the_setting(program: Path) -> None:
    broken = program.parent / "python"  # an interpreter that cannot run couler.kfp_env
    broken.write_text("#!/bin/sh\necho \"No module named 'couler'\" >&2\nexit 1\n")
    broken.chmod(0o755)
    proc = couler("compile", str(program), "--engine", "kfp", cwd=program.parent,
                  kfp_python=str(broken))
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"COULER_KFP_PYTHON={broken} did not compile (exit status 1)" in proc.stderr
    assert "No module named 'couler'" in proc.stderr
