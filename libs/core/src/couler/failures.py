"""Why a step failed, and so whether running it again can help: the failure classifier.

:func:`classify` maps what is known about one failed attempt -- its exit code, the signal
that ended it, the engine's reason (``OOMKilled``, ``Evicted``, ...), the tail of its log
and the attempts before it -- to a :class:`~couler.ir.FailureClass` and a reason that names
the pattern that matched. Retry policies decide by class: the default policy retries
``TRANSIENT``, ``INFRA`` and ``OOM`` (with more memory) but never ``USER``, a deterministic
error of the step itself, which fails the same way every time.

The rules, first match wins (:data:`PATTERNS` lists every pattern with why):

1. The engine's reason: ``OOMKilled`` is out of memory; evictions, lost nodes, image
   pulls, preemption, the engine's deadline and containers that cannot run are the
   platform's (``INFRA``).
2. Out of memory with evidence: the engine saw the memory limit hit, or a SIGKILL (exit
   137 / -9) with a memory message in the log, or a ``MemoryError``.
3. A timeout of the step (``TRANSIENT``); a SIGTERM (exit 143 / -15) is the platform
   stopping the pod (``INFRA``).
4. A Python traceback: its last exception decides. Network and timeout exceptions are
   ``INFRA`` / ``TRANSIENT``; any other exception (``ValueError``, ``KeyError``,
   ``ModuleNotFoundError``, ...) is the step's own bug (``USER``) -- unless its message is
   a network error ("RuntimeError: download failed: Connection reset by peer").
5. Log lines without a traceback: network and DNS errors, HTTP 502/503/504, a full disk
   (``INFRA``: the node's disk; a new pod gets a fresh one), a missing command (``USER``).
6. Anything else that exited non-zero is ``TRANSIENT`` the first time (retried once
   more) and ``USER`` when the attempt before it ended with the same exit code and the
   same last log line: the same error twice is deterministic.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from couler import ir

__all__ = [
    "PATTERNS",
    "Attempt",
    "Classification",
    "Pattern",
    "classify",
    "describe",
    "error_line",
]

TRANSIENT = ir.FailureClass.TRANSIENT
INFRA = ir.FailureClass.INFRA
OOM = ir.FailureClass.OOM
USER = ir.FailureClass.USER

_LABELS = {TRANSIENT: "transient", INFRA: "infrastructure", OOM: "out of memory",
           USER: "user error", ir.FailureClass.ANY: "failure"}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One earlier failed attempt of the same step: what the repeat rule compares."""

    exit_code: int | None
    error: str = ""  # its error line (see :func:`error_line`)


@dataclass(frozen=True, slots=True)
class Classification:
    """The class of one failed attempt and why."""

    failure_class: ir.FailureClass
    pattern: str  # the name of the matched pattern (see PATTERNS)
    reason: str  # in words, naming what matched

    def __str__(self) -> str:
        return describe(self.failure_class, self.reason)


@dataclass(frozen=True, slots=True)
class _Facts:
    exit_code: int | None
    signal: int | None
    engine_reason: str
    log: str
    memory_evidence: bool
    timed_out: bool
    exception: tuple[str, str] | None  # the traceback's last exception: (name, message)


@dataclass(frozen=True, slots=True)
class Pattern:
    """One row of the table: where it looks, what it matches, the class and why."""

    name: str
    source: str  # "engine reason", "exit code", "signal", "traceback" or "log"
    failure_class: ir.FailureClass
    why: str
    match: Callable[[_Facts], str | None]  # the matched text, or None

    @property
    def regex(self) -> str:
        """The log regex of a log pattern (matched case-insensitively per line), else ""."""
        return self.match.regex if isinstance(self.match, _LogMatch) else ""

    @property
    def exceptions(self) -> frozenset[str]:
        """The exception names of a traceback pattern (full or last dotted part), else empty."""
        return self.match.names if isinstance(self.match, _ExceptionMatch) else frozenset()


def describe(failure_class: ir.FailureClass, reason: str) -> str:
    """``"user error: Python ValueError in the traceback"``: the class in words and why."""
    label = _LABELS.get(failure_class, failure_class.value)
    return f"{label}: {reason}" if reason else label


# ------------------------------------------------------------------- matchers


def _reason(*words: str) -> Callable[[_Facts], str | None]:
    wanted = tuple(w.lower() for w in words)

    def match(f: _Facts) -> str | None:
        low = f.engine_reason.lower()
        return next((f"engine reason {words[i]!r}" for i, w in enumerate(wanted) if w in low),
                    None)
    return match


