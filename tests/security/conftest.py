"""The attack suite's stack: the real embedded stack (``couler up``), attacked from outside.

One stack per module (``stack``), started as users start it, with its authenticated bus.
Helpers connect to its NATS as an anonymous client, as any identity whose seed an attacker
may have stolen (``as_identity``), or as a stranger with a key of its own, and read what
the stack's streams hold through the admin identity.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from couler_runtime import stack
from couler_runtime.bus import Bus
from couler_runtime.bus_keys import BusFiles
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import Run
from tests.e2e.conftest import leftovers
from tests.waiting import nkey_client

DEADLINE = 90.0


@dataclass
class Stack:
    """The running stack, its bus credentials and a client."""

    home: Path
    info: stack.StackInfo
    client: CoulerClient
    files: BusFiles = field(init=False)

    def __post_init__(self) -> None:
        self.files = BusFiles(self.home / "bus")

    @property
    def nats_url(self) -> str:
        return self.info.nats_url

    async def bus(self, identity: str, **kw: Any) -> Bus:
        """A bus connected (and signing) as ``identity``, as a thief of its seed would."""
        return await Bus.connect(self.nats_url, name=f"thief-{identity}",
                                 identity=self.files.identity(identity),
                                 trust=self.files.trust(), tls=self.files.client_tls(),
                                 connect_timeout=10, **kw)

    async def raw(self, identity: str, errors: list[str]) -> Any:
        """A plain nats-py client with ``identity``'s seed, collecting async errors."""
        return await nkey_client(self.nats_url, self.files.seed_file(identity), identity,
                                 errors, tls=self.files.client_tls())

    @contextlib.asynccontextmanager
    async def admin(self) -> AsyncIterator[Bus]:
        bus = await self.bus("admin", deadletters=False)
        try:
            yield bus
        finally:
            await bus.close()

    async def stream_counts(self) -> dict[str, int]:
        async with self.admin() as bus:
            return {s.config.name or "": s.state.messages
                    for s in await bus.jetstream.streams_info()}

    async def stored(self, subject: str) -> list[Any]:
        """Every message the streams hold on ``subject`` (raw nats messages)."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        async with self.admin() as bus:
            sub = await bus.jetstream.pull_subscribe(subject, config=ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE))
            pending = (await sub.consumer_info()).num_pending or 0
            found: list[Any] = []
            while len(found) < pending:
                found += await sub.fetch(min(256, pending - len(found)), timeout=DEADLINE)
            await sub.unsubscribe()
            return found

    def wait_run(self, run_id: str, deadline: float = DEADLINE) -> Run:
        end = time.monotonic() + deadline
        while True:
            run = self.client.submitter.get(run_id)
            if run.state.terminal or time.monotonic() > end:
                return run
            time.sleep(0.2)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("couler-attacked")
    info = stack.up(home, token=secrets.token_urlsafe(16))
    s = Stack(home, info, CoulerClient(info.addresses, token=info.token))
    try:
        yield s
    finally:
        s.client.close()
        latest = stack._read(home / "stack.json")
        pids = list(latest.pids.values()) if latest else list(info.pids.values())
        if latest is not None:
            stack.down(home)
        assert leftovers(home, pids) == []
