"""Helpers of the KFP compiler: the kfp import, names, the step wrapper script, schedules."""

from __future__ import annotations

import importlib
import importlib.util
import keyword
import os
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from couler import ir
from couler.compilers import entrypoint
from couler.compilers.kube import memory_levels
from couler.engines.base import Feature
from couler.errors import UnsupportedFeatureError, UserError

from ._capabilities import _NO_DEPENDS_NOTE, ENGINE

LOCAL_DIR_ENV = "COULER_KFP_LOCAL_DIR"
LOCAL_SECRETS_ENV = "COULER_KFP_LOCAL_SECRETS"  # local mode: {"SECRET/KEY": value} as JSON

_PLACEHOLDER = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")
_INTERPRETER = {
    ir.ScriptLanguage.PYTHON: ("python",),
    ir.ScriptLanguage.BASH: ("bash",),
    ir.ScriptLanguage.SH: ("sh",),
}
_ORDERING = {ir.CompareOp.GT, ir.CompareOp.LT, ir.CompareOp.GE, ir.CompareOp.LE}
_PY_TYPE: dict[ir.ValueType, type] = {
    ir.ValueType.STRING: str,
    ir.ValueType.INT: int,
    ir.ValueType.FLOAT: float,
    ir.ValueType.BOOL: bool,
    ir.ValueType.LIST: list,
    ir.ValueType.JSON: str,
}


# --------------------------------------------------------------------------- kfp import


def _import(module: str) -> Any:
    """Import a kfp module lazily, typed ``Any`` (kfp is not in the main environment)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(
            "compiling for Kubeflow Pipelines needs the kfp SDK, which is not installed in "
            f"this environment ({exc}); install kfp (requirements-kfp.txt) or use .venv-kfp "
            "(create it with scripts/setup-engine-venv.sh kfp)") from exc


def recurring_schedule(wf: ir.Workflow) -> dict[str, Any] | None:
    """The KFP recurring-run settings of ``wf``'s cron schedule (None without one).

    ``{"cron": six-field cron, "max_concurrency": int, "enabled": bool}``; KFP's cron
    (robfig/cron) has a seconds field first and runs in UTC.

    Raises:
        couler.errors.UnsupportedFeatureError: a schedule setting KFP cannot express.
    """
    sched = wf.schedule
    if sched is None:
        return None

    def refuse(detail: str) -> UnsupportedFeatureError:
        return UnsupportedFeatureError(ENGINE, wf.name, "", Feature.CRON.value, detail)

    if sched.timezone not in ("", "UTC", "Etc/UTC"):
        raise refuse(f"time zone {sched.timezone!r}: KFP recurring runs follow UTC")
    if sched.concurrency_policy is ir.ConcurrencyPolicy.REPLACE:
        raise refuse("concurrency policy Replace: a KFP recurring run cannot stop the "
                     "previous run (max_concurrency only bounds)")
    if sched.starting_deadline_seconds is not None:
        raise refuse("a starting deadline: a KFP recurring run catches up every missed "
                     "interval or none (no_catchup)")
    if sched.successful_history_limit is not None or sched.failed_history_limit is not None:
        raise refuse("history limits: KFP keeps every run of a recurring run")
    fields = sched.schedule.split()
    if sched.schedule.startswith("@"):
        cron = sched.schedule
    elif len(fields) == 5:
        cron = "0 " + " ".join(fields)
    else:
        raise refuse(f"cron schedule {sched.schedule!r}: expected five fields")
    allow = sched.concurrency_policy is ir.ConcurrencyPolicy.ALLOW
    return {"cron": cron, "max_concurrency": 10 if allow else 1, "enabled": not sched.suspend}


# --------------------------------------------------------------------------- helpers


def _log_name(step: str) -> str:
    """A step's name in local-mode log file names ("/" of inner steps is not a file name)."""
    return step.replace("/", "~")


def _artifact_sources(step: ir.Step) -> set[str]:
    """The steps whose output artifacts ``step`` reads."""
    return {a.source.step for a in step.input_artifacts
            if isinstance(a.source, ir.StepArtifactRef)}


