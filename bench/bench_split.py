"""Benchmark: the user's path for a long chain -- ``couler compile`` and the optimizer's plan.

Two measurements per size N (an N-step chain written in the open-source SDK's style:
``couler.argo``, one ``run_container`` per step):

* **compile** -- ``python -m couler compile chain.py N --engine argo > /dev/null`` as a
  process of its own: the wall time of the whole process (interpreter start, capture into
  IR with validation, compile, YAML, exit), and its user and system CPU time.
* **optimize** -- in a process of its own, the program is captured into IR (not timed), then
  the optimizer service's use case plans it for Argo as the service does for an event
  (``couler_optimizer.service.Optimizer.optimize``: validation, the engine's capability
  check, every pass with the default retry policy, the split to Argo's budget -- which
  compiles the chunks to measure them -- and the plan's record in a SQLite store); the
  cache is not asked. Reported: the wall and CPU time of that call, its chunks and the
  largest chunk's size.

Each case runs ``--repeat`` times; the fastest run is reported, and the median wall time,
with t(N)/t(smallest N) (linear: the ratio of the sizes), of wall time and of CPU time (on a
shared machine the wall time also counts waiting for a CPU). Figures, never assertions.
Usage::

    .venv/bin/python bench/bench_split.py [--steps 10000 20000 40000 100000] [--repeat 2]
        [--json bench/results-split.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROGRAM = '''\
import sys

import couler.argo as couler

for i in range(int(sys.argv[1])):
    couler.run_container(image="alpine", command=["echo"], args=[str(i)], step_name=f"s{i}")
'''

OPTIMIZE = '''\
import asyncio, json, sys, time
from couler.api.capture import capture_program
from couler_optimizer.service import Optimizer
from couler_optimizer.store import OptimizerStore

program, n, db = sys.argv[1], sys.argv[2], sys.argv[3]
(wf,) = capture_program(program, [n])
store = OptimizerStore.open(f"sqlite:///{db}")
optimizer = Optimizer(store)

async def plan_once():
    start, cpu = time.perf_counter(), time.process_time()
    plan = await optimizer.optimize(wf, "argo", no_cache=True)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    split = next(p for p in plan.passes if p.name == "split")
    return {"seconds": seconds, "cpu_s": cpu, "chunks": len(plan.chunks),
            "largest": max((c.size_bytes for c in plan.chunks), default=0),
            "passes": {p.name: p.duration_ms / 1000 for p in plan.passes},
            "split": list(split.notes)}

# The main task returns the summary, not the plan: Python 3.11's asyncio.run repr()s the
# main task's result while restoring its SIGINT handler (signal.getsignal -> enum lookup
# of a functools.partial), which for a 100k-step plan took 5 s after the use case ended.
print(json.dumps(asyncio.run(plan_once())))
'''


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def _child_cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def compile_once(program: Path, n: int) -> dict[str, float]:
    user0, sys0 = _child_cpu()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "couler", "compile", str(program), str(n),
                    "--engine", "argo"], stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    user1, sys1 = _child_cpu()
    return {"wall_s": wall, "user_s": user1 - user0, "sys_s": sys1 - sys0}


def optimize_once(program: Path, n: int, workdir: Path) -> dict[str, Any]:
    db = workdir / f"optimizer-{n}-{time.monotonic_ns()}.db"
    out = subprocess.run([sys.executable, "-c", OPTIMIZE, str(program), str(n), str(db)],
                         capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10000, 20000, 40000, 100000])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"compile": {}, "optimize": {}, "python": sys.version.split()[0],
                               "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="couler-bench-split-") as tmp:
        workdir = Path(tmp)
        program = workdir / "chain.py"
        program.write_text(PROGRAM)
        for n in args.steps:
            runs = [compile_once(program, n) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["wall_s"])
            results["compile"][n] = {**best, "median_wall_s": _median(runs, "wall_s")}
            print(f"compile  {n:>7,} steps: {best['wall_s']:6.2f} s wall "
                  f"(median {_median(runs, 'wall_s'):.2f}), "
                  f"{best['user_s']:6.2f} s user, {best['sys_s']:5.2f} s sys", flush=True)
        for n in args.steps:
            runs = [optimize_once(program, n, workdir) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["seconds"])
            results["optimize"][n] = {**best, "median_seconds": _median(runs, "seconds")}
            print(f"optimize {n:>7,} steps: {best['seconds']:6.2f} s wall "
                  f"(median {_median(runs, 'seconds'):.2f}), {best['cpu_s']:6.2f} s "
                  f"CPU, {best['chunks']} chunks, "
                  f"largest {best['largest']:,} bytes; split {best['passes']['split']:.2f} s",
                  flush=True)
    low = min(args.steps)
    for n in args.steps:
        if n == low:
            continue
        c = results["compile"][n]["wall_s"] / results["compile"][low]["wall_s"]
        o = results["optimize"][n]["seconds"] / results["optimize"][low]["seconds"]
        cc = ((results["compile"][n]["user_s"] + results["compile"][n]["sys_s"])
              / (results["compile"][low]["user_s"] + results["compile"][low]["sys_s"]))
        oc = results["optimize"][n]["cpu_s"] / results["optimize"][low]["cpu_s"]
        print(f"t({n})/t({low}) (linear: {n / low:g}): compile {c:.2f} wall, {cc:.2f} CPU; "
              f"optimize {o:.2f} wall, {oc:.2f} CPU")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
