"""Run one command as a subprocess, sample its process tree, enforce limits.

The process starts in its own session (process group) so that a timeout, a
memory-limit kill or a cancellation kills the whole tree. On Linux it also gets
SIGKILL when the thread that started it dies (``PR_SET_PDEATHSIG``): a crashed
engine process leaves no step running unobserved, and a resumed run runs the
interrupted step again as a new attempt instead of losing a result it never saw. Every
``SAMPLE_SECONDS`` the tree's CPU (in cores) and resident memory are sampled
with psutil; the peaks are returned with the exit code.

A process given a ``stop`` event (a daemon step, stopped when the run no longer needs it) is
stopped gracefully when the event is set: SIGTERM to its process group, SIGKILL to what is
left once it exited or after ``grace_seconds``. ``on_start`` is called once it was started.

While the process runs, ``on_sample`` (when given) receives a :class:`ProcessSample` about
every ``series_seconds``, and once more when it ends (for the rest of the time): the
*average* cores the tree used over the interval since the previous sample (the CPU time
it spent, its exited and reaped children's included, over the wall time), not an
instantaneous reading, and its resident memory at the end of the interval. A process that
ends before it is sampled once gets none.

The death signal is set by ``setpriv --pdeathsig KILL`` (util-linux), which then execs the
command, or by a small Python shim where ``setpriv`` is missing -- never by a
``preexec_fn``: that forces ``fork()`` instead of ``vfork()``, and a fork of a process
running gRPC threads (every service) runs gRPC's fork handlers in the child, which abort
it now and then (``Check failed: next_worker->state == KICKED``, exit -6, measured at about
one spawn in ten under load).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

__all__ = ["SAMPLE_SECONDS", "SERIES_SECONDS", "STOP_GRACE_SECONDS", "ProcessResult",
           "ProcessSample", "run_process"]

log = logging.getLogger(__name__)

SAMPLE_SECONDS = 0.05
FIRST_SAMPLE_SECONDS = 0.004  # doubled up to SAMPLE_SECONDS
SERIES_SECONDS = 1.0  # the interval of the time series passed to on_sample, by default
STOP_GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL when a stopped process goes on

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
        stopped: The process was stopped by its ``stop`` event (SIGTERM, then SIGKILL).
        peak_cpu: Peak CPU use of the tree, in cores.
        peak_memory_bytes: Peak resident memory of the tree, in bytes.
        error: Why the process could not start, if it did not.
    """

    exit_code: int | None
    started: bool = True
    timed_out: bool = False
    oom_killed: bool = False
    cancelled: bool = False
    stopped: bool = False
    peak_cpu: float = 0.0
    peak_memory_bytes: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """What a process tree used over one interval of its time series.

    Attributes:
        at: Seconds since the epoch at the end of the interval.
        interval_seconds: The interval's length (wall time).
        cpu: The average cores used over the interval (CPU time / wall time).
        memory_bytes: The tree's resident memory at ``at``.
    """

    at: float
    interval_seconds: float
    cpu: float
    memory_bytes: int


OnSample = Callable[[ProcessSample], None]


