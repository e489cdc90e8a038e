"""Cached steps taken out of a workflow for engines that cannot restore them (issue 10,
item 4): readers get the results written in, the compiled document no longer holds them."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from couler import ir
from couler.compilers import argo
from couler.engines.base import StepState, StepStatus
from couler.optimize import CachedStep, optimize
from couler.optimize.cache_key import workflow_keys
from couler.optimize.reuse import ArtifactStore, substitute_cached
from couler_runtime.rpc.records import CacheEntry, Plan
from couler_submitter.reused import AllReused, keyed_by_plan, taken_out

STORE = ArtifactStore(endpoint="minio:9000", bucket="couler", prefix="runs",
                      access_key=ir.SecretRef("couler-artifacts", "accessKey"),
                      secret_key=ir.SecretRef("couler-artifacts", "secretKey"))
HEX = "ab" * 32


def _step(name: str, **kw: object) -> ir.Step:
    return ir.Step(name=name, body=ir.ContainerSpec(image="alpine", command=("echo", name)),
                   outputs=(ir.OutputParameter("out", source=ir.OutputSource.STDOUT,
                                               type=ir.ValueType.INT),), **kw)  # type: ignore[arg-type]


def _pipeline(**use: object) -> ir.Workflow:
    """prep (parameter and artifact) -> train (reads both) -> report (reads train)."""
    prep = dataclasses.replace(_step("prep"), output_artifacts=(
        ir.OutputArtifact("data", "/tmp/data.csv"),))
    train = dataclasses.replace(_step(
        "train", inputs=(ir.InputParameter("rows", ir.StepOutputRef("prep", "out")),),
        input_artifacts=(ir.InputArtifact("data", "/in/data.csv",
                                          ir.StepArtifactRef("prep", "data")),),
        dependencies=(ir.Dependency("prep"),)), **use)  # type: ignore[arg-type]
    report = _step("report", inputs=(ir.InputParameter("x", ir.StepOutputRef("train", "out")),),
                   dependencies=(ir.Dependency("train"),))
    return ir.Workflow(name="pipe", steps=(prep, train, report))


def test_a_cached_step_is_taken_out_and_its_results_written_into_its_readers() -> None:
    done = substitute_cached(_pipeline(), {"prep": {"out": "42"}},
                             {"prep": {"data": f"sha256:{HEX}"}}, STORE)
    assert done.cached == ("prep",) and done.unneeded == ()
    ir.validate(done.workflow)
    train = done.workflow.steps[0]
    assert [s.name for s in done.workflow.steps] == ["train", "report"]
    assert train.dependencies == ()
    assert train.inputs[0].value == ir.Literal.of(42)  # typed as the output was declared
    loc = train.input_artifacts[0].source
    assert isinstance(loc, ir.ArtifactLocation)
    assert (loc.storage, loc.bucket, loc.key) == (ir.StorageKind.S3, "couler",
                                                  f"runs/sha256/{HEX}")
    assert loc.access_key == ir.SecretRef("couler-artifacts", "accessKey")


def test_the_argo_document_no_longer_holds_the_cached_step() -> None:
    done = substitute_cached(_pipeline(), {"prep": {"out": "42"}},
                             {"prep": {"data": f"sha256:{HEX}"}}, STORE)
    doc = argo.compile_workflow(done.workflow)
    text = yaml.safe_dump(doc)
    assert "prep" not in {t["name"] for t in doc["spec"]["templates"]}
    assert f"runs/sha256/{HEX}" in text and "couler-artifacts" in text
    assert "'42'" in text or '"42"' in text or "value: 42" in text


@pytest.mark.parametrize("engine", ["argo", "tekton", "airflow"])
def test_every_engine_compiles_the_workflow_without_its_cached_steps(engine: str) -> None:
    """Parameters only (Tekton and Airflow take no artifacts): the reused steps are absent
    from each engine's document, their outputs present as values."""
    wf = ir.Workflow(name="params", steps=(
        _step("prep"),
        _step("train", inputs=(ir.InputParameter("rows", ir.StepOutputRef("prep", "out")),),
              dependencies=(ir.Dependency("prep"),)),
        _step("report", inputs=(ir.InputParameter("x", ir.StepOutputRef("train", "out")),),
              dependencies=(ir.Dependency("train"),))))
    keys = workflow_keys(wf)
    entry = CachedStep(keys["train"], {"out": "31337"})
    plan = optimize(wf, engine, lookup=lambda ks: {k: entry for k in ks if k == entry.key},
                    substitute=True, store=STORE, retry=None)  # by failure class: not all
    assert [s.name for s in plan.workflow.steps] == ["report"] and plan.unneeded == ("prep",)
    assert "31337" in plan.document
    assert "echo prep" not in plan.document and "echo train" not in plan.document


