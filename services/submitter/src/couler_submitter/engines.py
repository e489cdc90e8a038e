"""The engines a submitter runs plans on, behind one small interface.

A :class:`Runner` starts a workflow under the submitter's run id and reports every step
change through a callback (called from worker threads); the returned :class:`RunHandle`
waits, cancels and locates output artifacts. Three runners exist:

* :class:`LocalRunner` -- :class:`couler_runtime.local.LocalEngine`: the run directory is
  ``<runs_dir>/<run_id>``; its existence means "the engine was started", so after a crash
  the run is *resumed* there (steps that succeeded are not run again), never started twice.
  Processes a killed submitter left behind in that directory are killed first, so an
  interrupted attempt never runs alongside its replacement. A submitter that stops
  gracefully stops its runs' processes and marks the runs ``.interrupted``, so that the
  next start resumes them (rather than taking them for cancelled by a user).
* :class:`DryRunRunner` -- records every step SUCCEEDED without running anything (the
  throughput benchmark's engine).
* :class:`AdapterRunner` -- any :class:`couler.engines.base.EngineAdapter` (Argo, Tekton,
  Airflow, KFP, ...): submit with the run id as idempotency key, then follow ``watch``.
  No adapter is configured by default (they need cluster settings); a composition root
  plugs them in through ``build(..., adapters=...)``. A run for an engine that is not
  configured fails with a message naming the engine and the ``COULER_ENGINES`` setting.

Utilization while steps run: each runner hands the samples of running steps
(:class:`couler.engines.base.StepSample`) to the ``on_sample`` callback given to ``start``,
``resume`` and ``retry`` (from worker threads). The local engine samples the step's process
tree itself; an adapter whose engine exposes what pods use
(:class:`couler.engines.base.SamplingAdapter`: Argo, Tekton through the Kubernetes metrics
API) is polled every ``metrics_interval`` seconds while its run is watched, and a reading
the engine has not refreshed since (the same time) is passed on once. Airflow's and KFP's
APIs expose none: their runs have no samples.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import psutil  # type: ignore[import-untyped]

from couler import ir
from couler.engines.base import (
    EngineAdapter,
    RunState,
    RunStatus,
    SamplingAdapter,
    StepSample,
    StepState,
    StepStatus,
)
from couler.errors import NotFoundError, UserError
from couler_runtime.local import LocalEngine, LocalRun, Reuse
from couler_runtime.local.process import SERIES_SECONDS
from couler_runtime.private_files import check_private

__all__ = [
    "KNOWN_ENGINES",
    "AdapterRunner",
    "DryRunRunner",
    "LocalRunner",
    "OnSample",
    "OnStep",
    "RunHandle",
    "Runner",
    "not_configured",
]

log = logging.getLogger(__name__)

KNOWN_ENGINES = ("local", "dryrun", "argo", "tekton", "airflow", "kfp", "ray")

OnStep = Callable[[StepStatus], None]
OnSample = Callable[[StepSample], None]

_INTERRUPTED = ".interrupted"  # in a local run directory: stopped by a submitter shutdown
_INTERRUPT_WAIT = 30.0  # seconds a shutdown waits for a run's processes to be stopped


class RunHandle(Protocol):
    """A started run."""

    def wait(self) -> RunStatus:
        """Block until the run ends; its final status."""
        ...

    def cancel(self) -> None:
        """Stop the run (its steps end CANCELLED)."""
        ...

    def artifact_path(self, step: str, artifact: str) -> Path | None:
        """Where a succeeded step's output artifact is, if the engine keeps it locally."""
        ...


class Runner(Protocol):
    """Starts, resumes and retries runs on one engine."""

    name: str

    def start(self, run_id: str, wf: ir.Workflow, parameters: Mapping[str, str],
              cached: Mapping[str, Reuse], on_event: OnStep, *,
              on_sample: OnSample | None = None) -> RunHandle:
        """Start ``wf`` as run ``run_id``; ``on_sample`` gets what running steps use."""
        ...

    def resume(self, run_id: str, on_event: OnStep, *,
               on_sample: OnSample | None = None) -> RunHandle | None:
        """Pick up a run this engine was started with (after a restart); None when the
        engine never got it (the caller starts it)."""
        ...

    def retry(self, run_id: str, on_event: OnStep, *,
              on_sample: OnSample | None = None) -> RunHandle | None:
        """Re-run a finished run from its failure point; None when there is nothing to
        resume (the caller starts it again from the plan)."""
        ...

    def interrupt(self, run_id: str, handle: RunHandle) -> None:
        """Stop a run because the submitter stops (not the user): the next start resumes it."""
        ...

    def logs(self, engine_run_id: str, step: str, key: str) -> str:
        """What one step execution of the engine's run wrote (NotFoundError if nothing)."""
        ...


