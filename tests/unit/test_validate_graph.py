"""The IR validator's graph rules: names, edges, ``depends`` terms and cycles.

Each test builds the smallest workflow breaking (or just not breaking) one rule and
checks the exact list of issues, so a rule that fires too often, too rarely, on the
wrong step or field, is caught (found by the mutation check, bench/mutation.py).
"""

from __future__ import annotations

from couler import ir
from couler.errors import Issue

E = ir.EdgeCondition
T = ir.DependsTerm


def step(name: str, *deps: str | ir.Dependency, **fields: object) -> ir.Step:
    fields.setdefault("body", ir.ContainerSpec(image="alpine", command=("true",)))
    return ir.Step(name=name, dependencies=tuple(
        d if isinstance(d, ir.Dependency) else ir.Dependency(d) for d in deps),
        **fields)  # type: ignore[arg-type]


def mapped(name: str) -> ir.Step:
    return step(name, foreach=ir.ForEach(items=(ir.Literal.of(1), ir.Literal.of(2))))


def issues(*steps: ir.Step, **kw: object) -> list[tuple[str, str, str]]:
    found: list[Issue] = ir.find_issues(ir.Workflow("w", steps, **kw))  # type: ignore[arg-type]
    return [(i.step, i.field, i.message) for i in found]


