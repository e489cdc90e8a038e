"""Hyperparameter tuning: ``couler.tune`` and its search-space helpers.

::

    def train(lr, depth):
        return couler.run_script(image="python:3.12", source=fit, args=[lr, depth],
                                 output=couler.create_parameter_artifact("/tmp/auc", "auc"))

    best = couler.tune(train, space={"lr": couler.loguniform(1e-4, 1e-1),
                                     "depth": couler.int_range(2, 8)},
                       trials=20, parallel=4, objective="auc", direction="maximize")
    couler.run_container(image="python:3.12", command=["echo"], args=[best.best_params])

``train`` is called once, with one handle per parameter (by keyword), and must create
exactly one step: its trials are executions of that step, each reading one set of
parameters (``{{item.NAME}}``). The step's ``objective`` output is the value the study
optimizes. The returned :class:`TuneResult` holds the tune step's outputs that later
steps read: ``best_params`` (a JSON object), ``best_value``, and each best parameter
(``best["lr"]``). The IR is :class:`couler.ir.Tune`; the local engine and Ray drive an
optuna study directly, static engines run rounds of ask / trials / tell steps
(:mod:`couler.optimize.tune`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from couler import ir
from couler.api.builder import StepDraft, current_builder
from couler.api.handles import ItemHandle, ParameterOutput, Secret
from couler.errors import UserError

__all__ = ["SpaceParam", "TuneResult", "choice", "int_range", "loguniform", "tune", "uniform"]


@dataclass(frozen=True)
class SpaceParam:
    """One dimension of a search space, named by its key in ``tune(space={...})``."""

    kind: ir.TuneKind
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False
    choices: tuple[object, ...] = ()

    def to_ir(self, name: str) -> ir.TuneParam:
        """The IR parameter called ``name``."""
        try:
            choices = tuple(ir.Literal.of(c) for c in self.choices)
        except (TypeError, ValueError) as e:
            raise UserError(f"tune(): choice values of {name!r} must be JSON-compatible "
                            f"({e})") from e
        return ir.TuneParam(name=name, kind=self.kind, low=self.low, high=self.high,
                            step=self.step, log=self.log, choices=choices)


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{what} must be a number, not {value!r}")
    if not math.isfinite(value):
        raise UserError(f"{what} must be finite, not {value!r}")
    return float(value)


def uniform(low: float, high: float, *, step: float | None = None) -> SpaceParam:
    """A float drawn uniformly from ``[low, high]`` (on a grid of ``step`` when given)."""
    return SpaceParam(ir.TuneKind.UNIFORM, _number(low, "uniform(): low"),
                      _number(high, "uniform(): high"),
                      None if step is None else _number(step, "uniform(): step"))


def loguniform(low: float, high: float) -> SpaceParam:
    """A float in ``[low, high]``, uniform in its logarithm (learning rates, penalties)."""
    return SpaceParam(ir.TuneKind.LOGUNIFORM, _number(low, "loguniform(): low"),
                      _number(high, "loguniform(): high"))


def int_range(low: int, high: int, *, step: int = 1, log: bool = False) -> SpaceParam:
    """An integer in ``[low, high]``, both included, every ``step`` (``log``: log scale)."""
    for what, v in (("low", low), ("high", high), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"int_range(): {what} must be an integer, not {v!r}")
    return SpaceParam(ir.TuneKind.INT, float(low), float(high),
                      None if step == 1 else float(step), log)


def choice(*values: object) -> SpaceParam:
    """One of ``values``: ``choice("adam", "sgd")`` or ``choice(["adam", "sgd"])``."""
    if len(values) == 1 and isinstance(values[0], (list, tuple)):
        values = tuple(values[0])
    return SpaceParam(ir.TuneKind.CHOICE, choices=tuple(values))


class TuneResult:
    """The outputs of a tune step: ``best_params``, ``best_value`` and ``result[NAME]``.

    Each is an output handle like any step output: pass it to later steps as an
    argument, format it into their args, or compare it in a ``when``.
    """

    __slots__ = ("_draft", "_params")

    def __init__(self, draft: StepDraft, params: Mapping[str, ir.ValueType]) -> None:
        self._draft = draft
        self._params = dict(params)

    @property
    def step_name(self) -> str:
        """The tune step's name."""
        return self._draft.name

    @property
    def best_params(self) -> ParameterOutput:
        """The best trial's parameters, a JSON object."""
        return ParameterOutput(self._draft, ir.TUNE_BEST_PARAMS, type=ir.ValueType.JSON)

    @property
    def best_value(self) -> ParameterOutput:
        """The best trial's objective value."""
        return ParameterOutput(self._draft, ir.TUNE_BEST_VALUE, type=ir.ValueType.FLOAT)

    @property
    def params(self) -> dict[str, ParameterOutput]:
        """Each best parameter's output, by name."""
        return {name: ParameterOutput(self._draft, name, type=t)
                for name, t in self._params.items()}

    def __getitem__(self, name: str) -> ParameterOutput:
        if name not in self._params:
            raise KeyError(f"tune step {self._draft.name!r} has no parameter {name!r}; its "
                           f"parameters: {sorted(self._params)}")
        return ParameterOutput(self._draft, name, type=self._params[name])

    def __repr__(self) -> str:
        return f"TuneResult(step={self.step_name!r}, params={sorted(self._params)!r})"


