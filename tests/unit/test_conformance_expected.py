"""The hand-written expected answers of the conformance programs (tests/conformance/expected.py).

They are the oracle every engine's run is compared with, so they are checked here against
what they are written from: every program has one, it lists exactly the program's steps
(exit hook steps and sub-workflow steps, ``PARENT/STEP``, included), and every run and step
says why, naming rules that exist in docs/semantics.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from couler import ir
from tests.conformance.expected import EXPECTED, PARAGRAPHS
from tests.conformance.loader import load_program, program_paths

SEMANTICS = (Path(__file__).resolve().parents[2] / "docs" / "semantics.md").read_text(
    encoding="utf-8")
PATHS = {p.stem: p for p in program_paths()}
WORKFLOWS = {name: load_program(path) for name, path in PATHS.items()}
RULE = re.compile(r"\b([SE]\d+)\b")
STATES = {"succeeded", "failed", "skipped"}


def defined_rules() -> set[str]:
    """The S and E ids docs/semantics.md defines (first cell of a table row)."""
    return set(re.findall(r"^\| ([SE]\d+)\b", SEMANTICS, flags=re.MULTILINE))


def step_names(wf: ir.Workflow) -> set[str]:
    names: set[str] = set()
    for step in [*wf.steps, *(s for hook in wf.exit_hooks for s in hook.steps)]:
        names.add(step.name)
        if isinstance(step.body, ir.SubWorkflowSpec):
            inner = step.body.steps or next(
                w.steps for w in WORKFLOWS.values() if w.name == step.body.name)
            names |= {f"{step.name}/{name}" for name in step_names(
                ir.Workflow(name=step.body.name, steps=inner))}
    return names


def test_every_program_has_an_answer() -> None:
    assert sorted(EXPECTED) == sorted(PATHS)


def test_the_semantics_page_defines_the_rules() -> None:
    rules = defined_rules()
    assert {f"S{i}" for i in range(1, 12)} <= rules
    assert {f"E{i}" for i in range(1, 8)} <= rules


@pytest.mark.parametrize("program", sorted(PATHS))
def test_answer_lists_the_programs_steps(program: str) -> None:
    assert set(EXPECTED[program]["steps"]) == step_names(WORKFLOWS[program])


@pytest.mark.parametrize("program", sorted(PATHS))
def test_every_answer_names_its_rules(program: str) -> None:
    answer = EXPECTED[program]
    assert answer["state"] in ("succeeded", "failed")
    assert RULE.search(answer["why"]), f"{program}: the run's why names no rule"
    whys = [answer["why"]]
    for name, step in answer["steps"].items():
        assert step["state"] in STATES, name
        why = step["why"]
        named = RULE.search(why) or any(re.search(rf"\b{p}\b", why) for p in PARAGRAPHS)
        assert named, f"{program}/{name}: {why!r} names no rule"
        whys.append(why)
    unknown = {r for why in whys for r in RULE.findall(why)} - defined_rules()
    assert not unknown, f"{program} names rules docs/semantics.md does not define: {unknown}"


def test_paragraphs_named_exist() -> None:
    # "words", "attempts", "daemon": the page's definitions, attempts and daemon paragraphs
    assert "Words: a step **succeeded**" in SEMANTICS
    assert "Attempts count attempts" in SEMANTICS
    assert "A **daemon step**" in SEMANTICS


def test_retry_programs_state_their_attempts() -> None:
    retried = [name for name, wf in WORKFLOWS.items()
               if any(s.retry is not None for s in wf.steps)]
    assert sorted(retried) == ["oom_policies", "retry_backoff", "retry_timeout"]
    for name in retried:
        for step in WORKFLOWS[name].steps:
            assert "attempts" in EXPECTED[name]["steps"][step.name], (name, step.name)


def test_not_run_and_skipped_are_told_apart() -> None:
    """Both are recorded skipped; the why says which (S2 not run, S6 / S8 skipped)."""
    for program, answer in EXPECTED.items():
        for name, step in answer["steps"].items():
            if step["state"] == "skipped":
                assert re.search(r"not run|skipped by its when|does not fire", step["why"]), (
                    program, name)
