"""Retry by failure class on KFP: the step's command runs under the POSIX-sh retry wrapper
(couler.compilers.entrypoint), compiled by the kfp SDK, run by kfp.local and, as compiled
for a KFP backend, by /bin/sh on this host."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.integration.test_kfp import all_tasks, helper

# argv: COUNTER. Fails with a network error (infra) until its third attempt.
FLAKY = r'''
import pathlib, sys
counter = pathlib.Path(sys.argv[1])
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
if n < 3:
    sys.exit("dial tcp 10.0.0.7:5432: connect: connection refused")
print(f"trained after {n} attempts")
'''

# argv: COUNTER. A bug (a Python ValueError: user): never retried.
BUGGY = r'''
import pathlib, sys
counter = pathlib.Path(sys.argv[1])
counter.write_text(str(int(counter.read_text()) + 1 if counter.exists() else 1))
raise ValueError("learning rate must be positive")
'''


def program(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(f'''
import couler.argo as couler
from couler import ir

couler.config_workflow(name="retry-{name}")
couler.run_container(
    image="python:3.12-alpine", command=["python3", "-c", {source!r}, {str(tmp_path / name)!r}],
    step_name="train",
    retry=ir.RetryPolicy(limit=3, on=(ir.FailureClass.INFRA, ir.FailureClass.TRANSIENT)),
)
''')
    return path


def test_the_compiled_step_runs_under_the_wrapper_without_kfp_retries(tmp_path: Path) -> None:
    path = program(tmp_path, "flaky", FLAKY)
    out = helper(tmp_path, "compile", str(path))[str(path)]
    spec: dict[str, Any] = out["spec"]
    task = all_tasks(spec)["train"]
    assert "retryPolicy" not in task  # the wrapper retries, not KFP (it would retry bugs)
    container = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
    command = container["command"]
    assert command[:2] == ["/bin/sh", "-c"] and command[3] == "couler-entrypoint"
    assert "couler_on='infra transient'" in command[2]
    # the compiled command, run as the container would run it (python3 of this host)
    words = [*command, *container.get("args", [])]
    proc = subprocess.run(words, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "trained after 3 attempts\n"
    assert proc.stderr.count("failed (exit 1): infra (connection-refused)") == 2


def test_kfp_local_retries_a_network_error_and_stops_at_a_bug(tmp_path: Path) -> None:
    flaky = program(tmp_path, "flaky", FLAKY)
    out = helper(tmp_path, "run", str(flaky), str(tmp_path / "root-ok"))
    assert out["runs"]["train"] == ["trained after 3 attempts\n"]
    assert (tmp_path / "flaky").read_text() == "3"

    buggy = program(tmp_path, "buggy", BUGGY)
    failed = helper(tmp_path, "run-failing", str(buggy), str(tmp_path / "root-bad"))
    assert failed["failed"] == ["train"]
    assert (tmp_path / "buggy").read_text() == "1"  # a user error is not retried