def not_configured(engine: str, configured: tuple[str, ...]) -> UserError:
    """The error of a run for an engine this submitter does not run."""
    if engine not in KNOWN_ENGINES:
        return UserError(f"engine {engine!r} is unknown (known: {', '.join(KNOWN_ENGINES)})")
    return UserError(
        f"engine {engine!r} is not configured in this submitter (it runs: "
        f"{', '.join(configured) or 'none'}); add it to COULER_ENGINES and plug in its "
        f"adapter (couler.engines.base.EngineAdapter, e.g. couler_runtime.{engine}) with the "
        "cluster's connection settings, or submit with engine 'local'")


# =========================================================================== local


def reap_orphans(run_dir: Path) -> list[int]:
    """Kill processes whose working directory is inside ``run_dir`` (left by a killed
    submitter: step processes run in their own sessions and outlive it)."""
    root = str(run_dir.resolve())
    killed = []
    for proc in psutil.process_iter(["pid", "cwd"]):
        cwd = proc.info.get("cwd")
        if proc.pid == os.getpid() or not cwd:
            continue
        if cwd == root or cwd.startswith(root + os.sep):
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed.append(proc.pid)
    for pid in killed:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(10)
    return killed


def _status_from_record(run_dir: Path) -> RunStatus:
    """The final status kept in a finished run's ``run.json``."""
    data = json.loads((run_dir / "run.json").read_text())
    steps = []
    for s in data.get("steps", ()):
        steps.append(StepStatus(
            step=str(s["step"]), state=StepState(str(s["state"])), key=str(s.get("key", "")),
            attempts=int(s.get("attempts") or 0), exit_code=s.get("exit_code"),
            started_at=s.get("started_at"), finished_at=s.get("finished_at"),
            peak_cpu=s.get("peak_cpu"), peak_memory_bytes=s.get("peak_memory_bytes"),
            outputs={str(k): str(v) for k, v in (s.get("outputs") or {}).items()},
            message=str(s.get("message", "")), cache_key=str(s.get("cache_key", ""))))
    return RunStatus(run_id=run_dir.name, workflow=str(data["workflow"]["name"]),
                     state=RunState(str(data["state"])), steps=tuple(steps),
                     started_at=data.get("started_at"), finished_at=data.get("finished_at"),
                     message=str(data.get("message", "")))


class _Finished:
    """The handle of a run that had already finished when it was picked up again."""

    def __init__(self, status: RunStatus, run_dir: Path, on_event: OnStep) -> None:
        self._status = status
        self._run_dir = run_dir
        for step in status.steps:
            on_event(step)

    def wait(self) -> RunStatus:
        return self._status

    def cancel(self) -> None:
        return None

    def artifact_path(self, step: str, artifact: str) -> Path | None:
        path = self._run_dir / "artifacts" / step / artifact
        return path if path.exists() else None


