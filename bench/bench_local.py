"""Benchmark: local-engine overhead per step, for 1,000 trivial steps (chain and fan-out).

Each step runs `true` (a container step, run as a host command), so nearly all of the time is
the engine's: scheduling, process start-up, psutil sampling, the run record. Reported per
shape: wall seconds, steps per second and milliseconds per step, with 4 workers.

Usage:  .venv/bin/python bench/bench_local.py [--steps 1000] [--workers 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

from couler import ir
from couler_runtime.local import LocalEngine


def workflow(shape: str, n: int) -> ir.Workflow:
    """``n`` steps running ``true``: a chain, or one root with ``n - 1`` children."""
    body = ir.ContainerSpec("alpine", command=("true",))
    steps = []
    for i in range(n):
        if shape == "chain":
            deps = (ir.Dependency(f"s{i - 1}"),) if i else ()
        else:
            deps = (ir.Dependency("s0"),) if i else ()
        steps.append(ir.Step(f"s{i}", body, dependencies=deps))
    return ir.Workflow(f"local-{shape}", tuple(steps))


def measure(shape: str, n: int, workers: int) -> dict[str, Any]:
    """Run one shape and time it."""
    wf = workflow(shape, n)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        status = LocalEngine(tmp, max_workers=workers).run(wf)
        seconds = time.perf_counter() - started
    if str(status.state) != "succeeded":
        raise SystemExit(f"{shape}: run {status.state}: {status.message}")
    return {
        "shape": shape,
        "steps": n,
        "workers": workers,
        "seconds": round(seconds, 2),
        "steps_per_second": round(n / seconds, 1),
        "ms_per_step": round(1000 * seconds / n, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results = [measure(shape, args.steps, args.workers) for shape in ("chain", "fanout")]
    for r in results:
        print(
            f"{r['shape']:7} {r['steps']} steps, {r['workers']} workers: {r['seconds']} s, "
            f"{r['steps_per_second']} steps/s, {r['ms_per_step']} ms/step"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