def _mount_rewriter(step: ir.Step, root: str) -> Callable[[str], str]:
    """Local mode: map each mount path (and what is below it) to ``root/VOLUME[/SUB]``,
    a host directory shared by the run's steps (as the local engine does)."""
    mounts = sorted(step.volume_mounts, key=lambda m: -len(m.mount_path))
    if not mounts:
        return lambda text: text
    pattern = re.compile("|".join(f"(?<![\\w/.]){re.escape(m.mount_path.rstrip('/'))}(?![\\w.-])"
                                  for m in mounts))
    hosts = {m.mount_path.rstrip("/"): os.path.join(root, m.name, m.sub_path).rstrip("/")
             for m in mounts}
    return lambda text: pattern.sub(lambda match: hosts[match.group(0)], text)


def _ident(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name) or "p"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = "p_" + base
    ident, n = base, 1
    while ident in taken:
        n += 1
        ident = f"{base}_{n}"
    taken.add(ident)
    return ident


def _static_key(key: str) -> str:
    """A static item's key as a KFP loop sub-variable (a Python identifier)."""
    ident = re.sub(r"\W", "_", key)
    return ident if ident.isidentifier() and not keyword.iskeyword(ident) else f"k_{ident}"


def _item_text(value: object) -> object:
    if isinstance(value, dict):
        return {_static_key(str(k)): ir.Literal.of(v).text for k, v in value.items()}
    return ir.Literal.of(value).text


_NO_DEPENDS = _NO_DEPENDS_NOTE
_EDGE_REFUSED = {
    ir.EdgeCondition.ERRORED: "KFP's task final status does not tell a platform error from "
                              "the command's own failure",
    ir.EdgeCondition.SKIPPED: "a task inside a dsl.If reports no status to tasks outside it",
    ir.EdgeCondition.OMITTED: "KFP runs no task after an upstream that was not run",
    ir.EdgeCondition.ANY_SUCCEEDED: "a ParallelFor reports no per-item outcomes to a task "
                                    "after it",
    ir.EdgeCondition.ALL_FAILED: "a ParallelFor reports no per-item outcomes to a task "
                                 "after it",
}

_SWAPPED = {
    ir.CompareOp.EQ: ir.CompareOp.EQ, ir.CompareOp.NE: ir.CompareOp.NE,
    ir.CompareOp.GT: ir.CompareOp.LT, ir.CompareOp.LT: ir.CompareOp.GT,
    ir.CompareOp.GE: ir.CompareOp.LE, ir.CompareOp.LE: ir.CompareOp.GE,
}

_COMPARE: dict[ir.CompareOp, Callable[[Any, Any], Any]] = {
    ir.CompareOp.EQ: lambda a, b: a == b,
    ir.CompareOp.NE: lambda a, b: a != b,
    ir.CompareOp.GT: lambda a, b: a > b,
    ir.CompareOp.LT: lambda a, b: a < b,
    ir.CompareOp.GE: lambda a, b: a >= b,
    ir.CompareOp.LE: lambda a, b: a <= b,
}


def _compare(left: Any, op: ir.CompareOp, right: Any) -> Any:
    return _COMPARE[op](left, right)


def _is_channel(value: object) -> bool:
    return isinstance(value, _import("kfp.dsl.pipeline_channel").PipelineChannel)


def _annotation_src(annotation: Any) -> str:
    origin = getattr(annotation, "__metadata__", None)  # dsl.Input / dsl.Output[Artifact]
    if origin:
        kind = "Output" if "output" in repr(origin).lower() else "Input"
        return f"dsl.{kind}[dsl.Artifact]"
    if isinstance(annotation, type):
        builtin = annotation.__module__ == "builtins"
        return annotation.__name__ if builtin else f"dsl.{annotation.__name__}"
    inner = getattr(annotation, "type", str)
    return f"dsl.OutputPath({getattr(inner, '__name__', 'str')})"


