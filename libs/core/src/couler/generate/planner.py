"""The deterministic offline planner: common ML requests in plain English → IR.

It serves the generator's API when no LLM endpoint is configured, and it is the
reference the LLM path is tested against. The planner decomposes the request into
sub-tasks (the paper's modular decomposition: data loading, processing, model
training, evaluation, selection), retrieves a catalog entry for each, and wires
them into a workflow; it understands:

* models — XGBoost, LightGBM, logistic regression, random forest (several are
  trained side by side);
* the data — a path or URL ending in .csv/.tsv/.parquet/.json, or an ``s3://``
  URL, becomes the default of the workflow parameter ``table``;
* "evaluate", "compare", "keep the better / best one" — evaluation per model and a
  selection step;
* a sweep — "sweep over batch sizes 16, 32 and 64" (also learning rates, rounds)
  becomes a map of train-and-score trials and a selection of the best setting;
* tuning — "tune it with 20 trials of Bayesian optimization" (or "random search",
  "optuna", "hyperparameter search"; "N trials", default 20) becomes a tune step
  (:func:`couler.tune`) over learning rate, batch size and rounds whose outputs are the
  best setting and its score.

A request it cannot plan raises a UserError saying what it understands; it never
guesses a workflow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field

from couler import ir
from couler.errors import UserError
from couler.generate.catalog import MODELS, model_key
from couler.generate.spec import TUNE_SPACE, StepSpec, TuneSpec, WorkflowSpec, assemble

__all__ = ["GenerationReport", "plan"]

_MODEL_PATTERN = re.compile(
    r"\b(xgboost|xgb|lightgbm|lgbm|light gbm|logistic regression|logistic|logreg|"
    r"random[ -]forest)\b", re.IGNORECASE)
_SOURCE_PATTERN = re.compile(
    r"((?:s3|gs|https?)://\S+|[\w./~-]+\.(?:csv|tsv|parquet|json))", re.IGNORECASE)
_SWEEP_PATTERN = re.compile(
    r"(batch[ _-]?sizes?|learning[ _-]?rates?|rounds)\s*(?:of|=|:|in|over)?\s*"
    r"((?:\d+(?:\.\d+)?(?:\s*(?:,|and|or)\s*)?)+)", re.IGNORECASE)
_SWEEP_PARAM = {"batch": "batch_size", "learning": "learning_rate", "rounds": "rounds"}
_TRIALS_PATTERN = re.compile(r"\b(\d+)\s+(?:trials?|runs?|iterations?|evaluations?)\b",
                             re.IGNORECASE)
_BAYES_PATTERN = re.compile(r"\b(bayes(?:ian)?|tpe|optuna|hyper[- ]?parameter (?:search|"
                            r"optimi[sz]ation|tuning))\b", re.IGNORECASE)
_RANDOM_PATTERN = re.compile(r"\brandom(?:ly)?[- ]search\b", re.IGNORECASE)
_DEFAULT_TRIALS = 20
_DEFAULT_SWEEP = {"batch_size": ["16", "32", "64"], "learning_rate": ["0.1", "0.3", "1.0"],
                  "rounds": ["5", "10", "20"]}


@dataclass(frozen=True, slots=True)
class GenerationReport:
    """How a request became a workflow."""

    subtasks: tuple[str, ...]
    catalog_entries: tuple[str, ...]
    planner: str = "offline"
    notes: tuple[str, ...] = field(default_factory=tuple)
    rounds: int = 0  # LLM repair rounds used (0 offline)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def _models(text: str) -> list[str]:
    found: list[str] = []
    for match in _MODEL_PATTERN.finditer(text):
        key = model_key(match.group(1).replace("-", " "))
        if key is not None and key not in found:
            found.append(key)
    return found


def _sweep(text: str, words: list[str]) -> tuple[str, list[str]] | None:
    match = _SWEEP_PATTERN.search(text)
    if match is not None:
        param = _SWEEP_PARAM[re.split(r"[ _-]", match.group(1).lower())[0]]
        values = re.findall(r"\d+(?:\.\d+)?", match.group(2))
        if param != "learning_rate":
            values = [v for v in values if "." not in v]
        if values:
            return param, values
    if {"sweep", "grid", "tune", "tuning"} & set(words):
        for key, param in _SWEEP_PARAM.items():
            if key in words:
                return param, _DEFAULT_SWEEP[param]
        return "batch_size", _DEFAULT_SWEEP["batch_size"]
    return None


def _tune(text: str, words: list[str]) -> TuneSpec | None:
    """A tuning request: "N trials" with tune/search/optimize wording, or a named method
    (Bayesian optimization, TPE, optuna, random search). None otherwise (a listed sweep
    stays a sweep)."""
    random = _RANDOM_PATTERN.search(text) is not None
    method = random or _BAYES_PATTERN.search(text) is not None
    trials = _TRIALS_PATTERN.search(text)
    tuning = bool({"tune", "tuning", "optimize", "optimise", "search"} & set(words))
    if not method and not (trials and tuning):
        return None
    count = int(trials.group(1)) if trials else _DEFAULT_TRIALS
    return TuneSpec(max(count, 1), "random" if random else "tpe")


def _name(text: str, models: list[str], stem: str) -> str:
    parts = [stem, *models[:3]]
    digest = hashlib.sha256(" ".join(text.split()).lower().encode()).hexdigest()[:6]
    return "-".join([*parts, digest])


def plan(text: str, *, name: str = "") -> tuple[ir.Workflow, GenerationReport]:
    """Turn ``text`` into a validated workflow and a report of how it was built."""
    request = " ".join(text.split())
    if not request:
        raise UserError("generate: the request text is empty")
    words = _words(request)
    models = _models(request)
    tune = _tune(request, words)
    sweep = _sweep(request, words) if tune is None else None
    wants_train = bool(models) or sweep is not None or tune is not None or bool(
        {"train", "fit", "model", "models"} & set(words))
    if not wants_train:
        raise UserError(
            f"generate: cannot plan {request[:80]!r} offline: the offline planner builds "
            "training workflows (load a table, preprocess, train XGBoost / LightGBM / logistic "
            "regression / random forest, evaluate, keep the best, sweep batch sizes or "
            "learning rates); configure an LLM endpoint for other requests")
    notes: list[str] = []
    if not models:
        models = ["logistic" if sweep is not None or tune is not None else "xgboost"]
        notes.append(f"no model named: using {MODELS[models[0]][0]}")
    source_match = _SOURCE_PATTERN.search(request)
    source = source_match.group(1).rstrip(".,;") if source_match else "dataset.csv"
    if source_match is None:
        notes.append("no data source named: parameter 'table' defaults to 'dataset.csv' "
                     "(a synthetic table unless such a file exists); pass -p table=PATH")
    wants_eval = bool({"evaluate", "evaluation", "score", "compare", "accuracy", "test",
                       "validate", "best", "better", "keep", "select", "choose"} & set(words))
    wants_select = bool({"best", "better", "keep", "select", "choose", "winner"} & set(words))
    subtasks = ["load the table", "preprocess: standardise and split"]
    specs = [StepSpec("load-table", "load-table"),
             StepSpec("preprocess", "preprocess", after=("load-table",))]
    if tune is not None:
        model = models[0]
        specs.append(StepSpec("tune", "train-trial", {"model": model}, ("preprocess",),
                              tune=tune))
        method = "random search" if tune.sampler == "random" else \
            "Bayesian optimization (TPE)"
        subtasks += [f"tune {', '.join(p.name for p in TUNE_SPACE)} of {MODELS[model][0]} "
                     f"with {tune.trials} trials of {method}",
                     "keep the best setting (the tune step's best_params)"]
        if len(models) > 1:
            notes.append(f"tuning uses one model: {MODELS[model][0]}")
    elif sweep is not None:
        param, values = sweep
        model = models[0]
        specs.append(StepSpec("sweep", "train-trial", {"model": model}, ("preprocess",),
                              (param, tuple(values))))
        specs.append(StepSpec("select-best", "select-best", after=("sweep",)))
        subtasks += [f"sweep {param} over {', '.join(values)} with {MODELS[model][0]}",
                     f"keep the best {param}"]
        if len(models) > 1:
            notes.append(f"a sweep uses one model: {MODELS[model][0]}")
    else:
        evaluated: list[str] = []
        for model in models:
            specs.append(StepSpec(f"train-{model}", "train", {"model": model}, ("preprocess",)))
            subtasks.append(f"train {MODELS[model][0]}")
            if wants_eval or len(models) > 1:
                specs.append(StepSpec(f"evaluate-{model}", "evaluate", after=(f"train-{model}",)))
                subtasks.append(f"evaluate {MODELS[model][0]}")
                evaluated.append(f"evaluate-{model}")
        if len(evaluated) > 1:
            specs.append(StepSpec("select-best", "select-best", after=tuple(evaluated)))
            subtasks.append("keep the better model" if len(evaluated) == 2 else
                            "keep the best model")
        elif wants_select:
            notes.append("one model: nothing to select between")
    stem = "tune" if tune is not None else "sweep" if sweep is not None else "train"
    spec = WorkflowSpec(name or _name(request, models, stem), tuple(specs), source)
    wf = assemble(spec)
    wf = dataclasses.replace(
        wf, labels=(("couler.io/generated-by", "offline-planner"),),
        annotations=(("couler.io/request", request[:256]),))
    ir.validate(wf)
    entries = tuple(dict.fromkeys(s.entry for s in specs))
    return wf, GenerationReport(tuple(subtasks), entries, notes=tuple(notes))
