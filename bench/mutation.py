"""Mutation check (issue 15, item 5): mutmut's mutation operators over chosen functions.

mutmut 2.5.1 (PyPI) generates the mutants; this driver only restricts them to the chosen
modules/functions (mutmut 2 mutates whole files; the local engine is 1,500 lines and only
its decision functions are in scope) and runs the chosen fast tests once per mutant.

Each run copies the worktree (without .git) to a scratch directory, so the checkout is never
mutated. One mutant at a time: the file is written into the copy, then a forked child (in its
own process group) runs ``pytest -x`` on the module's tests with the copy on ``sys.path``;
a mutant is *killed* when the tests fail (or time out), *survived* when they pass.

    python3 -m venv /tmp/mutvenv && /tmp/mutvenv/bin/pip install 'mutmut==2.5.1'
    nice -n 19 .venv/bin/python bench/mutation.py --mutmut-site \\
        /tmp/mutvenv/lib/python3.11/site-packages [--target NAME ...] \\
        [--json bench/results-mutation.json]

Targets: validate (the graph rules of ir/validate.py), validate-flow (its data-flow rules),
validate-rest (workflow-level fields and policies), validate-entry (its entry points),
depends, semantics, engine (the local engine's decisions).

The project's venv runs the tests; mutmut is only imported from ``--mutmut-site`` (appended
to ``sys.path``), so the project's environment is not changed.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    name: str
    path: str                      # relative to the worktree
    functions: tuple[str, ...]     # qualified names ("Class.method"); () = the whole module
    tests: tuple[str, ...]         # pytest arguments (relative to the worktree)


TARGETS = (
    # validate.py has 776 mutants (338 of them message strings): too many for a
    # 10-minute run on this machine, so the graph checks (the dependency rules) only
    Target("validate", "libs/core/src/couler/ir/validate.py",
           ("_Checker.check_scope", "_Checker.check_edge", "_Checker.check_cycles",
            "_Checker.check_step", "_terms", "_find_cycle"),
           ("tests/unit/test_ir.py", "tests/unit/test_validate_graph.py")),
    # the data-flow rules: what a step reads (inputs, placeholders, maps, conditions) and
    # the parameters a run is given
    Target("validate-flow", "libs/core/src/couler/ir/validate.py",
           ("check_parameters", "_type_problem", "_Checker.literal_ok", "_Checker.check_body",
            "_Checker.check_env", "_Checker.check_text", "_Checker.check_io",
            "_Checker.check_forwarded_output", "_Checker.check_step_ref",
            "_Checker.check_source", "_Checker.check_condition", "_Checker.check_foreach"),
           ("tests/unit/test_ir.py", "tests/unit/test_validate_graph.py",
            "tests/unit/test_ir_parameters.py", "tests/unit/test_validate_flow.py")),
    # the rest: workflow-level fields, policies (retry, resources, tuning), names, secrets
    Target("validate-rest", "libs/core/src/couler/ir/validate.py",
           ("parse_quantity", "_Checker.run", "_Checker.check_parameters",
            "_Checker.check_secret", "_Checker.check_location", "_Checker.check_tune",
            "_Checker.check_tune_param", "_Checker.check_retry", "_Checker.check_resources",
            "_Checker.check_quantity", "_Checker.check_positive", "_Checker.check_labels",
            "_dns_message"),
           ("tests/unit/test_ir.py", "tests/unit/test_validate_graph.py",
            "tests/unit/test_ir_limits.py", "tests/unit/test_validate_flow.py",
            "tests/unit/test_validate_rest.py")),
    # the entry points (validate() raising on findings, find_issues(), the checker's
    # record) and the trigger subject's tokens
    Target("validate-entry", "libs/core/src/couler/ir/validate.py",
           ("validate", "find_issues", "_Checker.__init__", "_Checker.add", "_subject_ok"),
           ("tests/unit/test_ir.py", "tests/unit/test_validate_graph.py",
            "tests/unit/test_validate_flow.py",
            "tests/unit/test_validate_rest.py")),
    Target("depends", "libs/core/src/couler/api/depends.py", (),
           ("tests/unit/test_api.py", "tests/unit/test_depends_parser.py")),
    Target("semantics", "libs/core/src/couler/semantics.py", ("failed_leaves",),
           ("tests/unit/test_semantics.py", "tests/unit/test_local_decisions.py")),
    Target("engine", "libs/runtime/src/couler_runtime/local/engine.py",
           ("skipped_without_running", "LocalRun._decide", "LocalRun._edge",
            "LocalRun._outcome", "LocalRun._expr", "_expr_steps"),
           ("tests/unit/test_local_decisions.py",)),
)


def function_lines(source: str, functions: tuple[str, ...]) -> set[int] | None:
    """0-based line numbers of the bodies of ``functions`` (None = every line)."""
    if not functions:
        return None
    lines: set[int] = set()
    found: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = prefix + child.name
                if qual in functions:
                    found.add(qual)
                    first = child.body[0].lineno  # skip the signature (annotations)
                    lines.update(range(first - 1, (child.end_lineno or first)))
    visit(ast.parse(source), "")
    missing = set(functions) - found
    if missing:
        raise SystemExit(f"functions not found: {sorted(missing)}")
    return lines


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> str:
    """"passed" / "failed" / "timeout": the tests in a forked child on the copy."""
    pid = os.fork()
    if pid == 0:  # child
        os.setpgid(0, 0)
        os.chdir(copy)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        import pytest
        code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests])
        os._exit(int(code))
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "passed" if os.waitstatus_to_exitcode(status) == 0 else "failed"
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.05)  # polling the child's exit, not synchronizing with it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutmut-site", required=True,
                        help="site-packages of a venv holding mutmut 2.5.1")
    parser.add_argument("--target", action="append", choices=[t.name for t in TARGETS])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--without", action="append", default=[], metavar="TEST_FILE",
                        help="leave this test file out (the 'before' runs)")
    parser.add_argument("--list", action="store_true", help="count the mutants, run nothing")
    args = parser.parse_args()
    sys.path.append(args.mutmut_site)
    import mutmut
    from mutmut import ALL, Context, list_mutations, mutate

    sys.dont_write_bytecode = True  # a mutant and the original can share mtime and size
    with tempfile.TemporaryDirectory(prefix="couler-mut-") as tmp:
        copy = Path(tmp) / "wt"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
            ".git", "__pycache__", ".venv", "*.pyc", ".mypy_cache", ".ruff_cache"))
        srcs = sorted(str(p) for p in [*copy.glob("libs/*/src"), *copy.glob("services/*/src")])
        sys.path[:0] = [str(copy), *srcs]
        os.environ["PYTHONPATH"] = os.pathsep.join([str(copy), *srcs])
        # warm the parent (third-party imports) so each forked child starts fast;
        # the project's own modules are imported fresh by each child
        import pydantic  # noqa: F401
        import pytest  # noqa: F401
        import yaml  # noqa: F401

        results: dict[str, object] = {"tool": f"mutmut {mutmut.__version__}", "targets": {}}
        for target in TARGETS:
            if args.target and target.name not in args.target:
                continue
            path = copy / target.path
            original = path.read_text()
            scope = function_lines(original, target.functions)
            ids = [m for m in list_mutations(Context(source=original, mutation_id=ALL,
                                                     filename=str(path)))
                   if scope is None or m.line_number in scope]
            print(f"{target.name}: {len(ids)} mutants in {target.path}"
                  f"{' ' + ', '.join(target.functions) if target.functions else ''}",
                  flush=True)
            if args.list:
                continue
            tests = tuple(t for t in target.tests
                          if (copy / t).exists() and t not in args.without)
            start = time.monotonic()
            base = run_tests(copy, tests, timeout=600)
            base_s = time.monotonic() - start
            if base != "passed":
                raise SystemExit(f"{target.name}: the tests fail on the original code")
            survivors = []
            counts = {"killed": 0, "timeout": 0, "survived": 0}
            try:
                for n, mid in enumerate(ids, 1):
                    mutated, _ = mutate(Context(source=original, mutation_id=mid,
                                                filename=str(path)))
                    path.write_text(mutated)
                    outcome = run_tests(copy, tests, timeout=2 * base_s + 5)
                    key = "survived" if outcome == "passed" else (
                        "timeout" if outcome == "timeout" else "killed")
                    counts[key] += 1
                    if key == "survived":
                        new = mutated.split("\n")[mid.line_number]
                        survivors.append({"line": mid.line_number + 1,
                                          "original": mid.line.strip(),
                                          "mutant": new.strip()})
                        print(f"  SURVIVED {target.path}:{mid.line_number + 1}: "
                              f"{mid.line.strip()!r} -> {new.strip()!r}", flush=True)
                    if n % 25 == 0:
                        print(f"  {n}/{len(ids)} {counts}", flush=True)
            finally:
                path.write_text(original)
            took = time.monotonic() - start
            print(f"{target.name}: {counts} in {took:.0f} s "
                  f"(tests {base_s:.1f} s per run)", flush=True)
            results["targets"][target.name] = {  # type: ignore[index]
                "path": target.path, "functions": list(target.functions),
                "tests": list(tests), "mutants": len(ids), **counts,
                "seconds": round(took), "survivors": survivors}
        if args.json and not args.list:
            args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
