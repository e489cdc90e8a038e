"""Step artifacts in the shared artifact store (:mod:`couler_runtime.blobs`).

The records name an artifact by ``sha256:<hex>`` (``StoredArtifact.digest``); the store
keys blobs as ``sha256/<hex>``. Only files are stored: a directory artifact is reported
as not storable, which makes the step not cacheable rather than cached incompletely.
"""

from __future__ import annotations

from pathlib import Path

from couler.errors import UserError
from couler_runtime.blobs import (
    BlobStore,
    LocalBlobStore,
    S3BlobStore,
    digest_of,
    key_for_digest,
)
from couler_runtime.rpc.records import StoredArtifact

__all__ = ["ArtifactBlobs"]

_PREFIX = "sha256:"


class ArtifactBlobs:
    """Uploads and downloads step artifacts (implements ``service.Blobs``)."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def upload(self, path: Path) -> StoredArtifact:
        """Store the file at ``path``; its digest, size and where it went."""
        if not path.is_file():
            raise UserError(f"artifact {path.name!r} is a directory; only files are stored")
        key = self.store.put_file(path)
        return StoredArtifact(_PREFIX + digest_of(key), path.stat().st_size, self._uri(key))

    def download(self, digest: str, dest: Path) -> None:
        """Write the blob named ``sha256:<hex>`` (or a bare hex) to ``dest``."""
        self.store.get_to_file(key_for_digest(digest.removeprefix(_PREFIX)), dest)

    def _uri(self, key: str) -> str:
        if isinstance(self.store, LocalBlobStore):
            hex_digest = digest_of(key)
            return (self.store.root / "sha256" / hex_digest[:2] / hex_digest).resolve().as_uri()
        if isinstance(self.store, S3BlobStore):
            return f"s3://{self.store.bucket}/" + (f"{self.store.prefix}/{key}"
                                                   if self.store.prefix else key)
        return key
