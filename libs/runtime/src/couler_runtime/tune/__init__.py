"""Hyperparameter tuning with optuna: the study behind a tune step (:class:`couler.ir.Tune`).

The study lives in RDB storage through SQLAlchemy: ``sqlite:///<state dir>/tune.db`` by
default (embedded), a PostgreSQL URL in production (``postgresql+psycopg://...``, the
driver this project installs), given by the ``COULER_TUNE_STORAGE`` setting. Its name
is derived from the workflow, the step and a hash of what determines its trials
(:func:`couler.optimize.tune.study_name`), so a run that crashed resumes the same study
and its completed trials are not run again.

Who drives the study:

* the local engine and Ray ask and tell it directly (:class:`Driver`), up to
  ``parallel`` trials at once, each an execution of the step;
* static engines (Argo) run rounds of steps that call this package's command line,
  ``python -m couler_runtime.tune ask|tell|best`` (:mod:`couler_runtime.tune.__main__`).

**Pruning protocol.** A trial reports intermediate values by appending lines
``STEP VALUE`` (an integer step, e.g. the epoch, and a number) to the file whose path is
in the environment variable ``COULER_TUNE_REPORT``. The engine reads new lines while the
trial runs, reports them to the study, asks the pruner, and stops a trial it prunes: the
trial is recorded PRUNED, in optuna and in the run's records (``step[N]``), not failed.
``COULER_TUNE_TRIAL`` holds the trial's number. :func:`report` does the appending.

On a static engine nothing watches a running trial, so the trial reports to the study
itself, as optuna's own distributed trials do: the rewrite (:func:`couler.optimize.tune.
expand_tune`) gives the trial step ``COULER_TUNE_STUDY`` (the study's name),
``COULER_TUNE_TRIAL``, ``COULER_TUNE_STORAGE`` (from the storage secret) and
``COULER_TUNE_OBJECTIVE`` (the path of its objective output, when it is a file), and
:func:`report` then records the value in the study and asks the pruner. A pruned trial is
told PRUNED there and then, writes ``pruned`` as its objective and ends with exit status 0
(:class:`TrialPruned`), so its round goes on and the tell step leaves the trial as it is.
This needs ``couler-runtime`` (and so optuna) in the trial's image; a trial that only
appends lines to a report file is not pruned on a static engine.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from couler import ir
from couler.optimize.tune import budget, grid_size

if TYPE_CHECKING:
    from optuna.study import Study

__all__ = [
    "OBJECTIVE_ENV",
    "PRUNED_OBJECTIVE",
    "REPORT_ENV",
    "STORAGE_ENV",
    "STUDY_ENV",
    "TRIAL_ENV",
    "Driver",
    "TrialOutcome",
    "TrialPruned",
    "best_outputs",
    "budget",
    "close_study",
    "default_storage",
    "distributions",
    "grid_size",
    "open_study",
    "parse_value",
    "read_reports",
    "report",
]

REPORT_ENV = "COULER_TUNE_REPORT"  # the file a trial appends "STEP VALUE" lines to
TRIAL_ENV = "COULER_TUNE_TRIAL"  # the trial's number
STORAGE_ENV = "COULER_TUNE_STORAGE"  # the study's database URL (a setting)
STUDY_ENV = "COULER_TUNE_STUDY"  # static engines: the study a trial reports to itself
OBJECTIVE_ENV = "COULER_TUNE_OBJECTIVE"  # static engines: the trial's objective output file
PRUNED_OBJECTIVE = "pruned"  # the objective a trial pruned on a static engine leaves
INTERRUPTED = "couler_interrupted"  # user attribute of a trial a crash left running


class TrialPruned(SystemExit):
    """Raised by :func:`report` in a trial its study pruned (static engines): the trial
    stops with exit status 0, its pruned state already in the study."""

    def __init__(self, message: str) -> None:
        super().__init__(0)
        self.message = message

def _optuna() -> Any:
    """optuna, imported when a study is used, its info logging (a line per trial) off."""
    import optuna

    if optuna.logging.get_verbosity() < logging.WARNING:
        optuna.logging.set_verbosity(logging.WARNING)
    return optuna


def report(step: int, value: float) -> None:
    """Report an intermediate value from inside a trial (a no-op outside one).

    Under an engine that watches the trial (local, Ray) the value is appended to the
    ``COULER_TUNE_REPORT`` file and the engine stops a pruned trial. On a static engine
    (``COULER_TUNE_STUDY`` set) the value goes to the study directly; when the pruner
    stops the trial, it is told PRUNED, its objective file gets ``pruned``, and
    :class:`TrialPruned` ends the process with status 0.
    """
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{int(step)} {float(value)!r}\n")
        return
    study_name = os.environ.get(STUDY_ENV, "").strip()
    if not study_name:
        return
    _report_direct(study_name, int(step), float(value))


_DIRECT: dict[tuple[str, str], Any] = {}  # (storage, study) -> the study, per process


def _report_direct(study_name: str, step: int, value: float) -> None:
    """Record ``value`` of this trial in its study; stop the trial when it is pruned."""
    storage = os.environ.get(STORAGE_ENV, "").strip()
    number_text = os.environ.get(TRIAL_ENV, "").strip()
    if not storage or not number_text.lstrip("-").isdigit():
        raise RuntimeError(
            f"couler_runtime.tune.report: {STUDY_ENV} is set but {STORAGE_ENV} or "
            f"{TRIAL_ENV} is missing or not a trial number ({number_text!r}): the trial "
            "step must be compiled by couler.optimize.tune.expand_tune")
    optuna = _optuna()
    key = (storage, study_name)
    study = _DIRECT.get(key)
    if study is None:
        study = optuna.load_study(study_name=study_name, storage=_rdb(storage),
                                  pruner=_pruner(ir.TunePruner.MEDIAN))
        _DIRECT[key] = study
    number = int(number_text)
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    trial = optuna.Trial(study, trial_id)
    trial.report(value, step)
    if not trial.should_prune():
        return
    study.tell(number, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
    message = (f"trial {number} of study {study_name!r} pruned at step {step} "
               f"(intermediate value {value!r})")
    objective = os.environ.get(OBJECTIVE_ENV, "").strip()
    if objective:
        _write_text(objective, PRUNED_OBJECTIVE)
    else:  # a standard-output objective: the last line it prints
        print(PRUNED_OBJECTIVE, flush=True)
    print(f"couler: {message}", file=sys.stderr, flush=True)
    raise TrialPruned(message)


def _write_text(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")


def _rdb(storage: str) -> Any:
    """optuna's RDB storage for ``storage`` (SQLite: wait for the file's lock)."""
    engine_kwargs: dict[str, Any] = {}
    if storage.startswith("sqlite"):
        # several threads (and ask/tell processes) share one file: wait for its lock
        engine_kwargs = {"connect_args": {"timeout": 60}}
    return _optuna().storages.RDBStorage(storage, engine_kwargs=engine_kwargs)


def read_reports(path: Path, offset: int) -> tuple[list[tuple[int, float]], int]:
    """The complete ``STEP VALUE`` lines of ``path`` past byte ``offset``, and the new
    offset (a line still being written is left for the next read; malformed lines are
    skipped)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    values: list[tuple[int, float]] = []
    for line in data[:end].decode("utf-8", errors="replace").splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            step, value = int(float(parts[0])), float(parts[1])
        except ValueError:
            continue
        if math.isfinite(value):
            values.append((step, value))
    return values, offset + end