@dataclass(frozen=True, slots=True)
class _LogMatch:
    """A log regex (case-insensitive, multi-line); couler.compilers.entrypoint reads it."""

    regex: str
    label: str

    def __call__(self, f: _Facts) -> str | None:
        return self.label if re.search(self.regex, f.log, re.IGNORECASE | re.MULTILINE) else None


@dataclass(frozen=True, slots=True)
class _ExceptionMatch:
    """A set of exception names; read by couler.compilers.entrypoint too."""

    names: frozenset[str]
    label: str

    def __call__(self, f: _Facts) -> str | None:
        if f.exception is None:
            return None
        full = f.exception[0]
        short = full.rsplit(".", 1)[-1]
        return f"Python {full} {self.label}" if full in self.names or short in self.names \
            else None


def _log(regex: str, label: str) -> Callable[[_Facts], str | None]:
    return _LogMatch(regex, label)


def _exception(names: frozenset[str], label: str) -> Callable[[_Facts], str | None]:
    return _ExceptionMatch(names, label)


_MEMORY_LOG = re.compile(r"out of memory|oom[-_ ]?kill|memory cgroup|cannot allocate memory"
                         r"|exceed(?:ed|ing) (?:its |the )?memory|MemoryError|bad_alloc",
                         re.IGNORECASE)
_SIGKILL = (137, -9)
_SIGTERM = (143, -15)


def _oom_kill(f: _Facts) -> str | None:
    killed = f.exit_code in _SIGKILL or f.signal == 9
    if not killed:
        return None
    if f.memory_evidence:
        return f"SIGKILL (exit {f.exit_code}) at the memory limit"
    if _MEMORY_LOG.search(f.log) or "memory" in f.engine_reason.lower():
        return f"SIGKILL (exit {f.exit_code}) with a memory message"
    return None


def _memory_limit(f: _Facts) -> str | None:
    return "killed at its memory limit" if f.memory_evidence else None


def _timed_out(f: _Facts) -> str | None:
    return "the step's timeout" if f.timed_out else None


def _sigterm(f: _Facts) -> str | None:
    if f.exit_code in _SIGTERM or f.signal == 15:
        return f"SIGTERM (exit {f.exit_code if f.exit_code is not None else 143})"
    return None


def _network_exception_message(f: _Facts) -> str | None:
    if f.exception is None:
        return None
    name, message = f.exception
    for pattern in (*_NETWORK_LOG, _NO_SPACE):
        if pattern.match(_Facts(None, None, "", message, False, False, None)):
            return f"Python {name} caused by a platform error ({pattern.name})"
    return None


def _user_exception(f: _Facts) -> str | None:
    if f.exception is None:
        return None
    return f"Python {f.exception[0]} in the traceback"


_INFRA_EXCEPTIONS = frozenset({
    "ConnectionError", "ConnectionResetError", "ConnectionRefusedError",
    "ConnectionAbortedError", "BrokenPipeError", "gaierror", "herror",
    "NewConnectionError", "MaxRetryError", "ProtocolError", "RemoteDisconnected",
    "EndpointConnectionError", "ConnectTimeoutError", "ServiceUnavailable",
    "InternalServerError", "ClientConnectorError", "ServerDisconnectedError",
})
_TIMEOUT_EXCEPTIONS = frozenset({
    "TimeoutError", "timeout", "ReadTimeout", "ConnectTimeout", "ReadTimeoutError",
    "DeadlineExceeded", "ServerTimeoutError",
})
_OOM_EXCEPTIONS = frozenset({"MemoryError", "OutOfMemoryError"})

