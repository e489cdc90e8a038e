"""The generator service's composition root: settings, LLM client, gRPC servicer, consumer.

The generator is stateless: no store. Every request carries all it needs, the catalog is
code (``couler.generate.library``), and a redelivered request is simply planned again;
its answer's deterministic Nats-Msg-Id makes the republish a no-op.

Settings (environment, ``COULER_`` prefix): the common ones (:class:`CommonSettings`)
plus the optional LLM endpoint. Without ``COULER_LLM_BASE_URL`` the offline planner
serves requests; with it, ``COULER_LLM_MODEL`` is required; ``COULER_LLM_API_KEY`` is a
secret and never appears in ``repr``, ``str`` or logs. An empty variable counts as unset
(compose files pass ``${COULER_LLM_BASE_URL:-}``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Self
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from couler_generator.events import start_consumer
from couler_generator.rpc import GeneratorService
from couler_generator.service import ChatModel, Generator
from couler_runtime.bus import Bus
from couler_runtime.rpc import GENERATOR
from couler_runtime.service import Component, service_main
from couler_runtime.settings import ENV_PREFIX, CommonSettings, redact_url

__all__ = ["GeneratorSettings", "build", "main"]

log = logging.getLogger(__name__)


class GeneratorSettings(CommonSettings):
    """Settings of the generator service.

    Attributes:
        llm_base_url: An OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:8000/v1``;
            unset means the offline planner.
        llm_model: The chat model to ask (required with ``llm_base_url``).
        llm_api_key: The endpoint's API key (secret); unset for endpoints that need none.
        llm_max_rounds: Generate-validate-repair rounds before the generator refuses.
        llm_timeout: Seconds one chat completion may take.
    """

    llm_base_url: str | None = None
    llm_model: str = ""
    llm_api_key: SecretStr | None = None
    llm_max_rounds: int = Field(default=3, ge=1, le=10)
    llm_timeout: float = Field(default=60.0, gt=0)

    @field_validator("llm_base_url", mode="before")
    @classmethod
    def _base_url(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, str):
            parts = urlsplit(value.strip())
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"must be an http(s):// URL (got {redact_url(value)!r})")
            _ = parts.port  # raises ValueError on a bad port
            return value.strip()
        return value

    @field_validator("llm_api_key", mode="before")
    @classmethod
    def _api_key(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value else value

    @model_validator(mode="after")
    def _model_needed(self) -> Self:
        if self.llm_base_url is not None and not self.llm_model.strip():
            raise ValueError(f"{ENV_PREFIX}LLM_MODEL: required when {ENV_PREFIX}LLM_BASE_URL "
                             f"is set ({redact_url(self.llm_base_url)!r})")
        return self

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name == "llm_base_url" and isinstance(value, str):
                yield name, redact_url(value)
            else:
                yield name, value


async def build(settings: GeneratorSettings, bus: Bus) -> Component:
    """Wire the generator: the LLM client (when configured), the servicer, the consumer."""
    llm = None
    if settings.llm_base_url is not None:
        llm = ChatModel(settings.llm_base_url, settings.llm_model,
                        api_key=settings.llm_api_key, timeout=settings.llm_timeout)
    generator = Generator(llm, max_rounds=settings.llm_max_rounds)
    log.info("planning with %r", generator)  # the endpoint and model; never the key
    try:
        await start_consumer(bus, generator)
    except BaseException:
        if llm is not None:
            llm.close()
        raise

    async def close() -> None:
        # Runs after the bus stopped its consumers, so no handler still uses the client.
        if llm is not None:
            llm.close()

    return Component({GENERATOR: GeneratorService(generator)}, close)


def main() -> int:
    """The ``couler-generator`` console script."""
    return service_main("generator", GeneratorSettings, build)


if __name__ == "__main__":
    sys.exit(main())
