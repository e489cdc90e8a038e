"""``couler generate "TEXT"``: a plain-English request → a workflow, printed, never run.

The offline planner (:func:`couler.generate.planner.plan`) turns the request into IR; the
workflow is printed as canonical IR JSON (``--engine ir``, the default) or compiled for an
engine (``argo``, ``tekton``, ``airflow``, ``kfp``) — compiling checks that the engine can
run it. ``-o FILE`` writes it to a file; ``--explain`` prints to stderr how the request was
read: the sub-tasks, the template chosen for each (with the runners-up and their scores),
and the choices and notes (workflow parameters to set, steps added). ``--spec`` prints the
intermediate spec (the JSON an LLM would answer) instead of the workflow.

With ``--llm-url URL --llm-model NAME`` (or ``COULER_LLM_BASE_URL`` / ``COULER_LLM_MODEL``; the
key, if the endpoint needs one, from ``COULER_LLM_API_KEY`` only, never printed) an
OpenAI-compatible chat endpoint writes the spec instead
(:func:`couler.generate.llm.generate_with_llm`): its answer is parsed and validated, never
run, and the errors — the engine's too — go back to it for repair. The client here is a
few lines of ``urllib``: the core library does not depend on the ``openai`` package, which
the generator service uses.

Exit status: 0 with the workflow; 2 (a refusal) naming the part of the request that could
not be planned, or the feature the engine cannot run; 1 when the LLM endpoint fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO
from urllib.parse import urlsplit

from couler.errors import RetryableError, UserError
from couler.generate.endpoint import (
    RATE_LIMIT_ATTEMPTS,
    RATE_LIMIT_MAX_WAIT,
    completion_text,
    rate_limit_wait,
)

__all__ = ["add_generate_command", "cmd_generate"]

_ENGINES = ("ir", "argo", "tekton", "airflow", "kfp")


def add_generate_command(sub: Any) -> None:
    """Register ``generate`` on the ``couler`` command's sub-parsers."""
    p = sub.add_parser("generate", help="turn a plain-English request into a workflow")
    p.add_argument("text", help="the request, e.g. \"train XGBoost on s3://b/churn.csv\"; "
                                "'-' reads it from stdin")
    p.add_argument("--engine", choices=_ENGINES, default="ir",
                   help="print canonical IR JSON (default) or compile for an engine")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--name", default="", help="the workflow's name (default: from the request)")
    p.add_argument("--explain", action="store_true",
                   help="print the sub-tasks, templates and choices to stderr")
    p.add_argument("--spec", action="store_true",
                   help="print the generator's spec (JSON) instead of the workflow")
    p.add_argument("--llm-url", default=os.environ.get("COULER_LLM_BASE_URL", ""),
                   help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 "
                        "(default: $COULER_LLM_BASE_URL; key: $COULER_LLM_API_KEY); unset: the "
                        "offline planner")
    p.add_argument("--llm-model", default=os.environ.get("COULER_LLM_MODEL", ""),
                   help="the chat model to ask (default: $COULER_LLM_MODEL)")
    p.add_argument("--llm-rounds", type=int, default=3,
                   help="answers the model may give, repairs included (default 3)")
    p.set_defaults(func=cmd_generate, takes_err=True)


def cmd_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler import ir
    from couler.cli import COMPILERS
    from couler.generate.library import TEMPLATES
    from couler.generate.planner import GenerationReport
    from couler.generate.spec import WorkflowSpec, assemble, spec_to_json

    text = sys.stdin.read() if args.text == "-" else args.text
    spec: WorkflowSpec | None = None
    wf: ir.Workflow | None = None
    report: GenerationReport
    if args.llm_url:
        from couler.generate.llm import generate_with_llm

        if not args.llm_model:
            raise UserError("generate: --llm-url needs --llm-model (or COULER_LLM_MODEL)")
        if args.spec:
            raise UserError("generate: --spec prints the offline planner's spec; with an LLM "
                            "endpoint print the workflow (--engine ir) instead")
        engine = args.engine

        def check(candidate: ir.Workflow) -> None:
            if engine != "ir":
                COMPILERS[engine]([candidate])

        complete = chat_client(args.llm_url, args.llm_model,
                               api_key=os.environ.get("COULER_LLM_API_KEY", ""))
        wf, report = generate_with_llm(text, complete, templates=TEMPLATES,
                                       max_rounds=args.llm_rounds, check=check, name=args.name)
    else:
        from couler.generate.planner import plan_spec

        spec, report = plan_spec(text, name=args.name, templates=TEMPLATES)
    if args.explain:
        err.write(f"request: {' '.join(text.split())[:300]}\n")
        err.write(f"planner: {report.planner}"
                  + (f" ({report.rounds} rounds)" if report.rounds else "") + "\n")
        err.write("sub-tasks:\n" + "".join(f"  {i}. {s}\n"
                                           for i, s in enumerate(report.subtasks, 1)))
        if report.choices:
            err.write("template choices (score; runners-up):\n"
                      + "".join(f"  {c}\n" for c in report.choices))
        if spec is not None and spec.schedule:
            err.write(f"schedule: {spec.schedule} {spec.timezone}\n")
        for note in report.notes:
            err.write(f"note: {note}\n")
    if args.spec and spec is not None:
        rendered = json.dumps(spec_to_json(spec), indent=2, sort_keys=True) + "\n"
    else:
        if wf is None:
            assert spec is not None
            wf = assemble(spec, TEMPLATES)
        try:
            rendered = COMPILERS[args.engine]([wf])
        except UserError as exc:
            raise UserError(f"generate: the workflow {wf.name!r} cannot run on "
                            f"{args.engine}: {exc}") from exc
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(rendered)
    else:
        out.write(rendered)
    return 0


