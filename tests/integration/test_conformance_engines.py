"""Conformance programs run on kfp.local, compared with the expected answers.

The answers are written by hand from docs/semantics.md (tests/conformance/expected.py);
each run's summary (final state, per step state, attempts and outputs) is compared
with :func:`tests.conformance.harness.matches` as far as the engine reports it.
Known engine differences are listed (``*_DIFFERENCES``), each naming the semantics
exception it comes from, and asserted, so a fix shows up as a failure to update them.
The Ray executor's runs are in tests/ray_engine/check_conformance.py (run by
tests/integration/test_ray.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conformance import harness
from tests.conformance.expected import EXPECTED
from tests.conformance.loader import program_paths

PATHS = {p.stem: p for p in program_paths()}


# --------------------------------------------------------------------------- kfp.local

# Runs inside .venv-kfp: run every program with kfp.local (couler's local mode) and
# print, per program, its summary: steps (and exit hook steps) that ran, attempts
# (executions), outputs (the output parameter files kfp.local keeps under the pipeline
# root, compared as they are); a conditional step or an exit hook that did not run is
# "skipped". Also
# the accelerators the container-mode pipeline requests (executor → accelerator).
KFP_RUN_HELPER = r'''
import json, os, re, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.conformance.harness import LOCAL_SECRETS
from tests.conformance.loader import load_program
from couler import ir
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError
root = Path(sys.argv[2])
out = {}
for path in sys.argv[3:]:
    name, wf = Path(path).stem, load_program(Path(path))
    failed = []
    cwd = root.parent / "cwd" / name
    cwd.mkdir(parents=True)
    os.chdir(cwd)  # programs write relative files (retry markers): one directory each
    # programs/tune.py: the ask / tell / best steps find the study's database in this secret
    secrets = {**LOCAL_SECRETS, ("couler-tune", "url"): f"sqlite:///{root / name}.db"}
    try:
        runs = K.run_locally(wf, str(root / name), secrets=secrets)
    except UnsupportedFeatureError as exc:
        out[name] = {"state": "unsupported", "feature": exc.feature}
        continue
    except K.LocalRunError as exc:  # kfp.local stops at the failed step
        runs, failed = exc.runs, exc.failed
    except Exception as exc:
        out[name] = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"[-1000:]}
        continue
    run_dirs = [d for d in (root / name).iterdir() if not d.name.startswith("couler-kfp-log")]
    assert len(run_dirs) <= 1, run_dirs
    steps = {}
    hooks = {s.name for hook in wf.exit_hooks for s in hook.steps}
    for step in [*wf.steps, *(s for hook in wf.exit_hooks for s in hook.steps)]:
        if isinstance(step.body, ir.SubWorkflowSpec):  # a nested pipeline: GROUP/STEP runs
            inner = [f"{step.name}/{s.name}" for s in step.body.steps]
            for key in inner:
                state = ("failed" if key in failed else
                         "succeeded" if key in runs else "skipped")
                steps[key] = {"state": state, "outputs": {}}
            states = {steps[key]["state"] for key in inner}
            steps[step.name] = {"state": "failed" if "failed" in states else
                                "succeeded" if "succeeded" in states else "skipped",
                                "outputs": {}}
            continue
        if step.name in failed:
            steps[step.name] = {"state": "failed", "outputs": {}}
            continue
        if step.name not in runs:
            # a conditional step, a step not reached (its guards), a hook or an edge
            # handler that did not fire, or any step after a failure
            steps[step.name] = {"state": "skipped", "outputs": {}, "attempts": 0}
            continue
        outputs = {}
        # a tune step's task (its best step, under its name) has the tune outputs
        for o in (ir.tune_outputs(step.tune) if step.tune is not None else step.outputs):
            ident = re.sub(r"\W", "_", o.name)
            files = sorted((p for d in run_dirs for p in d.glob(f"**/{step.name}/{ident}")),
                           key=lambda p: [int(n) for n in re.findall(r"iteration-(\d+)", str(p))])
            values = [f.read_text() for f in files]
            if step.foreach is not None:
                outputs[o.name] = json.dumps(values)
            elif values:
                outputs[o.name] = values[0]
        steps[step.name] = {"state": "succeeded", "outputs": outputs,
                            "attempts": 1 if step.foreach is not None else len(runs[step.name])}
    executors = K.compile_workflow(wf)["deploymentSpec"]["executors"]
    accelerators = {e.removeprefix("exec-"): x["container"]["resources"]["accelerator"]
                    for e, x in executors.items()
                    if "accelerator" in x["container"].get("resources", {})}
    out[name] = {"state": "failed" if failed else "succeeded", "steps": steps,
                 "accelerators": accelerators}
print(json.dumps(out))
'''

# Every program the KFP compiler accepts runs on kfp.local (test_conformance checks how
# the others are rejected).
# Local mode applies no Kubernetes settings (kfp.local ignores them): secrets come from
# run_locally(secrets=...) (the local engine's LOCAL_SECRETS) and volume mounts are host
# directories; test_kfp.py checks the settings in the compiled platform spec. A job step
# needs a cluster (its kubectl script talks to the Kubernetes API): run_locally refuses it,
# as the local engine does, and test_kfp_job.py runs its compiled script against a fake
# kubectl.
KFP_RUN = ["artifacts", "basic_steps", "cron", "edge_conditions", "exit_hooks", "gpu",
           "interpolation", "job_step", "map_static", "map_upstream", "omitted_upstream",
           "oom_policies", "placement", "resources_cache", "retry_backoff", "retry_timeout",
           "secrets", "sibling_whens", "skip_propagation", "strict_succeeded", "subworkflows",
           "tune", "when_else", "while_loop", "workflow_params"]

# Where kfp.local differs from the expected answers, each naming the exception.
KFP_DIFFERENCES: dict[str, dict[str, Any]] = {
    # E6 (docs/semantics.md): `broken` fails and its failed / any edges run their handlers
    # (ignore_upstream_failure), but KFP fails a run one of whose tasks failed.
    "edge_conditions": {**EXPECTED["edge_conditions"], "state": "failed"},
}
# Fail-fast (docs/semantics.md, exception E1): kfp.local stops the whole run at the first
# failed task, so an independent step runs only if kfp.local happened to run it first (its
# order among ready tasks varies); the semantics: a failure stops only its dependents.
KFP_FAIL_FAST: dict[str, set[str]] = {"skip_propagation": {"unrelated"}}


@pytest.fixture(scope="module")
def kfp_outcomes() -> dict[str, harness.Outcome]:
    try:
        return harness.compile_kfp(program_paths())
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def kfp_runs(kfp_outcomes: dict[str, harness.Outcome],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every KFP-compiled program, run in ONE .venv-kfp subprocess."""
    names = [n for n, o in kfp_outcomes.items() if o.status == "compiled"]
    tmp = tmp_path_factory.mktemp("kfp-conformance")
    helper = tmp / "kfp_run.py"
    helper.write_text(KFP_RUN_HELPER, encoding="utf-8")
    # programs/tune.py: local mode runs `python -m couler_runtime.tune` on the host, with
    # the `python` found first: this (the main) environment's, which has optuna
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable),
                                                 os.environ.get("PATH", "")]))
    proc = subprocess.run([str(harness.KFP_PYTHON), str(helper), str(harness.ROOT),
                           str(tmp / "root"), *(str(PATHS[n]) for n in names)],
                          capture_output=True, text=True, check=False, timeout=300,
                          cwd=tmp, env=env)  # programs write relative files (retry markers)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(runs) == sorted(names)
    return runs


