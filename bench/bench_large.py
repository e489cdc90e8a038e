"""Benchmark: one very large workflow through the whole stack, as a user runs it.

For each size N it starts the embedded stack with the CLI (``couler up`` in a temporary
home), writes a workflow program that builds an N-step chain with the Python API
(``with couler.workflow("chain")``, one ``run_container`` per step), and runs
``couler submit --engine dryrun --wait PROGRAM -- N`` as a process of its own: the program is
captured into IR, uploaded to the submitter in chunks (it is larger than one message),
submitted by reference, planned by the optimizer (``couler.workflow.requested`` →
``couler.workflow.optimized``, both bodies by reference through the payload store),
dry-run by the submitter (every step recorded and published as a ``couler.step.*`` event
through the outbox) and followed with a line per step until it finishes. Then it waits
until the monitor's and the cache's durable consumers have taken every step event, and
reads each service process's peak resident memory (``VmHWM`` in ``/proc``: the high-water
mark since it started). Finally ``couler down``.

Reported per N: the CLI's wall time (capture, upload, Submit, planning, the dry run, and
the watch), the submitter's record of the phases (accepted → first step → finished), how
long after the run finished the consumers caught up, and the peak RSS of every process.
Usage::

    .venv/bin/python bench/bench_large.py [--steps 10000 50000 100000]
        [--json bench/results-large.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from couler_runtime import stack
from couler_runtime.bus import Bus
from couler_runtime.bus_keys import BusFiles
from couler_runtime.client import CoulerClient

PROGRAM = '''\
import sys

import couler.argo as couler

n = int(sys.argv[1])
with couler.workflow("chain"):
    for k in range(n):
        couler.run_container(image="alpine", command=["echo", str(k)], step_name=f"s{k}")
'''

# The durable consumers of step events: the monitor's and the cache's.
CONSUMERS = (("COULER_STEP", "monitor-steps"), ("COULER_STEP", "cache"))
COULER = [sys.executable, "-m", "couler"]


def peak_rss(pid: int) -> int:
    """The process's peak resident set size in bytes (``VmHWM``); 0 if it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    m = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else 0


async def _pending(home: Path, nats_url: str) -> dict[str, int]:
    files = BusFiles(home / "bus")
    bus = await Bus.connect(nats_url, name="bench-admin", identity=files.identity("admin"),
                            trust=files.trust(), tls=files.client_tls(), deadletters=False)
    try:
        pending = {}
        for stream, durable in CONSUMERS:
            info = await bus.jetstream.consumer_info(stream, durable)
            pending[durable] = (info.num_pending or 0) + (info.num_ack_pending or 0)
        return pending
    finally:
        await bus.close()


def wait_consumers(home: Path, nats_url: str, limit: float) -> dict[str, float]:
    """Seconds until each step-event consumer had nothing pending (-1 past ``limit``)."""
    start = time.monotonic()
    done: dict[str, float] = {}
    while len(done) < len(CONSUMERS) and time.monotonic() - start < limit:
        for durable, n in asyncio.run(_pending(home, nats_url)).items():
            if n == 0 and durable not in done:
                done[durable] = round(time.monotonic() - start, 1)
        time.sleep(0.5)
    return {durable: done.get(durable, -1.0) for _, durable in CONSUMERS}


def run_size(n: int, workdir: Path) -> dict[str, Any]:
    home = workdir / f"home-{n}"
    program = workdir / "chain.py"
    program.write_text(PROGRAM)
    env = {**os.environ, "COULER_HOME": str(home)}
    subprocess.run([*COULER, "up", "--home", str(home)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        info, _ = stack.status(home)
        err_log = workdir / f"submit-{n}.err"
        t0 = time.perf_counter()
        with err_log.open("w") as err:
            proc = subprocess.run(
                [*COULER, "submit", "--engine", "dryrun", "--wait", "--home", str(home),
                 str(program), "--", str(n)],
                check=False, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"couler submit failed ({proc.returncode}): {proc.stdout}\n"
                             f"{err_log.read_text()[-3000:]}")
        run_id = proc.stdout.split()[1]  # "run <id> succeeded ..."
        caught_up = wait_consumers(home, info.nats_url, limit=1800)
        with CoulerClient(info.addresses, token=info.token or None) as client:
            run = client.submitter.get_page(run_id, page_size=1)
        latest, _ = stack.status(home)
        peaks = {name: peak_rss(pid) for name, pid in latest.pids.items()}
        restarts = {name: getattr(p, "restarts", 0)
                    for name, p in getattr(latest, "processes", {}).items()}
        first_step = run.started_at or 0.0
        return {
            "steps": n, "state": run.state.value, "step_count": run.step_count,
            "cli_wall_s": round(wall, 1),
            "accepted_to_first_step_s": round(first_step - (run.created_at or 0.0), 1),
            "first_step_to_finished_s": round((run.finished_at or 0.0) - first_step, 1),
            "consumers_after_finish_s": caught_up,
            "peak_rss_mib": {k: round(v / 2**20) for k, v in sorted(peaks.items())},
            "restarts": restarts, "cli_lines": sum(1 for _ in err_log.open()),
        }
    finally:
        subprocess.run([*COULER, "down", "--home", str(home)], check=False, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="couler-bench-large-") as tmp:
        for n in args.steps:
            result = run_size(n, Path(tmp))
            results.append(result)
            print(json.dumps(result), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