class LocalRunner:
    """Runs on :class:`LocalEngine` in ``runs_dir`` (see the module docstring)."""

    name = "local"

    def __init__(self, runs_dir: Path, max_workers: int, *,
                 secrets_file: Path | None = None,
                 series_seconds: float = SERIES_SECONDS) -> None:
        self.runs_dir = runs_dir
        self.secrets_file = secrets_file
        self.engine = LocalEngine(runs_dir, max_workers, cache_keys=True,
                                  secrets=self._secrets(), series_seconds=series_seconds)

    def _secrets(self) -> dict[tuple[str, str], str]:
        """The values of ``secrets_file`` (none without one).

        Raises:
            UserError: The file cannot be read, is readable by others, or has another
                shape (naming file, secret and key, never a value).
        """
        if self.secrets_file is None:
            return {}
        from couler.cli import read_secrets_file

        check_private(self.secrets_file, "COULER_SECRETS_FILE")
        return read_secrets_file(str(self.secrets_file))

    def run_dir(self, run_id: str) -> Path:
        """The engine's directory of run ``run_id``."""
        return self.engine.work_dir / run_id

    def start(self, run_id: str, wf: ir.Workflow, parameters: Mapping[str, str],
              cached: Mapping[str, Reuse], on_event: OnStep, *,
              on_sample: OnSample | None = None) -> LocalRun:
        if self.secrets_file is not None:  # an edit takes effect at the next run
            self.engine.secrets = self._secrets()
        return self.engine.start(wf, run_id=run_id, parameters=parameters, cached=cached,
                                 on_event=on_event, on_sample=on_sample)

    def resume(self, run_id: str, on_event: OnStep, *,
               on_sample: OnSample | None = None) -> RunHandle | None:
        run_dir = self.run_dir(run_id)
        if not run_dir.is_dir():
            return None
        reaped = reap_orphans(run_dir)
        if reaped:
            log.warning("run %s: killed %d step process(es) left by a previous submitter",
                        run_id, len(reaped))
        if not (run_dir / "run.json").is_file():
            # Made but the engine wrote no record yet: nothing ran; start it afresh.
            shutil.rmtree(run_dir)
            return None
        marker = run_dir / _INTERRUPTED
        status = _status_from_record(run_dir)
        if status.state.terminal and not marker.exists():
            return _Finished(status, run_dir, on_event)
        # Running when the submitter died, or stopped by its shutdown: go on from there
        # (an attempt the shutdown stopped counts, like one a crash stopped).
        handle = self.engine.resume(run_dir, on_event=on_event, interrupted=marker.exists(),
                                    on_sample=on_sample)
        marker.unlink(missing_ok=True)
        return handle

    def interrupt(self, run_id: str, handle: RunHandle) -> None:
        # The marker tells resume() that this CANCELLED record is a shutdown, not a user's
        # cancel; the engine kills the step processes, so none outlives the submitter.
        (self.run_dir(run_id) / _INTERRUPTED).touch()
        handle.cancel()
        if isinstance(handle, LocalRun):
            handle.wait(_INTERRUPT_WAIT)

    def retry(self, run_id: str, on_event: OnStep, *,
              on_sample: OnSample | None = None) -> RunHandle | None:
        run_dir = self.run_dir(run_id)
        if not (run_dir / "run.json").is_file():
            return None
        reap_orphans(run_dir)
        return self.engine.resume(run_dir, on_event=on_event, on_sample=on_sample)

    def logs(self, engine_run_id: str, step: str, key: str) -> str:
        run_dir = self.run_dir(engine_run_id)
        if not (run_dir / "run.json").is_file():
            raise NotFoundError(f"run {engine_run_id!r}: the local engine has no record of it")
        return self.engine.logs(run_dir, step, key)


# =========================================================================== dry run


class _DryRun:
    def __init__(self, run_id: str, wf: ir.Workflow, on_event: OnStep) -> None:
        self._run_id = run_id
        self._wf = wf
        self._on_event = on_event
        self._cancel = threading.Event()
        self._status: RunStatus | None = None
        self._thread = threading.Thread(target=self._main, name=f"couler-dryrun-{run_id}",
                                        daemon=True)
        self._thread.start()

    def _main(self) -> None:
        started = time.time()
        steps = []
        for step in _topological(self._wf):
            now = time.time()
            if self._cancel.is_set():
                status = StepStatus(step=step.name, state=StepState.CANCELLED,
                                    message="run cancelled", finished_at=now)
            else:
                status = StepStatus(step=step.name, state=StepState.SUCCEEDED, attempts=1,
                                    exit_code=0, started_at=now, finished_at=now,
                                    message="dry run: not executed")
            steps.append(status)
            self._on_event(status)
        state = RunState.CANCELLED if self._cancel.is_set() else RunState.SUCCEEDED
        self._status = RunStatus(self._run_id, self._wf.name, state, tuple(steps), started,
                                 time.time(), "cancelled" if self._cancel.is_set() else "")

    def wait(self) -> RunStatus:
        self._thread.join()
        assert self._status is not None  # set by the thread before it ends
        return self._status

    def cancel(self) -> None:
        self._cancel.set()

    def artifact_path(self, step: str, artifact: str) -> Path | None:
        return None


def _topological(wf: ir.Workflow) -> list[ir.Step]:
    """The steps level by level (a step after all it depends on), each level in workflow
    order; linear in the steps and edges. Steps left in a cycle (an invalid workflow)
    come last, in workflow order."""
    index = {s.name: i for i, s in enumerate(wf.steps)}
    waiting = [0] * len(wf.steps)
    downstream: list[list[int]] = [[] for _ in wf.steps]
    for i, step in enumerate(wf.steps):
        for up in {d.step for d in step.dependencies}:
            j = index.get(up)
            if j is not None and j != i:
                waiting[i] += 1
                downstream[j].append(i)
    level = [i for i, n in enumerate(waiting) if n == 0]
    order: list[int] = []
    while level:
        order.extend(level)
        following: list[int] = []
        for i in level:
            for k in downstream[i]:
                waiting[k] -= 1
                if waiting[k] == 0:
                    following.append(k)
        level = sorted(following)
    if len(order) < len(wf.steps):
        placed = set(order)
        order.extend(i for i in range(len(wf.steps)) if i not in placed)
    return [wf.steps[i] for i in order]


