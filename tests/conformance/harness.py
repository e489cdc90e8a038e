"""Conformance harness: every program x every engine, compiled or rejected, and run locally.

For each program (``tests/conformance/programs``) and each engine in
``scripts/gen_engine_docs.py: ENGINES`` the outcome is ``compiled`` (Argo,
Tekton, Airflow in-process; KFP in one ``.venv-kfp`` subprocess; the local and
Ray engines through ``check_capabilities``) or ``unsupported: <feature>``.
Programs are also run on the local engine (``ran`` when it succeeds there) and
their final states and outputs compared with the answers written from the semantics
(:data:`tests.conformance.expected.EXPECTED`).

:func:`render_results` builds the engine x program and engine x feature tables
written to ``RESULTS.md`` by ``scripts/conformance_table.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from couler import ir
from couler.engines.base import (
    Capability,
    Feature,
    RunStatus,
    Support,
    check_capabilities,
    features_used,
)
from couler.errors import InsufficientResourcesError, UnsupportedFeatureError

from .expected import EXPECTED
from .loader import PROGRAMS, load_program, program_paths

__all__ = [
    "EXPECTED",
    "KFP_PYTHON",
    "LOCAL_GPUS",
    "LOCAL_SECRETS",
    "RESULTS",
    "Outcome",
    "capabilities",
    "collect",
    "compile_kfp",
    "compile_one",
    "engines",
    "features_used",
    "render_results",
    "run_local",
    "summarize",
]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
KFP_PYTHON = ROOT / ".venv-kfp" / "bin" / "python"
# Secret values the local engine resolves for programs/secrets.py.
LOCAL_SECRETS: Mapping[tuple[str, str], str] = {("conformance-creds", "TOKEN"): "s3cr3t"}
# The one GPU the local engine is given (a device UUID it hands the step in
# CUDA_VISIBLE_DEVICES; programs/gpu.py only asks for one), whatever the machine has.
LOCAL_GPUS = ("GPU-00000000-0000-4000-8000-c0c0c0c0c0c0",)
IN_PROCESS = ("argo", "tekton", "airflow")
CHECK_ONLY = ("local", "ray")


def engines() -> tuple[tuple[str, str], ...]:
    """``scripts/gen_engine_docs.py: ENGINES`` (engine name, capabilities module)."""
    spec = importlib.util.spec_from_file_location("gen_engine_docs",
                                                  ROOT / "scripts" / "gen_engine_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.ENGINES)


def capabilities(module: str) -> Mapping[Feature, Capability]:
    """The ``CAPABILITIES`` of an engine module."""
    caps: Mapping[Feature, Capability] = importlib.import_module(module).CAPABILITIES
    return caps


@dataclass
class Outcome:
    """One program on one engine."""

    status: str  # "compiled" | "unsupported"
    feature: str = ""  # the unsupported feature's name (Feature value)
    step: str = ""
    document: Any = None  # the compiled document(s), for schema checks
    error: str = ""  # anything other than UnsupportedFeatureError (a conformance failure)

    @property
    def label(self) -> str:
        return f"unsupported: {self.feature}" if self.status == "unsupported" else self.status


def _compiler(engine: str) -> Callable[[ir.Workflow], Any]:
    module = importlib.import_module(f"couler.compilers.{engine}")
    compile_workflow: Callable[[ir.Workflow], Any] = module.compile_workflow
    return compile_workflow


def compile_one(engine: str, module: str, wf: ir.Workflow) -> Outcome:
    """Compile (or capability-check) ``wf`` for an in-process engine."""
    try:
        if engine in CHECK_ONLY:
            check_capabilities(engine, capabilities(module), wf)
            return Outcome("compiled")
        return Outcome("compiled", document=_compiler(engine)(wf))
    except UnsupportedFeatureError as exc:
        return Outcome("unsupported", feature=exc.feature, step=exc.step)
    except Exception as exc:
        return Outcome("error", error=f"{type(exc).__name__}: {exc}")


# Runs inside .venv-kfp: load every program, compile it, print one JSON line.
KFP_HELPER = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.conformance.loader import load_program
from couler.compilers import kfp as K
from couler.errors import UnsupportedFeatureError
from pathlib import Path
out = {}
for path in sys.argv[2:]:
    wf = load_program(Path(path))
    try:
        K.compile_workflow(wf)
        out[Path(path).stem] = {"status": "compiled"}
    except UnsupportedFeatureError as exc:
        out[Path(path).stem] = {"status": "unsupported", "feature": exc.feature,
                                "step": exc.step}
    except Exception as exc:
        out[Path(path).stem] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
'''


def compile_kfp(paths: list[Path], timeout: float = 120) -> dict[str, Outcome]:
    """Compile every program with KFP in ONE ``.venv-kfp`` subprocess.

    Raises:
        RuntimeError: ``.venv-kfp`` is missing (with the setup command) or the helper failed.
    """
    if not KFP_PYTHON.exists():
        raise RuntimeError(f"{KFP_PYTHON} is missing: run scripts/setup-engine-venv.sh kfp "
                           "(kfp needs its own environment, it pins protobuf < 7)")
    with tempfile.TemporaryDirectory() as tmp:
        helper = Path(tmp) / "kfp_conformance.py"
        helper.write_text(KFP_HELPER, encoding="utf-8")
        proc = subprocess.run([str(KFP_PYTHON), str(helper), str(ROOT), *map(str, paths)],
                              capture_output=True, text=True, check=False, timeout=timeout,
                              cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"kfp helper failed:\n{proc.stderr[-4000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: Outcome(d["status"], feature=d.get("feature", ""), step=d.get("step", ""),
                          error=d.get("error", ""))
            for name, d in data.items()}


def run_local(wf: ir.Workflow, work_dir: Path,
              workflows: Sequence[ir.Workflow] = ()) -> dict[str, Any]:
    """Run ``wf`` on the local engine: its summary, ``{"state": "unsupported", ...}`` or
    ``{"state": "refused", "resource": ...}`` (the machine lacks what a step requests).

    ``workflows`` are the ones a sub-workflow reference may name (the other programs). The
    engine is given the device :data:`LOCAL_GPUS`, whatever the machine has, so the results
    do not depend on it (tests/integration/test_local_gpus.py checks the refusal of a
    request above the machine).
    """
    from couler_runtime.local import LocalEngine

    engine = LocalEngine(work_dir, max_workers=4, secrets=LOCAL_SECRETS, workflows=workflows,
                         gpus=LOCAL_GPUS)
    try:
        return summarize(engine.run(wf))
    except UnsupportedFeatureError as exc:
        return {"state": "unsupported", "feature": exc.feature}
    except InsufficientResourcesError as exc:
        return {"state": "refused", "resource": exc.resource}


def summarize(status: RunStatus) -> dict[str, Any]:
    """A run's final state and, per step (aggregate record, key ""), its state and outputs."""
    steps = {s.step: {"state": s.state.value, "attempts": s.attempts,
                      "outputs": dict(sorted(s.outputs.items()))}
             for s in status.steps if s.key == ""}
    return {"state": status.state.value, "steps": dict(sorted(steps.items()))}


