"""Compiling for Kubeflow Pipelines in kfp's own environment (part of the command line).

The kfp SDK pins ``protobuf < 7`` and ``kubernetes < 31``; the main environment needs
protobuf 7 for the generated gRPC code and kubernetes 37 for the adapters, so kfp lives in
``.venv-kfp`` (``scripts/setup.sh`` creates it beside ``.venv``). When ``import kfp`` fails in
the command line's process, ``couler compile --engine kfp`` compiles there: the program is
still captured here, and only its IR crosses. This module is both ends:

* here, :func:`locate` finds the kfp environment's interpreter (``$COULER_KFP_PYTHON``, else
  ``.venv-kfp/bin/python`` beside the environment running couler) and
  :func:`compile_workflows` runs ``python -m couler.kfp_env`` with it, writing each workflow's
  canonical IR JSON to its stdin, one per line (as ``couler compile --engine ir`` prints them);
* there, :func:`serve` compiles them and writes one JSON reply line to stdout::

      {"specs": [PipelineSpec, ...]}                        in the order sent
      {"error": {"kind": "user" | "internal" | "environment", "type": ..., "message": ...}}

The kind is decided by the exception's type where it was raised and becomes the matching
error here: ``user`` a :class:`~couler.errors.UserError` (exit status 2), ``internal`` a
:class:`~couler.errors.CoulerError` (exit status 1), ``environment`` (that interpreter has no
kfp, or reads the IR differently) a user error naming ``COULER_KFP_PYTHON``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from couler import __version__, ir
from couler.errors import CoulerError, UserError

__all__ = ["SETTING", "KfpEnvironment", "compile_workflows", "decode_reply", "locate", "serve"]

log = logging.getLogger("couler.cli")

SETTING = "COULER_KFP_PYTHON"
"""The environment variable naming the kfp environment's interpreter."""

DEFAULT_VENV = ".venv-kfp"
_HOW = (f"run ./scripts/setup.sh (or scripts/setup-engine-venv.sh kfp), or set {SETTING} to "
        "the python of an environment with kfp and couler installed")


@dataclasses.dataclass(frozen=True)
class KfpEnvironment:
    """The interpreter that compiles for kfp, and whether ``$COULER_KFP_PYTHON`` chose it."""

    python: Path
    configured: bool

    def __str__(self) -> str:
        if self.configured:
            return f"the kfp environment {SETTING}={self.python}"
        return f"the kfp environment {self.python} (the default; {SETTING} chooses another)"


def locate(environ: Mapping[str, str], prefix: Path) -> KfpEnvironment:
    """The kfp environment: ``$COULER_KFP_PYTHON``, else ``.venv-kfp`` beside ``prefix``.

    Args:
        environ: the process environment (``os.environ``).
        prefix: the environment running couler (``sys.prefix``), e.g. ``<repo>/.venv``.

    Raises:
        couler.errors.UserError: the setting names no executable, or it is unset and there is
            no ``.venv-kfp`` beside ``prefix``; the message names the setting.
    """
    configured = environ.get(SETTING, "").strip()
    if configured:
        python = Path(configured)
        if not _is_executable(python):
            raise UserError(
                f"{SETTING}={configured}: no such executable; set it to the python of an "
                "environment with kfp and couler installed, or unset it to use .venv-kfp "
                "(./scripts/setup.sh creates it)")
        return KfpEnvironment(python, configured=True)
    python = prefix.parent / DEFAULT_VENV / "bin" / "python"
    if not _is_executable(python):
        raise UserError(
            "compiling for Kubeflow Pipelines needs the kfp SDK, which is not installed in "
            f"this environment ({prefix}), and there is no kfp environment at {python}: {_HOW}")
    return KfpEnvironment(python, configured=False)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def compile_workflows(env: KfpEnvironment,
                      workflows: Sequence[ir.Workflow]) -> list[dict[str, Any]]:
    """Compile ``workflows`` to KFP ``PipelineSpec`` documents with ``env``'s interpreter.

    Raises:
        couler.errors.UserError: a workflow kfp cannot compile (as raised there), or ``env``
            cannot compile at all (it does not start, or has no kfp); the message names
            ``env`` and the setting.
        couler.errors.CoulerError: kfp failed unexpectedly.
    """
    request = "".join(ir.to_json(wf) + "\n" for wf in workflows)
    try:
        # -P: the current directory must not shadow couler or kfp there.
        proc = subprocess.run([str(env.python), "-P", "-m", "couler.kfp_env"], input=request,
                              capture_output=True, text=True, check=False)
    except OSError as exc:
        raise UserError(f"{env} cannot be run ({exc}): {_HOW}") from exc
    lines = proc.stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except json.JSONDecodeError:
        reply = None
    if not isinstance(reply, dict):
        raise UserError(f"{env} did not compile (exit status {proc.returncode}): "
                        f"{_tail(proc.stderr)}; {_HOW}")
    if proc.stderr.strip():  # kfp's own warnings; with an internal error, its traceback
        error = reply.get("error")
        internal = isinstance(error, dict) and error.get("kind") == "internal"
        log.log(logging.WARNING if internal else logging.INFO, "%s: %s", env,
                proc.stderr.strip())
    return decode_reply(reply, env)


