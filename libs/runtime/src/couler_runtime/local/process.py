"""Run one command as a subprocess, sample its process tree, enforce limits.

The process starts in its own session (process group) so that a timeout, a
memory-limit kill or a cancellation kills the whole tree. On Linux it also gets
SIGKILL when the thread that started it dies (``PR_SET_PDEATHSIG``): a crashed
engine process leaves no step running unobserved, and a resumed run runs the
interrupted step again as a new attempt instead of losing a result it never saw. Every
``SAMPLE_SECONDS`` the tree's CPU (in cores) and resident memory are sampled
with psutil; the peaks are returned with the exit code.

The death signal is set by ``setpriv --pdeathsig KILL`` (util-linux), which then execs the
command, or by a small Python shim where ``setpriv`` is missing -- never by a
``preexec_fn``: that forces ``fork()`` instead of ``vfork()``, and a fork of a process
running gRPC threads (every service) runs gRPC's fork handlers in the child, which abort
it now and then (``Check failed: next_worker->state == KICKED``, exit -6, measured at about
one spawn in ten under load).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]

__all__ = ["SAMPLE_SECONDS", "ProcessResult", "run_process"]

SAMPLE_SECONDS = 0.05
FIRST_SAMPLE_SECONDS = 0.004  # doubled up to SAMPLE_SECONDS

_PR_SET_PDEATHSIG = 1

# Sets the death signal, then becomes the command (the same process: the signal stays set).
_SHIM = ("import ctypes, os, signal, sys\n"
         "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
         "os.execvp(sys.argv[1], sys.argv[1:])\n")


def _death_prefix() -> list[str]:
    """What to put before a command so it gets SIGKILL when its parent dies (Linux)."""
    if os.uname().sysname != "Linux":
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        probe = subprocess.run([setpriv, "--pdeathsig", "KILL", "--", "true"],
                               capture_output=True, check=False)
        if probe.returncode == 0:
            return [setpriv, "--pdeathsig", "KILL", "--"]
    return [sys.executable, "-c", _SHIM]


_PREFIX: list[str] | None = None


def _prefix() -> list[str]:
    global _PREFIX  # noqa: PLW0603 -- probed once per process, on first use
    if _PREFIX is None:
        _PREFIX = _death_prefix()
    return _PREFIX


def _missing(program: str, cwd: Path, env: Mapping[str, str]) -> str:
    """Why ``program`` cannot be executed ("" when it can), as exec would say it."""
    if "/" in program:
        path = Path(program) if program.startswith("/") else cwd / program
        if not path.exists():
            return f"{program!r}: [Errno 2] No such file or directory: {program!r}"
        if not os.access(path, os.X_OK) or path.is_dir():
            return f"{program!r}: [Errno 13] Permission denied: {program!r}"
        return ""
    if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        return f"{program!r}: [Errno 2] No such file or directory: {program!r}"
    return ""


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """What happened to one process.

    Attributes:
        exit_code: The exit code; negative for a signal (-9 for SIGKILL); None
            when the process could not be started.
        started: False when the process could not be started at all.
        timed_out: The process was killed because it exceeded its timeout.
        oom_killed: The process tree was killed for exceeding its memory limit.
        cancelled: The process was killed because the run was cancelled.
        peak_cpu: Peak CPU use of the tree, in cores.
        peak_memory_bytes: Peak resident memory of the tree, in bytes.
        error: Why the process could not start, if it did not.
    """

    exit_code: int | None
    started: bool = True
    timed_out: bool = False
    oom_killed: bool = False
    cancelled: bool = False
    peak_cpu: float = 0.0
    peak_memory_bytes: int = 0
    error: str = ""


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        children = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in children:  # processes that left the group
        with contextlib.suppress(psutil.Error):
            child.kill()


class _Sampler:
    """Peak CPU and resident memory over a process tree.

    Memory is each process's high-water mark (``VmHWM`` in ``/proc/PID/status``, so a peak
    between two samples is not missed), summed over the tree; the current RSS (what a
    memory limit is checked against) is returned by :meth:`sample`. The root is not
    counted until it has exec'd ``argv``: before that it is a fork of this (large)
    process, whose pages would be taken for the step's. A process that ends before it is
    sampled once has no peak (0): unknown, never a guess.
    """

    def __init__(self, pid: int, argv: Sequence[str]) -> None:
        self.pid = pid
        self.argv = list(argv)
        self.procs: dict[int, object] = {}
        self.hwm: dict[int, int] = {}
        self.execed = False
        self.peak_cpu = 0.0
        self.peak_rss = 0

    def sample(self) -> int:
        try:
            root = psutil.Process(self.pid)
            if not self.execed:
                self.execed = root.cmdline() == self.argv
                if not self.execed:
                    return 0
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        rss, cpu = 0, 0.0
        for proc in tree:
            pid = int(proc.pid)
            cached = self.procs.setdefault(pid, proc)
            try:
                now = int(cached.memory_info().rss)  # type: ignore[attr-defined]
                cpu += float(cached.cpu_percent(None)) / 100.0  # type: ignore[attr-defined]
            except psutil.Error:
                continue
            rss += now
            self.hwm[pid] = max(self.hwm.get(pid, 0), now, _high_water_mark(pid))
        self.peak_rss = max(self.peak_rss, rss, sum(self.hwm.values()))
        self.peak_cpu = max(self.peak_cpu, cpu)
        return rss


def _high_water_mark(pid: int) -> int:
    """The peak resident memory of ``pid`` since its exec, in bytes (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdout_path: Path,
    stderr_path: Path,
    timeout_seconds: float | None = None,
    memory_limit_bytes: int | None = None,
    cancel: threading.Event | None = None,
) -> ProcessResult:
    """Run ``argv`` to completion, sampling it and enforcing the limits.

    Args:
        argv: The command line.
        cwd: Working directory.
        env: The complete environment.
        stdout_path: File receiving standard output.
        stderr_path: File receiving standard error.
        timeout_seconds: Kill the tree after this long.
        memory_limit_bytes: Kill the tree when its sampled RSS exceeds this.
        cancel: Kill the tree as soon as this event is set.

    Returns:
        The exit code, the peaks, and why the process was killed, if it was.
    """
    # Checked here: behind the death-signal prefix a missing program would be an exit code.
    problem = _missing(argv[0], cwd, env) if argv else "an empty command"
    if problem:
        return ProcessResult(exit_code=None, started=False, error=problem)
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        try:
            proc = subprocess.Popen(
                [*_prefix(), *argv], cwd=cwd, env=dict(env), stdout=out, stderr=err,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        except OSError as exc:
            return ProcessResult(exit_code=None, started=False, error=f"{argv[0]!r}: {exc}")
        sampler = _Sampler(proc.pid, argv)
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        timed_out = oom = cancelled = False
        interval = FIRST_SAMPLE_SECONDS
        while True:
            rss = sampler.sample()
            code = proc.poll()
            if code is not None:
                break
            if cancel is not None and cancel.is_set():
                cancelled = True
            elif deadline is not None and time.monotonic() >= deadline:
                timed_out = True
            elif memory_limit_bytes is not None and rss > memory_limit_bytes:
                oom = True
            if cancelled or timed_out or oom:
                _kill_tree(proc)
                code = proc.wait()
                break
            # Wait on the process itself: a step that ends early returns at once instead
            # of after a whole sampling interval (cancellation is checked every interval).
            # The first intervals are short, so that a step of a few tens of milliseconds
            # is still sampled once after its exec.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=interval)
            interval = min(interval * 2, SAMPLE_SECONDS)
        _kill_tree(proc)  # reap anything the step left running in its group
    return ProcessResult(
        exit_code=code, timed_out=timed_out, oom_killed=oom, cancelled=cancelled,
        peak_cpu=sampler.peak_cpu, peak_memory_bytes=sampler.peak_rss,
    )
