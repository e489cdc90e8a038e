"""``couler generate "TEXT"``: a plain-English request → a workflow, printed, never run.

The offline planner (:func:`couler.generate.planner.plan`) turns the request into IR; the
workflow is printed as canonical IR JSON (``--engine ir``, the default) or compiled for an
engine (``argo``, ``tekton``, ``airflow``, ``kfp``) — compiling checks that the engine can
run it. ``-o FILE`` writes it to a file; ``--explain`` prints to stderr how the request was
read: the sub-tasks, the template chosen for each (with the runners-up and their scores),
and the choices and notes (workflow parameters to set, steps added). ``--spec`` prints the
intermediate spec (the JSON an LLM would answer) instead of the workflow.

Exit status: 0 with the workflow; 2 (a refusal) naming the part of the request that could
not be planned, or the feature the engine cannot run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from couler.errors import UserError

__all__ = ["add_generate_command", "cmd_generate"]

_ENGINES = ("ir", "argo", "tekton", "airflow", "kfp")


def add_generate_command(sub: Any) -> None:
    """Register ``generate`` on the ``couler`` command's sub-parsers."""
    p = sub.add_parser("generate", help="turn a plain-English request into a workflow")
    p.add_argument("text", help="the request, e.g. \"train XGBoost on s3://b/churn.csv\"; "
                                "'-' reads it from stdin")
    p.add_argument("--engine", choices=_ENGINES, default="ir",
                   help="print canonical IR JSON (default) or compile for an engine")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--name", default="", help="the workflow's name (default: from the request)")
    p.add_argument("--explain", action="store_true",
                   help="print the sub-tasks, templates and choices to stderr")
    p.add_argument("--spec", action="store_true",
                   help="print the generator's spec (JSON) instead of the workflow")
    p.set_defaults(func=cmd_generate, takes_err=True)


def cmd_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler.cli import COMPILERS
    from couler.generate.library import TEMPLATES
    from couler.generate.planner import plan_spec
    from couler.generate.spec import assemble, spec_to_json

    text = sys.stdin.read() if args.text == "-" else args.text
    spec, report = plan_spec(text, name=args.name, templates=TEMPLATES)
    if args.explain:
        err.write(f"request: {' '.join(text.split())[:300]}\n")
        err.write("sub-tasks:\n" + "".join(f"  {i}. {s}\n"
                                           for i, s in enumerate(report.subtasks, 1)))
        err.write("template choices (score; runners-up):\n"
                  + "".join(f"  {c}\n" for c in report.choices))
        if spec.schedule:
            err.write(f"schedule: {spec.schedule} {spec.timezone}\n")
        for note in report.notes:
            err.write(f"note: {note}\n")
    if args.spec:
        rendered = json.dumps(spec_to_json(spec), indent=2, sort_keys=True) + "\n"
    else:
        wf = assemble(spec, TEMPLATES)
        try:
            rendered = COMPILERS[args.engine]([wf])
        except UserError as exc:
            raise UserError(f"generate: the workflow {wf.name!r} cannot run on "
                            f"{args.engine}: {exc}") from exc
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(rendered)
    else:
        out.write(rendered)
    return 0
