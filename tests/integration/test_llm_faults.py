"""The two LLM clients under the faults an OpenAI-compatible endpoint gives.

The command line's client (``couler.generate_cli.chat_client``, urllib) and the generator
service's (``couler_generator.service.ChatModel``, the openai SDK) against
tests/openai_fake.py answering 429 with ``Retry-After``, holding a request past the client's
timeout, cutting its JSON (inside a complete answer, or by dropping the connection under the
full ``Content-Length``) and answering valid JSON that is not a chat completion. Each must
wait what the endpoint asks (bounded, the waits recorded, never slept here), report a
timeout naming it, and turn a malformed answer into a clear error or one more draft for the
validate-and-repair loop -- never a crash, never anything run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from couler.errors import RetryableError
from couler.generate.library import TEMPLATES
from couler.generate.llm import generate_with_llm
from couler.generate_cli import chat_client
from couler_generator.service import ChatModel
from tests.integration.test_generate_llm import GOOD, answer
from tests.openai_fake import FakeOpenAI, Hold, RateLimited, Raw, Truncated

API_KEY = "sk-couler-faults-41c2"
REQUEST = "Load s3://data/churn.csv, train LightGBM to predict churned and evaluate its AUC"
HI = [{"role": "user", "content": "hi"}]
Complete = Callable[[Sequence[Mapping[str, str]]], str]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(API_KEY)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture(params=["cli", "service"])
def client(request: pytest.FixtureRequest, fake: FakeOpenAI,
           sleeps: list[float]) -> Iterator[Callable[..., Complete]]:
    """A factory of one of the two clients: ``make(timeout=...)``."""
    made: list[ChatModel] = []

    def make(timeout: float = 60.0) -> Complete:
        if request.param == "cli":
            return chat_client(fake.url, "fake-1", api_key=API_KEY, timeout=timeout,
                               sleep=sleeps.append)
        model = ChatModel(fake.url, "fake-1", api_key=SecretStr(API_KEY), timeout=timeout,
                          sleep=sleeps.append)
        made.append(model)
        return model

    yield make
    for model in made:
        model.close()


# --------------------------------------------------------------------------- 429


def test_too_many_requests_waits_the_retry_after(fake: FakeOpenAI, client: Any,
                                                 sleeps: list[float]) -> None:
    fake.say(RateLimited("2"), RateLimited("3"), "the answer")
    assert client()(HI) == "the answer"
    assert sleeps == [2.0, 3.0]
    assert len(fake.seen()) == 3


def test_too_many_requests_gives_up_after_bounded_attempts(fake: FakeOpenAI, client: Any,
                                                           sleeps: list[float]) -> None:
    fake.say(*[RateLimited("1")] * 10)
    with pytest.raises(RetryableError, match=r"HTTP 429.*3 times") as caught:
        client()(HI)
    assert len(fake.seen()) == 3 and sleeps == [1.0, 1.0]
    assert API_KEY not in str(caught.value)


def test_a_retry_after_beyond_the_bound_is_not_waited(fake: FakeOpenAI, client: Any,
                                                      sleeps: list[float]) -> None:
    """An endpoint asking for an hour is not waited on inside a request: the error says
    so, and the caller's own back-off decides."""
    fake.say(RateLimited("3600"), "never asked")
    with pytest.raises(RetryableError, match=r"HTTP 429.*3600 s"):
        client()(HI)
    assert len(fake.seen()) == 1 and sleeps == []


def test_without_a_retry_after_the_wait_backs_off(fake: FakeOpenAI, client: Any,
                                                  sleeps: list[float]) -> None:
    fake.say(RateLimited(""), RateLimited("soon"), "ok")
    assert client()(HI) == "ok"
    assert sleeps == [1.0, 2.0]


# --------------------------------------------------------------------------- timeout


def test_a_request_held_past_the_timeout_is_reported_naming_it(
        fake: FakeOpenAI, client: Any, sleeps: list[float]) -> None:
    fake.say(Hold())
    try:
        with pytest.raises(RetryableError, match=r"did not answer within 0\.5 s") as caught:
            client(timeout=0.5)(HI)
        assert fake.wait_held(1)  # it was the endpoint that held it
    finally:
        fake.release()
    assert fake.url.removesuffix("/v1") in str(caught.value)
    assert len(fake.seen()) == 1 and sleeps == []  # a timeout is not sent again here


# --------------------------------------------------------------------------- malformed


@pytest.mark.parametrize("drop", [False, True], ids=["cut-json", "dropped-connection"])
def test_a_cut_answer_is_a_clear_retryable_error(fake: FakeOpenAI, client: Any,
                                                 drop: bool) -> None:
    fake.say(Truncated(answer(), at=60, drop=drop))
    with pytest.raises(RetryableError, match=r"LLM endpoint .* (unusable|did not answer)"):
        client()(HI)


@pytest.mark.parametrize("body", [
    '{"object": "list", "data": []}',
    '{"choices": 5}',
    '{"choices": [{"message": {"content": {"steps": []}}}]}',
    '[1, 2, 3]',
    '"just a string"',
])
def test_json_that_is_not_a_completion_is_an_empty_draft(fake: FakeOpenAI, client: Any,
                                                         body: str) -> None:
    fake.say(Raw(body))
    assert client()(HI) == ""


def test_a_malformed_answer_goes_to_the_repair_loop_and_nothing_runs(
        fake: FakeOpenAI, client: Any, tmp_path: Path) -> None:
    """Valid JSON that is not the spec, and an envelope without a completion: both are
    drafts the loop sends back; the third answer is the workflow."""
    marker = tmp_path / "ran"
    not_the_schema = json.dumps({"workflow": {"run": f"touch {marker}"}, "steps": "all"})
    fake.say(not_the_schema, Raw('{"object": "list"}'), json.dumps(GOOD))
    wf, report = generate_with_llm(REQUEST, client(), templates=TEMPLATES, max_rounds=3)
    assert (wf.name, report.rounds) == ("churn-lightgbm", 3)
    second, third = fake.seen()[1:]
    assert "steps" in second["messages"][-1]["content"]  # the schema error, sent back
    assert "empty" in third["messages"][-1]["content"]
    assert not marker.exists()
