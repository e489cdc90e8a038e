"""Benchmark: the latency of one NATS hop through Couler's bus (publish → handler → ack).

Starts a throwaway ``nats-server -js`` (file storage) on 127.0.0.1, then sends N
``StepEvent`` messages one at a time through :class:`couler_runtime.bus.Bus`: each
is published (waiting for JetStream's store acknowledgement, as services do) and
the time until a durable pull consumer's handler receives it is recorded; the next
message goes after the handler acked the previous one. Reports p50 / p90 / p99 /
max of the hop and of the publish call alone, and messages per second.

Three modes, each on its own server: ``open`` (no authentication, as before the bus was
secured), ``auth`` (what every deployment runs: nkey identities with their permissions,
messages signed by the submitter and verified by the consumer) and ``tls`` (the same over
TLS with the deployment's CA). Usage::

    .venv/bin/python bench/bench_nats.py [--messages 2000] [--modes open,auth,tls]
        [--json bench/results-nats.json]
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
from couler_runtime.bus_keys import BusFiles


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _measure(url: str, n: int, files: BusFiles | None) -> dict[str, float]:
    if files is None:
        bus = await Bus.connect(url, name="bench")
        await bus.ensure_streams()
        consumer = bus
    else:
        admin = await Bus.connect(url, name="admin", identity=files.identity("admin"),
                                  tls=files.client_tls())
        await admin.ensure_streams()
        await admin.close()
        bus = await Bus.connect(url, name="couler-submitter", tls=files.client_tls(),
                                identity=files.identity("submitter"), trust=files.trust())
        consumer = await Bus.connect(url, name="couler-monitor", tls=files.client_tls(),
                                     identity=files.identity("monitor"), trust=files.trust())
    received: asyncio.Queue[float] = asyncio.Queue()

    async def handler(event: Event[events_pb2.StepEvent]) -> None:
        received.put_nowait(time.perf_counter())

    await consumer.subscribe("couler.step.>", "monitor-steps", events_pb2.StepEvent, handler,
                             batch=1)
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
    if consumer is not bus:
        await consumer.close()
    return {
        "messages": n,
        "hop_p50_ms": round(_pct(hops, 50), 3), "hop_p90_ms": round(_pct(hops, 90), 3),
        "hop_p99_ms": round(_pct(hops, 99), 3), "hop_max_ms": round(max(hops), 3),
        "hop_mean_ms": round(statistics.fmean(hops), 3),
        "publish_p50_ms": round(_pct(publishes, 50), 3),
        "publish_p99_ms": round(_pct(publishes, 99), 3),
        "sequential_messages_per_s": round(n / total, 1),
    }


def _one(mode: str, n: int) -> dict[str, float]:
    binary = Path(sys.executable).parent / "nats-server"
    port, monitor = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as store:
        files = None if mode == "open" else BusFiles.create(Path(store) / "bus",
                                                            tls=mode == "tls")
        config = [] if files is None else ["-c", str(files.config)]
        proc = subprocess.Popen([str(binary), *config, "-js", "-sd", store, "-a", "127.0.0.1",
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
            scheme = "tls" if mode == "tls" else "nats"
            return {"mode": mode,  # type: ignore[dict-item]
                    **asyncio.run(_measure(f"{scheme}://127.0.0.1:{port}", n, files))}
        finally:
            proc.terminate()
            proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--modes", default="open,auth,tls")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    figures = [_one(mode, args.messages) for mode in args.modes.split(",")]
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
