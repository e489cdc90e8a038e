"""Tune steps (:class:`couler.ir.Tune`): the study's name, and the rewrite for static engines.

The local engine and Ray drive an optuna study themselves. An engine that runs a fixed
document (Argo, Airflow, KFP) cannot: :func:`expand_tune` rewrites each tune step, a pure IR
rewrite, into ``ceil(budget / parallel)`` rounds of

* ``STEP-ask-R``: ``python -m couler_runtime.tune ask`` asks the study for up to
  ``parallel`` trials and writes their parameter sets (a JSON list of objects, output
  ``params``) and their trial numbers (output ``trials``);
* ``STEP-R``: the trial step, mapped over ``params`` (each trial reads its parameters as
  ``{{item.NAME}}``, as it does everywhere), ``parallel`` at once;
* ``STEP-tell-R``: ``python -m couler_runtime.tune tell`` tells the study the trials'
  objective values (the map's ``objective`` output, a JSON list in item order);

then ``STEP`` itself -- the name later steps already read -- runs
``python -m couler_runtime.tune best``, whose outputs are the tune step's
(:func:`couler.ir.tune_outputs`). The study's name also holds the run
(``{{workflow.uid}}``: Argo's workflow uid, Airflow's run id), so a retried run resumes its
study and another run starts its own; a round whose ask finds the budget spent (a retried
run whose trials had all finished) maps over nothing. The steps find the study's database URL
in the environment variable ``COULER_TUNE_STORAGE``, from the secret the tune step names
(``Tune.storage``, default secret ``couler-tune`` key ``url``): never a literal in the
document.

**Pruning.** Nothing watches a running trial on a static engine, so with a pruner the trial
reports to the study itself: the ask step tags each parameter set with the trial's number
and the study's name (``couler_trial``, ``couler_study``), and the trial step gets them as
``COULER_TUNE_TRIAL`` and ``COULER_TUNE_STUDY``, the storage secret as
``COULER_TUNE_STORAGE`` and the path of its objective output (when it is a file) as
``COULER_TUNE_OBJECTIVE``. ``couler_runtime.tune.report(step, value)`` in the trial then
records the value in the study and asks the pruner; a pruned trial is told PRUNED, leaves
``pruned`` as its objective and exits 0 (its round goes on; the tell step leaves finished
trials as they are). The trial's image needs ``couler-runtime`` for this; a trial that
never reports is never pruned.

**Slots** (``slots=True``, Tekton). An engine whose map cannot select a field of an item
from an upstream list (a Tekton matrix over an array result gives each trial one string)
gets each round as ``STEP-R-K`` steps instead of one map: slot ``K`` of round ``R`` reads
its parameters from the ask step's outputs ``tK-pJ`` (parameter ``J`` of the space, as
text) and, when pruning, its trial number ``tK-trial`` and the study's name ``study``;
the tell step reads the slots' objectives one by one (``--trial N --value V`` pairs). How
many trials a round asks for is known when compiling (``parallel``, the rest of the budget
in the last round), and ask is told to give exactly that many (``--slots-out``): the study
is the run's own (its name holds the run's uid), so anything else is an error, not a
shorter round.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence

from couler import ir

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_STORAGE_SECRET",
    "STUDY_KEY",
    "TRIAL_KEY",
    "budget",
    "expand_tune",
    "grid_size",
    "has_tune",
    "round_sizes",
    "rounds",
    "slot_output",
    "spec_digest",
    "study_name",
]

# The ask/tell/best steps need Python with couler-runtime (and so optuna): the submitter
# service's image has both (deploy/k8s, services/submitter/Dockerfile).
DEFAULT_IMAGE = "ghcr.io/couler-dev/couler-submitter:0.2.0"
DEFAULT_STORAGE_SECRET = ir.SecretRef("couler-tune", "url")
_OUT_DIR = "/tmp/couler-tune"
_SLOTS_DIR = f"{_OUT_DIR}/slots"  # three levels deep: an engine mapping paths maps it too
#: The keys a tagged parameter set holds besides the parameters (see "Pruning" above).
TRIAL_KEY = "couler_trial"
STUDY_KEY = "couler_study"


def spec_digest(step: ir.Step, context: Sequence[str] = ()) -> str:
    """A digest of what determines a tune step's trials: its tuning spec (not where the
    study is stored), the trial step's definition and ``context`` (e.g. the values it
    reads from upstream steps, known when it runs)."""
    assert step.tune is not None
    spec = dataclasses.replace(step.tune, storage=None, image="")
    trial = dataclasses.replace(step, tune=None, name="", dependencies=(), depends=None,
                                when=None, retry=None, timeout_seconds=None, resources=None,
                                priority=None)
    material = {"tune": ir.to_dict(spec), "step": ir.to_dict(trial), "context": list(context)}
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def study_name(workflow: str, step: ir.Step, context: Sequence[str] = ()) -> str:
    """The name of a tune step's study: ``<workflow>.<step>.<digest>`` (see
    :func:`spec_digest`), the same in every run with the same spec and context."""
    return f"{workflow}.{step.name}.{spec_digest(step, context)[:16]}"


def grid_size(spec: ir.Tune) -> int:
    """How many points a grid over ``spec``'s space has (each parameter discrete: a
    choice, an int range, or a uniform range with a step)."""
    size = 1
    for p in spec.space:
        if p.kind is ir.TuneKind.CHOICE:
            size *= len(p.choices)
        elif p.kind is ir.TuneKind.INT:
            size *= len(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
        else:
            width = p.step or (p.high - p.low) or 1.0
            size *= math.floor((p.high - p.low) / width + 1e-9) + 1
    return size


def budget(spec: ir.Tune) -> int:
    """How many trials the study runs: ``trials``, at most the grid for the grid sampler."""
    if spec.sampler is ir.TuneSampler.GRID:
        return min(spec.trials, grid_size(spec))
    return spec.trials


def rounds(spec: ir.Tune) -> int:
    """How many ask/trials/tell rounds a static engine compiles for ``spec``."""
    return max(math.ceil(budget(spec) / spec.parallel), 1)


def round_sizes(spec: ir.Tune) -> list[int]:
    """How many trials each round asks for: ``parallel``, the rest of the budget last."""
    total = budget(spec)
    return [min(spec.parallel, total - r * spec.parallel) for r in range(rounds(spec))] \
        if total else [0]


def slot_output(slot: int, what: str) -> str:
    """The ask step's output holding ``what`` for trial slot ``slot`` (slots mode):
    ``tK-pJ`` (parameter ``J`` of the space, as text), ``tK-trial`` (the trial's number),
    ``tK`` (the whole parameter set as a JSON object) for ``what`` = ``pJ``, ``trial``,
    ``""``."""
    return f"t{slot}-{what}" if what else f"t{slot}"


def has_tune(wf: ir.Workflow) -> bool:
    """Whether any step of ``wf`` (exit hooks and inline sub-workflows included) tunes."""
    steps = [*wf.steps, *(s for h in wf.exit_hooks for s in h.steps)]
    return any(s.tune is not None for s in ir.all_steps(steps))


def _context_inputs(step: ir.Step) -> tuple[ir.InputParameter, ...]:
    """The trial step's inputs that are not trial parameters: they enter the study's name
    at run time (the values it reads from upstream steps and workflow parameters)."""
    return tuple(dataclasses.replace(i, name=f"ctx-{n}", type=ir.ValueType.STRING)
                 for n, i in enumerate(i for i in step.inputs
                                       if not isinstance(i.value, ir.ItemRef)))


def _tool(step: ir.Step, name: str, command: str, args: Sequence[str], *,
          inputs: Sequence[ir.InputParameter], outputs: Sequence[ir.OutputParameter],
          deps: Sequence[str], wf_name: str) -> ir.Step:
    """One step running ``python -m couler_runtime.tune COMMAND`` for ``step``'s study."""
    assert step.tune is not None
    spec = step.tune
    context = _context_inputs(step)
    # the run: a retry of the run (same uid) resumes its study, another run has its own
    ctx_args: list[str] = ["--context", "{{workflow.uid}}"]
    for c in context:
        ctx_args += ["--context", f"{{{{inputs.{c.name}}}}}"]
    spec_json = ir.to_json(dataclasses.replace(spec, storage=None, image=""))
    edges = _edges(step, deps)
    base = ["-m", "couler_runtime.tune", command, "--study",
            study_name(wf_name, step), "--spec", spec_json, *ctx_args]
    return ir.Step(
        name=name,
        body=ir.ContainerSpec(image=spec.image or DEFAULT_IMAGE, command=("python",),
                              args=(*base, *args)),
        template=f"{step.template or step.name}-{command}",
        inputs=(*context, *inputs),
        outputs=tuple(outputs),
        env=(ir.EnvVar("COULER_TUNE_STORAGE", secret=spec.storage or DEFAULT_STORAGE_SECRET),),
        dependencies=edges[0], depends=edges[1], when=edges[2],
        node_selector=step.node_selector,
        tolerations=step.tolerations,
        cache=ir.CachePolicy(enabled=False),  # it reads and writes the study
        labels=step.labels,
    )


def _edges(step: ir.Step, own: Sequence[str]
           ) -> tuple[tuple[ir.Dependency, ...], ir.DependsExpr | None, ir.When | None]:
    """The edges of a step of the rewrite: the tune step's own (every such step may read
    what the trial step reads, and keeps its when) and those to ``own`` steps of the
    rewrite."""
    mine = [d for d in own if all(d != u.step for u in step.dependencies)]
    deps = (*step.dependencies, *(ir.Dependency(d) for d in mine))
    depends: ir.DependsExpr | None = None
    if step.depends is not None:
        depends = ir.DependsAll((step.depends, *(ir.DependsTerm(d) for d in mine))) \
            if mine else step.depends
    return deps, depends, step.when


def _reporting_env(step: ir.Step) -> tuple[ir.EnvVar, ...]:
    """What a trial step needs to report to its study itself (see "Pruning" above)."""
    assert step.tune is not None
    env = [ir.EnvVar("COULER_TUNE_STUDY", f"{{{{item.{STUDY_KEY}}}}}"),
           ir.EnvVar("COULER_TUNE_TRIAL", f"{{{{item.{TRIAL_KEY}}}}}"),
           ir.EnvVar("COULER_TUNE_STORAGE",
                     secret=step.tune.storage or DEFAULT_STORAGE_SECRET)]
    objective = next((o for o in step.outputs if o.name == step.tune.objective), None)
    if objective is not None and objective.source is ir.OutputSource.PATH:
        env.append(ir.EnvVar("COULER_TUNE_OBJECTIVE", objective.selector))
    return tuple(env)


def _expand_step(wf_name: str, step: ir.Step, prune: bool, text: bool) -> list[ir.Step]:
    spec = step.tune
    assert spec is not None
    trial = dataclasses.replace(step, tune=None)
    prunes = prune and spec.pruner is not ir.TunePruner.NONE
    if prunes:
        trial = dataclasses.replace(trial, env=(*trial.env, *_reporting_env(step)))
    steps: list[ir.Step] = []
    prev: list[str] = []
    for r in range(rounds(spec)):
        ask, mapped, tell = f"{step.name}-ask-{r}", f"{step.name}-{r}", f"{step.name}-tell-{r}"
        steps.append(_tool(
            step, ask, "ask",
            ["--n", str(spec.parallel), "--params-out", f"{_OUT_DIR}/params.json",
             "--trials-out", f"{_OUT_DIR}/trials.json", *(["--tag-trials"] if prunes else []),
             *(["--text-params"] if text else [])],
            inputs=(),
            outputs=(ir.OutputParameter("params", ir.OutputSource.PATH,
                                        f"{_OUT_DIR}/params.json", ir.ValueType.LIST),
                     ir.OutputParameter("trials", ir.OutputSource.PATH,
                                        f"{_OUT_DIR}/trials.json", ir.ValueType.LIST)),
            deps=prev, wf_name=wf_name))
        edges = _edges(step, [ask])
        steps.append(dataclasses.replace(
            trial, name=mapped, dependencies=edges[0], depends=edges[1], when=edges[2],
            foreach=ir.ForEach(source=ir.StepOutputRef(ask, "params"),
                               parallelism=spec.parallel)))
        steps.append(_tool(
            step, tell, "tell",
            ["--trials", "{{inputs.trials}}", "--values", "{{inputs.values}}"],
            inputs=(ir.InputParameter("trials", ir.StepOutputRef(ask, "trials"),
                                      ir.ValueType.LIST),
                    ir.InputParameter("values", ir.StepOutputRef(mapped, spec.objective),
                                      ir.ValueType.JSON)),
            outputs=(), deps=[ask, mapped], wf_name=wf_name))
        prev = [tell]
    steps.append(_best(step, prev, wf_name))
    return steps


_ITEM = re.compile(r"\{\{\s*item(?:\.([^}\s]*))?\s*\}\}")


def _map_texts(value: object, fn: Callable[[str], str]) -> object:
    """``value`` (a step body, an env var) with ``fn`` applied to every string in it."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(_map_texts(v, fn) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _map_texts(getattr(value, f.name), fn)
                   for f in dataclasses.fields(value)
                   if isinstance(getattr(value, f.name), (str, tuple))}
        return dataclasses.replace(value, **changes)
    return value


def _slot_trial(step: ir.Step, trial: ir.Step, ask: str, slot: int, prunes: bool
                ) -> tuple[ir.Step, set[str]]:
    """Slot ``slot`` of a round: ``trial`` reading its parameters from ``ask``'s slot
    outputs instead of a map item; also the ask outputs it reads."""
    spec = step.tune
    assert spec is not None
    index = {p.name: j for j, p in enumerate(spec.space)}
    used: set[str] = set()

    def source(key: str) -> ir.StepOutputRef:
        out = slot_output(slot, f"p{index[key]}" if key else "")
        used.add(out)
        return ir.StepOutputRef(ask, out)

    inputs = [dataclasses.replace(i, value=source(i.value.key))
              if isinstance(i.value, ir.ItemRef) else i for i in trial.inputs]
    extra: dict[str, ir.InputParameter] = {}

    def text(s: str) -> str:
        def sub(m: re.Match[str]) -> str:
            key = m.group(1) or ""
            name = f"tune-p{index[key]}" if key else "tune-params"
            if name not in extra:
                extra[name] = ir.InputParameter(name, source(key), ir.ValueType.STRING)
            return f"{{{{inputs.{name}}}}}"
        return _ITEM.sub(sub, s) if "{{" in s else s

    body = _map_texts(trial.body, text)
    env = tuple(_map_texts(e, text) for e in trial.env)
    if prunes:
        for name, out in (("tune-trial", slot_output(slot, "trial")), ("tune-study", "study")):
            used.add(out)
            extra[name] = ir.InputParameter(name, ir.StepOutputRef(ask, out),
                                            ir.ValueType.STRING)
        own = ("COULER_TUNE_TRIAL", "COULER_TUNE_STUDY")
        env = (*env, *(e for e in _reporting_env(step) if e.name not in own),
               ir.EnvVar("COULER_TUNE_STUDY", "{{inputs.tune-study}}"),
               ir.EnvVar("COULER_TUNE_TRIAL", "{{inputs.tune-trial}}"))
    return dataclasses.replace(trial, body=body, env=env,  # type: ignore[arg-type]
                               inputs=(*inputs, *extra.values())), used


def _slot_type(spec: ir.Tune, output: str) -> ir.ValueType:
    """The type of an ask step's slot output (see :func:`slot_output`)."""
    what = output.partition("-")[2]
    if what.startswith("p"):
        return spec.space[int(what[1:])].value_type
    return {"trial": ir.ValueType.INT, "": ir.ValueType.JSON}.get(what, ir.ValueType.STRING)


def _expand_slots(wf_name: str, step: ir.Step, prune: bool) -> list[ir.Step]:
    spec = step.tune
    assert spec is not None
    trial = dataclasses.replace(step, tune=None)
    prunes = prune and spec.pruner is not ir.TunePruner.NONE
    steps: list[ir.Step] = []
    prev: list[str] = []
    for r, size in enumerate(round_sizes(spec)):
        if size == 0:
            break
        ask, tell = f"{step.name}-ask-{r}", f"{step.name}-tell-{r}"
        slots = [_slot_trial(step, trial, ask, k, prunes) for k in range(size)]
        used = sorted({o for _, outs in slots for o in outs} | {
            slot_output(k, "trial") for k in range(size)})
        steps.append(_tool(
            step, ask, "ask",
            ["--n", str(size), "--slots-out", _SLOTS_DIR],
            inputs=(),
            outputs=tuple(ir.OutputParameter(o, ir.OutputSource.PATH, f"{_SLOTS_DIR}/{o}",
                                             _slot_type(spec, o)) for o in used),
            deps=prev, wf_name=wf_name))
        names = []
        for k, (slot, _) in enumerate(slots):
            name = f"{step.name}-{r}-{k}"
            names.append(name)
            edges = _edges(step, [ask])
            steps.append(dataclasses.replace(slot, name=name, dependencies=edges[0],
                                             depends=edges[1], when=edges[2]))
        pairs = [a for k in range(size)
                 for a in ("--trial", f"{{{{inputs.trial-{k}}}}}",
                           "--value", f"{{{{inputs.value-{k}}}}}")]
        steps.append(_tool(
            step, tell, "tell", pairs,
            inputs=(*(ir.InputParameter(f"trial-{k}",
                                        ir.StepOutputRef(ask, slot_output(k, "trial")),
                                        ir.ValueType.STRING) for k in range(size)),
                    *(ir.InputParameter(f"value-{k}", ir.StepOutputRef(n, spec.objective),
                                        ir.ValueType.STRING) for k, n in enumerate(names))),
            outputs=(), deps=[ask, *names], wf_name=wf_name))
        prev = [tell]
    steps.append(_best(step, prev, wf_name))
    return steps


def _best(step: ir.Step, prev: Sequence[str], wf_name: str) -> ir.Step:
    """The tune step itself after its rounds: the study's best trial's outputs."""
    assert step.tune is not None
    outputs = ir.tune_outputs(step.tune)
    out_args = [arg for o in outputs for arg in ("--out", f"{o.name}={o.selector}")]
    return dataclasses.replace(
        _tool(step, step.name, "best", out_args, inputs=(), outputs=outputs, deps=prev,
              wf_name=wf_name),
        template=step.template or step.name)


def expand_tune(wf: ir.Workflow, *, prune: bool = True, text: bool = False,
                slots: bool = False) -> ir.Workflow:
    """``wf`` with every top-level tune step rewritten into ask/trials/tell rounds and a
    best step of the same name (see the module docstring); ``wf`` itself when it has
    none. Pure: the study is reached only when the rewritten steps run.

    ``prune=False`` compiles no pruning, for an engine that cannot set a trial's
    environment from its item (KFP sets literal values only): the trial is not told its
    study and trial number, so ``couler_runtime.tune.report`` is a no-op in it and every
    trial runs to its end. ``text=True`` has the ask step write each parameter's value as
    its text (``--text-params``), for an engine whose map turns an integer item field
    into a float (KFP). ``slots=True`` unrolls each round's trials into one step per
    trial reading the ask step's per-slot outputs (see "Slots" above), for an engine whose
    map cannot select a field of an upstream item (Tekton)."""
    if not any(s.tune is not None for s in wf.steps):
        return wf
    steps: list[ir.Step] = []
    for step in wf.steps:
        if step.tune is None:
            steps.append(step)
        else:
            steps.extend(_expand_slots(wf.name, step, prune) if slots
                         else _expand_step(wf.name, step, prune, text))
    return dataclasses.replace(wf, steps=tuple(steps))
