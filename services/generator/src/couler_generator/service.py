"""The generator's use case: a request in plain language → a valid IR workflow, or a refusal.

:class:`Generator` plans with the deterministic offline planner
(:func:`couler.generate.planner.plan`) over the template catalog
(:data:`couler.generate.library.TEMPLATES`) unless it was given a :class:`ChatModel`; then
it asks the model through :func:`couler.generate.llm.generate_with_llm`, which parses the
model's JSON spec into IR (never executing it), validates it, and sends the errors back for
repair at most ``max_rounds`` times before refusing. Either way the workflow must pass the
target engine's capability check (``couler.engines.base.check_capabilities`` with that
engine's ``CAPABILITIES``); for the LLM a failed check is one more error to repair.

Errors, by type (mapped to gRPC statuses and NATS answers by the runtime)::

    UserError                  the text cannot be planned, unknown engine, the endpoint
                               refused the request (HTTP 400/422)
    ├── ValidationError        (from the planner) the workflow is invalid
    └── UnsupportedFeatureError  the target engine cannot run the planned workflow
    RetryableError             the LLM endpoint is unreachable, timed out or failed
                               (HTTP 401/403/404/408/409/429/5xx: infrastructure or settings)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import openai
from pydantic import SecretStr

from couler import ir
from couler.errors import RetryableError, UserError
from couler.generate.endpoint import (
    RATE_LIMIT_ATTEMPTS,
    RATE_LIMIT_MAX_WAIT,
    completion_text,
    rate_limit_wait,
)
from couler.generate.library import TEMPLATES
from couler.generate.llm import generate_with_llm
from couler.generate.planner import GenerationReport as PlannerReport
from couler.generate.planner import plan
from couler.generate.templates import Template
from couler_runtime import metrics
from couler_runtime.engines import check_engine, engine_name
from couler_runtime.rpc.records import GenerationReport
from couler_runtime.settings import redact_url

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

__all__ = ["ChatModel", "Generator", "capability_check"]

log = logging.getLogger(__name__)

# Sent when no key is configured: the client insists on one, local endpoints ignore it.
_NO_KEY = "unused"
_MESSAGE_LIMIT = 300

Check = Callable[[ir.Workflow], None]


def capability_check(engine: str) -> Check:
    """The capability check of ``engine`` ("" means "local"); UserError for an unknown one."""
    name = engine_name(engine)

    def check(wf: ir.Workflow) -> None:
        check_engine(name, wf)

    return check


class ChatModel:
    """An OpenAI-compatible chat endpoint as the ``complete(messages) -> str`` callable.

    Blocking (it runs in a worker thread); safe to call from several threads. Asks for a
    JSON object (``response_format``) and stops asking when the endpoint answers HTTP 400 to
    that once, as endpoints without JSON mode do. HTTP 429 is asked again after the
    endpoint's ``Retry-After`` (else 1, 2, 4... s), ``attempts`` times in all, never waiting
    beyond ``max_wait`` (:mod:`couler.generate.endpoint`): the endpoint did no work. Any
    other failure is not retried here: it is a RetryableError and the caller (the NATS
    consumer's back-off, or the gRPC client) decides when to try again, so one Generate
    lasts at most ``max_rounds`` times (``attempts`` times ``timeout`` plus the waits).
    A timeout names ``timeout``; an answer that is no chat completion gives "" (one more
    draft for the repair loop), never an exception.

    Args:
        base_url: The endpoint, e.g. ``http://127.0.0.1:8000/v1``.
        model: The model to ask.
        api_key: The endpoint's key; only ever handed to the client.
        timeout: Seconds one completion may take.
        attempts: Tries in all when the endpoint answers 429.
        max_wait: The longest ``Retry-After`` waited on.
        sleep: How to wait (tests record it).
    """

    def __init__(self, base_url: str, model: str, *, api_key: SecretStr | None = None,
                 timeout: float = 60.0, attempts: int = RATE_LIMIT_ATTEMPTS,
                 max_wait: float = RATE_LIMIT_MAX_WAIT,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.model = model
        self._where = redact_url(base_url)
        self._timeout = timeout
        self._attempts = attempts
        self._max_wait = max_wait
        self._sleep = sleep
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key.get_secret_value() if api_key else _NO_KEY,
            timeout=timeout, max_retries=0)
        self._json_mode = True
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ChatModel(base_url={self._where!r}, model={self.model!r})"

    def __call__(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The model's answer to ``messages`` (its text; "" when it gave none)."""
        with self._lock:
            json_mode = self._json_mode
        if not json_mode:
            return self._rate_limited(messages, json_mode=False)
        try:
            return self._rate_limited(messages, json_mode=True)
        except openai.BadRequestError:
            pass  # perhaps no JSON mode there: ask without it (a 400 again is a refusal)
        answer = self._rate_limited(messages, json_mode=False)
        log.info("LLM endpoint %s refuses response_format=json_object; asking without it",
                 self._where)
        with self._lock:
            self._json_mode = False
        return answer

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def _rate_limited(self, messages: Sequence[Mapping[str, str]], *, json_mode: bool) -> str:
        failures = 0
        while True:
            try:
                return self._complete(messages, json_mode=json_mode)
            except openai.RateLimitError as exc:
                failures += 1
                wait = rate_limit_wait(exc.response.headers.get("retry-after"), failures,
                                       now=time.time(), max_wait=self._max_wait)
                if wait > self._max_wait:
                    raise RetryableError(
                        f"generate: the LLM endpoint {self._where} answered HTTP 429 (rate "
                        f"limited) and asks to wait {wait:g} s") from exc
                if failures >= self._attempts:
                    raise RetryableError(
                        f"generate: the LLM endpoint {self._where} answered HTTP 429 (rate "
                        f"limited) {failures} times; try again later") from exc
                log.info("LLM endpoint %s: rate limited (HTTP 429); asking again in %g s",
                         self._where, wait)
                self._sleep(wait)

    def _complete(self, messages: Sequence[Mapping[str, str]], *, json_mode: bool) -> str:
        params = cast("list[ChatCompletionMessageParam]", [dict(m) for m in messages])
        extra: dict[str, Any] = (
            {"response_format": {"type": "json_object"}} if json_mode else {})
        try:
            raw = self._client.chat.completions.with_raw_response.create(
                model=self.model, messages=params, **extra)
            answer = json.loads(raw.http_response.content)
        except openai.BadRequestError as exc:
            if json_mode:
                raise  # the caller retries without JSON mode
            raise self._refused(exc) from exc
        except openai.UnprocessableEntityError as exc:
            raise self._refused(exc) from exc
        except openai.RateLimitError:
            raise  # the caller waits and asks again
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            # No body in the message: some endpoints echo part of the key they rejected.
            raise RetryableError(
                f"generate: the LLM endpoint {self._where} refused the credentials "
                f"(HTTP {exc.status_code}; check COULER_LLM_API_KEY)") from exc
        except openai.APIStatusError as exc:
            raise RetryableError(
                f"generate: the LLM endpoint {self._where} answered HTTP {exc.status_code}: "
                f"{_brief(exc.message)}") from exc
        except openai.APITimeoutError as exc:
            raise RetryableError(
                f"generate: the LLM endpoint {self._where} did not answer within "
                f"{self._timeout:g} s") from exc
        except openai.APIConnectionError as exc:
            raise RetryableError(
                f"generate: the LLM endpoint {self._where} did not answer "
                f"({type(exc).__name__}: {_brief(str(exc))})") from exc
        except (openai.OpenAIError, ValueError) as exc:  # e.g. a body cut off, not JSON
            raise RetryableError(
                f"generate: the LLM endpoint {self._where} gave an unusable answer "
                f"({type(exc).__name__}: {_brief(str(exc))})") from exc
        # Read as plain JSON, defensively: a missing or empty answer is one more invalid
        # draft for the repair loop, not a crash.
        return completion_text(answer)

    def _refused(self, exc: openai.APIStatusError) -> UserError:
        return UserError(f"generate: the LLM endpoint {self._where} refused the request "
                         f"(HTTP {exc.status_code}): {_brief(exc.message)}")


def _brief(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_LIMIT else text[:_MESSAGE_LIMIT] + "..."


class Generator:
    """Turns requests into workflows: offline, or through ``llm`` when one is given.

    Args:
        llm: The chat model; None for the offline planner.
        max_rounds: Generate-validate-repair rounds the LLM gets before a refusal.
        templates: The catalog steps are chosen from (default: the library's).
    """

    def __init__(self, llm: ChatModel | None = None, *, max_rounds: int = 3,
                 templates: Mapping[str, Template] | None = None) -> None:
        if max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        self._llm = llm
        self._max_rounds = max_rounds
        self._templates = TEMPLATES if templates is None else templates
        self._requests = metrics.meter("couler.generator").create_counter(
            "couler.generator.requests", unit="{request}",
            description="Generation requests: planner=offline or llm, result=generated, "
                        "refused (the request cannot be planned) or failed (the LLM "
                        "endpoint was unavailable)")

    def __repr__(self) -> str:
        return f"Generator(llm={self._llm!r}, max_rounds={self._max_rounds})"

    async def generate(self, text: str, constraints: Sequence[str] = (), engine: str = "",
                       name: str = "") -> tuple[ir.Workflow, GenerationReport]:
        """A valid workflow for ``text``, runnable on ``engine``, and how it was made
        (counted by outcome; see :meth:`_generate`)."""
        planner = "offline" if self._llm is None else "llm"
        try:
            made = await self._generate(text, constraints, engine, name)
        except UserError:
            self._requests.add(1, {"planner": planner, "result": "refused"})
            raise
        except Exception:
            self._requests.add(1, {"planner": planner, "result": "failed"})
            raise
        self._requests.add(1, {"planner": planner, "result": "generated"})
        return made

    async def _generate(self, text: str, constraints: Sequence[str], engine: str,
                        name: str) -> tuple[ir.Workflow, GenerationReport]:
        """A valid workflow for ``text``, runnable on ``engine``, and how it was made.

        Args:
            text: The request in plain language.
            constraints: Extra requirements in plain language (given to the LLM; the
                offline planner cannot interpret them and says so in the report's notes).
            engine: The engine the workflow must run on; "" means "local".
            name: The workflow's name; "" lets the generator choose.

        Raises:
            UserError: The request cannot be planned into a valid workflow (the message
                says why); UnsupportedFeatureError when the engine cannot run it.
            RetryableError: The LLM endpoint is unavailable.
        """
        if not text.strip():
            raise UserError("generate: the request text is empty")
        check = capability_check(engine)
        constraints = tuple(c.strip() for c in constraints if c.strip())
        if self._llm is None:
            wf, report = plan(text, name=name, templates=self._templates)
            check(wf)
            notes = report.notes
            if constraints:
                notes += ("the offline planner does not interpret constraints; not applied: "
                          + "; ".join(constraints),)
            return wf, _record(report, notes=notes)
        # The openai client blocks: keep the event loop (gRPC, NATS) free.
        return await asyncio.to_thread(self._generate_with_llm, self._llm, text, constraints,
                                       check, name)

    def _generate_with_llm(self, llm: ChatModel, text: str, constraints: tuple[str, ...],
                           check: Check, name: str) -> tuple[ir.Workflow, GenerationReport]:
        repairs: list[str] = []

        def complete(messages: Sequence[Mapping[str, str]]) -> str:
            if len(messages) > 2:
                # The last message asks for a repair: its inner lines are the errors.
                repairs.extend(line.strip() for line in messages[-1]["content"].splitlines()[1:-1]
                               if line.strip())
            return llm(messages)

        request = text.strip()
        if constraints:
            request += "\nConstraints:\n" + "\n".join(f"- {c}" for c in constraints)
        wf, report = generate_with_llm(request, complete, templates=self._templates,
                                       max_rounds=self._max_rounds, check=check, name=name)
        # The request as the user wrote it (without the constraints appended for the model).
        wf = dataclasses.replace(
            wf, labels=(*wf.labels, ("couler.io/generated-by", "llm")),
            annotations=(*((k, v) for k, v in wf.annotations if k != "couler.io/request"),
                         ("couler.io/request", " ".join(text.split())[:256])))
        ir.validate(wf)
        check(wf)
        return wf, _record(report, model=llm.model, repairs=tuple(repairs))


def _record(report: PlannerReport, *, model: str = "", repairs: tuple[str, ...] = (),
            notes: tuple[str, ...] | None = None) -> GenerationReport:
    return GenerationReport(
        planner=report.planner, model=model, subtasks=report.subtasks,
        catalog_steps=report.catalog_entries,
        # The offline planner's one draft is valid by construction: one round.
        rounds=max(report.rounds, 1), repairs=repairs,
        notes=report.notes if notes is None else notes)
