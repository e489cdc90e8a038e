"""The optimizer's passes: cache keys, pruning, recommendations, retries, splitting."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping, Sequence

import pytest

from couler import ir
from couler.compilers import airflow, argo, tekton
from couler.compilers.wire import json_size
from couler.errors import UserError
from couler.optimize import (
    DEFAULT_RETRY,
    Budget,
    CachedStep,
    Recommendation,
    apply_recommendations,
    budget_for,
    default_retry,
    document_size,
    handoff_parameter,
    learned_limit,
    not_cacheable_reason,
    optimize,
    prune_cached,
    split_workflow,
    step_cache_key,
)
from couler.optimize.cache_key import (
    item_cache_key,
    iteration_cache_key,
    map_items,
    unneeded_steps,
    workflow_keys,
)

L = ir.Literal.of


def container(name: str, *cmd: str, inputs: Sequence[ir.InputParameter] = (),
              deps: Sequence[str] = (), outputs: Sequence[str] = ("out",), **kw: object
              ) -> ir.Step:
    return ir.Step(
        name=name, body=ir.ContainerSpec(image="python:3.11", command=cmd or ("echo", name)),
        inputs=tuple(inputs),
        outputs=tuple(ir.OutputParameter(o, source=ir.OutputSource.STDOUT) for o in outputs),
        dependencies=tuple(ir.Dependency(d) for d in deps), **kw)  # type: ignore[arg-type]


def chain(n: int, name: str = "chain") -> ir.Workflow:
    steps = [container("s0", "echo", "0")]
    for i in range(1, n):
        steps.append(container(
            f"s{i}", "echo", "{{inputs.x}}",
            inputs=[ir.InputParameter("x", ir.StepOutputRef(f"s{i - 1}", "out"))],
            deps=[f"s{i - 1}"]))
    return ir.Workflow(name=name, steps=tuple(steps))


WF = chain(3)

# ---------------------------------------------------------------------- cache keys


def key(step: ir.Step, producer_keys: Mapping[str, str] | None = None,
        wf: ir.Workflow = WF, params: Mapping[str, str] | None = None) -> str | None:
    return step_cache_key(wf, step, params=params or {}, producer_keys=producer_keys or {})


def test_same_content_same_key_and_names_or_policies_do_not_matter() -> None:
    a = container("a", "train", "--lr", "0.1")
    renamed = dataclasses.replace(
        a, name="b", retry=ir.RetryPolicy(limit=3), timeout_seconds=10,
        resources=ir.Resources(memory_request="1Gi"))
    assert key(a) is not None and key(a) == key(renamed)


@pytest.mark.parametrize("change", [
    {"body": ir.ContainerSpec(image="python:3.12", command=("train", "--lr", "0.1"))},
    {"body": ir.ContainerSpec(image="python:3.11", command=("train", "--lr", "0.2"))},
    {"env": (ir.EnvVar("SEED", "1"),)},
    {"cache": ir.CachePolicy(salt="v2")},
    {"outputs": (ir.OutputParameter("model", source=ir.OutputSource.STDOUT),)},
])
def test_everything_that_determines_outputs_changes_the_key(change: dict[str, object]) -> None:
    a = container("a", "train", "--lr", "0.1")
    assert key(a) != key(dataclasses.replace(a, **change))  # type: ignore[arg-type]


def test_a_step_is_keyed_by_its_producers_keys_and_unknown_ones_give_none() -> None:
    step = WF.steps[1]  # reads s0's output
    assert key(step, {"s0": "k1"}) is not None
    assert key(step, {"s0": "k1"}) != key(step, {"s0": "k2"})
    assert key(step, {}) is None  # never a partial key
    other = dataclasses.replace(step, inputs=(
        ir.InputParameter("x", ir.StepOutputRef("s0", "other")),))
    assert key(other, {"s0": "k1"}) != key(step, {"s0": "k1"})  # which output is read


def test_literal_and_parameter_values_are_part_of_the_key() -> None:
    a = container("a", inputs=[ir.InputParameter("p", ir.WorkflowParamRef("lr"))])
    assert key(a, params={"lr": "0.1"}) != key(a, params={"lr": "0.2"})
    assert key(a, params={}) is None
    b = container("a", inputs=[ir.InputParameter("p", L("0.1"))])
    assert key(b) is not None and key(b) != key(dataclasses.replace(
        b, inputs=(ir.InputParameter("p", L("0.2")),)))


def test_every_key_of_a_chain_is_known_before_it_runs() -> None:
    keys = workflow_keys(chain(4))
    assert sorted(keys) == ["s0", "s1", "s2", "s3"] and len(set(keys.values())) == 4
    changed = dataclasses.replace(chain(4), steps=(
        container("s0", "echo", "changed"), *chain(4).steps[1:]))
    # A change at the root changes every key below it (lineage), and only those.
    assert all(workflow_keys(changed)[n] != keys[n] for n in keys)
    renamed = dataclasses.replace(chain(4), name="other")
    assert workflow_keys(renamed) == keys  # the workflow's name is not part of a key


def test_secrets_enter_the_key_by_reference_only() -> None:
    a = container("a", env=(ir.EnvVar("TOKEN", secret=ir.SecretRef("creds", "token")),))
    b = container("a", env=(ir.EnvVar("TOKEN", secret=ir.SecretRef("creds", "other")),))
    assert key(a) is not None and key(a) != key(b)


def test_input_artifacts_enter_by_producer_key_or_external_digest() -> None:
    art = ir.InputArtifact("data", "/data", ir.StepArtifactRef("s0", "d"))
    a = container("a", input_artifacts=(art,))
    assert key(a) is None
    assert key(a, {"s0": "k1"}) != key(a, {"s0": "k2"})
    ext = container("a", input_artifacts=(ir.InputArtifact("data", "/data", ir.ArtifactLocation(
        storage=ir.StorageKind.S3, bucket="b", key="k")),))
    with_digest = [step_cache_key(WF, ext, params={}, producer_keys={},
                                  external_digests={"data": d}) for d in ("sha256:1", "sha256:2")]
    assert key(ext) is None  # keyed when it runs, from the file it is handed
    assert None not in with_digest and with_digest[0] != with_digest[1]


@pytest.mark.parametrize(("change", "reason"), [
    ({"cache": ir.CachePolicy(enabled=False)}, "turned off"),
    ({"body": ir.JobSpec(manifest="{}")}, "job"),
    ({"foreach": ir.ForEach(items=(L(1),))}, "map"),
    ({"volume_mounts": (ir.VolumeMount("v", "/v"),)}, "volume"),
    ({"daemon": True}, "daemon"),
])
def test_steps_that_are_never_cached(change: dict[str, object], reason: str) -> None:
    step = dataclasses.replace(container("a"), **change)  # type: ignore[arg-type]
    assert reason in (not_cacheable_reason(WF, step) or "")
    assert key(step) is None


def test_workflow_default_turns_caching_off() -> None:
    wf = dataclasses.replace(WF, defaults=ir.StepDefaults(cache=ir.CachePolicy(enabled=False)))
    assert key(WF.steps[0], wf=wf) is None


def test_user_key_replaces_content() -> None:
    a = container("a", "x", cache=ir.CachePolicy(key="my-key"))
    b = container("b", "y", cache=ir.CachePolicy(key="my-key"))
    assert key(a) == key(b)
    assert key(a) != key(container("c", "x", cache=ir.CachePolicy(key="my-key", salt="s")))


# ---------------------------------------------------------------------- pruning


class FakeIndex:
    """A dict-backed lookup recording its calls (stands in for the cache service's RPC)."""

    def __init__(self) -> None:
        self.entries: dict[str, CachedStep] = {}
        self.calls: list[list[str]] = []

    def __call__(self, keys: Sequence[str]) -> Mapping[str, CachedStep]:
        self.calls.append(list(keys))
        return {k: self.entries[k] for k in keys if k in self.entries}


def fill(index: FakeIndex, wf: ir.Workflow, outputs: Mapping[str, str],
         params: Mapping[str, str] | None = None) -> dict[str, str]:
    """Commit each step's output as a run would (keys by lineage); returns the keys."""
    keys = workflow_keys(wf, params)
    for step in wf.steps:
        index.entries[keys[step.name]] = CachedStep(keys[step.name], {"out": outputs[step.name]})
    return keys


def test_a_fully_cached_chain_is_found_in_one_lookup() -> None:
    index = FakeIndex()
    fill(index, WF, {"s0": "0", "s1": "1", "s2": "2"})
    cached, _ = prune_cached(WF, index)
    assert sorted(cached) == ["s0", "s1", "s2"]
    assert cached["s2"].outputs == {"out": "2"}
    assert len(index.calls) == 1


def test_steps_that_read_nothing_upstream_are_looked_up_in_one_call() -> None:
    """Control-only dependencies do not change keys: a 20,000-step chain of them is one
    lookup (it was one per step, over a frontier scan of every step: quadratic)."""
    steps = [container("c0")]
    steps += [container(f"c{i}", deps=[f"c{i - 1}"]) for i in range(1, 20_000)]
    wf = ir.Workflow(name="control-chain", steps=tuple(steps))
    index = FakeIndex()
    fill(index, wf, {s.name: s.name for s in wf.steps})
    cached, notes = prune_cached(wf, index)
    assert len(cached) == 20_000 and notes == []
    assert len(index.calls) == 1 and len(index.calls[0]) == 20_000


def test_an_evicted_ancestor_does_not_hide_its_cached_descendants() -> None:
    """Keys by lineage: s2 is found although s1's entry is gone, and s1 need not run."""
    index = FakeIndex()
    keys = fill(index, WF, {"s0": "0", "s1": "1", "s2": "2"})
    del index.entries[keys["s1"]]
    cached, notes = prune_cached(WF, index)
    assert sorted(cached) == ["s0", "s2"]
    assert "step 's1': not needed: every step that reads it is reused" in notes


def test_an_evicted_leaf_runs_again_and_so_do_the_ancestors_it_reads() -> None:
    index = FakeIndex()
    keys = fill(index, WF, {"s0": "0", "s1": "1", "s2": "2"})
    del index.entries[keys["s2"]]
    del index.entries[keys["s1"]]
    cached, notes = prune_cached(WF, index)
    assert sorted(cached) == ["s0"]
    assert not any("not needed" in n for n in notes)


def test_a_hit_without_every_output_is_not_used() -> None:
    index = FakeIndex()
    keys = fill(index, WF, {"s0": "0", "s1": "1", "s2": "2"})
    for name in ("s0", "s1", "s2"):
        index.entries[keys[name]] = CachedStep(keys[name], {})
    assert prune_cached(WF, index)[0] == {}


def test_a_hit_older_than_the_steps_max_age_is_a_miss() -> None:
    wf = dataclasses.replace(WF, steps=(
        dataclasses.replace(WF.steps[0], cache=ir.CachePolicy(max_age_seconds=3600)),
        *WF.steps[1:]))
    index = FakeIndex()
    keys = fill(index, wf, {"s0": "0", "s1": "1", "s2": "2"})
    for name in ("s0", "s1", "s2"):
        index.entries[keys[name]] = CachedStep(keys[name], {"out": name}, created_at=1000.0)
    assert sorted(prune_cached(wf, index, now=1000.0 + 3600)[0]) == ["s0", "s1", "s2"]
    cached, notes = prune_cached(wf, index, now=1000.0 + 3601)
    assert sorted(cached) == ["s1", "s2"]  # s0 too old; its readers are keyed by lineage
    assert any("older than its max_age (3600 s)" in n for n in notes)


def test_workflow_parameters_resolve_into_keys() -> None:
    step = container("a", "echo", "{{inputs.p}}",
                     inputs=[ir.InputParameter("p", ir.WorkflowParamRef("lr"))])
    wf = ir.Workflow(name="w", steps=(step,),
                     parameters=(ir.Parameter("lr", default=L("0.1")),))
    index = FakeIndex()
    fill(index, wf, {"a": "x"})
    assert "a" in prune_cached(wf, index)[0]
    assert prune_cached(wf, index, {"lr": "0.2"})[0] == {}
    fill(index, wf, {"a": "y"}, {"lr": "0.2"})
    assert prune_cached(wf, index, {"lr": "0.2"})[0]["a"].outputs == {"out": "y"}


# ------------------------------------------------------------ unneeded steps


def _diamond(**reader: object) -> ir.Workflow:
    """a -> b (reads a), and c (reads a; changed by ``reader``)."""
    a = container("a")
    b = container("b", inputs=[ir.InputParameter("x", ir.StepOutputRef("a", "out"))],
                  deps=["a"])
    c = dataclasses.replace(container(
        "c", inputs=[ir.InputParameter("x", ir.StepOutputRef("a", "out"))], deps=["a"]),
        **reader)  # type: ignore[arg-type]
    return ir.Workflow(name="diamond", steps=(a, b, c))


def test_a_step_every_reader_of_which_is_reused_is_not_needed() -> None:
    assert unneeded_steps(_diamond(), {"b", "c"}) == {"a"}
    assert unneeded_steps(_diamond(), {"b"}) == set()  # c runs and reads a
    assert unneeded_steps(chain(4), {"s3"}) == {"s0", "s1", "s2"}  # transitively
    assert unneeded_steps(chain(4), {"s2"}) == {"s0", "s1"}  # s3 runs, reads only s2
    # a reused step only reused steps read is unneeded too: reused without its artifacts
    assert unneeded_steps(chain(4), {"s1", "s3"}) == {"s0", "s1", "s2"}
    assert unneeded_steps(chain(1), set()) == set()  # a leaf is always wanted


@pytest.mark.parametrize("reader", [
    # c waits for a without reading it: a's effect may be what it waits for
    {"inputs": ()},
    # c looks at a's state or outputs, not only its data
    {"dependencies": (ir.Dependency("a", ir.EdgeCondition.FAILED),)},
    {"when": ir.When(ir.Condition(ir.StepOutputRef("a", "out"), ir.CompareOp.EQ, L("1")))},
])
def test_a_step_a_reused_reader_looks_at_otherwise_is_needed(reader: dict[str, object]) -> None:
    assert unneeded_steps(_diamond(**reader), {"b", "c"}) == set()


def test_the_plan_counts_the_keys_it_uses_once_it_is_made() -> None:
    """Found entries are peeked at; what the plan reuses and what it runs is counted, not
    the entries nothing reads (so eviction ranks by the use entries really get)."""
    index = FakeIndex()
    keys = fill(index, WF, {"s0": "0", "s1": "1", "s2": "2"})
    del index.entries[keys["s2"]]
    used: list[list[str]] = []
    plan = optimize(WF, "local", lookup=index, record_use=lambda ks: used.append(list(ks)))
    assert sorted(plan.cached) == ["s0", "s1"]
    assert used == [sorted([keys["s1"], keys["s2"]])]  # s0 is read only by reused s1


def test_steps_that_cannot_be_cached_or_that_an_exit_hook_reads_are_needed() -> None:
    off = _diamond()
    off = dataclasses.replace(off, steps=(
        dataclasses.replace(off.steps[0], cache=ir.CachePolicy(enabled=False)), *off.steps[1:]))
    assert unneeded_steps(off, {"b", "c"}) == set()
    hook = container("notify", inputs=[ir.InputParameter("x", ir.StepOutputRef("a", "out"))])
    hooked = dataclasses.replace(_diamond(), exit_hooks=(
        ir.ExitHook(ir.RunStatus.FAILED, (hook,)),))
    assert unneeded_steps(hooked, {"b", "c"}) == set()


# ------------------------------------------------------------ recommendations


def test_memory_recommendation_sets_request_and_lifts_a_lower_limit() -> None:
    step = container("s0", resources=ir.Resources(memory_request="1Gi", memory_limit="2Gi"))
    wf = dataclasses.replace(WF, steps=(step, *WF.steps[1:]))
    recs = [Recommendation("chain", "s0", "memory_request", "3Gi", "peak 2.4Gi"),
            Recommendation("other", "s0", "memory_request", "9Gi")]
    out, notes = apply_recommendations(wf, recs)
    res = out.steps[0].resources
    assert res is not None and (res.memory_request, res.memory_limit) == ("3Gi", "3Gi")
    assert any("peak 2.4Gi" in n for n in notes)
    ir.validate(out)


def test_bad_or_unknown_recommendations_are_reported_not_applied() -> None:
    recs = [Recommendation("chain", "s0", "memory_request", "lots"),
            Recommendation("chain", "nope", "cpu_request", "1")]
    out, notes = apply_recommendations(WF, recs)
    assert out == WF
    assert any("not a quantity" in n for n in notes) and any("no such step" in n for n in notes)


def test_retry_and_timeout_recommendations() -> None:
    recs = [Recommendation("chain", "s1", "retry_limit", "5"),
            Recommendation("chain", "s2", "timeout_seconds", "60")]
    out, _ = apply_recommendations(WF, recs)
    assert out.steps[1].retry is not None and out.steps[1].retry.limit == 5
    assert out.steps[2].timeout_seconds == 60


def test_a_learned_retry_limit_changes_the_next_plan() -> None:
    # 0 for transient failures under the default policy: the step's own failures are not
    # retried (the plan's default_retry pass does not put them back), the platform's and
    # OOM kills still are; the notes say why
    recs = [Recommendation("chain", "s0", "retry_limit", "0",
                           reason="no transient or infrastructure failure in 5 runs",
                           failure_class=ir.FailureClass.TRANSIENT),
            Recommendation("chain", "s1", "retry_limit", "4"),
            Recommendation("chain", "s1", "retry_backoff_seconds", "12")]
    plan = optimize(WF, "local", recommendations=recs, compile=False)
    s0, s1, s2 = plan.workflow.steps
    assert s0.retry == dataclasses.replace(
        DEFAULT_RETRY, on=(ir.FailureClass.INFRA, ir.FailureClass.OOM))
    assert s1.retry is not None and s1.retry.limit == 4 and s1.retry.on == DEFAULT_RETRY.on
    assert s1.retry.backoff == ir.Backoff(12.0, 2.0, 60.0)
    assert s2.retry == DEFAULT_RETRY  # no recommendation: the default
    notes = next(r.notes for r in plan.reports if r.name == "right_size")
    assert ("step 's0': transient failures not retried (no transient or infrastructure "
            "failure in 5 runs)") in notes
    assert "step 's1': retry back-off = 12s" in notes
    # the default's own back-off cap is raised to a longer learned base
    out, _ = apply_recommendations(WF, [Recommendation("chain", "s1",
                                                       "retry_backoff_seconds", "90")])
    retry = out.steps[1].retry
    assert retry is not None and retry.backoff == ir.Backoff(90.0, 2.0, 90.0)
    ir.validate(out)
    # 0 for no class in particular: no retries at all
    out, _ = apply_recommendations(WF, [Recommendation("chain", "s0", "retry_limit", "0")])
    assert out.steps[0].retry == dataclasses.replace(DEFAULT_RETRY, limit=0)


def test_a_written_policy_is_kept_but_oom_retries_raise_it() -> None:
    own = ir.RetryPolicy(limit=0, backoff=ir.Backoff(7.0), on=(ir.FailureClass.TRANSIENT,))
    wf = dataclasses.replace(WF, steps=(dataclasses.replace(WF.steps[0], retry=own),
                                        *WF.steps[1:]))
    learned = [Recommendation("chain", "s0", "retry_limit", "3",
                              failure_class=ir.FailureClass.TRANSIENT),
               Recommendation("chain", "s0", "retry_backoff_seconds", "30")]
    assert apply_recommendations(wf, learned) == (wf, [])  # the program's policy wins
    oom = Recommendation("chain", "s0", "retry_limit", "2", failure_class=ir.FailureClass.OOM)
    out, _ = apply_recommendations(wf, [oom])
    assert out.steps[0].retry == dataclasses.replace(own, limit=2)


def test_bad_retry_backoff_recommendation_is_reported() -> None:
    out, notes = apply_recommendations(WF, [Recommendation("chain", "s0",
                                                           "retry_backoff_seconds", "0")])
    assert out == WF and "at least 1" in notes[0]


# ---------------------------------------------------------------------- retries


def test_default_retry_fills_only_missing_policies() -> None:
    own = ir.RetryPolicy(limit=7)
    wf = dataclasses.replace(WF, steps=(dataclasses.replace(WF.steps[0], retry=own),
                                        *WF.steps[1:]))
    out, notes = default_retry(wf)
    assert out.steps[0].retry == own
    assert out.steps[1].retry == DEFAULT_RETRY and out.steps[2].retry == DEFAULT_RETRY
    assert "s1, s2" in notes[0]
    with_default = dataclasses.replace(wf, defaults=ir.StepDefaults(retry=own))
    assert default_retry(with_default) == (with_default, [])


def test_the_default_policy_retries_every_class_but_user_errors() -> None:
    assert set(DEFAULT_RETRY.on) == {ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA,
                                     ir.FailureClass.OOM}
    assert ir.FailureClass.USER not in DEFAULT_RETRY.on


# --------------------------------------------------------------------- splitting


def argo_size(wf: ir.Workflow) -> int:
    """The optimizer's measure of an Argo document: its compact JSON."""
    return document_size(argo.compile_workflow(wf), "argo")


def layered(levels: int, width: int) -> ir.Workflow:
    steps: list[ir.Step] = []
    for lv in range(levels):
        for j in range(width):
            ups = [f"l{lv - 1}-{k}" for k in (j, (j + 1) % width)] if lv else []
            ups = sorted(set(ups))
            inputs = [ir.InputParameter(f"i{k}", ir.StepOutputRef(u, "out"))
                      for k, u in enumerate(ups)]
            steps.append(container(f"l{lv}-{j}", "echo", *(f"{{{{inputs.i{k}}}}}"
                                                          for k in range(len(ups))),
                                   inputs=inputs, deps=ups))
    return ir.Workflow(name="layers", steps=tuple(steps))


def check_chunks(wf: ir.Workflow, budget: Budget) -> list[str]:
    result = split_workflow(wf, budget, argo_size)
    chunks = result.chunks
    names = [c.name for c in chunks]
    seen = [s for c in chunks for s in c.steps]
    assert sorted(seen) == sorted(s.name for s in wf.steps)  # every step exactly once
    for i, c in enumerate(chunks):
        assert all(names.index(d) < i for d in c.depends_on)  # acyclic: only earlier chunks
        ir.validate(c.workflow)
        assert argo_size(c.workflow) == c.size_bytes
        if budget.bytes_allowed is not None:
            assert c.size_bytes <= budget.bytes_allowed
        if budget.max_steps is not None:
            assert len(c.steps) <= budget.max_steps
    return list(result.notes)


def test_within_budget_is_one_chunk() -> None:
    result = split_workflow(WF, Budget(max_steps=10), argo_size)
    assert len(result.chunks) == 1 and result.chunks[0].workflow == WF
    assert "not split" in result.notes[0]


def test_split_by_bytes_keeps_the_chunk_graph_acyclic_and_within_budget() -> None:
    wf = layered(8, 6)
    budget = Budget(max_bytes=argo_size(wf) // 3)
    notes = check_chunks(wf, budget)
    assert "critical path" in notes[-1]


def test_split_by_steps_hands_outputs_over_as_parameters() -> None:
    wf = chain(10)
    result = split_workflow(wf, Budget(max_steps=4), argo_size)
    assert [len(c.steps) for c in result.chunks] == [4, 4, 2]
    second = result.chunks[1]
    assert second.depends_on == (result.chunks[0].name,)
    param = handoff_parameter("s3", "out")
    assert second.workflow.parameter(param) is not None
    first_step = second.workflow.steps[0]
    assert first_step.inputs[0].value == ir.WorkflowParamRef(param)
    assert first_step.dependencies == ()
    check_chunks(wf, Budget(max_steps=4))


def test_failure_edges_and_artifact_handoffs_are_never_cut() -> None:
    steps = list(chain(6).steps)
    steps[3] = dataclasses.replace(steps[3], dependencies=(
        ir.Dependency("s2", ir.EdgeCondition.FAILED),))
    steps[3] = dataclasses.replace(steps[3], inputs=())
    steps[3] = dataclasses.replace(steps[3], body=ir.ContainerSpec(image="a", command=("x",)))
    wf = ir.Workflow(name="w", steps=tuple(steps))
    ir.validate(wf)
    result = split_workflow(wf, Budget(max_steps=1), argo_size)
    together = [c for c in result.chunks if "s2" in c.steps]
    assert "s3" in together[0].steps


def test_over_budget_with_exit_hooks_is_a_clear_error() -> None:
    wf = dataclasses.replace(chain(5), exit_hooks=(
        ir.ExitHook(on=ir.RunStatus.ANY, steps=(container("bye"),)),))
    with pytest.raises(UserError, match=r"'chain'.*exit hooks"):
        split_workflow(wf, Budget(max_steps=2), argo_size)


class Counting:
    """A ``measure`` that compiles with Argo and counts the steps it compiled."""

    def __init__(self) -> None:
        self.steps = 0
        self.calls = 0

    def __call__(self, wf: ir.Workflow) -> int:
        self.steps += len(wf.steps)
        self.calls += 1
        return argo_size(wf)


def test_a_long_chain_fills_chunks_to_the_budget_and_compiles_each_step_about_once() -> None:
    wf = chain(600)
    budget = Budget(max_bytes=argo_size(wf) // 6)
    allowed = budget.bytes_allowed
    assert allowed is not None
    measure = Counting()
    result = split_workflow(wf, budget, measure)
    chunks = result.chunks
    assert len(chunks) >= 6
    for chunk in chunks[:-1]:  # every chunk but the last is more than 90 % full
        assert allowed * 0.9 < chunk.size_bytes <= allowed, chunk.name
    # Linear: the sample, the whole (when near the budget) and each chunk about once.
    assert measure.steps <= 3 * len(wf.steps), measure.steps
    # Hand-offs: each chunk's first step reads the previous chunk's last output.
    for before, after in itertools.pairwise(chunks):
        first = after.workflow.steps[0]
        param = handoff_parameter(before.steps[-1], "out")
        assert first.inputs[0].value == ir.WorkflowParamRef(param)
        assert after.workflow.parameter(param) is not None
        assert after.depends_on == (before.name,)
    largest = max(c.size_bytes for c in chunks)
    assert f"largest {largest} bytes ({largest / allowed:.0%} of the budget)" in result.notes[0]
    check_chunks(wf, budget)


def test_chunks_of_uneven_steps_are_cut_where_the_real_size_says() -> None:
    """Small steps first, then steps ten times larger: the size model (fitted on the small
    ones) overshoots, and the chunk is cut smaller until its document fits."""
    steps = list(chain(120).steps)
    for i in range(60, 120):
        steps[i] = dataclasses.replace(steps[i], body=ir.ContainerSpec(
            image="python:3.11", command=("echo", "{{inputs.x}}", "y" * 2000)))
    wf = ir.Workflow(name="uneven", steps=tuple(steps))
    budget = Budget(max_bytes=argo_size(wf) // 5)
    notes = check_chunks(wf, budget)
    assert "chunks of at most" in notes[0]


def test_a_workflow_that_fits_is_compiled_once_and_not_split() -> None:
    wf = chain(50)
    measure = Counting()
    result = split_workflow(wf, Budget(max_bytes=argo_size(wf) * 2), measure)
    assert [c.workflow for c in result.chunks] == [wf]
    assert result.chunks[0].size_bytes == argo_size(wf)
    assert measure.steps <= len(wf.steps) + 64  # the sample and the whole


def test_the_learned_budget_lowers_the_static_one_and_says_why() -> None:
    wf = chain(200)
    size = argo_size(wf)
    budget = Budget(max_bytes=1 << 20, learned_bytes=size // 3,
                    learned_reason="argo refused a 30 KiB document at 2026-12-02T04:00:00Z")
    assert budget.bytes_allowed == size // 3 == min(int((1 << 20) * 0.97), size // 3)
    result = split_workflow(wf, budget, argo_size)
    assert len(result.chunks) >= 3
    assert result.notes[0] == (f"budget {size // 3 / 1024:.0f} KiB: argo refused a 30 KiB "
                               "document at 2026-12-02T04:00:00Z")
    check_chunks(wf, budget)
    # a learned budget above the static one changes nothing, and is not reported
    high = Budget(max_bytes=size * 2, learned_bytes=size * 4, learned_reason="old")
    assert high.bytes_allowed == int(size * 2 * 0.97)
    assert split_workflow(wf, high, argo_size).notes == (
        f"within budget (200 steps, {size} of {high.bytes_allowed} bytes): not split",)
    assert learned_limit(1000) == 800


def test_a_unit_over_the_budget_is_named() -> None:
    wf = chain(10)
    big = dataclasses.replace(wf.steps[4], body=ir.ContainerSpec(
        image="python:3.11", command=("echo", "{{inputs.x}}", "z" * 5000)))
    wf = dataclasses.replace(wf, steps=(*wf.steps[:4], big, *wf.steps[5:]))
    with pytest.raises(UserError, match=r"workflow 'chain': steps that must stay together "
                                        r"\(s4\) compile to \d+ bytes, over the budget of 4000"):
        split_workflow(wf, Budget(max_bytes=4000, margin=1.0), argo_size)


def test_documents_are_measured_as_the_engines_api_stores_them() -> None:
    """Compact JSON for the Kubernetes engines (Tekton: its objects together, as the
    PipelineRun's status holds the Pipeline's spec), the DAG file's bytes for Airflow."""
    wf = chain(20)
    doc = argo.compile_workflow(wf)
    compact = json.dumps(doc, separators=(",", ":"))
    assert document_size(doc, "argo") == len(compact.encode()) == json_size(doc)
    assert json.loads(compact) == doc
    assert document_size(doc, "argo") < len(argo.to_yaml(doc).encode())  # not the YAML
    docs = tekton.compile_workflow(wf)
    assert len(docs) == 2
    assert document_size(docs, "tekton") == sum(
        len(json.dumps(d, separators=(",", ":"))) for d in docs)
    spec = {"pipelineInfo": {"name": "chain"}, "root": {"dag": {"tasks": {"a": {}}}}}
    assert document_size(spec, "kfp") == len('{"pipelineInfo":{"name":"chain"},'
                                             '"root":{"dag":{"tasks":{"a":{}}}}}')
    source = airflow.compile_workflow(wf)
    assert document_size(source, "airflow") == len(source.encode())
    assert document_size(None, "local") == 0
    # non-ASCII characters are escaped: never fewer bytes than the server stores (UTF-8)
    accented = argo.compile_workflow(ir.Workflow(name="w", steps=(
        container("s0", "echo", "détente"),)))
    assert document_size(accented, "argo") > len(json.dumps(
        accented, separators=(",", ":"), ensure_ascii=False).encode())


def test_optimize_splits_to_the_compact_json_size_of_each_chunk() -> None:
    """optimize() with the argo engine: each chunk's size is its document's compact JSON,
    within the budget, though its YAML (what ``couler compile`` prints) is larger."""
    wf = chain(300)
    whole = json_size(argo.compile_workflow(wf))
    budget = Budget(max_bytes=whole // 4, margin=1.0)
    allowed = budget.bytes_allowed
    assert allowed is not None
    plan = optimize(wf, "argo", budget=budget, retry=None)
    assert len(plan.chunks) >= 4
    for chunk in plan.chunks:
        doc = argo.compile_workflow(chunk.workflow)
        assert chunk.size_bytes == json_size(doc) <= allowed, chunk.name
    # the fullest chunks would be over the budget measured as YAML: the unit is JSON
    assert any(len(argo.to_yaml(argo.compile_workflow(c.workflow))) > allowed
               for c in plan.chunks)
    # not split: the plan's document is still the YAML, and the note gives its JSON size
    one = optimize(chain(5), "argo", retry=None)
    assert one.document == argo.to_yaml(argo.compile_workflow(chain(5)))
    split = next(r for r in one.reports if r.name == "split")
    size = json_size(argo.compile_workflow(chain(5)))
    assert f"5 steps, {size} of {budget_for('argo').bytes_allowed} bytes" in split.notes[0]


def test_engine_budgets_come_from_the_limits_tables() -> None:
    assert budget_for("argo").max_bytes == 1048576
    assert budget_for("kfp").max_bytes == 1572864
    assert budget_for("local").max_bytes is None


# -------------------------------------------------------------------- pipeline


def test_optimize_runs_every_pass_and_compiles() -> None:
    index = FakeIndex()
    fill(index, WF, {"s0": "0", "s1": "1", "s2": "2"})
    plan = optimize(WF, "argo", lookup=index,
                    recommendations=[Recommendation("chain", "s1", "memory_request", "2Gi")])
    assert [r.name for r in plan.reports] == [
        "validate", "prune_cached", "substitute_cached", "right_size", "default_retry",
    "split", "compile"]
    assert sorted(plan.cached) == ["s0", "s1", "s2"]
    assert "kind: Workflow" in plan.document
    res = plan.workflow.steps[1].resources
    assert res is not None and res.memory_request == "2Gi"
    assert plan.chunks == ()


def test_optimize_splits_a_too_large_workflow() -> None:
    wf = chain(30)
    plan = optimize(wf, "argo", budget=Budget(max_steps=10))
    assert len(plan.chunks) == 3 and plan.document == ""
    assert next(r for r in plan.reports if r.name == "split").changed


def test_artifact_handoffs_are_keyed_by_the_producers_key() -> None:
    make = container("make", output_artifacts=(ir.OutputArtifact("data", "/tmp/d"),))
    use = container("use", input_artifacts=(
        ir.InputArtifact("data", "/in/d", ir.StepArtifactRef("make", "data")),), deps=["make"])
    wf = ir.Workflow(name="arts", steps=(make, use))
    index = FakeIndex()
    keys = workflow_keys(wf)
    index.entries[keys["make"]] = CachedStep(keys["make"], {"out": "m"}, {"data": "sha256:abc"})
    index.entries[keys["use"]] = CachedStep(keys["use"], {"out": "u"})
    assert sorted(prune_cached(wf, index)[0]) == ["make", "use"]
    del index.entries[keys["make"]]  # the big artifact was evicted: its reader is still found
    cached, notes = prune_cached(wf, index)
    assert sorted(cached) == ["use"] and any("'make': not needed" in n for n in notes)


# ------------------------------------------------------------ map items, loop iterations


def sweep(*items: object, **kw: object) -> ir.Step:
    """A map step over literal ``items`` reading each item's field ``lr``."""
    kw.setdefault("foreach", ir.ForEach(items=tuple(L(i) for i in items)))
    return container("train", "train", "--lr", "{{inputs.lr}}",
                     inputs=[ir.InputParameter("lr", ir.ItemRef("lr"))], **kw)  # type: ignore[arg-type]


def item_key(step: ir.Step, item: object, wf: ir.Workflow = WF,
             producer_keys: Mapping[str, str] | None = None) -> str | None:
    return item_cache_key(wf, step, item, params={}, producer_keys=producer_keys or {})


def test_an_items_key_is_its_value_not_its_position() -> None:
    step = sweep({"lr": 0.1}, {"lr": 0.2})
    appended = sweep({"lr": 0.3}, {"lr": 0.2}, {"lr": 0.1})  # reordered and grown
    a, b = item_key(step, {"lr": 0.1}), item_key(step, {"lr": 0.2})
    assert a is not None and b is not None and a != b
    assert item_key(appended, {"lr": 0.1}) == a and item_key(appended, {"lr": 0.2}) == b
    # a field read (item.lr) is keyed by the whole item: another field changes the key
    assert item_key(step, {"lr": 0.1, "seed": 1}) != a
    # canonical JSON: the order of an item's fields does not matter, its types do
    assert item_key(step, {"lr": 0.1, "seed": 1}) == item_key(step, {"seed": 1, "lr": 0.1})
    assert item_key(step, {"lr": "0.1"}) != a
    # the step's own spec is part of it, and so are its producers' keys
    other = dataclasses.replace(step, env=(ir.EnvVar("SEED", "1"),))
    assert item_key(other, {"lr": 0.1}) != a
    reads = dataclasses.replace(step, inputs=(
        *step.inputs, ir.InputParameter("data", ir.StepOutputRef("s0", "out"))))
    assert item_key(reads, {"lr": 0.1}) is None  # never a partial key
    assert item_key(reads, {"lr": 0.1}, producer_keys={"s0": "k1"}) != \
        item_key(reads, {"lr": 0.1}, producer_keys={"s0": "k2"})


def test_a_map_is_not_cached_as_a_whole_but_its_items_are() -> None:
    step = sweep({"lr": 0.1})
    assert "not cached as a whole" in (not_cacheable_reason(WF, step) or "")
    assert key(step) is None and item_key(step, {"lr": 0.1}) is not None
    assert item_key(container("plain"), 1) is None  # only map steps have items
    off = sweep({"lr": 0.1}, cache=ir.CachePolicy(enabled=False))
    assert item_key(off, {"lr": 0.1}) is None


def loop_step(**kw: object) -> ir.Step:
    cond = ir.Condition(ir.StepOutputRef("tune", "out"), ir.CompareOp.LT, L(3))
    return container("tune", "tune", loop=ir.Loop(cond, max_iterations=5), **kw)  # type: ignore[arg-type]


def test_loop_iterations_form_a_chain() -> None:
    step = loop_step()

    def it(n: int, previous: str, s: ir.Step = step) -> str | None:
        return iteration_cache_key(WF, s, n, previous, params={}, producer_keys={})

    first = it(0, "")
    assert first is not None and it(0, "ignored") == first
    second = it(1, first)
    assert second is not None and second != first
    assert it(1, "x" * 64) != second  # each depends on the one before
    assert it(2, second) not in (first, second)
    assert it(1, "") is None  # a later iteration needs the previous key
    assert it(0, "", dataclasses.replace(step, env=(ir.EnvVar("A", "1"),))) != first
    assert "loop steps are not cached as a whole" in (not_cacheable_reason(WF, step) or "")


def test_map_items_are_known_before_the_run_when_literal_a_parameter_or_reused() -> None:
    assert map_items(WF, sweep(1, 2), {}) == [1, 2]
    by_param = sweep(foreach=ir.ForEach(source=ir.WorkflowParamRef("grid")))
    assert map_items(WF, by_param, {"grid": "[3, 4]"}) == [3, 4]
    assert map_items(WF, by_param, {"grid": "not json"}) is None
    upstream = sweep(foreach=ir.ForEach(source=ir.StepOutputRef("gen", "out")))
    assert map_items(WF, upstream, {}) is None  # it runs: known when it has run
    assert map_items(WF, upstream, {}, {"gen": {"out": '["a"]'}}) == ["a"]


def map_wf(items: Sequence[object], *, source: ir.StepOutputRef | None = None,
           gen: ir.Step | None = None) -> ir.Workflow:
    foreach = ir.ForEach(source=source) if source else ir.ForEach(
        items=tuple(L(i) for i in items))
    step = sweep(foreach=foreach)
    return ir.Workflow(name="sweep", steps=(*((gen,) if gen else ()), step))


def test_prune_finds_cached_items_by_value_in_one_lookup() -> None:
    index = FakeIndex()
    first = map_wf([{"lr": 0.1}, {"lr": 0.2}])
    step = first.steps[0]
    for lr in (0.1, 0.2):
        k = item_key(step, {"lr": lr}, first)
        assert k is not None
        index.entries[k] = CachedStep(k, {"out": f"trained {lr}"})
    grown = map_wf([{"lr": 0.3}, {"lr": 0.2}, {"lr": 0.1}])
    cached, notes = prune_cached(grown, index)
    assert sorted(cached) == ["train[1]", "train[2]"]  # by position in this run's items
    assert cached["train[2]"].outputs == {"out": "trained 0.1"}
    assert "train" not in cached and len(index.calls) == 1
    assert any("not cached as a whole" in n for n in notes)


def test_items_from_a_reused_producer_are_looked_up_after_it() -> None:
    gen = container("gen", "gen")
    wf = map_wf([], source=ir.StepOutputRef("gen", "out"), gen=gen)
    keys = workflow_keys(wf)
    index = FakeIndex()
    index.entries[keys["gen"]] = CachedStep(keys["gen"], {"out": '[{"lr": 0.5}]'})
    k = item_key(wf.steps[1], {"lr": 0.5}, wf, producer_keys=keys)
    assert k is not None
    index.entries[k] = CachedStep(k, {"out": "trained 0.5"})
    cached, _ = prune_cached(wf, index)
    assert sorted(cached) == ["gen", "train[0]"] and len(index.calls) == 2
    # a producer that runs: its items are keyed when they run, and the plan says so
    del index.entries[keys["gen"]]
    cached, notes = prune_cached(wf, index)
    assert cached == {}
    assert any("step 'train': its items are not known before the run" in n and "'gen'" in n
               for n in notes), notes


def test_prune_finds_a_loops_cached_iterations() -> None:
    wf = ir.Workflow(name="tuning", steps=(loop_step(),))
    step = wf.steps[0]
    index = FakeIndex()
    previous = ""
    for n in range(2):
        k = iteration_cache_key(wf, step, n, previous, params={}, producer_keys={})
        assert k is not None
        index.entries[k] = CachedStep(k, {"out": str(n + 1)})
        previous = k
    cached, _ = prune_cached(wf, index)
    assert sorted(cached) == ["tune[0]", "tune[1]"] and len(index.calls) == 1
    assert len(index.calls[0]) == 5  # every iteration up to max_iterations
