"""An OpenAI-compatible chat endpoint for tests: a FastAPI app under uvicorn on 127.0.0.1.

``POST /v1/chat/completions`` answers from a script the test sets (:meth:`FakeOpenAI.say`):
each entry is either the assistant's text or an HTTP status to fail with; every request
body is kept in ``requests``. It checks ``Authorization: Bearer <api_key>`` (401
otherwise), can refuse ``response_format`` with HTTP 400 as endpoints without JSON mode do,
and answers 500 when the script is empty. :meth:`stop` and :meth:`start` take it down and
bring it back on the same port.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.servers import free_port

__all__ = ["FakeOpenAI"]

START_TIMEOUT = 30.0


class FakeOpenAI:
    """A scripted chat-completions server; ``url`` is its ``base_url`` (ending in ``/v1``)."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.requests: list[dict[str, Any]] = []
        self.reject_response_format = False
        self._script: collections.deque[str | int] = collections.deque()
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = self._make_app()

    def say(self, *replies: str | int) -> None:
        """Replace the script: the next answers, in order (an int is an HTTP error status)."""
        with self._lock:
            self._script = collections.deque(replies)
            self.requests.clear()

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
                reply: str | int = self._script.popleft() if self._script else 500
            if isinstance(reply, int):
                return _error(reply, f"scripted failure {reply}", "server_error")
            return JSONResponse({
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", ""),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })

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
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join()
        self._server = self._thread = None


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": None}},
                        status_code=status)
