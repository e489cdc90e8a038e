"""The failure classifier of the generated Airflow DAG files, generated from
:data:`couler.failures.PATTERNS`.

A generated DAG file must not import couler (Airflow workers do not have it), so
:func:`classifier_source` writes the classifier into the file: the pattern table
(:data:`couler.failures.PATTERNS`, read at compile time: each pattern's words,
regular expression or exception names) and a small interpreter of it,
``_couler_classify``, which follows :func:`couler.failures.classify` rule for rule
(first match wins; an unknown non-zero exit is transient once and user error when
the attempt before it ended with the same exit code and error line). The unit tests
run the generated source against :func:`couler.failures.classify` on the same facts.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from couler import failures

__all__ = ["BUILTIN_PATTERNS", "classifier_source", "pattern_table"]

# Patterns whose matcher is a plain function of the facts: the generated
# interpreter implements each by name (see _CLASSIFIER below).
BUILTIN_PATTERNS = frozenset({
    "memory-limit", "sigkill-memory", "step-timeout", "sigkill", "sigterm",
    "python-wrapped-network", "python-exception", "command-not-found",
})


def _closure(fn: Any) -> dict[str, Any]:
    cells = fn.__closure__ or ()
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in cells), strict=True))


def pattern_table() -> list[list[Any]]:
    """Every pattern of :data:`couler.failures.PATTERNS` as a row of literals:
    ``[name, class, kind, data]`` with kind ``reason`` (engine words), ``log`` (a
    regular expression), ``exception`` (exception names) or ``builtin``.

    Raises:
        RuntimeError: a pattern whose matcher this module does not know (a new kind of
            pattern in couler.failures: teach the generated interpreter first).
    """
    rows: list[list[Any]] = []
    for p in failures.PATTERNS:
        fn = p.match
        qual = getattr(fn, "__qualname__", "")
        free = _closure(fn) if qual.endswith("<locals>.match") else {}
        if qual.startswith("_reason."):
            data: dict[str, Any] = {"words": list(free["words"])}
            kind = "reason"
        elif p.regex:  # a log pattern (couler.failures.Pattern.regex)
            data = {"regex": p.regex, "label": getattr(fn, "label", "")}
            kind = "log"
        elif p.exceptions:  # a traceback pattern (couler.failures.Pattern.exceptions)
            data = {"names": sorted(p.exceptions), "label": getattr(fn, "label", "")}
            kind = "exception"
        elif p.name in BUILTIN_PATTERNS:
            data, kind = {}, "builtin"
        else:
            raise RuntimeError(f"failure pattern {p.name!r} has a matcher the Airflow "
                               "runner does not know")
        rows.append([p.name, p.failure_class.value, kind, data])
    return rows


def _wrapped() -> list[str]:
    """The patterns python-wrapped-network tries on an exception's message."""
    return [p.name for p in (*failures._NETWORK_LOG, failures._NO_SPACE)]


def _text(value: str, indent: str) -> str:
    """A string literal, split into adjacent literals of at most 60 characters."""
    if len(value) <= 60:
        return repr(value)
    parts = [repr(value[i:i + 60]) for i in range(0, len(value), 60)]
    return "(\n" + "".join(f"{indent}    {p}\n" for p in parts) + f"{indent})"


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


def _literal(value: Any, indent: str = "") -> str:
    """A Python literal, one item per line, long strings split (lines stay short)."""
    if isinstance(value, str):
        return _text(value, indent)
    inner = indent + "    "
    if len(repr(value)) + len(indent) <= 88 and not any(
            isinstance(v, str) and len(v) > 60 for v in _leaves(value)):
        return repr(value)
    if isinstance(value, dict) and value:
        items = [f"{inner}{k!r}: {_literal(v, inner)},\n" for k, v in value.items()]
        return "{\n" + "".join(items) + indent + "}"
    if isinstance(value, list) and value:
        items = [f"{inner}{_literal(v, inner)},\n" for v in value]
        return "[\n" + "".join(items) + indent + "]"
    return repr(value)


def classifier_source() -> str:
    """The classifier's source for a generated DAG file (needs ``re`` imported)."""
    memory = failures._MEMORY_LOG.pattern
    line = failures._EXCEPTION_LINE.pattern
    head = [
        "# The failure classifier (couler.failures.classify), generated from its PATTERNS.",
        f"_FAILURE_MEMORY = re.compile({_text(memory, '')}, re.IGNORECASE)",
        f"_FAILURE_LINE = re.compile({_text(line, '')})",
        f"_FAILURE_NUMBERS = re.compile({failures._NUMBERS.pattern!r})",
        f"_FAILURE_WRAPPED = {_literal(_wrapped())}",
        f"FAILURE_PATTERNS: list[list[Any]] = {_literal(pattern_table())}",
    ]
    return "\n".join(head) + "\n" + _CLASSIFIER


