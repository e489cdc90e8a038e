"""Natural language → IR: the offline planner, the spec parser and the LLM repair loop."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from couler import ir
from couler.errors import UserError, ValidationError
from couler.generate import (
    CATALOG,
    assemble,
    generate_with_llm,
    parse_spec,
    plan,
    system_prompt,
)


def step_names(wf: ir.Workflow) -> list[str]:
    return [s.name for s in wf.steps]


def deps(wf: ir.Workflow, name: str) -> set[str]:
    step = wf.step(name)
    assert step is not None
    return {d.step for d in step.dependencies}


def test_two_models_evaluated_and_the_better_kept() -> None:
    wf, report = plan("Train an XGBoost and a LightGBM model on s3://data/churn.csv, "
                      "evaluate both, keep the better one")
    assert step_names(wf) == ["load-table", "preprocess", "train-xgboost", "evaluate-xgboost",
                              "train-lightgbm", "evaluate-lightgbm", "select-best"]
    assert deps(wf, "select-best") == {"evaluate-xgboost", "evaluate-lightgbm"}
    assert deps(wf, "train-lightgbm") == {"preprocess"}
    table = wf.parameter("table")
    assert table is not None and table.default == ir.Literal.of("s3://data/churn.csv")
    assert report.subtasks[-1] == "keep the better model"
    assert report.catalog_entries == ("load-table", "preprocess", "train", "evaluate",
                                      "select-best")
    ir.validate(wf)


def test_preprocess_train_evaluate_chain_with_defaults_noted() -> None:
    wf, report = plan("preprocess -> train -> evaluate")
    assert step_names(wf) == ["load-table", "preprocess", "train-xgboost", "evaluate-xgboost"]
    assert any("no model named" in n for n in report.notes)
    assert any("no data source" in n for n in report.notes)


def test_batch_size_sweep_becomes_a_map_and_a_selection() -> None:
    wf, report = plan("run a sweep over batch sizes 16, 32 and 64")
    sweep = wf.step("sweep")
    assert sweep is not None and sweep.foreach is not None
    assert [lit.value for lit in sweep.foreach.items] == [16, 32, 64]
    assert isinstance(sweep.body, ir.ScriptSpec) and "{{item}}" in sweep.body.args
    assert deps(wf, "select-best") == {"sweep"}
    assert "batch_size" in report.subtasks[2]


def test_learning_rate_sweep_keeps_decimals() -> None:
    wf, _ = plan("tune learning rates 0.01, 0.1 and 0.5 for logistic regression")
    sweep = wf.step("sweep")
    assert sweep is not None and sweep.foreach is not None
    assert [lit.value for lit in sweep.foreach.items] == [0.01, 0.1, 0.5]


def test_names_are_deterministic_and_overridable() -> None:
    text = "train xgboost on a.csv"
    assert plan(text)[0].name == plan("  train   xgboost on a.csv ")[0].name
    assert plan(text, name="mine")[0].name == "mine"


@pytest.mark.parametrize("text", ["", "   ", "book a flight to Paris"])
def test_requests_it_cannot_plan_are_refused(text: str) -> None:
    with pytest.raises(UserError, match="generate"):
        plan(text)


# ---------------------------------------------------------------------- spec


GOOD = {
    "name": "churn",
    "table": "churn.csv",
    "steps": [
        {"name": "load", "entry": "load-table"},
        {"name": "prep", "entry": "preprocess", "after": ["load"]},
        {"name": "fit", "entry": "train", "params": {"model": "lightgbm"}, "after": ["prep"]},
        {"name": "score", "entry": "evaluate", "after": ["fit"]},
    ],
}


def test_a_spec_assembles_with_data_wired_by_kind() -> None:
    wf = assemble(parse_spec("```json\n" + json.dumps(GOOD) + "\n```"))
    score = wf.step("score")
    assert score is not None
    sources = {a.name: a.source for a in score.input_artifacts}
    assert sources["model"] == ir.StepArtifactRef("fit", "model")
    assert sources["dataset"] == ir.StepArtifactRef("prep", "dataset")
    fit = wf.step("fit")
    assert fit is not None and isinstance(fit.body, ir.ScriptSpec)
    assert fit.body.args[0] == "lightgbm"


def issues_of(text: str) -> list[str]:
    with pytest.raises(ValidationError) as info:
        assemble(parse_spec(text))
    return [str(i) for i in info.value.issues]


def mutate(**changes: Any) -> str:
    data = json.loads(json.dumps(GOOD))
    for index, patch in changes.items():
        data["steps"][int(index[1:])].update(patch)
    return json.dumps(data)


@pytest.mark.parametrize(("text", "expected"), [
    ("not json", "field 'json': not valid JSON"),
    ("[1]", "expected a JSON object"),
    (mutate(s2={"entry": "rm -rf /"}), "step 'fit', field 'entry'"),
    (mutate(s2={"params": {"model": "gpt"}}), "step 'fit', field 'params.model'"),
    (mutate(s2={"params": {"epochs": "3"}}), "step 'fit', field 'params': epochs"),
    (mutate(s3={"after": ["nowhere"]}), "step 'score', field 'after': unknown step 'nowhere'"),
    (mutate(s1={"after": []}), "step 'prep', field 'after': a preprocess step must come after"),
    (mutate(s0={"name": "Bad Name"}), "step 'Bad Name', field 'name'"),
])
def test_spec_problems_name_the_step_and_field(text: str, expected: str) -> None:
    assert any(expected in i for i in issues_of(text)), issues_of(text)


# ----------------------------------------------------------------------- LLM


class Scripted:
    """A chat model that answers from a list and records what it was sent."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.seen: list[list[dict[str, str]]] = []

    def __call__(self, messages: Sequence[dict[str, str]]) -> str:
        self.seen.append([dict(m) for m in messages])
        return self.answers.pop(0)


def test_llm_answer_is_parsed_into_ir() -> None:
    model = Scripted(json.dumps(GOOD))
    wf, report = generate_with_llm("train lightgbm on churn.csv", model)
    assert wf.name == "churn" and report.planner == "llm" and report.rounds == 1
    assert model.seen[0][0]["role"] == "system"
    assert all(name in model.seen[0][0]["content"] for name in CATALOG)


def test_errors_are_sent_back_for_repair() -> None:
    model = Scripted(mutate(s3={"after": ["nowhere"]}), json.dumps(GOOD))
    _, report = generate_with_llm("train", model)
    assert report.rounds == 2
    feedback = model.seen[1][-1]["content"]
    assert "step 'score', field 'after'" in feedback


def test_engine_check_failures_are_repaired_too() -> None:
    calls: list[str] = []

    def check(wf: ir.Workflow) -> None:
        calls.append(wf.name)
        if len(calls) == 1:
            raise UserError("engine 'tekton' cannot run step 'fit'")

    model = Scripted(json.dumps(GOOD), json.dumps(GOOD))
    _, report = generate_with_llm("train", model, check=check)
    assert report.rounds == 2 and "tekton" in model.seen[1][-1]["content"]


def test_code_in_an_answer_is_never_run_and_the_request_is_refused() -> None:
    code = "```python\nimport os; os.system('touch /tmp/pwned')\n```"
    model = Scripted(code, code, code)
    with pytest.raises(UserError, match="no valid workflow after 3 rounds"):
        generate_with_llm("train", model, max_rounds=3)
    assert len(model.seen) == 3


def test_prompt_documents_the_schema() -> None:
    assert '"entry"' in system_prompt() and "train-trial" in system_prompt()
