"""Load conformance programs as IR; stdlib and ``couler`` only, so every engine venv can use it.

A program is either a Couler API program (``import couler.argo as couler``),
captured with :func:`couler.api.capture.capture_program`, or a module defining
``def workflow() -> ir.Workflow`` for features the Python API cannot express.
"""

from __future__ import annotations

import ast
import runpy
from pathlib import Path

from couler import ir
from couler.api.capture import capture_program

PROGRAMS = Path(__file__).resolve().parent / "programs"


def program_paths() -> list[Path]:
    """Every conformance program, sorted by name."""
    return sorted(p for p in PROGRAMS.glob("*.py") if not p.name.startswith("_"))


def defines_workflow(path: Path) -> bool:
    """Whether ``path`` builds its IR directly (a top-level ``def workflow()``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return any(isinstance(n, ast.FunctionDef) and n.name == "workflow" for n in tree.body)


def load_program(path: Path) -> ir.Workflow:
    """The one workflow the program at ``path`` builds, validated."""
    if defines_workflow(path):
        wf = runpy.run_path(str(path), run_name=f"conformance_{path.stem}")["workflow"]()
        if not isinstance(wf, ir.Workflow):
            raise TypeError(f"{path.name}: workflow() returned {type(wf).__name__}")
        ir.validate(wf)
        return wf
    workflows = capture_program(str(path))
    if len(workflows) != 1:
        raise ValueError(f"{path.name} builds {len(workflows)} workflows, expected one")
    return workflows[0]
