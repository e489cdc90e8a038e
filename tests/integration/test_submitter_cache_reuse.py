"""The submitter reusing cache entries against the real cache service and artifact store.

A cached step's record carries the compute its reuse saved (the entry's ``cost_seconds``),
through the run store and gRPC (issue 10, item 6). A corrupt or missing blob behind an
entry is detected when the run fetches it: the entry is dropped from the cache and the
step runs again -- its wrong output is never passed on (issue 10, bad input). Both run on
a local artifact directory and on the S3 server the suite runs (SeaweedFS), with the cache
service and the submitter sharing it, as in production.
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
from couler_runtime.blobs import LocalBlobStore, S3BlobStore
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import CacheEntry, RunState, StoredArtifact
from couler_submitter.main import SubmitterSettings
from tests.integration import test_cache_service as cache_service
from tests.integration.test_cache_service import Cache, Starter
from tests.integration.test_submitter_service import (
    ServiceThread,
    lines,
    make_and_use,
    optimize,
    unique,
    wait_state,
)
from tests.servers import NatsServer, SeaweedS3

WAIT = 90.0

# The cache service's fixtures (a service on real NATS; a local or an S3 artifact store).
start = cache_service.start
artifacts = cache_service.artifacts


@dataclass
class Stack:
    """A cache service and a submitter on one artifact store, a client for both, and the
    NATS they share (the tests play the optimizer on it)."""

    cache: Cache
    client: CoulerClient
    nats: NatsServer


@pytest.fixture
def stack(start: Starter, artifacts: dict[str, Any], nats_server: NatsServer,
          tmp_path: Path) -> Iterator[Stack]:
    """A cache service and a submitter on one artifact store; a client for both."""
    cache = start(**artifacts)
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
    entry = CacheEntry(key=uuid.uuid4().hex * 2, workflow=wf.name, step="make",
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
    optimize(stack.nats, sub.run_id, wf, cached={"make": entry})
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
    cache, client = stack.cache, stack.client
    marker = tmp_path / "ran"
    wf = workflow(marker)
    entry = cached_entry(cache, wf, cost=60.0)
    digest = entry.artifacts["data"].digest
    replace_blob(cache, digest, b"tampered bytes!" if damage == "corrupt" else None)

    sub = client.submitter.submit(wf)
    with caplog.at_level(logging.WARNING, logger="couler_submitter.service"):
        optimize(stack.nats, sub.run_id, wf, cached={"make": entry})
        run = wait_state(client, sub.run_id, RunState.SUCCEEDED, RunState.FAILED)
    assert run.state is RunState.SUCCEEDED, [(s.name, s.message) for s in run.steps]
    made = run.step("make")
    # The step ran again: its own output, not the cached one, reached its reader.
    assert (made.state, made.cached, made.attempts) == (StepState.SUCCEEDED, False, 1)
    assert made.outputs == {"said": "new"} and made.cache_saved_seconds == 0.0
    assert lines(marker) == ["make"]
    assert run.step("use").outputs == {"seen": "fresh new"}
    # The entry is gone from the cache (only its metadata is kept, marked evicted), and
    # the warning names the run, step and key.
    assert cache.client.cache.show(entry.key).evicted_at is not None
    warned = [r.getMessage() for r in caplog.records
              if entry.key in r.getMessage() and sub.run_id in r.getMessage()]
    assert warned and "step 'make'" in warned[0] and "runs again" in warned[0], \
        [r.getMessage() for r in caplog.records]