def _ladder_levels(retry: ir.RetryPolicy | None, res: ir.Resources | None
                   ) -> list[dict[str, Any]]:
    """The compute resources of each rung of memory escalation
    (:func:`couler.compilers.kube.memory_levels`), or [] for one task: no memory factor or
    quantity, or a policy that does not retry an out-of-memory failure (nothing escalates
    then, as on the local engine)."""
    if retry is None or not {ir.FailureClass.ANY, ir.FailureClass.OOM} & set(retry.on):
        return []
    return memory_levels(retry, res)


def _binary_quantity(text: str) -> str:
    """A memory quantity of whole bytes in the largest binary unit that is exact
    ("2147483648" → "2Gi"); any other quantity as it is."""
    if not text.isdigit() or int(text) == 0:
        return text
    n = int(text)
    for unit in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        size = 1024 ** ("KMGTPE".index(unit[0]) + 1)
        if n % size == 0:
            return f"{n // size}{unit}"
    return text


def _rung_lines(policy: ir.RetryPolicy, *, last: bool, run: str = '"$@"') -> list[str]:
    """sh lines of one attempt task ("rung") of memory escalation on OOM.

    They run ``run`` under the retry wrapper (:func:`couler.compilers.entrypoint.fragment`)
    with the attempts the tasks before made (``$couler_before``) counted against the limit
    and indexing the back-off delays. Every rung but the ``last`` stops at an out-of-memory
    failure (``stop_on``): its memory is fixed, the next rung has more. They write the last
    attempt's failure class ("" on success) to ``$couler_class_out`` and the attempts made
    so far to ``$couler_attempts_out``, and set ``$couler_handover`` to 1 when the next rung
    is to go on (the last attempt ended out of memory, attempts are left, this is not the
    last rung), else 0; ``$couler_rc`` is the last attempt's exit code.
    """
    lines = []
    if policy.backoff is not None:  # the delay before this rung's first attempt
        delays = " ".join(f"{d:g}" for d in entrypoint.delays(policy))
        lines.append(f'if [ "$couler_before" -gt 0 ]; then sleep "$(echo {shlex.quote(delays)}'
                     ' | cut -d " " -f "$couler_before")"; fi')
    lines.append(entrypoint.fragment(
        policy, run, status_path="", work_dir="",
        stop_on=() if last else (ir.FailureClass.OOM,),
        attempts_before="couler_before").rstrip("\n"))
    lines += ['mkdir -p "$(dirname "$couler_class_out")" "$(dirname "$couler_attempts_out")"',
              'printf \'%s\' "$couler_class" > "$couler_class_out"',
              'printf \'%s\' "$couler_attempt" > "$couler_attempts_out"',
              "couler_handover=0"]
    if not last:
        lines += [f'if [ "$couler_rc" -ne 0 ] && [ "$couler_class" = oom ] && '
                  f'[ "$couler_attempt" -le {policy.limit} ]; then',
                  "  couler_handover=1",
                  '  echo "couler: out of memory in attempt $couler_attempt: the next task, with '
                  'more memory, goes on" >&2',
                  "fi"]
    return lines


def _rung_script(policy: ir.RetryPolicy, *, last: bool) -> str:
    """A whole ``/bin/sh -c`` script of one rung (:func:`_rung_lines`): $1 is the class
    output file, $2 the attempts output file, $3 the attempts made before, then the
    command. It exits 0 when it hands over, else with the command's exit code."""
    lines = ['couler_class_out="$1"; couler_attempts_out="$2"; couler_before="$3"; shift 3',
             *_rung_lines(policy, last=last),
             '[ "$couler_handover" = 1 ] && exit 0',
             'exit "$couler_rc"']
    return "\n".join(lines) + "\n"


