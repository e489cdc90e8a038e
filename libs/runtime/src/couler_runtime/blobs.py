"""Content-addressed artifact blobs in a local directory or any S3 server (``minio`` client).

A blob's key is ``sha256/<hex digest of its bytes>``: storing the same bytes twice stores them
once, and a reader can check what it got. :func:`open_blob_store` picks the store from the
``artifacts`` setting (a directory, or ``s3://bucket/prefix``).

Errors are Couler's: :class:`~couler.errors.NotFoundError` for a missing blob,
:class:`~couler.errors.UserError` naming the setting for bad credentials or a bad bucket,
:class:`~couler.errors.RetryableError` for connection trouble and server errors. The API is
synchronous (the ``minio`` client is); asyncio services call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Protocol, TypeVar, runtime_checkable

import urllib3
from minio import Minio
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError

from couler.errors import CoulerError, NotFoundError, RetryableError, UserError
from couler_runtime.private_files import write_atomic
from couler_runtime.settings import ENV_PREFIX, CommonSettings, S3Location

__all__ = [
    "BlobIntegrityError",
    "BlobStore",
    "LocalBlobStore",
    "S3BlobStore",
    "digest_of",
    "key_for_digest",
    "open_blob_store",
    "open_payload_store",
]

_KEY = re.compile(r"sha256/([0-9a-f]{64})")
_CHUNK = 1 << 20
T = TypeVar("T")


class BlobIntegrityError(CoulerError):
    """A blob's bytes do not match its key (corruption in the store)."""


def key_for_digest(hex_digest: str) -> str:
    """The key of the blob whose sha256 is ``hex_digest``."""
    return f"sha256/{hex_digest}"


def digest_of(key: str) -> str:
    """The hex sha256 in ``key``; raises UserError if it is not a blob key."""
    m = _KEY.fullmatch(key)
    if m is None:
        raise UserError(f"not a blob key: {key!r} (expected 'sha256/<64 hex digits>')")
    return m.group(1)


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class _Reader(Protocol):
    def read(self, amt: int, /) -> bytes: ...


def _copy_verified(src: _Reader, dest: Path, expected: str, key: str) -> None:
    """Stream ``src`` into ``dest`` atomically, checking the sha256 on the way."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != expected:
            raise BlobIntegrityError(f"blob {key}: content hashes to sha256 {h.hexdigest()}")
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed blob storage; every key is ``sha256/<hex>``."""

    def put_file(self, path: str | os.PathLike[str]) -> str:
        """Store a file's bytes; returns its key."""
        ...

    def put_bytes(self, data: bytes) -> str:
        """Store ``data``; returns its key."""
        ...

    def get_to_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Write the blob to ``path`` atomically (verified against the key)."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """The blob's bytes (verified against the key)."""
        ...

    def exists(self, key: str) -> bool:
        """Whether the blob is stored."""
        ...

    def size(self, key: str) -> int:
        """The blob's size in bytes."""
        ...

    def delete(self, key: str) -> bool:
        """Remove the blob; False if it was not there."""
        ...

    def keys(self) -> Iterator[str]:
        """Every stored key."""
        ...


