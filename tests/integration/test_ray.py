"""The Ray executor's checks, run in the Ray venv inside a private network namespace.

tests/ray_engine/check_*.py need Ray, which lives only in .venv-ray; this test runs
them through tests/ray_engine/run_in_netns.sh and checks the result. A missing
.venv-ray is a failure, not a skip.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from couler import ir
from couler.errors import UserError
from couler_runtime.ray import RayExecutor

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "ray_engine" / "run_in_netns.sh"
EXPECTED_PASSED = 68  # tests in tests/ray_engine/check_*.py (parametrized cases included)


def test_ray_executor_checks_pass_inside_a_network_namespace() -> None:
    venv_python = ROOT / ".venv-ray" / "bin" / "python"
    if not venv_python.exists():
        pytest.fail(f"{venv_python.parent.parent} is missing: create it with "
                    "`scripts/setup-engine-venv.sh ray` (the Ray checks cannot run without it)")
    proc = subprocess.run([str(SCRIPT)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"Ray checks failed (exit {proc.returncode}):\n{output[-6000:]}"
    passed = re.search(r"(\d+) passed", output)
    assert passed is not None, f"no pytest summary in the output:\n{output[-3000:]}"
    assert int(passed.group(1)) == EXPECTED_PASSED, output[-3000:]
    assert not re.search(r"\d+ (failed|error|skipped)", output), output[-3000:]


def test_without_ray_a_clear_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    step = ir.Step(name="a", body=ir.ContainerSpec(image="alpine", command=("true",)))
    with pytest.raises(UserError, match=r"setup-engine-venv\.sh ray"):
        RayExecutor(tmp_path).run(ir.Workflow(name="w", steps=(step,)))