class DryRunRunner:
    """Records every step SUCCEEDED; nothing runs (see the module docstring)."""

    name = "dryrun"

    def start(self, run_id: str, wf: ir.Workflow, parameters: Mapping[str, str],
              cached: Mapping[str, Reuse], on_event: OnStep, *,
              on_sample: OnSample | None = None) -> RunHandle:
        return _DryRun(run_id, wf, on_event)  # nothing runs: nothing to sample

    def resume(self, run_id: str, on_event: OnStep, *,
               on_sample: OnSample | None = None) -> RunHandle | None:
        return None  # nothing is kept: run it again

    def retry(self, run_id: str, on_event: OnStep, *,
              on_sample: OnSample | None = None) -> RunHandle | None:
        return None

    def interrupt(self, run_id: str, handle: RunHandle) -> None:
        handle.cancel()

    def logs(self, engine_run_id: str, step: str, key: str) -> str:
        raise NotFoundError(f"run {engine_run_id!r} was a dry run: no step ran, none wrote logs")


# =========================================================================== adapters


class _Watched:
    def __init__(self, adapter: EngineAdapter, engine_run_id: str, on_event: OnStep,
                 on_sample: OnSample | None = None, metrics_interval: float = 5.0) -> None:
        self._adapter = adapter
        self._id = self.engine_run_id = engine_run_id
        self._on_event = on_event
        self._status: RunStatus | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"couler-watch-{engine_run_id}",
                                        daemon=True)
        self._thread.start()
        if on_sample is not None and isinstance(adapter, SamplingAdapter):
            threading.Thread(target=self._sample, args=(adapter, on_sample, metrics_interval),
                             name=f"couler-metrics-{engine_run_id}", daemon=True).start()

    def _main(self) -> None:
        seen: dict[tuple[str, str], StepStatus] = {}
        try:
            for status in self._adapter.watch(self._id):
                for step in status.steps:
                    if seen.get((step.step, step.key)) != step:
                        seen[(step.step, step.key)] = step
                        self._on_event(step)
                self._status = status
        finally:
            self._done.set()

    def _sample(self, adapter: SamplingAdapter, on_sample: OnSample, interval: float) -> None:
        """Poll what the run's running steps use until the watch ends; each reading once."""
        last: dict[tuple[str, str, int], float] = {}  # the latest time passed on, per attempt
        failing = False
        while not self._done.wait(interval):
            try:
                samples = adapter.utilization(self._id)
            except Exception as exc:  # best effort: the run goes on without samples
                if not failing:
                    log.warning("run %s: reading what its steps use failed (%s); trying again "
                                "every %g s", self._id, exc, interval)
                failing = True
                continue
            failing = False
            for sample in samples:
                ident = (sample.step, sample.key, sample.attempt)
                if sample.at <= last.get(ident, float("-inf")):
                    continue  # not refreshed since the last poll
                last[ident] = sample.at
                on_sample(sample)

    def wait(self) -> RunStatus:
        self._thread.join()
        return self._status or self._adapter.status(self._id)

    def cancel(self) -> None:
        self._adapter.cancel(self._id)

    def artifact_path(self, step: str, artifact: str) -> Path | None:
        return None


class AdapterRunner:
    """Runs on a remote engine through its :class:`EngineAdapter`; ``metrics_interval``:
    seconds between two polls of what running steps use (a :class:`SamplingAdapter`)."""

    def __init__(self, name: str, adapter: EngineAdapter, *,
                 metrics_interval: float = 5.0) -> None:
        self.name = name
        self.adapter = adapter
        self.metrics_interval = metrics_interval

    def start(self, run_id: str, wf: ir.Workflow, parameters: Mapping[str, str],
              cached: Mapping[str, Reuse], on_event: OnStep, *,
              on_sample: OnSample | None = None) -> RunHandle:
        # The run id as idempotency key: a submit repeated after a crash finds the first run.
        engine_run_id = self.adapter.submit(wf, idempotency_key=run_id)
        return _Watched(self.adapter, engine_run_id, on_event, on_sample,
                        self.metrics_interval)

    def resume(self, run_id: str, on_event: OnStep, *,
               on_sample: OnSample | None = None) -> RunHandle | None:
        return None  # start() again: the adapter's idempotency key finds the same run

    def retry(self, run_id: str, on_event: OnStep, *,
              on_sample: OnSample | None = None) -> RunHandle | None:
        return None

    def interrupt(self, run_id: str, handle: RunHandle) -> None:
        return None  # the remote run goes on; resume finds it by its idempotency key

    def logs(self, engine_run_id: str, step: str, key: str) -> str:
        return self.adapter.logs(engine_run_id, step, key)
