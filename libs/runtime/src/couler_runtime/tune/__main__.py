"""``python -m couler_runtime.tune``: the study's steps on engines that run fixed documents.

::

    python -m couler_runtime.tune ask  --study NAME --spec TUNE_JSON --n K \\
        [--params-out FILE] [--trials-out FILE] [--context VALUE ...]
    python -m couler_runtime.tune tell --study NAME --spec TUNE_JSON \\
        --trials '[3, 4]' --values '[0.91, 0.87]' [--context VALUE ...]
    python -m couler_runtime.tune tell ... --trial 3 --value 0.91 --trial 4 --value 0.87
    python -m couler_runtime.tune best --study NAME --spec TUNE_JSON [--out NAME=FILE ...]

``ask`` asks for up to K new trials (fewer when the budget is nearly spent, none when it
is) and prints their parameter sets as a JSON list of objects (also written to
``--params-out``), their trial numbers to ``--trials-out``; with ``--tag-trials`` each set
also holds the trial's number and the study's full name (keys ``couler_trial`` and
``couler_study``), which the trial step reads to report to the study itself (pruning);
with ``--text-params`` each value is written as its text (KFP's map would make ``2`` ``2.0``).
``--slots-out DIR`` (Tekton, whose map cannot select a field of an item) writes one file
per trial slot and parameter instead: ``DIR/tK-pJ`` (parameter ``J`` of the space, as
text), ``DIR/tK-trial`` (the trial's number), ``DIR/tK`` (the set as a JSON object) and
``DIR/study`` (the study's full name); there the round's size is fixed when compiling, so
ask fails (status 1) when the study cannot give exactly ``--n`` trials.
``tell`` records the objective value of each asked trial, in the same order (a value that
is not a number fails its trial; a trial the study has finished already, one pruned while
it ran, is left as it is). ``best`` prints the best trial's outputs (``best_params``,
``best_value``, each parameter by name) as a JSON object and writes those named by
``--out`` to their files. The storage URL is
``--storage`` or the ``COULER_TUNE_STORAGE`` environment variable (from a secret: never in
the document). ``--context`` values (what the trial step reads from upstream) are hashed
into the study's name, so other data makes another study. Exit status 2 for bad usage,
1 when the study cannot be used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from optuna.study import Study

from couler import ir
from couler.optimize.tune import STUDY_KEY, TRIAL_KEY

from . import (
    STORAGE_ENV,
    Driver,
    TrialOutcome,
    best_outputs,
    budget,
    close_study,
    finished_count,
    open_study,
    parse_value,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m couler_runtime.tune",
                                     description="ask, tell or read an optuna study")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("ask", "tell", "best"):
        p = sub.add_parser(name)
        p.add_argument("--study", required=True, help="the study's name")
        p.add_argument("--spec", required=True, help="the tune spec (couler.ir.Tune as JSON)")
        p.add_argument("--storage", default="", help=f"database URL (default ${STORAGE_ENV})")
        p.add_argument("--context", action="append", default=[],
                       help="a value the study's name depends on (repeatable)")
        if name == "ask":
            p.add_argument("--n", type=int, required=True, help="how many trials at most")
            p.add_argument("--params-out", default="", help="write the parameter sets here")
            p.add_argument("--trials-out", default="", help="write the trial numbers here")
            p.add_argument("--tag-trials", action="store_true",
                           help=f"add each trial's number ({TRIAL_KEY}) and the study's name "
                                f"({STUDY_KEY}) to its parameter set, for a trial that "
                                "reports intermediate values to the study itself")
            p.add_argument("--slots-out", default="", metavar="DIR",
                           help="write each trial's parameters, number and the study's name "
                                "to files in DIR (tK-pJ, tK-trial, tK, study), exactly --n "
                                "trials")
            p.add_argument("--text-params", action="store_true",
                           help="write each parameter's value as its text (a string as it "
                                "is, another value as JSON), for an engine whose map would "
                                "turn an integer into a float (KFP: 2 → 2.0)")
        elif name == "tell":
            p.add_argument("--trials", default=None, help="the asked trial numbers (JSON)")
            p.add_argument("--values", default=None,
                           help="their objective values, in order (JSON list)")
            p.add_argument("--trial", action="append", default=[],
                           help="one asked trial's number (repeatable, with --value)")
            p.add_argument("--value", action="append", default=[],
                           help="that trial's objective value, as its text")
        else:
            p.add_argument("--out", action="append", default=[], metavar="NAME=FILE",
                           help="write output NAME to FILE (repeatable)")
    return parser


def _name(study: str, context: Sequence[str]) -> str:
    if not context:
        return study
    digest = hashlib.sha256(json.dumps(list(context)).encode()).hexdigest()[:12]
    return f"{study}.{digest}"


def _write(path: str, text: str) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")


def _list(text: str, what: str) -> list[object]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, str):  # one item's output, or a list rendered twice
        try:
            value = json.loads(value)
        except ValueError:
            value = [value]
    if not isinstance(value, list):
        raise SystemExit(f"tune: --{what} must be a JSON list, got {text[:200]!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status."""
    args = _parser().parse_args(argv)
    storage = args.storage or os.environ.get(STORAGE_ENV, "")
    if not storage:
        print(f"tune: no storage: give --storage or set {STORAGE_ENV}", file=sys.stderr)
        return 2
    try:
        spec = ir.from_json(ir.Tune, args.spec)
    except (ValueError, TypeError, KeyError) as e:
        print(f"tune: --spec is not a tune spec: {e}", file=sys.stderr)
        return 2
    name = _name(args.study, args.context)
    try:
        study = open_study(storage, name, spec)
    except Exception as e:  # a bad URL, an unreachable database: the step fails
        print(f"tune: cannot open study {name!r}: {e}", file=sys.stderr)
        return 1
    try:
        return _run(args, study, spec, name)
    finally:
        close_study(study)


