"""The generator service in-process against a real nats-server, and a real HTTP LLM fake.

The service runs as it does in production -- ``serve(settings, build)`` with the gRPC server
on 127.0.0.1:0 and its durable consumer on JetStream -- on an asyncio loop in a thread; the
tests call it with the blocking ``CoulerClient`` and publish / receive events with a bus of
their own. The LLM path talks to ``tests/openai_fake.py`` (FastAPI under uvicorn) through
the real ``openai`` client. Only one generator instance runs at a time (each class has its
own), because instances share the durable consumer ``generator``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from pydantic import SecretStr

from couler import ir
from couler.errors import RetryableError, UnsupportedFeatureError, UserError
from couler.generate.planner import plan
from couler.v1 import events_pb2
from couler_generator.events import DURABLE, GENERATED, REJECTED, REQUESTED
from couler_generator.main import GeneratorSettings, build
from couler_generator.service import ChatModel, Generator
from couler_runtime import codec
from couler_runtime.bus import HEADER_TENANT, HEADER_TRACEPARENT, Bus
from couler_runtime.client import CoulerClient
from couler_runtime.engines import check_engine
from couler_runtime.service import READY_PREFIX
from couler_runtime.settings import SettingsError
from tests.openai_fake import FakeOpenAI
from tests.servers import BIN, NatsServer
from tests.service_thread import Builder
from tests.service_thread import ServiceThread as RunningService

API_KEY = "sk-couler-test-9d41f07c2b"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
WAIT = 60.0  # a bound on waiting, never an assertion about speed

TWO_MODELS = ("Load s3://data/churn.csv, train an XGBoost model and a LightGBM model on it "
              "side by side, evaluate the AUC of each, then keep the better one")
PIPELINE = "Load s3://data/sales.csv, train a random forest and evaluate its accuracy"
FANOUT = "Split s3://logs/events.parquet into 6 shards and clean each shard, at most 2 at a time"
UNPLANNABLE = "book me a flight to Paris next Tuesday"
# a cron schedule: Ray runs one run and cannot schedule it (the submitter does)
NIGHTLY = "Every night at 2am, load s3://data/sales.csv, train a random forest and evaluate it"


def spec(**changes: dict[str, Any]) -> str:
    """A valid LLM answer (two models, keep the better); ``changes`` edit steps by name."""
    steps: list[dict[str, Any]] = [
        {"name": "load", "template": "ingest-object-store",
         "params": {"source": "s3://data/churn.csv"}},
        {"name": "train-xgb", "template": "train-xgboost", "after": ["load"]},
        {"name": "train-lgbm", "template": "train-lightgbm", "after": ["load"]},
        {"name": "eval-xgb", "template": "evaluate-auc", "after": ["train-xgb"]},
        {"name": "eval-lgbm", "template": "evaluate-auc", "after": ["train-lgbm"]},
        {"name": "pick", "template": "rank-models", "params": {"metric": "auc"},
         "after": ["eval-xgb", "eval-lgbm"]},
    ]
    for step in steps:
        step.update(changes.get(step["name"], {}))
    return json.dumps({"name": "llm-two-models", "steps": steps})


# ----------------------------------------------------------------------------- harness


def ServiceThread(settings: GeneratorSettings,
                  builder: Builder = build
                  ) -> RunningService[GeneratorSettings]:
    """The generator service running in a thread (tests/service_thread.py)."""
    return RunningService(settings, builder)


def settings_for(nats: NatsServer, state: Path, **llm: Any) -> GeneratorSettings:
    defaults: dict[str, Any] = {"llm_base_url": None, "llm_model": "", "llm_api_key": None}
    # the generator's logic on an open bus; its identity and permissions are tested with
    # the others' in tests/integration/test_bus_security.py and tests/security
    return GeneratorSettings.load("generator", nats_url=nats.url, grpc_address="127.0.0.1:0",
                                  state_dir=state, auth_token=None, otel_endpoint=None,
                                  bus_insecure=True, **{**defaults, **llm})


@dataclass
class Exchange:
    """What came back on the answer subjects for the runs a test published."""

    answers: dict[str, list[tuple[str, Message, dict[str, str]]]] = field(default_factory=dict)
    sequences: dict[str, int] = field(default_factory=dict)  # run id -> request's stream seq
    terminated: set[int] = field(default_factory=set)  # stream seqs the consumer terminated


TERMINATED = f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.COULER_WORKFLOW.{DURABLE}"


async def exchange(nats: NatsServer, requests: Sequence[events_pb2.WorkflowRequested],
                   wait_for: set[str], *, headers: dict[str, str] | None = None) -> Exchange:
    """Publish ``requests`` in order; return once every run in ``wait_for`` was answered
    and the generator's consumer has answered (acked or terminated) every request."""
    bus = await Bus.connect(nats.url, name="generator-test", tenant="acme")
    result = Exchange()
    done = asyncio.Event()
    ours = {r.run_id for r in requests}
    types: dict[str, type[events_pb2.WorkflowGenerated] | type[events_pb2.WorkflowRejected]] = {
        GENERATED: events_pb2.WorkflowGenerated, REJECTED: events_pb2.WorkflowRejected}

    async def collect(msg: Any) -> None:
        body = types[msg.subject].FromString(msg.data)
        run_id = body.run_id
        if run_id in ours:
            result.answers.setdefault(run_id, []).append((msg.subject, body,
                                                          dict(msg.headers or {})))
        if wait_for <= set(result.answers):
            done.set()

    async def terminated(msg: Any) -> None:
        result.terminated.add(json.loads(msg.data)["stream_seq"])

    subs = [await bus.client.subscribe(subject, cb=collect) for subject in types]
    subs.append(await bus.client.subscribe(TERMINATED, cb=terminated))
    try:
        await bus.ensure_streams()
        for request in requests:
            published = await bus.publish(REQUESTED, request, msg_id=f"{request.run_id}.requested",
                                          headers=headers)
            result.sequences[request.run_id] = published.sequence
        await asyncio.wait_for(done.wait(), WAIT)
        # The ack follows the answer's publish: wait for it too (a bound, not a timing).
        last = max(result.sequences.values())
        deadline = asyncio.get_running_loop().time() + WAIT
        while True:
            info = await bus.jetstream.consumer_info("COULER_WORKFLOW", DURABLE)
            if info.ack_floor is not None and info.ack_floor.stream_seq >= last:
                break
            assert asyncio.get_running_loop().time() < deadline, "requests never acked"
            await asyncio.sleep(0.02)
        await bus.client.flush()
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await bus.close()
    return result


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


