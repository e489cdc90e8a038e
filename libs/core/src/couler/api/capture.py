"""Capture mode: run a workflow program and record the workflows it builds, without submitting.

The CLI uses :func:`capture_program` (:func:`capture_program_secrets` when it
also needs the values of the secrets the program created, to run it locally);
tests can use :func:`capture_callable`.
While a program runs in capture mode, every ``couler.run(...)`` records the
current workflow's IR instead of submitting it. If the program never calls
``run()``, the workflows it built (the implicit one, and explicit
``with couler.workflow(...)`` scopes that completed) are recorded at the end.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from couler import ir
from couler.api.builder import capture_context, finish_capture
from couler.api.handles import SecretMaterial
from couler.errors import InvalidWorkflowError, UserError

__all__ = ["CapturedProgram", "capture_callable", "capture_program", "capture_program_secrets"]


@dataclass(frozen=True)
class CapturedProgram:
    """What a program built: its workflows and, in memory only, their secrets' values.

    ``secrets[i]`` holds the secret material of ``workflows[i]``: the values
    given to ``create_secret`` (hidden from ``repr``), for a local run. They
    are never part of the IR.
    """

    workflows: list[ir.Workflow]
    secrets: list[list[SecretMaterial]] = field(repr=False)


def capture_program(path: str, argv: Sequence[str] = ()) -> list[ir.Workflow]:
    """Run the program at ``path`` in capture mode and return the workflows it builds.

    See :func:`capture_program_secrets` for the arguments and errors.
    """
    return capture_program_secrets(path, argv).workflows


def capture_program_secrets(path: str, argv: Sequence[str] = ()) -> CapturedProgram:
    """Run the program at ``path`` in capture mode; return its workflows and secret material.

    The program runs as ``__main__`` with ``sys.argv = [path, *argv]`` and its
    directory first on ``sys.path`` (both restored afterwards). Process-wide
    ``sys.argv``/``sys.path`` make this unsafe to call from several threads
    at once.

    Args:
        path: The Python program.
        argv: Its command-line arguments.

    Returns:
        The recorded workflows, each validated, with the secret material of each.

    Raises:
        UserError: if ``path`` is not a file.
        InvalidWorkflowError: if the program raises; the message names the
            program, the line in it and the original error (kept as ``__cause__``).
    """
    program = os.path.abspath(path)
    if not os.path.isfile(program):
        raise UserError(f"program {path!r} does not exist")
    directory = os.path.dirname(program)
    old_argv = sys.argv
    sys.argv = [program, *argv]
    sys.path.insert(0, directory)
    try:
        with capture_context(program) as session:
            try:
                runpy.run_path(program, run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise _program_error(program, e) from e
            except Exception as e:
                raise _program_error(program, e) from e
            try:
                workflows = finish_capture(session)
            except Exception as e:
                raise _program_error(program, e) from e
            return CapturedProgram(workflows, list(session.secrets))
    finally:
        sys.argv = old_argv
        if directory in sys.path:
            sys.path.remove(directory)


def capture_callable(fn: Callable[[], Any]) -> list[ir.Workflow]:
    """Call ``fn`` in capture mode (with a fresh implicit builder) and return what it builds.

    Exceptions from ``fn`` propagate unchanged; the caller's own builder
    state is restored either way.
    """
    with capture_context(None) as session:
        fn()
        return finish_capture(session)


def _program_error(program: str, error: BaseException) -> InvalidWorkflowError:
    line = None
    tb = error.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == program:
            line = tb.tb_lineno
        tb = tb.tb_next
    where = f"{program}, line {line}" if line is not None else program
    detail = f"exit status {error.code}" if isinstance(error, SystemExit) \
        else f"{type(error).__name__}: {error}"
    return InvalidWorkflowError(f"{where}: the workflow program failed: {detail}")
