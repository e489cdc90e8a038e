"""Benchmark: what a deterministic failure costs under the default retry policy.

A step that raises ``ValueError`` on the local engine, run under ``DEFAULT_RETRY`` (it is a
user error: attempted once) and under the same policy retrying every class (``on=ANY``: what
every failure got before failure classes -- two retries with 5 s and 10 s of back-off).
Reported: wall seconds, attempts and the failure reason of each.

Usage:  .venv/bin/python bench/bench_failures.py [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from couler import ir
from couler.optimize import DEFAULT_RETRY
from couler_runtime.local import LocalEngine


def workflow(name: str, retry: ir.RetryPolicy) -> ir.Workflow:
    """One script step that raises ValueError, under ``retry``."""
    body = ir.ScriptSpec(image="python:3.12", command=("python3",),
                         source="raise ValueError('bad input')")
    return ir.Workflow(name=name, steps=(ir.Step(name="bug", body=body, retry=retry),))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args()
    cases = {"default (user error: not retried)": DEFAULT_RETRY,
             "every class retried (before)": dataclasses.replace(
                 DEFAULT_RETRY, on=(ir.FailureClass.ANY,))}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        engine = LocalEngine(Path(tmp))
        for i, (label, policy) in enumerate(cases.items()):
            start = time.monotonic()
            status = engine.run(workflow(f"bench-failure-{i}", policy))
            seconds = time.monotonic() - start
            (step,) = [s for s in status.steps if s.step == "bug"]
            results.append({"case": label, "seconds": round(seconds, 2),
                            "attempts": step.attempts, "failure": step.failure,
                            "failure_reason": step.failure_reason})
    print(f"{'case':<36} {'seconds':>8} {'attempts':>8}  reason")
    for r in results:
        print(f"{r['case']:<36} {r['seconds']:>8.2f} {r['attempts']:>8}  {r['failure_reason']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