def default_storage(state_dir: str | Path) -> str:
    """The storage URL: the ``COULER_TUNE_STORAGE`` setting, else SQLite in ``state_dir``."""
    url = os.environ.get(STORAGE_ENV, "").strip()
    if url:
        return url
    path = Path(state_dir).resolve() / "tune.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def distributions(spec: ir.Tune) -> dict[str, Any]:
    """The optuna distribution of each parameter of ``spec``'s space."""
    d = _optuna().distributions
    out: dict[str, Any] = {}
    for p in spec.space:
        if p.kind is ir.TuneKind.CHOICE:
            out[p.name] = d.CategoricalDistribution([c.value for c in p.choices])
        elif p.kind is ir.TuneKind.INT:
            step = int(p.step) if p.step is not None else 1
            out[p.name] = d.IntDistribution(int(p.low), int(p.high), log=p.log, step=step)
        else:
            out[p.name] = d.FloatDistribution(p.low, p.high,
                                              log=p.kind is ir.TuneKind.LOGUNIFORM,
                                              step=p.step)
    return out


def _grid(spec: ir.Tune) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for p in spec.space:
        if p.kind is ir.TuneKind.CHOICE:
            grid[p.name] = [c.value for c in p.choices]
        elif p.kind is ir.TuneKind.INT:
            step = int(p.step) if p.step is not None else 1
            grid[p.name] = list(range(int(p.low), int(p.high) + 1, step))
        else:
            width = p.step or (p.high - p.low) or 1.0
            n = math.floor((p.high - p.low) / width + 1e-9)
            grid[p.name] = [p.low + i * width for i in range(n + 1)]
    return grid


