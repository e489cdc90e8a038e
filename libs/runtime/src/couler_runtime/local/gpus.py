"""The GPUs the local engine hands out to steps, and how it finds them.

A step that requests ``n`` GPUs (``resources={"gpu": n}``) waits until ``n`` of the
machine's devices are free, runs with them as ``CUDA_VISIBLE_DEVICES`` (and
``NVIDIA_VISIBLE_DEVICES``), and gives them back when its process ends -- the way Ray
hands out ``num_gpus``. A step that requests none runs with ``CUDA_VISIBLE_DEVICES=""``
when the machine has GPUs, so it cannot take a device another step holds.

The devices, in this order of precedence:

1. ``LocalEngine(gpus=[...])``;
2. the ``COULER_LOCAL_GPUS`` setting: device indices or UUIDs separated by commas
   (``"0,1"``), or ``none``;
3. ``CUDA_VISIBLE_DEVICES`` of the engine's own process, when set;
4. the GPUs ``nvidia-smi`` lists, when it is on the PATH;
5. none.

A workflow with a step requesting more GPUs than the machine has is refused before it
starts (:class:`couler.errors.InsufficientResourcesError`, naming the step).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence

__all__ = ["GPUS_ENV", "GpuPool", "discover", "parse", "visible_env"]

GPUS_ENV = "COULER_LOCAL_GPUS"
_DEVICE = re.compile(r"^(\d+|(GPU|MIG)-[0-9A-Za-z-]+)$")


def parse(text: str, *, setting: str = GPUS_ENV) -> tuple[str, ...]:
    """``"0,1"`` (or ``"none"``, ``""``) as device ids.

    Raises:
        ValueError: An entry is neither an index nor a GPU/MIG UUID, or repeats; the
            message names ``setting``.
    """
    if text.strip().lower() in {"", "none"}:
        return ()
    devices = tuple(d.strip() for d in text.split(","))
    for d in devices:
        if not _DEVICE.match(d):
            raise ValueError(f"{setting}: {d!r} is not a GPU index or UUID "
                             "(e.g. '0,1' or 'GPU-5c3e...'; 'none' for no GPUs)")
    if len(set(devices)) != len(devices):
        raise ValueError(f"{setting}: a device is listed twice in {text!r}")
    return devices


def _nvidia_smi() -> tuple[str, ...]:
    """The indices of the GPUs ``nvidia-smi`` lists (none when it is missing or fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run([exe, "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip().isdigit())


def discover(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The machine's GPUs for the local engine (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    if GPUS_ENV in env:
        return parse(env[GPUS_ENV])
    if "CUDA_VISIBLE_DEVICES" in env:
        visible = env["CUDA_VISIBLE_DEVICES"].strip()
        # CUDA reads "-1" (or an invalid entry) as "no devices from here on"
        kept = []
        for d in (x.strip() for x in visible.split(",") if x.strip()):
            if not _DEVICE.match(d):
                break
            kept.append(d)
        return tuple(kept)
    return _nvidia_smi()


def visible_env(devices: Sequence[str]) -> dict[str, str]:
    """The environment that shows a step exactly ``devices``."""
    ids = ",".join(devices)
    return {"CUDA_VISIBLE_DEVICES": ids, "NVIDIA_VISIBLE_DEVICES": ids or "void"}


class GpuPool:
    """The free devices of one engine; steps take and give back whole devices."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = tuple(devices)
        self._free = list(self.devices)
        self._cond = threading.Condition()

    def acquire(self, n: int, stop: threading.Event, poll: float = 0.2
                ) -> tuple[str, ...] | None:
        """Take ``n`` devices, waiting until they are free (lowest ids first); None when
        ``stop`` is set first.

        Raises:
            ValueError: ``n`` is more than the pool has (checked before a run starts).
        """
        if n > len(self.devices):
            raise ValueError(f"{n} GPUs requested, {len(self.devices)} on this machine")
        with self._cond:
            while len(self._free) < n:
                if stop.is_set():
                    return None
                self._cond.wait(poll)
            if stop.is_set():
                return None
            taken = tuple(sorted(self._free, key=self.devices.index)[:n])
            for d in taken:
                self._free.remove(d)
            return taken

    def release(self, taken: Sequence[str]) -> None:
        """Give ``taken`` back."""
        with self._cond:
            self._free.extend(d for d in taken if d not in self._free)
            self._cond.notify_all()