def test_kfp_runs_the_compiled_programs(kfp_runs: dict[str, Any]) -> None:
    assert sorted(kfp_runs) == KFP_RUN


def test_kfp_local_refuses_the_compiled_job_step(kfp_outcomes: dict[str, harness.Outcome],
                                                 kfp_runs: dict[str, Any]) -> None:
    assert kfp_outcomes["job_step"].status == "compiled"  # for a KFP backend
    assert kfp_runs["job_step"] == {"state": "unsupported",
                                    "feature": "job step (Kubernetes resource)"}


def test_kfp_local_requests_the_accelerator(kfp_runs: dict[str, Any]) -> None:
    # The KFP compiler requests the accelerator (set_accelerator_type / _limit);
    # kfp.local's SubprocessRunner ignores it and runs the step on the host.
    gpu = kfp_runs["gpu"]
    (accelerator,) = gpu["accelerators"].values()
    assert list(gpu["accelerators"]) == ["train"]
    assert (accelerator["resourceType"], accelerator["resourceCount"]) == ("nvidia.com/gpu", "1")
    assert gpu["state"] == "succeeded"  # requested, ignored, run
    # (a program kfp.local refuses to run, job_step, reports no accelerators at all)
    assert all(run.get("accelerators", {}) == {} for name, run in kfp_runs.items()
               if name != "gpu")


@pytest.mark.parametrize("program", [p for p in KFP_RUN if p != "job_step"])
def test_kfp_local_run_matches_expected(kfp_runs: dict[str, Any], program: str) -> None:
    actual = kfp_runs[program]
    expected = KFP_DIFFERENCES.get(program, EXPECTED[program])
    for step in KFP_FAIL_FAST.get(program, ()):
        if actual["steps"][step]["state"] == "skipped":  # E1: not run after the failure
            expected = {**expected, "steps": {**expected["steps"], step: {"state": "skipped"}}}
    assert harness.matches(expected, actual) == [], json.dumps(actual, indent=1)


@pytest.mark.parametrize("program", sorted(KFP_DIFFERENCES))
def test_kfp_listed_differences_still_differ(kfp_runs: dict[str, Any], program: str) -> None:
    """A listed difference that disappears must be removed from the list (and the docs)."""
    assert harness.matches(EXPECTED[program], kfp_runs[program]) != []
