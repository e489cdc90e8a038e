"""The NL expectation oracle (tests/nl_oracle.py) on small hand-built IR workflows.

Every key has a workflow that meets it and one that does not; the semantics are those of
the header of tests/nl/dev-cases.yaml.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from couler import ir
from tests.nl_oracle import KEYS, check, cron_fields, seconds

CASES = Path(__file__).resolve().parents[1] / "nl" / "dev-cases.yaml"
S, F = ir.EdgeCondition.SUCCEEDED, ir.EdgeCondition.FAILED


def ctr(name: str, *deps: str, args: tuple[str, ...] = (), **kw: object) -> ir.Step:
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", args=args),
                   dependencies=tuple(ir.Dependency(d) for d in deps),
                   **kw)  # type: ignore[arg-type]


def wf_of(*steps: ir.Step, **kw: object) -> ir.Workflow:
    return ir.Workflow(name="oracle", steps=steps, **kw)  # type: ignore[arg-type]


def items(*values: object, parallelism: int | None = None) -> ir.ForEach:
    return ir.ForEach(items=tuple(ir.Literal.of(v) for v in values), parallelism=parallelism)


def cond(left: ir.ValueSource, op: str, right: object) -> ir.When:
    return ir.When(ir.Condition(left, ir.CompareOp(op), ir.Literal.of(right)))


CHAIN = wf_of(ctr("load-csv"), ctr("train-xgboost", "load-csv"), ctr("report", "train-xgboost"))


# --------------------------------------------------------------------------- text


def test_mentions_read_every_text_field_case_insensitively() -> None:
    wf = wf_of(
        ir.Step(name="a", template="TplWord", body=ir.ContainerSpec(
            image="ghcr.io/acme/ImageWord:1", command=("cmdword",), args=("--x", "ArgWord"))),
        ir.Step(name="b", body=ir.ScriptSpec(image="python", source="import SourceWord"),
                env=(ir.EnvVar("E", "EnvWord"), ir.EnvVar("S", secret=ir.SecretRef("s", "k")))),
        ir.Step(name="c", body=ir.JobSpec.of({"kind": "PyTorchJob", "x": "ManifestWord"})),
        ir.Step(name="d", body=ir.ContainerSpec(image="alpine"), input_artifacts=(
            ir.InputArtifact("in", "/in", ir.ArtifactLocation(
                ir.StorageKind.S3, bucket="acme-ml", key="legal-qa/train.jsonl")),)),
        ir.Step(name="e", body=ir.ContainerSpec(image="alpine"), output_artifacts=(
            ir.OutputArtifact("out", "/out", ir.ArtifactLocation(
                ir.StorageKind.HTTP, url="https://example.org/adult.csv")),)),
    )
    words = ["tplword", "imageword", "CMDWORD", "argword", "sourceword", "envword",
             "manifestword", "s3://acme-ml/legal-qa", "adult.csv"]
    assert check(wf, {"mentions": words}) == []
    assert check(wf, {"mentions": ["tplword", "nowhere"]}) == [
        "mentions: no step mentions 'nowhere'"]


def test_mentions_resolve_inputs_placeholders_to_literals_and_parameter_defaults() -> None:
    step = ir.Step(
        name="fetch", body=ir.ContainerSpec(image="alpine", args=(
            "--url", "{{inputs.url}}", "--table", "{{inputs.table}}", "{{inputs.up}}")),
        env=(ir.EnvVar("WHERE", "{{inputs.url}}"),),
        inputs=(ir.InputParameter("url", ir.Literal.of("https://x.org/sms-spam.zip")),
                ir.InputParameter("table", ir.WorkflowParamRef("table")),
                ir.InputParameter("up", ir.StepOutputRef("prev", "path"))))
    wf = wf_of(ctr("prev"), step, parameters=(
        ir.Parameter("table", default=ir.Literal.of("customer_lifetime")),))
    assert check(wf, {"mentions": ["sms-spam", "customer_lifetime"]}) == []
    # input values count only where a placeholder uses them
    unused = ir.Step(name="s", body=ir.ContainerSpec(image="alpine"),
                     inputs=(ir.InputParameter("u", ir.Literal.of("hidden-value")),))
    assert check(wf_of(unused), {"mentions": ["hidden-value"]}) != []


def test_mentions_in_map_items_count_for_that_copy() -> None:
    wf = wf_of(ctr("deploy", foreach=items("us-east-1", "eu-central-1")))
    assert check(wf, {"mentions": ["eu-central"]}) == []
    assert check(wf, {"mentions": ["ap-northeast"]}) != []


# --------------------------------------------------------------------------- graph


def test_min_steps_counts_a_fan_out_once_and_sub_workflow_bodies_by_their_steps() -> None:
    body = ir.SubWorkflowSpec("group", steps=(ctr("x"), ctr("y", "x")))
    wf = wf_of(ctr("a", foreach=items(1, 2, 3)), ir.Step(name="g", body=body))
    assert check(wf, {"min_steps": 3}) == []  # a, x, y; not g itself, a once
    assert check(wf, {"min_steps": 4}) == ["min_steps: 3 steps, expected at least 4"]


def test_order_is_transitive_and_not_reversed() -> None:
    assert check(CHAIN, {"order": [["load", "report"], ["csv", "xgboost"]]}) == []
    assert check(CHAIN, {"order": [["report", "load"]]}) != []
    # two branches of a diamond are not ordered
    wf = wf_of(ctr("a"), ctr("b", "a"), ctr("c", "a"), ctr("d", "b", "c"))
    assert check(wf, {"order": [["a", "d"]]}) == []
    assert check(wf, {"order": [["b", "c"]]}) != []


def test_order_follows_depends_terms_when_reads_and_sub_workflow_boundaries() -> None:
    gate = ctr("promote", when=cond(ir.StepOutputRef("evaluate", "auc"), ">", 0.4))
    body = ir.SubWorkflowSpec("inner", steps=(ctr("inner-train"),))
    wf = wf_of(ctr("evaluate"), gate,
               ctr("notify", depends=ir.DependsTerm("cleanup", F)),
               ctr("cleanup"),
               ir.Step(name="group", body=body, dependencies=(ir.Dependency("evaluate"),)),
               ctr("after", "group"))
    assert check(wf, {"order": [["evaluate", "promote"], ["cleanup", "notify"],
                                ["evaluate", "inner-train"], ["inner-train", "after"]]}) == []
    assert check(wf, {"order": [["promote", "inner-train"]]}) != []


def test_exit_hook_steps_come_after_every_main_step() -> None:
    hook = ir.ExitHook(ir.RunStatus.ANY, (ctr("heartbeat"),))
    wf = wf_of(ctr("a"), ctr("b"), exit_hooks=(hook,))
    assert check(wf, {"order": [["a", "heartbeat"], ["b", "heartbeat"]]}) == []
    assert check(wf, {"order": [["heartbeat", "a"]]}) != []


def test_parallel_needs_unrelated_steps_one_per_member() -> None:
    wf = wf_of(ctr("prep"), ctr("ridge", "prep"), ctr("lasso", "prep"),
               ctr("report", "ridge", "lasso"))
    assert check(wf, {"parallel": [["ridge", "lasso"]]}) == []
    assert check(wf, {"parallel": [["prep", "lasso"]]}) == [
        "parallel: no concurrent steps mentioning each of ['prep', 'lasso']"]
    # one step mentioning both members is not two concurrent steps
    assert check(wf_of(ctr("ridge-lasso")), {"parallel": [["ridge", "lasso"]]}) != []


def test_parallel_accepts_distinct_copies_of_one_fan_out() -> None:
    wf = wf_of(ctr("features", foreach=items("web", "mobile")))
    assert check(wf, {"parallel": [["web", "mobile"]]}) == []
    # words in the step's own text name the step as a whole, not one copy per member
    assert check(wf, {"parallel": [["features", "features"]]}) != []
    assert check(wf, {"parallel": [["features", "web"]]}) != []
    # a fan-out running one copy at a time has no concurrent copies
    serial = wf_of(ctr("features", foreach=items("web", "mobile", parallelism=1)))
    assert check(serial, {"parallel": [["web", "mobile"]]}) != []
    # the same item cannot be two copies
    assert check(wf, {"parallel": [["web", "web"]]}) != []


# --------------------------------------------------------------------------- fan-out


def test_fanout_counts_static_items_exactly() -> None:
    wf = wf_of(ctr("score", foreach=items(*range(16))))
    assert check(wf, {"fanout": 16}) == []
    assert check(wf, {"fanout": 15}) == ["fanout: no step fanned out over exactly 15 items"]


def test_fanout_counts_a_list_parameter_default_and_a_runtime_list_producer() -> None:
    by_param = ctr("fit", foreach=ir.ForEach(source=ir.WorkflowParamRef("sites")))
    wf = wf_of(by_param, parameters=(ir.Parameter(
        "sites", ir.ValueType.LIST, ir.Literal.of(["lyon", "porto", "gdansk", "turin"])),))
    assert check(wf, {"fanout": 4, "mentions": ["gdansk"]}) == []
    assert check(wf, {"fanout": 3}) != []
    runtime = wf_of(ctr("split", args=("--shards", "25")),
                    ctr("gen", "split", foreach=ir.ForEach(
                        source=ir.StepOutputRef("split", "shards"))))
    assert check(runtime, {"fanout": 25}) == []
    assert check(runtime, {"fanout": 24}) != []


def test_fanout_counts_unrelated_copies_of_one_template() -> None:
    def deploy(region: str, *deps: str) -> ir.Step:
        return ir.Step(name=f"deploy-{region}", template="deploy",
                       body=ir.ContainerSpec(image="alpine"),
                       dependencies=tuple(ir.Dependency(d) for d in deps))

    wf = wf_of(ctr("tests"), deploy("us", "tests"), deploy("eu", "tests"), deploy("ap", "tests"))
    assert check(wf, {"fanout": 3}) == []
    chained = wf_of(deploy("us"), deploy("eu", "deploy-us"), deploy("ap", "deploy-eu"))
    assert check(chained, {"fanout": 3}) != []


def test_max_parallel_reads_the_fan_out_step_or_workflow_limit() -> None:
    assert check(wf_of(ctr("t", foreach=items(*range(50), parallelism=10))),
                 {"max_parallel": 10}) == []
    assert check(wf_of(ctr("t", parallelism=2)), {"max_parallel": 2}) == []
    assert check(wf_of(ctr("t"), parallelism=5), {"max_parallel": 5}) == []
    assert check(wf_of(ctr("t", foreach=items(1, 2, parallelism=10))),
                 {"max_parallel": 5}) != []


# --------------------------------------------------------------------------- conditions


def test_when_matches_words_of_step_output_refs_and_numbers_numerically() -> None:
    wf = wf_of(ctr("evaluate-wape"), ctr("register", "evaluate-wape", when=cond(
        ir.StepOutputRef("evaluate-wape", "wape"), "<", 0.35)))
    assert check(wf, {"when": "wape"}) == []
    assert check(wf, {"when": "steps.evaluate-wape.outputs.wape"}) == []
    assert check(wf, {"when": "0.350"}) == []  # numerically equal
    assert check(wf, {"when": 0.35}) == []
    assert check(wf, {"when": "0.36"}) == ["when: no step's condition mentions '0.36'"]
    assert check(CHAIN, {"when": "wape"}) != []  # no conditional step


def test_on_failure_accepts_failure_hooks_and_failure_edges() -> None:
    for on in (ir.RunStatus.FAILED, ir.RunStatus.ERROR, ir.RunStatus.ANY):
        wf = wf_of(ctr("a"), exit_hooks=(ir.ExitHook(on, (ctr("opsgenie-page"),)),))
        assert check(wf, {"on_failure": "opsgenie"}) == []
    edge = wf_of(ctr("train"), ir.Step(name="slack", body=ir.ContainerSpec(image="alpine"),
                                       dependencies=(ir.Dependency("train", F),)))
    assert check(edge, {"on_failure": "slack"}) == []
    negated = wf_of(ctr("train"), ctr("slack", "train",
                                      depends=ir.DependsNot(ir.DependsTerm("train", S))))
    assert check(negated, {"on_failure": "slack"}) == []
    ok_only = wf_of(ctr("a"), exit_hooks=(ir.ExitHook(ir.RunStatus.SUCCEEDED, (ctr("slack"),)),))
    assert check(ok_only, {"on_failure": "slack"}) == [
        "on_failure: no step mentioning 'slack' runs when the workflow fails"]
    assert check(wf_of(ctr("train"), ctr("slack", "train")), {"on_failure": "slack"}) != []


def test_on_exit_accepts_any_hooks_both_hooks_and_completed_edges() -> None:
    anyhook = wf_of(ctr("a"), exit_hooks=(ir.ExitHook(ir.RunStatus.ANY, (ctr("heartbeat"),)),))
    assert check(anyhook, {"on_exit": "heartbeat"}) == []
    both = wf_of(ctr("a"), exit_hooks=(ir.ExitHook(ir.RunStatus.SUCCEEDED, (ctr("emr-ok"),)),
                                       ir.ExitHook(ir.RunStatus.FAILED, (ctr("emr-bad"),))))
    assert check(both, {"on_exit": "emr"}) == []
    done = wf_of(ctr("a"), ir.Step(name="teardown", body=ir.ContainerSpec(image="alpine"),
                                   dependencies=(ir.Dependency("a", ir.EdgeCondition.COMPLETED),)))
    assert check(done, {"on_exit": "teardown"}) == []
    failed_only = wf_of(ctr("a"), exit_hooks=(ir.ExitHook(ir.RunStatus.FAILED, (ctr("emr"),)),))
    assert check(failed_only, {"on_exit": "emr"}) == [
        "on_exit: no step mentioning 'emr' runs whatever the outcome"]
    assert check(CHAIN, {"on_exit": "report"}) != []  # a plain success edge


# --------------------------------------------------------------------------- policies


def test_retry_uses_the_step_policy_else_the_workflow_default() -> None:
    assert check(wf_of(ctr("a", retry=ir.RetryPolicy(4))), {"retry": 4}) == []
    assert check(wf_of(ctr("a"), defaults=ir.StepDefaults(retry=ir.RetryPolicy(7))),
                 {"retry": 5}) == []
    # a step's own policy replaces the default
    wf = wf_of(ctr("a", retry=ir.RetryPolicy(1)), defaults=ir.StepDefaults(retry=ir.RetryPolicy(7)))
    assert check(wf, {"retry": 5}) == ["retry: no step retries at least 5 times"]


def test_gpu_and_memory_use_effective_resources() -> None:
    res = ir.Resources(memory_request="48Gi", gpu=3)
    assert check(wf_of(ctr("a", resources=res)), {"gpu": 3, "memory_gi": 48}) == []
    assert check(wf_of(ctr("a"), defaults=ir.StepDefaults(resources=res)),
                 {"gpu": 2, "memory_gi": 40}) == []
    assert check(wf_of(ctr("a", resources=res)), {"gpu": 4}) != []
    assert check(wf_of(ctr("a", resources=res)), {"memory_gi": 49}) != []
    # a limit counts too; 64G is 59.6Gi
    g64 = wf_of(ctr("a", resources=ir.Resources(memory_limit="64G")))
    assert check(g64, {"memory_gi": 59}) == []
    assert check(g64, {"memory_gi": 60}) != []


@pytest.mark.parametrize("form", [2700, "2700", "45m", "0h45m"])
def test_timeout_accepts_seconds_and_durations(form: object) -> None:
    assert check(wf_of(ctr("a", timeout_seconds=2700)), {"timeout": form}) == []
    assert check(wf_of(ctr("a", timeout_seconds=2760)), {"timeout": form}) != []


def test_timeout_reads_defaults_and_the_workflow_timeout() -> None:
    assert check(wf_of(ctr("a"), defaults=ir.StepDefaults(timeout_seconds=5400)),
                 {"timeout": "1h30m"}) == []
    assert check(wf_of(ctr("a"), timeout_seconds=36000), {"timeout": "10h"}) == []
    assert check(wf_of(ctr("a"), timeout_seconds=36000), {"timeout": "3h"}) != []


def test_seconds_parses_and_refuses() -> None:
    assert [seconds(v) for v in (90, "90", "45m", "3h", "1h30m", "2d")] == [
        90, 90, 2700, 10800, 5400, 172800]
    with pytest.raises(ValueError):
        seconds("soon")


@pytest.mark.parametrize(("want", "got"), [
    ("0 6 * * 1", "0 6 * * MON"), ("0 6 * * 1", "0 6 * * 1"), ("*/30 * * * *", "0,30 * * * *"),
    ("30 7 * * 1-5", "30 7 * * mon-fri"), ("0 0 * * 0", "0 0 * * 7"),
    ("0 */6 * * *", "0 0-23/6 * * *"),
    ("0 0 * * *", "@daily"), ("0 3 1 * *", "0 3 1 * *"),
])
def test_cron_accepts_equivalent_forms(want: str, got: str) -> None:
    assert check(wf_of(ctr("a"), schedule=ir.CronSchedule(got)), {"cron": want}) == []


def test_cron_refuses_other_schedules_and_no_schedule() -> None:
    wf = wf_of(ctr("a"), schedule=ir.CronSchedule("0 6 * * 2"))
    assert check(wf, {"cron": "0 6 * * 1"}) == [
        "cron: schedule '0 6 * * 2' is not equivalent to '0 6 * * 1'"]
    assert check(wf_of(ctr("a"), schedule=ir.CronSchedule("*/20 * * * *")),
                 {"cron": "*/30 * * * *"}) != []
    assert check(CHAIN, {"cron": "0 6 * * 1"}) != []
    assert cron_fields("0 6 * * MON") == cron_fields("0 6 * * 1")


def test_loop_needs_a_loop_within_the_iteration_bound() -> None:
    again = ir.Condition(ir.StepOutputRef("tune", "acc"), ir.CompareOp.LT, ir.Literal.of(0.95))
    wf = wf_of(ctr("tune", loop=ir.Loop(again, max_iterations=8)))
    assert check(wf, {"loop": 8}) == []
    assert check(wf, {"loop": 7}) == ["loop: no step repeats with at most 7 iterations"]
    assert check(CHAIN, {"loop": 100}) != []


# --------------------------------------------------------------------------- the cases file


def test_unknown_keys_and_malformed_values_fail() -> None:
    assert check(CHAIN, {"bogus": 1}) == ["bogus: unknown expectation key"]
    assert check(CHAIN, {"min_steps": "many"}) != []
    assert check(CHAIN, {"order": [["load"]]}) != []
    assert check(CHAIN, {"cron": "every day"}) != []


def test_every_key_of_the_cases_file_is_known_to_the_oracle() -> None:
    cases = yaml.safe_load(CASES.read_text())
    used = {key for case in cases for key in case["expect"]}
    assert len(cases) == 40
    assert used <= KEYS
    assert all(f"#   {key}:" in CASES.read_text() for key in KEYS)