def _sampler(spec: ir.Tune) -> Any:
    s = _optuna().samplers
    if spec.sampler is ir.TuneSampler.RANDOM:
        return s.RandomSampler(seed=spec.seed)
    if spec.sampler is ir.TuneSampler.CMAES:
        return s.CmaEsSampler(seed=spec.seed, warn_independent_sampling=False)
    if spec.sampler is ir.TuneSampler.GRID:
        return _grid_sampler(s.GridSampler)(_grid(spec), seed=spec.seed)
    return s.TPESampler(seed=spec.seed)


def _grid_sampler(base: type[Any]) -> type[Any]:
    """optuna's grid sampler without its stop at the end of the grid: ``Study.stop`` is
    for ``optimize``, it raises under ask/tell (the budget bounds the trials instead)."""

    class GridSampler(base):  # type: ignore[misc]
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return GridSampler


def _pruner(kind: ir.TunePruner) -> Any:
    p = _optuna().pruners
    if kind is ir.TunePruner.NONE:
        return p.NopPruner()
    return p.MedianPruner(n_startup_trials=2, n_warmup_steps=0)


def open_study(storage: str, name: str, spec: ir.Tune) -> Study:
    """Create the study ``name`` in ``storage``, or load it when it exists (resume)."""
    optuna = _optuna()
    study = optuna.create_study(storage=_rdb(storage), study_name=name, load_if_exists=True,
                                direction=spec.direction.value, sampler=_sampler(spec),
                                pruner=_pruner(spec.pruner))
    done = len(study.get_trials(deepcopy=False))
    if done and spec.seed is not None:
        # A seeded sampler made anew would replay the draws of the trials the study has
        # (a resumed run, or the next round's ask process): seed it past them.
        study.sampler = _sampler(dataclasses.replace(spec, seed=spec.seed + done))
    return cast("Study", study)


def close_study(study: Study) -> None:
    """Close the study's database connections (its SQLAlchemy engine's pool)."""
    storage = getattr(study, "_storage", None)
    backend = getattr(storage, "_backend", storage)
    engine = getattr(backend, "engine", None)
    if engine is not None:
        engine.dispose()


def parse_value(text: str) -> float | None:
    """The objective value in a trial's output text (a number, or a one-number JSON list
    or object value); None when it is not a finite number."""
    text = text.strip()
    try:
        value: object = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def best_outputs(study: Study, spec: ir.Tune) -> dict[str, str]:
    """The tune step's outputs from the study's best trial: ``best_params`` (a JSON object),
    ``best_value`` and each parameter by name.

    Raises:
        ValueError: no trial completed.
    """
    state = _optuna().trial.TrialState
    if not study.get_trials(deepcopy=False, states=(state.COMPLETE,)):
        raise ValueError("no trial of the study completed")
    best = study.best_trial
    params = {p.name: best.params.get(p.name) for p in spec.space}
    out = {ir.TUNE_BEST_PARAMS: json.dumps(params, sort_keys=True),
           ir.TUNE_BEST_VALUE: repr(float(best.value if best.value is not None else math.nan))}
    for name, value in params.items():
        out[name] = _text(value)
    return out