_NETWORK_LOG: tuple[Pattern, ...] = (
    Pattern("dns-resolution", "log", INFRA,
            "DNS lookups fail while the cluster's resolver or network is unwell",
            _log(r"temporary failure in name resolution|name or service not known"
                 r"|no such host|could not resolve host|getaddrinfo failed",
                 "a DNS error (name resolution) in the log")),
    Pattern("connection-reset", "log", INFRA,
            "the peer or a proxy dropped the connection; a new attempt reconnects",
            _log(r"connection reset by peer", "'Connection reset by peer' in the log")),
    Pattern("connection-refused", "log", INFRA,
            "the service was not listening yet (starting, restarting, failing over)",
            _log(r"connection refused", "'Connection refused' in the log")),
    Pattern("io-timeout", "log", INFRA,
            "a network read or dial timed out (Go clients: registries, object stores)",
            _log(r"i/o timeout", "'i/o timeout' in the log")),
    Pattern("tls-handshake-timeout", "log", INFRA,
            "a TLS handshake timed out: a congested network or an overloaded endpoint",
            _log(r"tls handshake timeout", "'TLS handshake timeout' in the log")),
    Pattern("http-5xx", "log", INFRA,
            "HTTP 502/503/504: a gateway or an overloaded service, not the request itself",
            _log(r"\b50[234]\b[^\n]{0,40}(?:bad gateway|service unavailable|gateway time-?out"
                 r"|server error)|(?:bad gateway|service unavailable|gateway time-?out)",
                 "an HTTP 502/503/504 in the log")),
    Pattern("connection-error", "log", INFRA,
            "a client's ConnectionError: the network, not the program's logic",
            _log(r"\bConnection(?:Reset|Refused|Aborted)?Error\b|broken pipe",
                 "a ConnectionError in the log")),
    Pattern("socket-timeout", "log", INFRA,
            "a socket timed out: the network or the peer was slow",
            _log(r"socket\.timeout|timed out while (?:connecting|reading)",
                 "'socket.timeout' in the log")),
)

_NO_SPACE = Pattern(
    "no-space", "log", INFRA,
    "the node's disk is full; the retry's new pod gets a fresh ephemeral disk (on the local "
    "engine it is the same disk: a repeat is then caught as the same error twice only when no "
    "pattern matched, so a full local disk is retried up to the policy's limit)",
    _log(r"no space left on device", "'No space left on device' in the log"))

#: Every pattern, in the order they are tried.
PATTERNS: tuple[Pattern, ...] = (
    # 1. the engine's reason
    Pattern("engine-oomkilled", "engine reason", OOM,
            "the kernel killed the container at its memory limit; more memory helps",
            _reason("OOMKilled", "OOM killed")),
    Pattern("engine-evicted", "engine reason", INFRA,
            "the kubelet evicted the pod (node pressure): the step did nothing wrong",
            _reason("Evicted")),
    Pattern("engine-node-lost", "engine reason", INFRA,
            "the node went away under the pod", _reason("NodeLost", "node lost",
                                                        "node was lost")),
    Pattern("engine-image-pull", "engine reason", INFRA,
            "the image could not be pulled: a registry or network outage (the engine backs "
            "off and pulls again; a wrong name fails the same way each time)",
            _reason("ImagePullBackOff", "ErrImagePull")),
    Pattern("engine-preempted", "engine reason", INFRA,
            "a higher-priority pod or a spot reclaim took the node", _reason("Preempted",
                                                                             "preemption")),
    Pattern("engine-deadline", "engine reason", INFRA,
            "the engine's own deadline (activeDeadlineSeconds) ended the pod",
            _reason("DeadlineExceeded")),
    Pattern("engine-cannot-run", "engine reason", INFRA,
            "the runtime could not start the container", _reason("ContainerCannotRun",
                                                                 "cannot start the process")),
    # 2. out of memory with evidence
    Pattern("memory-limit", "exit code", OOM,
            "the engine saw the step exceed its memory limit", _memory_limit),
    Pattern("sigkill-memory", "signal", OOM,
            "SIGKILL (exit 137 / -9) with a memory message: the OOM killer", _oom_kill),
    Pattern("python-memoryerror", "traceback", OOM,
            "Python ran out of memory; more memory helps",
            _exception(_OOM_EXCEPTIONS, "(out of memory)")),
    Pattern("log-oom", "log", OOM,
            "the log says memory ran out (cgroup OOM, allocation failure)",
            _log(_MEMORY_LOG.pattern, "an out-of-memory message in the log")),
    # 3. timeouts and the platform's signals
    Pattern("step-timeout", "engine reason", TRANSIENT,
            "the step ran past its timeout: slow inputs or a slow node may not repeat",
            _timed_out),
    Pattern("sigkill", "signal", INFRA,
            "SIGKILL (exit 137 / -9) without memory evidence: killed from outside (a node "
            "shutting down, a preempted pod's grace period over)",
            lambda f: (f"SIGKILL (exit {f.exit_code}) without memory evidence"
                       if f.exit_code in _SIGKILL or f.signal == 9 else None)),
    Pattern("sigterm", "signal", INFRA,
            "SIGTERM (exit 143): the platform stopped the pod (drain, scale-down)",
            _sigterm),
    # 4. a Python traceback: its last exception
    Pattern("python-network-exception", "traceback", INFRA,
            "a network exception (ConnectionError, gaierror, MaxRetryError, ...)",
            _exception(_INFRA_EXCEPTIONS, "(a network error)")),
    Pattern("python-timeout-exception", "traceback", TRANSIENT,
            "a timeout exception (socket.timeout, TimeoutError, ReadTimeout)",
            _exception(_TIMEOUT_EXCEPTIONS, "(a timeout)")),
    Pattern("python-wrapped-network", "traceback", INFRA,
            "an exception whose message is a network error or a full disk "
            "(OSError: [Errno 28] No space left on device)", _network_exception_message),
    Pattern("python-exception", "traceback", USER,
            "any other exception (ValueError, KeyError, AssertionError, ZeroDivisionError, "
            "ImportError, SyntaxError, TypeError, ...) is the program's own: it fails again",
            _user_exception),
    # 5. log lines without a traceback
    *_NETWORK_LOG,
    _NO_SPACE,
    Pattern("command-not-found", "exit code", USER,
            "exit 127 / 126: the command is missing or not executable in the image",
            lambda f: (f"exit {f.exit_code}: command not found or not executable"
                       if f.exit_code in (126, 127) else None)),
    Pattern("usage-error", "log", USER,
            "the program refused its arguments (argparse's 'usage:' / 'error:')",
            _log(r"^usage: .*\n(?:.*\n)*?.*error: ", "a usage error (bad arguments) in the log")),
)