def _wrapper(outputs: Sequence[ir.OutputParameter], working_dir: str, *,
             gate: tuple[bool, tuple[str, ...]] | None = None,
             inputs_art: Sequence[str] = (), outputs_art: Sequence[str] = (),
             rung: tuple[ir.RetryPolicy, bool] | None = None) -> str:
    """The ``/bin/sh -c`` script: $1..$k are the output files, then the local paths of
    the input and of the output artifacts, then the command.

    With ``rung`` (the retry policy, whether it is the last rung), the step is an attempt
    task of memory escalation: after the artifact paths come the class and attempts output
    files and the attempts made before, and the command runs under :func:`_rung_lines`;
    when it hands over, the outputs are written empty and the script exits 0 at once.

    An input artifact is copied to the path the step reads it at before the command
    runs; an output artifact is copied from the path the step wrote it at after the
    command succeeded (missing: the step fails, as on Argo).

    With ``gate`` (a ``failed`` / ``error`` exit hook, an edge handler) $1 is the
    ``PipelineTaskFinalStatus`` JSON first; ``gate`` is (run when the state is one of
    ``states``?, states): when the step is not to run, the script writes empty outputs
    and exits 0 without running the command.
    """
    lines = ["set -u"]
    if gate is not None:
        lines.append('couler_status="$1"; shift')
    for k in range(len(outputs)):
        lines.append(f'o{k}="$1"; shift')
    for k in range(len(inputs_art)):
        lines.append(f'i{k}="$1"; shift')
    for k in range(len(outputs_art)):
        lines.append(f'a{k}="$1"; shift')
    if rung is not None:
        lines.append('couler_class_out="$1"; couler_attempts_out="$2"; couler_before="$3"; '
                     'shift 3')
    if gate is not None:
        run_on, states = gate
        # protojson puts a space after the colon or not (deliberately unstable): match both
        empty = "".join(f'mkdir -p "$(dirname "$o{k}")"; : > "$o{k}"; '
                        for k in range(len(outputs)))
        patterns = "|".join(f"""*'"state":"{st}"'*|*'"state": "{st}"'*""" for st in states)
        lines += ['case "$couler_status" in',
                  f"  {patterns}) {':' if run_on else empty + 'exit 0'};;"]
        if run_on:
            lines.append(f"  *) {empty}exit 0;;")
        lines.append("esac")
    for k, path in enumerate(inputs_art):
        q = shlex.quote(path)
        lines.append(f'mkdir -p "$(dirname {q})" && cp -R "$i{k}" {q} || exit 1')
    if working_dir:
        lines.append(f"cd {shlex.quote(working_dir)} || exit 1")
    stdout = any(o.source is ir.OutputSource.STDOUT for o in outputs)
    if rung is not None:
        empty = "".join(f'mkdir -p "$(dirname "$o{k}")"; : > "$o{k}"; '
                        for k in range(len(outputs)))
        empty += "".join(f'mkdir -p "$a{k}"; ' for k in range(len(outputs_art)))
        body = _rung_lines(rung[0], last=rung[1])
        if stdout:
            lines += ['couler_out=$(mktemp)', "{", *body, '} > "$couler_out"',
                      'cat "$couler_out"']
        else:
            lines += body
        lines += [f'if [ "$couler_handover" = 1 ]; then {empty}exit 0; fi',
                  '[ "$couler_rc" -eq 0 ] || exit "$couler_rc"']
    elif stdout:
        lines += ['couler_out=$(mktemp)', '"$@" > "$couler_out"; rc=$?', 'cat "$couler_out"',
                  '[ "$rc" -eq 0 ] || exit "$rc"']
    else:
        lines.append('"$@" || exit $?')
    for k, path in enumerate(outputs_art):
        q = shlex.quote(path)
        lines += [f'[ -e {q} ] || {{ echo "couler: output artifact {q} is missing" >&2; exit 1; }}',
                  f'mkdir -p "$(dirname "$a{k}")" && cp -R {q} "$a{k}" || exit 1']
    for k, o in enumerate(outputs):
        lines.append(f'mkdir -p "$(dirname "$o{k}")"')
        if o.source is ir.OutputSource.STDOUT:
            lines.append(f'printf \'%s\' "$(cat "$couler_out")" > "$o{k}"')
        else:
            # the value with trailing newlines removed, like stdout (and the local engine)
            lines.append(f'couler_v=$(cat {shlex.quote(o.selector)}) || exit 1')
            lines.append(f'printf \'%s\' "$couler_v" > "$o{k}"')
    return "\n".join(lines) + "\n"
