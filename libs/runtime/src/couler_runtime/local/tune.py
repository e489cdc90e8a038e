"""The local engine's hyperparameter-tuning driver: how a step with ``tune`` runs.

It owns the step's optuna study as the local engine drives it (:mod:`couler_runtime.tune`
does the optuna side): opening the study in its storage under a name hashing the step's
spec and what its trials read, asking for parameter sets and running up to ``parallel``
trials at once (each an execution of the step recorded ``step[N]``), reusing evaluated
parameters and cache hits, feeding the values a trial reports through
``$COULER_TUNE_REPORT`` to the pruner and stopping the trials it prunes, telling the
study how each trial ended, and ending the step with the best trial's outputs. The rules
are in :mod:`couler_runtime.local.engine`'s docstring (**Tuning**).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from couler import ir
from couler.engines.base import StepState
from couler.optimize.cache_key import cache_policy
from couler.optimize.tune import study_name

from .. import tune as tuning
from .journal import _DONE_OK, _Record

if TYPE_CHECKING:
    from .engine import LocalRun

__all__ = ["TrialCtl", "run_tune"]


def _tune_context(run: LocalRun, step: ir.Step) -> list[str]:
    """What the study's name hashes besides the step's spec: the values of the inputs
    the trials share, the identity of the artifacts they read (a producer's cache key,
    else this run's), and this run when the step is not to be reused."""
    context: list[str] = []
    for inp in step.inputs:
        if not isinstance(inp.value, ir.ItemRef):
            value = run._value(inp.value, step, None, {}, f"inputs.{inp.name}")
            context.append(f"input {inp.name}={value}")
    for art in step.input_artifacts:
        src = art.source
        if isinstance(src, ir.StepArtifactRef):
            rec = run._record(src.step)
            who = rec.cache_key if rec is not None and rec.cache_key else \
                f"run {run.run_id} step {src.step}"
            context.append(f"artifact {art.name}={who}/{src.artifact}")
        else:
            context.append(f"artifact {art.name}={ir.to_json(src)}")
    if not cache_policy(run.workflow, step).enabled:
        context.append(f"run {run.run_id}")
    return context


def run_tune(run: LocalRun, step: ir.Step, rec: _Record, spec: ir.Tune) -> None:
    """Drive the step's optuna study: ask, run up to ``parallel`` trials at once (each
    an execution of the step, recorded ``step[N]``, N the trial's number), tell, and
    end with the best trial's outputs."""
    wf = run.workflow
    where = f"workflow {wf.name!r}, step {step.name!r}"
    run._update(rec, state=StepState.RUNNING, started_at=time.time())
    name = run._name(step.name)
    for (prev_step, key), prev in run._previous.items():  # trials of a crashed attempt
        if prev_step == name and key and prev.state.terminal:
            run._update(_Record.from_dict(prev.to_dict()))
    try:
        study = study_name(wf.name, step, _tune_context(run, step))
        storage = run.engine.tune_storage or tuning.default_storage(run.engine.work_dir)
        opened = tuning.open_study(storage, study, spec)
    except Exception as exc:  # a bad storage URL, an unreachable database, a bad input
        run._update(rec, state=StepState.FAILED, finished_at=time.time(),
                    message=f"{where}, field 'tune': cannot open the study: {exc}")
        return
    try:
        driver = tuning.Driver(opened, spec)
    except Exception as exc:
        tuning.close_study(opened)
        run._update(rec, state=StepState.FAILED, finished_at=time.time(),
                    message=f"{where}, field 'tune': cannot resume the study: {exc}")
        return
    try:
        _drive(run, step, rec, spec, study, driver)
    finally:
        driver.close()


def _drive(run: LocalRun, step: ir.Step, rec: _Record, spec: ir.Tune, study: str,  # noqa: PLR0917
           driver: tuning.Driver) -> None:
    """Run the trials of ``study`` through ``driver`` and record the step's end."""
    where = f"workflow {run.workflow.name!r}, step {step.name!r}"
    name = run._name(step.name)
    running: dict[Future[None], int] = {}
    error = ""
    with ThreadPoolExecutor(spec.parallel) as pool:
        while True:
            try:
                while (not error and not run._cancel.is_set()
                       and len(running) < spec.parallel and driver.remaining() > 0):
                    number, params, known = driver.ask()
                    fut = pool.submit(_run_trial, run, step, spec, driver, number,
                                      params, known)
                    running[fut] = number
            except Exception as exc:  # the study's database failed under us
                error = f"cannot ask the study for a trial: {exc!r}"
            if not running:
                break
            done, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
            for fut in done:
                number = running.pop(fut)
                try:
                    fut.result()
                except Exception as exc:
                    error = error or f"trial {number}: {exc!r}"
    if error:
        run._update(rec, state=StepState.FAILED, finished_at=time.time(),
                    message=f"{where}, field 'tune': {error}")
        return
    with run._lock:
        trials = [r for (s, k), r in run._records.items() if s == name and k]
    counts = {state: sum(r.state is state for r in trials) for state in StepState}
    summary = (f"study {study!r}: {len(trials)} trials ({counts[StepState.SUCCEEDED]} "
               f"run, {counts[StepState.CACHED]} reused, {counts[StepState.PRUNED]} pruned, "
               f"{counts[StepState.FAILED]} failed)")
    if not trials:
        summary += " in this run: the study had finished its trials before"
    stats: dict[str, object] = {
        "finished_at": time.time(),
        "attempts": max((r.attempts for r in trials), default=0),
        "peak_cpu": max((r.peak_cpu or 0.0 for r in trials), default=None),
        "peak_memory_bytes": max((r.peak_memory_bytes or 0 for r in trials), default=None),
    }
    if run._cancel.is_set():
        run._update(rec, state=run._stopped_state(), message=run._stop_message(),
                    **stats)
        return
    try:
        outputs = driver.outputs()
    except ValueError as exc:
        failed = [r for r in trials if r.state is StepState.FAILED]
        run._update(rec, state=StepState.FAILED, failure=failed[0].failure if failed
                    else "", message=f"{where}, field 'tune': {exc}; {summary}"
                    + (f"; trial {failed[0].key}: {failed[0].message}" if failed else ""),
                    **stats)
        return
    run._update(rec, state=StepState.SUCCEEDED, outputs=outputs, failure="",
                message=f"{summary}; best {spec.objective} "
                        f"{outputs[ir.TUNE_BEST_VALUE]}", **stats)


def _run_trial(run: LocalRun, step: ir.Step, spec: ir.Tune, driver: tuning.Driver, number: int,  # noqa: PLR0917
               params: dict[str, Any], known: float | None) -> None:
    """Run (or reuse) trial ``number`` with ``params`` and tell the study how it ended."""
    rec = _Record(run._name(step.name), key=str(number))
    now = time.time()
    if known is not None:  # the study evaluated these parameters already
        run._update(rec, state=StepState.CACHED, started_at=now, finished_at=now,
                    attempts=0, outputs={spec.objective: repr(known)},
                    message=f"parameters {json.dumps(params, sort_keys=True)} were "
                            "evaluated by an earlier trial of the study: its value reused")
        driver.tell(number, tuning.TrialOutcome("complete", known))
        return
    hit = run._part_hit(step, lambda: run._item_key(step, params))
    if hit is None or not run._reuse_part(step, rec, hit):
        trial = TrialCtl(run._steps_dir / step.name / f"trial-{number}" / "report",
                         _TrialStop(run._cancel))
        with run._lock:
            run._trials[(rec.step, rec.key)] = trial
        watcher = threading.Thread(target=_watch_trial, args=(trial, driver, number),
                                   name=f"couler-tune-{number}", daemon=True)
        watcher.start()
        try:
            run._execute(step, rec, f"trial-{number}", params)
        finally:
            trial.done.set()
            watcher.join()
            with run._lock:
                run._trials.pop((rec.step, rec.key), None)
    if rec.state is StepState.PRUNED:
        driver.tell(number, tuning.TrialOutcome("pruned", message=rec.message))
        return
    if rec.state not in _DONE_OK:
        if rec.state is StepState.FAILED:
            driver.tell(number, tuning.TrialOutcome("fail", message=rec.message))
        # a cancelled trial stays running in the study: a resumed run runs it again
        return
    text = rec.outputs.get(spec.objective, "")
    value = tuning.parse_value(text)
    if value is None:
        run._update(rec, state=StepState.FAILED, message=(
            f"workflow {run.workflow.name!r}, step {step.name!r}, field 'tune.objective': "
            f"output {spec.objective!r} of trial {number} is not a number: {text[:200]!r}"))
        driver.tell(number, tuning.TrialOutcome("fail", message=rec.message))
        return
    driver.tell(number, tuning.TrialOutcome("complete", value))


def _watch_trial(trial: TrialCtl, driver: tuning.Driver, number: int) -> None:
    """Feed the values a running trial reports to the study; stop it when pruned."""
    while True:
        finished = trial.done.wait(0.1)
        values, trial.offset = tuning.read_reports(trial.report, trial.offset)
        for step_no, value in values:
            try:
                prune = driver.report(number, step_no, value)
            except Exception:
                return
            if prune and not finished and not trial.pruned:
                trial.pruned = (f"pruned at step {step_no} (intermediate value {value!r}): "
                                "the study's pruner stopped the trial")
                trial.stop.set()
        if finished:
            return


class _TrialStop(threading.Event):
    """A tuning trial's stop: set when its study prunes it, or when the run is stopped."""

    def __init__(self, run: threading.Event) -> None:
        super().__init__()
        self._run = run

    def is_set(self) -> bool:
        return self._run.is_set() or super().is_set()


@dataclass
class TrialCtl:
    """A tuning trial while it runs: its report file, its stop, why it was pruned."""

    report: Path
    stop: _TrialStop
    offset: int = 0
    pruned: str = ""
    done: threading.Event = field(default_factory=threading.Event)