_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Iteration|Warning|timeout"
    r"|gaierror|herror|Unavailable|Exceeded))(?::\s?(.*))?$")
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


def _last_exception(log: str) -> tuple[str, str] | None:
    """The last exception of the last Python traceback in ``log``: (name, message).

    A tail cut before the ``Traceback`` header still counts when its last error line
    is an exception line at the left margin (``ValueError: ...``).
    """
    start = log.rfind(_TRACEBACK)
    lines = log[start:].splitlines() if start >= 0 else log.splitlines()[-3:]
    found: tuple[str, str] | None = None
    for line in lines:
        if not line or line[0].isspace():
            continue
        m = _EXCEPTION_LINE.match(line.rstrip())
        if m:
            found = (m.group(1), (m.group(2) or "").strip())
    return found


def error_line(log: str) -> str:
    """The attempt's error as the repeat rule compares it: its last non-empty log line,
    numbers and addresses blanked (``0x7f3a``, pids and times change between attempts)."""
    for line in reversed(log.strip().splitlines()):
        if line.strip():
            return _NUMBERS.sub("#", line.strip())[:300]
    return ""


def classify(exit_code: int | None, signal: int | None = None, engine_reason: str = "",
             log: str = "", previous: Sequence[Attempt] = (), *,
             memory_evidence: bool = False, timed_out: bool = False) -> Classification:
    """The class of one failed attempt, and why.

    Args:
        exit_code: The attempt's exit code (None when it did not exit, e.g. evicted).
        signal: The signal that ended it, if the engine reports one apart from the code.
        engine_reason: The engine's words for it (``OOMKilled``, ``Evicted``, a message).
        log: The tail of what the step wrote (stderr), a few KiB are enough.
        previous: The step's earlier failed attempts in this run, oldest first.
        memory_evidence: The engine saw the memory limit hit (a cgroup / monitor kill).
        timed_out: The step ran past its timeout.

    Returns:
        The first matching pattern's class with a reason naming it; an unknown non-zero
        exit is ``TRANSIENT`` the first time and ``USER`` when the attempt before ended
        with the same exit code and error line.
    """
    facts = _Facts(exit_code, signal, engine_reason or "", log or "", memory_evidence,
                   timed_out, _last_exception(log or ""))
    for pattern in PATTERNS:
        matched = pattern.match(facts)
        if matched:
            return Classification(pattern.failure_class, pattern.name, matched)
    error = error_line(facts.log)
    if previous and previous[-1].exit_code == exit_code and previous[-1].error == error:
        said = f": {error[:120]}" if error else ""
        return Classification(USER, "same-error-twice",
                              f"the same exit code {exit_code} and error twice{said}")
    if exit_code is None:
        text = (facts.engine_reason or error)[:160]
        said = f": {text}" if text else ""
        return Classification(TRANSIENT, "unknown", f"an unknown failure{said}")
    return Classification(TRANSIENT, "unknown-exit",
                          f"exit code {exit_code}, not a known error, seen once (a repeat "
                          "would be a user error)")