def _run(args: argparse.Namespace, study: Study, spec: ir.Tune, name: str) -> int:
    if args.command == "ask":
        driver = Driver(study, spec)
        n = max(min(args.n, budget(spec) - finished_count(study)), 0)
        if args.slots_out and n != args.n:
            print(f"tune: study {name!r} has {n} trials left of its budget of "
                  f"{budget(spec)}, but this round has {args.n} slots (the study is the "
                  "run's own: was it shared with another run?)", file=sys.stderr)
            return 1
        params: list[dict[str, object]] = []
        numbers: list[int] = []
        for _ in range(n):
            number, p, _known = driver.ask()
            numbers.append(number)
            if args.text_params:
                p = {k: v if isinstance(v, str) else json.dumps(v) for k, v in p.items()}
            if args.tag_trials:
                p = {**p, TRIAL_KEY: number, STUDY_KEY: name}
            params.append(p)
        text = json.dumps(params, sort_keys=True)
        if args.slots_out:
            _write_slots(Path(args.slots_out), spec, params, numbers, name)
        _write(args.params_out, text)
        _write(args.trials_out, json.dumps(numbers))
        print(text)
        return 0
    if args.command == "tell":
        lists = args.trials is not None or args.values is not None
        if lists == bool(args.trial or args.value) or \
                (lists and (args.trials is None or args.values is None)):
            print("tune: tell takes --trials and --values (JSON lists) or --trial and --value "
                  "pairs", file=sys.stderr)
            return 2
        numbers_in: list[object] = list(args.trial)
        values: list[object] = list(args.value)
        if args.trials is not None:
            numbers_in, values = _list(args.trials, "trials"), _list(args.values, "values")
        if len(values) != len(numbers_in):
            print(f"tune: {len(numbers_in)} trials but {len(values)} values", file=sys.stderr)
            return 2
        for trial_no, value in zip(numbers_in, values, strict=True):
            v = parse_value(json.dumps(value) if not isinstance(value, str) else value)
            state = "complete" if v is not None else "fail"
            _tell(study, _number(trial_no), TrialOutcome(state, v))
        print(json.dumps({"told": len(values)}))
        return 0
    try:
        outputs = best_outputs(study, spec)
    except ValueError as e:
        print(f"tune: study {name!r}: {e}", file=sys.stderr)
        return 1
    for target in args.out:
        key, _, path = str(target).partition("=")
        if key not in outputs or not path:
            print(f"tune: --out {target!r}: expected NAME=FILE, NAME one of "
                  f"{sorted(outputs)}", file=sys.stderr)
            return 2
        _write(path, outputs[key])
    print(json.dumps(outputs, sort_keys=True))
    return 0


def _text(value: object) -> str:
    """A parameter's value as a step reads it: a string as it is, another value as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def _write_slots(out: Path, spec: ir.Tune, params: Sequence[dict[str, object]],
                 numbers: Sequence[int], study: str) -> None:
    """The files of ``--slots-out``: each slot's parameters, number and set, the study."""
    for k, (p, number) in enumerate(zip(params, numbers, strict=True)):
        for j, param in enumerate(spec.space):
            _write(str(out / f"t{k}-p{j}"), _text(p[param.name]))
        _write(str(out / f"t{k}-trial"), str(number))
        _write(str(out / f"t{k}"), json.dumps(p, sort_keys=True))
    _write(str(out / "study"), study)


def _number(value: object) -> int:
    """A trial number as the engine passed it back: ``3``, ``"3"`` or ``3.0`` (KFP renders
    a list's numbers as floats)."""
    number = float(str(value))
    if not number.is_integer():
        raise SystemExit(f"tune: --trials: {value!r} is not a trial number")
    return int(number)


def _tell(study: Study, number: int, outcome: TrialOutcome) -> None:
    import optuna

    state = optuna.trial.TrialState
    if outcome.state == "complete" and outcome.value is not None:
        study.tell(number, outcome.value, skip_if_finished=True)
    else:
        study.tell(number, state=state.FAIL, skip_if_finished=True)


if __name__ == "__main__":
    sys.exit(main())
