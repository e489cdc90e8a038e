"""Golden tests: each program in programs/ compiles to the Argo document in expected/.

The programs re-express, against Couler's own API, the scenarios of the open-source
Couler SDK's golden cases (coin flip, exit handlers, while loop, linear and diamond
DAGs, conditional DAG, implicit parameter passing, input parameters, producer/consumer,
multiple outputs, cron, secrets, concurrent and concurrent sub-tasks, resources) plus
the features Couler adds (else branch, map over static items and over an upstream
output, workflow parameters, retry/timeout/cache policies, run_job actions).

Comparison is of the canonical form (see canonical.py): goldens catch format drift, they
do not say what a document means. A golden change must come with a semantic test that
explains it: ``SEMANTIC_TESTS`` names, for every golden program, the conformance programs
(tests/conformance/programs) whose answers, written by hand from docs/semantics.md
(tests/conformance/expected.py), assert the meaning of the features it uses -- and
``test_every_golden_names_its_semantic_tests`` fails when a golden program uses a feature
none of them covers. So a change of meaning shows up as a changed expected answer (or a
new conformance program) in the same commit, never as a regenerated golden alone. To
regenerate after an intended change: ``./scripts/test.sh tests/golden --update-goldens``
and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from couler.api.capture import capture_program
from couler.compilers.argo import compile_workflow, to_yaml
from couler.engines.base import features_used
from tests.argo_schema import assert_valid_argo
from tests.conformance.expected import EXPECTED
from tests.conformance.loader import PROGRAMS as CONFORMANCE
from tests.conformance.loader import load_program
from tests.golden.canonical import canonical, canonical_text

HERE = Path(__file__).parent
PROGRAMS = sorted((HERE / "programs").glob("*.py"))

# golden program -> the conformance programs whose expected answers assert its meaning
SEMANTIC_TESTS: dict[str, tuple[str, ...]] = {
    "coin_flip": ("sibling_whens", "when_else"),  # S6: whens on one output are siblings
    "concurrent": ("subworkflows",),
    "concurrent_subtasks": ("subworkflows",),
    "cron": ("cron",),
    "dag_conditional": ("when_else", "strict_succeeded"),  # S1, S3, S6
    "dag_diamond": ("subworkflows", "skip_propagation", "basic_steps"),  # S1 / S2, fan-in
    "dag_linear": ("skip_propagation", "basic_steps"),
    "dag_linear_set_dependencies": ("skip_propagation", "basic_steps"),
    "exit_handlers": ("exit_hooks", "basic_steps"),  # S8
    "implicit_parameter_passing": ("basic_steps",),  # S11: an output fills an argument
    "input_bare_string": ("basic_steps",),
    "input_from_script": ("basic_steps",),
    "input_two_calls": ("basic_steps",),
    "input_two_params": ("basic_steps", "workflow_params"),
    "job_apply": ("job_step",),
    "map_static": ("map_static",),  # S10
    "map_upstream": ("map_upstream",),
    "multiple_outputs": ("basic_steps", "artifacts"),
    "policies": ("retry_backoff", "retry_timeout", "resources_cache", "oom_policies",
                 "placement"),
    "producer_consumer": ("artifacts",),
    "resources": ("resources_cache", "gpu"),
    "secrets": ("secrets",),
    "when_else": ("when_else",),
    "while_loop": ("while_loop",),
    "workflow_parameters": ("workflow_params",),
}


def _compile(program: Path) -> list[dict[str, object]]:
    return [compile_workflow(wf) for wf in capture_program(str(program))]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.stem)
def test_program_matches_golden(program: Path, update_goldens: bool) -> None:
    docs = _compile(program)
    assert docs, f"{program.name} built no workflow"
    for doc in docs:
        assert_valid_argo(doc)
    expected_path = HERE / "expected" / f"{program.stem}.yaml"
    text = "---\n".join(to_yaml(d) for d in docs)
    if update_goldens:
        expected_path.write_text(text, encoding="utf-8")
    assert expected_path.exists(), f"no golden for {program.name}; run with --update-goldens"
    expected = list(yaml.safe_load_all(expected_path.read_text(encoding="utf-8")))
    assert canonical_text(docs) == canonical_text(expected)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.stem)
def test_every_golden_names_its_semantic_tests(program: Path) -> None:
    """Every feature of the golden program is used by a conformance program named for it,
    whose hand-written expected answer asserts what it means."""
    named = SEMANTIC_TESTS.get(program.stem)
    assert named, f"{program.stem}: name its semantic tests in SEMANTIC_TESTS"
    assert set(named) <= set(EXPECTED), sorted(set(named) - set(EXPECTED))
    covered = {f for name in named for f in features_used(load_program(CONFORMANCE /
                                                                      f"{name}.py"))}
    used = {f for wf in capture_program(str(program)) for f in features_used(wf)}
    assert used <= covered, (f"{program.stem} uses {sorted(f.value for f in used - covered)}, "
                             f"which none of {named} asserts")


def test_semantic_tests_name_only_goldens() -> None:
    assert sorted(SEMANTIC_TESTS) == [p.stem for p in PROGRAMS]


def test_every_golden_has_a_program() -> None:
    stems = {p.stem for p in PROGRAMS}
    orphans = [p.name for p in (HERE / "expected").glob("*.yaml") if p.stem not in stems]
    assert orphans == []


def test_dag_and_set_dependencies_agree() -> None:
    via_dag = _compile(HERE / "programs" / "dag_linear.py")
    via_set = _compile(HERE / "programs" / "dag_linear_set_dependencies.py")
    assert canonical(via_dag) == canonical(via_set)


def test_canonical_form_ignores_named_item_order_but_not_args() -> None:
    a = {"tasks": [{"name": "x", "args": ["1", "2"]}, {"name": "y"}]}
    b = {"tasks": [{"name": "y"}, {"name": "x", "args": ["1", "2"]}]}
    c = {"tasks": [{"name": "y"}, {"name": "x", "args": ["2", "1"]}]}
    assert canonical(a) == canonical(b)
    assert canonical(a) != canonical(c)
