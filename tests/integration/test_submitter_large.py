"""Large workflows and odd inputs at the submitter's gRPC edge, against a real NATS.

No message depends on the size of a workflow: a workflow over 1 MiB is uploaded in chunks
and submitted by reference, records come a page of steps at a time, Watch sends what
changed, List counts. Sizes are checked at Submit and RegisterTemplate: a value over its
limit is INVALID_ARGUMENT naming the workflow, step, field and limit. No input a user can
send is answered with INTERNAL.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from couler import ir
from couler.engines.base import StepState
from couler.errors import CoulerError, NotFoundError, UserError, ValidationError
from couler.v1 import submitter_service_pb2
from couler_runtime import codec
from couler_runtime.client import UPLOAD_THRESHOLD, CoulerClient
from couler_runtime.rpc.client import connect
from couler_runtime.rpc.records import BlobRef, RunState
from couler_submitter.main import SubmitterSettings
from tests.integration.test_submitter_service import (
    WAIT,
    RealOptimizer,
    ServiceThread,
    optimizer_settings,
    settings_for,
    unique,
)
from tests.servers import NatsServer

SUBMIT = "/couler.v1.SubmitterService/Submit"


def chain(n: int, name: str) -> ir.Workflow:
    steps = [ir.Step(name="s0", body=ir.ContainerSpec(image="alpine", command=("echo", "0")))]
    steps += [ir.Step(name=f"s{i}", body=ir.ContainerSpec(image="alpine",
                                                          command=("echo", str(i))),
                      dependencies=(ir.Dependency(f"s{i - 1}"),)) for i in range(1, n)]
    return ir.Workflow(name=name, steps=tuple(steps))


@pytest.fixture(scope="module")
def settings(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
             ) -> SubmitterSettings:
    state = tmp_path_factory.mktemp("large")
    return settings_for(nats_server, state, f"sqlite:///{state / 's.db'}",
                        max_value_bytes=64 * 1024)


@pytest.fixture
def optimizer(nats_server: NatsServer, settings: SubmitterSettings, tmp_path: Path
              ) -> Iterator[RealOptimizer]:
    """The real optimizer on the submitter's bus and payload store (a plan over the bus's
    inline limit goes by reference)."""
    running = RealOptimizer(optimizer_settings(
        nats_server, tmp_path / "optimizer", artifacts=settings.artifacts)).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def service(settings: SubmitterSettings) -> Iterator[ServiceThread]:
    svc = ServiceThread(settings).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def client(service: ServiceThread) -> Iterator[CoulerClient]:
    with CoulerClient({"submitter": service.address}, timeout=WAIT) as c:
        yield c


def raw_submit(service: ServiceThread, request: bytes) -> grpc.RpcError:
    """Send ``request`` bytes as a Submit; the error it is answered with."""
    with connect(service.address) as channel:
        call = channel.unary_unary(SUBMIT, request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=WAIT)
    return info.value


class TestLarge:
    @pytest.mark.usefixtures("optimizer")
    def test_a_large_workflow_is_uploaded_paged_watched_and_counted(
            self, client: CoulerClient) -> None:
        wf = chain(30_000, unique("big"))
        assert codec.workflow_to_proto(wf).ByteSize() > UPLOAD_THRESHOLD
        sub = client.submitter.submit(wf, engine="dryrun")  # uploaded, by reference
        # the optimizer plans it (its plan, too large to go inline, through the store)
        seen = 0
        changed_total = 0

        def follow(run: object, changed: tuple[object, ...]) -> None:
            nonlocal seen, changed_total
            seen += 1
            changed_total += len(changed)

        run = client.submitter.wait(sub.run_id, timeout=WAIT * 3, on_steps=follow)
        assert run.state is RunState.SUCCEEDED, run.message
        assert len(run.steps) == run.step_count == 30_000
        assert [s.name for s in run.steps[:3]] == ["s0", "s1", "s2"]
        assert {s.state for s in run.steps} == {StepState.SUCCEEDED}
        # the watch sent each step's change about once, not the whole run every time
        assert 30_000 <= changed_total < 2 * 30_000
        # Get pages; the client puts the pages together.
        page = client.submitter.get_page(sub.run_id, page_size=7000)
        assert len(page.steps) == 7000 and page.next_step_page_token
        again = client.submitter.get(sub.run_id)
        assert again.steps == run.steps and again.next_step_page_token == ""
        # List counts instead of steps.
        [listed] = [r for r in client.submitter.list(workflow=wf.name).runs]
        assert (listed.steps, listed.step_count, listed.cached_step_count) == ((), 30_000, 0)
        with pytest.raises(UserError, match="field 'step_page_token'"):
            client.submitter.get_page(sub.run_id, page_token="garbage")

    def test_upload_checks_what_it_stores_and_download_gives_it_back(
            self, client: CoulerClient) -> None:
        data = codec.workflow_to_proto(chain(3, unique("up"))).SerializeToString()
        ref = client.submitter.upload_workflow(data)
        assert ref == BlobRef("sha256:" + hashlib.sha256(data).hexdigest(), len(data))
        assert client.submitter.download_blob(ref) == data
        with pytest.raises(UserError, match=r"not a couler\.v1\.Workflow"):
            client.submitter.upload_workflow(b"\xff\xff\xff not a workflow")
        with pytest.raises(NotFoundError):
            client.submitter.download_blob(BlobRef("sha256:" + "0" * 64, 10))
        with pytest.raises(UserError, match="field 'size_bytes'"):
            client.submitter.download_blob(dataclasses.replace(ref, size_bytes=ref.size_bytes
                                                               + 1))
        with pytest.raises(UserError, match="field 'digest'"):
            client.submitter.download_blob(BlobRef("md5:abc", 3))
        # a reference to bytes that are not what was announced is refused at Submit
        request = submitter_service_pb2.SubmitRequest(engine="dryrun")
        request.workflow_ref.digest = ref.digest
        request.workflow_ref.size_bytes = ref.size_bytes - 1
        with pytest.raises(UserError, match="field 'size_bytes'"):
            client.submitter._submit(request)

    def test_a_large_template_is_registered_and_listed_by_reference(
            self, client: CoulerClient) -> None:
        name = unique("tpl")
        wf = chain(30_000, name)
        tpl = client.submitter.register_template(name, wf, engine="dryrun")
        assert tpl.workflow == wf and tpl.workflow_digest == ir.digest(wf)
        listed = {t.name: t for t in client.submitter.list_templates()}
        assert listed[name].workflow == wf


class TestLimits:
    def test_a_value_over_the_limit_is_refused_naming_it(
            self, client: CoulerClient, service: ServiceThread) -> None:
        wf = chain(3, unique("limit"))
        big = dataclasses.replace(wf, steps=(wf.steps[0], dataclasses.replace(
            wf.steps[1], body=ir.ContainerSpec(image="alpine", command=("echo",),
                                               args=("a", "x" * (10 << 20)))), wf.steps[2]))
        with pytest.raises(ValidationError) as info:
            client.submitter.submit(big, engine="dryrun")
        assert f"workflow {wf.name!r}, step 's1', field 'args[1]'" in str(info.value)
        assert "over the limit of 64 KiB per value" in str(info.value)
        # the same inline, past the client's upload: INVALID_ARGUMENT, not INTERNAL
        request = submitter_service_pb2.SubmitRequest(engine="dryrun")
        request.workflow.CopyFrom(codec.workflow_to_proto(big))
        error = raw_submit(service, request.SerializeToString())
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "field 'args[1]'" in (error.details() or "")
        with pytest.raises(ValidationError, match=r"field 'parameters\.p'"):
            client.submitter.submit(wf, engine="dryrun", parameters={"p": "v" * 70_000})
        with pytest.raises(ValidationError, match="field 'args"):
            client.submitter.register_template(unique("big-tpl"), big)

    @pytest.mark.parametrize("case", [
        "empty", "no-steps", "deep-json", "nested", "unicode-name", "huge-text", "huge-key",
        "huge-engine", "garbage", "bad-enum", "dangling"])
    def test_odd_inputs_are_invalid_argument_never_internal(
            self, service: ServiceThread, case: str) -> None:
        request = submitter_service_pb2.SubmitRequest(engine="dryrun")
        body = ir.ContainerSpec(image="alpine", command=("echo",))
        if case == "empty":
            pass  # no source at all
        elif case == "no-steps":
            request.workflow.name = "nothing"
        elif case == "deep-json":
            step = ir.Step(name="a", body=body, inputs=(ir.InputParameter(
                "x", ir.Literal(json="[" * 20_000 + "]" * 20_000)),))
            request.workflow.CopyFrom(codec.workflow_to_proto(ir.Workflow("deep", (step,))))
        elif case == "nested":
            inner = ir.Step(name="leaf", body=body)
            for level in range(30):
                inner = ir.Step(name=f"l{level}", body=ir.SubWorkflowSpec(
                    name=f"l{level}", steps=(inner,)))
            request.workflow.CopyFrom(codec.workflow_to_proto(ir.Workflow("nest", (inner,))))
        elif case == "unicode-name":
            request.workflow.CopyFrom(codec.workflow_to_proto(ir.Workflow(
                "ünïcødé-☃", (ir.Step(name="schritt-ß", body=body),))))
        elif case == "huge-text":
            request.text = "train " * 2_000_000
        elif case == "huge-key":
            request.workflow.CopyFrom(codec.workflow_to_proto(chain(1, "key")))
            request.idempotency_key = "k" * 100_000
        elif case == "huge-engine":
            request.workflow.CopyFrom(codec.workflow_to_proto(chain(1, "engine")))
            request.engine = "e" * 1_000_000
        elif case == "garbage":
            error = raw_submit(service, b"\x0a\xff\xff\xff\xff\x0f garbage")
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            return
        elif case == "bad-enum":
            wf = codec.workflow_to_proto(chain(1, "enum"))
            wf.steps[0].inputs.add(name="x").value.literal.json = "1"
            wf.steps[0].inputs[0].type = 99  # not a ValueType
            request.workflow.CopyFrom(wf)
        elif case == "dangling":
            wf = codec.workflow_to_proto(chain(2, "dangling"))
            wf.steps[1].dependencies[0].step = "nowhere"
            request.workflow.CopyFrom(wf)
        error = raw_submit(service, request.SerializeToString())
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, (error.code(),
                                                                    error.details())
        assert "internal" not in (error.details() or "").lower()

    def test_the_limits_come_from_the_settings(self) -> None:
        settings = SubmitterSettings.load("submitter", max_value_bytes=4096,
                                          max_workflow_bytes=1 << 20, max_workflow_steps=10,
                                          max_nesting_depth=2)
        limits = settings.size_limits
        assert (limits.max_value_bytes, limits.max_workflow_bytes, limits.max_steps,
                limits.max_depth) == (4096, 1 << 20, 10, 2)
        defaults = SubmitterSettings.load("submitter").size_limits
        assert (defaults.max_value_bytes, defaults.max_workflow_bytes) == (256 << 10, 64 << 20)
        with pytest.raises(CoulerError, match="MAX_VALUE_BYTES"):
            SubmitterSettings.load("submitter", max_value_bytes=0)
