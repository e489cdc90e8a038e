"""The cache, as the optimizer asks it: ``couler.v1.CacheService.Lookup`` over gRPC.

:class:`CacheLookup` is the blocking :data:`~couler_optimizer.service.CacheFetch` the pass
pipeline calls from its worker thread. Any failure of the call (the cache is down, the
deadline passed, the token was refused, an error inside the cache) raises
:class:`~couler_optimizer.service.CacheUnavailableError`; the optimizer then makes the plan
without the cache and says so in the ``prune_cached`` report, rather than failing the run.
Keys are asked :data:`LOOKUP_PAGE` at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from couler.errors import CoulerError
from couler_optimizer.service import CacheUnavailableError
from couler_runtime.client import CoulerClient
from couler_runtime.rpc.records import CacheEntry

__all__ = ["LOOKUP_PAGE", "CacheLookup"]

#: Keys asked per Lookup call (a 64-character key: about 70 KiB per request).
LOOKUP_PAGE = 1000


class CacheLookup:
    """Looks keys up in the cache service at ``address``.

    The channel is opened on first use and reused (gRPC channels are thread-safe and
    reconnect by themselves after the cache restarts).

    Args:
        address: The cache's ``host:port``.
        token: The bearer token the services require, if any.
        timeout: Seconds one Lookup may take.
    """

    def __init__(self, address: str, *, token: str | None = None, timeout: float = 5.0) -> None:
        self.address = address
        self._client = CoulerClient({"cache": address}, token=token, timeout=timeout)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CacheLookup(address={self.address!r})"

    def __call__(self, keys: Sequence[str], *, peek: bool = False
                 ) -> Mapping[str, CacheEntry]:
        """The entries found for ``keys``, by key (``peek``: count no hit or miss).

        Raises:
            CacheUnavailableError: The cache could not answer.
        """
        if not keys:
            return {}
        found: dict[str, CacheEntry] = {}
        try:
            with self._lock:  # the client creates its channel lazily
                cache = self._client.cache
            # A page of keys per call: no message grows with the workflow.
            for at in range(0, len(keys), LOOKUP_PAGE):
                found.update(cache.lookup(keys[at:at + LOOKUP_PAGE], peek=peek).entries)
        except CoulerError as exc:
            raise CacheUnavailableError(
                f"Lookup at {self.address}: {type(exc).__name__}: {exc}") from exc
        return found

    def close(self) -> None:
        """Close the channel."""
        self._client.close()
