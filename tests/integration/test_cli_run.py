"""`couler run`: a program runs on the local engine with progress, exit status and a JSON record."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from couler.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def program(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "wf.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def test_run_succeeds_with_progress_and_json_record(tmp_path: Path) -> None:
    status, out, err = run_cli(
        "run", str(ROOT / "examples" / "coin_flip.py"), "--json", "--work-dir", str(tmp_path)
    )
    assert status == 0, err
    record = json.loads(out)
    assert record["workflow"] == "coin-flip" and record["state"] == "succeeded"
    steps = {s["step"]: s for s in record["steps"] if not s["key"]}
    flip = steps["flip-coin"]
    assert flip["state"] == "succeeded" and flip["attempts"] == 1
    assert flip["outputs"]["result"] in ("heads", "tails")
    assert flip["duration_seconds"] is not None and flip["duration_seconds"] >= 0
    assert flip["peak_memory_bytes"] is not None
    # Exactly one branch ran: the other was skipped by its condition.
    assert sorted(steps[n]["state"] for n in ("heads", "tails")) == ["skipped", "succeeded"]
    # The progress display names every step as it changes state.
    assert "flip-coin" in err and "workflow 'coin-flip' succeeded" in err
    assert (Path(tmp_path) / record["run_id"] / "run.json").exists()


def test_failed_run_exits_1_and_records_attempts(tmp_path: Path) -> None:
    prog = program(tmp_path, """
        import couler.argo as couler

        couler.config_workflow(name="fails")
        couler.run_container(image="alpine", command=["sh", "-c", "echo boom >&2; exit 3"],
                             step_name="broken", retry=2)
        couler.run_container(image="alpine", command=["echo", "never"], step_name="after")
    """)
    status, out, err = run_cli("run", str(prog), "--json", "--work-dir", str(tmp_path / "runs"))
    assert status == 1
    record = json.loads(out)
    steps = {s["step"]: s for s in record["steps"] if not s["key"]}
    assert record["state"] == "failed"
    assert steps["broken"]["state"] == "failed" and steps["broken"]["attempts"] == 3
    assert steps["broken"]["exit_code"] == 3
    assert steps["after"]["state"] != "succeeded"
    assert "FAIL broken" in err and "workflow 'fails' failed" in err


def test_run_passes_workflow_parameters(tmp_path: Path) -> None:
    prog = program(tmp_path, """
        import couler.argo as couler

        with couler.workflow("params") as wf:
            who = couler.workflow_parameter("who", default="nobody")
            couler.run_container(
                image="alpine", command=["sh", "-c", 'printf "hello %s" "$0" > /tmp/greeting'],
                args=[who], step_name="hello",
                output=couler.create_parameter_artifact("/tmp/greeting", name="greeting"),
            )
    """)
    status, out, err = run_cli("run", str(prog), "--json", "-q", "-p", "who=couler",
                               "--work-dir", str(tmp_path / "runs"))
    assert status == 0, err
    steps = {s["step"]: s for s in json.loads(out)["steps"]}
    assert steps["hello"]["outputs"] == {"greeting": "hello couler"}
    status, out, _ = run_cli("run", str(prog), "--json", "-q", "--work-dir", str(tmp_path / "r2"))
    assert {s["step"]: s for s in json.loads(out)["steps"]}["hello"]["outputs"] == {
        "greeting": "hello nobody"
    }
    bad, _, err = run_cli("run", str(prog), "-p", "oops", "--work-dir", str(tmp_path / "runs"))
    assert bad == 2 and "NAME=VALUE" in err


def test_run_of_an_invalid_program_names_the_step(tmp_path: Path) -> None:
    prog = program(tmp_path, """
        import couler.argo as couler

        couler.config_workflow(name="bad")
        couler.set_dependencies(
            lambda: couler.run_container(image="alpine", command=["true"], step_name="x"),
            dependencies=["ghost"],
        )
    """)
    status, out, err = run_cli("run", str(prog), "--work-dir", str(tmp_path / "runs"))
    assert status == 2 and out == ""
    assert "step 'x'" in err and "ghost" in err


def test_couler_run_as_a_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "couler", "run", str(ROOT / "examples" / "map_batches.py"),
         "--work-dir", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok train[3]" in proc.stderr and "workflow 'map-batches' succeeded" in proc.stderr


def test_retry_resumes_from_the_failure_point(tmp_path: Path) -> None:
    flag, count = tmp_path / "fixed", tmp_path / "count"
    prog = program(tmp_path, f"""
        import couler.argo as couler

        couler.config_workflow(name="flaky")
        couler.run_container(image="alpine", command=["sh", "-c", "echo x >> {count}"],
                             step_name="first")
        couler.run_container(image="alpine", command=["test", "-e", "{flag}"], step_name="second")
    """)
    status, out, _ = run_cli("run", str(prog), "--json", "-q", "--work-dir", str(tmp_path / "runs"))
    assert status == 1
    run_dir = tmp_path / "runs" / json.loads(out)["run_id"]
    flag.write_text("now it works")
    status, out, err = run_cli("retry", str(run_dir), "--json")
    assert status == 0, err
    steps = {s["step"]: s for s in json.loads(out)["steps"]}
    assert steps["second"]["state"] == "succeeded"
    assert count.read_text().count("x") == 1  # "first" was not run again
    assert "retrying 'flaky'" in err
    missing, _, err = run_cli("retry", str(tmp_path / "nope"))
    assert missing == 2 and "no local run record" in err


def test_run_on_ray_without_ray_names_the_setup_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as in .venv, where Ray is not installed
    status, out, err = run_cli("run", str(ROOT / "examples" / "coin_flip.py"), "--engine", "ray",
                               "--json", "--work-dir", str(tmp_path / "runs"))
    assert status == 2 and out == ""
    assert "couler: error:" in err and "'ray' package" in err
    assert "scripts/setup-engine-venv.sh ray" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_ray_is_not_importable_in_the_main_environment() -> None:
    # The CLI's --engine ray error above is what users of this environment see.
    proc = subprocess.run(
        [sys.executable, "-m", "couler", "run", str(ROOT / "examples" / "coin_flip.py"),
         "--engine", "ray"],
        capture_output=True, text=True, check=False, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert "scripts/setup-engine-venv.sh ray" in proc.stderr
    assert proc.stdout == ""


def test_address_needs_the_ray_engine(tmp_path: Path) -> None:
    status, _, err = run_cli("run", str(ROOT / "examples" / "coin_flip.py"), "--address",
                             "127.0.0.1:6379", "--work-dir", str(tmp_path / "runs"))
    assert status == 2 and "--address needs --engine ray" in err


def test_what_the_program_prints_stays_out_of_the_json_and_the_document(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prog = program(tmp_path, """
        import couler.argo as couler

        print("building the workflow")
        couler.run_container(image="alpine", command=["echo", "hi"], step_name="hi")
    """)
    status, out, err = run_cli("run", str(prog), "--json", "--work-dir", str(tmp_path / "runs"))
    assert status == 0, err
    assert json.loads(out)["state"] == "succeeded"
    status, out, err = run_cli("compile", str(prog), "--engine", "ir")
    assert status == 0, err
    assert json.loads(out)["name"] == "wf"
    assert capsys.readouterr().err.count("building the workflow") == 2  # on stderr instead


def test_unknown_or_ill_typed_parameters_are_refused(tmp_path: Path) -> None:
    prog = program(tmp_path, """
        import couler.argo as couler

        n = couler.workflow_parameter("n", default=3)
        couler.run_container(image="alpine", command=["sh", "-c", "echo $0"], args=[n],
                             step_name="show")
    """)
    status, out, err = run_cli("run", str(prog), "-p", "m=1", "-p", "n=abc",
                               "--work-dir", str(tmp_path / "runs"))
    assert status == 2 and out == ""
    assert "field 'parameters.m': no such parameter (the workflow declares: n)" in err
    assert "field 'parameters.n': 'abc' is not a valid int" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _local_examples() -> list[str]:
    """The examples examples/README.md says run as they are on the local engine."""
    text = (ROOT / "examples" / "README.md").read_text()
    table = text.split("These also run as they are", 1)[1].split("The others", 1)[0]
    return re.findall(r"^\| `(\w+\.py)` \|", table, re.M)


def test_the_readme_lists_every_example_once() -> None:
    text = (ROOT / "examples" / "README.md").read_text()
    listed = re.findall(r"^\| `(\w+\.py)` \|", text, re.M)
    assert sorted(listed) == sorted(p.name for p in (ROOT / "examples").glob("*.py"))
    assert len(_local_examples()) >= 5


@pytest.mark.parametrize("name", _local_examples())
def test_the_examples_said_to_run_locally_do(name: str, tmp_path: Path) -> None:
    status, out, err = run_cli("run", str(ROOT / "examples" / name), "--json", "--work-dir",
                               str(tmp_path))
    assert status == 0, err
    assert json.loads(out)["state"] == "succeeded"


def test_the_json_record_says_where_the_run_and_its_artifacts_are(tmp_path: Path) -> None:
    prog = program(tmp_path, """
        import couler.argo as couler

        out = couler.create_local_artifact("/tmp/out/model.txt")
        couler.run_container(image="alpine", command=["sh", "-c"],
                             args=["mkdir -p /tmp/out && echo weights > /tmp/out/model.txt"],
                             output=out, step_name="train")
    """)
    status, out, err = run_cli("run", str(prog), "--json", "--work-dir", str(tmp_path / "runs"))
    assert status == 0, err
    record = json.loads(out)
    assert Path(record["run_dir"]) == tmp_path / "runs" / record["run_id"]
    (train,) = record["steps"]
    (path,) = train["artifacts"].values()
    assert Path(path).read_text() == "weights\n"
    assert Path(path).is_relative_to(record["run_dir"])