class _Series:
    """Turns the sampler's readings into :class:`ProcessSample` intervals.

    CPU time is summed per reading, as the increase of the tree's total since the previous
    reading (never negative: a process that left the tree between two readings takes its
    time with it, and only that reading's share is lost).
    """

    def __init__(self, emit: OnSample, interval: float, started: float) -> None:
        self._emit = emit
        self._interval = interval
        self._since = started  # monotonic start of the current interval
        self._used = 0.0  # CPU seconds used in the current interval
        self._total: float | None = None  # the tree's CPU total at the previous reading
        self._last: tuple[float, float, int] | None = None  # (monotonic, epoch, rss)
        self.emitted = 0

    def observe(self, total: float, rss: int) -> None:
        now = time.monotonic()
        if self._total is not None:
            self._used += max(0.0, total - self._total)
        else:
            self._used += max(0.0, total)  # since the process started (its first reading)
        self._total = total
        if rss == 0:  # the tree's processes have exited (unreaped): no memory reading
            if self._last is None:
                return  # never seen alive: no sample (as a process too short to sample)
            rss = self._last[2]  # the last known
        self._last = (now, time.time(), rss)
        if now - self._since >= self._interval:
            self._flush()

    def finish(self) -> None:
        """The process ended: the rest of the time since the last sample, if any."""
        if self._last is not None and self._last[0] > self._since:
            self._flush()

    def _flush(self) -> None:
        assert self._last is not None  # flushed after a reading only
        now, at, rss = self._last
        wall = now - self._since
        if wall <= 0:
            return
        sample = ProcessSample(at=at, interval_seconds=wall, cpu=self._used / wall,
                               memory_bytes=rss)
        self._since, self._used = now, 0.0
        self.emitted += 1
        try:
            self._emit(sample)
        except Exception:  # a consumer's failure never stops the step or its limits
            log.warning("a utilization sample could not be passed on", exc_info=True)


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
        self.cpu_seconds: float | None = None  # the tree's CPU time at the last reading

    def sample(self) -> int:
        self.cpu_seconds = None  # set once the tree was read
        try:
            root = psutil.Process(self.pid)
            if not self.execed:
                self.execed = root.cmdline() == self.argv
                if not self.execed:
                    return 0
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        rss, cpu, seconds = 0, 0.0, 0.0
        for proc in tree:
            pid = int(proc.pid)
            cached: Any = self.procs.setdefault(pid, proc)
            try:
                with cached.oneshot():
                    now = int(cached.memory_info().rss)
                    cpu += float(cached.cpu_percent(None)) / 100.0
                    t = cached.cpu_times()
                    # its own time and that of the children it reaped (a child's time moves
                    # to its parent when reaped: the tree's total goes on counting it)
                    seconds += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                continue
            rss += now
            self.hwm[pid] = max(self.hwm.get(pid, 0), now, _high_water_mark(pid))
        self.peak_rss = max(self.peak_rss, rss, sum(self.hwm.values()))
        self.peak_cpu = max(self.peak_cpu, cpu)
        self.cpu_seconds = seconds
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
    on_sample: OnSample | None = None,
    series_seconds: float = SERIES_SECONDS,
    stop: threading.Event | None = None,
    grace_seconds: float = STOP_GRACE_SECONDS,
    on_start: Callable[[], None] | None = None,
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
        on_sample: Receives the tree's time series while it runs (see the module
            docstring); called on this thread, so it must be quick.
        series_seconds: The interval of that series.
        stop: Stop the tree gracefully as soon as this event is set: SIGTERM to its
            process group, SIGKILL after ``grace_seconds`` (or once the process exited).
        grace_seconds: How long a stopped process may take to exit.
        on_start: Called (on this thread) once the process was started.

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
        if on_start is not None:
            on_start()
        sampler = _Sampler(proc.pid, argv)
        series = (_Series(on_sample, series_seconds, time.monotonic())
                  if on_sample is not None else None)
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        timed_out = oom = cancelled = stopped = False
        interval = FIRST_SAMPLE_SECONDS
        while True:
            rss = sampler.sample()
            if series is not None and sampler.cpu_seconds is not None:
                series.observe(sampler.cpu_seconds, rss)
            code = proc.poll()
            if code is not None:
                break
            if cancel is not None and cancel.is_set():
                cancelled = True
            elif stop is not None and stop.is_set():
                stopped = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace_seconds)
                _kill_tree(proc)
                code = proc.wait()
                break
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
        if series is not None:
            series.finish()
    return ProcessResult(
        exit_code=code, timed_out=timed_out, oom_killed=oom, cancelled=cancelled,
        stopped=stopped,
        peak_cpu=sampler.peak_cpu, peak_memory_bytes=sampler.peak_rss,
    )
