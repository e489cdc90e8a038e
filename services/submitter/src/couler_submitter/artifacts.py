"""Step artifacts in the shared artifact store (:mod:`couler_runtime.blobs`).

The records name an artifact by ``sha256:<hex>`` (``StoredArtifact.digest``); the store
keys blobs as ``sha256/<hex>``. A file is stored as its bytes; a directory as the
deterministic tar :func:`~couler_runtime.local.artifacts.pack_directory` writes, so its
digest is the one the local engine computes for it
(:func:`~couler_runtime.local.artifacts.digest_path`) and the cache keys of the steps that
read it agree. A download unpacks such a tar back into a directory.

:meth:`ArtifactBlobs.put_file` / :meth:`ArtifactBlobs.get_file` store and read other bytes
(uploaded workflows, answers too large to send inline) as they are.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from couler_runtime.blobs import (
    BlobStore,
    LocalBlobStore,
    S3BlobStore,
    digest_of,
    key_for_digest,
)
from couler_runtime.local.artifacts import is_packed_directory, pack_directory, unpack_directory
from couler_runtime.rpc.records import StoredArtifact

__all__ = ["ArtifactBlobs"]

_PREFIX = "sha256:"


@contextlib.contextmanager
def _scratch(beside: Path) -> Iterator[Path]:
    """A temporary directory next to ``beside`` (same file system), removed afterwards."""
    beside.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=beside.parent, prefix=f".{beside.name}.", suffix=".tmp"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class ArtifactBlobs:
    """Uploads and downloads step artifacts (implements ``service.Blobs``)."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def upload(self, path: Path) -> StoredArtifact:
        """Store the file or directory at ``path``; its digest, size and where it went."""
        if not path.is_dir():
            key = self.store.put_file(path)
            return StoredArtifact(_PREFIX + digest_of(key), path.stat().st_size, self._uri(key))
        with _scratch(path) as tmp:
            packed = tmp / "directory.tar"
            with packed.open("wb") as out:
                pack_directory(path, out)
            key = self.store.put_file(packed)  # keyed by the tar's sha256 == digest_path(path)
            return StoredArtifact(_PREFIX + digest_of(key), packed.stat().st_size,
                                  self._uri(key))

    def download(self, digest: str, dest: Path) -> None:
        """Restore the blob named ``sha256:<hex>`` (or a bare hex) at ``dest``.

        A packed directory becomes the directory ``dest``; any other blob the file ``dest``.
        Whatever was at ``dest`` is replaced.
        """
        key = key_for_digest(digest.removeprefix(_PREFIX))
        with _scratch(dest) as tmp:
            blob = tmp / "blob"
            self.store.get_to_file(key, blob)
            if is_packed_directory(blob):
                unpack_directory(blob, dest)
                return
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            os.replace(blob, dest)

    def put_file(self, path: Path) -> str:
        """Store the file's bytes as they are (no packing); their ``sha256:<hex>`` digest."""
        return _PREFIX + digest_of(self.store.put_file(path))

    def size(self, digest: str) -> int:
        """The size of blob ``sha256:<hex>`` in bytes (NotFoundError when not stored)."""
        return self.store.size(key_for_digest(digest.removeprefix(_PREFIX)))

    def get_file(self, digest: str, dest: Path) -> None:
        """Write the bytes of blob ``sha256:<hex>`` to the file ``dest`` (no unpacking),
        checked against the digest on the way."""
        self.store.get_to_file(key_for_digest(digest.removeprefix(_PREFIX)), dest)

    def _uri(self, key: str) -> str:
        if isinstance(self.store, LocalBlobStore):
            hex_digest = digest_of(key)
            return (self.store.root / "sha256" / hex_digest[:2] / hex_digest).resolve().as_uri()
        if isinstance(self.store, S3BlobStore):
            return f"s3://{self.store.bucket}/" + (f"{self.store.prefix}/{key}"
                                                   if self.store.prefix else key)
        return key
