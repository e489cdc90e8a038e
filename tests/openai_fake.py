"""An OpenAI-compatible chat endpoint for tests: a FastAPI app under uvicorn on 127.0.0.1.

``POST /v1/chat/completions`` answers from a script the test sets (:meth:`FakeOpenAI.say`):
each entry is the assistant's text, an HTTP status to fail with, or one of the faults an
endpoint gives: :class:`RateLimited` (429 with ``Retry-After``, the body OpenAI sends),
:class:`Hold` (the request is kept unanswered until :meth:`FakeOpenAI.release`: past any
client timeout; :meth:`FakeOpenAI.wait_held` is the barrier on its arrival),
:class:`Truncated` (the completion's JSON cut after ``at`` bytes: with ``drop``, the
connection closes mid-body under the full ``Content-Length``; without, a complete HTTP answer
whose JSON is cut) and :class:`Raw` (any body, e.g. valid JSON that is not a chat
completion). Every request body is kept in ``requests``. It checks ``Authorization: Bearer
<api_key>`` (401 otherwise), can refuse ``response_format`` with HTTP 400 as endpoints
without JSON mode do, and answers 500 when the script is empty. :meth:`stop` and
:meth:`start` take it down and bring it back on the same port.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.servers import free_port

__all__ = ["FakeOpenAI", "Hold", "RateLimited", "Raw", "Truncated"]


@dataclass(frozen=True)
class RateLimited:
    """429 Too Many Requests with ``Retry-After: retry_after`` (seconds)."""

    retry_after: str = "1"


@dataclass(frozen=True)
class Hold:
    """Keep the request unanswered until :meth:`FakeOpenAI.release` (then answer 500)."""


@dataclass(frozen=True)
class Truncated:
    """The chat completion carrying ``content``, its JSON cut after ``at`` bytes."""

    content: str
    at: int
    drop: bool = False


@dataclass(frozen=True)
class Raw:
    """This body, as it is, with ``status``."""

    body: str
    status: int = 200


Reply = str | int | RateLimited | Hold | Truncated | Raw

START_TIMEOUT = 30.0


class FakeOpenAI:
    """A scripted chat-completions server; ``url`` is its ``base_url`` (ending in ``/v1``)."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.requests: list[dict[str, Any]] = []
        self.reject_response_format = False
        self._script: collections.deque[Reply] = collections.deque()
        self._lock = threading.Condition()
        self.held = 0  # requests that arrived to a Hold
        self._release = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = self._make_app()

    def say(self, *replies: Reply) -> None:
        """Replace the script: the next answers, in order (an int is an HTTP error status)."""
        with self._lock:
            self._script = collections.deque(replies)
            self.requests.clear()
            self.held = 0
            self._release.clear()

    def wait_held(self, n: int = 1, timeout: float = 30.0) -> bool:
        """Block until ``n`` requests are being held (a barrier, not a delay)."""
        with self._lock:
            return self._lock.wait_for(lambda: self.held >= n, timeout)

    def release(self) -> None:
        """Let every held request go (it is answered 500: its client is long gone)."""
        self._release.set()

    def seen(self) -> list[dict[str, Any]]:
        """The request bodies received since the last :meth:`say`."""
        with self._lock:
            return list(self.requests)

    def _make_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            if request.headers.get("authorization") != f"Bearer {self.api_key}":
                return _error(401, "invalid api key", "invalid_request_error")
            body = await request.json()
            with self._lock:
                self.requests.append(body)
                if self.reject_response_format and "response_format" in body:
                    return _error(400, "response_format is not supported by this model",
                                  "invalid_request_error")
                reply: Reply = self._script.popleft() if self._script else 500
                number = len(self.requests)
            if isinstance(reply, int):
                return _error(reply, f"scripted failure {reply}", "server_error")
            if isinstance(reply, RateLimited):
                return _error(429, "Rate limit reached for requests. Please try again later.",
                              "requests", code="rate_limit_exceeded",
                              headers={"Retry-After": reply.retry_after})
            if isinstance(reply, Hold):
                with self._lock:
                    self.held += 1
                    self._lock.notify_all()
                await asyncio.to_thread(self._release.wait)
                return _error(500, "held past the client's timeout", "server_error")
            if isinstance(reply, Raw):
                return Response(reply.body, status_code=reply.status,
                                media_type="application/json")
            content = reply.content if isinstance(reply, Truncated) else reply
            data = json.dumps(_completion(number, body.get("model", ""), content)).encode()
            if not isinstance(reply, Truncated):
                return Response(data, media_type="application/json")
            if not reply.drop:
                return Response(data[:reply.at], media_type="application/json")

            async def cut() -> AsyncIterator[bytes]:
                yield data[:reply.at]
                raise ConnectionAbortedError("the fake drops the connection mid-body")

            return StreamingResponse(cut(), media_type="application/json",
                                     headers={"Content-Length": str(len(data))})

        return app

    def start(self) -> None:
        """Serve on ``port`` (the same one after a :meth:`stop`)."""
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, lifespan="off",
                                http="h11", ws="none", log_config=None, access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="fake-openai", daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                raise RuntimeError(f"the fake OpenAI server did not start on port {self.port}")
            time.sleep(0.02)
        self._server, self._thread = server, thread

    def stop(self) -> None:
        """Stop serving; connections are refused until :meth:`start`."""
        self._release.set()
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join()
        self._server = self._thread = None


def _completion(number: int, model: str, content: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _error(status: int, message: str, kind: str, *, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}},
                        status_code=status, headers=headers)