def _enum(kind: type[Any], value: object, what: str) -> Any:
    try:
        return kind(str(value).lower())
    except ValueError:
        known = ", ".join(repr(k.value) for k in kind)
        raise UserError(f"tune(): unknown {what} {value!r}; use one of {known}") from None


def tune(step_fn: Callable[..., Any], space: Mapping[str, SpaceParam], *, trials: int = 20,
         parallel: int = 1, objective: str, direction: str = "maximize",
         sampler: str = "tpe", pruner: str = "median", seed: int | None = None,
         storage: Secret | tuple[str, str] | None = None, image: str = "") -> TuneResult:
    """Tune a step's hyperparameters with an optuna study; its trials run as the step.

    Args:
        step_fn: Creates exactly one step, called with one handle per parameter of
            ``space`` (by keyword); the step reads them like map items.
        space: Parameter name -> :func:`uniform`, :func:`loguniform`,
            :func:`int_range` or :func:`choice`.
        trials: How many trials in all.
        parallel: At most this many trials at once.
        objective: The name of the step output holding the trial's objective value
            (``"result"``: its standard output).
        direction: ``"maximize"`` or ``"minimize"``.
        sampler: ``"tpe"`` (Bayesian optimization), ``"random"``, ``"cmaes"`` or ``"grid"``.
        pruner: ``"median"`` (stop a trial whose reported intermediate values are worse
            than the median of earlier trials at the same step) or ``"none"``.
        seed: Seed of the sampler, for reproducible studies.
        storage: Where engines that run the study in steps of their own (Argo, Tekton,
            Airflow, KFP) find the study's database URL: a secret (its key ``url``) or a
            ``(secret name, key)`` pair. Default: secret ``couler-tune`` key ``url``.
        image: The image of those engines' ask/tell steps (default: one with
            couler-runtime, :data:`couler.optimize.tune.DEFAULT_IMAGE`).

    Returns:
        The tune step's outputs (:class:`TuneResult`).

    Raises:
        UserError: if the space is empty or malformed, ``step_fn`` does not create
            exactly one step, or an option is unknown.
    """
    b = current_builder()
    if not isinstance(space, Mapping) or not space:
        raise UserError(f"workflow {b.workflow_name()!r}: tune(): the search space is empty; "
                        "give space={'name': couler.uniform(...), ...}")
    params: list[ir.TuneParam] = []
    for name, dim in space.items():
        if not isinstance(dim, SpaceParam):
            raise UserError(f"workflow {b.workflow_name()!r}: tune(): space[{name!r}] must be "
                            "couler.uniform, loguniform, int_range or choice, not "
                            f"{dim!r}")
        params.append(dim.to_ir(str(name)))
    for what, v in (("trials", trials), ("parallel", parallel)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"workflow {b.workflow_name()!r}: tune(): {what} must be a "
                            f"positive integer, got {v!r}")
    storage_ref: ir.SecretRef | None
    if storage is None:
        storage_ref = None
    elif isinstance(storage, Secret):
        storage_ref = storage.ref("url")
    elif isinstance(storage, Sequence) and len(storage) == 2:
        storage_ref = ir.SecretRef(str(storage[0]), str(storage[1]))
    else:
        raise UserError(f"workflow {b.workflow_name()!r}: tune(): storage must be a secret "
                        f"or a (secret name, key) pair, not {storage!r}")
    spec_kwargs = {
        "direction": _enum(ir.TuneDirection, direction, "direction"),
        "sampler": _enum(ir.TuneSampler, sampler, "sampler"),
        "pruner": _enum(ir.TunePruner, pruner, "pruner"),
    }
    token = object()
    handles = {p.name: ItemHandle(token, p.name, p.value_type) for p in params}
    with b.atomic():
        with b.map_context(token), b.capture() as frame:
            step_fn(**handles)
        created = [d for d in frame.created if d.scope is b.scope]
        fn_name = getattr(step_fn, "__name__", None) or type(step_fn).__name__
        if len(created) != 1:
            raise UserError(f"workflow {b.workflow_name()!r}: tune() over {fn_name} created "
                            f"{len(created)} steps {[d.name for d in created]}; the function "
                            "must create exactly one step")
        draft = created[0]
        if draft.loop is not None or draft.foreach is not None:
            raise UserError(f"workflow {b.workflow_name()!r}, step {draft.name!r}: a tuned "
                            "step cannot also loop or map")
        if objective == "result" and draft.is_stdout("result"):
            draft.stdout_used = True
            draft.stdout_type = ir.ValueType.FLOAT
        draft.tune = ir.Tune(space=tuple(params), objective=objective, trials=trials,
                             parallel=parallel, seed=seed, storage=storage_ref, image=image,
                             **spec_kwargs)
    return TuneResult(draft, {p.name: p.value_type for p in params})
