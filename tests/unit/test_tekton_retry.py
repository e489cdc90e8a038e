"""Tekton retry back-off and retry by failure class: the compiled step script is run.

The step's ``script`` is what Tekton writes to a file and executes with the step's
``args``; here it is run with /bin/sh after substituting ``$(results.NAME.path)`` with
temporary files, as Tekton's entrypoint does.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from couler import ir
from couler.compilers import tekton
from couler.errors import UnsupportedFeatureError
from tests.conformance.loader import load_program, program_paths
from tests.unit.test_tekton_compiler import compile_ok, ctr, tasks, wf_of

S = ir.Step
C = ir.FailureClass
ROOT = Path(__file__).resolve().parents[2]


def run_step(task: dict[str, Any], tmp_path: Path) -> tuple[int, dict[str, str], str]:
    """Run a compiled task's only step; return (exit code, results, stdout)."""
    (step,) = task["taskSpec"]["steps"]
    names = [r["name"] for r in task["taskSpec"].get("results", [])]
    results_dir = tmp_path / "results"
    results_dir.mkdir(exist_ok=True)
    text = step["script"]
    for name in names:
        text = text.replace(f"$(results.{name}.path)", str(results_dir / name))
    assert not re.search(r"\$\((results|params|tasks)\.", text), "unsubstituted variable"
    bin_dir = tmp_path / "bin"  # a recording sleep: delays are checked, not waited for
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sleep").write_text(f'#!/bin/sh\necho "$1" >> {tmp_path / "slept"}\n')
    (bin_dir / "sleep").chmod(0o755)
    script = tmp_path / "script.sh"
    script.write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(["/bin/sh", str(script), *step.get("args", [])], cwd=tmp_path,
                          env=env, capture_output=True, text=True, check=False)
    results = {n: (results_dir / n).read_text() for n in names if (results_dir / n).exists()}
    return proc.returncode, results, proc.stdout


def _program(stem: str) -> ir.Workflow:
    (path,) = [p for p in program_paths() if p.stem == stem]
    return load_program(path)


def test_retry_backoff_program_recovers_on_the_second_attempt(tmp_path: Path) -> None:
    docs = compile_ok(_program("retry_backoff"))
    task = tasks(docs)["flaky"]
    assert "retries" not in task  # the wrapper retries; Tekton's retries would multiply
    rc, results, out = run_step(task, tmp_path)
    assert rc == 0
    assert results == {"result": "recovered", "couler-attempts": "2", "couler-failure": ""}
    assert out.strip() == "recovered"
    assert (tmp_path / "slept").read_text().split() == ["0.1"]  # base * factor**0


def test_user_error_is_not_retried_by_class(tmp_path: Path) -> None:
    step = S("t", ctr("sh", "-c", "echo 'Traceback (most recent call last):' >&2; "
                                  "echo 'ValueError: bad' >&2; exit 1"),
             retry=ir.RetryPolicy(limit=3, on=(C.TRANSIENT, C.INFRA)))
    rc, results, _ = run_step(tasks(compile_ok(wf_of(step)))["t"], tmp_path)
    assert rc == 1
    assert (results["couler-attempts"], results["couler-failure"]) == ("1", "user")


def test_network_error_is_retried_to_the_limit(tmp_path: Path) -> None:
    step = S("t", ctr("sh", "-c", "echo 'curl: (6) Could not resolve host: x' >&2; exit 6"),
             retry=ir.RetryPolicy(limit=2, backoff=ir.Backoff(1, 2), on=(C.INFRA,)))
    task = tasks(compile_ok(wf_of(step)))["t"]
    rc, results, _ = run_step(task, tmp_path)
    assert rc == 6
    assert (results["couler-attempts"], results["couler-failure"]) == ("3", "infra")
    assert (tmp_path / "slept").read_text().split() == ["1", "2"]


def test_wrapped_step_keeps_file_outputs(tmp_path: Path) -> None:
    out = str(tmp_path / "out.txt")
    step = S("t", ctr("sh", "-c", f"echo 42 > {out}"),
             outputs=(ir.OutputParameter("n", ir.OutputSource.PATH, out),),
             retry=ir.RetryPolicy(limit=1, on=(C.INFRA,)))
    rc, results, _ = run_step(tasks(compile_ok(wf_of(step)))["t"], tmp_path)
    assert rc == 0 and results["n"] == "42\n" and results["couler-attempts"] == "1"


def test_plain_retry_stays_native() -> None:
    task = tasks(compile_ok(wf_of(S("t", ctr("x"), retry=ir.RetryPolicy(limit=2)))))["t"]
    assert task["retries"] == 2
    assert "script" not in task["taskSpec"]["steps"][0]


def test_entrypoint_container_cannot_be_wrapped() -> None:
    step = S("t", ir.ContainerSpec("alpine"), retry=ir.RetryPolicy(limit=1, on=(C.OOM,)))
    try:
        tekton.compile_workflow(wf_of(step))
    except UnsupportedFeatureError as e:
        assert e.step == "t" and e.feature == "retry by failure class"
    else:
        raise AssertionError("compiled a wrapper around an unknown entrypoint")
