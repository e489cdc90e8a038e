"""The `couler` command line: compile and validate programs, errors on stderr."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from couler.cli import main
from tests.argo_schema import assert_valid_argo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_compiles_to_valid_argo(example: Path) -> None:
    status, out, err = run_cli("compile", str(example))
    assert status == 0, err
    docs = list(yaml.safe_load_all(out))
    assert docs and all(d["apiVersion"] == "argoproj.io/v1alpha1" for d in docs)
    for doc in docs:
        assert_valid_argo(doc)


def test_compile_writes_output_file(tmp_path: Path) -> None:
    target = tmp_path / "wf.yaml"
    status, out, err = run_cli(
        "compile", str(ROOT / "examples" / "dag_diamond.py"), "-o", str(target)
    )
    assert status == 0, err
    assert out == ""
    doc = yaml.safe_load(target.read_text())
    tasks = {t["name"]: t for t in doc["spec"]["templates"][0]["dag"]["tasks"]}
    assert set(tasks) == {"A", "B", "C", "D"} or set(tasks) == {"a", "b", "c", "d"}


def test_compile_cron_example_gives_cron_workflow() -> None:
    status, out, _ = run_cli("compile", str(ROOT / "examples" / "cron_report.py"))
    assert status == 0
    doc = yaml.safe_load(out)
    assert doc["kind"] == "CronWorkflow"
    assert "Asia/Shanghai" not in out


def test_compile_ir_engine_prints_canonical_json(tmp_path: Path) -> None:
    status, out, _ = run_cli("compile", str(ROOT / "examples" / "coin_flip.py"), "--engine", "ir")
    assert status == 0
    from couler import ir

    wf = ir.from_json(ir.Workflow, out)
    assert wf.name == "coin-flip"
    assert ir.to_json(wf) + "\n" == out


def test_validate_reports_ok_with_digest() -> None:
    status, out, _ = run_cli("validate", str(ROOT / "examples" / "coin_flip.py"))
    assert status == 0
    assert out.startswith("ok: workflow 'coin-flip': 3 steps, sha256:")


def test_validate_checks_the_size_limits_submit_applies(tmp_path: Path) -> None:
    prog = write(
        tmp_path,
        "big.py",
        """
        import couler.argo as couler

        couler.run_container(image="alpine", command=["echo", "x" * 300000],
                             step_name="huge")
        """,
    )
    status, out, err = run_cli("validate", str(prog))
    assert status == 2 and out == ""
    assert ("workflow 'big', step 'huge', field 'command[1]': 300000 bytes is over the "
            "limit of 256 KiB per value") in err, err


def test_cycle_fails_naming_the_steps(tmp_path: Path) -> None:
    prog = write(
        tmp_path,
        "cycle.py",
        """
        import couler.argo as couler

        def job(name):
            couler.run_container(image="alpine", command=["true"], step_name=name)

        couler.config_workflow(name="cyclic")
        couler.set_dependencies(lambda: job("first"), dependencies=["second"])
        couler.set_dependencies(lambda: job("second"), dependencies=["first"])
    """,
    )
    status, out, err = run_cli("validate", str(prog))
    assert status == 2
    assert out == ""
    assert "cycle" in err and "'first'" in err and "'second'" in err
    assert "dependencies" in err


def test_dangling_dependency_fails_naming_the_step(tmp_path: Path) -> None:
    prog = write(
        tmp_path,
        "dangling.py",
        """
        import couler.argo as couler

        couler.config_workflow(name="dangling")
        couler.set_dependencies(
            lambda: couler.run_container(image="alpine", command=["true"], step_name="lonely"),
            dependencies=["ghost"],
        )
    """,
    )
    status, _, err = run_cli("compile", str(prog))
    assert status == 2
    assert "step 'lonely'" in err and "ghost" in err


def test_bad_name_fails_naming_the_step(tmp_path: Path) -> None:
    prog = write(
        tmp_path,
        "badname.py",
        """
        import couler.argo as couler

        couler.config_workflow(name="bad-names")
        couler.run_container(image="alpine", command=["true"], step_name="Not_A_DNS_Name!")
    """,
    )
    status, _, err = run_cli("compile", str(prog))
    assert status == 2
    assert "Not_A_DNS_Name!" in err and "DNS-1123" in err


def test_program_exception_names_file_and_line(tmp_path: Path) -> None:
    prog = write(
        tmp_path,
        "broken.py",
        """
        import couler.argo as couler

        couler.config_workflow(name="broken")
        raise RuntimeError("boom in user code")
    """,
    )
    status, _, err = run_cli("compile", str(prog))
    assert status == 2
    assert "broken.py" in err and "boom in user code" in err and "line 5" in err


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    status, _, err = run_cli("compile", str(tmp_path / "nope.py"))
    assert status == 2
    assert "no such file" in err


def test_program_without_steps_is_an_error(tmp_path: Path) -> None:
    prog = write(tmp_path, "empty.py", "import couler.argo as couler\n")
    status, _, err = run_cli("compile", str(prog))
    assert status == 2
    assert "no workflow" in err


def test_python_dash_m_couler_runs_in_a_subprocess(tmp_path: Path) -> None:
    """The module entry point works as a real process, with the program's own arguments."""
    prog = write(
        tmp_path,
        "args.py",
        """
        import sys
        import couler.argo as couler

        couler.config_workflow(name=sys.argv[1])
        couler.run_container(image="alpine", command=["echo", sys.argv[2]], step_name="echo")
    """,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "couler", "compile", str(prog), "--", "from-argv", "hello"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(proc.stdout)
    assert doc["metadata"]["generateName"] == "from-argv-"
    assert "hello" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "couler", "compile", str(tmp_path / "x.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "no such file" in bad.stderr and bad.stdout == ""


def test_compile_for_tekton_gives_pipeline_and_run() -> None:
    status, out, err = run_cli(
        "compile", str(ROOT / "examples" / "dag_diamond.py"), "--engine", "tekton"
    )
    assert status == 0, err
    kinds = [d["kind"] for d in yaml.safe_load_all(out)]
    assert kinds == ["Pipeline", "PipelineRun"]


def test_compile_for_tekton_names_an_unsupported_feature() -> None:
    status, _, err = run_cli(
        "compile", str(ROOT / "tests" / "conformance" / "programs" / "daemon.py"),
        "--engine", "tekton"
    )
    assert status == 2
    assert "tekton" in err and "daemon step" in err


def test_compile_for_tekton_adds_the_cronjob_of_a_schedule() -> None:
    status, out, err = run_cli(
        "compile", str(ROOT / "examples" / "cron_report.py"), "--engine", "tekton"
    )
    assert status == 0, err
    kinds = [d["kind"] for d in yaml.safe_load_all(out)]
    assert kinds == ["Pipeline", "PipelineRun", "ConfigMap", "CronJob"]


def test_compile_for_airflow_writes_a_dag_file() -> None:
    import ast

    status, out, err = run_cli(
        "compile", str(ROOT / "examples" / "coin_flip.py"), "--engine", "airflow"
    )
    assert status == 0, err
    ast.parse(out)  # a Python DAG file
    assert "coin-flip" in out


def test_compile_for_kfp_without_kfp_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The main environment has no kfp (it pins protobuf < 7): the command compiles in the
    # kfp environment (tests/integration/test_cli_kfp_env.py), here one that does not exist.
    monkeypatch.setenv("COULER_KFP_PYTHON", str(tmp_path / "missing"))
    status, out, err = run_cli(
        "compile", str(ROOT / "examples" / "dag_diamond.py"), "--engine", "kfp"
    )
    assert status == 2 and out == ""
    assert err.startswith(f"couler: error: COULER_KFP_PYTHON={tmp_path / 'missing'}: no such")
    assert "kfp" in err


def test_stack_commands_without_a_stack_or_with_an_empty_request(tmp_path: Path) -> None:
    status, out, err = run_cli("status", "--home", str(tmp_path))
    assert status == 2 and out == ""
    assert err.startswith(f"couler: error: no stack in {tmp_path.resolve()}; start one with")
    status, _, err = run_cli("submit", "--text", "   ", "--home", str(tmp_path))
    assert status == 2 and "--text is empty" in err
