"""The service contract: generated code, descriptors, and record conversions."""

from __future__ import annotations

import importlib

import pytest
from google.protobuf import descriptor_pool
from hypothesis import given, settings

from couler import ir
from couler.engines import base
from couler.errors import InvalidWorkflowError
from couler.v1 import common_pb2, events_pb2
from couler_runtime.rpc import SERVICES
from couler_runtime.rpc import records as r
from tests.ir_strategies import workflows

NEW_PROTOS = ["common", "events", "generator_service", "optimizer_service", "cache_service",
              "submitter_service", "monitor_service"]

RPCS = {
    "GeneratorService": {"Generate"},
    "OptimizerService": {"Optimize"},
    "CacheService": {"Lookup", "Commit", "Stats", "Evict", "Pin", "List", "Show"},
    "SubmitterService": {"Submit", "UploadWorkflow", "Get", "Watch", "Cancel", "Retry",
                         "List", "Logs", "RegisterTemplate", "ListTemplates", "DownloadBlob",
                         "ListSchedules", "PauseSchedule", "ResumeSchedule"},
    "MonitorService": {"Utilization", "Recommendations"},
}


def script_step(name: str) -> ir.Step:
    return ir.Step(name=name, body=ir.ScriptSpec(image="python:3.12", source="print(1)"))


WF = ir.Workflow(name="train", steps=(script_step("prep"), script_step("fit")))


@pytest.mark.parametrize("short", ["generator", "optimizer", "cache", "submitter", "monitor"])
def test_generated_grpc_stubs_import_with_absolute_imports(short: str) -> None:
    module = importlib.import_module(f"couler.v1.{short}_service_pb2_grpc")
    prefix = short.capitalize() + "Service"
    assert hasattr(module, f"{prefix}Stub")
    assert hasattr(module, f"add_{prefix}Servicer_to_server")
    for rpc in RPCS[prefix]:
        assert callable(getattr(module, f"{prefix}Servicer").__dict__[rpc])


def test_services_declare_the_planned_rpcs_and_watch_streams() -> None:
    pool = descriptor_pool.Default()
    assert set(SERVICES.values()) == {f"couler.v1.{s}" for s in RPCS}
    for service, rpcs in RPCS.items():
        desc = pool.FindServiceByName(f"couler.v1.{service}")
        assert {m.name for m in desc.methods} == rpcs
        for m in desc.methods:
            # Only an upload streams from the client; Watch and downloads to it.
            assert m.client_streaming == (m.name == "UploadWorkflow")
            assert m.server_streaming == (service == "SubmitterService"
                                          and m.name in ("Watch", "DownloadBlob"))


@pytest.mark.parametrize("proto", NEW_PROTOS)
def test_every_enum_starts_with_unspecified(proto: str) -> None:
    module = importlib.import_module(f"couler.v1.{proto}_pb2")
    for enum in module.DESCRIPTOR.enum_types_by_name.values():
        zero = enum.values_by_number[0].name
        assert zero.endswith("_UNSPECIFIED"), enum.full_name


def test_submit_source_and_event_sources_are_oneofs() -> None:
    from couler.v1 import submitter_service_pb2 as s

    req = s.SubmitRequest(text="train a model")
    req.workflow.name = "w"
    assert req.WhichOneof("source") == "workflow"
    assert not req.text
    ev = events_pb2.WorkflowRequested(run_id="r", text="x")
    assert ev.WhichOneof("source") == "text"


def test_run_state_mirrors_engine_states_plus_two() -> None:
    for state in base.RunState:
        assert r.RunState.from_engine(state).value == state.value
        assert r.RunState.from_engine(state).terminal == state.terminal
    assert {s.name for s in r.RunState} - {s.name for s in base.RunState} == {
        "ACCEPTED", "PLANNING"}
    names = set(common_pb2.RunState.keys()) - {"RUN_STATE_UNSPECIFIED"}
    assert names == {f"RUN_STATE_{s.name}" for s in r.RunState}
    assert set(common_pb2.StepState.keys()) - {"STEP_STATE_UNSPECIFIED"} == {
        f"STEP_STATE_{s.name}" for s in base.StepState}


