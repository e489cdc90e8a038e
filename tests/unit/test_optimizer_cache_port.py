"""The optimizer's use of its cache port (no sockets).

The optimizer asks the cache through :class:`couler_optimizer.service.CacheFetch`: first a
peek at every step's key (counting nothing: it does not yet know which entries it will
use), then a counted lookup of the keys the plan uses -- the hits it reuses and the misses
it runs -- so the cache ranks its entries by the use they get. What each call carries is
checked here against :class:`FakeCachePort`, a fake of that port that records the calls;
the same plans against the real cache service, with what the cache counted, are in
``tests/integration/test_optimizer_service.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from couler import ir
from couler.optimize.cache_key import workflow_keys
from couler_optimizer.service import CacheUnavailableError, Optimizer
from couler_optimizer.store import OptimizerStore
from couler_runtime.rpc.records import CacheEntry


class FakeCachePort:
    """A fake of the optimizer's cache port (``CacheFetch``): entries from a dict; records
    every call as (peek, keys); raises :class:`CacheUnavailableError` while ``down``."""

    def __init__(self) -> None:
        self.entries: dict[str, CacheEntry] = {}
        self.calls: list[tuple[bool, tuple[str, ...]]] = []
        self.down = False

    def __call__(self, keys: Sequence[str], *, peek: bool = False
                 ) -> Mapping[str, CacheEntry]:
        self.calls.append((peek, tuple(keys)))
        if self.down:
            raise CacheUnavailableError("Lookup at fake: unavailable")
        return {k: self.entries[k] for k in keys if k in self.entries}

    def peeked(self) -> list[set[str]]:
        return [set(keys) for peek, keys in self.calls if peek]

    def counted(self) -> list[set[str]]:
        return [set(keys) for peek, keys in self.calls if not peek]


def step(name: str, *deps: str, salt: str) -> ir.Step:
    return ir.Step(
        name=name, body=ir.ContainerSpec(image="python:3.11", command=("echo", salt, name)),
        inputs=tuple(ir.InputParameter("x", ir.StepOutputRef(d, "out")) for d in deps[:1]),
        outputs=(ir.OutputParameter("out", source=ir.OutputSource.STDOUT),),
        dependencies=tuple(ir.Dependency(d) for d in deps))


def chain3() -> ir.Workflow:
    salt = uuid.uuid4().hex
    return ir.Workflow(name="chain", steps=(
        step("s0", salt=salt), step("s1", "s0", salt=salt), step("s2", "s1", salt=salt)))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[OptimizerStore]:
    s = OptimizerStore.open(f"sqlite:///{tmp_path / 'optimizer.db'}")
    yield s
    s.close()


def optimizer(store: OptimizerStore, port: FakeCachePort) -> Optimizer:
    return Optimizer(store, port, cache_address="fake:1")


def test_peeks_at_every_key_then_counts_the_keys_the_plan_uses(store: OptimizerStore
                                                               ) -> None:
    port = FakeCachePort()
    wf = chain3()
    keys = workflow_keys(wf)
    port.entries[keys["s0"]] = CacheEntry(key=keys["s0"], outputs={"out": "hello"})
    port.entries[keys["s1"]] = CacheEntry(key=keys["s1"], outputs={"out": "world"})
    plan = asyncio.run(optimizer(store, port).optimize(wf, "local"))
    assert set(plan.cached) == {"s0", "s1"}
    # every step's key was peeked at (s2's among them), before anything was counted
    assert set().union(*port.peeked()) == set(keys.values())
    assert port.calls[0][0] is True and port.calls[-1][0] is False
    # counted: the hit it reuses (s1) and the miss it runs (s2); not s0, which only s1
    # reads (reused without its artifacts)
    assert port.counted() == [{keys["s1"], keys["s2"]}]


def test_no_cache_never_calls_the_port(store: OptimizerStore) -> None:
    port = FakeCachePort()
    wf = chain3()
    port.entries = {k: CacheEntry(key=k, outputs={"out": "x"}) for k in workflow_keys(wf).values()}
    plan = asyncio.run(optimizer(store, port).optimize(wf, "local", no_cache=True))
    assert plan.cached == {} and port.calls == []


def test_parameters_reach_the_keys_asked(store: OptimizerStore) -> None:
    port = FakeCachePort()
    wf = ir.Workflow(
        name="with-param", parameters=(ir.Parameter("lr", default=ir.Literal.of("0.1")),),
        steps=(ir.Step(name="train", body=ir.ContainerSpec(
            image="python:3.11", command=("train", "{{inputs.x}}")),
            inputs=(ir.InputParameter("x", ir.WorkflowParamRef("lr")),)),))
    given, default = workflow_keys(wf, {"lr": "0.5"})["train"], workflow_keys(wf)["train"]
    assert given != default
    opt = optimizer(store, port)
    asyncio.run(opt.optimize(wf, "local", parameters={"lr": "0.5"}))
    asyncio.run(opt.optimize(wf, "local"))
    asked = {k for _, keys in port.calls for k in keys}
    assert asked == {given, default}
    assert port.calls[0][1] == (given,) and port.calls[-1][1] == (default,)


def test_a_failing_port_is_asked_once_and_the_plan_is_made_without_it(
        store: OptimizerStore) -> None:
    port = FakeCachePort()
    port.down = True
    plan = asyncio.run(optimizer(store, port).optimize(chain3(), "local"))
    assert plan.cached == {}
    assert len(port.calls) == 1 and port.calls[0][0] is True  # no count after the failure
    [prune] = [p for p in plan.passes if p.name == "prune_cached"]
    assert not prune.changed
    assert prune.notes[0].startswith("cache unavailable at fake:1: Lookup at fake")


def test_an_event_plan_asks_once_for_a_redelivered_run(store: OptimizerStore) -> None:
    port = FakeCachePort()
    wf = chain3()
    opt = optimizer(store, port)
    first = asyncio.run(opt.plan_event("run-1", wf, "local"))
    calls = len(port.calls)
    assert calls == 2  # one peek, one count
    again = asyncio.run(opt.plan_event("run-1", wf, "local"))
    assert again == first and len(port.calls) == calls  # the recorded plan; no new ask
