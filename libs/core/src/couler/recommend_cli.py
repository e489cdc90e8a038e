"""``couler recommend WORKFLOW``: each step's current and recommended resources, and why.

``WORKFLOW`` is a workflow's name, or a program (``PATH.py``, with its arguments after
``--``) whose workflows are looked up by name. The recommendations come from the monitor of
the running ``couler up`` stack (its address and token from the stack's state file), or from
the one at ``--address`` (else ``$COULER_MONITOR_ADDRESS``, else ``$COULER_ADDRESS``) with
``--token`` (else ``$COULER_AUTH_TOKEN``).

The *current* requests are, for a program, those of its compiled IR (a step's own, else the
workflow's defaults); for a name, those of the workflow's latest plan the monitor saw
(``couler.workflow.optimized``), or "unknown" when it saw none. Per recommendation: the
value the optimizer applies, the recommender's latest target and range (which the value
follows only past the hysteresis), the percentile, runs, samples and the time the evidence
spans, and a sentence saying why. ``--json`` prints the same for machines (quantities as
text, seconds and epoch times as numbers).

Like :mod:`couler.cache_cli`, this needs ``couler-runtime``, imported when it runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from couler import ir
from couler.cli_format import human_seconds
from couler.errors import UserError
from couler.service_cli import service_client

__all__ = ["add_recommend_command"]

_CURRENT_FIELD = {"memory_request": "memory_request", "cpu_request": "cpu_request",
                  "memory_limit": "memory_limit"}


@dataclass(frozen=True)
class _Current:
    """Where the current requests come from, and what they are per step."""

    source: str  # "program", "plan" or "unknown"
    steps: dict[str, ir.Resources]
    defaults: ir.Resources | None

    def of(self, step: str) -> ir.Resources | None:
        return self.steps.get(step, self.defaults)


def _from_program(wf: ir.Workflow) -> _Current:
    defaults = wf.defaults.resources or ir.Resources()
    return _Current("program", {s.name: s.resources or defaults for s in wf.steps}, defaults)


def _from_plan(report: Any) -> _Current:
    planned = {q.step: q.resources for q in report.requested}
    if not planned:
        return _Current("unknown", {}, None)
    defaults = planned.pop("", None)
    return _Current("plan", planned, defaults)


def _resources_json(r: ir.Resources | None) -> dict[str, str] | None:
    if r is None:
        return None
    return {"cpu_request": r.cpu_request, "memory_request": r.memory_request,
            "cpu_limit": r.cpu_limit, "memory_limit": r.memory_limit}


def _is_resource(rec: Any) -> bool:
    return bool(rec.percentile > 0)


def _report_json(name: str, current: _Current, report: Any,
                 order: Sequence[str]) -> dict[str, Any]:
    from couler_runtime.rpc.records import recommendation_json

    steps = []
    for step in order:
        steps.append({
            "step": step, "current": _resources_json(current.of(step)),
            "recommendations": [
                recommendation_json(r)
                for r in report.recommendations if r.step == step]})
    return {"workflow": name, "current_from": current.source, "steps": steps}


def _evidence(rec: Any) -> str:
    if not _is_resource(rec):
        return f"{rec.based_on_samples} run(s)" if rec.based_on_samples else "-"
    span = human_seconds(rec.span_seconds) if rec.span_seconds else "0s"
    samples = "" if rec.samples == rec.runs else f", {rec.samples} samples"
    return f"p{rec.percentile * 100:g} of {rec.runs} runs{samples} over {span}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for r in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)


def _print(name: str, current: _Current, report: Any, order: Sequence[str],
           out: TextIO) -> None:
    source = {"program": "from the program's IR",
              "plan": "from its latest plan the monitor saw",
              "unknown": "unknown (the monitor saw no plan of it)"}[current.source]
    print(f"workflow {name}: current requests {source}", file=out)
    if not order:
        print("  no steps and no recommendations", file=out)
        return
    rows: list[list[str]] = []
    reasons: list[str] = []
    for step in order:
        recs = [r for r in report.recommendations if r.step == step]
        now = current.of(step)
        if not recs:
            shown = ("unknown" if now is None else
                     f"cpu {now.cpu_request or 'not set'}, "
                     f"memory {now.memory_request or 'not set'}")
            rows.append([step, "-", shown, "no recommendation yet", "", "", ""])
            continue
        for r in recs:
            field = _CURRENT_FIELD.get(r.kind.value)
            value = ("unknown" if now is None or field is None
                     else getattr(now, field) or "not set")
            resource = _is_resource(r)
            rows.append([step, r.kind.value, value, r.value,
                         r.target if resource else "",
                         f"{r.lower_bound}..{r.upper_bound}" if resource else "",
                         _evidence(r)])
            if r.reason:
                reasons.append(f"  {step} {r.kind.value}: {r.reason}")
    _table(["STEP", "KIND", "CURRENT", "RECOMMENDED", "TARGET", "RANGE", "EVIDENCE"], rows,
           out)
    if reasons:
        print("why:", file=out)
        for line in reasons:
            print(line, file=out)


def cmd_recommend(args: argparse.Namespace, out: TextIO) -> int:
    target = args.workflow
    workflows: list[tuple[str, ir.Workflow | None]]
    if target.endswith(".py") or Path(target).is_file():
        from couler.cli import _capture

        workflows = [(wf.name, wf) for wf in _capture(target, args.program_args)]
    else:
        if args.program_args:
            raise UserError("couler recommend: arguments after -- are for a program "
                            f"(PATH.py), and {target!r} is a workflow name")
        workflows = [(target, None)]
    answers = []
    with service_client(args, "monitor") as monitor:
        for name, wf in workflows:
            report = monitor.recommendation_report(name, args.step or "")
            current = _from_program(wf) if wf is not None else _from_plan(report)
            if wf is not None:
                order = [s.name for s in wf.steps]
                order += sorted({r.step for r in report.recommendations} - set(order))
            else:
                order = sorted({r.step for r in report.recommendations}
                               | set(current.steps))
            if args.step:
                order = [s for s in order if s == args.step]
            answers.append((name, current, report, order))
    if args.json:
        docs = [_report_json(*a) for a in answers]
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2), file=out)
        return 0
    for i, answer in enumerate(answers):
        if i:
            print(file=out)
        _print(*answer, out)
    return 0


def add_recommend_command(sub: Any) -> None:
    """Register ``couler recommend`` on the CLI's sub-parsers."""
    p = sub.add_parser("recommend", help="each step's current and recommended resources, "
                                         "and the evidence behind them")
    p.add_argument("workflow", metavar="WORKFLOW",
                   help="a workflow's name, or a program PATH.py (its arguments after --)")
    p.add_argument("program_args", nargs="*", help="arguments for the program (after --)")
    p.add_argument("--step", help="only this step")
    p.add_argument("--home", help="the stack's directory (default $COULER_HOME or ~/.couler)")
    p.add_argument("--address", help="the monitor's host:port (default "
                                     "$COULER_MONITOR_ADDRESS, $COULER_ADDRESS, or the stack's)")
    p.add_argument("--token", default=None, help="the gRPC auth token (default "
                                                 "$COULER_AUTH_TOKEN or the stack's)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per call (default 30)")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.set_defaults(func=cmd_recommend)
