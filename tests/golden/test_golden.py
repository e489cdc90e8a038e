"""Golden tests: each program in programs/ compiles to the Argo document in expected/.

The programs re-express, against Couler's own API, the scenarios of the open-source
Couler SDK's golden cases (coin flip, exit handlers, while loop, linear and diamond
DAGs, conditional DAG, implicit parameter passing, input parameters, producer/consumer,
multiple outputs, cron, secrets, concurrent and concurrent sub-tasks, resources) plus
the features Couler adds (else branch, map over static items and over an upstream
output, workflow parameters, retry/timeout/cache policies, run_job actions).

Comparison is semantic (see canonical.py). To regenerate after an intended change:
``./scripts/test.sh tests/golden --update-goldens`` and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from couler.api.capture import capture_program
from couler.compilers.argo import compile_workflow, to_yaml
from tests.argo_schema import assert_valid_argo
from tests.golden.canonical import canonical, canonical_text

HERE = Path(__file__).parent
PROGRAMS = sorted((HERE / "programs").glob("*.py"))


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
