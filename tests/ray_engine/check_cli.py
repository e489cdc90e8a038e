"""`couler run --engine ray`: the CLI runs a program on Ray with progress, JSON record, exit status.

Run only by tests/ray_engine/run_in_netns.sh (Ray venv, private network namespace).
Each check runs ``python -m couler`` as a separate process with this venv's
interpreter: with ``--address`` it joins the session's cluster, without it the CLI
starts (and stops) a local cluster of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

ROOT = Path(__file__).resolve().parents[2]


def couler(*argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "couler", *argv], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=timeout)


def steps_of(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["step"]: s for s in record["steps"] if not s["key"]}


def session_address(ray: Any) -> str:
    address: str = ray.get_runtime_context().gcs_address
    return address


def test_example_runs_on_the_session_cluster(ray_session: Any, tmp_path: Path) -> None:
    proc = couler("run", "examples/coin_flip.py", "--engine", "ray",
                  "--address", session_address(ray_session), "--json",
                  "--work-dir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["workflow"] == "coin-flip" and record["state"] == "succeeded"
    assert record["duration_seconds"] is not None and record["duration_seconds"] > 0
    steps = steps_of(record)
    flip = steps["flip-coin"]
    assert flip["state"] == "succeeded" and flip["attempts"] == 1
    assert flip["outputs"]["result"] in ("heads", "tails")
    assert flip["duration_seconds"] is not None and flip["duration_seconds"] >= 0
    assert flip["peak_memory_bytes"] is not None and flip["peak_memory_bytes"] > 0
    assert sorted(steps[n]["state"] for n in ("heads", "tails")) == ["skipped", "succeeded"]
    # The same live progress display as the local engine.
    assert "on ray" in proc.stderr and "   ok flip-coin" in proc.stderr
    assert "workflow 'coin-flip' succeeded" in proc.stderr
    saved = json.loads((tmp_path / "runs" / record["run_id"] / "run.json").read_text())
    assert saved["engine"] == "ray" and saved["state"] == "succeeded"


def test_map_example_on_a_cluster_the_cli_starts(tmp_path: Path) -> None:
    proc = couler("run", "examples/map_batches.py", "--engine", "ray", "--workers", "2",
                  "--json", "--work-dir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["workflow"] == "map-batches" and record["state"] == "succeeded"
    train = {s["key"]: s["state"] for s in record["steps"] if s["step"] == "train" and s["key"]}
    assert train == {str(i): "succeeded" for i in range(4)}
    score = {s["key"]: s["state"] for s in record["steps"] if s["step"] == "score" and s["key"]}
    assert score == {str(i): "succeeded" for i in range(3)}  # one per upstream shard
    assert "ok train[3]" in proc.stderr


def test_failed_run_exits_1_with_attempts(ray_session: Any, tmp_path: Path) -> None:
    prog = tmp_path / "fails.py"
    prog.write_text(textwrap.dedent("""
        import couler.argo as couler

        couler.config_workflow(name="fails")
        couler.run_container(image="alpine", command=["sh", "-c", "echo boom >&2; exit 3"],
                             step_name="broken", retry=2)
        couler.run_container(image="alpine", command=["echo", "never"], step_name="after")
    """))
    proc = couler("run", str(prog), "--engine", "ray", "--address",
                  session_address(ray_session), "--json", "--work-dir", str(tmp_path / "runs"))
    assert proc.returncode == 1, proc.stderr
    record = json.loads(proc.stdout)
    assert record["state"] == "failed"
    broken = steps_of(record)["broken"]
    assert broken["state"] == "failed" and broken["attempts"] == 3 and broken["exit_code"] == 3
    assert "boom" in broken["message"]
    assert steps_of(record)["after"]["state"] == "skipped"
    assert "FAIL broken" in proc.stderr and "retry broken" in proc.stderr


@pytest.mark.parametrize("own_cluster", [False, True], ids=["address", "own-cluster"])
def test_ctrl_c_cancels_the_run(ray_session: Any, tmp_path: Path, own_cluster: bool) -> None:
    """SIGINT cancels the run: sent to the CLI alone (joined to the session's cluster), or,
    as a terminal's Ctrl-C does, to its whole process group, Ray's own processes included."""
    pid_file = tmp_path / "pid"
    prog = tmp_path / "slow.py"
    prog.write_text(textwrap.dedent(f"""
        import couler.argo as couler

        couler.config_workflow(name="slow")
        couler.run_container(image="alpine", step_name="sleep", command=[
            "sh", "-c", "echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; exec sleep 300"])
    """))
    where = [] if own_cluster else ["--address", session_address(ray_session)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "couler", "run", str(prog), "--engine", "ray", *where, "--json",
         "--work-dir", str(tmp_path / "runs")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        if own_cluster:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    record = json.loads(out)
    assert record["state"] == "cancelled"
    assert steps_of(record)["sleep"]["state"] == "cancelled"
    assert "workflow 'slow' cancelled" in err
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_unreachable_address_fails_fast(tmp_path: Path) -> None:
    proc = couler("run", "examples/coin_flip.py", "--engine", "ray", "--address", "127.0.0.1:1",
                  "--work-dir", str(tmp_path / "runs"), timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "cannot reach the Ray cluster at '127.0.0.1:1'" in proc.stderr