_TIMEOUT = 120.0
_BRIEF = 300


def chat_client(url: str, model: str, *, api_key: str = "", timeout: float = _TIMEOUT,
                attempts: int = RATE_LIMIT_ATTEMPTS, max_wait: float = RATE_LIMIT_MAX_WAIT,
                sleep: Callable[[float], None] = time.sleep,
                ) -> Callable[[Sequence[Mapping[str, str]]], str]:
    """``complete(messages) -> str`` over an OpenAI-compatible ``POST {url}/chat/completions``.

    Asks for a JSON object (``response_format``) and, when the endpoint answers HTTP 400
    to that, asks again without it (endpoints without JSON mode). HTTP 429 is asked again
    after the endpoint's ``Retry-After`` (else 1, 2, 4... s), ``attempts`` times in all; a
    ``Retry-After`` beyond ``max_wait`` is not waited on. A failed call is a RetryableError
    (HTTP 401/403 name the key's variable, never the key; a timeout names ``timeout``; an
    answer cut off or not JSON says so); HTTP 422 or a 400 without JSON mode is a
    UserError. An answer that is JSON but no chat completion gives "" (one more draft for
    the repair loop). The key is only ever sent in the header.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"generate: --llm-url must be an http(s):// URL (got {_where(url)!r})")
    endpoint = url.rstrip("/") + "/chat/completions"
    where = _where(url)
    json_mode = [True]

    def post(messages: Sequence[Mapping[str, str]], with_json: bool) -> Any:
        body: dict[str, Any] = {"model": model, "messages": [dict(m) for m in messages]}
        if with_json:
            body["response_format"] = {"type": "json_object"}
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        request = urllib.request.Request(endpoint, data=json.dumps(body).encode(),
                                         headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)

    def ask(messages: Sequence[Mapping[str, str]]) -> Any:
        failures = 0
        while True:
            try:
                try:
                    return post(messages, json_mode[0])
                except urllib.error.HTTPError as exc:
                    if exc.code != 400 or not json_mode[0]:
                        raise
                    exc.close()
                    json_mode[0] = False  # perhaps no JSON mode there: ask without it
                    return post(messages, False)
            except urllib.error.HTTPError as exc:
                if exc.code != 429:
                    raise
                failures += 1
                with exc:
                    wait = rate_limit_wait(exc.headers.get("Retry-After"), failures,
                                           now=time.time(), max_wait=max_wait)
                if wait > max_wait:
                    raise RetryableError(f"generate: the LLM endpoint {where} answered HTTP "
                                         f"429 (rate limited) and asks to wait {wait:g} s"
                                         ) from exc
                if failures >= attempts:
                    raise RetryableError(f"generate: the LLM endpoint {where} answered HTTP "
                                         f"429 (rate limited) {failures} times; try again "
                                         "later") from exc
                sleep(wait)

    def complete(messages: Sequence[Mapping[str, str]]) -> str:
        try:
            answer = ask(messages)
        except urllib.error.HTTPError as exc:
            with exc:  # the error holds the response: close its connection
                body = exc.read().decode("utf-8", "replace")
            if exc.code in (401, 403):
                # No body in the message: some endpoints echo part of the key they rejected.
                raise RetryableError(f"generate: the LLM endpoint {where} refused the "
                                     f"credentials (HTTP {exc.code}; check "
                                     "COULER_LLM_API_KEY)") from exc
            detail = _brief(body)
            if exc.code in (400, 422):
                raise UserError(f"generate: the LLM endpoint {where} refused the request "
                                f"(HTTP {exc.code}): {detail}") from exc
            raise RetryableError(f"generate: the LLM endpoint {where} answered HTTP "
                                 f"{exc.code}: {detail}") from exc
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # URLError, timeouts, an answer not JSON or cut off (IncompleteRead)
            if isinstance(exc, TimeoutError) or isinstance(
                    getattr(exc, "reason", None), TimeoutError):
                raise RetryableError(f"generate: the LLM endpoint {where} did not answer "
                                     f"within {timeout:g} s") from exc
            raise RetryableError(f"generate: the LLM endpoint {where} did not answer usably "
                                 f"({type(exc).__name__}: {_brief(str(exc))})") from exc
        return completion_text(answer)

    return complete


def _where(url: str) -> str:
    """``url`` without credentials, query or fragment (safe to print)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _brief(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _BRIEF else text[:_BRIEF] + "..."