def make_run() -> r.Run:
    steps = (
        r.StepRecord("prep", base.StepState.SUCCEEDED, attempts=1, exit_code=0,
                     started_at=1_700_000_000.25, finished_at=1_700_000_002.5, peak_cpu=0.5,
                     peak_memory_bytes=12_345_678, outputs={"rows": "100"}, cache_key="k1"),
        r.StepRecord("fit", base.StepState.CACHED, cached=True, cache_key="k2",
                     outputs={"model": "s3://b/m"}),
        r.StepRecord("eval", base.StepState.FAILED, key="3", attempts=2, exit_code=137,
                     message="killed: out of memory", failure_class=ir.FailureClass.OOM),
        r.StepRecord("lint", base.StepState.FAILED, attempts=1, exit_code=1,
                     failure_class=ir.FailureClass.USER,
                     failure_reason="user error: Python ValueError in the traceback; not "
                                    "retried"),
        r.StepRecord("report", base.StepState.PENDING),
    )
    return r.Run(
        run_id="r-1", state=r.RunState.FAILED, workflow="train", engine="local",
        engine_run_id="local-1", steps=steps, created_at=1_700_000_000.0,
        started_at=1_700_000_000.125, finished_at=None, message="step 'eval' failed",
        passes=(r.PassReport("validate"), r.PassReport("prune_cached", True, ("fit",), 1.5)),
        idempotency_key="idem", parameters={"lr": "0.1"}, workflow_digest="sha256:ab",
        template="nightly", dry_run=False, revision=7, retries=1,
    )


def test_run_round_trips_through_the_wire() -> None:
    run = make_run()
    wire = r.run_to_proto(run).SerializeToString()
    back = r.run_from_proto(common_pb2.Run.FromString(wire))
    assert back == run
    assert back.step("eval", "3").failure_class is ir.FailureClass.OOM
    lint = back.step("lint")
    assert lint.failure_class is ir.FailureClass.USER
    assert lint.failure_reason.startswith("user error: Python ValueError")
    assert back.step("report").exit_code is None
    assert back.step("prep").exit_code == 0  # zero is not "absent"
    with pytest.raises(KeyError):
        back.step("nope")


def test_unset_state_is_rejected_with_its_location() -> None:
    msg = r.run_to_proto(make_run())
    msg.steps[1].state = common_pb2.STEP_STATE_UNSPECIFIED
    with pytest.raises(InvalidWorkflowError, match="step 'fit', state"):
        r.run_from_proto(msg)
    msg = common_pb2.Run(run_id="x")
    with pytest.raises(InvalidWorkflowError, match="run 'x', state"):
        r.run_from_proto(msg)


def test_step_record_from_engine_status() -> None:
    status = base.StepStatus("fit", base.StepState.CACHED, attempts=0, outputs={"a": "1"})
    rec = r.StepRecord.from_status(status, cache_key="k")
    assert (rec.name, rec.state, rec.cached, rec.cache_key, dict(rec.outputs)) == (
        "fit", base.StepState.CACHED, True, "k", {"a": "1"})
    assert rec.cache_lineage == ()


def test_cache_lineage_and_entry_cost_cross_the_wire() -> None:
    """The engine's lineage reaches the step event, the cache entry's cost, lineage and pin
    its clients."""
    status = base.StepStatus("fit", base.StepState.SUCCEEDED, attempts=1, cache_key="k3",
                             started_at=10.0, finished_at=70.5, cache_lineage=("k1", "k2"))
    rec = r.StepRecord.from_status(status)
    assert rec.cache_lineage == ("k1", "k2")
    wire = r.step_record_to_proto(rec)
    assert list(wire.cache_lineage) == ["k1", "k2"]
    assert r.step_record_from_proto(wire) == rec
    entry = r.CacheEntry("k3", "w", "fit", {"o": "1"}, {}, 10, 1.0, 2.0, 3,
                         cost_seconds=60.5, lineage=("k1", "k2"), pinned=True)
    back = r.cache_entry_from_proto(common_pb2.CacheEntry.FromString(
        r.cache_entry_to_proto(entry).SerializeToString()))
    assert back == entry
    assert (back.cost_seconds, back.lineage, back.pinned) == (60.5, ("k1", "k2"), True)


@settings(max_examples=25, deadline=None)
@given(workflows())
def test_plan_round_trips_with_any_workflow(wf: ir.Workflow) -> None:
    plan = r.Plan(
        workflow=wf, engine="argo", compiled="apiVersion: argoproj.io/v1alpha1\n",
        cached={"fit": r.CacheEntry("k", "w", "fit", {"o": "1"},
                                    {"model": r.StoredArtifact("sha256:00", 10, "file:///m")},
                                    10, 1.0, 2.0, 3)},
        passes=(r.PassReport("split", True, ("2 chunks",), 0.25),),
        chunks=(r.Chunk("c0", ("a",)), r.Chunk("c1", ("b", "c"), ("c0",))),
        workflow_digest="sha256:ff",
    )
    wire = r.plan_to_proto(plan).SerializeToString()
    assert r.plan_from_proto(common_pb2.Plan.FromString(wire)) == plan


