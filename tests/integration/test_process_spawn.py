"""Step processes start safely inside a gRPC service and die with the engine's process.

A ``fork()`` of a process running gRPC threads runs gRPC's fork handlers in the child, which
abort it now and then (exit -6): the local engine spawns without ``preexec_fn`` (so Python
uses ``vfork``) and sets the death signal with ``setpriv`` or a small exec shim instead.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import psutil  # type: ignore[import-untyped]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from couler_runtime.local.process import run_process

SPAWNS = 150  # the old fork + preexec_fn start aborted about one in ten of these


def test_steps_spawned_while_grpc_is_busy_never_abort(tmp_path: Path) -> None:
    ready: list[int] = []
    stop = threading.Event()

    async def serve() -> None:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        ready.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await server.stop(None)

    def hammer() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{ready[0]}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not stop.is_set():
                stub.Check(health_pb2.HealthCheckRequest(), timeout=10)

    threads = [threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)]
    threads[0].start()
    deadline = time.monotonic() + 30
    while not ready:
        assert time.monotonic() < deadline, "the gRPC server did not start"
        time.sleep(0.01)
    threads += [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    for t in threads[1:]:
        t.start()
    try:
        codes = [run_process(["true"], cwd=tmp_path, env=dict(os.environ),
                             stdout_path=tmp_path / "out", stderr_path=tmp_path / "err"
                             ).exit_code for _ in range(SPAWNS)]
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert codes == [0] * SPAWNS, sorted(set(codes))


def test_a_step_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    engine = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from couler_runtime.local.process import run_process
        here = Path({str(tmp_path)!r})
        run_process(["sh", "-c", "echo $$ > {pid_file}; exec sleep 60"], cwd=here,
                    env=dict(os.environ), stdout_path=here / "o", stderr_path=here / "e")
    """)
    proc = subprocess.Popen([sys.executable, "-c", engine])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None, "the step did not start"
            time.sleep(0.05)
        step = psutil.Process(int(pid_file.read_text()))
        assert step.is_running()
        os.kill(proc.pid, signal.SIGKILL)  # the engine's process dies
        proc.wait(30)
        step.wait(30)  # raises TimeoutExpired if the step outlived it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_missing_program_is_not_started(tmp_path: Path) -> None:
    result = run_process(["/no/such/binary"], cwd=tmp_path, env=dict(os.environ),
                         stdout_path=tmp_path / "out", stderr_path=tmp_path / "err")
    assert not result.started and "No such file or directory" in result.error
    result = run_process(["no-such-program-anywhere"], cwd=tmp_path, env=dict(os.environ),
                         stdout_path=tmp_path / "out", stderr_path=tmp_path / "err")
    assert not result.started and "'no-such-program-anywhere'" in result.error
