"""The submitter reusing cache entries against the real cache service and artifact store.

A cached step's record carries the compute its reuse saved (the entry's ``cost_seconds``),
through the run store and gRPC (issue 10, item 6). A corrupt or missing blob behind an
entry is detected when the run fetches it: the entry is dropped from the cache and the
step runs again -- its wrong output is never passed on (issue 10, bad input). Both run on
a local artifact directory and on the S3 server the suite runs (SeaweedFS), with the cache
service and the submitter sharing it, as in production; the plans come from the real
optimizer service, which finds the entries in the real cache.
"""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import minio
import pytest

from couler import ir
from couler.engines.base import StepState
from couler.optimize.cache_key import workflow_keys
from couler_runtime.blobs import LocalBlobStore, S3BlobStore
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import CacheEntry, RunState, StoredArtifact
from couler_submitter.main import SubmitterSettings
from tests.integration import test_cache_service as cache_service
from tests.integration.test_cache_service import Cache, Starter
from tests.integration.test_submitter_service import (
    RealOptimizer,
    ServiceThread,
    lines,
    make_and_use,
    optimizer_settings,
    planned,
    unique,
    wait_state,
)
from tests.servers import NatsServer, SeaweedS3
from tests.waiting import eventually

WAIT = 90.0

# The cache service's fixtures (a service on real NATS; a local or an S3 artifact store).
start = cache_service.start
artifacts = cache_service.artifacts


@dataclass
class Stack:
    """A cache service and a submitter on one artifact store, a client for both, and the
    NATS they share with the optimizer that plans their runs."""

    cache: Cache
    client: CoulerClient
    nats: NatsServer


@pytest.fixture
def stack(start: Starter, artifacts: dict[str, Any], nats_server: NatsServer,
          tmp_path: Path) -> Iterator[Stack]:
    """A cache service and a submitter on one artifact store, and an optimizer asking the
    cache; a client for the cache and the submitter."""
    cache = start(**artifacts)
    optimizer = RealOptimizer(optimizer_settings(
        nats_server, tmp_path / "optimizer", cache_address=cache.service.address)).start()
    state = tmp_path / "submitter"
    settings = SubmitterSettings.load(
        "submitter", nats_url=nats_server.url, grpc_address="127.0.0.1:0", state_dir=state,
        database_url=f"sqlite:///{state / 'runs.db'}", auth_token=None, otel_endpoint=None,
        runs_dir=str(state / "runs"), engines="local", outbox_interval=1.0, bus_insecure=True,
        cache_address=cache.service.address, **artifacts)
    service = ServiceThread(settings).start()
    try:
        with CoulerClient({"submitter": service.address, "cache": cache.service.address},
                          timeout=WAIT) as client:
            yield Stack(cache, client, nats_server)
    finally:
        service.stop()
        optimizer.stop()


def replace_blob(cache: Cache, digest: str, data: bytes | None) -> None:
    """Overwrite the blob of ``digest`` with other bytes (``data``) or delete it (None),
    behind the store's back -- what a disk or a bucket may do."""
    store = cache.blobs.store
    key = cache.blobs.key(digest)
    if isinstance(store, LocalBlobStore):
        path = store.root / "sha256" / digest[7:9] / digest[7:]
        if data is None:
            path.unlink()
        else:
            path.write_bytes(data)
        return
    assert isinstance(store, S3BlobStore)
    s3 = minio.Minio(cache.settings.s3_endpoint or "", access_key=SeaweedS3.access_key,
                     secret_key=SeaweedS3.secret_key, secure=False)
    name = f"{store.prefix}/{key}" if store.prefix else key
    if data is None:
        s3.remove_object(store.bucket, name)
    else:
        s3.put_object(store.bucket, name, io.BytesIO(data), len(data))


def workflow(marker: Path) -> ir.Workflow:
    return make_and_use(unique("reuse"), f"open({str(marker)!r}, 'a').write('make\\n')")