def test_other_records_round_trip() -> None:
    rec = r.Recommendation("train", "fit", r.RecommendationKind.RETRY, "3", "2 OOM kills",
                           5, 1_700_000_000.0, ir.FailureClass.OOM, "train.fit.retry.3")
    assert r.recommendation_from_proto(r.recommendation_to_proto(rec)) == rec
    sized = r.Recommendation(
        "train", "fit", r.RecommendationKind.MEMORY_REQUEST, "734Mi", "p95 of 12 runs' peaks",
        12, 1_700_000_000.0, None, "train/fit/memory_request/734Mi", target="700Mi",
        lower_bound="520Mi", upper_bound="900Mi", percentile=0.95, runs=12, samples=2**40,
        span_seconds=3.5 * 86400)
    assert r.recommendation_from_proto(r.recommendation_to_proto(sized)) == sized
    report = r.RecommendationReport((sized, rec), (
        r.StepRequests("", ir.Resources(cpu_request="250m"), "run-1", 1_700_000_000.25),
        r.StepRequests("fit", ir.Resources(cpu_request="2", memory_request="4Gi",
                                           memory_limit="8Gi"), "run-1", None)))
    assert r.recommendation_report_from_proto(r.recommendation_report_to_proto(report)) \
        == report
    sample = r.UtilizationSample("r", "w", "s", 1_700_000_000.5, 1.25, 2**31 + 5, "2", 3)
    assert r.utilization_sample_from_proto(r.utilization_sample_to_proto(sample)) == sample
    util = r.Utilization((sample,), (r.StepPeak("r", "w", "s", 1.5, 2**33, 4, "2"),))
    assert r.utilization_from_proto(r.utilization_to_proto(util)) == util
    report = r.GenerationReport("llm", "m", ("prep", "train"), ("xgboost",), 2, ("cycle",),
                                ("assumed CSV",))
    assert r.generation_report_from_proto(r.generation_report_to_proto(report)) == report
    tpl = r.Template("nightly", WF, "argo", "sha256:1", 5.0)
    assert r.template_from_proto(r.template_to_proto(tpl)) == tpl
    objectives = (r.Objective.COST, r.Objective.LATENCY)
    assert r.objectives_from_proto(
        common_pb2.Objective.Value(n) for n in r.objectives_to_proto(objectives)) == objectives
    states = (r.RunState.FAILED, r.RunState.ACCEPTED)
    assert r.run_states_from_proto(
        common_pb2.RunState.Value(n) for n in r.run_states_to_proto(states)) == states


def test_pass_report_notes_are_bounded() -> None:
    """A pass that names every step of a 100k-step workflow must not make the record (and
    every Get) that large: at most MAX_NOTES notes of at most MAX_NOTE_CHARS characters."""
    every_step = "on: " + ", ".join(f"s{i}" for i in range(100_000))
    report = r.PassReport("default_retry", True,
                          (every_step, *(f"step 's{i}': cached" for i in range(200))), 1.5)
    bounded = r.bounded_report(report)
    assert len(bounded.notes) == r.MAX_NOTES
    assert all(len(n) <= r.MAX_NOTE_CHARS for n in bounded.notes)
    assert bounded.notes[0].endswith("…") and bounded.notes[0].startswith("on: s0, s1")
    assert bounded.notes[-1] == f"{201 - (r.MAX_NOTES - 1)} more notes left out"
    assert (bounded.name, bounded.changed, bounded.duration_ms) == ("default_retry", True, 1.5)
    small = r.PassReport("split", False, ("a", "b"))
    assert r.bounded_report(small) is small
    assert r.bounded_notes(["x"] * r.MAX_NOTES) == ("x",) * r.MAX_NOTES


def test_run_counts_and_page_token_round_trip() -> None:
    run = r.Run("run-1", r.RunState.RUNNING, steps=(r.StepRecord("a", base.StepState.RUNNING),),
                step_count=100_000, cached_step_count=7, next_step_page_token="p1")
    assert r.run_from_proto(r.run_to_proto(run)) == run
    ref = r.BlobRef("sha256:" + "0" * 64, 12)
    assert r.blob_ref_from_proto(r.blob_ref_to_proto(ref)) == ref