def test_a_valid_diamond_has_no_issue() -> None:
    assert issues(step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c")) == []


def test_a_step_name_used_twice_is_reported_once() -> None:
    assert issues(step("a"), step("a")) == [("a", "name", "step name is used twice")]


def test_a_step_name_at_the_limit_is_accepted_and_one_more_is_not() -> None:
    assert issues(step("s" * 63)) == []
    (issue,) = issues(step("s" * 64))
    assert issue[:2] == ("s" * 64, "name") and "at most 63" in issue[2]
    (issue,) = issues(step("Bad_Name"))
    assert issue[:2] == ("Bad_Name", "name") and "DNS-1123" in issue[2]


def test_an_empty_step_name_is_reported_on_the_workflow() -> None:
    assert ("", "name", "a step needs a name") in issues(step(""))


def test_a_self_dependency_is_reported_but_is_not_a_cycle() -> None:
    assert issues(step("a", "a")) == [("a", "dependencies", "a step cannot depend on itself")]


def test_an_unknown_and_a_repeated_dependency() -> None:
    assert issues(step("a"), step("b", "a", "x", "a")) == [
        ("b", "dependencies", "depends on unknown step 'x'"),
        ("b", "dependencies", "dependency on 'a' is listed twice"),
    ]


def test_depends_terms_must_be_listed_dependencies() -> None:
    expr = ir.DependsAny((T("a"), ir.DependsNot(ir.DependsAll((T("b", E.FAILED), T("c"))))))
    assert issues(step("a"), step("b"), step("c"), step("d", "a", "c", depends=expr)) == [
        ("d", "depends", "expression names 'b', which is not in dependencies")]
    assert issues(step("a"), step("b"), step("c"),
                  step("d", "a", ir.Dependency("b", E.ANY), "c", depends=expr)) == []


def test_item_counting_edges_need_a_map_upstream() -> None:
    message = ("condition {!r} on 'a' needs a map step (it counts the items); use "
               "'succeeded_only' or 'failed' for a single step")
    for cond in (E.ANY_SUCCEEDED, E.ALL_FAILED):
        assert issues(step("a"), step("b", ir.Dependency("a", cond))) == [
            ("b", "dependencies", message.format(cond.value))]
        assert issues(mapped("a"), step("b", ir.Dependency("a", cond))) == []
        # in a depends expression too, on the field "depends"
        assert issues(step("a"), step("b", ir.Dependency("a", E.ANY),
                                      depends=ir.DependsNot(T("a", cond)))) == [
            ("b", "depends", message.format(cond.value))]
    # the other conditions never need a map
    for cond in (E.SUCCEEDED, E.FAILED, E.SUCCEEDED_ONLY, E.COMPLETED, E.ANY):
        assert issues(step("a"), step("b", ir.Dependency("a", cond))) == []


def test_a_cycle_is_reported_on_each_of_its_steps_in_execution_order() -> None:
    # a <- c <- b <- a ; "d" hangs off the cycle, "e" is free
    found = issues(step("a", "b"), step("b", "c"), step("c", "a"), step("d", "a"), step("e"))
    cycle = "dependency cycle: c -> b -> a -> c"
    assert found == [("c", "dependencies", cycle), ("b", "dependencies", cycle),
                     ("a", "dependencies", cycle)]


def test_a_two_step_cycle_beside_a_self_edge() -> None:
    found = issues(step("x", "x", "y"), step("y", "x"), step("z", "y"))
    assert found == [("x", "dependencies", "a step cannot depend on itself"),
                     ("y", "dependencies", "dependency cycle: y -> x -> y"),
                     ("x", "dependencies", "dependency cycle: y -> x -> y")]


def test_the_cycle_found_starts_from_the_first_stuck_step_by_name() -> None:
    # two cycles: the one through the alphabetically first stuck step is reported
    found = issues(step("p", "q"), step("q", "p"), step("b", "a"), step("a", "b"))
    assert [f[2] for f in found] == ["dependency cycle: b -> a -> b"] * 2


def test_a_long_chain_is_not_a_cycle() -> None:
    chain = [step("s0")] + [step(f"s{i}", f"s{i - 1}") for i in range(1, 30)]
    assert issues(*chain) == []


def test_exit_hook_steps_are_a_scope_of_their_own() -> None:
    hook = ir.ExitHook(ir.RunStatus.ANY, (step("h"), step("h")))
    assert issues(step("h"), exit_hooks=(hook,)) == [("h", "name", "step name is used twice")]
    empty = ir.ExitHook(ir.RunStatus.FAILED, ())
    assert issues(step("a"), exit_hooks=(empty,)) == [
        ("", "exit_hooks[0]", "an exit hook needs at least one step")]


def test_a_cycle_entered_from_a_finished_step_is_still_a_cycle() -> None:
    # "a" has two upstreams: "f" (free) and "b" (on the cycle); finishing f must not free a
    cycle = "dependency cycle: b -> a -> b"
    assert issues(step("f"), step("a", "f", "b"), step("b", "a")) == [
        ("b", "dependencies", cycle), ("a", "dependencies", cycle)]


def test_a_cycle_beside_as_many_free_steps_is_found() -> None:
    found = issues(step("e1"), step("e2"), step("a", "b"), step("b", "a"))
    assert [f[:2] for f in found] == [("b", "dependencies"), ("a", "dependencies")]


def test_free_steps_named_before_the_cycle_are_not_reported_on_it() -> None:
    cycle = "dependency cycle: y -> x -> y"
    assert issues(step("a"), step("b", "a"), step("x", "y"), step("y", "x")) == [
        ("y", "dependencies", cycle), ("x", "dependencies", cycle)]


def test_a_when_reading_an_unknown_step_is_reported_on_the_when_field() -> None:
    cond = ir.Condition(ir.StepOutputRef("nope", "out"), ir.CompareOp.EQ, ir.Literal.of("1"))
    assert issues(step("a", when=ir.When(cond))) == [
        ("a", "when.left", "refers to unknown step 'nope'")]


def test_a_when_cannot_read_its_own_steps_output_but_a_loop_can() -> None:
    own = ir.Condition(ir.StepOutputRef("a", "out"), ir.CompareOp.EQ, ir.Literal.of("1"))
    outputs = (ir.OutputParameter("out", selector="/tmp/out"),)
    found = issues(step("a", when=ir.When(own), outputs=outputs))
    assert [f[:2] for f in found] == [("a", "when.left")]
    assert issues(step("a", loop=ir.Loop(own, max_iterations=1), outputs=outputs)) == []
    assert issues(step("a", loop=ir.Loop(own, max_iterations=0), outputs=outputs)) == [
        ("a", "loop.max_iterations", "must be at least 1")]


def test_a_step_cannot_both_loop_and_map() -> None:
    cond = ir.Condition(ir.Literal.of("1"), ir.CompareOp.EQ, ir.Literal.of("1"))
    both = step("a", loop=ir.Loop(cond), foreach=ir.ForEach(items=(ir.Literal.of(1),)))
    assert issues(both) == [
        ("a", "loop", "a step cannot both loop and map; wrap one in a sub-workflow")]


def test_a_steps_counts_are_checked_on_their_own_fields() -> None:
    found = issues(step("a", timeout_seconds=0, parallelism=-1,
                        cache=ir.CachePolicy(max_age_seconds=0)))
    assert found == [("a", "timeout_seconds", "must be positive, got 0"),
                     ("a", "parallelism", "must be positive, got -1"),
                     ("a", "cache.max_age_seconds", "must be positive, got 0")]
    assert issues(step("a", timeout_seconds=1, parallelism=1,
                       cache=ir.CachePolicy(max_age_seconds=1))) == []


def test_volume_mounts_name_a_declared_volume_at_an_absolute_path() -> None:
    vols = (ir.Volume("data", claim_name="pvc-data"),)
    ok = (ir.VolumeMount("data", "/data"), ir.VolumeMount("couler-out-dir-0", "/out"))
    assert issues(step("a", volume_mounts=ok), volumes=vols) == []
    bad = (ir.VolumeMount("other", "/x"), ir.VolumeMount("data", "rel/path"))
    assert issues(step("a", volume_mounts=bad), volumes=vols) == [
        ("a", "volume_mounts", "mounts unknown volume 'other'"),
        ("a", "volume_mounts", "mount path 'rel/path' is not absolute")]


def test_a_steps_labels_and_node_selector_values_are_label_values() -> None:
    bad = (("team", "not a value!"),)
    assert issues(step("a", labels=bad, node_selector=bad)) == [
        ("a", "node_selector", "'not a value!' is not a valid value for 'team'"),
        ("a", "labels", "'not a value!' is not a valid value for 'team'")]
    good = (("team", "ml"),)
    assert issues(step("a", labels=good, node_selector=good)) == []


def test_a_step_downstream_of_a_cycle_is_not_reported_on_it() -> None:
    # "a" is stuck (it waits on the cycle) and sorts first, but is not on the cycle
    cycle = "dependency cycle: y -> x -> y"
    assert issues(step("a", "x"), step("x", "y"), step("y", "x")) == [
        ("y", "dependencies", cycle), ("x", "dependencies", cycle)]


def test_a_loop_condition_reading_an_unknown_step_is_reported_on_its_field() -> None:
    cond = ir.Condition(ir.StepOutputRef("nope", "out"), ir.CompareOp.EQ, ir.Literal.of("1"))
    assert issues(step("a", loop=ir.Loop(cond))) == [
        ("a", "loop.condition.left", "refers to unknown step 'nope'")]


def test_a_steps_retry_policy_issues_name_the_retry_field() -> None:
    policy = ir.RetryPolicy(limit=-1, on=(), backoff=ir.Backoff(base_seconds=0, factor=0.5),
                            memory_factor=1.0)
    assert issues(step("a", retry=policy)) == [
        ("a", "retry.limit", "must not be negative"),
        ("a", "retry.on", "name at least one failure class to retry"),
        ("a", "retry.backoff.base_seconds", "must be positive"),
        ("a", "retry.backoff.factor", "must be at least 1"),
        ("a", "retry.memory_factor", "must be greater than 1"),
    ]