def finished_count(study: Study) -> int:
    """The trials that count toward the budget: finished ones, but not those a crash
    interrupted (they run again)."""
    state = _optuna().trial.TrialState
    done = (state.COMPLETE, state.PRUNED, state.FAIL)
    return sum(1 for t in study.get_trials(deepcopy=False, states=done)
               if not t.user_attrs.get(INTERRUPTED))


def recover(study: Study) -> int:
    """Fail the trials a crashed driver left running and queue their parameters again;
    the number of trials recovered."""
    optuna = _optuna()
    state = optuna.trial.TrialState
    stale = study.get_trials(deepcopy=False, states=(state.RUNNING,))
    for t in stale:
        study._storage.set_trial_user_attr(t._trial_id, INTERRUPTED, True)
        study.tell(t.number, state=state.FAIL, skip_if_finished=True)
        study.enqueue_trial(dict(t.params), skip_if_exists=False)
    return len(stale)


def same_params(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two parameter sets are equal (floats compared exactly, as JSON)."""
    return json.dumps(dict(a), sort_keys=True) == json.dumps(dict(b), sort_keys=True)


@dataclass
class TrialOutcome:
    """How a trial ended, as its engine tells the driver."""

    state: str  # "complete", "pruned" or "fail"
    value: float | None = None
    message: str = ""


class Driver:
    """Asks and tells a study on behalf of an engine that runs the trials itself.

    Thread-safe: trials run on several threads report through one lock.
    """

    def __init__(self, study: Study, spec: ir.Tune) -> None:
        self.study = study
        self.spec = spec
        self.lock = threading.Lock()
        self.recovered = recover(study)
        self._space = distributions(spec)
        self._issued = 0

    def remaining(self) -> int:
        """How many more trials to ask for (the budget less the finished and issued ones)."""
        with self.lock:
            return max(budget(self.spec) - finished_count(self.study) - self._issued, 0)

    def ask(self) -> tuple[int, dict[str, Any], float | None]:
        """A new trial: its number, parameters, and the value of an earlier completed
        trial of the study with the same parameters (None: it must run)."""
        optuna = _optuna()
        with self.lock:
            trial = self.study.ask(self._space)
            self._issued += 1
            params = dict(trial.params)
            for t in self.study.get_trials(deepcopy=False,
                                           states=(optuna.trial.TrialState.COMPLETE,)):
                if t.number != trial.number and same_params(t.params, params):
                    return trial.number, params, t.value
            return trial.number, params, None

    def report(self, number: int, step: int, value: float) -> bool:
        """Record an intermediate value of trial ``number``; whether to prune it."""
        optuna = _optuna()
        with self.lock:
            trial = optuna.Trial(self.study, self._trial_id(number))
            trial.report(value, step)
            return bool(trial.should_prune())

    def _trial_id(self, number: int) -> int:
        return int(self.study._storage.get_trial_id_from_study_id_trial_number(
            self.study._study_id, number))

    def tell(self, number: int, outcome: TrialOutcome) -> None:
        """Record how trial ``number`` ended."""
        state = _optuna().trial.TrialState
        with self.lock:
            self._issued -= 1
            if outcome.state == "complete" and outcome.value is not None:
                self.study.tell(number, outcome.value, skip_if_finished=True)
            elif outcome.state == "pruned":
                self.study.tell(number, state=state.PRUNED, skip_if_finished=True)
            else:
                self.study.tell(number, state=state.FAIL, skip_if_finished=True)

    def outputs(self) -> dict[str, str]:
        """The tune step's outputs (see :func:`best_outputs`)."""
        with self.lock:
            return best_outputs(self.study, self.spec)

    def close(self) -> None:
        """Close the study's database connections."""
        with self.lock:
            close_study(self.study)


def trial_values(study: Study) -> list[float]:
    """The objective values of the study's completed trials (in trial order)."""
    state = _optuna().trial.TrialState
    return [float(t.value) for t in study.get_trials(deepcopy=False, states=(state.COMPLETE,))
            if t.value is not None]


def as_json_list(values: Sequence[object]) -> str:
    """A JSON list, as steps print their list outputs."""
    return json.dumps(list(values))
