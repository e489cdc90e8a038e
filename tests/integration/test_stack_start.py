"""The supervisor (``couler_runtime.supervisor``) with real processes: small shell programs.

A process that fails to start takes what it started along and is started again with a
growing back-off; one killed with SIGKILL is started again; one a previous supervisor left
is adopted only when its start time matches; a restart asked for skips the back-off; stop
goes group by group and kills what ignores SIGTERM; the control socket is its owner's.
The supervisor is driven tick by tick here (the stack's process loops over ``tick``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from couler.errors import UserError
from couler_runtime.supervisor import (
    RESTARTING,
    RUNNING,
    STOPPED,
    Child,
    ControlError,
    ControlServer,
    Launch,
    ProcessRecord,
    Program,
    StartFailed,
    Supervisor,
    backoff_delay,
    process_matches,
    request,
    start_time,
)

WITHIN = 20.0  # seconds a step of these tests may take (a hang, not a timing)


def _gone(pid: int) -> bool:
    return not process_matches(pid, 0.0)  # gone, or a zombie


def _says(marker: str, log: Path) -> Callable[[Child], bool]:
    """Ready once the process wrote ``marker`` to its log (after it started)."""
    def ready(child: Child) -> bool:
        with log.open("rb") as fh:
            fh.seek(child.log_offset)
            return marker.encode() in fh.read()
    return ready


def _program(tmp_path: Path, name: str, script: str, *, ready: str = "READY",
             blocked: Callable[[], str] = lambda: "") -> Program:
    log = tmp_path / f"{name}.log"
    return Program(name, log, lambda: Launch(["sh", "-c", script], dict(os.environ)),
                   _says(ready, log), blocked, marker="sh")


def _until(sup: Supervisor | None, check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WITHIN
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {WITHIN:.0f} s")
        if sup is not None:
            sup.tick()
        time.sleep(0.02)


@pytest.fixture
def records() -> Iterator[dict[str, ProcessRecord]]:
    recs: dict[str, ProcessRecord] = {}
    yield recs
    for rec in recs.values():  # whatever a failed test left
        if rec.pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rec.pid, signal.SIGKILL)


def test_a_process_that_dies_while_starting_takes_its_children_along_and_backs_off(
        tmp_path: Path, records: dict[str, ProcessRecord]) -> None:
    child = tmp_path / "child.pid"
    prog = _program(tmp_path, "flaky", f"sleep 60 & echo $! >> {child}; "
                                        "echo 'bind: address in use'; exit 3")
    exits: list[tuple[int, float]] = []
    sup = Supervisor([prog], records, backoff_first=0.05,
                     on_change=lambda: exits.append((records["flaky"].failures,
                                                     records["flaky"].backoff)))
    _until(sup, lambda: records["flaky"].failures >= 4, "four failed starts")
    sup.stop(grace=1.0)
    rec = records["flaky"]
    assert rec.last_exit == "exit status 3" and rec.restarts >= 3
    delays = sorted({b for f, b in exits if f})
    assert delays[:4] == [backoff_delay(n, first=0.05) for n in (1, 2, 3, 4)] == \
        [0.05, 0.1, 0.2, 0.4]
    pids = [int(p) for p in child.read_text().split()]
    assert len(pids) >= 4
    _until(None, lambda: all(_gone(p) for p in pids), "each start's child gone with it")


def test_a_killed_process_is_started_again_and_counted(
        tmp_path: Path, records: dict[str, ProcessRecord]) -> None:
    sup = Supervisor([_program(tmp_path, "svc", "echo READY; exec sleep 60")], records)
    _until(sup, lambda: records["svc"].state == RUNNING, "running")
    first = records["svc"].pid
    assert records["svc"].restarts == 0 and records["svc"].started == start_time(first)
    os.kill(first, signal.SIGKILL)
    _until(sup, lambda: records["svc"].state == RUNNING and records["svc"].pid != first,
           "running again")
    rec = records["svc"]
    assert (rec.restarts, rec.failures, rec.last_exit, rec.backoff) == (
        1, 1, "killed by SIGKILL", 0.5)
    sup.stop(grace=1.0)
    assert rec.state == STOPPED and rec.pid == 0


def test_a_process_not_ready_in_time_is_killed_and_started_again(
        tmp_path: Path, records: dict[str, ProcessRecord]) -> None:
    prog = _program(tmp_path, "mute", "exec sleep 60", ready="never said")
    sup = Supervisor([prog], records, ready_timeout=0.3, backoff_first=0.05)
    _until(sup, lambda: records["mute"].restarts >= 1, "started again")
    assert records["mute"].last_exit == "not ready after 0.3 s"
    sup.stop(grace=1.0)


def test_a_readiness_check_that_gives_up_fails_the_start(
        tmp_path: Path, records: dict[str, ProcessRecord]) -> None:
    def refuse(_: Child) -> bool:
        raise StartFailed("the admin could not create the streams")

    prog = Program("nats", tmp_path / "nats.log",
                   lambda: Launch(["sleep", "60"], dict(os.environ)), refuse)
    sup = Supervisor([prog], records)
    _until(sup, lambda: records["nats"].failures == 1, "the failed start")
    assert records["nats"].last_exit == ("failed to start: the admin could not create the "
                                         "streams")
    assert records["nats"].state == RESTARTING
    sup.stop(grace=1.0)


def test_a_program_waits_for_what_it_needs(
        tmp_path: Path, records: dict[str, ProcessRecord]) -> None:
    needed = _program(tmp_path, "needed", "echo READY; exec sleep 60")
    needy = _program(tmp_path, "needy", "echo READY; exec sleep 60",
                     blocked=lambda: "" if records["needed"].state == RUNNING else "needed")
    sup = Supervisor([needy, needed], records)
    sup.tick()
    assert (records["needy"].state, records["needy"].note) == ("waiting", "needed")
    _until(sup, lambda: records["needy"].state == RUNNING, "both running")
    assert records["needy"].started >= records["needed"].started
    sup.stop(grace=1.0)


def test_adopt_only_the_process_recorded(tmp_path: Path,
                                         records: dict[str, ProcessRecord]) -> None:
    outside = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        # until the child has exec'd, its command line is the test's own Python, not sleep
        _until(None, lambda: psutil.Process(outside.pid).cmdline()[:1] == ["sleep"], "exec")
        prog = Program("svc", tmp_path / "svc.log",
                       lambda: Launch(["sh", "-c", "echo READY; exec sleep 60"],
                                      dict(os.environ)), _says("READY", tmp_path / "svc.log"),
                       marker="sleep")
        sup = Supervisor([prog], records)
        started = start_time(outside.pid)
        assert not sup.adopt("svc", outside.pid, started + 5)  # a reused pid: another process
        assert sup.adopt("svc", outside.pid, started)
        sup.tick()
        assert records["svc"].state == RUNNING and records["svc"].pid == outside.pid
        outside.kill()
        outside.wait()
        _until(sup, lambda: records["svc"].state == RUNNING
               and records["svc"].pid != outside.pid, "started again")
        assert records["svc"].last_exit == ("exited (status unknown: started by an earlier "
                                            "supervisor)")
        sup.stop(grace=1.0)
    finally:
        outside.kill()
        outside.wait()


def test_a_restart_asked_for_skips_the_back_off_and_stop_kills_what_ignores_sigterm(
        tmp_path: Path, records: dict[str, ProcessRecord]) -> None:
    stubborn = _program(tmp_path, "stubborn", "trap '' TERM; echo READY; "
                                              "while :; do sleep 0.1; done")
    polite = _program(tmp_path, "polite", "echo READY; exec sleep 60")
    sup = Supervisor([stubborn, polite], records,
                     stop_groups=[["polite"], ["stubborn"]])
    _until(sup, lambda: all(r.state == RUNNING for r in records.values()), "running")
    old = records["polite"].pid
    assert sup.restart("polite") == old
    _until(sup, lambda: records["polite"].state == RUNNING and records["polite"].pid != old,
           "restarted")
    assert (records["polite"].failures, records["polite"].backoff) == (0, 0.0)
    assert records["polite"].last_exit == "killed by SIGTERM"
    with pytest.raises(UserError, match="no process 'nope'"):
        sup.restart("nope")
    pids = {n: r.pid for n, r in records.items()}
    assert sup.stop(grace=0.5) == ["stubborn"]
    assert all(r.state == STOPPED for r in records.values())
    _until(None, lambda: all(_gone(p) for p in pids.values()), "both gone")


@pytest.mark.parametrize("deep", [False, True])
def test_the_control_socket_is_its_owners_and_answers_one_request(
        tmp_path: Path, deep: bool) -> None:
    where = tmp_path / ("d" * 120 if deep else "")  # past a unix socket's 107 bytes
    where.mkdir(exist_ok=True)
    path = where / "supervisor.sock"
    server = ControlServer(path)
    try:
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                for conn, message in server.requests(0.05):
                    if message.get("op") == "echo":
                        ControlServer.reply(conn, {"ok": True, "echo": message["text"]})
                    else:
                        ControlServer.reply(conn, {"ok": False, "error": "unknown request"})

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            assert request(path, {"op": "echo", "text": "hi"})["echo"] == "hi"
            with pytest.raises(UserError, match="unknown request"):
                request(path, {"op": "other"})
        finally:
            stop.set()
            thread.join()
    finally:
        server.close()
    assert not path.exists()
    with pytest.raises(ControlError, match="no supervisor answers"):
        request(path, {"op": "echo"}, connect_within=0.2)
