"""The documented engine differences: code, docs and the warnings of ``couler compile`` agree.

Each difference in :data:`couler.semantics.EXCEPTIONS` is a row of docs/semantics.md; the
conformance programs that meet one on an engine are exactly the ones the conformance
tests list as differing there (tests/integration/test_conformance_*.py), and
``couler compile`` warns about it on stderr, naming the workflow, steps and rule.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from couler import ir
from couler.semantics import EXCEPTIONS, differences, failed_leaves
from tests.conformance.loader import load_program, program_paths

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")
PROGRAMS = {p.stem: load_program(p) for p in program_paths()}


def test_every_exception_is_a_row_of_the_docs_and_nothing_else_is() -> None:
    rows = re.findall(r"^\| (E\d+) \| ([^|]+) \| (S\d+) \| (.+) \|$", DOC, re.MULTILINE)
    assert [(e.id, ", ".join(e.engines), e.rule, e.summary) for e in EXCEPTIONS] == \
        [(i, engines.strip(), rule, text) for i, engines, rule, text in rows]


def test_the_rules_named_by_exceptions_are_defined() -> None:
    rules = set(re.findall(r"^\| (S\d+) ", DOC, re.MULTILINE))
    assert {e.rule for e in EXCEPTIONS} <= rules and len(rules) == 11


def met(engine: str) -> dict[str, set[str]]:
    """Per conformance program, the exceptions it meets on ``engine``."""
    out = {name: {w.exception.id for w in differences(wf, engine)}
           for name, wf in PROGRAMS.items()}
    return {name: ids for name, ids in out.items() if ids}


def test_the_programs_airflow_runs_differently_are_the_ones_warned_about() -> None:
    # test_conformance_airflow.AIRFLOW_DIFFERENCES lists unusual_edges for E4 (cron and
    # subworkflows differ from the local engine's refusals, not from the semantics)
    warned = met("airflow")
    assert warned == {"unusual_edges": {"E4"}}


def test_edges_from_a_sub_workflow_that_may_not_run_are_warned_on_airflow() -> None:
    strict = ir.EdgeCondition.SUCCEEDED_ONLY
    inner = (ir.Step(name="x", body=ir.ContainerSpec(image="a", command=("true",))),)
    group = ir.Step(name="grp", body=ir.SubWorkflowSpec(name="grp", steps=inner),
                    dependencies=(ir.Dependency("gate", strict),))
    wf = ir.Workflow(name="g", steps=(*_chain(("gate", ())), group, *_chain(
        ("after", ("grp",)))))
    (warning,) = differences(wf, "airflow")
    assert (warning.exception.id, warning.steps) == ("E2", ("after",))
    plain = ir.Workflow(name="g", steps=(*_chain(("gate", ())),
                                          ir.Step(name="grp", body=group.body,
                                                  dependencies=(ir.Dependency("gate"),)),
                                          *_chain(("after", ("grp",)))))
    assert differences(plain, "airflow") == []  # nothing upstream can skip it unmarked


def test_fail_fast_is_warned_where_independent_branches_exist() -> None:
    warned = met("kfp")
    assert "E1" in warned["skip_propagation"]  # KFP_DIFFERENCES: `unrelated` is not run
    assert "basic_steps" not in warned  # one chain: nothing to stop
    step = differences(PROGRAMS["skip_propagation"], "tekton")[0]
    assert step.steps[:2] == ("train", "unrelated") and "S7" in str(step)
    assert differences(PROGRAMS["skip_propagation"], "argo") == []


def test_argo_runs_every_program_as_specified() -> None:
    assert met("argo") == {}


def test_status_gated_exit_hooks_are_warned_on_kfp() -> None:
    wf = ir.Workflow(name="hooks", steps=(
        ir.Step(name="a", body=ir.ContainerSpec(image="alpine", command=("true",))),),
        exit_hooks=(ir.ExitHook(ir.RunStatus.FAILED, (
            ir.Step(name="mourn", body=ir.ContainerSpec(image="alpine", command=("true",))),
        )),))
    (warning,) = differences(wf, "kfp")
    assert warning.exception.id == "E3" and warning.steps == ("mourn",)


def test_edge_handlers_are_warned_on_kfp() -> None:
    """E3: a failed / completed handler that does not fire reports succeeded; E6: the run
    fails although the failure is handled; E7: an any edge from a step that may not run."""
    warned = {w.exception.id: w.steps for w in differences(PROGRAMS["omitted_upstream"],
                                                           "kfp")}
    assert warned["E3"] == ("on-eval-failure", "after-eval")
    assert warned["E6"] == ("on-eval-failure", "after-eval", "always")
    assert warned["E7"] == ("always",)  # evaluate runs only after train
    edges = {w.exception.id: w.steps for w in differences(PROGRAMS["edge_conditions"], "kfp")}
    assert edges["E6"] == ("on-failure", "always") and "E7" not in edges  # broken always runs


@pytest.mark.parametrize(("engine", "warned"), [("tekton", True), ("argo", False)])
def test_couler_compile_prints_the_warning(tmp_path: Path, engine: str, warned: bool) -> None:
    program = tmp_path / "branches.py"
    program.write_text(
        "import couler.argo as couler\n"
        "for name in ('a', 'b'):\n"
        "    couler.set_dependencies(lambda name=name: couler.run_container(\n"
        "        image='alpine', command=['true'], step_name=name))\n")
    proc = subprocess.run([sys.executable, "-m", "couler", "compile", str(program),
                           "--engine", engine], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    line = "couler: warning: workflow 'branches', steps 'a', 'b': E1 (S7) on tekton"
    assert (line in proc.stderr) is warned, proc.stderr
    assert "warning" not in proc.stdout


def _chain(*specs: tuple[str, tuple[str, ...]]) -> list[ir.Step]:
    return [ir.Step(name=n, body=ir.ContainerSpec(image="a", command=("true",)),
                    dependencies=tuple(ir.Dependency(d) for d in deps)) for n, deps in specs]


@pytest.mark.parametrize(("outcomes", "leaves"), [
    # a handled failure: the handler succeeded, nothing failed reaches a leaf
    ({"train": "failed", "deploy": "skipped", "alert": "succeeded"}, ["deploy"]),
    ({"train": "failed", "alert": "succeeded", "deploy": "succeeded"}, []),
    ({"train": "succeeded", "alert": "skipped", "deploy": "succeeded"}, []),
    # the failure stops deploy (not run): it carries train's failed branch to the leaf
    ({"train": "failed", "alert": "failed", "deploy": "skipped"}, ["deploy", "alert"]),
])
def test_failed_leaves_follow_argos_dag_phase(outcomes: dict[str, str],
                                              leaves: list[str]) -> None:
    steps = _chain(("train", ()), ("deploy", ("train",)), ("alert", ("train",)))
    assert sorted(failed_leaves(steps, outcomes.__getitem__)) == sorted(leaves)


def test_a_skipped_leaf_with_several_parents_fails_if_any_branch_did() -> None:
    steps = _chain(("a", ()), ("b", ()), ("join", ("a", "b")))
    state = {"a": "succeeded", "b": "failed", "join": "skipped"}
    assert failed_leaves(steps, state.__getitem__) == ["join"]
    state["join"] = "succeeded"  # it ran (an any edge) and succeeded: b is handled
    assert failed_leaves(steps, state.__getitem__) == []
