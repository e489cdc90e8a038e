"""The offline planner: a parsed request → a :class:`~couler.generate.spec.WorkflowSpec` → IR.

It serves the generator when no LLM endpoint is configured and is what the LLM path is
measured against. :func:`plan` parses the request into sub-tasks
(:mod:`couler.generate.parse`), retrieves a catalog template for each
(:mod:`couler.generate.retrieve`), fills the template's parameters from the clause
(sources and destinations, models, metrics), and wires the steps: stages in order, the
tasks of one stage in parallel, fan-outs, conditions on the metric of the step that
measures it (adding an evaluation step when none does), loops, tuning, resources,
retries, timeouts, a schedule and exit hooks. A step consuming data that no earlier step
produces gets a load step of its own, whose source is the URI the request gave or a
workflow parameter to set at submit time — never made-up data.

It refuses (UserError, naming the part) a request with no action it can place, and
never substitutes a generic workflow for the one asked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from couler import ir
from couler.errors import UserError
from couler.generate.parse import (
    MODEL_WORDS,
    Request,
    Task,
    parse_request,
    stem,
    verb_form,
    words,
)
from couler.generate.retrieve import Retriever
from couler.generate.spec import COMPATIBLE as _COMPATIBLE
from couler.generate.spec import (
    ConditionSpec,
    FanOut,
    LoopSpec,
    StepSpec,
    TuneSpec,
    WorkflowSpec,
    assemble,
)
from couler.generate.templates import Template

__all__ = ["MAX_REQUEST", "GenerationReport", "plan", "plan_spec"]

def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: The retrieval score a clause whose verb is unknown must reach to be planned: at least one
#: keyword of the catalog besides the verb (no category prior is added for it).
_GUESSED_VERB_SCORE = 2.0
#: Longest request the planner reads (characters); longer ones are refused.
MAX_REQUEST = 8000
_STOP_NAME = _wordset("""
a an the of to in on for from with and or by at as into onto over per each every all any
it its this that these those them their they our your is are be using use via than then
also just only both same other new up out off there here after before once until about
across through within without between s whose which what when where while if so some
""")
_URI = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s,;()\"']+|(?<![\w/])(?:~|\.{1,2})?/[\w.@+-]+"
                  r"(?:/[\w.@+-]+)+/?|(?<![\w/])[\w-]+(?:/[\w.-]+)*\.(?:csv|tsv|parquet|"
                  r"jsonl?|zip|tar|gz|txt|xlsx?|avro|orc)\b", re.I)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+\w")
_CHANNEL = re.compile(r"#[\w-]+")
_SOURCE_PARAMS = ("source", "url", "uri", "path", "input", "query", "table", "location")
_TARGET_PARAMS = ("target", "destination", "dest", "output", "sink", "url", "webhook",
                  "channel", "to", "recipient", "endpoint", "registry", "table", "index")
_MODEL_PARAMS = ("model", "estimator", "base_model", "model_name", "checkpoint", "algorithm")


@dataclass(frozen=True, slots=True)
class GenerationReport:
    """How a request became a workflow (``couler generate --explain`` prints it)."""

    subtasks: tuple[str, ...]
    catalog_entries: tuple[str, ...]
    planner: str = "offline"
    notes: tuple[str, ...] = field(default_factory=tuple)
    rounds: int = 0  # LLM repair rounds used (0 offline)
    choices: tuple[str, ...] = field(default_factory=tuple)


def _templates() -> Mapping[str, Template]:
    from couler.generate.library import TEMPLATES

    return TEMPLATES


def plan(text: str, *, name: str = "",
         templates: Mapping[str, Template] | None = None) -> tuple[ir.Workflow, GenerationReport]:
    """Turn ``text`` into a validated workflow and a report of how it was built."""
    catalog = templates if templates is not None else _templates()
    spec, report = plan_spec(text, name=name, templates=catalog)
    return assemble(spec, catalog), report


def _refuse_text(text: str) -> str:
    request = " ".join(text.split())
    if not request:
        raise UserError("generate: the request text is empty")
    if len(request) > MAX_REQUEST:
        raise UserError(f"generate: the request is {len(request)} characters; the planner reads "
                        f"at most {MAX_REQUEST} (describe the workflow in fewer words)")
    letters = [c for c in request if c.isalpha()]
    if letters and sum(c.isascii() for c in letters) / len(letters) < 0.6:
        raise UserError("generate: the request does not look like English; the offline planner "
                        "reads English requests (configure an LLM endpoint for other languages)")
    return request


def plan_spec(text: str, *, name: str = "", templates: Mapping[str, Template]
              ) -> tuple[WorkflowSpec, GenerationReport]:
    """The spec for ``text`` and the report (see :func:`plan`)."""
    request = _refuse_text(text)
    parsed = parse_request(request)
    main = [t for t in parsed.tasks if not t.hook]
    if not main:
        found = "; ".join(parsed.context[:3]) or request[:120]
        raise UserError(
            f"generate: cannot plan {request[:80]!r}: found no step to run (an action such as "
            f"train, evaluate, load, deploy or notify) in: {found!r}")
    if parsed.unplaced:
        raise UserError("generate: cannot plan part of the request: "
                        + "; ".join(repr(u) for u in parsed.unplaced)
                        + " (a condition whose action is not a step the planner knows)")
    builder = _Builder(parsed, Retriever(templates), templates)
    spec = builder.build(name or _workflow_name(request, main))
    report = GenerationReport(
        subtasks=tuple(builder.subtasks), catalog_entries=tuple(
            dict.fromkeys(s.template for s in (*spec.steps, *spec.on_failure, *spec.on_exit,
                                               *spec.on_success) if s.template)),
        notes=tuple(builder.notes), choices=tuple(builder.choices))
    return spec, report


def _workflow_name(request: str, tasks: list[Task]) -> str:
    base = _slug(" ".join([tasks[0].verb, *_salient(tasks[0].obj)[:2]]), 40) or "generated"
    digest = hashlib.sha256(request.lower().encode()).hexdigest()[:6]
    return f"{base}-{digest}"


def _slug(text: str, limit: int = 50) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].rstrip("-")


def _salient(text: str) -> list[str]:
    """The words that name what a clause works on, tool names first kept in order."""
    out = []
    def short(m: re.Match[str]) -> str:
        parts = [re.sub(r"\.\w+$", "", p) for p in re.split(r"[/:]+", m.group(0)) if p]
        named = [p for p in parts if re.search(r"[a-zA-Z]{3}", p)
                 and p.lower() not in ("s3", "gs", "http", "https", "sample", "file", "www")]
        return f" {named[-1]} " if named else " "

    for w in re.findall(r"[A-Za-z0-9][\w@.+-]*", re.sub(_URI, short, text)):
        low = w.lower().strip(".-")
        if low in _STOP_NAME or len(low) < 2 or low.isdigit():
            continue
        out.append(low)
    return out


@dataclass(slots=True)
class _Step:
    """A step while it is built (the spec's StepSpec is frozen)."""

    task: Task
    name: str
    template: Template
    params: dict[str, str]
    after: list[str] = field(default_factory=list)
    when: ConditionSpec | None = None
    loop: LoopSpec | None = None
    tune: TuneSpec | None = None


class _Builder:
    def __init__(self, parsed: Request, retriever: Retriever,
                 templates: Mapping[str, Template]) -> None:
        self.parsed = parsed
        self.retriever = retriever
        self.templates = templates
        self.names: set[str] = set()
        self.parameters: dict[str, str] = {}
        self.subtasks: list[str] = []
        self.notes: list[str] = list(parsed.notes)
        self.choices: list[str] = []
        self.sources = list(parsed.sources)
        self.data = list(parsed.data)
        self.measured: dict[tuple[str, str, str], _Step] = {}  # condition -> its metric step
        # (a check of the data, the step that runs only if it passes)
        self.data_checks: list[tuple[_Step, _Step]] = []
        self.loads: dict[str, _Step] = {}  # source -> its load step
        self.splits: dict[str, _Step] = {}  # load step -> the split after it

    # -- names and templates

    def _name(self, task: Task, prefix: str = "") -> str:
        words_ = _salient(task.obj)
        base = _slug(" ".join([prefix or task.verb, *words_[:4]]), 48) or _slug(task.verb)
        name, n = base, 2
        while name in self.names:
            name = f"{base[:45]}-{n}"
            n += 1
        self.names.add(name)
        return name

    def _pick(self, task: Task, category: str = "", produces: str = "",
              available: frozenset[str] | None = None) -> Template:
        """The best template for ``task``; with ``available``, one whose required inputs
        are among those kinds."""
        # an exit hook reads nothing from the steps: only templates that need no input
        def allow(t: Template) -> bool:
            needs = set(t.consumes) - set(t.optional)
            return ((not task.hook or not needs)
                    and (not produces or produces in t.produces)
                    and (available is None or needs <= available))

        # the clause's verb and object: its modifiers (GPUs, retries, "in 8 chunks") and
        # the sentence's heading do not say which template does the work
        models = " ".join(task.items) if _model_items(task) else ""
        hits = self.retriever.search(f"{task.verb} {task.obj} {models}", verb=task.verb,
                                     category=category, allow=allow)
        template = hits[0][0]
        others = ", ".join(f"{t.name} {score:.1f}" for t, score in hits[1:3])
        self.choices.append(f"{task.verb} {task.obj.strip()[:60]!r} -> {template.name} "
                            f"({hits[0][1]:.1f}; next: {others or 'none'})")
        return template

    # -- parameters

    def _params(self, task: Task, template: Template, step_name: str) -> dict[str, str]:
        text = task.text
        uris = _URI.findall(text) + _EMAIL.findall(text)
        params: dict[str, str] = {}
        names = [p.name for p in template.params]
        into = re.search(r"\b(?:to|into|onto|in)\s+(?:the\s+)?(.+)$", task.obj, re.I)
        source_uri = next((u for u in uris if re.search(r"\b(?:from|at|in)\s+" + re.escape(u),
                                                         text)), uris[0] if uris else "")
        target_uri = next((u for u in uris if u != source_uri or template.category == "deliver"),
                          "")
        for p in template.params:
            low = p.name.lower()
            value = ""
            if template.category == "ingest" and low in _SOURCE_PARAMS and not params.get(
                    "source-set"):
                value = source_uri or (self.sources.pop(0) if self.sources else "")
                if value:
                    params["source-set"] = "1"
            elif template.category == "deliver" and low in _TARGET_PARAMS:
                channel = _CHANNEL.search(text)
                email = _EMAIL.search(text)
                if low == "channel" and channel:
                    value = channel.group(0)
                elif low in ("to", "recipient") and email:
                    value = email.group(0)
                elif target_uri and low in ("target", "destination", "url", "uri", "dest",
                                            "endpoint", "webhook", "output", "sink"):
                    value = target_uri
                elif into is not None and low in ("target", "destination", "dest", "registry",
                                                  "table", "index", "sink"):
                    value = _trim(into.group(1))
            elif low in _MODEL_PARAMS and _model_items(task):
                value = "{{item}}"  # "for each of the five models (forest, …)": each copy's
            elif low in _MODEL_PARAMS:
                tool = _tool(task, template)
                if tool:
                    value = tool
            elif low == "metric" and template.category == "evaluate":
                metric = _metric_word(text, template)
                if metric:
                    value = metric
            elif low in ("stat", "where", "column") and "stat" in names and "where" in names:
                value = _table_stat(text).get(low, "")
            elif low in ("shards", "parts", "n", "num_shards", "chunks") and task.shards:
                value = str(task.shards)
            if value:
                params[p.name] = value
            elif p.default is None:
                # the request did not say: a workflow parameter set at submit time
                pname = _slug(f"{step_name}-{p.name}", 60)
                self.parameters[pname] = ""
                params[p.name] = f"{{{{parameters.{pname}}}}}"
                self.notes.append(f"step {step_name}: the request gives no {p.name} "
                                  f"({p.description or 'required'}); set -p {pname}=VALUE")
        params.pop("source-set", None)
        return {k: v for k, v in params.items() if k in names}

    # -- the workflow

    def build(self, name: str) -> WorkflowSpec:
        parsed = self.parsed
        stages: dict[int, list[_Step]] = {}
        order: list[int] = []
        hooks: dict[str, list[_Step]] = {"failure": [], "exit": [], "success": []}
        built: list[_Step] = []
        for task in _expand_named(parsed.tasks):
            if not verb_form(task.verb) and task.verb not in ("run",):
                # a word read as a verb only by its place ("book a flight"): planned only
                # when the catalog has a step about what it names
                best = self.retriever.search(f"{task.verb} {task.obj}")[0]
                if best[1] < _GUESSED_VERB_SCORE and any(
                        verb_form(t.verb) for t in parsed.tasks if t is not task):
                    # an action among ML steps that no template does ("draft the launch
                    # memo"): a command the user gives at submit time
                    self.notes.append(f"{task.text.strip()[:80]!r}: no catalog step does "
                                      "that; planned as a command to run")
                    task.obj, task.verb = f"{task.verb} {task.obj}", "run"
                elif best[1] < _GUESSED_VERB_SCORE:
                    raise UserError(f"generate: cannot plan {task.text.strip()[:100]!r}: no "
                                    "catalog step does that (the catalog covers data loading, "
                                    "processing, training, evaluation and delivery of ML work)")
            if task.items:
                # each copy works on one item: the step's text names the item, not the list
                task.text, task.obj = _one_item(task.text, task.items), _one_item(task.obj,
                                                                                  task.items)
            template = self._pick(task)
            step = _Step(task, self._name(task), template, {})
            step.params = self._params(task, template, step.name)
            self.subtasks.append(_describe(task, template))
            if task.hook:
                hooks[task.hook].append(step)
                continue
            if task.stage not in stages:
                stages[task.stage] = []
                order.append(task.stage)
            stages[task.stage].append(step)
            built.append(step)
        # wire stages in order; a condition's else branch shares its stage
        previous: list[_Step] = []
        extra: list[_Step] = []
        for stage in order:
            group = self._per_model(stages[stage], previous, built)
            for step in group:
                if not step.after or not any(a in {m.name for m in previous}
                                             for a in step.after):
                    step.after = [p.name for p in previous]
            for step in group:
                if step.task.condition is not None:
                    evaluator = self._condition(step, built, previous, extra)
                    chained = [p.name for p in previous if p.task.condition is not None
                               and p.task.condition.metric == step.task.condition.metric
                               and p.task.condition.value == step.task.condition.value
                               and p.task.condition.otherwise == step.task.condition.otherwise]
                    if evaluator is not None and chained:
                        # "if …, canary it; watch the errors; then promote": the steps
                        # under one condition run one after another
                        step.after = [*chained, evaluator.name]
                    elif evaluator is not None and evaluator.name not in step.after:
                        step.after = [evaluator.name]
                if step.task.unconditional:
                    # "either way": after the step the condition reads, not the branches
                    conditional = next((s for s in group if s.when is not None), None)
                    if conditional is not None and conditional.when is not None:
                        step.after = [conditional.when.step]
            # later stages follow every unconditional step here, and the branches
            previous = group
        self._implicit_loads(built, extra)
        by_name = {s.name: s for s in (*built, *extra)}
        for check, step in self.data_checks:
            # the check reads the data the step it guards reads
            if any("data" in u.template.produces for u in _upstream(check, by_name)):
                continue
            source = next((u for u in _upstream(step, by_name) if u is not check
                           and "data" in u.template.produces
                           and check not in _upstream(u, by_name)), None)
            if source is not None:
                check.after = [*check.after, source.name]
        for step in built:
            if step.when is not None and step.when.step in by_name:
                # the measuring step's template may have changed to one that can run here
                metric = by_name[step.when.step].template.metric
                if metric and metric != step.when.metric:
                    step.when = dataclasses.replace(step.when, metric=metric)
            self._loop_and_tune(step)
        self._align_metrics([*built, *extra])
        steps = [self._spec(s) for s in self._ordered(built, extra)]
        hook_specs = {k: tuple(self._spec(s, hook=True) for s in v) for k, v in hooks.items()}
        return WorkflowSpec(
            name=name, steps=tuple(steps), schedule=parsed.schedule, timezone=parsed.timezone,
            timeout_seconds=parsed.timeout, parameters=dict(self.parameters),
            on_failure=hook_specs["failure"], on_success=hook_specs["success"],
            on_exit=hook_specs["exit"], request=parsed.text)

    def _per_model(self, group: list[_Step], previous: list[_Step],
                   built: list[_Step]) -> list[_Step]:
        """A step that reads one model, after several parallel models ("evaluate both"),
        as one copy per model, each after its own."""
        models = [p for p in previous if "model" in p.template.produces]
        if len(models) < 2:
            return group
        out: list[_Step] = []
        for step in group:
            t = step.template
            if "model" not in t.consumes or "model" in t.optional or step.task.items:
                out.append(step)
                continue
            index = built.index(step)
            built.remove(step)
            self.names.discard(step.name)
            for k, model in enumerate(models):
                task = dataclasses.replace(step.task, text=f"{step.task.text} ({model.task.obj})")
                copy = _Step(task, self._name(dataclasses.replace(
                    task, obj=f"{step.task.obj} {model.task.obj}")), t, dict(step.params))
                copy.after = [model.name]
                built.insert(index + k, copy)
                out.append(copy)
        return out

    def _align_metrics(self, steps: list[_Step]) -> None:
        """A step ranking reports ("keep the better one") ranks by the metric its
        evaluations report; when it names one ("the better AUC"), they measure that."""
        by_name = {s.name: s for s in steps}
        by_metric = {t.metric: t for t in self.templates.values()
                     if t.category == "evaluate" and t.metric and "model" in t.consumes}
        for step in steps:
            if "report" not in step.template.consumes or step.template.param("metric") is None:
                continue
            evaluations = [by_name[a] for a in step.after if a in by_name
                           and by_name[a].template.category == "evaluate"
                           and by_name[a].template.metric]
            if not evaluations:
                continue
            named = _metric_word(step.task.text, step.template)
            wanted = by_metric.get(named.replace("-", "_")) if named else None
            for evaluation in evaluations:
                if wanted is not None and evaluation.template.metric != wanted.metric and \
                        set(wanted.consumes) <= set(evaluation.template.consumes):
                    evaluation.template = wanted
                    evaluation.params = self._params(evaluation.task, wanted, evaluation.name)
            metrics = {e.template.metric for e in evaluations}
            if len(metrics) == 1:
                step.params["metric"] = metrics.pop()
            else:
                self.notes.append(f"step {step.name}: its inputs report different metrics "
                                  f"({', '.join(sorted(metrics))}); it ranks by "
                                  f"{step.params.get('metric', 'its default')}")

    def _ordered(self, built: list[_Step], extra: list[_Step]) -> list[_Step]:
        """Steps with every inserted step placed before its first dependant."""
        out: list[_Step] = []
        placed: set[str] = set()
        pending = {s.name: s for s in extra}

        def place(s: _Step) -> None:
            for a in s.after:
                if a in pending and a not in placed:
                    place(pending[a])
            if s.name not in placed:
                placed.add(s.name)
                out.append(s)

        for s in built:
            place(s)
        for s in extra:
            place(s)
        return out

    def _condition(self, step: _Step, built: list[_Step], previous: list[_Step],
                   extra: list[_Step]) -> _Step | None:
        """Point ``step``'s condition at the step that measures its metric."""
        cond = step.task.condition
        assert cond is not None
        metric_words = {stem(w) for w in words(cond.metric)} - {"it", "its", "the", "model"}
        key = (cond.metric, cond.op, cond.value)
        measured = self.measured.get(key)
        index = built.index(step)
        candidates = [s for s in built[:index] if s.template.metric]
        if measured is None:
            # the step that reports it: named like the metric, else the latest that measures
            def says(s: _Step) -> bool:
                have = {stem(w) for w in words(f"{s.task.text} {s.template.metric}")}
                return bool(metric_words & have)

            measured = next((s for s in reversed(candidates) if says(s)), None)
            if measured is None and candidates and any(c in previous for c in candidates):
                measured = candidates[-1]
        if measured is None and _about_data(cond.metric):
            # "unless the validation step reports a null-label rate above 0.02, fine-tune
            # …": a property of the data the step reads, measured before the step
            task = Task(f"measure {cond.metric}", "measure", cond.metric, step.task.stage)
            template = self._pick(task, category="evaluate", available=frozenset({"data"}))
            if template.metric:
                measured = _Step(task, self._name(task, "measure"), template, {},
                                 [p.name for p in previous])
                measured.params = self._params(task, template, measured.name)
                extra.append(measured)
                self.data_checks.append((measured, step))
                self.subtasks.append(_describe(task, template) + " (added: the condition "
                                     "needs a measured value, of the data)")
        if measured is None:
            # nothing reports the metric: measure it after the step it is about
            earlier = built[:index]
            about = next((s for s in reversed(earlier)
                          if metric_words & {stem(w) for w in words(s.task.text)}), None)
            about = about or (previous[-1] if previous else None)
            if about is None:
                return None
            task = Task(f"measure {cond.metric}", "evaluate", cond.metric, about.task.stage)
            reach = [about, *_upstream(about, {s.name: s for s in built + extra})]
            produced = {k for u in reach for k in u.template.produces}
            template = self._pick(task, category="evaluate", available=frozenset(
                produced | {"data", "predictions"}))
            if not template.metric:
                self.notes.append(f"step {step.name}: no catalog template measures "
                                  f"{cond.metric!r}; the condition cannot be checked")
                return None
            measured = _Step(task, self._name(task, "evaluate"), template, {}, [about.name])
            measured.params = self._params(task, template, measured.name)
            extra.append(measured)
            self.subtasks.append(_describe(task, template) + " (added: the condition "
                                 "needs a measured value)")
        self.measured[key] = measured
        value = cond.value
        if not value:
            pname = _slug(f"baseline-{cond.metric}", 60)
            self.parameters[pname] = ""
            value = f"parameters.{pname}"
            self.notes.append(f"step {step.name}: compared with a baseline the request does "
                              f"not give; set -p {pname}=VALUE")
        step.when = ConditionSpec(measured.name, measured.template.metric, cond.op, value,
                                  cond.otherwise)
        return measured

    def _implicit_loads(self, built: list[_Step], extra: list[_Step]) -> None:
        """Give each step what it consumes and no earlier step produces: a load step for
        data, a fetch step for a model, an evaluation for a report."""
        by_name = {s.name: s for s in (*built, *extra)}
        for step in list(built):
            self._feasible(step, _upstream(step, by_name))
            for kind in step.template.consumes:
                if kind in step.template.optional:
                    continue
                upstream = _upstream(step, by_name)
                if any(kind in u.template.produces or
                       any(c in u.template.produces for c in _COMPATIBLE.get(kind, ()))
                       for u in upstream):
                    continue
                if kind == "report":
                    added = self._evaluations_for(step, upstream, by_name)
                    if added:
                        extra.extend(added)
                        by_name.update((a.name, a) for a in added)
                        # after the measurements, and still after the steps before it
                        step.after = list(dict.fromkeys([*step.after, *(a.name for a in added)]))
                        continue
                if kind == "report":
                    continue  # assemble names what is missing
                if kind in ("data", "predictions"):
                    load = self._data_for(step, extra, by_name)
                else:
                    load = self._fetch_model(step)
                    extra.append(load)
                    by_name[load.name] = load
                step.after = [*step.after, load.name]

    def _feasible(self, step: _Step, upstream: list[_Step]) -> None:
        """Pick another template for ``step`` when what it must read cannot be had: a
        report with no model upstream to measure, a model where no step trains one."""
        produced = {k for u in upstream for k in u.template.produces}
        available = frozenset(produced | {"data", "predictions"} | (
            {"report"} if "model" in produced else set()))
        needs = set(step.template.consumes) - set(step.template.optional)
        if needs <= available | {"model"} and not ("model" in needs and "model" not in produced
                                                   and step.template.category == "evaluate"):
            return
        before = step.template.name
        step.template = self._pick(step.task, category=step.template.category,
                                   available=available - ({"model"} - produced))
        step.params = self._params(step.task, step.template, step.name)
        self.notes.append(f"step {step.name}: {before} needs what no earlier step makes; "
                          f"using {step.template.name}")

    def _evaluations_for(self, step: _Step, upstream: list[_Step],
                         by_name: Mapping[str, _Step]) -> list[_Step]:
        """Evaluation steps after the models ``step`` compares (one per model)."""
        models = [u for u in upstream if "model" in u.template.produces]
        if not models:
            return []
        nearest = [m for m in models if m.name in step.after] or models[:1]
        metric = _metric_word(step.task.text, step.template) or "accuracy"
        out = []
        for model in nearest:
            task = Task(f"evaluate {metric} of {model.task.obj.strip()}", "evaluate",
                        f"{metric} {model.task.obj.strip()}", model.task.stage,
                        items=model.task.items, max_parallel=model.task.max_parallel)
            template = self._pick(task, category="evaluate")
            name = self._name(Task(task.text, "evaluate", f"{metric} {model.name}", 0), "evaluate")
            evaluation = _Step(task, name, template, {}, [model.name])
            evaluation.params = self._params(task, template, name)
            self._rows_for(evaluation, model, upstream, by_name)
            out.append(evaluation)
            self.subtasks.append(_describe(task, template) + f" (added: {step.name} compares "
                                 "measured models)")
        return out

    @staticmethod
    def _rows_for(evaluation: _Step, model: _Step, upstream: list[_Step],
                  by_name: Mapping[str, _Step]) -> None:
        """An evaluation measures rows: when nothing before its model makes any (a fetched
        model), it also runs after the nearest step before ``upstream``'s owner that does."""
        wants = set(evaluation.template.consumes) & {"data", "predictions"}
        if not wants or any(wants & set(u.template.produces)
                            for u in [model, *_upstream(model, by_name)]):
            return
        rows = next((u for u in upstream if u is not model and wants & set(u.template.produces)),
                    None)
        if rows is not None:
            evaluation.after.append(rows.name)

    def _data_for(self, step: _Step, extra: list[_Step], by_name: dict[str, _Step]) -> _Step:
        """The step ``step`` reads its data from: a load (one per source), and for training
        a train/test split after it, so evaluations later measure held-out rows."""
        load = self._load_for(step)
        key = " ".join(load.params.get(p, "") for p in sorted(load.params)) or load.task.obj
        if key in self.loads:
            self.names.discard(load.name)
            self.subtasks.pop()
            load = self.loads[key]
        else:
            self.loads[key] = load
            extra.append(load)
            by_name[load.name] = load
        if step.template.category != "train":
            return load
        split = self.splits.get(load.name)
        if split is None:
            task = Task(f"split {load.task.obj} into train and test", "split",
                        f"{load.task.obj}", load.task.stage)
            template = self._pick(task, category="process")
            split = _Step(task, self._name(task, "split"), template, {}, [load.name])
            split.params = self._params(task, template, split.name)
            self.splits[load.name] = split
            extra.append(split)
            by_name[split.name] = split
            self.subtasks.append(_describe(task, template) + " (added: held-out rows for "
                                 "evaluation)")
        return split

    def _fetch_model(self, step: _Step) -> _Step:
        about = re.split(r"\b(?:with|using|and|to|into|then|on)\b", step.task.obj)[0].strip()
        task = Task(f"fetch model {about}", "fetch", f"model {about}", step.task.stage)
        template = self._pick(task, category="ingest", produces="model")
        fetch = _Step(task, self._name(task, "fetch"), template, {})
        fetch.params = self._params(task, template, fetch.name)
        self.subtasks.append(_describe(task, template) + f" (added: {step.name} needs a model)")
        return fetch

    def _load_for(self, step: _Step) -> _Step:
        source = next(iter(_URI.findall(step.task.text)), "") or (
            self.sources.pop(0) if self.sources else "")
        obj = step.task.obj.replace("{{item}}", " ")
        # the data a clause names: what follows "on" / "from" / "in" ("train X on the
        # retinal scan masks"), else its object
        named = re.search(r"\b(?:on|from|in|over|using)\s+(?:the\s+|our\s+|all\s+)?(.+)$", obj)
        about = (named.group(1) if named else obj)
        about = re.split(r"\b(?:with|using|and|to|into|then|for)\b", about)[0].strip(" ,.")
        if not source and self.data:
            # a sentence said where the data is ("the data comes from the loans table in
            # Redshift"): the load reads it
            about = self.data.pop(0)
        task = Task(f"load {about} {source}".strip(), "load", about or source, step.task.stage)
        template = self._pick(task, category="ingest", produces="data")
        load = _Step(task, self._name(task, "load"), template, {})
        load.params = self._params(task, template, load.name)
        self.subtasks.append(_describe(task, template) + f" (added: {step.name} needs data)")
        return load

    def _loop_and_tune(self, step: _Step) -> None:
        task = step.task
        if task.loop_max:
            until = task.loop_until
            if step.template.metric and until is not None and until.value:
                step.loop = LoopSpec(task.loop_max, step.template.metric, until.op, until.value)
            else:
                why = (f"{step.template.name!r} reports no metric to stop on"
                       if not step.template.metric else "the request names no value to reach")
                self.notes.append(f"step {step.name}: runs {task.loop_max} times ({why})")
                step.loop = LoopSpec(task.loop_max)
        if task.tune_trials:
            space = _space(step.template)
            if step.template.metric and space:
                step.tune = TuneSpec(task.tune_trials, space, task.tune_sampler or "tpe",
                                     direction=_direction(step.template.metric))
            else:
                self.notes.append(f"step {step.name}: {step.template.name!r} has no metric or "
                                  "hyperparameters to tune; runs once")

    def _spec(self, s: _Step, hook: bool = False) -> StepSpec:
        t = s.task
        foreach = FanOut(t.items, t.max_parallel) if t.items and not hook else None
        return StepSpec(
            name=s.name, template=s.template.name, params=s.params, task=t.text,
            after=() if hook else tuple(dict.fromkeys(s.after)), retries=t.retries,
            timeout_seconds=t.timeout, cpu=t.cpu, memory=t.memory,
            gpu=t.gpu or (1 if s.template.gpu and t.gpu == 0 and _asks_gpu(t) else 0),
            when=s.when, foreach=foreach, tune=s.tune, loop=s.loop)


#: A list of at most this many names without a limit on concurrency becomes one step per
#: name (named after it); longer lists, counts and limited ones stay a fan-out.
_NAMED_COPIES = 8


def _expand_named(tasks: list[Task]) -> list[Task]:
    """Tasks over a short list of names ("for the web and mobile surfaces") as one task per
    name, each naming its own; others as they are."""
    out: list[Task] = []
    for task in tasks:
        named = task.items and not any(re.fullmatch(r"[\w-]*\d+", i) for i in task.items)
        if not named or len(task.items) > _NAMED_COPIES or task.max_parallel or task.hook:
            out.append(task)
            continue
        for item in task.items:
            copy = dataclasses.replace(task, items=())
            copy.text = _one_item(task.text, task.items).replace("{{item}}", item)
            copy.obj = _one_item(task.obj, task.items).replace("{{item}}", item)
            if item.lower() not in copy.obj.lower():
                copy.obj = f"{copy.obj} {item}"
            out.append(copy)
    return out


_DATA_WORDS = re.compile(r"\b(?:nulls?|missing|duplicates?|duplicated|schema|invalid|empty|"
                         r"nans?|row\s+count|rows|records|freshness|stale|malformed|"
                         r"(?:data|input)\s+(?:quality|validation|check))\b", re.I)
_MODEL_METRICS = re.compile(r"\b(?:auc|f1|accuracy|precision|recall|rmse|mae|mape|loss|"
                            r"perplexity|wer|bleu|ndcg|map|latency|drift)\b", re.I)


def _about_data(metric: str) -> bool:
    """Whether a condition's metric is a property of data ("a null-label rate", "the
    number of duplicate rows"), not of a model."""
    return bool(_DATA_WORDS.search(metric)) and not _MODEL_METRICS.search(metric)


def _table_stat(text: str) -> dict[str, str]:
    """measure-table's statistic for a metric: "a null-label rate" is the share of rows
    whose label is null; "the p99 latency" a percentile; otherwise a row count."""
    rate = re.search(r"\b(?:rate|share|fraction|percent(?:age)?|ratio|proportion)\b|%", text, re.I)
    generic = ("the", "a", "an", "any", "of", "values", "value", "rows", "data", "rate", "share")
    column = ""
    for pattern in (r"\b(?:nulls?|missing|empty|nan)[\s-]+([a-z]\w*)",
                    r"\b([a-z]\w*)[\s-]+(?:is\s+|are\s+)?(?:nulls?|missing|empty)\b"):
        column = next((m.group(1) for m in re.finditer(pattern, text, re.I)
                       if m.group(1).lower() not in generic), "")
        if column:
            break
    if column:
        return {"stat": "share" if rate else "count", "where": f"{column}.isnull()"}
    percentile = re.search(r"\bp(\d{2}(?:\.\d+)?)\s+(?:of\s+(?:the\s+)?)?([a-z]\w*)", text, re.I)
    if percentile is not None:
        return {"stat": f"p{percentile.group(1)}", "column": percentile.group(2)}
    return {}


def _model_items(task: Task) -> bool:
    """Whether ``task`` fans out over models it names ("random forest, SVM and k-nearest
    neighbors"): each copy trains or uses its own."""
    return bool(task.items) and all(
        MODEL_WORDS.search(i) or re.search(r"\b(?:neighbou?rs|nb|bayes|boosting|ols|"
                                           r"perceptron|[a-z]+net)\b", i, re.I)
        for i in task.items)


def _one_item(text: str, items: tuple[str, ...]) -> str:
    """``text`` with the list of ``items`` it names replaced by ``{{item}}``."""
    alternatives = "|".join(re.escape(i) for i in sorted(items, key=len, reverse=True))
    one = rf"(?:{alternatives})"
    pattern = rf"\b{one}(?:\s*,\s*(?:and\s+|or\s+)?{one}|\s+(?:and|or)\s+{one})*\b"
    return re.sub(pattern, "{{item}}", text, flags=re.I)


def _asks_gpu(task: Task) -> bool:
    return bool(re.search(r"\bgpus?\b|\bcuda\b", task.text, re.I))


def _upstream(step: _Step, by_name: Mapping[str, _Step]) -> list[_Step]:
    seen: set[str] = set()
    out: list[_Step] = []
    frontier = list(step.after) + ([step.when.step] if step.when else [])
    while frontier:
        n = frontier.pop()
        if n in seen or n not in by_name:
            continue
        seen.add(n)
        out.append(by_name[n])
        frontier.extend(by_name[n].after)
    return out


def _trim(text: str) -> str:
    text = re.split(r"\s+(?:for|with|using|as|so|because|before|after|every|each)\s+", text)[0]
    return text.strip(" ,.")[:120]


_TOOL_WORD = re.compile(r"\b([A-Z][\w.+/-]*\d[\w.+/-]*|[A-Za-z]*[A-Z][a-z]*[A-Z][\w.+/-]*|"
                        r"[A-Z]{2,}[\w.+/-]*|[a-z]+\d[\w.+/-]*)(?:\s+(?:\d+[BbMm]|large-v\d|"
                        r"small|base|large))?")


def _tool(task: Task, template: Template) -> str:
    """The model or tool a clause names ("YOLOv8", "XLM-RoBERTa", "random forest")."""
    known = {k.lower() for k in template.keywords}
    for m in _TOOL_WORD.finditer(task.obj):
        word = m.group(0)
        if word.lower() in ("gpu", "gpus", "csv", "s3", "api", "ml", "llm", "id"):
            continue
        return word
    lowered = task.obj.lower()
    for k in sorted(known, key=len, reverse=True):
        if len(k) > 3 and re.search(r"\b" + re.escape(k) + r"\b", lowered):
            return k
    return ""


def _metric_word(text: str, template: Template) -> str:
    m = re.search(r"\b(auc|roc[- ]auc|f1|accuracy|precision|recall|rmse|mae|mape|wape|smape|"
                  r"perplexity|wer|cer|bleu|rouge[- ]?l?|ndcg(?:@\d+)?|map(?:@\d+)?|"
                  r"hit[- ]rate(?:\s+at\s+\d+)?|top[- ]?\d+|log[- ]?loss|iou|mean iou|r2|"
                  r"calibration|ece|brier)\b", text, re.I)
    return m.group(1).lower() if m else ""


def _direction(metric: str) -> str:
    lower_better = ("rmse", "mae", "mape", "wape", "loss", "error", "perplexity", "wer", "cer",
                    "brier", "ece")
    return "minimize" if any(k in metric.lower() for k in lower_better) else "maximize"


# Typical ranges of common hyperparameters, used when a request asks to tune a template.
_RANGES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("0.001", "0.3"), "lr": ("0.0001", "0.1"),
    "max_depth": ("2", "10"), "depth": ("2", "10"), "num_leaves": ("8", "128"),
    "n_estimators": ("50", "500"), "iterations": ("100", "1000"), "epochs": ("1", "10"),
    "batch_size": ("16", "32", "64", "128"), "alpha": ("0.0001", "10"), "C": ("0.01", "100"),
    "min_child_samples": ("5", "100"), "subsample": ("0.5", "1.0"),
}


def _space(template: Template) -> dict[str, tuple[str, ...]]:
    # the catalog spells parameters with "-" (learning-rate), the table with "_"
    return {p.name: _RANGES[key] for p in template.params
            if (key := p.name.replace("-", "_")) in _RANGES}


def _describe(task: Task, template: Template) -> str:
    bits = [f"{task.verb} {task.obj.strip()}"[:100], f"-> {template.name}"]
    if task.items:
        bits.append(f"for each of {len(task.items)} ({', '.join(task.items[:4])}"
                    f"{', ...' if len(task.items) > 4 else ''})")
    if task.condition is not None:
        c = task.condition
        word = "unless" if c.otherwise else "if"
        bits.append(f"{word} {c.metric} {c.op} {c.value or 'baseline'}")
    for label, value in (("gpu", task.gpu), ("memory", task.memory), ("retries", task.retries),
                         ("timeout", f"{task.timeout}s" if task.timeout else ""),
                         ("at most in parallel", task.max_parallel),
                         ("on", task.hook)):
        if value:
            bits.append(f"{label} {value}")
    return " ".join(str(b) for b in bits)

