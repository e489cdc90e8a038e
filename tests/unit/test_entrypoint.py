"""The retrying sh entrypoint (:mod:`couler.compilers.entrypoint`), run with /bin/sh.

Each test runs the generated script on a real command and reads the status file it
writes; the classification is compared with :func:`couler.failures.classify` on the
same exit code and stderr, so the sh translation and the Python classifier cannot drift.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from couler import failures, ir
from couler.compilers import entrypoint

C = ir.FailureClass


def _run(tmp_path: Path, policy: ir.RetryPolicy, *command: str,
         stdout_path: str = "", env: dict[str, str] | None = None,
         ) -> tuple[int, dict[str, str], str]:
    oom = tmp_path / "memory.events"
    oom.touch()
    status = tmp_path / "status"
    text = entrypoint.script(policy, status_path=str(status), stdout_path=stdout_path,
                             work_dir=str(tmp_path / "work"), oom_files=(str(oom),))
    bin_dir = tmp_path / "bin"  # a recording `sleep`: the delays are checked, not waited
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "sleep"
    fake.write_text(f'#!/bin/sh\necho "$1" >> {tmp_path / "slept"}\n')
    fake.chmod(0o755)
    full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "OOM_FILE": str(oom), **(env or {})}
    proc = subprocess.run(["/bin/sh", "-c", text, "couler-entrypoint", *command],
                          cwd=tmp_path, env=full_env, capture_output=True, text=True,
                          check=False)
    fields = dict(line.split("=", 1) for line in status.read_text().splitlines())
    return proc.returncode, fields, proc.stdout


def _slept(tmp_path: Path) -> list[str]:
    f = tmp_path / "slept"
    return f.read_text().split() if f.exists() else []


FLAKY = ("if [ -e marker ]; then echo recovered; exit 0; fi; touch marker; "
         "echo \"$MSG\" >&2; exit \"$CODE\"")


def test_same_exit_twice_is_user_and_stops(tmp_path: Path) -> None:
    policy = ir.RetryPolicy(limit=5, on=(C.TRANSIENT, C.INFRA))
    rc, status, _ = _run(tmp_path, policy, "sh", "-c", "echo 'bad input 42' >&2; exit 3")
    assert rc == 3
    assert status == {"attempts": "2", "class": "user", "pattern": "same-error-twice",
                      "exit": "3"}


def test_connection_error_traceback_is_retried_until_success(tmp_path: Path) -> None:
    policy = ir.RetryPolicy(limit=2, on=(C.INFRA,))
    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
          "requests.exceptions.ConnectionError: connection aborted")
    rc, status, out = _run(tmp_path, policy, "sh", "-c", FLAKY,
                           env={"MSG": tb, "CODE": "1"})
    assert rc == 0
    assert status["attempts"] == "2" and status["class"] == "" and status["exit"] == "0"
    assert out.strip() == "recovered"


def test_user_exception_is_not_retried(tmp_path: Path) -> None:
    policy = ir.RetryPolicy(limit=3, on=(C.TRANSIENT, C.INFRA, C.OOM))
    tb = "Traceback (most recent call last):\n  File \"x.py\"\nValueError: bad value 7"
    rc, status, _ = _run(tmp_path, policy, "sh", "-c", FLAKY, env={"MSG": tb, "CODE": "1"})
    assert rc == 1
    assert status["attempts"] == "1"
    assert (status["class"], status["pattern"]) == ("user", "python-exception")


def test_any_retries_a_user_error(tmp_path: Path) -> None:
    policy = ir.RetryPolicy(limit=1)  # on=(ANY,)
    tb = "Traceback (most recent call last):\nValueError: bad"
    rc, status, _ = _run(tmp_path, policy, "sh", "-c", FLAKY, env={"MSG": tb, "CODE": "1"})
    assert rc == 0 and status["attempts"] == "2"


def test_limit_bounds_attempts(tmp_path: Path) -> None:
    policy = ir.RetryPolicy(limit=2, on=(C.INFRA,))
    rc, status, _ = _run(tmp_path, policy, "sh", "-c",
                         "echo 'dial tcp: i/o timeout' >&2; exit 1")
    assert rc == 1
    assert status["attempts"] == "3" and status["class"] == "infra"
    assert status["pattern"] == "io-timeout"


def test_sigkill_with_cgroup_oom_kill_is_oom(tmp_path: Path) -> None:
    policy = ir.RetryPolicy(limit=0)
    # the command raises the cgroup counter as the kernel's OOM killer would
    rc, status, _ = _run(tmp_path, policy, "sh", "-c",
                         'echo "oom_kill 1" >> "$OOM_FILE"; exit 137')
    assert rc == 137
    assert (status["class"], status["pattern"]) == ("oom", "memory-limit")


def test_sigkill_without_memory_evidence_is_infra(tmp_path: Path) -> None:
    rc, status, _ = _run(tmp_path, ir.RetryPolicy(limit=0), "sh", "-c", "exit 137")
    assert (rc, status["class"], status["pattern"]) == (137, "infra", "sigkill")


def test_backoff_sleeps_the_computed_delays(tmp_path: Path) -> None:
    policy = ir.RetryPolicy(limit=4, backoff=ir.Backoff(0.5, 3, cap_seconds=4))
    assert entrypoint.delays(policy) == [0.5, 1.5, 4.0, 4.0]
    rc, status, _ = _run(tmp_path, policy, "sh", "-c", "echo 'Connection refused' >&2; exit 1")
    assert rc == 1 and status["attempts"] == "5"
    assert _slept(tmp_path) == ["0.5", "1.5", "4", "4"]


def test_no_backoff_does_not_sleep(tmp_path: Path) -> None:
    policy = ir.RetryPolicy(limit=2, on=(C.INFRA,))
    _run(tmp_path, policy, "sh", "-c", "echo 'Connection refused' >&2; exit 1")
    assert _slept(tmp_path) == []


def test_stdout_path_keeps_the_last_attempts_stdout(tmp_path: Path) -> None:
    out = tmp_path / "stdout"
    rc, _, shown = _run(tmp_path, ir.RetryPolicy(limit=1, on=(C.TRANSIENT,)), "sh", "-c",
                        FLAKY, stdout_path=str(out), env={"MSG": "flaky", "CODE": "2"})
    assert rc == 0
    assert out.read_text() == "recovered\n"
    assert shown == ""  # captured, not shown: the caller echoes it


def test_arguments_are_passed_verbatim(tmp_path: Path) -> None:
    rc, _, out = _run(tmp_path, ir.RetryPolicy(limit=0, on=(C.INFRA,)), "printf",
                      "%s|", "a b", "$HOME", "*")
    assert rc == 0 and out == "a b|$HOME|*|"


# The sh classifier against the Python one, on the same exit code and stderr.
SAMPLES = [
    (1, "Traceback (most recent call last):\n  File 'a'\nKeyError: 'x'"),
    (1, "Traceback (most recent call last):\nsocket.gaierror: [Errno -2] Name or service"),
    (1, "Traceback (most recent call last):\nTimeoutError: timed out"),
    (1, "Traceback (most recent call last):\nMemoryError"),
    (1, "Traceback (most recent call last):\nRuntimeError: download failed: Connection reset "
        "by peer"),
    (1, "Traceback (most recent call last):\nOSError: [Errno 28] No space left on device"),
    (1, "curl: (6) Could not resolve host: example.com"),
    (1, "HTTP 503 Service Unavailable"),
    (1, "error: 504 upstream gateway timeout"),
    (1, "write /data/x: no space left on device"),
    (1, "usage: train.py [-h] --lr LR\ntrain.py: error: the following arguments are required"),
    (1, "fatal: cannot allocate memory"),
    (1, "java.lang.OutOfMemoryError: Java heap space"),
    (127, "sh: foo: not found"),
    (126, "permission denied"),
    (137, "Killed"),
    (137, "process exceeded its memory limit"),
    (143, "Terminated"),
    (2, "something odd happened"),
    (1, "ConnectionResetError in worker"),
    (1, "an Errno 5 error: 50312 widgets"),
]


@pytest.mark.parametrize(("code", "log"), SAMPLES, ids=[f"{c}-{i}" for i, (c, _) in
                                                        enumerate(SAMPLES)])
def test_sh_classifier_agrees_with_failures_classify(tmp_path: Path, code: int, log: str,
                                                     ) -> None:
    expected = failures.classify(code, log=log + "\n")
    _, status, _ = _run(tmp_path, ir.RetryPolicy(limit=0, on=(C.INFRA,)), "sh", "-c",
                        'printf "%s\\n" "$MSG" >&2; exit "$CODE"',
                        env={"MSG": log, "CODE": str(code)})
    assert (status["class"], status["pattern"]) == (expected.failure_class.value,
                                                    expected.pattern)


def test_every_pattern_is_translated_or_engine_only() -> None:
    script = entrypoint.script(ir.RetryPolicy(limit=1, on=(C.INFRA,)), status_path="/s")
    for p in failures.PATTERNS:
        if p.source == entrypoint.ENGINE_ONLY:
            assert f"couler_pattern={p.name}\n" not in script
        else:
            assert f"couler_pattern={p.name}\n" in script, p.name


def test_untranslatable_regex_is_refused() -> None:
    with pytest.raises(ValueError, match=r"escape \\d"):
        entrypoint.grep_pattern(r"exit \d+")
    with pytest.raises(ValueError, match="lazy"):
        entrypoint.grep_pattern(r"a.*?b")
    assert entrypoint.grep_pattern(r"^usage: .*\n(?:.*\n)*?.*error: ") == ["^usage: .*",
                                                                           ".*error: "]


def test_wrapped_network_uses_the_same_patterns_as_failures() -> None:
    names = {p.name for p in failures.PATTERNS
             if p.source == "log" and p.failure_class is C.INFRA}
    assert names == {p.name for p in (*failures._NETWORK_LOG, failures._NO_SPACE)}


def test_needs_wrapper() -> None:
    assert not entrypoint.needs_wrapper(None)
    assert not entrypoint.needs_wrapper(ir.RetryPolicy(limit=2))
    assert entrypoint.needs_wrapper(ir.RetryPolicy(limit=2, backoff=ir.Backoff()))
    assert entrypoint.needs_wrapper(ir.RetryPolicy(limit=2, on=(C.OOM,)))


def test_argv_runs_the_command(tmp_path: Path) -> None:
    status = tmp_path / "st"
    cmd = entrypoint.argv(ir.RetryPolicy(limit=0, on=(C.INFRA,)), ["sh", "-c", "exit 4"],
                          status_path=str(status))
    assert cmd[:2] == ["/bin/sh", "-c"] and cmd[3:] == ["couler-entrypoint", "sh", "-c",
                                                        "exit 4"]
    proc = subprocess.run(cmd, capture_output=True, check=False, cwd=tmp_path)
    assert proc.returncode == 4
    assert "exit=4" in status.read_text()


def test_exception_line_endings_match_failures() -> None:
    assert f"(?:{entrypoint._SUFFIXES}))" in failures._EXCEPTION_LINE.pattern


def test_stop_on_ends_the_attempts_here_even_under_any(tmp_path: Path) -> None:
    oom = tmp_path / "memory.events"
    oom.touch()
    status = tmp_path / "status"
    text = entrypoint.script(ir.RetryPolicy(limit=3), status_path=str(status),
                             work_dir=str(tmp_path / "w"), oom_files=(str(oom),),
                             stop_on=(C.OOM,), attempts_before="BEFORE")
    proc = subprocess.run(["/bin/sh", "-c", text, "x", "sh", "-c",
                           f'echo "oom_kill 1" >> {oom}; exit 137'],
                          env={**os.environ, "BEFORE": "1"}, capture_output=True, check=False)
    assert proc.returncode == 137
    fields = dict(line.split("=", 1) for line in status.read_text().splitlines())
    # counted after the one attempt made before; stopped at the OOM though ANY retries it
    assert (fields["attempts"], fields["class"]) == ("2", "oom")
