"""Benchmark: workflows per second through the whole pipeline to a dry-run engine.

Starts the embedded stack (``couler_runtime.stack.up``: nats-server and the five
service processes) in a temporary home, then submits N distinct workflows over gRPC
from a few client threads with ``engine="dryrun"`` (the submitter records every step
succeeded without running a process), so what is measured is Couler itself: Submit →
``couler.workflow.requested`` → optimizer (validate, cache lookup over gRPC, passes)
→ ``couler.workflow.optimized`` → submitter → step events → finished, plus the monitor
and the cache consuming the events. Reports workflows/s (first submit to last
finished), the submit→finished latency per workflow, and the CPU time each process of the
stack spent per workflow during the measured part. The bus is authenticated as in every
deployment (nkey identities, every message signed and verified); ``--tls`` runs NATS over
TLS too (``couler up --tls``). Usage::

    .venv/bin/python bench/bench_pipeline.py [--workflows 200] [--steps 5] [--clients 4]
        [--tls | --both] [--repeat 1] [--json bench/results-pipeline.json]

``--both --repeat 3`` alternates three runs without and three with TLS (each on a fresh
stack; the machine's speed drifts between runs) and reports each run and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from couler import ir
from couler_runtime import stack
from couler_runtime.client import CoulerClient


def workflow(i: int, steps: int) -> ir.Workflow:
    """A chain of ``steps`` container steps, distinct per ``i`` (no cache hits)."""
    chain = [ir.Step(name="s0", body=ir.ContainerSpec(image="alpine", command=("echo", str(i))))]
    for k in range(1, steps):
        chain.append(ir.Step(name=f"s{k}", body=ir.ContainerSpec(
            image="alpine", command=("echo", str(i), str(k))),
            dependencies=(ir.Dependency(f"s{k - 1}"),)))
    return ir.Workflow(name=f"bench-{i}", steps=tuple(chain))


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _cpu(proc: psutil.Process) -> float:
    """User + system CPU seconds of ``proc`` so far."""
    times = proc.cpu_times()
    return float(times.user + times.system)


def measure(workflows: int, steps: int, clients: int, tls: bool) -> dict[str, object]:
    """One run: a fresh stack, ``workflows`` submitted from ``clients`` threads; figures."""
    with tempfile.TemporaryDirectory(prefix="couler-bench-") as tmp:
        home = Path(tmp)
        t0 = time.perf_counter()
        info = stack.up(home, token="bench", tls=tls)
        startup = time.perf_counter() - t0
        try:
            client = CoulerClient(info.addresses, token=info.token)
            # warm up: one workflow through every stage
            first = client.submitter.submit(workflow(-1, steps), engine="dryrun")
            client.submitter.wait(first.run_id, timeout=60)

            def one(i: int) -> tuple[float, str]:
                start = time.perf_counter()
                sub = client.submitter.submit(workflow(i, steps), engine="dryrun")
                run = client.submitter.wait(sub.run_id, timeout=600)
                return time.perf_counter() - start, run.state.value

            procs = {name: psutil.Process(pid) for name, pid in info.pids.items()}
            procs["bench client"] = psutil.Process()
            cpu0 = {name: _cpu(p) for name, p in procs.items()}
            begin = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                results = list(pool.map(one, range(workflows)))
            wall = time.perf_counter() - begin
            cpu = {name: _cpu(p) - cpu0[name] for name, p in procs.items()}
            client.close()
        finally:
            stack.down(home)
    latencies = [r[0] * 1000 for r in results]
    states = {s: sum(1 for r in results if r[1] == s) for s in {r[1] for r in results}}
    return {
        "workflows": workflows, "steps_per_workflow": steps,
        "clients": clients, "tls": tls, "states": states,
        "stack_startup_s": round(startup, 2),
        "wall_s": round(wall, 2),
        "workflows_per_s": round(workflows / wall, 2),
        "steps_per_s": round(workflows * steps / wall, 1),
        "latency_p50_ms": round(_pct(latencies, 50), 1),
        "latency_p99_ms": round(_pct(latencies, 99), 1),
        "latency_mean_ms": round(statistics.fmean(latencies), 1),
        "cpu_ms_per_workflow": {name: round(1000 * c / workflows, 2)
                                for name, c in sorted(cpu.items(), key=lambda kv: -kv[1])},
        "cpu_ms_per_workflow_total": round(1000 * sum(cpu.values()) / workflows, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--tls", action="store_true", help="run NATS with TLS")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs, each on a fresh stack; with --both, alternating")
    parser.add_argument("--both", action="store_true",
                        help="alternate runs without and with TLS")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    modes = [False, True] if args.both else [args.tls]
    runs = []
    for _ in range(args.repeat):
        for tls in modes:
            figures = measure(args.workflows, args.steps, args.clients, tls)
            print(json.dumps(figures, indent=2), flush=True)
            runs.append(figures)
    summary = {
        ("tls" if tls else "auth"): {
            "workflows_per_s": sorted(float(str(r["workflows_per_s"])) for r in runs
                                      if r["tls"] is tls),
            "median_workflows_per_s": statistics.median(
                float(str(r["workflows_per_s"])) for r in runs if r["tls"] is tls)}
        for tls in modes}
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2) + "\n")
    ok = all(r["states"] == {"succeeded": args.workflows} for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
