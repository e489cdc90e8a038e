"""A generated workflow before it is IR: catalog entries, their parameters and order.

Both the offline planner and the LLM path produce a :class:`WorkflowSpec`;
:func:`assemble` turns it into IR, wiring data by entry kind (a ``train`` step reads
the dataset of the ``preprocess`` step it follows, an ``evaluate`` step the model of
its ``train`` step, a ``select`` step the scores of its upstream steps), so a
generator only chooses *what* runs and in which order — never code or file paths.
:func:`parse_spec` reads the JSON form an LLM returns and reports every problem
with the step and field named, which is what the repair loop sends back.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from couler import ir
from couler.errors import Issue, ValidationError
from couler.generate.catalog import CATALOG, DATA, MODELS

__all__ = ["SPEC_SCHEMA", "TUNE_SPACE", "StepSpec", "TuneSpec", "WorkflowSpec", "assemble",
           "parse_spec"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SWEEPABLE = ("learning_rate", "batch_size", "rounds")
_TUNE_SAMPLERS = ("tpe", "random")
#: The search space a tuned train-trial step explores (each swept hyperparameter).
TUNE_SPACE = (
    ir.TuneParam("learning_rate", ir.TuneKind.LOGUNIFORM, 0.01, 1.0),
    ir.TuneParam("batch_size", ir.TuneKind.CHOICE,
                 choices=tuple(ir.Literal.of(v) for v in (16, 32, 64, 128))),
    ir.TuneParam("rounds", ir.TuneKind.INT, 5, 40),
)

# The JSON shape asked of an LLM (also documented in the prompt).
SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "steps"],
    "properties": {
        "name": {"type": "string"},
        "table": {"type": "string"},
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "entry"],
                "properties": {
                    "name": {"type": "string"},
                    "entry": {"enum": sorted(CATALOG)},
                    "params": {"type": "object", "additionalProperties": {"type": "string"}},
                    "after": {"type": "array", "items": {"type": "string"}},
                    "sweep": {
                        "type": "object",
                        "properties": {"param": {"enum": list(_SWEEPABLE)},
                                       "values": {"type": "array"}},
                    },
                    "tune": {
                        "type": "object",
                        "required": ["trials"],
                        "properties": {"trials": {"type": "integer", "minimum": 1},
                                       "parallel": {"type": "integer", "minimum": 1},
                                       "sampler": {"enum": list(_TUNE_SAMPLERS)}},
                    },
                },
            },
        },
    },
}


@dataclass(frozen=True, slots=True)
class TuneSpec:
    """Tune a train-trial step over :data:`TUNE_SPACE` with an optuna study."""

    trials: int
    sampler: str = "tpe"  # "tpe" (Bayesian optimization) or "random" (random search)
    parallel: int = 0  # 0: min(4, trials)


@dataclass(frozen=True, slots=True)
class StepSpec:
    name: str
    entry: str
    params: Mapping[str, str] = field(default_factory=dict)
    after: tuple[str, ...] = ()
    sweep: tuple[str, tuple[str, ...]] | None = None  # (parameter, values)
    tune: TuneSpec | None = None


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    name: str
    steps: tuple[StepSpec, ...]
    table: str = "dataset.csv"
    notes: tuple[str, ...] = ()


def parse_spec(text: str, workflow: str = "generated") -> WorkflowSpec:
    """Parse an LLM's JSON answer (a fenced code block is accepted) into a spec."""
    body = text.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", body, re.DOTALL)
    if fenced is not None:
        body = fenced.group(1).strip()
    issues: list[Issue] = []
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValidationError([Issue(workflow, "", "json", f"not valid JSON: {exc}")]) from exc
    if not isinstance(data, dict):
        raise ValidationError([Issue(workflow, "", "json", "expected a JSON object")])
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        issues.append(Issue(workflow, "", "name",
                            f"{name!r} is not a lowercase DNS-1123 name"))
        name = workflow
    table = data.get("table", "dataset.csv")
    if not isinstance(table, str):
        issues.append(Issue(name, "", "table", "must be a string"))
        table = "dataset.csv"
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        issues.append(Issue(name, "", "steps", "must be a non-empty list"))
        raise ValidationError(issues)
    steps = []
    for i, raw in enumerate(raw_steps):
        where = raw.get("name") if isinstance(raw, dict) else None
        step_name = where if isinstance(where, str) else f"steps[{i}]"
        if not isinstance(raw, dict):
            issues.append(Issue(name, step_name, "", "each step must be an object"))
            continue
        entry = raw.get("entry")
        if entry not in CATALOG:
            issues.append(Issue(name, step_name, "entry",
                                f"{entry!r} is not in the catalog ({', '.join(sorted(CATALOG))})"))
            continue
        params = raw.get("params", {})
        if not isinstance(params, dict) or not all(isinstance(v, (str, int, float))
                                                   for v in params.values()):
            issues.append(Issue(name, step_name, "params", "must map names to values"))
            params = {}
        after = raw.get("after", [])
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            issues.append(Issue(name, step_name, "after", "must be a list of step names"))
            after = []
        sweep = None
        if raw.get("sweep") is not None:
            sw = raw["sweep"]
            values = sw.get("values") if isinstance(sw, dict) else None
            if (not isinstance(sw, dict) or sw.get("param") not in _SWEEPABLE
                    or not isinstance(values, list) or not values):
                issues.append(Issue(name, step_name, "sweep",
                                    f"needs a param in {_SWEEPABLE} and a non-empty values list"))
            else:
                sweep = (str(sw["param"]), tuple(str(v) for v in values))
        tune = None
        if raw.get("tune") is not None:
            tune = _parse_tune(raw["tune"])
            if tune is None:
                issues.append(Issue(name, step_name, "tune",
                                    "needs \"trials\" (a positive integer), optionally "
                                    "\"parallel\" (a positive integer) and \"sampler\" "
                                    f"(one of {', '.join(_TUNE_SAMPLERS)})"))
        steps.append(StepSpec(step_name, str(entry), {k: str(v) for k, v in params.items()},
                              tuple(after), sweep, tune))
    if issues:
        raise ValidationError(issues)
    return WorkflowSpec(name, tuple(steps), table)