def test_an_ancestor_nothing_left_needs_is_taken_out_too() -> None:
    done = substitute_cached(_pipeline(), {"train": {"out": "7"}}, {}, STORE)
    assert done.cached == ("train",) and done.unneeded == ("prep",)
    assert [s.name for s in done.workflow.steps] == ["report"]
    assert done.workflow.steps[0].inputs[0].value == ir.Literal.of(7)


def test_a_map_over_a_cached_output_fans_out_over_the_recorded_list() -> None:
    shards = _step("shards")
    score = dataclasses.replace(_step("score"), foreach=ir.ForEach(
        source=ir.StepOutputRef("shards", "out")), dependencies=(ir.Dependency("shards"),))
    wf = ir.Workflow(name="m", steps=(shards, score))
    done = substitute_cached(wf, {"shards": {"out": '["a", "b"]'}}, {}, STORE)
    ir.validate(done.workflow)
    [mapped] = done.workflow.steps
    assert mapped.foreach == ir.ForEach(items=(ir.Literal.of("a"), ir.Literal.of("b")))
    kept = substitute_cached(wf, {"shards": {"out": "not a list"}}, {}, STORE)
    assert kept.cached == () and "not a JSON list" in kept.notes[0]


def test_a_step_looked_at_otherwise_than_by_its_results_stays() -> None:
    failed = ir.Workflow(name="h", steps=(_step("a"), _step(
        "on-fail", dependencies=(ir.Dependency("a", ir.EdgeCondition.FAILED),))))
    done = substitute_cached(failed, {"a": {"out": "1"}}, {}, STORE)
    assert done.cached == () and done.workflow == failed
    assert "waits for it to be failed" in done.notes[0]
    # an artifact with no store the engine reads: the producer runs again
    done = substitute_cached(_pipeline(), {"prep": {"out": "1"}},
                             {"prep": {"data": f"sha256:{HEX}"}}, None)
    assert done.cached == () and "reads no artifact store" in done.notes[0]


def test_optimize_for_a_remote_engine_takes_out_what_the_cache_holds() -> None:
    wf = _pipeline()
    keys = workflow_keys(wf)
    entries = {keys["prep"]: CachedStep(keys["prep"], {"out": "42"}, {"data": f"sha256:{HEX}"})}
    plan = optimize(wf, "argo", lookup=lambda ks: {k: entries[k] for k in ks if k in entries},
                    substitute=True, store=STORE)
    assert [s.name for s in plan.workflow.steps] == ["train", "report"]
    assert set(plan.cached) == {"prep"} and plan.keys == keys and not plan.nothing_to_run
    assert "name: prep" not in plan.document
    every = {k: CachedStep(k, {"out": "1"}, {"data": f"sha256:{HEX}"}) for k in keys.values()}
    plan = optimize(wf, "argo", lookup=lambda ks: {k: every[k] for k in ks},
                    substitute=True, store=STORE)
    assert plan.nothing_to_run and plan.document == "" and set(plan.cached) == set(keys)


def test_the_submitter_reports_taken_out_steps_and_keys_remote_results() -> None:
    wf = _pipeline()
    keys = workflow_keys(wf)
    plan = Plan(workflow=ir.Workflow(name="pipe", steps=(wf.steps[2],)), engine="argo",
                cached={"train": CacheEntry(key=keys["train"], outputs={"out": "7"})},
                unneeded=("prep",), step_keys=keys)
    by = {s.step: s for s in taken_out(plan)}
    assert set(by) == {"train", "prep"}
    local = dataclasses.replace(plan, workflow=wf, engine="local", unneeded=(), cached={
        "train": CacheEntry(key=keys["train"]), "sweep[0]": CacheEntry(key="k")})
    assert taken_out(local) == []  # the local engine reports its reused steps and items
    assert by["train"].state is StepState.CACHED and by["train"].outputs == {"out": "7"}
    assert by["prep"].state is StepState.SKIPPED and "not needed" in by["prep"].message
    done = keyed_by_plan(StepStatus("report", StepState.SUCCEEDED), wf.steps[2], keys)
    assert done.cache_key == keys["report"] and done.cache_lineage == (keys["train"],)
    failed = keyed_by_plan(StepStatus("report", StepState.FAILED), wf.steps[2], keys)
    assert failed.cache_key == ""  # only a success is committed
    final = AllReused("r1", "pipe", taken_out(plan)).wait()
    assert final.state.value == "succeeded" and len(final.steps) == 2