def decode_reply(reply: Mapping[str, Any], env: KfpEnvironment) -> list[dict[str, Any]]:
    """The specs of a reply from :func:`serve`, or its error raised as the matching type."""
    error = reply.get("error")
    if isinstance(error, dict):
        kind, message = error.get("kind"), str(error.get("message", ""))
        if kind == "user":
            raise UserError(message)
        if kind == "environment":
            raise UserError(f"{env} cannot compile: {message}; {_HOW}")
        raise CoulerError(f"{env}: kfp failed: {error.get('type', 'error')}: {message}")
    specs = reply.get("specs")
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise CoulerError(f"{env} replied without pipeline specs: {str(reply)[:200]}")
    return specs


def _tail(text: str, lines: int = 5) -> str:
    tail = text.strip().splitlines()[-lines:]
    return " | ".join(tail) if tail else "no output"


# --------------------------------------------------------------------------- the kfp side


def serve(stdin: TextIO, stdout: TextIO) -> int:
    """Compile the canonical IR JSON lines on ``stdin``; write one JSON reply to ``stdout``.

    Runs in the kfp environment (``python -m couler.kfp_env``). Returns the exit status: 0
    whenever a reply was written, errors included.
    """
    reply = _compile(stdin.read())
    stdout.write(json.dumps(reply, separators=(",", ":"), ensure_ascii=False) + "\n")
    stdout.flush()
    return 0


def _compile(request: str) -> dict[str, Any]:
    if importlib.util.find_spec("kfp") is None:
        return _error("environment", "ModuleNotFoundError",
                      f"kfp is not installed in {sys.prefix}")
    from couler.compilers import kfp

    try:
        workflows = [ir.from_json(ir.Workflow, line) for line in request.splitlines()
                     if line.strip()]
    except (ValueError, KeyError, TypeError) as exc:
        return _error("environment", type(exc).__name__,
                      f"cannot read the workflow IR ({exc}); is couler there the same version "
                      f"as here ({__version__})?")
    try:
        # What kfp prints goes to stderr: stdout carries the reply.
        with contextlib.redirect_stdout(sys.stderr):
            specs = [kfp.compile_workflow(wf) for wf in workflows]
    except UserError as exc:
        return _error("user", type(exc).__name__, str(exc))
    except CoulerError as exc:
        return _error("internal", type(exc).__name__, str(exc))
    except Exception as exc:  # the process boundary: a bug in kfp or the compiler
        traceback.print_exc(file=sys.stderr)
        return _error("internal", type(exc).__name__, str(exc))
    return {"specs": specs}


def _error(kind: str, type_name: str, message: str) -> dict[str, Any]:
    return {"error": {"kind": kind, "type": type_name, "message": message}}


if __name__ == "__main__":  # pragma: no cover - run by compile_workflows in the kfp environment
    sys.exit(serve(sys.stdin, sys.stdout))
