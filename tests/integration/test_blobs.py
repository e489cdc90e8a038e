"""Artifact blobs on a local directory and on a real S3 server (SeaweedFS via minio)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from couler.errors import NotFoundError, RetryableError, UserError
from couler_runtime.blobs import (
    BlobIntegrityError,
    BlobStore,
    LocalBlobStore,
    S3BlobStore,
    open_blob_store,
)
from couler_runtime.settings import CommonSettings
from tests.servers import SeaweedS3, free_port

MISSING = "sha256/" + "0" * 64


def bucket_name() -> str:
    return f"couler-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    if request.param == "local":
        yield LocalBlobStore(tmp_path / "blobs")
        return
    s3: SeaweedS3 = request.getfixturevalue("s3_server")
    bucket = S3BlobStore(s3.endpoint, s3.access_key, s3.secret_key, bucket_name(), "runs/a")
    bucket.ensure_bucket()
    yield bucket


def test_bytes_round_trip_content_addressed(store: BlobStore) -> None:
    data = b"model weights \x00\x01"
    key = store.put_bytes(data)
    assert key == "sha256/" + hashlib.sha256(data).hexdigest()
    assert store.put_bytes(data) == key  # stored once
    assert store.exists(key)
    assert store.size(key) == len(data)
    assert store.get_bytes(key) == data
    other = store.put_bytes(b"")
    assert sorted(store.keys()) == sorted([key, other])
    assert store.get_bytes(other) == b""


def test_big_file_round_trip(store: BlobStore, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    data = os.urandom(6 * 1024 * 1024 + 123)  # over minio's 5 MiB multipart threshold
    src.write_bytes(data)
    key = store.put_file(src)
    assert key == "sha256/" + hashlib.sha256(data).hexdigest()
    assert store.size(key) == len(data)
    dest = tmp_path / "out" / "nested" / "big.bin"
    store.get_to_file(key, dest)
    assert dest.read_bytes() == data
    assert os.listdir(dest.parent) == ["big.bin"]  # no temp file left behind


def test_missing_blob_is_not_found(store: BlobStore, tmp_path: Path) -> None:
    assert not store.exists(MISSING)
    with pytest.raises(NotFoundError, match=f"blob {MISSING} not found"):
        store.get_bytes(MISSING)
    with pytest.raises(NotFoundError, match=f"blob {MISSING} not found"):
        store.get_to_file(MISSING, tmp_path / "x")
    with pytest.raises(NotFoundError):
        store.size(MISSING)
    assert not (tmp_path / "x").exists()
    assert store.delete(MISSING) is False


def test_delete(store: BlobStore) -> None:
    key = store.put_bytes(b"temporary")
    assert store.delete(key) is True
    assert not store.exists(key)
    assert list(store.keys()) == []


def test_keys_are_validated(store: BlobStore) -> None:
    for bad in ("../etc/passwd", "sha256/xyz", "md5/" + "0" * 32):
        with pytest.raises(UserError, match="not a blob key"):
            store.get_bytes(bad)


def test_local_store_detects_corruption(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    key = store.put_bytes(b"original")
    hex_digest = key.removeprefix("sha256/")
    (tmp_path / "sha256" / hex_digest[:2] / hex_digest).write_bytes(b"tampered")
    with pytest.raises(BlobIntegrityError, match=f"blob {key}"):
        store.get_bytes(key)
    with pytest.raises(BlobIntegrityError):
        store.get_to_file(key, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_wrong_secret_is_a_user_error_naming_the_settings(s3_server: SeaweedS3) -> None:
    store = S3BlobStore(s3_server.endpoint, s3_server.access_key, "wrong-secret", bucket_name())
    with pytest.raises(UserError, match="COULER_S3_ACCESS_KEY and COULER_S3_SECRET_KEY"):
        store.ensure_bucket()
    with pytest.raises(UserError, match="COULER_S3_SECRET_KEY"):
        store.put_bytes(b"x")


def test_unreachable_server_is_retryable() -> None:
    store = S3BlobStore(f"127.0.0.1:{free_port()}", "k", "s", bucket_name(), retries=0)
    with pytest.raises(RetryableError, match="check COULER_S3_ENDPOINT"):
        store.ensure_bucket()


def test_bad_bucket_name_names_the_setting() -> None:
    with pytest.raises(UserError, match="COULER_ARTIFACTS: invalid bucket name 'No_Such'"):
        S3BlobStore("127.0.0.1:1", "k", "s", "No_Such")


def test_open_blob_store_from_settings(s3_server: SeaweedS3, tmp_path: Path) -> None:
    local = open_blob_store(CommonSettings.load("cache", state_dir=tmp_path))
    assert isinstance(local, LocalBlobStore)
    assert local.root == tmp_path / "artifacts"

    bucket = bucket_name()
    settings = CommonSettings.load(
        "cache", state_dir=tmp_path, artifacts=f"s3://{bucket}/cache",
        s3_endpoint=f"http://{s3_server.endpoint}", s3_access_key=s3_server.access_key,
        s3_secret_key=s3_server.secret_key)
    remote = open_blob_store(settings)  # creates the bucket
    assert isinstance(remote, S3BlobStore)
    key = remote.put_bytes(b"cached output")
    assert (remote.bucket, remote.prefix) == (bucket, "cache")
    again = S3BlobStore(s3_server.endpoint, s3_server.access_key, s3_server.secret_key, bucket,
                        "cache")
    assert again.get_bytes(key) == b"cached output"
    assert list(again.keys()) == [key]


def test_seaweedfs_listens_on_loopback_only(s3_server: SeaweedS3) -> None:
    assert s3_server.listen_addresses() == {"127.0.0.1"}