def cached_entry(cache: Cache, wf: ir.Workflow, cost: float) -> CacheEntry:
    """An entry for ``make`` committed to the cache: its artifact in the store."""
    blob = cache.put(b"from-cache " + uuid.uuid4().hex.encode())
    entry = CacheEntry(key=workflow_keys(wf)["make"], workflow=wf.name, step="make",
                       outputs={"said": "old"},
                       artifacts={"data": StoredArtifact(blob.digest, blob.size_bytes)},
                       cost_seconds=cost)
    assert cache.client.cache.commit(entry).created
    return cache.client.cache.show(entry.key).entry


def test_a_reused_step_records_the_compute_it_saved(
        stack: Stack, tmp_path: Path) -> None:
    cache, client = stack.cache, stack.client
    marker = tmp_path / "ran"
    wf = workflow(marker)
    entry = cached_entry(cache, wf, cost=4321.5)
    sub = client.submitter.submit(wf)
    assert planned(stack.nats, sub.run_id).cached["make"].key == entry.key
    run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
    assert run.state is RunState.SUCCEEDED, [(s.name, s.message) for s in run.steps]
    made = run.step("make")
    assert (made.state, made.cached, made.cache_saved_seconds) == \
        (StepState.CACHED, True, 4321.5)
    assert run.step("use").cache_saved_seconds == 0.0  # it ran
    assert run.step("use").outputs["seen"].startswith("from-cache ")
    assert lines(marker) == []
    # The page a status reads carries it as well (the record read back from the store).
    page = client.submitter.get_page(sub.run_id, page_size=1)
    assert [(s.name, s.cache_saved_seconds) for s in page.steps] == [("make", 4321.5)]


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_corrupt_or_missing_blob_is_dropped_and_the_step_runs_again(
        stack: Stack, tmp_path: Path, damage: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A missing blob is caught by the cache itself when the optimizer looks the entry up
    (it is dropped and reported missing: the plan reuses nothing); a corrupt one passes that
    check (the cache does not read the bytes), so the plan reuses the entry and the
    submitter catches it when it fetches the blob, drops the entry and runs the step. Either
    way the step runs again, and the cache then holds its fresh result under the key."""
    cache, client = stack.cache, stack.client
    marker = tmp_path / "ran"
    wf = workflow(marker)
    entry = cached_entry(cache, wf, cost=60.0)
    digest = entry.artifacts["data"].digest
    replace_blob(cache, digest, b"tampered bytes!" if damage == "corrupt" else None)

    sub = client.submitter.submit(wf)
    with caplog.at_level(logging.WARNING):
        plan = planned(stack.nats, sub.run_id)
        run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
    if damage == "corrupt":
        assert plan.cached["make"].key == entry.key  # offered: the cache cannot tell
    else:
        assert dict(plan.cached) == {}  # the cache dropped it at the lookup
    assert run.state is RunState.SUCCEEDED, [(s.name, s.message) for s in run.steps]
    made = run.step("make")
    # The step ran again: its own output, not the cached one, reached its reader.
    assert (made.state, made.cached, made.attempts) == (StepState.SUCCEEDED, False, 1)
    assert made.outputs == {"said": "new"} and made.cache_saved_seconds == 0.0
    assert made.cache_key == entry.key
    assert lines(marker) == ["make"]
    assert run.step("use").outputs == {"seen": "fresh new"}
    # The damaged entry was dropped, so the fresh result could take its key (a commit of a
    # key that is present keeps the first entry): the cache commits it from the step event.
    eventually(lambda: cache.client.cache.show(entry.key).entry.outputs == {"said": "new"},
               "the fresh result committed under the key", WAIT)
    fresh = cache.client.cache.show(entry.key)
    assert fresh.evicted_at is None and fresh.entry.artifacts["data"].digest != digest
    # The warning names the key: the submitter's (run and step) or the cache's own.
    messages = [r.getMessage() for r in caplog.records if entry.key in r.getMessage()]
    if damage == "corrupt":
        warned = [m for m in messages if sub.run_id in m]
        assert warned and "step 'make'" in warned[0] and "runs again" in warned[0], messages
    else:
        assert any("dropped: an artifact blob is gone" in m for m in messages), messages
