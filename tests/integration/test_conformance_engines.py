"""Conformance programs run on kfp.local, compared with expected.json.

expected.json records the local engine's results; each run's summary (final
state, per step state, attempts and outputs) is compared with
:func:`tests.conformance.harness.matches` as far as the engine reports it.
Known engine differences are listed (``*_DIFFERENCES``) and asserted, so a fix
shows up as a failure to update them. The Ray executor's runs are in
tests/ray_engine/check_conformance.py (run by tests/integration/test_ray.py).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.conformance import harness
from tests.conformance.loader import load_program, program_paths

EXPECTED: dict[str, Any] = json.loads(harness.EXPECTED.read_text(encoding="utf-8"))
PATHS = {p.stem: p for p in program_paths()}


def _has_when(name: str) -> bool:
    return any(s.when is not None for s in load_program(PATHS[name]).steps)


# --------------------------------------------------------------------------- kfp.local

# Runs inside .venv-kfp: run every program with kfp.local (couler's local mode) and
# print, per program, its summary: steps that ran, attempts (executions), outputs
# (the output parameter files kfp.local keeps under the pipeline root).
KFP_RUN_HELPER = r'''
import json, re, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.conformance.loader import load_program
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError
root = Path(sys.argv[2])
out = {}
for path in sys.argv[3:]:
    name, wf = Path(path).stem, load_program(Path(path))
    try:
        runs = K.run_locally(wf, str(root / name))
    except UnsupportedFeatureError as exc:
        out[name] = {"state": "unsupported", "feature": exc.feature}
        continue
    except Exception as exc:
        out[name] = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"[-1000:]}
        continue
    (run_dir,) = [d for d in (root / name).iterdir() if not d.name.startswith("couler-kfp-log")]
    steps = {}
    for step in wf.steps:
        if step.name not in runs:
            continue
        outputs = {}
        for o in step.outputs:
            ident = re.sub(r"\W", "_", o.name)
            files = sorted(run_dir.glob(f"**/{step.name}/{ident}"),
                           key=lambda p: [int(n) for n in re.findall(r"iteration-(\d+)", str(p))])
            # kfp.local keeps the file's trailing newline; the local engine strips it
            values = [f.read_text().rstrip("\n") for f in files]
            if step.foreach is not None:
                outputs[o.name] = json.dumps(values)
            elif values:
                outputs[o.name] = values[0]
        steps[step.name] = {"state": "succeeded", "outputs": outputs,
                            "attempts": 1 if step.foreach is not None else len(runs[step.name])}
    out[name] = {"state": "succeeded", "steps": steps}
print(json.dumps(out))
'''

# Not run on kfp.local: conditions do not evaluate under kfp.local 2.17.3 (neither
# branch of a when / else runs), so programs with a `when` cannot be compared.
KFP_EXCLUDED = {name for name in PATHS if _has_when(name)}

# Where kfp.local differs from expected.json (the local engine's results).
KFP_DIFFERENCES: dict[str, dict[str, Any]] = {
    # The local engine rejects GPU requests; kfp.local ignores the accelerator and runs it.
    "gpu": {"state": "succeeded", "steps": {"train": {"state": "succeeded"}}},
}
# kfp.local fails these runs (the error text it raises).
KFP_FAILURES: dict[str, str] = {
    # A map over an upstream step's list output inside the pipeline: kfp.local's loop
    # cannot resolve the producer's output channel.
    "map_upstream": "Parent pipeline input argument 'pipelinechannel--list-shards-result' "
                    "not found",
}


@pytest.fixture(scope="module")
def kfp_outcomes() -> dict[str, harness.Outcome]:
    try:
        return harness.compile_kfp(program_paths())
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def kfp_runs(kfp_outcomes: dict[str, harness.Outcome],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every KFP-compiled program without `when`, run in ONE .venv-kfp subprocess."""
    names = [n for n, o in kfp_outcomes.items() if o.status == "compiled" and n not in KFP_EXCLUDED]
    tmp = tmp_path_factory.mktemp("kfp-conformance")
    helper = tmp / "kfp_run.py"
    helper.write_text(KFP_RUN_HELPER, encoding="utf-8")
    proc = subprocess.run([str(harness.KFP_PYTHON), str(helper), str(harness.ROOT),
                           str(tmp / "root"), *(str(PATHS[n]) for n in names)],
                          capture_output=True, text=True, check=False, timeout=300,
                          cwd=tmp)  # programs write relative files (retry markers)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(runs) == sorted(names)
    return runs


def test_kfp_runs_the_compiled_programs(kfp_runs: dict[str, Any]) -> None:
    assert len(kfp_runs) >= 6
    assert "when_else" not in kfp_runs


@pytest.mark.parametrize("program", sorted(set(PATHS) - KFP_EXCLUDED))
def test_kfp_local_run_matches_expected(kfp_runs: dict[str, Any], program: str) -> None:
    if program not in kfp_runs:  # rejected by the KFP compiler (test_conformance checks how)
        return
    actual = kfp_runs[program]
    if program in KFP_FAILURES:
        assert actual["state"] == "failed" and KFP_FAILURES[program] in actual["error"], actual
        return
    expected = KFP_DIFFERENCES.get(program, EXPECTED[program])
    assert harness.matches(expected, actual) == [], json.dumps(actual, indent=1)
