"""Benchmark: Ray executor overhead per step, for 1,000 trivial steps (chain and fan-out).

The same workflows as ``bench_local.py`` (each step runs ``true``), run by
:class:`~couler_runtime.ray.RayExecutor` on a local Ray cluster with ``--cpus`` CPUs, and,
for the ratio, by ``bench_local.py`` itself with as many workers, in a child process (so it
runs exactly as the local benchmark does, in the same namespace), interleaved with the Ray
runs so both see the same machine load. Reported per shape and engine (fastest of
``--repeat`` runs): wall seconds, steps per second, milliseconds per step, and the Ray /
local ratio. Ray's start-up and a small warm-up run (which starts Ray's worker processes)
are timed separately and not counted.

Ray binds to every network interface: run this only through ``bench/run_ray_bench.sh``,
which starts it in a private network namespace with the Ray venv.

Usage:  bench/run_ray_bench.sh [--steps 1000] [--cpus 4] [--repeat 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from bench_local import workflow  # bench/ is on sys.path: the same workflows as bench_local

from couler import ir
from couler_runtime.ray import RayExecutor


def timed_ray(wf: ir.Workflow, tmp: str) -> float:
    """Run ``wf`` to success on Ray and return the wall seconds."""
    started = time.perf_counter()
    status = RayExecutor(Path(tmp) / "ray").run(wf)
    seconds = time.perf_counter() - started
    if str(status.state) != "succeeded":
        raise SystemExit(f"ray {wf.name}: run {status.state}: {status.message}")
    return seconds


def timed_local(steps: int, workers: int, tmp: str) -> dict[str, float]:
    """Seconds per shape of one ``bench_local.py`` run, in a child process without Ray."""
    out = Path(tmp) / "local.json"
    subprocess.run([sys.executable, str(Path(__file__).with_name("bench_local.py")),
                    "--steps", str(steps), "--workers", str(workers), "--json", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    return {r["shape"]: float(r["seconds"]) for r in json.loads(out.read_text())}


def figures(engine: str, shape: str, n: int, cpus: int, seconds: float) -> dict[str, Any]:
    return {"engine": engine, "shape": shape, "steps": n, "workers": cpus,
            "seconds": round(seconds, 2), "steps_per_second": round(n / seconds, 1),
            "ms_per_step": round(1000 * seconds / n, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--cpus", type=int, default=4,
                        help="CPUs of the local Ray cluster = local engine workers (default 4)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs per shape and engine, the fastest counts (default 2)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    started = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False, _temp_dir=os.environ.get("RAY_TMPDIR"))
    startup = time.perf_counter() - started
    results: list[dict[str, Any]] = []
    best: dict[tuple[str, str], float] = {}

    def keep(engine: str, shape: str, seconds: float) -> None:
        best[engine, shape] = min(seconds, best.get((engine, shape), seconds))

    try:
        with tempfile.TemporaryDirectory() as tmp:
            warmup = timed_ray(workflow("fanout", 2 * args.cpus), tmp)
            print(f"ray start-up {startup:.2f} s, warm-up ({2 * args.cpus} steps) {warmup:.2f} s")
            for _ in range(args.repeat):
                for shape, seconds in timed_local(args.steps, args.cpus, tmp).items():
                    keep("local", shape, seconds)
                for shape in ("chain", "fanout"):
                    keep("ray", shape, timed_ray(workflow(shape, args.steps), tmp))
    finally:
        ray.shutdown()
    for shape in ("chain", "fanout"):
        for engine in ("local", "ray"):
            results.append(figures(engine, shape, args.steps, args.cpus, best[engine, shape]))
    for r in results:
        local = next(x for x in results if x["engine"] == "local" and x["shape"] == r["shape"])
        r["ratio_vs_local"] = round(r["seconds"] / local["seconds"], 2)
        print(f"{r['engine']:5} {r['shape']:7} {r['steps']} steps, {r['workers']} workers: "
              f"{r['seconds']} s, {r['steps_per_second']} steps/s, {r['ms_per_step']} ms/step, "
              f"x{r['ratio_vs_local']} vs local")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ray_startup_seconds": round(startup, 2), "repeat": args.repeat,
                       "load_average_after": [round(x, 2) for x in os.getloadavg()],
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