def matches(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Differences between an :data:`EXPECTED` entry and a run summary.

    The run state and the set of steps must be equal; per step the state must
    match and every listed output must have the listed value (unlisted outputs
    are not compared; ``attempts`` is compared when listed).
    """
    problems: list[str] = []
    if expected["state"] != actual["state"]:
        problems.append(f"run state {actual['state']!r}, expected {expected['state']!r}")
    if expected["state"] == "refused":
        if expected.get("resource") != actual.get("resource"):
            problems.append(f"refused for {actual.get('resource')!r}, "
                            f"expected {expected.get('resource')!r}")
        return problems
    if expected["state"] == "unsupported":
        if expected.get("feature") != actual.get("feature"):
            problems.append(f"unsupported {actual.get('feature')!r}, "
                            f"expected {expected.get('feature')!r}")
        return problems
    exp_steps, act_steps = expected["steps"], actual.get("steps", {})
    if set(exp_steps) != set(act_steps):
        problems.append(f"steps {sorted(act_steps)}, expected {sorted(exp_steps)}")
    for name, exp in exp_steps.items():
        act = act_steps.get(name)
        if act is None:
            continue
        if exp["state"] != act["state"]:
            problems.append(f"step {name}: state {act['state']!r}, expected {exp['state']!r}")
        if "attempts" in exp and exp["attempts"] != act["attempts"]:
            problems.append(f"step {name}: {act['attempts']} attempts, "
                            f"expected {exp['attempts']}")
        for key, value in exp.get("outputs", {}).items():
            if act["outputs"].get(key) != value:
                problems.append(f"step {name}: output {key}={act['outputs'].get(key)!r}, "
                                f"expected {value!r}")
    return problems


@dataclass
class Results:
    """Everything the tables are made of."""

    engines: tuple[str, ...]
    programs: tuple[str, ...]
    features: dict[str, list[str]]  # program -> Feature values it uses
    outcomes: dict[tuple[str, str], Outcome]  # (engine, program)
    local_runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def cell(self, engine: str, program: str) -> str:
        out = self.outcomes[(engine, program)]
        if out.status == "error":
            return f"ERROR: {out.error}"
        if engine == "local" and out.status == "compiled":
            run = self.local_runs.get(program, {})
            if run.get("state") == "refused":
                return f"compiled; refused here: no {run.get('resource')}"
            declared = (", on a declared GPU device" if "GPU resources"
                        in self.features.get(program, ()) else "")
            return f"ran ({run.get('state', '?')}{declared})"
        return out.label


def collect(work_dir: Path, *, kfp: dict[str, Outcome] | None = None) -> Results:
    """Compile every program for every engine and run it on the local engine.

    ``kfp`` may hold KFP outcomes computed already (:func:`compile_kfp`).
    """
    paths = program_paths()
    workflows = {p.stem: load_program(p) for p in paths}
    names = tuple(engine for engine, _ in engines())
    outcomes: dict[tuple[str, str], Outcome] = {}
    kfp_outcomes = kfp if kfp is not None else compile_kfp(paths)
    for engine, module in engines():
        for program, wf in workflows.items():
            if engine == "kfp":
                outcomes[(engine, program)] = kfp_outcomes[program]
            else:
                outcomes[(engine, program)] = compile_one(engine, module, wf)
    local_runs = {program: run_local(wf, work_dir / program, tuple(workflows.values()))
                  for program, wf in workflows.items()}
    return Results(
        engines=names,
        programs=tuple(workflows),
        features={p: [f.value for f in features_used(wf)] for p, wf in workflows.items()},
        outcomes=outcomes,
        local_runs=local_runs,
    )


def feature_cell(results: Results, engine: str, feature: Feature,
                 caps: Mapping[Feature, Capability]) -> str:
    """How the programs using ``feature`` fared on ``engine``."""
    users = [p for p in results.programs if feature.value in results.features[p]]
    if not users:
        return "not covered"
    cap = caps.get(feature)
    if cap is None or cap.support is Support.UNSUPPORTED:
        rejected = any(results.outcomes[(engine, p)].feature == feature.value for p in users)
        return "unsupported" if rejected else "unsupported (not reached)"
    oks = [p for p in users if results.outcomes[(engine, p)].status == "compiled"]
    if not oks:
        return "blocked by other features"
    if engine == "local":
        ran = [p for p in oks if results.local_runs.get(p, {}).get("state") in
               ("succeeded", "failed")]
        return "ran" if ran else "compiled"
    return "compiled"


def render_results(results: Results) -> str:
    """The text of RESULTS.md (deterministic for given results)."""
    caps = {engine: capabilities(module) for engine, module in engines()}
    out = [
        "# Conformance results",
        "",
        "Generated by `scripts/conformance_table.py --update` from the programs in "
        "`tests/conformance/programs`; do not edit by hand (a test checks it is up to date).",
        "",
        "**compiled**: the engine's compiler produced a document (local / ray: the capability "
        "check passed); **ran (state)**: run on the local engine, final state; "
        "**unsupported: F**: rejected with `UnsupportedFeatureError` naming feature F.",
        "",
        "## Engine x program",
        "",
        "| program | " + " | ".join(results.engines) + " |",
        "|---|" + "---|" * len(results.engines),
    ]
    for program in results.programs:
        cells = [results.cell(engine, program) for engine in results.engines]
        out.append(f"| {program} | " + " | ".join(cells) + " |")
    out += [
        "",
        "## Engine x feature",
        "",
        "**compiled** / **ran**: at least one program using the feature compiled (ran on the "
        "local engine); **unsupported**: rejected naming the feature; **blocked by other "
        "features**: every program using it was rejected for another feature first.",
        "",
        "| feature | programs | " + " | ".join(results.engines) + " |",
        "|---|---|" + "---|" * len(results.engines),
    ]
    for feature in Feature:
        users = [p for p in results.programs if feature.value in results.features[p]]
        cells = [feature_cell(results, engine, feature, caps[engine])
                 for engine in results.engines]
        out.append(f"| {feature.value} | {', '.join(users)} | " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)


def programs_dir() -> Path:
    """Where the programs live (for messages)."""
    return PROGRAMS