def text_request(rid: str, text: str, **options: Any) -> events_pb2.WorkflowRequested:
    return events_pb2.WorkflowRequested(run_id=rid, text=text,
                                        options=events_pb2.RunOptions(**options))


def deps(wf: ir.Workflow) -> dict[str, set[str]]:
    return {s.name: {d.step for d in s.dependencies} for s in wf.steps}


# ----------------------------------------------------------------------------- offline


@pytest.fixture(scope="class")
def offline(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[ServiceThread]:
    service = ServiceThread(settings_for(nats_server, tmp_path_factory.mktemp("gen"))).start()
    yield service
    service.stop()


@pytest.fixture(scope="class")
def offline_client(offline: ServiceThread) -> Iterator[CoulerClient]:
    with CoulerClient({"generator": offline.address}, timeout=WAIT) as client:
        yield client


class TestOffline:
    """No LLM endpoint configured: the deterministic planner serves gRPC and events."""

    def test_two_models_side_by_side(self, offline_client: CoulerClient) -> None:
        wf, report = plan(TWO_MODELS)
        got = offline_client.generator.generate(TWO_MODELS)
        ir.validate(got.workflow)
        assert got.workflow == wf  # the planner's workflow, intact on the wire
        graph = deps(got.workflow)
        assert graph["train-xgboost-model"] == graph["train-lightgbm-model"] == {"load-churn"}
        # "evaluate the AUC of each": one measurement per model, both ranked
        assert graph["evaluate-auc-xgboost-model"] >= {"train-xgboost-model"}
        assert graph["evaluate-auc-lightgbm-model"] >= {"train-lightgbm-model"}
        assert graph["keep-better-one"] == {"evaluate-auc-xgboost-model",
                                            "evaluate-auc-lightgbm-model"}
        assert got.report.planner == "offline"
        assert got.report.rounds == 1
        assert got.report.catalog_steps == report.catalog_entries == (
            "ingest-object-store", "train-xgboost", "train-lightgbm", "evaluate-auc",
            "rank-models")
        assert got.report.subtasks == report.subtasks
        assert any(t.endswith("-> train-lightgbm") for t in got.report.subtasks)

    def test_preprocess_train_evaluate(self, offline_client: CoulerClient) -> None:
        got = offline_client.generator.generate(PIPELINE, name="sales-forest")
        ir.validate(got.workflow)
        assert got.workflow.name == "sales-forest"
        assert deps(got.workflow) == {
            "load-sales": set(),
            "train-random-forest": {"load-sales"},
            "evaluate-accuracy": {"train-random-forest", "load-sales"},
        }

    def test_shards_fan_out_with_a_limit(self, offline_client: CoulerClient) -> None:
        got = offline_client.generator.generate(FANOUT)
        ir.validate(got.workflow)
        [fanned] = [s for s in got.workflow.steps if s.foreach is not None]
        assert fanned.foreach is not None
        assert [item.value for item in fanned.foreach.items] == [str(i) for i in range(6)]
        assert fanned.foreach.parallelism == 2
        assert deps(got.workflow)[fanned.name] == {"split-events-shards"}
        assert any("for each of 6" in t for t in got.report.subtasks)

    def test_unplannable_text_is_invalid_argument(self, offline_client: CoulerClient) -> None:
        with pytest.raises(UserError, match="cannot plan") as caught:
            offline_client.generator.generate(UNPLANNABLE)
        assert "book me a flight" in str(caught.value)
        cause = caught.value.__cause__
        assert isinstance(cause, grpc.RpcError)
        assert cause.code() is grpc.StatusCode.INVALID_ARGUMENT

    def test_engine_capabilities_are_checked(self, offline_client: CoulerClient) -> None:
        assert offline_client.generator.generate(NIGHTLY, engine="argo").workflow.steps
        with pytest.raises(UnsupportedFeatureError) as caught:
            offline_client.generator.generate(NIGHTLY, engine="ray")
        assert (caught.value.engine, caught.value.feature) == ("ray", "cron schedule")
        with pytest.raises(UserError, match="unknown engine 'nomad'"):
            offline_client.generator.generate(TWO_MODELS, engine="nomad")

    def test_constraints_are_reported_not_silently_dropped(
            self, offline_client: CoulerClient) -> None:
        got = offline_client.generator.generate(PIPELINE, constraints=["use GPUs"])
        assert any("not applied" in n and "use GPUs" in n for n in got.report.notes)

    def test_text_request_becomes_workflow_generated(self, nats_server: NatsServer,
                                                     offline: ServiceThread) -> None:
        rid = run_id()
        options = events_pb2.RunOptions(engine="local", parameters={"table": "x.csv"},
                                        dry_run=True, constraints=["at most 8 steps"],
                                        tenant="acme")
        request = events_pb2.WorkflowRequested(run_id=rid, text=TWO_MODELS, options=options)
        got = asyncio.run(exchange(nats_server, [request],
                                   {rid}, headers={HEADER_TRACEPARENT: TRACEPARENT}))
        [(subject, body, headers)] = got.answers[rid]
        assert subject == GENERATED
        assert isinstance(body, events_pb2.WorkflowGenerated)
        assert body.run_id == rid
        assert body.options == options
        assert codec.workflow_from_proto(body.workflow) == plan(TWO_MODELS)[0]
        assert body.report.planner == "offline"
        assert headers["Nats-Msg-Id"] == f"{rid}.generated"
        assert headers[HEADER_TENANT] == "acme"
        # The same trace continues: same trace id as the request's traceparent.
        assert headers[HEADER_TRACEPARENT].split("-")[1] == TRACEPARENT.split("-")[1]

    def test_unplannable_request_is_rejected(self, nats_server: NatsServer,
                                             offline: ServiceThread) -> None:
        rid = run_id()
        got = asyncio.run(exchange(nats_server, [text_request(rid, UNPLANNABLE)], {rid}))
        [(subject, body, headers)] = got.answers[rid]
        assert subject == REJECTED
        assert isinstance(body, events_pb2.WorkflowRejected)
        assert (body.run_id, body.stage) == (rid, "generator")
        assert "cannot plan" in body.reason and "book me a flight" in body.reason
        assert headers["Nats-Msg-Id"] == f"{rid}.rejected"
        assert got.sequences[rid] not in got.terminated  # handled: acked, not terminated

    def test_request_without_run_id_is_terminated(self, nats_server: NatsServer,
                                                  offline: ServiceThread) -> None:
        rid = run_id()
        requests = [text_request("", PIPELINE), text_request(rid, PIPELINE)]
        got = asyncio.run(exchange(nats_server, requests, {rid}))
        assert got.sequences[""] in got.terminated  # bad input: term, nothing published
        assert got.sequences[rid] not in got.terminated
        assert "" not in got.answers

    def test_unsupported_engine_is_rejected(self, nats_server: NatsServer,
                                            offline: ServiceThread) -> None:
        # an engine whose matrix refuses the plan (the engines' gaps close over time, so
        # it is looked up, not named)
        wf, _ = plan(NIGHTLY)
        refusals = {}
        for engine in ("tekton", "kfp", "airflow", "ray"):
            try:
                check_engine(engine, wf)
            except UnsupportedFeatureError as exc:
                refusals[engine] = f"engine {engine!r} does not support {exc.feature}"
        assert refusals, "every engine expresses the request: pick another one"
        engine, reason = next(iter(refusals.items()))
        rid = run_id()
        got = asyncio.run(exchange(nats_server, [text_request(rid, NIGHTLY, engine=engine)],
                                   {rid}))
        [(subject, body, _)] = got.answers[rid]
        assert subject == REJECTED
        assert isinstance(body, events_pb2.WorkflowRejected)
        assert reason in body.reason

    def test_workflow_request_is_acked_and_ignored(self, nats_server: NatsServer,
                                                   offline: ServiceThread) -> None:
        with_workflow, with_text = run_id(), run_id()
        wf = codec.workflow_to_proto(plan(PIPELINE)[0])
        requests = [events_pb2.WorkflowRequested(run_id=with_workflow, workflow=wf),
                    text_request(with_text, PIPELINE)]
        # The consumer handles messages in order, so once the second is answered the first
        # has been handled too.
        got = asyncio.run(exchange(nats_server, requests, {with_text}))
        assert [a[0] for a in got.answers[with_text]] == [GENERATED]
        assert with_workflow not in got.answers
        assert got.sequences[with_workflow] not in got.terminated


# ----------------------------------------------------------------------------- LLM


@pytest.fixture(scope="class")
def fake_llm() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI(API_KEY)
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="class")
def llm_service(nats_server: NatsServer, fake_llm: FakeOpenAI,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceThread]:
    settings = settings_for(nats_server, tmp_path_factory.mktemp("gen-llm"),
                            llm_base_url=fake_llm.url, llm_model="fake-1", llm_api_key=API_KEY,
                            llm_max_rounds=2, llm_timeout=WAIT)
    service = ServiceThread(settings).start()
    yield service
    service.stop()


