"""The failure classifier: every pattern of the table, the repeat rule, the fallbacks."""

from __future__ import annotations

import pytest

from couler import ir
from couler.failures import PATTERNS, Attempt, classify, describe, error_line

T, INF, OOM, U = (ir.FailureClass.TRANSIENT, ir.FailureClass.INFRA, ir.FailureClass.OOM,
                  ir.FailureClass.USER)


def tb(last: str) -> str:
    return ("Traceback (most recent call last):\n"
            '  File "/app/main.py", line 12, in <module>\n'
            "    main()\n"
            f"{last}\n")


# (pattern, expected class, classify keyword arguments)
CASES: list[tuple[str, ir.FailureClass, dict[str, object]]] = [
    ("engine-oomkilled", OOM, {"exit_code": 137, "engine_reason": "OOMKilled (exit code 137)"}),
    ("engine-evicted", INF, {"exit_code": None, "engine_reason": "Pod was Evicted: "
                                                              "low on ephemeral-storage"}),
    ("engine-node-lost", INF, {"exit_code": None, "engine_reason": "NodeLost"}),
    ("engine-image-pull", INF, {"exit_code": None, "engine_reason": "ImagePullBackOff"}),
    ("engine-image-pull", INF, {"exit_code": None, "engine_reason": "ErrImagePull: timeout"}),
    ("engine-preempted", INF, {"exit_code": None, "engine_reason": "Preempted by scheduler"}),
    ("engine-deadline", INF, {"exit_code": None, "engine_reason": "DeadlineExceeded"}),
    ("engine-cannot-run", INF, {"exit_code": None, "engine_reason": "ContainerCannotRun"}),
    ("memory-limit", OOM, {"exit_code": -9, "memory_evidence": True}),
    ("sigkill-memory", OOM, {"exit_code": 137, "log": "Out of memory: Killed process 42"}),
    ("python-memoryerror", OOM, {"exit_code": 1, "log": tb("MemoryError")}),
    ("log-oom", OOM, {"exit_code": 134, "log": "terminate called after throwing an instance "
                                             "of 'std::bad_alloc'"}),
    ("step-timeout", T, {"exit_code": None, "timed_out": True}),
    ("sigkill", INF, {"exit_code": 137}),
    ("sigterm", INF, {"exit_code": 143}),
    ("sigterm", INF, {"exit_code": None, "signal": 15}),
    ("python-network-exception", INF, {"exit_code": 1, "log": tb(
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='x'): Max retries")}),
    ("python-network-exception", INF, {"exit_code": 1, "log": tb(
        "socket.gaierror: [Errno -3] Temporary failure in name resolution")}),
    ("python-timeout-exception", T, {"exit_code": 1, "log": tb("socket.timeout: timed out")}),
    ("python-timeout-exception", T, {"exit_code": 1, "log": tb("TimeoutError")}),
    ("python-wrapped-network", INF, {"exit_code": 1, "log": tb(
        "RuntimeError: download failed: Connection reset by peer")}),
    ("python-wrapped-network", INF, {"exit_code": 1, "log": tb(
        "OSError: [Errno 28] No space left on device")}),
    ("python-exception", U, {"exit_code": 1, "log": tb("ValueError: bad learning rate")}),
    ("python-exception", U, {"exit_code": 1, "log": tb("KeyError: 'label'")}),
    ("python-exception", U, {"exit_code": 1, "log": tb("AssertionError")}),
    ("python-exception", U, {"exit_code": 1, "log": tb("ZeroDivisionError: division by "
                                                        "zero")}),
    ("python-exception", U, {"exit_code": 1, "log": tb("ModuleNotFoundError: No module "
                                                        "named 'xgboost'")}),
    ("python-exception", U, {"exit_code": 1, "log": tb("ImportError: cannot import name "
                                                        "'f'")}),
    ("python-exception", U, {"exit_code": 1, "log": tb("TypeError: unsupported operand")}),
    ("python-exception", U, {"exit_code": 1, "log": '  File "x.py", line 3\n    x = (\n'
                                                    "SyntaxError: '(' was never closed"}),
    ("dns-resolution", INF, {"exit_code": 6, "log": "curl: (6) Could not resolve host: x"}),
    ("dns-resolution", INF, {"exit_code": 1, "log": "Temporary failure in name resolution"}),
    ("connection-reset", INF, {"exit_code": 1, "log": "read: Connection reset by peer"}),
    ("connection-refused", INF, {"exit_code": 1, "log": "dial tcp 10.0.0.1:5432: "
                                                      "connect: connection refused"}),
    ("io-timeout", INF, {"exit_code": 1, "log": "dial tcp: lookup db: i/o timeout"}),
    ("tls-handshake-timeout", INF, {"exit_code": 1, "log": "net/http: TLS handshake timeout"}),
    ("http-5xx", INF, {"exit_code": 1, "log": "HTTP/1.1 503 Service Unavailable"}),
    ("http-5xx", INF, {"exit_code": 22, "log": "The requested URL returned error: 502 Bad "
                                             "Gateway"}),
    ("connection-error", INF, {"exit_code": 1, "log": "ConnectionError while uploading"}),
    ("socket-timeout", INF, {"exit_code": 1, "log": "warning: socket.timeout reading chunk"}),
    ("no-space", INF, {"exit_code": 1, "log": "write /data/x: No space left on device"}),
    ("command-not-found", U, {"exit_code": 127, "log": "sh: 1: trian.py: not found"}),
    ("command-not-found", U, {"exit_code": 126}),
    ("usage-error", U, {"exit_code": 2, "log": "usage: train.py [-h] --lr LR\n"
                                               "train.py: error: the following arguments "
                                               "are required: --lr"}),
]


@pytest.mark.parametrize(("pattern", "expected", "kw"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_pattern(pattern: str, expected: ir.FailureClass, kw: dict[str, object]) -> None:
    exit_code = kw.pop("exit_code")
    got = classify(exit_code, **kw)  # type: ignore[arg-type]
    assert (got.pattern, got.failure_class) == (pattern, expected), got
    assert got.reason


def test_every_pattern_has_a_case_and_the_table_is_large_enough() -> None:
    names = [p.name for p in PATTERNS]
    assert len(names) == len(set(names)) >= 20
    assert {c[0] for c in CASES} == set(names)
    assert all(p.why for p in PATTERNS)
    # each class is reachable from the table
    assert {p.failure_class for p in PATTERNS} == {T, INF, OOM, U}


def test_reason_names_the_exception_or_the_matched_text() -> None:
    assert classify(1, log=tb("ValueError: x")).reason == "Python ValueError in the traceback"
    assert classify(None, engine_reason="OOMKilled").reason == "engine reason 'OOMKilled'"
    assert str(classify(1, log=tb("KeyError: 'a'"))) == \
        "user error: Python KeyError in the traceback"


def test_an_unknown_exit_is_transient_once_then_the_same_error_twice_is_user() -> None:
    first = classify(3, log="model diverged at step 4121")
    assert (first.failure_class, first.pattern) == (T, "unknown-exit")
    prev = [Attempt(3, error_line("model diverged at step 4121"))]
    # numbers are blanked: the step count differs between attempts, the error does not
    again = classify(3, log="model diverged at step 977", previous=prev)
    assert (again.failure_class, again.pattern) == (U, "same-error-twice")
    assert "same exit code 3 and error twice" in again.reason


@pytest.mark.parametrize(("exit_code", "log"), [
    (4, "model diverged at step 1"),  # another exit code
    (3, "checkpoint missing"),  # another error
])
def test_a_different_exit_or_error_is_not_a_repeat(exit_code: int, log: str) -> None:
    prev = [Attempt(3, error_line("model diverged at step 1"))]
    assert classify(exit_code, log=log, previous=prev).failure_class is T


def test_the_repeat_rule_compares_with_the_attempt_just_before() -> None:
    prev = [Attempt(3, "a"), Attempt(5, "b")]
    assert classify(3, log="a", previous=prev).failure_class is T
    assert classify(5, log="b", previous=prev).failure_class is U


def test_a_known_pattern_wins_over_the_repeat_rule() -> None:
    # a DNS error twice is still the network's: infra, retried
    log = "Temporary failure in name resolution"
    got = classify(1, log=log, previous=[Attempt(1, error_line(log))])
    assert got.failure_class is INF


def test_a_network_error_earlier_in_the_log_does_not_excuse_a_user_exception() -> None:
    log = "retrying after Connection refused\n" + tb("KeyError: 'label'")
    assert classify(1, log=log).failure_class is U


def test_a_tail_cut_before_the_traceback_header_still_finds_the_exception() -> None:
    got = classify(1, log='ne 3, in f\n    return 1 / 0\nZeroDivisionError: division by zero')
    assert (got.failure_class, got.reason) == (U, "Python ZeroDivisionError in the traceback")


def test_chained_tracebacks_use_the_last_exception() -> None:
    log = (tb("KeyError: 'x'") + "\nDuring handling of the above exception, another "
           "exception occurred:\n\n" + tb("ConnectionResetError: [Errno 104] reset"))
    assert classify(1, log=log).failure_class is INF


def test_no_exit_code_and_nothing_known_is_transient() -> None:
    got = classify(None, engine_reason="something odd")
    assert (got.failure_class, got.pattern) == (T, "unknown")


def test_describe() -> None:
    assert describe(U, "x") == "user error: x"
    assert describe(OOM, "") == "out of memory"