class LocalBlobStore:
    """Blobs as files under ``root/sha256/<hex[:2]>/<hex>``, written via temp file + rename."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalBlobStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        hex_digest = digest_of(key)
        return self.root / "sha256" / hex_digest[:2] / hex_digest

    def put_file(self, path: str | os.PathLike[str]) -> str:
        src = Path(path)
        key = key_for_digest(_hash_file(src))
        dest = self._path(key)
        if not dest.exists():
            with src.open("rb") as f:
                _copy_verified(f, dest, digest_of(key), key)  # src may change meanwhile
        return key

    def put_bytes(self, data: bytes) -> str:
        key = key_for_digest(hashlib.sha256(data).hexdigest())
        dest = self._path(key)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dest, data)
        return key

    def _open(self, key: str) -> IO[bytes]:
        try:
            return self._path(key).open("rb")
        except FileNotFoundError:
            raise NotFoundError(f"blob {key} not found in {self.root}") from None

    def get_to_file(self, key: str, path: str | os.PathLike[str]) -> None:
        with self._open(key) as f:
            _copy_verified(f, Path(path), digest_of(key), key)

    def get_bytes(self, key: str) -> bytes:
        with self._open(key) as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != digest_of(key):
            raise BlobIntegrityError(f"blob {key} in {self.root}: content does not match")
        return data

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise NotFoundError(f"blob {key} not found in {self.root}") from None

    def delete(self, key: str) -> bool:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def keys(self) -> Iterator[str]:
        for path in sorted((self.root / "sha256").glob("??/*")):
            if _KEY.fullmatch(f"sha256/{path.name}") and path.is_file():
                yield key_for_digest(path.name)


_AUTH_CODES = frozenset({"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied",
                         "InvalidToken", "ExpiredToken"})
_BUCKET_CODES = frozenset({"NoSuchBucket", "InvalidBucketName", "AllAccessDisabled"})


class S3BlobStore:
    """Blobs as objects ``<prefix>/sha256/<hex>`` in an S3 bucket, through ``minio``.

    Construction does no I/O; :meth:`ensure_bucket` checks the credentials and creates the
    bucket if it is missing (:func:`open_blob_store` calls it). Multipart uploads of big files
    are handled by ``minio``.

    Args:
        endpoint: ``host:port`` or ``http(s)://host:port``.
        access_key: The access key.
        secret_key: The secret key.
        bucket: The bucket.
        prefix: A key prefix inside the bucket.
        region: The region (asked from the server when None).
        retries: Attempts on connection errors and 5xx answers (urllib3, with back-off).
        timeout: Connect timeout in seconds (reads wait up to 10x longer).
    """

    def __init__(self, endpoint: str, access_key: str, secret_key: str, bucket: str,
                 prefix: str = "", *, region: str | None = None, retries: int = 2,
                 timeout: float = 5.0) -> None:
        secure = endpoint.startswith("https://")
        host = endpoint.split("://", 1)[-1].rstrip("/")
        try:
            S3Location.parse(f"s3://{bucket}")
        except ValueError as e:
            raise UserError(f"{ENV_PREFIX}ARTIFACTS: {e}") from None
        self.endpoint = host
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=timeout, read=timeout * 10),
            retries=urllib3.Retry(total=retries, backoff_factor=0.2,
                                  status_forcelist=(500, 502, 503, 504)),
        )
        self._client = Minio(host, access_key=access_key, secret_key=secret_key,
                             secure=secure, region=region, http_client=http)

    def __repr__(self) -> str:
        return f"S3BlobStore(endpoint={self.endpoint!r}, bucket={self.bucket!r}, " \
               f"prefix={self.prefix!r})"

    def _where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/") + f" at {self.endpoint}"

    def _object(self, key: str) -> str:
        digest_of(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn: Callable[[], T], key: str | None = None) -> T:
        """Run one minio call, translating its errors."""
        try:
            return fn()
        except S3Error as e:
            if e.code in ("NoSuchKey", "NoSuchObject", "NotFound") and key is not None:
                raise NotFoundError(f"blob {key} not found in {self._where()}") from None
            if e.code in _AUTH_CODES:
                raise UserError(
                    f"{what} in {self._where()}: {e.code}: check {ENV_PREFIX}S3_ACCESS_KEY and "
                    f"{ENV_PREFIX}S3_SECRET_KEY") from None
            if e.code in _BUCKET_CODES:
                raise UserError(f"{what} in {self._where()}: {e.code}: check "
                                f"{ENV_PREFIX}ARTIFACTS") from None
            raise RetryableError(f"{what} in {self._where()}: {e.code}: {e.message}") from e
        except ServerError as e:
            if e.status_code == 403:  # HEAD answers carry no error code
                raise UserError(
                    f"{what} in {self._where()}: access denied: check {ENV_PREFIX}S3_ACCESS_KEY"
                    f" and {ENV_PREFIX}S3_SECRET_KEY") from None
            raise RetryableError(f"{what} in {self._where()}: server error {e.status_code}") \
                from e
        except (urllib3.exceptions.HTTPError, OSError, InvalidResponseError) as e:
            raise RetryableError(f"{what} in {self._where()}: {type(e).__name__}: {e} "
                                 f"(check {ENV_PREFIX}S3_ENDPOINT)") from e
        except ValueError as e:  # minio validates names client-side
            raise UserError(f"{what} in {self._where()}: {e} (check {ENV_PREFIX}ARTIFACTS)") \
                from None
        except MinioException as e:
            raise RetryableError(f"{what} in {self._where()}: {e}") from e

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (also checks the credentials)."""
        if not self._call("checking the bucket", lambda: self._client.bucket_exists(self.bucket)):
            with contextlib.suppress(UserError):  # a concurrent creator won the race
                self._call("creating the bucket", lambda: self._client.make_bucket(self.bucket))
            if not self._call("checking the bucket",
                              lambda: self._client.bucket_exists(self.bucket)):
                raise UserError(f"bucket of {self._where()} cannot be created: check "
                                f"{ENV_PREFIX}ARTIFACTS")

    def put_file(self, path: str | os.PathLike[str]) -> str:
        src = Path(path)
        key = key_for_digest(_hash_file(src))
        if not self.exists(key):
            self._call("uploading", lambda: self._client.fput_object(
                self.bucket, self._object(key), str(src),
                content_type="application/octet-stream"), key)
        return key

    def put_bytes(self, data: bytes) -> str:
        key = key_for_digest(hashlib.sha256(data).hexdigest())
        if not self.exists(key):
            self._call("uploading", lambda: self._client.put_object(
                self.bucket, self._object(key), io.BytesIO(data), len(data),
                content_type="application/octet-stream"), key)
        return key

    def get_to_file(self, key: str, path: str | os.PathLike[str]) -> None:
        resp = self._call("downloading", lambda: self._client.get_object(
            self.bucket, self._object(key)), key)
        try:
            self._call("downloading",
                       lambda: _copy_verified(resp, Path(path), digest_of(key), key), key)
        finally:
            resp.close()
            resp.release_conn()

    def get_bytes(self, key: str) -> bytes:
        resp = self._call("downloading", lambda: self._client.get_object(
            self.bucket, self._object(key)), key)
        try:
            data = self._call("downloading", resp.read, key)
        finally:
            resp.close()
            resp.release_conn()
        if hashlib.sha256(data).hexdigest() != digest_of(key):
            raise BlobIntegrityError(f"blob {key} in {self._where()}: content does not match")
        return data

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except NotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        stat = self._call("reading the size",
                          lambda: self._client.stat_object(self.bucket, self._object(key)), key)
        return int(stat.size or 0)

    def delete(self, key: str) -> bool:
        if not self.exists(key):
            return False
        self._call("deleting", lambda: self._client.remove_object(
            self.bucket, self._object(key)), key)
        return True

    def keys(self) -> Iterator[str]:
        prefix = f"{self.prefix}/sha256/" if self.prefix else "sha256/"
        objects = self._call("listing", lambda: self._client.list_objects(
            self.bucket, prefix=prefix, recursive=True))
        it = iter(objects)
        while True:
            obj = self._call("listing", lambda: next(it, None))
            if obj is None:
                return
            name = (obj.object_name or "").removeprefix(f"{self.prefix}/" if self.prefix else "")
            if _KEY.fullmatch(name):
                yield name


