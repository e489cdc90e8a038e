"""The ``couler`` command line.

::

    couler compile PATH.py [--engine argo|ir] [-o FILE] [-- ARGS...]
    couler validate PATH.py [-- ARGS...]

The program runs with submission turned off: a ``couler.run(...)`` inside it
records the workflow instead of submitting it. Problems go to stderr with a
non-zero exit status (2 for a problem in the program or workflow, 1 for an
unexpected failure), naming the workflow, step and field.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from couler import __version__, ir
from couler.errors import CoulerError, UserError

log = logging.getLogger("couler.cli")

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1


def _compile_argo(workflows: Sequence[ir.Workflow]) -> str:
    from couler.compilers import argo

    return "---\n".join(argo.to_yaml(argo.compile_workflow(wf)) for wf in workflows)


def _compile_ir(workflows: Sequence[ir.Workflow]) -> str:
    return "".join(ir.to_json(wf) + "\n" for wf in workflows)


COMPILERS: dict[str, Callable[[Sequence[ir.Workflow]], str]] = {
    "argo": _compile_argo,
    "ir": _compile_ir,
}


def _capture(path: str, argv: Sequence[str]) -> list[ir.Workflow]:
    from couler.api.capture import capture_program

    if not Path(path).is_file():
        raise UserError(f"{path}: no such file")
    workflows = capture_program(path, argv)
    if not workflows:
        raise UserError(f"{path}: the program built no workflow (it created no step)")
    return workflows


def cmd_compile(args: argparse.Namespace, out: TextIO) -> int:
    workflows = _capture(args.path, args.program_args)
    text = COMPILERS[args.engine](workflows)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        for wf in workflows:
            log.info("wrote workflow %r (%d steps) to %s", wf.name, len(wf.steps), args.output)
    else:
        out.write(text)
    return 0


def cmd_validate(args: argparse.Namespace, out: TextIO) -> int:
    # capture_program validates each workflow as it is recorded.
    for wf in _capture(args.path, args.program_args):
        n = sum(1 for _ in ir.all_steps(wf.steps))
        out.write(f"ok: workflow {wf.name!r}: {n} step{'s' if n != 1 else ''}, {ir.digest(wf)}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``couler`` command."""
    parser = argparse.ArgumentParser(
        prog="couler",
        description="Describe an ML workflow once; compile and run it on the engine you use.",
    )
    parser.add_argument("--version", action="version", version=f"couler {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("compile", help="compile a workflow program for an engine")
    p.add_argument("path", help="a Python program that builds a workflow")
    p.add_argument(
        "--engine",
        choices=sorted(COMPILERS),
        default="argo",
        help="target engine (default: argo); 'ir' prints the canonical IR JSON",
    )
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("program_args", nargs="*", help="arguments for the program (after --)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("validate", help="check a workflow program without compiling it")
    p.add_argument("path", help="a Python program that builds a workflow")
    p.add_argument("program_args", nargs="*", help="arguments for the program (after --)")
    p.set_defaults(func=cmd_validate)
    return parser


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run the command line; returns the exit status."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=err,
        format="couler: %(message)s",
    )
    func: Any = args.func
    try:
        status: int = func(args, out)
    except UserError as e:
        err.write(f"couler: error: {e}\n")
        return EXIT_USER_ERROR
    except CoulerError as e:
        err.write(f"couler: error: {e}\n")
        return EXIT_INTERNAL_ERROR
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
