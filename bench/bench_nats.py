"""Benchmark: the latency of one NATS hop through Couler's bus (publish → handler → ack).

Starts a throwaway ``nats-server -js`` (file storage) on 127.0.0.1, then sends N
``StepEvent`` messages one at a time through :class:`couler_runtime.bus.Bus`: each
is published (waiting for JetStream's store acknowledgement, as services do) and
the time until a durable pull consumer's handler receives it is recorded; the next
message goes after the handler acked the previous one. Reports p50 / p90 / p99 /
max of the hop and of the publish call alone, and messages per second. Usage::

    .venv/bin/python bench/bench_nats.py [--messages 2000] [--json bench/results-nats.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from couler.v1 import common_pb2, events_pb2
from couler_runtime.bus import Bus, Event


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _measure(url: str, n: int) -> dict[str, float]:
    bus = await Bus.connect(url, name="bench")
    await bus.ensure_streams()
    received: asyncio.Queue[float] = asyncio.Queue()

    async def handler(event: Event[events_pb2.StepEvent]) -> None:
        received.put_nowait(time.perf_counter())

    await bus.subscribe("couler.step.>", "bench", events_pb2.StepEvent, handler, batch=1)
    hops: list[float] = []
    publishes: list[float] = []
    msg = events_pb2.StepEvent(run_id="bench", workflow="bench",
                               step=common_pb2.StepRecord(name="s", attempts=1))
    start_all = time.perf_counter()
    for i in range(n):
        msg.step.key = str(i)
        t0 = time.perf_counter()
        await bus.publish("couler.step.succeeded", msg, msg_id=f"bench.{i}")
        t1 = time.perf_counter()
        got = await received.get()
        publishes.append((t1 - t0) * 1000)
        hops.append((got - t0) * 1000)
    total = time.perf_counter() - start_all
    await bus.close()
    return {
        "messages": n,
        "hop_p50_ms": round(_pct(hops, 50), 3), "hop_p90_ms": round(_pct(hops, 90), 3),
        "hop_p99_ms": round(_pct(hops, 99), 3), "hop_max_ms": round(max(hops), 3),
        "hop_mean_ms": round(statistics.fmean(hops), 3),
        "publish_p50_ms": round(_pct(publishes, 50), 3),
        "publish_p99_ms": round(_pct(publishes, 99), 3),
        "sequential_messages_per_s": round(n / total, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    binary = Path(sys.executable).parent / "nats-server"
    port, monitor = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as store:
        proc = subprocess.Popen([str(binary), "-js", "-sd", store, "-a", "127.0.0.1",
                                 "-p", str(port), "-m", str(monitor)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with urllib.request.urlopen(
                            f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true",
                            timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            figures = asyncio.run(_measure(f"nats://127.0.0.1:{port}", args.messages))
        finally:
            proc.terminate()
            proc.wait(10)
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