def open_blob_store(settings: CommonSettings) -> LocalBlobStore | S3BlobStore:
    """The store the ``artifacts`` setting names, ready to use (an S3 bucket is created).

    Raises:
        UserError: Bad credentials or bucket, naming the setting.
        RetryableError: The S3 server is unreachable.
    """
    location = settings.s3_location
    if location is None:
        return LocalBlobStore(settings.artifacts)
    if not (settings.s3_endpoint and settings.s3_access_key and settings.s3_secret_key):
        raise UserError(f"{ENV_PREFIX}S3_ENDPOINT, {ENV_PREFIX}S3_ACCESS_KEY and "
                        f"{ENV_PREFIX}S3_SECRET_KEY are required for {settings.artifacts!r}")
    store = S3BlobStore(settings.s3_endpoint, settings.s3_access_key.get_secret_value(),
                        settings.s3_secret_key.get_secret_value(), location.bucket,
                        location.prefix)
    store.ensure_bucket()
    return store


PAYLOADS_PREFIX = "payloads"


def open_payload_store(settings: CommonSettings) -> LocalBlobStore | S3BlobStore:
    """Where bus messages too large to travel inline are kept: ``payloads/`` in the
    artifact store (a directory of its own, so the cache's eviction never touches them).

    Raises:
        UserError: Bad credentials or bucket, naming the setting.
        RetryableError: The S3 server is unreachable.
    """
    location = settings.s3_location
    if location is None:
        return LocalBlobStore(Path(settings.artifacts) / PAYLOADS_PREFIX)
    if not (settings.s3_endpoint and settings.s3_access_key and settings.s3_secret_key):
        raise UserError(f"{ENV_PREFIX}S3_ENDPOINT, {ENV_PREFIX}S3_ACCESS_KEY and "
                        f"{ENV_PREFIX}S3_SECRET_KEY are required for {settings.artifacts!r}")
    prefix = f"{location.prefix}/{PAYLOADS_PREFIX}" if location.prefix else PAYLOADS_PREFIX
    store = S3BlobStore(settings.s3_endpoint, settings.s3_access_key.get_secret_value(),
                        settings.s3_secret_key.get_secret_value(), location.bucket, prefix)
    store.ensure_bucket()
    return store