def _parse_tune(raw: object) -> TuneSpec | None:
    if not isinstance(raw, dict):
        return None
    trials, parallel = raw.get("trials"), raw.get("parallel", 0)
    sampler = raw.get("sampler", "tpe")
    if (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1
            or isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 0
            or sampler not in _TUNE_SAMPLERS):
        return None
    return TuneSpec(trials, str(sampler), parallel)


def _upstream_of_kind(spec: WorkflowSpec, step: StepSpec, kind: str) -> list[StepSpec]:
    """Steps of catalog kind ``kind`` reachable upstream of ``step`` (nearest first)."""
    by_name = {s.name: s for s in spec.steps}
    found: list[StepSpec] = []
    seen: set[str] = set()
    frontier = list(step.after)
    while frontier:
        nxt: list[str] = []
        for n in frontier:
            if n in seen or n not in by_name:
                continue
            seen.add(n)
            up = by_name[n]
            if CATALOG[up.entry].kind == kind:
                found.append(up)
            nxt.extend(up.after)
        frontier = nxt
    return found


def assemble(spec: WorkflowSpec) -> ir.Workflow:
    """The IR for ``spec``; raises ValidationError naming the step and field."""
    wf = spec.name
    issues: list[Issue] = []
    names = [s.name for s in spec.steps]
    for s in spec.steps:
        if not _NAME.match(s.name):
            issues.append(Issue(wf, s.name, "name", "not a lowercase DNS-1123 name"))
        if names.count(s.name) > 1:
            issues.append(Issue(wf, s.name, "name", "used twice"))
        for a in s.after:
            if a not in names:
                issues.append(Issue(wf, s.name, "after", f"unknown step {a!r}"))
        unknown = sorted(set(s.params) - set(CATALOG[s.entry].params))
        if unknown:
            issues.append(Issue(wf, s.name, "params",
                                f"{', '.join(unknown)} not parameters of {s.entry!r} "
                                f"({', '.join(CATALOG[s.entry].params) or 'none'})"))
        if s.tune is not None and CATALOG[s.entry].kind != "trial":
            issues.append(Issue(wf, s.name, "tune", "only a train-trial step can be tuned"))
        if s.tune is not None and s.sweep is not None:
            issues.append(Issue(wf, s.name, "tune", "a step either sweeps or tunes, not both"))
        model = s.params.get("model")
        if model is not None and model not in MODELS:
            issues.append(Issue(wf, s.name, "params.model",
                                f"{model!r} is not a known model ({', '.join(MODELS)})"))
    if issues:
        raise ValidationError(issues)
    steps = [_build(spec, s, issues) for s in spec.steps]
    if issues:
        raise ValidationError(issues)
    out = ir.Workflow(
        name=wf, steps=tuple(st for st in steps if st is not None),
        parameters=(ir.Parameter("table", default=ir.Literal.of(spec.table),
                                 description="the table to train on (CSV path or URL)"),))
    ir.validate(out)
    return out


