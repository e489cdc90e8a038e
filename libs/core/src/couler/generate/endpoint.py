"""What the two LLM clients share: how they wait on 429 and how they read an answer.

Both clients (the command line's ``couler.generate_cli.chat_client`` and the generator
service's ``ChatModel``) read the answer with :func:`completion_text`, which never raises:
whatever JSON the endpoint sent, a text or "" (one more draft for the repair loop).

On 429 Too Many Requests the endpoint did no work, so asking again is safe; the wait is
its ``Retry-After`` (seconds or an HTTP date), else the back-off 1, 2, 4... s. Both clients
ask :data:`RATE_LIMIT_ATTEMPTS` times in all and do not wait beyond :data:`RATE_LIMIT_MAX_WAIT`
inside one request (the error says how long the endpoint asked; the caller's own back-off
decides).
"""

from __future__ import annotations

import email.utils

__all__ = ["RATE_LIMIT_ATTEMPTS", "RATE_LIMIT_MAX_WAIT", "completion_text", "rate_limit_wait"]

RATE_LIMIT_ATTEMPTS = 3  # tries in all, the first included
RATE_LIMIT_MAX_WAIT = 30.0  # a longer Retry-After is not waited on inside one request


def rate_limit_wait(retry_after: str | None, failures: int, *, now: float | None = None,
                    max_wait: float = RATE_LIMIT_MAX_WAIT) -> float:
    """Seconds to wait after the ``failures``-th 429 in a row (1-based): the ``Retry-After``
    header's seconds or HTTP date (against ``now``, seconds since the epoch), else the
    back-off 1, 2, 4... s (at most ``max_wait``). The caller refuses a wait beyond
    ``max_wait``."""
    value = (retry_after or "").strip()
    if value:
        try:
            return max(float(value), 0.0)
        except ValueError:
            pass
        try:
            when: float | None = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError):
            when = None
        if when is not None and now is not None:
            return max(when - now, 0.0)
    return float(min(2.0 ** max(failures - 1, 0), max_wait))


def completion_text(answer: object) -> str:
    """The assistant's text in a chat-completion answer read as plain JSON; "" when it is
    not one (read defensively: whatever the endpoint sent, no exception)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""
