"""Benchmark: program -> IR -> Argo YAML for generated workflows of 1k, 10k and 100k steps.

Shapes:
  chain     a sequence of steps, each depending on the previous one (steps mode)
  fanout    one root with N-1 children (DAG mode, set_dependencies)
  layered   a layered random DAG: layers of ~sqrt(N) steps, each step depends on 1-3
            random steps of the previous layer (seeded, so every run builds the same graph)

Each case runs in a fresh subprocess so its peak memory (max RSS) is its own, and is run
--repeat times (default 3) in that process; the fastest run is reported, as timeit does, so
one-off costs of the machine (first-touch page faults) do not count. Reported per case:
seconds to build the IR with the Python API (including validation), to compile to an Argo
document, to dump YAML, the total, the peak RSS and the YAML size; and per shape the ratio
t(100k)/t(10k), which should stay near 10 (linear) and must stay <= 11.

Usage:  .venv/bin/python bench/bench_compile.py [--sizes 1000,10000,100000] [--repeat 3]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import resource
import subprocess
import sys
import time
from typing import Any

SHAPES = ("chain", "fanout", "layered")


def build(shape: str, n: int) -> Any:
    """Build a workflow of ``n`` steps of ``shape`` with the Couler Python API."""
    import couler.argo as couler

    def job(i: int) -> Any:
        return couler.run_container(
            image="alpine:3.20", command=["echo"], args=[f"step {i}"], step_name=f"s{i}"
        )

    with couler.workflow(f"bench-{shape}") as wf:
        if shape == "chain":
            for i in range(n):
                job(i)
        elif shape == "fanout":
            couler.set_dependencies(lambda: job(0), dependencies=None)
            for i in range(1, n):
                couler.set_dependencies(lambda i=i: job(i), dependencies=["s0"])
        elif shape == "layered":
            rng = random.Random(42)
            width = max(1, int(math.sqrt(n)))
            previous: list[str] = []
            i = 0
            while i < n:
                layer = []
                for _ in range(min(width, n - i)):
                    parents = rng.sample(previous, k=min(len(previous), rng.randint(1, 3)))
                    couler.set_dependencies(lambda i=i: job(i), dependencies=parents or None)
                    layer.append(f"s{i}")
                    i += 1
                previous = layer
        else:
            raise SystemExit(f"unknown shape {shape}")
        return wf.to_ir()


def run_once(shape: str, n: int) -> tuple[float, float, float, int, float, float]:
    """Build, compile and dump one workflow.

    Returns the three phase times, the YAML size, and the user and system CPU seconds.
    """
    from couler.compilers.argo import compile_workflow, to_yaml

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    wf = build(shape, n)
    t1 = time.perf_counter()
    doc = compile_workflow(wf, validate=False)  # build() already validated the IR
    t2 = time.perf_counter()
    text = to_yaml(doc)
    t3 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    if len(wf.steps) != n:
        raise SystemExit(f"{shape}: built {len(wf.steps)} steps, wanted {n}")
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    return t1 - t0, t2 - t1, t3 - t2, len(text.encode()), user, system


def run_case(shape: str, n: int, repeat: int) -> dict[str, Any]:
    """Measure one case in this process: the fastest of ``repeat`` runs."""
    runs = []
    for _ in range(repeat):
        runs.append(run_once(shape, n))
        gc.collect()
    build_s, compile_s, yaml_s, size, user, system = min(runs, key=lambda r: r[0] + r[1] + r[2])
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "shape": shape,
        "steps": n,
        "build_s": round(build_s, 3),
        "compile_s": round(compile_s, 3),
        "yaml_s": round(yaml_s, 3),
        "total_s": round(build_s + compile_s + yaml_s, 3),
        "user_cpu_s": round(user, 3),
        "system_cpu_s": round(system, 3),
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "yaml_bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest counts")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: shape:n in a subprocess
    args = parser.parse_args()
    if args.case:
        shape, n = args.case.split(":")
        print(json.dumps(run_case(shape, int(n), args.repeat)))
        return

    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    header = (
        f"{'shape':8} {'steps':>7} {'build s':>8} {'compile s':>9} {'yaml s':>7} "
        f"{'total s':>8} {'user s':>7} {'sys s':>6} {'peak MiB':>9} {'YAML bytes':>12}"
    )
    print(header, file=sys.stderr)
    for shape in args.shapes.split(","):
        for n in sizes:
            out = subprocess.run(
                [sys.executable, __file__, "--case", f"{shape}:{n}", "--repeat", str(args.repeat)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            r = json.loads(out)
            results.append(r)
            print(
                f"{shape:8} {n:>7} {r['build_s']:>8} {r['compile_s']:>9} {r['yaml_s']:>7} "
                f"{r['total_s']:>8} {r['user_cpu_s']:>7} {r['system_cpu_s']:>6} "
                f"{r['peak_rss_mib']:>9} {r['yaml_bytes']:>12}",
                file=sys.stderr,
                flush=True,
            )
    ratios, cpu_ratios = {}, {}
    for shape in args.shapes.split(","):
        rows = {r["steps"]: r for r in results if r["shape"] == shape}
        if 10_000 in rows and 100_000 in rows:
            big, small = rows[100_000], rows[10_000]
            ratios[shape] = round(big["total_s"] / small["total_s"], 2)
            cpu_ratios[shape] = round(big["user_cpu_s"] / small["user_cpu_s"], 2)
            print(
                f"t(100k)/t(10k) {shape}: {ratios[shape]} (user CPU: {cpu_ratios[shape]})",
                file=sys.stderr,
            )
    if args.json:
        with open(args.json, "w") as f:
            report = {"results": results, "ratios": ratios, "user_cpu_ratios": cpu_ratios}
            json.dump(report, f, indent=1)
    bad = {s: r for s, r in ratios.items() if r > 11}
    if bad:
        raise SystemExit(f"not near-linear: {bad}")


if __name__ == "__main__":
    main()