def _one(spec: WorkflowSpec, s: StepSpec, kind: str, issues: list[Issue]) -> StepSpec | None:
    ups = _upstream_of_kind(spec, s, kind)
    if not ups:
        issues.append(Issue(spec.name, s.name, "after",
                            f"a {CATALOG[s.entry].kind} step must come after a {kind} step"))
        return None
    return ups[0]


def _build(spec: WorkflowSpec, s: StepSpec, issues: list[Issue]) -> ir.Step | None:
    entry = CATALOG[s.entry]
    params = {**entry.params, **s.params}
    deps = list(dict.fromkeys(s.after))
    if entry.kind == "load":
        return entry.build(
            s.name, ["{{inputs.source}}", f"{DATA}/table.csv"],
            inputs=[ir.InputParameter("source", ir.WorkflowParamRef("table"))],
            output_artifacts=[ir.OutputArtifact("table", f"{DATA}/table.csv")],
            outputs=[ir.OutputParameter("summary", source=ir.OutputSource.STDOUT)], deps=deps)
    if entry.kind == "preprocess":
        load = _one(spec, s, "load", issues)
        if load is None:
            return None
        return entry.build(
            s.name, [f"{DATA}/table.csv", f"{DATA}/dataset.json", params["test_fraction"]],
            input_artifacts=[ir.InputArtifact("table", f"{DATA}/table.csv",
                                              ir.StepArtifactRef(load.name, "table"))],
            output_artifacts=[ir.OutputArtifact("dataset", f"{DATA}/dataset.json")],
            deps=_with(deps, load.name))
    prep = _one(spec, s, "preprocess", issues) if entry.kind in ("train", "trial",
                                                                  "evaluate") else None
    if entry.kind in ("train", "trial", "evaluate") and prep is None:
        return None
    dataset = (ir.InputArtifact("dataset", f"{DATA}/dataset.json",
                                ir.StepArtifactRef(prep.name, "dataset"))
               if prep is not None else None)
    if entry.kind == "train":
        assert dataset is not None and prep is not None
        if s.sweep is not None:
            issues.append(Issue(spec.name, s.name, "sweep", "use the train-trial entry to sweep"))
            return None
        return entry.build(
            s.name, [params["model"], f"{DATA}/dataset.json", f"{DATA}/model.json",
                     params["learning_rate"], params["batch_size"], params["rounds"]],
            input_artifacts=[dataset],
            output_artifacts=[ir.OutputArtifact("model", f"{DATA}/model.json")],
            outputs=[ir.OutputParameter("backend", source=ir.OutputSource.STDOUT)],
            deps=_with(deps, prep.name))
    if entry.kind == "trial":
        assert dataset is not None and prep is not None
        swept = s.sweep[0] if s.sweep is not None else ""
        args = [params["model"], f"{DATA}/dataset.json", "model.json"]
        if s.tune is not None:
            trials = s.tune.trials
            return dataclasses.replace(entry.build(
                s.name, [*args, *(f"{{{{item.{p}}}}}" for p in _SWEEPABLE)],
                input_artifacts=[dataset],
                outputs=[ir.OutputParameter("score", source=ir.OutputSource.STDOUT,
                                            type=ir.ValueType.FLOAT)],
                deps=_with(deps, prep.name)), tune=ir.Tune(
                    space=TUNE_SPACE, objective="score", trials=trials,
                    parallel=s.tune.parallel or min(4, trials),
                    sampler=ir.TuneSampler(s.tune.sampler), seed=0))
        args += ["{{item}}" if p == swept else params[p] for p in _SWEEPABLE]
        foreach = None
        if s.sweep is not None:
            items = []
            for v in s.sweep[1]:
                try:
                    items.append(ir.Literal.of(float(v) if "." in v else int(v)))
                except ValueError:
                    issues.append(Issue(spec.name, s.name, "sweep.values",
                                        f"{v!r} is not a number"))
                    return None
            foreach = ir.ForEach(items=tuple(items))
        return entry.build(
            s.name, args, input_artifacts=[dataset],
            outputs=[ir.OutputParameter("score", source=ir.OutputSource.STDOUT)],
            deps=_with(deps, prep.name), foreach=foreach)
    if entry.kind == "evaluate":
        assert dataset is not None and prep is not None
        train = _one(spec, s, "train", issues)
        if train is None:
            return None
        return entry.build(
            s.name, [f"{DATA}/model.json", f"{DATA}/dataset.json"],
            input_artifacts=[ir.InputArtifact("model", f"{DATA}/model.json",
                                              ir.StepArtifactRef(train.name, "model")), dataset],
            outputs=[ir.OutputParameter("score", source=ir.OutputSource.STDOUT)],
            deps=_with(_with(deps, train.name), prep.name))
    # select: scores of upstream evaluate / trial steps
    scored = [u for u in spec.steps if u.name in s.after
              and CATALOG[u.entry].kind in ("evaluate", "trial")]
    if not scored:
        issues.append(Issue(spec.name, s.name, "after",
                            "a select step must come after evaluate or train-trial steps"))
        return None
    sel_args: list[str] = []
    inputs = []
    for u in scored:
        if u.tune is not None:
            issues.append(Issue(spec.name, s.name, "after",
                                f"{u.name!r} is tuned: it selects its best setting itself "
                                "(outputs best_params, best_value); nothing to select"))
            return None
    for i, u in enumerate(scored):
        label = _label(spec, u)
        if u.sweep is not None:
            sel_args.insert(0, "--labels=[" + ",".join(u.sweep[1]) + "]")
            label = u.sweep[0]
        inputs.append(ir.InputParameter(f"s{i}", ir.StepOutputRef(u.name, "score"),
                                        type=ir.ValueType.JSON if u.sweep else
                                        ir.ValueType.STRING))
        sel_args.append(f"{label}={{{{inputs.s{i}}}}}")
    return entry.build(s.name, sel_args, inputs=inputs,
                       outputs=[ir.OutputParameter("best", source=ir.OutputSource.STDOUT)],
                       deps=deps)


def _label(spec: WorkflowSpec, step: StepSpec) -> str:
    """What a select step calls a scored step: the model it evaluates, else its name."""
    train = _upstream_of_kind(spec, step, "train")
    if CATALOG[step.entry].kind == "evaluate" and train:
        return {**CATALOG["train"].params, **train[0].params}["model"]
    return step.name


def _with(deps: Sequence[str], name: str) -> list[str]:
    return list(deps) if name in deps else [*deps, name]
