"""Step options of the SDK (resources, retry, cache, timeouts, pull policy) mapped onto the IR."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from couler import ir
from couler.errors import UserError

__all__ = [
    "Cache",
    "ImagePullPolicy",
    "parse_duration",
    "to_cache",
    "to_image_pull_policy",
    "to_resources",
    "to_retry",
    "to_seconds",
]


class ImagePullPolicy(enum.StrEnum):
    """When the container runtime pulls a step's image."""

    IfNotPresent = "IfNotPresent"
    Always = "Always"
    Never = "Never"


@dataclass(frozen=True)
class Cache:
    """Reuse a step's result (Argo memoization): ``Cache(name, key, max_age)``.

    Args:
        name: The cache's name (Argo: the ConfigMap holding it).
        key: The key results are stored under, written by the user.
        max_age: How old a cached result may be: ``"60s"``, ``"15m"``, ``"1h"``,
            ``"1d"`` (or combinations such as ``"1h30m"``); empty for no limit.
    """

    name: str
    key: str
    max_age: str = ""


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str | int | float) -> int:
    """Seconds in a duration such as ``"90s"``, ``"1h30m"``, ``"2d"`` or a plain number.

    Raises:
        UserError: if ``text`` is not a duration.
    """
    if isinstance(text, bool):
        raise UserError(f"{text!r} is not a duration")
    if isinstance(text, (int, float)):
        return int(text)
    s = text.strip()
    if s.isdigit():
        return int(s)
    pos = 0
    total = 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise UserError(f"{text!r} is not a duration; write e.g. '60s', '15m', '1h30m' or '1d'")
    return int(total)


def to_seconds(value: int | float | str | None, *, what: str) -> int | None:
    """A timeout given as seconds or a duration string, or None."""
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except UserError as e:
        raise UserError(f"{what}: {e}") from e
    if seconds <= 0:
        raise UserError(f"{what} must be positive, got {value!r}")
    return seconds


def to_cache(cache: Cache | ir.CachePolicy | None) -> ir.CachePolicy | None:
    """The IR cache policy of a ``cache=`` option."""
    if cache is None or isinstance(cache, ir.CachePolicy):
        return cache
    if isinstance(cache, Cache):
        max_age = parse_duration(cache.max_age) if cache.max_age else None
        return ir.CachePolicy(enabled=True, key=cache.key, name=cache.name, max_age_seconds=max_age)
    raise UserError(f"cache must be couler.Cache(name, key, max_age), not {type(cache).__name__}")


def to_retry(retry: int | ir.RetryPolicy | None) -> ir.RetryPolicy | None:
    """The IR retry policy of a ``retry=`` option: an attempt count or a RetryPolicy."""
    if retry is None or isinstance(retry, ir.RetryPolicy):
        return retry
    if isinstance(retry, int) and not isinstance(retry, bool):
        return ir.RetryPolicy(limit=retry)
    raise UserError(f"retry must be an int or couler.ir.RetryPolicy, not {type(retry).__name__}")


def to_image_pull_policy(policy: ImagePullPolicy | str | None) -> str:
    """The pull policy's text; empty when not given."""
    if policy is None:
        return ""
    if isinstance(policy, ImagePullPolicy):
        return policy.value
    for p in ImagePullPolicy:
        if p.value.lower() == str(policy).lower():
            return p.value
    raise UserError(f"image_pull_policy {policy!r} is not one of "
                    f"{[p.value for p in ImagePullPolicy]}")


_GPU_DEFAULT = "nvidia.com/gpu"


def to_resources(resources: Mapping[str, object] | ir.Resources | None) -> ir.Resources | None:
    """The IR resources of a ``resources=`` option.

    ``{"cpu": "1", "memory": "1Gi", "gpu": 1}`` sets identical requests and
    limits (as the open-source SDK did); ``{"requests": {...}, "limits": {...}}``
    sets them separately. A key containing ``gpu`` is a GPU count; a key like
    ``amd.com/gpu`` also names the GPU resource.
    """
    if resources is None or isinstance(resources, ir.Resources):
        return resources
    if not isinstance(resources, Mapping):
        raise UserError(f"resources must be a dict, not {type(resources).__name__}")
    if "requests" in resources or "limits" in resources:
        extra = set(resources) - {"requests", "limits"}
        if extra:
            raise UserError(f"resources: unexpected keys {sorted(extra)} next to requests/limits")
        requests = _resource_map(resources.get("requests") or {}, "requests")
        limits = _resource_map(resources.get("limits") or {}, "limits")
    else:
        requests = limits = _resource_map(resources, "resources")
    gpu = max(requests.get("gpu", (0, ""))[0], limits.get("gpu", (0, ""))[0])
    gpu_resource = limits.get("gpu", (0, ""))[1] or requests.get("gpu", (0, ""))[1] or _GPU_DEFAULT
    return ir.Resources(
        cpu_request=str(requests.get("cpu", ("", ""))[0]),
        cpu_limit=str(limits.get("cpu", ("", ""))[0]),
        memory_request=str(requests.get("memory", ("", ""))[0]),
        memory_limit=str(limits.get("memory", ("", ""))[0]),
        gpu=int(gpu),
        gpu_resource=gpu_resource,
    )


def _resource_map(values: object, what: str) -> dict[str, tuple[str | int, str]]:
    """Normalise a resource dict to {"cpu"|"memory"|"gpu": (value, resource name)}."""
    if not isinstance(values, Mapping):
        raise UserError(f"resources {what} must be a dict, not {type(values).__name__}")
    out: dict[str, tuple[str | int, str]] = {}
    for key, value in values.items():
        k = str(key).lower()
        if "gpu" in k:
            try:
                count = int(str(value))
            except ValueError as e:
                raise UserError(f"resources {what}: GPU count {value!r} is not an integer") from e
            out["gpu"] = (count, str(key) if "/" in str(key) else _GPU_DEFAULT)
        elif k in ("cpu", "memory"):
            out[k] = (str(value), k)
        else:
            raise UserError(f"resources {what}: unsupported key {key!r}; use cpu, memory and gpu")
    return out
