"""The conformance programs on the Ray executor, compared with the expected answers.

Run only by tests/ray_engine/run_in_netns.sh (Ray venv, private network namespace).
Every program whose features Ray supports (``check_capabilities`` with the Ray
``CAPABILITIES``) runs with :class:`RayExecutor` (secrets resolved from the same
mapping as the local run) and its summary is compared by
:func:`tests.conformance.harness.matches` with the answers written from
docs/semantics.md (tests/conformance/expected.py), exactly as the local-engine
conformance test does. Programs Ray rejects must be rejected by ``run`` for the
feature ``RAY_UNSUPPORTED`` names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from couler.engines.base import check_capabilities
from couler.errors import UnsupportedFeatureError
from couler_runtime.ray import CAPABILITIES, ENGINE, RayExecutor
from tests.conformance import harness
from tests.conformance.expected import EXPECTED
from tests.conformance.loader import load_program, program_paths

PATHS = {p.stem: p for p in program_paths()}

# Where Ray differs from the expected answers -- an environment limit, not a semantic
# exception: Ray maps a GPU request to num_gpus and the session cluster has no GPU, so the
# executor fails the step before submission (it never hangs).
RAY_EXPECTED: dict[str, dict[str, Any]] = {
    "gpu": {"state": "failed", "steps": {"train": {"state": "failed"}}},
}


# Programs whose features the Ray executor does not implement (its CAPABILITIES): Ray
# must reject them up front, naming the feature.
RAY_UNSUPPORTED: dict[str, str] = {"job_step": "job step (Kubernetes resource)",
                                   "subworkflows": "inline sub-workflow",
                                   "subworkflow_ref": "sub-workflow reference",
                                   "daemon": "daemon step",
                                   "cron": "cron schedule",
                                   "event_trigger": "event triggers"}


def ray_supports(name: str) -> bool:
    try:
        check_capabilities(ENGINE, CAPABILITIES, load_program(PATHS[name]))
    except UnsupportedFeatureError:
        return False
    return True


SUPPORTED = [name for name in PATHS if ray_supports(name)]
REJECTED = [name for name in PATHS if name not in SUPPORTED]


def run_ray(name: str, work_dir: Path) -> dict[str, Any]:
    """The program's run summary on Ray (as ``harness.run_local`` gives for the local engine)."""
    executor = RayExecutor(work_dir, secrets=harness.LOCAL_SECRETS)
    try:
        return harness.summarize(executor.run(load_program(PATHS[name])))
    except UnsupportedFeatureError as exc:
        return {"state": "unsupported", "feature": exc.feature}


def test_programs_split() -> None:
    assert len(SUPPORTED) >= 12 and REJECTED, (SUPPORTED, REJECTED)


@pytest.mark.parametrize("program", SUPPORTED)
def test_ray_run_matches_expected(program: str, tmp_path: Path) -> None:
    actual = run_ray(program, tmp_path)
    expected = RAY_EXPECTED.get(program, EXPECTED[program])
    assert harness.matches(expected, actual) == [], json.dumps(actual, indent=1)


@pytest.mark.parametrize("program", REJECTED)
def test_ray_rejects_as_expected(program: str, tmp_path: Path) -> None:
    actual = run_ray(program, tmp_path)
    assert actual["state"] == "unsupported"
    expected = {"state": "unsupported", "feature": RAY_UNSUPPORTED[program]}
    assert harness.matches(expected, actual) == []


def test_rejected_are_the_listed() -> None:
    assert sorted(REJECTED) == sorted(RAY_UNSUPPORTED)