_CLASSIFIER = '''

def _couler_last_exception(log: str) -> tuple[str, str] | None:
    """The last exception of the last Python traceback in the log: (name, message)."""
    start = log.rfind("Traceback (most recent call last):")
    lines = log[start:].splitlines() if start >= 0 else log.splitlines()[-3:]
    found = None
    for line in lines:
        if not line or line[0].isspace():
            continue
        m = _FAILURE_LINE.match(line.rstrip())
        if m:
            found = (m.group(1), (m.group(2) or "").strip())
    return found


def _couler_error_line(log: str) -> str:
    """The attempt's last non-empty log line, numbers blanked (the repeat rule's key)."""
    for line in reversed(log.strip().splitlines()):
        if line.strip():
            return _FAILURE_NUMBERS.sub("#", line.strip())[:300]
    return ""


def _couler_match(row: list[Any], f: dict[str, Any]) -> str | None:
    """The text pattern ``row`` matched in the facts ``f``, or None."""
    name, _, kind, data = row
    code, sig, exc = f["exit_code"], f["signal"], f["exception"]
    if kind == "reason":
        low = f["reason"].lower()
        return next((f"engine reason {w!r}" for w in data["words"] if w.lower() in low), None)
    if kind == "log":
        found = re.search(data["regex"], f["log"], re.IGNORECASE | re.MULTILINE)
        return data["label"] if found else None
    if kind == "exception":
        if exc is None:
            return None
        full, short = exc[0], exc[0].rsplit(".", 1)[-1]
        names = data["names"]
        return f"Python {full} {data['label']}" if full in names or short in names else None
    killed = code in (137, -9) or sig == 9
    if name == "memory-limit":
        return "killed at its memory limit" if f["memory"] else None
    if name == "sigkill-memory":
        if not killed:
            return None
        if f["memory"]:
            return f"SIGKILL (exit {code}) at the memory limit"
        if _FAILURE_MEMORY.search(f["log"]) or "memory" in f["reason"].lower():
            return f"SIGKILL (exit {code}) with a memory message"
        return None
    if name == "step-timeout":
        return "the step's timeout" if f["timed_out"] else None
    if name == "sigkill":
        return f"SIGKILL (exit {code}) without memory evidence" if killed else None
    if name == "sigterm":
        if code in (143, -15) or sig == 15:
            return f"SIGTERM (exit {code if code is not None else 143})"
        return None
    if name == "python-wrapped-network":
        if exc is None:
            return None
        facts = {"exit_code": None, "signal": None, "reason": "", "log": exc[1],
                 "memory": False, "timed_out": False, "exception": None}
        for other in FAILURE_PATTERNS:
            if other[0] in _FAILURE_WRAPPED and _couler_match(other, facts):
                return f"Python {exc[0]} caused by a platform error ({other[0]})"
        return None
    if name == "python-exception":
        return f"Python {exc[0]} in the traceback" if exc is not None else None
    if name == "command-not-found":
        if code in (126, 127):
            return f"exit {code}: command not found or not executable"
        return None
    raise ValueError(f"unknown failure pattern {name!r}")


def _couler_classify(exit_code: int | None, signal: int | None = None, reason: str = "",
                     log: str = "", previous: list[list[Any]] | None = None, *,
                     memory: bool = False, timed_out: bool = False) -> tuple[str, str, str]:
    """(failure class, pattern, reason) of one failed attempt, as couler.failures.classify;
    ``previous`` lists the earlier attempts as [exit code, error line]."""
    log = log or ""
    facts = {"exit_code": exit_code, "signal": signal, "reason": reason or "", "log": log,
             "memory": memory, "timed_out": timed_out,
             "exception": _couler_last_exception(log)}
    for row in FAILURE_PATTERNS:
        matched = _couler_match(row, facts)
        if matched:
            return row[1], row[0], matched
    error = _couler_error_line(log)
    if previous and previous[-1][0] == exit_code and previous[-1][1] == error:
        said = f": {error[:120]}" if error else ""
        return "user", "same-error-twice", f"the same exit code {exit_code} and error twice{said}"
    if exit_code is None:
        text = (reason or error)[:160]
        said = f": {text}" if text else ""
        return "transient", "unknown", f"an unknown failure{said}"
    return ("transient", "unknown-exit", f"exit code {exit_code}, not a known error, seen "
            "once (a repeat would be a user error)")
'''