@pytest.fixture(scope="class")
def llm_client(llm_service: ServiceThread) -> Iterator[CoulerClient]:
    with CoulerClient({"generator": llm_service.address}, timeout=WAIT) as client:
        yield client


def user_messages(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


class TestLLM:
    """An LLM endpoint configured: the openai client against the fake, parsed, never run."""

    def test_invalid_then_valid_answer_is_repaired(self, llm_client: CoulerClient,
                                                   fake_llm: FakeOpenAI) -> None:
        fake_llm.say(spec(**{"train-xgb": {"template": "train-boost"}}), spec())
        got = llm_client.generator.generate(TWO_MODELS, constraints=["at most 8 steps"])
        ir.validate(got.workflow)
        assert got.workflow.name == "llm-two-models"
        assert deps(got.workflow)["pick"] == {"eval-xgb", "eval-lgbm"}
        assert ("couler.io/generated-by", "llm") in got.workflow.labels
        assert (got.report.planner, got.report.model, got.report.rounds) == ("llm", "fake-1", 2)
        assert any("'train-boost' is not in the catalog" in r for r in got.report.repairs)
        assert got.report.catalog_steps == ("ingest-object-store", "train-xgboost",
                                            "train-lightgbm", "evaluate-auc", "rank-models")
        assert "train-xgb -> train-xgboost" in got.report.subtasks
        first, second = fake_llm.seen()
        assert first["model"] == "fake-1"
        assert first["response_format"] == {"type": "json_object"}
        assert "at most 8 steps" in user_messages(first)[0]
        # The second round carries the rejected answer and the errors to repair.
        assert second["messages"][-2] == {"role": "assistant",
                                          "content": spec(**{"train-xgb":
                                                             {"template": "train-boost"}})}
        repair = user_messages(second)[-1]
        assert repair.startswith("That answer is not valid")
        assert "step 'train-xgb'" in repair and "'train-boost' is not in the catalog" in repair

    def test_name_requested_wins(self, llm_client: CoulerClient,
                                 fake_llm: FakeOpenAI) -> None:
        fake_llm.say(spec())
        got = llm_client.generator.generate(TWO_MODELS, name="churn-models")
        assert got.workflow.name == "churn-models"
        assert got.report.rounds == 1 and got.report.repairs == ()

    def test_python_code_is_refused_not_run(self, llm_client: CoulerClient,
                                            fake_llm: FakeOpenAI, tmp_path: Path) -> None:
        marker = tmp_path / "executed"
        code = f"```python\nopen({str(marker)!r}, 'w').write('pwned')\n```"
        fake_llm.say(code, code)
        with pytest.raises(UserError, match="no valid workflow after 2 rounds") as caught:
            llm_client.generator.generate(TWO_MODELS)
        assert "no JSON object" in str(caught.value)
        assert isinstance(caught.value.__cause__, grpc.RpcError)
        assert caught.value.__cause__.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert len(fake_llm.seen()) == 2
        assert not marker.exists()

    def test_engine_check_errors_go_back_for_repair(self, llm_client: CoulerClient,
                                                    fake_llm: FakeOpenAI) -> None:
        nightly = json.dumps({**json.loads(spec()), "schedule": "0 2 * * *"})
        fake_llm.say(nightly, nightly)
        with pytest.raises(UserError, match="engine 'ray' does not support cron schedule"):
            llm_client.generator.generate(TWO_MODELS, engine="ray")
        repair = user_messages(fake_llm.seen()[1])[-1]
        assert "engine 'ray' does not support cron schedule" in repair

    def test_endpoint_down_is_unavailable(self, llm_client: CoulerClient,
                                          fake_llm: FakeOpenAI) -> None:
        fake_llm.stop()
        try:
            with pytest.raises(RetryableError, match="did not answer") as caught:
                llm_client.generator.generate(TWO_MODELS)
        finally:
            fake_llm.start()
        assert isinstance(caught.value.__cause__, grpc.RpcError)
        assert caught.value.__cause__.code() is grpc.StatusCode.UNAVAILABLE
        fake_llm.say(spec())
        assert llm_client.generator.generate(TWO_MODELS).report.planner == "llm"

    def test_event_is_nakked_while_the_endpoint_fails_then_generated(
            self, nats_server: NatsServer, llm_service: ServiceThread,
            fake_llm: FakeOpenAI) -> None:
        fake_llm.say(503, spec())  # the first delivery fails (retryable), the redelivery works
        rid = run_id()
        got = asyncio.run(exchange(nats_server, [text_request(rid, TWO_MODELS)], {rid}))
        [(subject, body, _)] = got.answers[rid]
        assert subject == GENERATED
        assert isinstance(body, events_pb2.WorkflowGenerated)
        assert (body.report.planner, body.report.rounds) == ("llm", 1)
        first, second = fake_llm.seen()
        # Two deliveries, each a fresh first round (not a repair round).
        assert len(first["messages"]) == len(second["messages"]) == 2

    def test_unusable_answers_reject_the_event(self, nats_server: NatsServer,
                                               llm_service: ServiceThread,
                                               fake_llm: FakeOpenAI) -> None:
        fake_llm.say("no idea", spec(**{"pick": {"after": ["nowhere"]}}))
        rid = run_id()
        got = asyncio.run(exchange(nats_server, [text_request(rid, TWO_MODELS)], {rid}))
        [(subject, body, _)] = got.answers[rid]
        assert subject == REJECTED
        assert isinstance(body, events_pb2.WorkflowRejected)
        assert body.stage == "generator"
        assert "no valid workflow after 2 rounds" in body.reason
        assert "unknown step 'nowhere'" in body.reason

    def test_api_key_never_in_logs_or_reprs(self, llm_client: CoulerClient,
                                            llm_service: ServiceThread, fake_llm: FakeOpenAI,
                                            caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG)
        fake_llm.say(spec(**{"load": {"template": "fetch"}}), spec())
        assert llm_client.generator.generate(TWO_MODELS).report.rounds == 2
        fake_llm.say(500)
        with pytest.raises(RetryableError) as caught:
            llm_client.generator.generate(TWO_MODELS)
        settings = llm_service.settings
        assert settings.llm_api_key is not None
        assert settings.llm_api_key.get_secret_value() == API_KEY
        model = ChatModel(fake_llm.url, "fake-1", api_key=settings.llm_api_key)
        try:
            texts = [caplog.text, repr(settings), str(settings), settings.model_dump_json(),
                     repr(model), repr(Generator(model)), str(caught.value)]
        finally:
            model.close()
        assert caplog.records  # the service did log (at DEBUG), just not the key
        for text in texts:
            assert API_KEY not in text


class TestChatModel:
    """The openai adapter alone against the fake: credentials, JSON mode fallback."""

    def test_wrong_key_is_retryable_and_names_the_setting(self, fake_llm: FakeOpenAI) -> None:
        model = ChatModel(fake_llm.url, "fake-1", api_key=SecretStr("sk-wrong-key"))
        try:
            with pytest.raises(RetryableError, match="COULER_LLM_API_KEY") as caught:
                model([{"role": "user", "content": "hi"}])
        finally:
            model.close()
        assert "sk-wrong-key" not in str(caught.value)

    def test_endpoint_without_json_mode(self, fake_llm: FakeOpenAI) -> None:
        model = ChatModel(fake_llm.url, "fake-1", api_key=SecretStr(API_KEY))
        fake_llm.reject_response_format = True
        try:
            fake_llm.say("first", "second")
            assert model([{"role": "user", "content": "a"}]) == "first"
            assert model([{"role": "user", "content": "b"}]) == "second"
        finally:
            fake_llm.reject_response_format = False
            model.close()
        formats = ["response_format" in body for body in fake_llm.seen()]
        assert formats == [True, False, False]  # asked once, then never again


def test_settings_need_a_model_with_an_endpoint(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="COULER_LLM_MODEL: required"):
        GeneratorSettings.load("generator", llm_base_url="http://127.0.0.1:9/v1",
                               llm_model="", state_dir=tmp_path)
    with pytest.raises(SettingsError, match="COULER_LLM_BASE_URL"):
        GeneratorSettings.load("generator", llm_base_url="ftp://x", llm_model="m",
                               state_dir=tmp_path)
    unset = GeneratorSettings.load("generator", llm_base_url="", llm_model="",
                                   llm_api_key="", state_dir=tmp_path)
    assert (unset.llm_base_url, unset.llm_api_key) == (None, None)



# ----------------------------------------------------------------------------- the process


def generator_env(nats: NatsServer, state: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    env.update({"COULER_NATS_URL": nats.url, "COULER_GRPC_ADDRESS": "127.0.0.1:0",
                "COULER_STATE_DIR": str(state), "COULER_LLM_BASE_URL": "",
                "COULER_LLM_MODEL": "", "COULER_LLM_API_KEY": "",
                "COULER_BUS_INSECURE": "true", **extra})
    return env


class TestConsoleScript:
    """``couler-generator`` as a process: READY line, serves, stops cleanly on SIGTERM."""

    def test_serves_until_sigterm(self, nats_server: NatsServer, tmp_path: Path) -> None:
        proc = subprocess.Popen([str(BIN / "couler-generator")], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True,
                                env=generator_env(nats_server, tmp_path))
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        reader = threading.Thread(target=lambda: [lines.put(line) for line in stdout],
                                  daemon=True)
        reader.start()
        with proc:
            try:
                ready = lines.get(timeout=WAIT)
                prefix, service, address = ready.split()
                assert (prefix, service) == (READY_PREFIX, "generator")
                with CoulerClient({"generator": address}, timeout=WAIT) as client:
                    assert client.generator.generate(PIPELINE).report.planner == "offline"
            finally:
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(WAIT)
                reader.join(WAIT)  # EOF once the process has exited
        assert code == 0

    def test_bad_settings_exit_2_naming_the_variable(self, nats_server: NatsServer,
                                                     tmp_path: Path) -> None:
        env = generator_env(nats_server, tmp_path, COULER_LLM_BASE_URL="http://127.0.0.1:9/v1")
        done = subprocess.run([str(BIN / "couler-generator")], env=env, capture_output=True,
                              text=True, timeout=WAIT, check=False)
        assert done.returncode == 2
        assert "COULER_LLM_MODEL: required" in done.stderr
